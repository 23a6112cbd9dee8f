// fork() + pipe isolation of simulations (see isolate.hpp).
#include "sim/src/isolate.hpp"

#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

#include "core/base/errors.hpp"
#include "core/base/process.hpp"

namespace muonbed::sim {

namespace {

// Child -> parent framing: a header, then the parts' bytes as they are. The header: one status
// byte ('O' ok, 'P' PlanError, 'E' other error: then one part, the message), the number of parts
// (uint32) and each part's size (uint64), in this machine's byte order (parent and child are one
// program). Sizes first, so the parent reads each part into a string of its own, once.
constexpr std::size_t kFixedHead = 1 + sizeof(std::uint32_t);
constexpr std::uint32_t kMaxParts = 64;
constexpr std::uint64_t kMaxPartBytes = std::uint64_t{1} << 40;

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

void send_parts(int fd, char status, const std::vector<std::string>& parts) {
  std::string head(1, status);
  const auto count = static_cast<std::uint32_t>(parts.size());
  head.append(reinterpret_cast<const char*>(&count), sizeof count);
  for (const std::string& part : parts) {
    const std::uint64_t size = part.size();
    head.append(reinterpret_cast<const char*>(&size), sizeof size);
  }
  write_all(fd, head.data(), head.size());
  for (const std::string& part : parts) write_all(fd, part.data(), part.size());
}

struct Child {
  pid_t pid = -1;
  int fd = -1;  // the pipe's read end while the child may still write
  // What came back: the header as it arrives (head_size grows once the count of parts is known),
  // then each part read in place; `part` is the one being read, `filled` its bytes so far.
  std::string head;
  std::size_t head_size = kFixedHead;
  bool head_done = false;
  std::vector<std::string> parts;
  std::size_t part = 0, filled = 0;
  std::string broken;  // why what came back cannot be a result (sizes out of range, extra bytes)
  int wstatus = 0;
  struct rusage usage {};
  std::string lost;  // why wait4 failed, if it did
  bool reaped = false;
};

Child start_child(const IsolatedBody& body) {
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
    std::vector<std::string> out;
    char status = 'O';
    try {
      out = body();
    } catch (const PlanError& e) {
      status = 'P';
      out = {e.what()};
    } catch (const std::exception& e) {
      status = 'E';
      out = {e.what()};
    } catch (...) {
      status = 'E';
      out = {"unknown exception in the simulation process"};
    }
    send_parts(fds[1], status, out);
    ::close(fds[1]);
    std::fflush(nullptr);
    ::_exit(0);  // no atexit handlers or static destructors: SimGrid's would run in the child
  }
  ::close(fds[1]);
#ifdef F_SETPIPE_SZ
  // A larger pipe (where allowed; else the default stays): a 100 MB trace in fewer hand-overs.
  ::fcntl(fds[0], F_SETPIPE_SZ, 1 << 20);
#endif
  register_child(pid, false);  // SIGTERM to muonbed stops it too (same process group)
  Child child;
  child.pid = pid;
  child.fd = fds[0];
  return child;
}

// Reads what the child's pipe holds into the header or the part being read; false at its end.
bool read_some(Child& child, char* scratch, std::size_t scratch_size) {
  char* into;
  std::size_t want;
  if (!child.head_done) {
    into = scratch;
    want = child.head_size - child.head.size();
  } else if (child.part < child.parts.size()) {
    std::string& part = child.parts[child.part];
    into = part.data() + child.filled;
    want = part.size() - child.filled;
  } else {
    into = scratch;  // nothing more is due: whatever comes is counted as broken
    want = scratch_size;
  }
  const ssize_t n = ::read(child.fd, into, want);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  const auto got = static_cast<std::size_t>(n);
  if (!child.head_done) {
    child.head.append(scratch, got);
    if (child.head.size() == kFixedHead) {
      std::uint32_t count;
      std::memcpy(&count, child.head.data() + 1, sizeof count);
      if (count > kMaxParts) {
        child.broken = "announced " + std::to_string(count) + " parts";
        return false;
      }
      child.head_size = kFixedHead + count * sizeof(std::uint64_t);
    }
    if (child.head.size() == child.head_size) {
      child.head_done = true;
      const std::size_t count = (child.head_size - kFixedHead) / sizeof(std::uint64_t);
      child.parts.resize(count);
      for (std::size_t k = 0; k < count; ++k) {
        std::uint64_t size;
        std::memcpy(&size, child.head.data() + kFixedHead + k * sizeof size, sizeof size);
        if (size > kMaxPartBytes) {
          child.broken = "announced a part of " + std::to_string(size) + " bytes";
          return false;
        }
        child.parts[k].resize(static_cast<std::size_t>(size));
      }
    }
  } else if (child.part < child.parts.size()) {
    child.filled += got;
  } else {
    child.broken = "sent more bytes than it announced";
    return false;
  }
  // Past the parts that are complete (empty ones included).
  while (child.head_done && child.part < child.parts.size() &&
         child.filled == child.parts[child.part].size()) {
    ++child.part;
    child.filled = 0;
  }
  return true;
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

IsolatedRun finish(Child& child) {
  if (!child.lost.empty()) throw Error("sim: lost the simulation process: " + child.lost);
  if (!child.broken.empty())  // before its signal: muonbed killed it for this
    throw Error("internal: the simulation process " + child.broken +
                " in its result; its stderr above may say why");
  if (WIFSIGNALED(child.wstatus))
    throw Error("sim: the simulation process died of signal " +
                std::to_string(WTERMSIG(child.wstatus)) + " (" +
                strsignal(WTERMSIG(child.wstatus)) + "); its stderr above may say why");
  if (child.head.empty())
    throw Error("sim: the simulation process exited (status " +
                std::to_string(WEXITSTATUS(child.wstatus)) + ") without a result");
  if (!child.head_done || child.part < child.parts.size())
    throw Error("sim: the simulation process exited (status " +
                std::to_string(WEXITSTATUS(child.wstatus)) +
                ") before its whole result came back; its stderr above may say why");
  const char status = child.head[0];
  if (status != 'O') {
    const std::string text = child.parts.empty() ? std::string() : child.parts[0];
    if (status == 'P') throw PlanError(text);
    throw Error(text);
  }
  IsolatedRun run;
  run.parts = std::move(child.parts);
  run.peak_rss_bytes = static_cast<double>(child.usage.ru_maxrss) * 1024.0;  // Linux: kilobytes
  return run;
}

}  // namespace

IsolatedRun run_isolated(const std::function<std::string()>& body) {
  return std::move(
      run_isolated_each({[&body]() { return std::vector<std::string>{body()}; }}, 1).front());
}

std::vector<IsolatedRun> run_isolated_each(const std::vector<IsolatedBody>& bodies, int at_once) {
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
      if (read_some(child, buffer, sizeof buffer)) continue;
      if (!child.broken.empty()) ::kill(child.pid, SIGKILL);  // nothing it sends can be used
      reap(child);                                            // end of its output: it is exiting
      --running;
    }
  }
  stop_started.armed = false;
  std::vector<IsolatedRun> runs;
  runs.reserve(children.size());
  for (Child& child : children) runs.push_back(finish(child));
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
