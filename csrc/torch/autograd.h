// grouped_mm with autograd recording, its node made in C++.
#pragma once

#include <Python.h>

namespace gg_bridge {

// with_autograd(forward, backward, case, a, b, offs, out_dtype) -> Tensor | None
PyObject* with_autograd(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

}  // namespace gg_bridge
