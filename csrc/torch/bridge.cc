// Module gg_runtime._torch_C: the hot paths of grouped_gemm and grouped_mm
// with the tensors read and the outputs made in C++ (libtorch), where Python
// pays ~1 us per tensor attribute.  Built against the torch of the build;
// gg_runtime/_native.py loads it only under that torch version (libtorch's
// C++ ABI is not stable across versions) and uses the Python twins otherwise.
//
// Each function does what its Python twin (gemm_list.grouped_gemm,
// ragged.ragged_m, ragged.ragged_k) does for the inputs it takes, and returns
// None for every other input: the twin then runs, copying or raising the
// error that names the argument.  Launches go through _C's runtime
// (runtime_api.h): one state per process.
#include <Python.h>

#include <ATen/ATen.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "../runtime_api.h"
#include "autograd.h"
#include "python_tensors.h"

namespace {

using gg_bridge::tensor_of;

const gg::RuntimeApi* g_api = nullptr;
bool g_poison = false;  // tests: fill every output with NaN before the launch

// One family's caller-given parameters, bound by name to their ABI positions.
template <size_t N>
struct Binding {
  int family = -1;
  size_t param_count = 0;
  std::array<size_t, N> slot{};

  std::vector<int64_t> args(const std::array<int64_t, N>& values) const {
    std::vector<int64_t> out(param_count, 0);
    for (size_t i = 0; i < N; ++i) out[slot[i]] = values[i];
    return out;
  }
};

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The family's caller-given parameters must be exactly `names` (any order).
template <size_t N>
Binding<N> bind_family(const char* family, const std::array<const char*, N>& names) {
  const auto families = g_api->families();
  Binding<N> b;
  for (size_t f = 0; f < families.size(); ++f) {
    if (std::string(families[f].name) == family) b.family = static_cast<int>(f);
  }
  if (b.family < 0) throw std::runtime_error(std::string("no kernel family ") + family);
  const gg::FamilyInfo& info = families[b.family];
  b.param_count = info.param_count;
  std::vector<std::string> given;
  for (const gg::ParamInfo& p : info.param_list()) {
    if (info.caller_gives(p)) given.push_back(p.name);
  }
  bool same = given.size() == N;
  for (size_t i = 0; i < N && same; ++i) {
    same = false;
    for (size_t j = 0; j < info.param_count; ++j) {
      if (std::string(info.params[j].name) == names[i] && info.caller_gives(info.params[j])) {
        b.slot[i] = j;
        same = true;
      }
    }
  }
  if (!same) {
    throw std::runtime_error(std::string("the build's ") + family + " family takes (" +
                             joined(given) + "), which csrc/torch/bridge.cc does not name");
  }
  return b;
}

constexpr std::array<const char*, 14> kRaggedMParams{
    "a_ptr", "b_ptr", "c_ptr",          "offs_ptr", "T",   "N",        "K",
    "G",     "lda",   "b_group_stride", "ldb",      "ldc", "bias_ptr", "has_bias"};
constexpr std::array<const char*, 11> kRaggedKParams{
    "a_ptr", "b_ptr", "c_ptr", "offs_ptr", "M", "N", "T", "G", "lda", "ldb", "ldc"};
// One group's words of the list family, in the kernel's order (checked at import).
constexpr std::array<const char*, 9> kListFields{"a", "b", "c", "M", "N", "K", "lda", "ldb", "ldc"};
constexpr size_t kListC = 2, kListM = 3, kListN = 4;

Binding<14> g_ragged_m;
Binding<11> g_ragged_k;
Binding<1> g_list;  // its one caller-given parameter: the group table

void check_list_fields() {
  const gg::FamilyInfo& f = g_api->families()[g_list.family];
  bool same = f.group_field_count == kListFields.size();
  for (size_t i = 0; i < kListFields.size() && same; ++i) {
    same = std::string(f.group_fields[i].name) == kListFields[i];
  }
  if (!same) throw std::runtime_error("the build's list group fields differ from bridge.cc's");
}

int64_t address(const at::Tensor& t) { return reinterpret_cast<int64_t>(t.data_ptr()); }

// A call of `family` on the target Python gives as the last four of the
// `expected` arguments: _native.target's (device, stream, dtype, out_dtype).
bool begin_call(const char* function, PyObject* const* args, Py_ssize_t nargs, Py_ssize_t expected,
                int family, gg::Call& call) {
  if (nargs != expected) {
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", function, expected);
    return false;
  }
  PyObject* const* target = args + expected - 4;
  call.family = family;
  call.device = static_cast<int>(PyLong_AsLong(target[0]));
  call.stream = static_cast<gg::cu::Stream>(PyLong_AsVoidPtr(target[1]));
  call.dtype = static_cast<int>(PyLong_AsLong(target[2]));
  call.out_dtype = static_cast<int>(PyLong_AsLong(target[3]));
  return !PyErr_Occurred();
}

at::Tensor new_output(at::IntArrayRef shape, const at::TensorOptions& options) {
  at::Tensor out = at::empty(shape, options);
  if (g_poison) out.fill_(NAN);
  return out;
}

// A tensor on `buffer`'s storage; not an autograd view (grouped_gemm's
// outputs are not differentiable), which costs a fraction of one.
at::Tensor slice(const at::Tensor& buffer, int64_t rows, int64_t cols, int64_t row_stride,
                 int64_t offset) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(buffer.storage()),
                                                          buffer.key_set(), buffer.dtype());
  const std::array<int64_t, 2> sizes{rows, cols}, strides{row_stride, 1};
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, std::make_optional(offset));
  return t;
}

