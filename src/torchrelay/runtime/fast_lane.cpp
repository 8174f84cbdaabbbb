// The stable group's all-reduces and broadcasts in C++, for the steady state (fast_lane.py
// states the contract; bound into the extension by native.cpp).
//
// Why C++: DDP calls its process group from C++. A ProcessGroup written in Python is called
// back through pybind for every collective (take the GIL, run the Python body, build the guard's
// entry), 1-2 % of a small model's step (docs/benchmarks.md, "Steady state"). Registered as the
// stable group's backend, this runs a collective with no Python at all once the Python side
// has armed it; anything else (local answers, set-up, hosting, a poisoned or aborted step) goes
// to the Python path, which is the reference.

#include "native.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <chrono>
#include <map>
#include <optional>
#include <utility>

namespace {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;
using BackendPtr = c10::intrusive_ptr<c10d::Backend>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// CLOCK_MONOTONIC, as Python's time.monotonic().
double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

WorkPtr completed(const std::vector<at::Tensor>& outputs) {
  auto future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  future->markCompleted(c10::IValue(outputs));
  return c10d::Work::create_from_future(future);
}

py::object wrap(const FuturePtr& future) {
  if (!future) {
    return py::none();
  }
  return py::cast(std::make_shared<torch::jit::PythonFutureWrapper>(future));
}

class Lane {
 public:
  // `slow(kind, tensors, opts)` runs a collective the lane does not (the Python path);
  // `watch(future)` watches a collective an abort released before it had started. Both are
  // kept for the process's life: dropping them needs the GIL, which the thread that drops
  // the last reference to the backend may not be able to take.
  Lane(std::shared_ptr<Poison> poison, py::object slow, py::object watch)
      : poison_(std::move(poison)), slow_(slow.release().ptr()), watch_(watch.release().ptr()) {}

  int64_t epoch() {
    std::lock_guard<std::mutex> hold(lock_);
    return epoch_;
  }

  // Run collectives on `inner` from now on, unless the lane was disarmed since `epoch` was
  // read (the state the caller checked may be stale then).
  bool arm(BackendPtr inner, int64_t generation, int64_t epoch) {
    std::lock_guard<std::mutex> hold(lock_);
    if (epoch != epoch_) {
      return false;
    }
    inner_ = std::move(inner);
    generation_ = generation;
    return true;
  }

  void disarm() {
    std::lock_guard<std::mutex> hold(lock_);
    disarm_locked();
  }

  // Disarm and hand over every collective still in flight: (generation, its future, or none
  // if it has not started yet; its launcher then watches it itself).
  std::vector<std::pair<int64_t, FuturePtr>> drain() {
    std::lock_guard<std::mutex> hold(lock_);
    disarm_locked();
    std::vector<std::pair<int64_t, FuturePtr>> pending;
    for (const auto& [id, entry] : entries_) {
      if (!entry.ended()) {
        pending.emplace_back(entry.generation, entry.future);
      }
    }
    entries_.clear();
    return pending;
  }

  std::optional<double> oldest_start() {
    std::lock_guard<std::mutex> hold(lock_);
    std::optional<double> oldest;
    for (const auto& [id, entry] : entries_) {
      if (!entry.ended() && (!oldest || entry.started < *oldest)) {
        oldest = entry.started;
      }
    }
    return oldest;
  }

  double last_launch() const { return last_launch_.load(); }
  int64_t launched() const { return launched_.load(); }

