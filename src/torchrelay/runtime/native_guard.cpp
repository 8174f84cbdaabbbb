// The step guard's per-collective completion in C++ (see guard.py and native.py for the
// contract; bound into the extension by native.cpp).
//
// Why C++: in Python, every all-reduce DDP launches ran one callback on gloo's thread, which
// had to take the GIL from the training thread: 2.5-4 % of a small model's CPU per step
// (docs/benchmarks.md, "Steady state"). Here the callback takes no GIL, so a healthy
// collective costs the step nothing but a chained future.

#include "native.h"

#include <torch/csrc/jit/python/pybind_utils.h>

c10::intrusive_ptr<c10::ivalue::Future> guard_future(
    const c10::intrusive_ptr<c10::ivalue::Future>& parent,
    const std::vector<at::Tensor>& outputs,
    const std::shared_ptr<Poison>& poison) {
  c10::IValue fallback(outputs);
  return parent->then(
      [fallback, poison](c10::ivalue::Future& done) -> c10::IValue {
        if (done.hasError()) {
          poison->mark("collective failed: " + done.tryRetrieveErrorMessage());
          return fallback;
        }
        return done.value();
      },
      c10::ListType::create(c10::TensorType::get()));
}

namespace {

// guard_future for a future Python holds (StepGuard.chain_native).
std::shared_ptr<torch::jit::PythonFutureWrapper> guarded(
    const std::shared_ptr<torch::jit::PythonFutureWrapper>& inner,
    const std::vector<at::Tensor>& outputs,
    const std::shared_ptr<Poison>& poison) {
  return std::make_shared<torch::jit::PythonFutureWrapper>(
      guard_future(inner->fut, outputs, poison));
}

}  // namespace

void bind_step_guard(py::module_& m) {
  py::class_<Poison, std::shared_ptr<Poison>>(m, "Poison")
      .def(py::init<>())
      .def("mark", &Poison::mark)
      .def("clear", &Poison::clear)
      .def_property_readonly("set", &Poison::is_set)
      .def_property_readonly("reason", &Poison::reason);
  m.def("guarded", &guarded);
}