PyObject* wrap_list(std::vector<at::Tensor>& tensors) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(tensors.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < tensors.size(); ++i) {
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), THPVariable_Wrap(std::move(tensors[i])));
  }
  return list;
}

// The group words (c left 0) as gemm_list._group_words makes them, or false
// where a group fails gemm_list's combined test.
bool group_words(PyObject** as, PyObject** bs, size_t groups, bool trans_b, const at::Tensor& ref,
                 std::vector<int64_t>& words) {
  words.reserve(groups * kListFields.size());
  const int device = ref.get_device();
  for (size_t g = 0; g < groups; ++g) {
    const at::Tensor* a = tensor_of(as[g]);
    const at::Tensor* b = tensor_of(bs[g]);
    if (a == nullptr || b == nullptr || a->dim() != 2 || b->dim() != 2) return false;
    const int64_t m = a->size(0), k = a->size(1), b_rows = b->size(0), b_cols = b->size(1);
    const int64_t n = trans_b ? b_rows : b_cols, b_k = trans_b ? b_cols : b_rows;
    if (a->scalar_type() != ref.scalar_type() || b->scalar_type() != ref.scalar_type() ||
        !a->is_cuda() || !b->is_cuda() || a->get_device() != device || b->get_device() != device ||
        k != b_k || (a->stride(1) != 1 && k > 1) || (b->stride(1) != 1 && b_cols > 1)) {
      return false;
    }
    words.insert(words.end(), {address(*a), address(*b), 0, m, n, k, a->stride(0), b->stride(0),
                               n});  // C_i is contiguous
  }
  return true;
}

// gemm_list._MIXED_N_ALIGN: with mixed N every C_i starts at a multiple of
// this many elements (128 bytes), so every C_i can take TMA stores.
constexpr int64_t kMixedNAlign = 64;

// The outputs as gemm_list._outputs makes them, their addresses in words.
std::vector<at::Tensor> outputs(std::vector<int64_t>& words, const at::Tensor& ref) {
  const size_t width = kListFields.size(), groups = words.size() / width;
  const int64_t n0 = words[kListN];
  bool equal_n = true;
  int64_t rows = 0, elements = 0;
  for (size_t g = 0; g < groups; ++g) {
    const int64_t m = words[g * width + kListM], n = words[g * width + kListN];
    equal_n = equal_n && n == n0;
    rows += m;
    elements += (m * n + kMixedNAlign - 1) / kMixedNAlign * kMixedNAlign;
  }
  const at::Tensor buffer =
      equal_n ? new_output({rows, n0}, ref.options()) : new_output({elements}, ref.options());
  const int64_t base = address(buffer), size = static_cast<int64_t>(ref.element_size());
  const int64_t row_stride = equal_n ? buffer.stride(0) : 0;
  std::vector<at::Tensor> out;
  out.reserve(groups);
  int64_t offset = 0;
  for (size_t g = 0; g < groups; ++g) {
    const int64_t m = words[g * width + kListM], n = words[g * width + kListN];
    out.push_back(slice(buffer, m, n, equal_n ? row_stride : n, offset));
    words[g * width + kListC] = base + size * offset;
    offset += equal_n ? m * row_stride : (m * n + kMixedNAlign - 1) / kMixedNAlign * kMixedNAlign;
  }
  return out;
}

