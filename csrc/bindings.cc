// Module gg_runtime._C: what the generated tables say, the process-wide
// settings, and the capsule `runtime_api` (runtime_api.h) through which the
// torch operators (gg_runtime._ops, csrc/ops/) reach run().  No torch, no CUDA
// headers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <set>
#include <string>
#include <vector>

#include "dispatch.h"
#include "driver.h"
#include "launch_group.h"
#include "registry.h"
#include "run.h"
#include "runtime_api.h"

namespace py = pybind11;

namespace {

// {axis name: value} of a variant code of family f.
py::dict axis_values(const gg::FamilyInfo& f, int code) {
  py::dict out;
  for (size_t i = 0; i < f.axis_count; ++i) out[f.axes[i].name] = gg::axis_value(f, code, i);
  return out;
}

py::list variants() {
  py::list out;
  for (const gg::KernelInfo& k : gg::kernel_table()) {
    py::dict d;
    d["key"] = k.key;
    d["cubin"] = k.cubin;
    d["kernel_name"] = k.kernel_name;
    d["family"] = gg::families()[k.family].name;
    d["arch"] = k.arch;
    d["dtype"] = gg::dtypes()[k.dtype].name;
    d["out_dtype"] = gg::dtypes()[k.out_dtype].name;
    d["axes"] = axis_values(gg::families()[k.family], k.axes);
    d["flavour"] = gg::flavours()[k.flavour].name;
    d["block"] = py::make_tuple(k.block_m, k.block_n, k.block_k);
    d["max_rows"] = k.max_rows;
    d["num_warps"] = k.num_warps;
    d["num_ctas"] = k.num_ctas;
    d["shared"] = k.shared;
    d["scratch_size"] = k.scratch_size;
    d["scratch_align"] = k.scratch_align;
    out.append(d);
  }
  return out;
}

// The parameters a caller gives, in ABI order.
py::list describe_params(std::span<const gg::ParamInfo> params) {
  py::list out;
  for (const gg::ParamInfo& p : params) {
    out.append(py::make_tuple(p.name, std::string(1, p.kind), gg::role_name(p.role), p.tma_limit,
                              p.aligned));
  }
  return out;
}

// {axis name: its value names, in code order}.
py::dict describe_axes(std::span<const gg::AxisInfo> axes) {
  py::dict out;
  for (const gg::AxisInfo& axis : axes) {
    out[axis.name] = std::vector<std::string>(axis.values, axis.values + axis.value_count);
  }
  return out;
}

py::dict describe_constants(std::span<const gg::ConstantInfo> constants) {
  py::dict out;
  for (const gg::ConstantInfo& c : constants) out[c.name] = c.value;
  return out;
}

py::dict choices() {
  py::dict out;
  for (const gg::ChoiceInfo& c : gg::choices()) {
    out[c.name] = std::vector<std::string>(c.values, c.values + c.value_count);
  }
  return out;
}

py::dict families() {
  py::dict out;
  for (const gg::FamilyInfo& f : gg::families()) {
    py::dict d;
    d["params"] = describe_params(f.param_list());
    d["group_fields"] = describe_params(f.group_field_list());
    d["axes"] = describe_axes(f.axis_list());
    d["constants"] = describe_constants(f.constant_list());
    out[f.name] = d;
  }
  return out;
}

py::dict device_info(int device) {
  const gg::DeviceProps& p = gg::device_props(device);
  py::dict d;
  d["name"] = p.name;
  d["capability"] = py::make_tuple(p.major, p.minor);
  d["sm_count"] = p.sm_count;
  d["shared_per_block_optin"] = p.shared_optin;
  const gg::KernelPath path = gg::kernel_path(p);
  d["kernel_arch"] = path.arch == 0 ? py::object(py::none()) : py::object(py::int_(path.arch));
  d["path"] = path.arch == 0 ? "unsupported" : path.ptx ? "ptx (compiled by the driver)" : "cubin";
  const std::string reason = gg::unsupported_reason(device, p);
  if (!reason.empty()) d["reason"] = reason;
  return d;
}

// fn() for _ops, status and message instead of an exception.
template <typename Fn>
gg::RunStatus reporting(Fn fn, std::string* error) {
  try {
    fn();
    return gg::RunStatus::kOk;
  } catch (const gg::CudaError& e) {
    *error = e.what();
    return gg::RunStatus::kCudaError;
  } catch (const gg::UnsupportedDevice& e) {
    *error = e.what();
    return gg::RunStatus::kUnsupportedDevice;
  } catch (const std::invalid_argument& e) {
    *error = e.what();
    return gg::RunStatus::kInvalidArgument;
  } catch (const std::exception& e) {
    *error = e.what();
    return gg::RunStatus::kOther;
  }
}

gg::RunStatus run_reporting(const gg::Call& call, std::string* error) {
  return reporting([&] { gg::run(call); }, error);
}

gg::RunStatus submit_reporting(std::string* error) { return reporting(gg::submit_recorded, error); }

bool runs_tma(int device) {
  static const std::set<int> tma_archs = [] {
    std::set<int> archs;
    for (const gg::KernelInfo& k : gg::kernel_table()) {
      if (std::string(gg::flavours()[k.flavour].name) == "tma") archs.insert(k.arch);
    }
    return archs;
  }();
  return tma_archs.count(gg::kernel_path(gg::device_props(device)).arch) > 0;
}

const gg::RuntimeApi kRuntimeApi{
    gg::kRuntimeApiVersion, &run_reporting,       &gg::families,     &gg::dtypes,        &runs_tma,
    &gg::forces_family,     &gg::start_recording, &submit_reporting, &gg::stop_recording};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gg_runtime's launcher for AOT-compiled Triton kernels";
  auto base = py::handle(PyExc_RuntimeError);
  py::register_exception<gg::CudaError>(m, "CudaError", base);
  py::register_exception<gg::UnsupportedDevice>(m, "UnsupportedDeviceError", base);
  m.attr("runtime_api") = py::capsule(&kRuntimeApi, gg::kRuntimeApiCapsule);

