// The worker runtime's compiled extension, one module (native.cpp binds it; native.py builds
// and loads it): the step guard's completion (native_guard.cpp) and the exit holder
// (exit_holder.cpp).

#pragma once

#include <torch/extension.h>

void bind_step_guard(py::module_& m);

// Starts this process's exit holder; its pid, or -errno (see exit_holder.py).
int start_exit_holder();