// grouped_gemm(As, Bs, trans_b, device, stream, dtype, out_dtype) -> list | None
// As[0] is checked (a 2-D CUDA tensor of a list-family dtype) by the caller.
PyObject* grouped_gemm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  gg::Call call{};
  if (!begin_call("grouped_gemm", args, nargs, 7, g_list.family, call)) return nullptr;
  PyObject *as = args[0], *bs = args[1];
  const auto is_sequence = [](PyObject* o) {
    return PyList_CheckExact(o) || PyTuple_CheckExact(o);
  };
  if (!is_sequence(as) || !is_sequence(bs) || PySequence_Fast_GET_SIZE(as) == 0 ||
      PySequence_Fast_GET_SIZE(as) != PySequence_Fast_GET_SIZE(bs)) {
    Py_RETURN_NONE;
  }
  PyObject** a_items = PySequence_Fast_ITEMS(as);
  const at::Tensor* ref = tensor_of(a_items[0]);
  const size_t groups = static_cast<size_t>(PySequence_Fast_GET_SIZE(as));
  std::vector<int64_t> words;
  const bool trans_b = PyObject_IsTrue(args[2]) == 1;
  if (ref == nullptr ||
      !group_words(a_items, PySequence_Fast_ITEMS(bs), groups, trans_b, *ref, words)) {
    Py_RETURN_NONE;
  }
  std::vector<at::Tensor> cs = outputs(words, *ref);
  call.args.assign(g_list.param_count, 0);
  call.groups = std::move(words);
  call.layout = trans_b ? "nt" : "nn";
  if (!g_api->run(call)) return nullptr;
  return wrap_list(cs);
  END_HANDLE_TH_ERRORS
}

// A grouped_mm call's tensors and output dtype, as ragged_m and ragged_k take
// them: (a, b, offs, out_dtype, device, stream, dtype, out_dtype_code).
struct RaggedCall {
  gg::Call call{};
  const at::Tensor *a = nullptr, *b = nullptr, *offs = nullptr;
  at::ScalarType out_type{};
  bool read = false;  // three tensors and a torch.dtype were given; else the twin runs
};

// Reads a ragged call's arguments; false (an exception set) on a malformed call.
bool read_ragged_call(const char* function, PyObject* const* args, Py_ssize_t nargs, int family,
                      RaggedCall& r) {
  if (!begin_call(function, args, nargs, 8, family, r.call)) return false;
  r.a = tensor_of(args[0]);
  r.b = tensor_of(args[1]);
  r.offs = tensor_of(args[2]);
  r.read = r.a != nullptr && r.b != nullptr && r.offs != nullptr && THPDtype_Check(args[3]);
  if (r.read) r.out_type = reinterpret_cast<THPDtype*>(args[3])->scalar_type;
  return true;
}

// Launches r.call (its args and layout set) writing `out`; returns it to Python.
PyObject* launch_into(RaggedCall& r, at::Tensor out) {
  if (!g_api->run(r.call)) return nullptr;
  return THPVariable_Wrap(std::move(out));
}

// ragged_m(a, b, offs, out_dtype, device, stream, dtype, out_dtype_code) -> Tensor | None
// Inputs classify() has checked as the ragged-M case; out_dtype a torch.dtype.
PyObject* ragged_m(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  RaggedCall r;
  if (!read_ragged_call("ragged_m", args, nargs, g_ragged_m.family, r)) return nullptr;
  if (!r.read) Py_RETURN_NONE;
  const at::Tensor &a = *r.a, &b = *r.b;
  const int64_t rows = a.size(0), k = a.size(1), groups = b.size(0), n = b.size(2);
  if (groups == 0 || (a.stride(1) != 1 && k > 1)) Py_RETURN_NONE;  // the twin zeroes / copies
  // b[g] is [K, N]: row-major (nn) or stored transposed (nt), as ragged._layout reads it.
  const int64_t row_stride = b.stride(1), col_stride = b.stride(2);
  const bool nn = n <= 1 || col_stride == 1;
  if (!nn && !(k <= 1 || row_stride == 1)) Py_RETURN_NONE;
  at::Tensor out = new_output({rows, n}, a.options().dtype(r.out_type));
  r.call.args = g_ragged_m.args({address(a), address(b), address(out), address(*r.offs), rows, n, k,
                                 groups, a.stride(0), b.stride(0), nn ? row_stride : col_stride, n,
                                 0, 0});  // no bias
  r.call.layout = nn ? "nn" : "nt";
  return launch_into(r, std::move(out));
  END_HANDLE_TH_ERRORS
}

