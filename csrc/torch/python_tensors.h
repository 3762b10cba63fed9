// Reading torch.Tensor arguments of the bridge's functions.
#pragma once

#include <Python.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/python_variable.h>

namespace gg_bridge {

// The tensor behind a torch.Tensor or nn.Parameter, else nullptr: subclasses
// (fake tensors, ...) may mean something else and take the Python twin.
inline const at::Tensor* tensor_of(PyObject* object) {
  return THPVariable_CheckExact(object) ? &THPVariable_Unpack(object) : nullptr;
}

}  // namespace gg_bridge
