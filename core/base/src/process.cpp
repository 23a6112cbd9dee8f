// Child processes, interrupts and the parent watchdog (see core/base/process.hpp).
#include "core/base/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/base/errors.hpp"

namespace muonbed {

namespace {

constexpr int kMaxChildren = 32;
constexpr double kGraceSeconds = 10;
std::atomic<int> g_signal{0};
// Registered children: pid > 0 a group of its own (signalled as -pid), pid < 0 a single
// process (-pid) of muonbed's group. 0: a free slot. Lock-free: read in the signal handler.
std::atomic<pid_t> g_children[kMaxChildren];

void signal_children(int sig) {
  for (auto& slot : g_children) {
    const pid_t v = slot.load();
    if (v > 0) ::kill(-v, sig);
    if (v < 0) ::kill(-v, sig);  // -v > 0: the single process
  }
}

void on_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    ::signal(sig, SIG_DFL);  // a second request: the default action for the next one
    return;
  }
  signal_children(SIGTERM);
}

// Waits (without reaping) up to `seconds` for `pid` to exit; true when it has.
bool exited_within(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      return true;  // not a child of ours any more
    }
    if (info.si_pid == pid) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

void install_interrupt_handlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a blocking wait returns EINTR and sees the flag
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &action, nullptr);
}

int interrupt_signal() {
  return g_signal.load();
}

void register_child(pid_t pid, bool group) {
  const pid_t value = group ? pid : -pid;
  for (auto& slot : g_children) {
    pid_t free = 0;
    if (slot.compare_exchange_strong(free, value)) break;
  }
  // A signal between fork() and here found no entry: pass it on now.
  if (interrupted()) ::kill(group ? -pid : pid, SIGTERM);
}

void unregister_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t as_group = pid, as_single = -pid;
    if (!slot.compare_exchange_strong(as_group, 0)) slot.compare_exchange_strong(as_single, 0);
  }
}

pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty()) throw Error("spawn_process: no program");
  // Everything the child needs is prepared before fork(): after it only async-signal-safe calls.
  std::vector<std::string> args = argv;
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  // The environment, with the defaults added where unset (setenv after fork is not safe).
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& [name, value] : options.default_env)
    if (std::getenv(name.c_str()) == nullptr) env_strings.push_back(name + "=" + value);
  std::vector<char*> c_env;
  for (std::string& e : env_strings) c_env.push_back(e.data());
  c_env.push_back(nullptr);
  const pid_t parent = ::getpid();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0)
    throw Error("cannot start " + argv[0] + " (fork: " + std::strerror(errno) +
                "); fix: free memory or processes, then run again");
  if (pid == 0) {
    ::setpgid(0, 0);  // a group of its own: stopping it stops mpirun and its local ranks
#ifdef __linux__
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // muonbed gone (even by SIGKILL): mpirun ends its job
    if (::getppid() != parent) ::_exit(1);
#endif
    if (!options.output_file.empty()) {
      const int log = ::open(options.output_file.c_str(),
                             O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (log >= 0) {
        ::dup2(log, STDOUT_FILENO);
        ::dup2(log, STDERR_FILENO);
      }
    }
    if (options.null_stdin) {
      const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
    }
    // Default dispositions in the child: muonbed's handlers do not survive exec anyway, but an
    // ignored signal would.
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    ::execve(c_args[0], c_args.data(), c_env.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent: no window in which a signal misses the group
  register_child(pid, true);
  return pid;
}

int wait_process(pid_t pid) {
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, 0);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      unregister_child(pid);
      throw Error(std::string("lost the child process: ") + std::strerror(errno));
    }
    if (interrupted()) {
      // The handler already sent SIGTERM to the group: give it the grace period, then SIGKILL
      // whatever is left (the leader is still unreaped, so its group id cannot be reused).
      if (!exited_within(pid, kGraceSeconds)) ::kill(-pid, SIGKILL);
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      unregister_child(pid);
      throw Interrupted{interrupt_signal()};
    }
  }
  unregister_child(pid);
  return status;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  return "ended with wait status " + std::to_string(status);
}

void exit_with_parent() {
  static std::atomic<bool> started{false};
  if (started.exchange(true)) return;
  const pid_t parent = ::getppid();
  if (parent <= 1) return;  // started by init (a container's entry point): nothing to watch
  std::thread([parent] {
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      // Reparented (to init or a subreaper): the launcher is gone, and so is this rank's job.
      if (::getppid() != parent) ::kill(::getpid(), SIGKILL);
    }
  }).detach();
}

std::string shell_quote(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789_-+=./:,@%") == std::string::npos;
  if (plain) return word;
  std::string out = "'";
  for (const char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_words(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) out += (out.empty() ? "" : " ") + shell_quote(a);
  return out;
}

std::optional<double> env_number(const char* name, double lo, double hi, bool integer,
                                 const char* example) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string value = text;
  // A ConfigError: bad input is the same for every point, so a sweep stops at once (exit 2).
  const auto refuse = [&](const std::string& why) -> ConfigError {
    std::ostringstream range;
    range << lo << ".." << hi;
    return ConfigError(SourceLocation{"environment", 0, 0},
                       std::string(name) + "='" + value + "' " + why,
                       std::string("use ") + (integer ? "an integer" : "a number") + " in " +
                           range.str() + ", e.g. " + name + "=" + example + " (or unset it)");
  };
  // Plain decimal only: strtod would also take "inf", "nan", hex floats and leading spaces.
  if (value.find_first_not_of(integer ? "0123456789+-" : "0123456789+-.eE") != std::string::npos)
    throw refuse("is not a plain decimal number");
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(value.c_str(), &end);
  if (end != value.c_str() + value.size() || errno == ERANGE || !std::isfinite(v))
    throw refuse("is not a number");
  if (integer && v != std::floor(v)) throw refuse("is not an integer");
  if (v < lo || v > hi) throw refuse("is out of range");
  return v;
}

std::optional<std::string> env_choice(const char* name, const std::vector<std::string>& choices) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  for (const std::string& c : choices)
    if (c == text) return c;
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  throw ConfigError(SourceLocation{"environment", 0, 0},
                    std::string(name) + "='" + text + "' is not one of " + list,
                    "use one of " + list + " (or unset it)");
}

std::filesystem::path temporary_folder() {
  const char* tmpdir = std::getenv("TMPDIR");
  if (tmpdir == nullptr || *tmpdir == '\0') return "/tmp";
  struct stat info {};
  if (::stat(tmpdir, &info) != 0 || !S_ISDIR(info.st_mode))
    throw ConfigError(SourceLocation{"environment", 0, 0},
                      std::string("TMPDIR='") + tmpdir + "' is " +
                          (::stat(tmpdir, &info) != 0 ? "not there" : "not a folder") +
                          " (muonbed keeps the files of a running job there)",
                      "set TMPDIR to a writable folder, or unset it to use /tmp");
  return tmpdir;
}

long long available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;  // kB
  }
  return -1;
}

}  // namespace muonbed
