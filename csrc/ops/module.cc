// Module gg_runtime._ops: registers the torch operators gg_runtime::* (their
// schemas, and one kernel each for CUDA, Meta (shapes only, for torch.compile)
// and CPU (which only raises the error that names the argument)), and takes
// the runtime from gg_runtime._C when Python imports it.
#include <Python.h>
#include <family_args.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "ops.h"

namespace {

using gg::ops::combine;
using gg::ops::dispatch_plan;
using gg::ops::gathered_mm;
using gg::ops::gathered_mm_k;
using gg::ops::grouped_gemm;
using gg::ops::grouped_mm;
using gg::ops::grouped_mm_glu;
using gg::ops::moe_experts;
using gg::ops::moe_experts_for_backward;
using gg::ops::moe_experts_into;
using gg::ops::quantize_fp8;
using gg::ops::quantize_fp8_both_orientations;
using gg::ops::quantize_fp8_columns;
using gg::ops::received_slots;
using gg::ops::route;
using gg::ops::scaled_grouped_mm;
using gg::ops::scaled_grouped_mm_k;
using gg::ops::send_fp8_rows;
using gg::ops::send_rows;
using gg::ops::sum_peer_rows;
using gg::ops::swiglu;
using gg::ops::swiglu_backward;
using gg::ops::swiglu_backward_fp8;

using Boxed = void (*)(StableIValue*, uint64_t, uint64_t);

// A boxed operator as its Meta kernel: the same function in a ShapesOnly scope.
template <Boxed op>
void shapes_only(StableIValue* stack, uint64_t args, uint64_t outputs) {
  gg::ops::ShapesOnly scope;
  op(stack, args, outputs);
}

template <Boxed op, bool kShapesOnly>
constexpr Boxed kernel() {
  return kShapesOnly ? &shapes_only<op> : op;
}

template <bool kShapesOnly, typename Library>
void implement(Library& m) {
  m.impl("grouped_mm", kernel<TORCH_BOX(&grouped_mm), kShapesOnly>());
  m.impl("scaled_grouped_mm", kernel<TORCH_BOX(&scaled_grouped_mm), kShapesOnly>());
  m.impl("scaled_grouped_mm_k", kernel<TORCH_BOX(&scaled_grouped_mm_k), kShapesOnly>());
  m.impl("quantize_fp8", kernel<TORCH_BOX(&quantize_fp8), kShapesOnly>());
  m.impl("quantize_fp8_both_orientations",
         kernel<TORCH_BOX(&quantize_fp8_both_orientations), kShapesOnly>());
  m.impl("quantize_fp8_columns", kernel<TORCH_BOX(&quantize_fp8_columns), kShapesOnly>());
  m.impl("grouped_gemm", kernel<TORCH_BOX(&grouped_gemm), kShapesOnly>());
  m.impl("swiglu", kernel<TORCH_BOX(&swiglu), kShapesOnly>());
  m.impl("swiglu_backward", kernel<TORCH_BOX(&swiglu_backward), kShapesOnly>());
  m.impl("swiglu_backward_fp8", kernel<TORCH_BOX(&swiglu_backward_fp8), kShapesOnly>());
  m.impl("grouped_mm_glu", kernel<TORCH_BOX(&grouped_mm_glu), kShapesOnly>());
  m.impl("gathered_mm", kernel<TORCH_BOX(&gathered_mm), kShapesOnly>());
  m.impl("gathered_mm_k", kernel<TORCH_BOX(&gathered_mm_k), kShapesOnly>());
  m.impl("combine", kernel<TORCH_BOX(&combine), kShapesOnly>());
  m.impl("route", kernel<TORCH_BOX(&route), kShapesOnly>());
  m.impl("send_rows", kernel<TORCH_BOX(&send_rows), kShapesOnly>());
  m.impl("send_fp8_rows", kernel<TORCH_BOX(&send_fp8_rows), kShapesOnly>());
  m.impl("sum_peer_rows", kernel<TORCH_BOX(&sum_peer_rows), kShapesOnly>());
  m.impl("dispatch_plan", kernel<TORCH_BOX(&dispatch_plan), kShapesOnly>());
  m.impl("received_slots", kernel<TORCH_BOX(&received_slots), kShapesOnly>());
  m.impl("moe_experts", kernel<TORCH_BOX(&moe_experts), kShapesOnly>());
  m.impl("moe_experts_into", kernel<TORCH_BOX(&moe_experts_into), kShapesOnly>());
  m.impl("moe_experts_for_backward", kernel<TORCH_BOX(&moe_experts_for_backward), kShapesOnly>());
}

// Whether the runtime's families and dtypes are those the operators were
// generated for (family::DType's order is the runtime's dtype table's).
bool same_tables(const gg::RuntimeApi& api) {
  const auto families = api.families();
  if (families.size() != std::size(gg::family::kAll)) return false;
  for (size_t i = 0; i < families.size(); ++i) {
    const gg::family::Key& key = gg::family::kAll[i];
    if (key.name != std::string(families[i].name) || key.param_count != families[i].param_count) {
      return false;
    }
  }
  const auto dtypes = api.dtypes();
  const auto& names = gg::family::Names<gg::family::DType>::kValues;
  if (dtypes.size() != names.size()) return false;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (names[i] != dtypes[i].name) return false;
  }
  return true;
}

