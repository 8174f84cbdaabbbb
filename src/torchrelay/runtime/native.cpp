// The module the launcher compiles once per torch (native.py) and every worker loads.

#include "native.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  bind_step_guard(m);
  bind_fast_lane(m);
  m.def("start_exit_holder", &start_exit_holder);
  m.def("install_stack_dump_end", &install_stack_dump_end);
}
