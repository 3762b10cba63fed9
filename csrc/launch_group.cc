#include "launch_group.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "driver.h"
#include "launch.h"

namespace gg {
namespace {

struct Recording {
  int depth = 0;
  int device = -1;
  cu::Stream stream = nullptr;
  bool stream_capturing = false;
  std::vector<KernelLaunch> launches;
};

thread_local Recording t_recording;
std::atomic<long> g_graph_launches{0};

void launch_now(KernelLaunch& l) {
  std::vector<void*> params = slot_pointers(l.slots);
  const cu::Result result =
      cuda().cuLaunchKernel(l.function, l.programs, 1, 1, 32 * l.info->num_warps, 1, 1,
                            l.info->shared, l.stream, params.data(), nullptr);
  if (result != cu::kSuccess) fail(result, std::string("launching ") + l.info->key);
}

cu::KernelNodeParams node_params(const KernelLaunch& l, std::vector<void*>& params) {
  cu::KernelNodeParams p{};
  p.function = l.function;
  p.grid_x = l.programs;
  p.grid_y = p.grid_z = 1;
  p.block_x = 32 * static_cast<unsigned>(l.info->num_warps);
  p.block_y = p.block_z = 1;
  p.shared_bytes = static_cast<unsigned>(l.info->shared);
  p.params = params.data();
  return p;
}

std::string kernel_list(const std::vector<KernelLaunch>& launches) {
  std::string out;
  for (const KernelLaunch& l : launches)
    out += (out.empty() ? "" : ", ") + std::string(l.info->key);
  return out;
}

// A chain of kernel nodes, instantiated once and updated for every call:
// one per device, stream and length (launches of one executable graph are
// ordered after each other, so streams do not share one), for the life of
// the process.
struct Chain {
  std::mutex mutex;
  cu::Graph graph = nullptr;
  cu::GraphExec exec = nullptr;
  std::vector<cu::GraphNode> nodes;

  // Sets the nodes to these launches; false where the driver refuses an update.
  bool update(std::vector<KernelLaunch>& launches) {
    if (exec == nullptr) return false;
    for (size_t i = 0; i < launches.size(); ++i) {
      std::vector<void*> params = slot_pointers(launches[i].slots);
      const cu::KernelNodeParams p = node_params(launches[i], params);
      if (cuda().cuGraphExecKernelNodeSetParams(exec, nodes[i], &p) != cu::kSuccess) return false;
    }
    return true;
  }

  void rebuild(std::vector<KernelLaunch>& launches) {
    const cu::Api& api = cuda();
    if (exec != nullptr) api.cuGraphExecDestroy(exec);
    if (graph != nullptr) api.cuGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
    nodes.assign(launches.size(), nullptr);
    const std::string what = "building a CUDA graph of " + kernel_list(launches);
    check(api.cuGraphCreate(&graph, 0), what);
    for (size_t i = 0; i < launches.size(); ++i) {
      std::vector<void*> params = slot_pointers(launches[i].slots);
      const cu::KernelNodeParams p = node_params(launches[i], params);
      check(api.cuGraphAddKernelNode(&nodes[i], graph, i == 0 ? nullptr : &nodes[i - 1],
                                     i == 0 ? 0 : 1, &p),
            what);
    }
    check(api.cuGraphInstantiateWithFlags(&exec, graph, 0), what);
  }
};

Chain& chain_for(int device, cu::Stream stream, size_t length) {
  static std::mutex mutex;
  static std::map<std::tuple<int, cu::Stream, size_t>, std::unique_ptr<Chain>> chains;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Chain>& chain = chains[{device, stream, length}];
  if (!chain) chain = std::make_unique<Chain>();
  return *chain;
}

void launch_as_graph(std::vector<KernelLaunch>& launches, int device, cu::Stream stream) {
  Chain& chain = chain_for(device, stream, launches.size());
  std::lock_guard<std::mutex> lock(chain.mutex);
  if (!chain.update(launches)) chain.rebuild(launches);
  const cu::Result result = cuda().cuGraphLaunch(chain.exec, stream);
  if (result != cu::kSuccess) {
    fail(result, "launching " + kernel_list(launches) + " as one CUDA graph");
  }
  ++g_graph_launches;
}

}  // namespace

std::vector<void*> slot_pointers(std::vector<uint64_t>& slots) {
  std::vector<void*> pointers;
  pointers.reserve(slots.size());
  for (uint64_t& slot : slots) pointers.push_back(&slot);
  return pointers;
}

void launch_or_record(KernelLaunch launch) {
  Recording& r = t_recording;
  if (r.depth > 0 && (launch.stream != r.stream || launch.device != r.device)) {
    submit_recorded();
    r.stream = launch.stream;
    r.device = launch.device;
    r.stream_capturing = stream_is_capturing(launch.stream);
  }
  if (r.depth == 0 || r.stream_capturing) {
    launch_now(launch);
    return;
  }
  r.launches.push_back(std::move(launch));
}

void start_recording() { ++t_recording.depth; }

void submit_recorded() {
  Recording& r = t_recording;
  std::vector<KernelLaunch> launches = std::move(r.launches);
  r.launches.clear();
  if (launches.empty()) return;
  DeviceScope scope(r.device);
  if (launches.size() == 1) {
    launch_now(launches[0]);
  } else {
    launch_as_graph(launches, r.device, r.stream);
  }
}

void stop_recording() {
  Recording& r = t_recording;
  if (r.depth > 0 && --r.depth == 0) r = Recording{};
}

long graph_launches() { return g_graph_launches.load(); }

}  // namespace gg
