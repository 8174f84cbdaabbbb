// The worker runtime's compiled extension, one module (native.cpp binds it; native.py builds
// and loads it): the step guard's completion (native_guard.cpp), the stable group's fast lane
// (fast_lane.cpp), the exit holder (exit_holder.cpp) and the end line of a stack dump
// (stack_dump.cpp).

#pragma once

#include <torch/extension.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

// Set by a failed collective (or by the step guard, which keeps every poison here when the
// extension is loaded), read by the training thread at the optimizer step and cleared at the
// next step. Only the first reason is kept: it names what failed first.
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

// A future that completes when `parent` does, with its value; if `parent` fails, it marks
// `poison` and completes with `outputs` (as they were left). Never raises on gloo's thread.
c10::intrusive_ptr<c10::ivalue::Future> guard_future(
    const c10::intrusive_ptr<c10::ivalue::Future>& parent,
    const std::vector<at::Tensor>& outputs,
    const std::shared_ptr<Poison>& poison);

void bind_step_guard(py::module_& m);
void bind_fast_lane(py::module_& m);

// Starts this process's exit holder; its pid, or -errno (see exit_holder.py).
int start_exit_holder();

// Has `signum` write `line` to stderr (after faulthandler's dump, which chains to it); 0, or
// -errno (see stack_dump.py).
int install_stack_dump_end(int signum, const std::string& line);
