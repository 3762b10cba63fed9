// grouped_mm's eager autograd without torch.autograd.Function.apply: the
// output's node is a C++ torch::autograd::Node that saves a, b and offs and
// calls back into Python (library.py's backward) for the gradients.
// Function.apply spends several microseconds per call in generic Python-facing
// work (a ctx object, its PyNode, output wrapping); this does what it does for
// grouped_mm's arguments: forward without grad mode, inputs saved (version
// checks, saved-tensor hooks), edges to a and b, the output's history set.
#include "autograd.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <type_traits>
#include <utility>

#include "python_tensors.h"

namespace gg_bridge {
namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// An owned reference, released at the end of its scope (under the GIL).
class Ref {
 public:
  explicit Ref(PyObject* object) : object_(object) {}
  ~Ref() { Py_XDECREF(object_); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  PyObject* get() const { return object_; }

 private:
  PyObject* object_;
};

// Holds the GIL for a scope (the engine calls nodes from its own threads).
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

class GroupedMMBackward : public Node {
 public:
  // backward(case, a, b, offs, grad, need_a, need_b) -> (grad_a, grad_b)
  GroupedMMBackward(PyObject* backward, PyObject* case_of_call, const at::Tensor& a,
                    const at::Tensor& b, const at::Tensor* offs)
      : backward_(backward), case_(case_of_call), a_(a, false), b_(b, false) {
    if (offs != nullptr) offs_ = SavedVariable(*offs, false);
    Py_INCREF(backward_);  // last: a throw above leaves no reference behind
    Py_INCREF(case_);
  }

  ~GroupedMMBackward() override {
    if (!Py_IsInitialized()) return;  // at exit the interpreter owns nothing any more
    Gil gil;
    Py_DECREF(backward_);
    Py_DECREF(case_);
  }

  std::string name() const override { return "GroupedMMBackward"; }

  // Compiled autograd traces every node; this one calls Python it cannot
  // trace.  library.py records GroupedMM's node instead while compiled
  // autograd is on, so only a graph recorded before it was turned on gets here.
  void compiled_args(torch::autograd::CompiledNodeArgs&) const override {
    TORCH_CHECK_NOT_IMPLEMENTED(
        false,
        "gg_runtime.grouped_mm: this call was recorded while compiled autograd was off, and "
        "its node cannot be traced by compiled autograd; run the forward with compiled "
        "autograd on too (its calls then record a traceable node)");
  }

  void release_variables() override {
    a_.reset_data();
    b_.reset_data();
    offs_.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    // Unpacking raises torch's errors for a freed graph or an input modified in place.
    const at::Tensor a = a_.unpack(), b = b_.unpack(), offs = offs_.unpack();
    // An undefined output gradient stands for zeros (Function's materialize_grads).
    const at::Tensor grad = grads[0].defined() ? grads[0] : input_metadata(0).zeros_like();
    const bool need_a = task_should_compute_output(0), need_b = task_should_compute_output(1);
    Gil gil;
    const Ref result{PyObject_CallFunctionObjArgs(
        backward_, case_, Ref{THPVariable_Wrap(a)}.get(), Ref{THPVariable_Wrap(b)}.get(),
        Ref{THPVariable_Wrap(offs)}.get(), Ref{THPVariable_Wrap(grad)}.get(),
        need_a ? Py_True : Py_False, need_b ? Py_True : Py_False, nullptr)};
    if (result.get() == nullptr) {
      python_error error;
      error.persist();  // the engine raises it in the thread that called backward
      throw error;
    }
    return gradients(result.get());
  }

 private:
  // (grad_a, grad_b), each a tensor or None, from backward's result.
  static variable_list gradients(PyObject* result) {
    if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 2) {
      throw std::runtime_error("grouped_mm's backward must return (grad_a, grad_b)");
    }
    variable_list out(2);
    for (Py_ssize_t i = 0; i < 2; ++i) {
      PyObject* item = PyTuple_GET_ITEM(result, i);
      if (item != Py_None) out[i] = THPVariable_Unpack(item);
    }
    return out;
  }

  PyObject* backward_;
  PyObject* case_;
  SavedVariable a_, b_, offs_;
};

// The node pointer type of this torch: std::shared_ptr<Node> in older
// releases, c10::intrusive_ptr<Node> in newer ones.
using NodePtr = decltype(torch::autograd::Edge::function);

template <typename T, typename... Args>
NodePtr make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<Node>>) {
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...));
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

// A tensor this path takes: no forward-mode gradient and no functorch wrapper
// (those take the Python path, where Function.apply handles or refuses them).
bool plain(const at::Tensor& t) {
  const c10::DispatchKeySet keys = t.key_set();
  return !keys.has(c10::DispatchKey::FuncTorchGradWrapper) &&
         !keys.has(c10::DispatchKey::FuncTorchBatched) && !t._fw_grad(0).defined();
}

}  // namespace

PyObject* with_autograd(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "with_autograd takes 7 arguments");
    return nullptr;
  }
  PyObject *forward = args[0], *backward = args[1], *case_of_call = args[2];
  const at::Tensor *a = tensor_of(args[3]), *b = tensor_of(args[4]);
  const at::Tensor* offs = args[5] == Py_None ? nullptr : tensor_of(args[5]);
  if (a == nullptr || b == nullptr || (offs == nullptr && args[5] != Py_None) || !plain(*a) ||
      !plain(*b)) {
    Py_RETURN_NONE;
  }
  // Saved before the launch: an input that cannot be saved (an inference
  // tensor) raises torch's error with nothing launched.
  NodePtr node = make_node<GroupedMMBackward>(backward, case_of_call, *a, *b, offs);
  node->set_next_edges(torch::autograd::collect_next_edges(*a, *b));
  PyObject* out = nullptr;
  {
    at::AutoGradMode no_grad(false);  // as Function.apply runs forward
    // forward(case, a, b, offs, out_dtype)
    out = PyObject_Vectorcall(forward, args + 2, 5, nullptr);
  }
  if (out == nullptr) return nullptr;
  const at::Tensor* result = tensor_of(out);
  if (result == nullptr || result->is_view()) {  // the caller passes cases with fresh outputs only
    Py_DECREF(out);
    PyErr_SetString(PyExc_RuntimeError, "with_autograd: forward must return a new tensor");
    return nullptr;
  }
  torch::autograd::set_history(*result, node);
  return out;
  END_HANDLE_TH_ERRORS
}

}  // namespace gg_bridge
