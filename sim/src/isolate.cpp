// fork() + pipe isolation of one simulation (see isolate.hpp).
#include "sim/src/isolate.hpp"

#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "core/base/errors.hpp"
#include "core/base/process.hpp"

namespace muonbed::sim {

namespace {

// Child -> parent framing: one status byte ('O' ok, 'P' PlanError, 'E' other error) then text.
void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // the parent went away; nothing useful left to do
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace

IsolatedRun run_isolated(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0)
    throw Error(std::string("sim: cannot create a pipe for the simulation process: ") +
                std::strerror(errno));
  // Buffered output would be written twice (by parent and child) if not flushed first.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(std::string("sim: cannot fork the simulation process: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    // The default actions: muonbed's interrupt handlers (core/base/process.hpp) would keep a
    // simulation running through Ctrl-C.
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
#ifdef __linux__
    // A killed runner (Ctrl-C, timeout) must not leave its simulation running on.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
#endif
    std::string out;
    char status = 'O';
    try {
      out = body();
    } catch (const PlanError& e) {
      status = 'P';
      out = e.what();
    } catch (const std::exception& e) {
      status = 'E';
      out = e.what();
    } catch (...) {
      status = 'E';
      out = "unknown exception in the simulation process";
    }
    write_all(fds[1], &status, 1);
    write_all(fds[1], out.data(), out.size());
    ::close(fds[1]);
    std::fflush(nullptr);
    ::_exit(0);  // no atexit handlers or static destructors: SimGrid's would run in the child
  }
  ::close(fds[1]);
  register_child(pid, false);  // SIGTERM to muonbed stops it too (same process group)
  struct Unregister {
    pid_t pid;
    ~Unregister() { unregister_child(pid); }
  } unregister{pid};
  std::string data;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int wstatus = 0;
  struct rusage usage {};
  pid_t waited;
  do {
    waited = ::wait4(pid, &wstatus, 0, &usage);
  } while (waited < 0 && errno == EINTR);
  if (waited < 0)
    throw Error(std::string("sim: lost the simulation process: ") + std::strerror(errno));
  if (WIFSIGNALED(wstatus))
    throw Error("sim: the simulation process died of signal " + std::to_string(WTERMSIG(wstatus)) +
                " (" + strsignal(WTERMSIG(wstatus)) + "); its stderr above may say why");
  if (data.empty())
    throw Error("sim: the simulation process exited (status " +
                std::to_string(WEXITSTATUS(wstatus)) + ") without a result");
  const char status = data[0];
  std::string text = data.substr(1);
  if (status == 'P') throw PlanError(text);
  if (status != 'O') throw Error(text);
  IsolatedRun run;
  run.output = std::move(text);
  run.peak_rss_bytes = static_cast<double>(usage.ru_maxrss) * 1024.0;  // Linux: kilobytes
  return run;
}

}  // namespace muonbed::sim
