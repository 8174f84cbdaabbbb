// The worker runtime's compiled extension, one module (native.cpp binds it; native.py builds
// and loads it): the step guard's completion (native_guard.cpp), the exit holder
// (exit_holder.cpp) and the end line of a stack dump (stack_dump.cpp).

#pragma once

#include <torch/extension.h>

#include <string>

void bind_step_guard(py::module_& m);

// Starts this process's exit holder; its pid, or -errno (see exit_holder.py).
int start_exit_holder();

// Has `signum` write `line` to stderr (after faulthandler's dump, which chains to it); 0, or
// -errno (see stack_dump.py).
int install_stack_dump_end(int signum, const std::string& line);
