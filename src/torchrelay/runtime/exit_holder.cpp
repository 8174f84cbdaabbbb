// The exit holder (see exit_holder.py for the contract).
//
// Why: the kernel ends a killed process in order: it unmaps its memory (exit_mm), then closes
// its files (exit_files: its sockets, which is how its peers' collectives fail), then tells its
// parent (waitpid, pidfd). Unmapping costs ~70 ms per GiB resident (bench.exit_floor), and
// nobody learns of the death before it is done. While another process shares the address
// space, exit_mm only drops a reference: the worker's sockets close and its parent reaps it at
// once; the holder then exits and the unmapping happens in it, off the recovery's path.
//
// Deliberately no pybind11 or torch here: this file is plain system calls.

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/futex.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <new>

// Declared in native.h too, which this file leaves out: it would pull in torch's headers.
int start_exit_holder();

namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr long kReadyTimeoutNs = 1000L * 1000 * 1000;

// What the two share, at the bottom of the holder's stack allocation (the stack grows down
// from its top): both outlive the call that starts the holder.
struct Start {
  int pidfd;
  std::atomic<int> ready;  // 0: starting; 1: holding; -1: could not close its descriptors
};

void wake(std::atomic<int>* word) {
  syscall(SYS_futex, reinterpret_cast<int*>(word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

// Runs in the holder, which shares the worker's memory and even its thread's TLS: raw system
// calls only, no libc state (a worker thread may hold malloc's or stdio's locks).
int hold(void* arg) {
  auto* start = static_cast<Start*>(arg);
  const int pidfd = start->pidfd;
  syscall(SYS_prctl, PR_SET_NAME, "torchrelay-hold", 0, 0, 0);
  // Its exit unmaps the worker's memory, whether it ends on the pidfd or by the agent's
  // SIGKILL to the group: at nice 19, so that on a machine without a spare core it takes idle
  // CPU rather than the recovery's. It runs nothing else.
  syscall(SYS_setpriority, PRIO_PROCESS, 0, 19);
  // The holder's copies of the worker's descriptors go: a socket held here would stay open
  // after the worker died, and its peers would learn of the death later, not sooner. Without
  // close_range (Linux < 5.9) the holder cannot keep that promise, so it does not stay.
  bool closed = syscall(SYS_close_range, pidfd + 1, ~0U, 0) == 0;
  if (pidfd > 0) {
    closed = closed && syscall(SYS_close_range, 0, pidfd - 1, 0) == 0;
  }
  start->ready.store(closed ? 1 : -1);
  wake(&start->ready);
  if (closed) {
    struct pollfd ended = {pidfd, POLLIN, 0};
    // Every signal is blocked (see start_exit_holder): only the worker's end, or an error,
    // returns from this.
    syscall(SYS_poll, &ended, 1, -1);
  }
  syscall(SYS_exit, 0);
  return 0;
}

// Waits until the holder holds (or gave up), so that a caller sees it settled; never longer
// than kReadyTimeoutNs (a holder not yet scheduled then is still one).
int settled(const Start* start) {
  struct timespec left = {0, kReadyTimeoutNs};
  int ready = start->ready.load();
  while (ready == 0) {
    const auto* word = reinterpret_cast<const int*>(&start->ready);
    if (syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, 0, &left, nullptr, 0) != 0 &&
        errno == ETIMEDOUT) {
      break;
    }
    ready = start->ready.load();
  }
  return ready;
}

}  // namespace

int start_exit_holder() {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  if (pidfd < 0) {
    return -errno;
  }
  // Never freed: the holder uses it for as long as this process lives.
  void* memory = std::malloc(kStackBytes);
  if (memory == nullptr) {
    close(pidfd);
    return -ENOMEM;
  }
  auto* start = new (memory) Start{pidfd, {0}};
  // The holder starts with every signal blocked and keeps them so: its handlers would be the
  // worker's (Python's), writing into the interpreter they share. SIGKILL still ends it.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const int pid = clone(hold, static_cast<char*>(memory) + kStackBytes, CLONE_VM | SIGCHLD, start);
  const int error = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  close(pidfd);
  if (pid < 0) {
    std::free(memory);
    return -error;
  }
  return settled(start) < 0 ? -ENOSYS : pid;
}
