// fork() + pipe isolation of simulations (see isolate.hpp).
#include "sim/src/isolate.hpp"

#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

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

struct Child {
  pid_t pid = -1;
  int fd = -1;  // the pipe's read end while the child may still write
  std::string data;
  int wstatus = 0;
  struct rusage usage {};
  std::string lost;  // why wait4 failed, if it did
  bool reaped = false;
};

Child start_child(const std::function<std::string()>& body) {
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
  Child child;
  child.pid = pid;
  child.fd = fds[0];
  return child;
}

void reap(Child& child) {
  if (child.fd >= 0) ::close(child.fd);
  child.fd = -1;
  pid_t waited;
  do {
    waited = ::wait4(child.pid, &child.wstatus, 0, &child.usage);
  } while (waited < 0 && errno == EINTR);
  if (waited < 0) child.lost = std::strerror(errno);
  unregister_child(child.pid);
  child.reaped = true;
}

IsolatedRun finish(const Child& child) {
  if (!child.lost.empty()) throw Error("sim: lost the simulation process: " + child.lost);
  if (WIFSIGNALED(child.wstatus))
    throw Error("sim: the simulation process died of signal " +
                std::to_string(WTERMSIG(child.wstatus)) + " (" +
                strsignal(WTERMSIG(child.wstatus)) + "); its stderr above may say why");
  if (child.data.empty())
    throw Error("sim: the simulation process exited (status " +
                std::to_string(WEXITSTATUS(child.wstatus)) + ") without a result");
  const char status = child.data[0];
  std::string text = child.data.substr(1);
  if (status == 'P') throw PlanError(text);
  if (status != 'O') throw Error(text);
  IsolatedRun run;
  run.output = std::move(text);
  run.peak_rss_bytes = static_cast<double>(child.usage.ru_maxrss) * 1024.0;  // Linux: kilobytes
  return run;
}

}  // namespace

IsolatedRun run_isolated(const std::function<std::string()>& body) {
  return std::move(run_isolated_each({body}, 1).front());
}

std::vector<IsolatedRun> run_isolated_each(const std::vector<std::function<std::string()>>& bodies,
                                           int at_once) {
  at_once = std::max(1, at_once);
  std::vector<Child> children;
  children.reserve(bodies.size());
  // A failure in the parent (fork, poll) ends the children already started: none outlives it.
  struct StopStarted {
    std::vector<Child>& children;
    bool armed = true;
    ~StopStarted() {
      if (!armed) return;
      for (Child& child : children)
        if (!child.reaped) {
          ::kill(child.pid, SIGKILL);
          reap(child);
        }
    }
  } stop_started{children};
  int running = 0;
  char buffer[1 << 16];
  while (true) {
    while (running < at_once && children.size() < bodies.size()) {
      children.push_back(start_child(bodies[children.size()]));
      ++running;
    }
    if (running == 0) break;
    // Read every running child's pipe as it fills: a child blocked on a full pipe would never
    // finish.
    std::vector<pollfd> polled;
    std::vector<std::size_t> whose;
    for (std::size_t i = 0; i < children.size(); ++i)
      if (children[i].fd >= 0) {
        polled.push_back({children[i].fd, POLLIN, 0});
        whose.push_back(i);
      }
    if (::poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw Error(std::string("sim: cannot wait for the simulation processes: ") +
                  std::strerror(errno));
    }
    for (std::size_t k = 0; k < polled.size(); ++k) {
      if (polled[k].revents == 0) continue;
      Child& child = children[whose[k]];
      const ssize_t n = ::read(child.fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        child.data.append(buffer, static_cast<std::size_t>(n));
        continue;
      }
      reap(child);  // end of its output: it is exiting
      --running;
    }
  }
  stop_started.armed = false;
  std::vector<IsolatedRun> runs;
  runs.reserve(children.size());
  for (const Child& child : children) runs.push_back(finish(child));
  return runs;
}

int usable_cores() {
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace muonbed::sim
