// The step guard's per-collective completion in C++ (see guard.py and native.py for the
// contract; bound into the extension by native.cpp).
//
// Why C++: in Python, every all-reduce DDP launches ran one callback on gloo's thread, which
// had to take the GIL from the training thread: 2.5-4 % of a small model's CPU per step
// (docs/benchmarks.md, "Steady state"). Here the callback takes no GIL, so a healthy
// collective costs the step nothing but a chained future.

#include "native.h"

#include <torch/csrc/jit/python/pybind_utils.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

// Set by a failed collective, read by the training thread at the optimizer step and cleared
// at the next step. Only the first reason is kept: it names the collective that failed first.
class Poison {
 public:
  void mark(const std::string& reason) {
    std::lock_guard<std::mutex> hold(lock_);
    if (!set_.load()) {
      reason_ = reason;
      set_.store(true);
    }
  }

  void clear() {
    std::lock_guard<std::mutex> hold(lock_);
    reason_.clear();
    set_.store(false);
  }

  bool is_set() const { return set_.load(); }

  std::string reason() {
    std::lock_guard<std::mutex> hold(lock_);
    return reason_;
  }

 private:
  std::atomic<bool> set_{false};
  std::mutex lock_;
  std::string reason_;
};

// The caller's future for an in-place collective: completes when `inner` does, with its value;
// if `inner` fails, it marks `poison` and completes with `outputs` (as they were left), so
// DDP's reducer never sees an error. Never raises on gloo's thread.
std::shared_ptr<torch::jit::PythonFutureWrapper> guarded(
    const std::shared_ptr<torch::jit::PythonFutureWrapper>& inner,
    const std::vector<at::Tensor>& outputs,
    const std::shared_ptr<Poison>& poison) {
  c10::IValue fallback(outputs);
  auto child = inner->fut->then(
      [fallback, poison](c10::ivalue::Future& parent) -> c10::IValue {
        if (parent.hasError()) {
          poison->mark("collective failed: " + parent.tryRetrieveErrorMessage());
          return fallback;
        }
        return parent.value();
      },
      c10::ListType::create(c10::TensorType::get()));
  return std::make_shared<torch::jit::PythonFutureWrapper>(child);
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