// ragged_k(a, b, offs, out_dtype, device, stream, dtype, out_dtype_code) -> Tensor | None
// Inputs classify() has checked as the ragged-K case; out_dtype a torch.dtype.
// Takes the weight gradient's layout, which ragged.ragged_k reads as 'tn'
// without a copy: a [M, T] a transposed view of a row-major [T, M] (x.t()), b
// [T, N] row-major.  Every other layout is the twin's (it reads a row-major a
// in place where TMA can, else copies).
PyObject* ragged_k(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  RaggedCall r;
  if (!read_ragged_call("ragged_k", args, nargs, g_ragged_k.family, r)) return nullptr;
  if (!r.read) Py_RETURN_NONE;
  const at::Tensor &a = *r.a, &b = *r.b;
  const int64_t m = a.size(0), tokens = a.size(1), n = b.size(1), groups = r.offs->size(0);
  if (a.stride(0) != 1 || (b.stride(1) != 1 && n > 1)) Py_RETURN_NONE;
  at::Tensor out = new_output({groups, m, n}, a.options().dtype(r.out_type));
  r.call.args = g_ragged_k.args({address(a), address(b), address(out), address(*r.offs), m, n,
                                 tokens, groups, a.stride(1), b.stride(0), n});
  r.call.layout = "tn";
  return launch_into(r, std::move(out));
  END_HANDLE_TH_ERRORS
}

PyObject* set_poison(PyObject*, PyObject* on) {
  g_poison = PyObject_IsTrue(on) == 1;
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"grouped_gemm", reinterpret_cast<PyCFunction>(grouped_gemm), METH_FASTCALL,
     "grouped_gemm(As, Bs, trans_b, device, stream, dtype, out_dtype): the Cs, or None where "
     "gemm_list's Python path must run."},
    {"ragged_m", reinterpret_cast<PyCFunction>(ragged_m), METH_FASTCALL,
     "ragged_m(a, b, offs, out_dtype, device, stream, dtype, out_dtype_code): the output, or "
     "None where ragged.ragged_m's Python path must run."},
    {"ragged_k", reinterpret_cast<PyCFunction>(ragged_k), METH_FASTCALL,
     "ragged_k(a, b, offs, out_dtype, device, stream, dtype, out_dtype_code): the output, or "
     "None where ragged.ragged_k's Python path must run."},
    {"with_autograd", reinterpret_cast<PyCFunction>(gg_bridge::with_autograd), METH_FASTCALL,
     "with_autograd(forward, backward, case, a, b, offs, out_dtype): forward(case, a, b, offs, "
     "out_dtype) without grad mode, its output given a C++ autograd node that calls "
     "backward(case, a, b, offs, grad, need_a, need_b) -> (grad_a, grad_b); None where "
     "Function.apply must run (forward-mode gradients, functorch wrappers, non-tensors)."},
    {"set_poison", set_poison, METH_O, "Tests: fill every output with NaN before its launch."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_torch_C",
                       "grouped_gemm and grouped_mm hot paths reading tensors in C++", -1,
                       kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__torch_C() {
  g_api = static_cast<const gg::RuntimeApi*>(PyCapsule_Import(gg::kRuntimeApiCapsule, 0));
  if (g_api == nullptr) return nullptr;
  if (g_api->version != gg::kRuntimeApiVersion) {
    PyErr_SetString(PyExc_ImportError, "gg_runtime._C and _torch_C come from different builds");
    return nullptr;
  }
  try {
    g_ragged_m = bind_family("ragged_m", kRaggedMParams);
    g_ragged_k = bind_family("ragged_k", kRaggedKParams);
    g_list = bind_family("list", std::array<const char*, 1>{"group_table"});
    check_list_fields();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ImportError, e.what());
    return nullptr;
  }
  return PyModule_Create(&kModule);
}
