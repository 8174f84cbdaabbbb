// The end line of a worker's stack dump (stack_dump.py): faulthandler writes the stacks from
// its handler of the dump signal, then chains to the handler installed here, which writes the
// line the node agent waits for before it fences the worker. Python cannot write it: a Python
// handler runs only when the main thread next runs bytecode, and a stuck one never does.

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <string>

namespace {

char end_line[256];
size_t end_length = 0;

void write_end_line(int) {
  const int saved = errno;
  size_t written = 0;
  while (written < end_length) {
    const ssize_t n = write(STDERR_FILENO, end_line + written, end_length - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the agent is gone: nobody waits for the line
    written += static_cast<size_t>(n);
  }
  errno = saved;
}

}  // namespace

int install_stack_dump_end(int signum, const std::string& line) {
  if (line.size() > sizeof end_line) return -EINVAL;
  std::memcpy(end_line, line.data(), line.size());
  end_length = line.size();
  struct sigaction action {};
  action.sa_handler = write_end_line;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  return sigaction(signum, &action, nullptr) == 0 ? 0 : -errno;
}