PyObject* set_poison(PyObject*, PyObject* on) {
  gg::ops::set_poison(PyObject_IsTrue(on) == 1);
  Py_RETURN_NONE;
}

PyObject* set_guards(PyObject*, PyObject* on) {
  gg::ops::set_guards(PyObject_IsTrue(on) == 1);
  Py_RETURN_NONE;
}

PyObject* guard_report(PyObject*, PyObject*) {
  std::vector<std::string> damaged;
  try {
    damaged = gg::ops::guard_report();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  PyObject* list = PyList_New(0);
  for (const std::string& line : damaged) {
    PyObject* text = PyUnicode_FromString(line.c_str());
    if (text == nullptr || PyList_Append(list, text) != 0) {
      Py_XDECREF(text);
      Py_DECREF(list);
      return nullptr;
    }
    Py_DECREF(text);
  }
  return list;
}

PyMethodDef kMethods[] = {
    {"set_poison", set_poison, METH_O, "Tests: fill every output with NaN before its launch."},
    {"set_guards", set_guards, METH_O,
     "Tests: put every output and scratch tensor between two canary-filled guard regions."},
    {"guard_report", guard_report, METH_NOARGS,
     "Tests: the guarded tensors whose guards were overwritten (synchronizes; forgets them)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT,
                       "_ops",
                       "gg_runtime's torch operators (torch.ops.gg_runtime)",
                       -1,
                       kMethods,
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr};

}  // namespace

STABLE_TORCH_LIBRARY(gg_runtime, m) {
  m.def(
      "grouped_mm(Tensor mat_a, Tensor mat_b, Tensor? offs=None, Tensor? bias=None, "
      "ScalarType? out_dtype=None, bool tf32=False) -> Tensor");
  m.def(
      "scaled_grouped_mm(Tensor mat_a, Tensor mat_b, Tensor scale_a, Tensor scale_b, "
      "Tensor? offs=None, Tensor? bias=None, Tensor? scale_result=None, "
      "ScalarType? out_dtype=None, bool use_fast_accum=False) -> Tensor");
  m.def(
      "scaled_grouped_mm_k(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs, "
      "int rows, str scaling, ScalarType? out_dtype=None) -> Tensor");
  m.def("quantize_fp8(Tensor x, str granularity='rowwise') -> (Tensor, Tensor)");
  m.def("quantize_fp8_both_orientations(Tensor x) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "quantize_fp8_columns(Tensor x, Tensor offs, str granularity='1x128', Tensor? rows=None, "
      "int k=1) -> (Tensor, Tensor)");
  m.def("grouped_gemm(Tensor[] As, Tensor[] Bs, bool trans_b=False) -> Tensor[]");
  m.def("swiglu(Tensor gu, str gate_up='concatenated', str activation='swiglu') -> Tensor");
  m.def(
      "swiglu_backward(Tensor gu, Tensor grad, Tensor scale, str gate_up='concatenated', "
      "str activation='swiglu') -> (Tensor, Tensor, Tensor)");
  m.def(
      "swiglu_backward_fp8(Tensor gu, Tensor grad, Tensor scale, Tensor offs, "
      "str gate_up='concatenated', str activation='swiglu', bool dgu_sums=False) -> "
      "(Tensor dgu, Tensor dgu_scale, "
      "Tensor dgu_columns, Tensor dgu_columns_scale, Tensor h_columns, Tensor h_columns_scale, "
      "Tensor dot, Tensor dgu_columns_sum)");
  m.def(
      "grouped_mm_glu(Tensor x, Tensor? rows, int k, Tensor w13, Tensor offs, Tensor? bias=None, "
      "str gate_up='concatenated', str activation='swiglu', bool save_gu=True) "
      "-> (Tensor, Tensor)");
  m.def("gathered_mm(Tensor x, Tensor rows, int k, Tensor b, Tensor offs) -> Tensor");
  m.def(
      "gathered_mm_k(Tensor a, Tensor b, Tensor offs, Tensor rows, int k, bool gather_a) "
      "-> Tensor");
  m.def("combine(Tensor rows, Tensor index, Tensor weights, Tensor offs) -> Tensor");
  m.def("route(Tensor ids, int experts) -> (Tensor, Tensor, Tensor)");
  m.def(
      "send_rows(Tensor rows, Tensor peers, Tensor ranks, Tensor dest, int blocks=1, "
      "Tensor? rows2=None, Tensor? peers2=None, Tensor? rows3=None, Tensor? peers3=None) -> ()");
  m.def(
      "send_fp8_rows(Tensor x, Tensor peers, Tensor scale_peers, Tensor ranks, Tensor dest, "
      "Tensor meta, Tensor meta_peers) -> ()");
  m.def("sum_peer_rows(Tensor region, Tensor peers, Tensor index, int first_row) -> Tensor");
  m.def(
      "dispatch_plan(Tensor topk_ids, Tensor topk_weights, int world, int rank, "
      "int experts_per_rank, int capacity) -> (Tensor dest, Tensor index, Tensor meta)");
  m.def(
      "received_slots(Tensor(a!) meta, int world, int rank, int experts_per_rank, int capacity) "
      "-> (Tensor ids, Tensor weights)");
  m.def(
      "moe_experts(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2, "
      "Tensor? b13=None, Tensor? b2=None, str gate_up='concatenated', "
      "str activation='swiglu', str weight_format='unquantized', Tensor? w13_scale=None, "
      "Tensor? w2_scale=None, Tensor? x_scale=None) -> Tensor");
  m.def(
      "moe_experts_into(Tensor(a!) into, Tensor x, Tensor topk_ids, Tensor topk_weights, "
      "Tensor w13, Tensor w2, Tensor? b13=None, Tensor? b2=None, str gate_up='concatenated', "
      "str activation='swiglu', str weight_format='unquantized', Tensor? w13_scale=None, "
      "Tensor? w2_scale=None, Tensor? x_scale=None) -> ()");
  m.def(
      "moe_experts_for_backward(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, "
      "Tensor w2, Tensor? b13=None, Tensor? b2=None, str gate_up='concatenated', "
      "str activation='swiglu', str weight_format='unquantized', Tensor? w13_scale=None, "
      "Tensor? w2_scale=None) -> (Tensor out, Tensor gu, Tensor order, Tensor offs, "
      "Tensor inverse, bool gathered)");
}

STABLE_TORCH_LIBRARY_IMPL(gg_runtime, CUDA, m) { implement<false>(m); }
STABLE_TORCH_LIBRARY_IMPL(gg_runtime, Meta, m) { implement<true>(m); }
STABLE_TORCH_LIBRARY_IMPL(gg_runtime, CPU, m) { implement<false>(m); }

PyMODINIT_FUNC PyInit__ops() {
  const auto* api = static_cast<const gg::RuntimeApi*>(PyCapsule_Import(gg::kRuntimeApiCapsule, 0));
  if (api == nullptr) return nullptr;
  if (api->version != gg::kRuntimeApiVersion || !same_tables(*api)) {
    PyErr_SetString(PyExc_ImportError, "gg_runtime._C and _ops come from different builds");
    return nullptr;
  }
  gg::ops::set_runtime(api);
  return PyModule_Create(&kModule);
}