  // Runs `launch` (Backend::allreduce or Backend::broadcast) on the armed communicator, or
  // hands the collective to the Python path.
  template <typename Options>
  WorkPtr run(const char* kind, std::vector<at::Tensor>& tensors, const Options& opts,
              WorkPtr (c10d::Backend::*launch)(std::vector<at::Tensor>&, const Options&)) {
    const double started = monotonic_s();
    BackendPtr inner;
    int64_t id = 0;
    {
      std::lock_guard<std::mutex> hold(lock_);
      if (inner_ && !poison_->is_set()) {
        inner = inner_;
        forget_ended();
        id = ++next_id_;
        entries_.emplace(id, Entry{started, generation_, FuturePtr()});
      }
    }
    if (!inner) {
      return slow(kind, tensors, opts);
    }
    Options launched_opts = opts;
    launched_opts.asyncOp = true;  // the inner work's future completes the caller's
    WorkPtr work;
    try {
      // Called from a Python ProcessGroup, c10d holds the GIL here; gloo's thread may need
      // it to free a finished work while it holds the queue lock this launch waits for.
      std::optional<py::gil_scoped_release> no_gil;
      if (PyGILState_Check()) {
        no_gil.emplace();
      }
      work = ((*inner).*launch)(tensors, launched_opts);
    } catch (const std::exception& error) {
      {
        std::lock_guard<std::mutex> hold(lock_);
        entries_.erase(id);
      }
      poison_->mark(std::string("collective failed to start: ") + error.what());
      return completed(tensors);
    }
    auto future = guard_future(work->getFuture(), tensors, poison_);
    last_launch_.store(started);
    launched_.fetch_add(1);
    bool drained = false;
    {
      std::lock_guard<std::mutex> hold(lock_);
      auto entry = entries_.find(id);
      drained = entry == entries_.end();
      if (!drained) {
        entry->second.future = future;
      }
    }
    if (drained) {  // aborted while it started: the abort cut the group, not watched this
      py::gil_scoped_acquire gil;
      py::reinterpret_borrow<py::object>(watch_)(wrap(future));
    }
    return c10d::Work::create_from_future(future);
  }

 private:
  struct Entry {
    double started;
    int64_t generation;
    FuturePtr future;  // none until it started
    bool ended() const { return future && future->completed(); }
  };

  void disarm_locked() {
    inner_.reset();  // parking closes the group's sockets by dropping it
    ++epoch_;
  }

  // The registry is the collectives in flight and no more (a finished one's future holds
  // its outputs until dropped).
  void forget_ended() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.ended() ? entries_.erase(it) : std::next(it);
    }
  }

  template <typename Options>
  WorkPtr slow(const char* kind, std::vector<at::Tensor>& tensors, const Options& opts) {
    py::gil_scoped_acquire gil;
    py::object work = py::reinterpret_borrow<py::object>(slow_)(kind, tensors, opts);
    return work.cast<WorkPtr>();
  }

  std::shared_ptr<Poison> poison_;
  PyObject* slow_;
  PyObject* watch_;
  std::mutex lock_;
  BackendPtr inner_;  // none: disarmed
  int64_t generation_ = -1;
  int64_t epoch_ = 0;
  int64_t next_id_ = 0;
  std::map<int64_t, Entry> entries_;
  std::atomic<double> last_launch_{0.0};
  std::atomic<int64_t> launched_{0};
};

// What the stable ProcessGroup dispatches its all-reduces and broadcasts to.
class LaneBackend : public c10d::Backend {
 public:
  LaneBackend(std::shared_ptr<Lane> lane, int size) : Backend(0, size), lane_(std::move(lane)) {}

  const std::string getBackendName() const override { return "torchrelay"; }

  WorkPtr allreduce(std::vector<at::Tensor>& tensors,
                    const c10d::AllreduceOptions& opts) override {
    return lane_->run("allreduce", tensors, opts, &c10d::Backend::allreduce);
  }

  WorkPtr broadcast(std::vector<at::Tensor>& tensors,
                    const c10d::BroadcastOptions& opts) override {
    return lane_->run("broadcast", tensors, opts, &c10d::Backend::broadcast);
  }

 private:
  std::shared_ptr<Lane> lane_;
};

}  // namespace

void bind_fast_lane(py::module_& m) {
  py::class_<Lane, std::shared_ptr<Lane>>(m, "Lane")
      .def(py::init<std::shared_ptr<Poison>, py::object, py::object>())
      .def_property_readonly("epoch", &Lane::epoch)
      .def("arm", &Lane::arm)
      .def("disarm", &Lane::disarm)
      .def("drain",
           [](Lane& lane) {
             py::list pending;
             for (const auto& [generation, future] : lane.drain()) {
               pending.append(py::make_tuple(generation, wrap(future)));
             }
             return pending;
           })
      .def("oldest_start", &Lane::oldest_start)
      .def_property_readonly("last_launch", &Lane::last_launch)
      .def_property_readonly("launched", &Lane::launched);
  m.def("lane_backend", [](std::shared_ptr<Lane> lane, int size) -> BackendPtr {
    return c10::make_intrusive<LaneBackend>(std::move(lane), size);
  });
}