  m.def("set_kernel_dir", &gg::set_kernel_dir);
  m.def("triton_version", &gg::triton_version);
  m.def("variants", &variants, "Every compiled variant, as in the generated kernel table.");
  m.def("families", &families,
        "Each family, in index order: its parameters and group fields (name, kind, role, "
        "tma_limit, aligned), its axes (name: values) and its constants (name: value).");
  m.def("choices", &choices,
        "Every Choice the families' axes and parameters take: name: its values, in code order.");
  m.def("device_info", &device_info, py::arg("device"));
  m.def("set_force_ptx", &gg::set_force_ptx, py::arg("on"),
        "Run the PTX kernels (compiled by the driver) on every GPU that can, cubins or not.");
  m.def("force_ptx", &gg::force_ptx);
  m.def("set_sm_limit", &gg::set_sm_limit, py::arg("sms"),
        "The most SMs this thread's launches fill (0: all); gg_runtime.settings.sm_limit.");
  m.def("sm_limit", &gg::sm_limit);
  m.def("set_override", &gg::set_override, py::arg("variant"), py::arg("basic_only"),
        "Test-only: force the variant with this key, or ('', True) only `basic` variants.");
  m.def(
      "last_variant",
      [] {
        const gg::KernelInfo* k = gg::last_variant();
        return std::string(k == nullptr ? "" : k->key);
      },
      "Key of the variant this thread's last launch ran ('' if it launched nothing).");
  m.def("last_programs", &gg::last_programs,
        "The programs (grid size) of this thread's last launch (0 if it launched nothing).");
  m.def("graph_launches", &gg::graph_launches,
        "Test-only: how many groups of recorded kernels this process launched as one CUDA "
        "graph.");
}
