// Module gg_runtime._C: raw pointers and sizes in, variant key out.  No torch,
// no CUDA headers: tensors are unpacked by the Python layer.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dispatch.h"
#include "driver.h"
#include "ops.h"
#include "registry.h"

namespace py = pybind11;

namespace {

gg::Target target(int device, uintptr_t stream, int dtype, bool allow_tma,
                  const std::string& variant) {
  if (dtype != static_cast<int>(gg::DType::kFloat16) &&
      dtype != static_cast<int>(gg::DType::kBFloat16)) {
    throw std::invalid_argument("unknown dtype code " + std::to_string(dtype));
  }
  return gg::Target{device, reinterpret_cast<gg::cu::Stream>(stream),
                    static_cast<gg::DType>(dtype), allow_tma, variant};
}

py::list variants() {
  static const char* families[] = {"list", "ragged_m", "ragged_k"};
  static const char* dtypes[] = {"float16", "bfloat16"};
  py::list out;
  for (size_t i = 0; i < gg::kernel_count(); ++i) {
    const gg::KernelInfo& k = gg::kernel_table()[i];
    py::dict d;
    d["key"] = k.key;
    d["cubin"] = k.cubin;
    d["kernel_name"] = k.kernel_name;
    d["family"] = families[static_cast<int>(k.family)];
    d["arch"] = k.arch;
    d["dtype"] = dtypes[static_cast<int>(k.dtype)];
    d["layout"] = std::string(k.a_t ? "t" : "n") + (k.b_t ? "t" : "n");
    d["flavour"] = k.tma ? "tma" : "basic";
    d["block"] = py::make_tuple(k.block_m, k.block_n, k.block_k);
    d["max_rows"] = k.max_rows;
    d["num_warps"] = k.num_warps;
    d["shared"] = k.shared;
    d["scratch_size"] = k.scratch_size;
    d["scratch_align"] = k.scratch_align;
    d["params"] = k.params;
    out.append(d);
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
  d["kernel_arch"] = p.arch == 0 ? py::object(py::none()) : py::object(py::int_(p.arch));
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gg_runtime's launcher for AOT-compiled Triton kernels";
  auto base = py::handle(PyExc_RuntimeError);
  py::register_exception<gg::CudaError>(m, "CudaError", base);
  py::register_exception<gg::UnsupportedDevice>(m, "UnsupportedDeviceError", base);

  m.def("set_kernel_dir", &gg::set_kernel_dir);
  m.def("triton_version", &gg::triton_version);
  m.def("variants", &variants, "Every compiled variant, as in the generated kernel table.");
  m.def("device_info", &device_info, py::arg("device"));

  m.def("run_list",
        [](int device, uintptr_t stream, int dtype, bool allow_tma,
           const std::string& variant, bool b_t, std::vector<int64_t> groups,
           uint64_t c_base, int64_t c_align) {
          gg::ListProblem p{b_t, std::move(groups), c_base, c_align};
          return gg::run_list(target(device, stream, dtype, allow_tma, variant), p);
        });
  m.def("run_ragged_m",
        [](int device, uintptr_t stream, int dtype, bool allow_tma,
           const std::string& variant, bool b_t, uint64_t a,
           uint64_t b, uint64_t out, uint64_t offs, int64_t rows, int64_t n, int64_t k,
           int64_t groups, int64_t lda, int64_t b_group_stride, int64_t ldb, int64_t ldc) {
          gg::RaggedMProblem p{b_t, a, b, out, offs, rows, n, k, groups,
                               lda, b_group_stride, ldb, ldc};
          return gg::run_ragged_m(target(device, stream, dtype, allow_tma, variant), p);
        });
  m.def("run_ragged_k",
        [](int device, uintptr_t stream, int dtype, bool allow_tma,
           const std::string& variant, bool a_t, uint64_t a,
           uint64_t b, uint64_t out, uint64_t offs, int64_t m, int64_t n, int64_t rows,
           int64_t groups, int64_t lda, int64_t ldb) {
          gg::RaggedKProblem p{a_t, a, b, out, offs, m, n, rows, groups, lda, ldb};
          return gg::run_ragged_k(target(device, stream, dtype, allow_tma, variant), p);
        });
}
