#include "run.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "dispatch.h"
#include "driver.h"
#include "launch.h"
#include "launch_group.h"

namespace gg {
namespace {

thread_local const KernelInfo* t_last = nullptr;
thread_local int t_sm_limit = 0;
thread_local unsigned t_last_programs = 0;

constexpr int64_t kTmaAlignBytes = 16;

// What the flavour rules ask of one parameter's values, over one call or over
// every busy group of a group table: each rule tests divisibility by a power
// of two (the low bits of the OR), a sign (the minimum) or a bound (the
// maximum), so one summary decides a rule for all the values at once.
struct Values {
  int64_t bits = 0;       // OR of the values
  int64_t byte_bits = 0;  // OR of value * element bytes (strides in bytes)
  int64_t min = std::numeric_limits<int64_t>::max();
  int64_t max = std::numeric_limits<int64_t>::min();

  void add(int64_t value, int element_bytes) {
    bits |= value;
    byte_bits |= value * element_bytes;
    min = std::min(min, value);
    max = std::max(max, value);
  }
};

// Do values given for a parameter of p's role meet TMA's rules?  The TMA
// flavour's kernels are compiled assuming what this checks (aot/variants.py
// divisible_params): whatever it stops checking, they must stop assuming.
bool tma_allows(const ParamInfo& p, const Values& v) {
  if (p.tma_limit != 0 && v.max > p.tma_limit) return false;
  switch (p.role) {
    case Role::kOperand:
    case Role::kOutput:
      return v.bits % kTmaAlignBytes == 0;
    case Role::kStride:
      return v.min > 0 && v.byte_bits % kTmaAlignBytes == 0;
    case Role::kRowLength:
      return v.byte_bits % kTmaAlignBytes == 0;
    default:
      return true;
  }
}

bool meets(Rule rule, const ParamInfo& p, const Values& v) {
  switch (rule) {
    case Rule::kTma:
      return tma_allows(p, v);
    case Rule::kAligned:
      return !p.aligned || v.bits % 16 == 0;
    case Rule::kNone:
      return true;
  }
  return false;
}

// Bit f set: the values summarised in `values` (one per parameter) meet
// flavours()[f]'s rule.
unsigned flavours_met(std::span<const ParamInfo> params, std::span<const Values> values) {
  const std::span<const FlavourInfo> all = flavours();
  unsigned met = 0;
  for (size_t f = 0; f < all.size(); ++f) {
    bool ok = true;
    for (size_t i = 0; i < params.size() && ok; ++i) ok = meets(all[f].rule, params[i], values[i]);
    if (ok) met |= 1u << f;
  }
  return met;
}

// A size expression evaluated with 1x1x1 tiles counts output elements: it is
// zero exactly when there is nothing to compute.
const KernelInfo& unit_tiles() {
  static const KernelInfo unit = [] {
    KernelInfo k{};
    k.block_m = k.block_n = k.block_k = 1;
    return k;
  }();
  return unit;
}

// What dispatch needs to know before a variant is chosen.
struct Survey {
  bool empty = true;
  unsigned flavours_ok = ~0u;  // bit f: every value meets flavours()[f]'s rule
  long rows = 0;               // per group, the bucket key
  unsigned conditions = 0;     // bit i: the family's condition i holds
};

Survey survey_call(const FamilyInfo& f, const Call& c, int element_bytes) {
  Survey s;
  s.empty = f.tiles(c.args.data(), unit_tiles()) == 0;
  s.rows = static_cast<long>(f.rows(c.args.data(), unit_tiles()));
  for (size_t i = 0; i < f.condition_count; ++i) {
    if (f.conditions[i](c.args.data(), unit_tiles()) != 0) s.conditions |= 1u << i;
  }
  std::vector<Values> values(f.param_count);
  for (size_t i = 0; i < f.param_count; ++i) values[i].add(c.args[i], element_bytes);
  s.flavours_ok = flavours_met(f.param_list(), values);
  return s;
}

// Over the groups that have output elements: rows averaged, flavour rules for all.
Survey survey_groups(const FamilyInfo& f, const Call& c, int element_bytes) {
  const size_t width = f.group_field_count;
  if (c.groups.size() % width != 0) {
    throw std::invalid_argument(std::string(f.name) + ": " + std::to_string(c.groups.size()) +
                                " group words is not a multiple of " + std::to_string(width));
  }
  Survey s;
  int64_t rows = 0, busy = 0;
  std::vector<Values> values(width);  // over the busy groups
  for (size_t g = 0; g < c.groups.size() / width; ++g) {
    const int64_t* fields = c.groups.data() + g * width;
    check_int32(f.group_field_list(), fields, static_cast<long>(g));
    if (f.tiles(fields, unit_tiles()) == 0) continue;  // no tile ever touches this group
    rows += f.rows(fields, unit_tiles());
    ++busy;
    for (size_t i = 0; i < width; ++i) values[i].add(fields[i], element_bytes);
  }
  s.flavours_ok = flavours_met(f.group_field_list(), values);
  s.empty = busy == 0;
  s.rows = static_cast<long>(busy == 0 ? 0 : rows / busy);
  return s;
}

void refuse_capture(const FamilyInfo& f, cu::Stream stream) {
  if (stream_is_capturing(stream)) {
    throw std::invalid_argument(
        std::string("this call (kernel family ") + f.name +
        ") copies its per-group metadata from host memory and cannot be captured in a CUDA "
        "graph; use grouped_mm (device-side offsets) inside graphs");
  }
}

// Copies the group table and its tile prefix to the device in one upload and
// points the runtime-filled parameters at them.  Returns the call's tiles.
int64_t stage_group_table(const FamilyInfo& f, const KernelInfo& k, const Call& c,
                          std::vector<int64_t>& args, std::optional<StreamBuffer>& buffer) {
  const size_t width = f.group_field_count, groups = c.groups.size() / width;
  std::vector<int64_t> words(c.groups);
  words.reserve(c.groups.size() + groups);
  int64_t tiles = 0;
  for (size_t g = 0; g < groups; ++g) {
    tiles += f.tiles(c.groups.data() + g * width, k);
    words.push_back(tiles);
  }
  const size_t bytes = words.size() * sizeof(int64_t);
  buffer.emplace(c.device, c.stream, bytes);
  upload_async(c.stream, buffer->ptr(), words.data(), bytes);
  for (size_t i = 0; i < f.param_count; ++i) {
    switch (f.params[i].role) {
      case Role::kGroupTable:
        args[i] = static_cast<int64_t>(buffer->ptr());
        break;
      case Role::kTilePrefix:
        args[i] = static_cast<int64_t>(buffer->ptr() + c.groups.size() * sizeof(int64_t));
        break;
      case Role::kCount:
        args[i] = static_cast<int64_t>(groups);
        break;
      default:
        break;
    }
  }
  return tiles;
}

// The programs a launch may have: the resident wave, or the calling thread's
// SM limit's share of it (programs per SM times the SMs allowed).
int64_t limited_wave(int64_t wave, int sm_count) {
  if (t_sm_limit <= 0 || t_sm_limit >= sm_count) return wave;
  return std::max<int64_t>(1, wave * t_sm_limit / sm_count);
}

}  // namespace

void set_sm_limit(int sms) {
  if (sms < 0) throw std::invalid_argument("the SM limit must be >= 0, got " + std::to_string(sms));
  t_sm_limit = sms;
}

int sm_limit() { return t_sm_limit; }

void run(const Call& c) {
  t_last = nullptr;
  const FamilyInfo& f = families()[c.family];
  if (c.args.size() != f.param_count) {
    throw std::invalid_argument(std::string(f.name) + " takes " + std::to_string(f.param_count) +
                                " arguments, got " + std::to_string(c.args.size()));
  }
  // TMA's stride rule, checked against the narrower type, holds for both.
  const int element_bytes = std::min(dtypes()[c.dtype].bytes, dtypes()[c.out_dtype].bytes);
  const Survey s =
      f.has_group_table() ? survey_groups(f, c, element_bytes) : survey_call(f, c, element_bytes);
  if (s.empty) return;
  DeviceScope scope(c.device);
  const DeviceProps& props = device_props(c.device);
  const KernelPath path = kernel_path(props);
  if (path.arch == 0) throw UnsupportedDevice(unsupported_reason(c.device, props));
  if (f.has_group_table()) refuse_capture(f, c.stream);
  const Request request{path.arch, c.family,      c.dtype, c.out_dtype,
                        c.axes,    s.flavours_ok, s.rows,  s.conditions};
  const size_t index = pick_variant(request, props);
  const KernelInfo& k = kernel_table()[index];
  const ReadyKernel ready = ready_kernel(index, path.ptx, c.device, props.shared_optin);
  std::vector<int64_t> args(c.args);
  std::optional<StreamBuffer> table;
  const int64_t tiles =
      f.has_group_table() ? stage_group_table(f, k, c, args, table) : f.tiles(args.data(), k);
  if (tiles > std::numeric_limits<int32_t>::max()) {  // kernels number tiles in int32
    throw std::invalid_argument("more than 2**31 output tiles in one call; split the problem");
  }
  const auto programs =
      static_cast<unsigned>(std::min<int64_t>(tiles, limited_wave(ready.wave, props.sm_count)));
  std::vector<uint64_t> slots = pack_args(f.param_list(), args);
  std::optional<StreamBuffer> graph_memory;
  const cu::DevicePtr scratch =
      launch_scratch(c.device, c.stream, scratch_bytes(k, programs), graph_memory);
  launch(k, ready.function, programs, c.stream, c.device, std::move(slots), scratch);
  // The table's stream-ordered free (its destructor) follows the launch.
  if (table) submit_recorded();
  t_last = &k;
  t_last_programs = programs;
}

const KernelInfo* last_variant() { return t_last; }
unsigned last_programs() { return t_last == nullptr ? 0 : t_last_programs; }

}  // namespace gg
