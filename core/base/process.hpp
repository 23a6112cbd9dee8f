// Processes muonbed starts (mpirun and its ranks, simulation workers) and how they end. Users
// run muonbed as root on shared nodes: whatever it starts ends with it, and nothing else is
// ever signalled.
//
//   spawn_process      fork + exec in a process group of the child's own, registered here;
//                      the child gets SIGTERM when muonbed dies (PR_SET_PDEATHSIG: SIGKILL of
//                      muonbed included), and mpirun passes it on to its ranks
//   wait_process       waits for it; on Ctrl-C / SIGTERM / SIGHUP (install_interrupt_handlers)
//                      it stops the group (SIGTERM, then SIGKILL after 10 s: every rank is gone
//                      within 10 s) and throws Interrupted
//   exit_with_parent   for the ranks: a watchdog thread ends the process when its parent (mpirun
//                      or orted) is gone, so a SIGKILLed mpirun leaves no rank behind
//   interrupts         a command that runs points installs the handlers; the first signal sets
//                      interrupt_signal() and stops every registered child group at once (the
//                      points loop then records the interrupted point as not run, writes the
//                      manifest and exits 128 + signal, 130 for Ctrl-C); a second Ctrl-C ends
//                      muonbed at once.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace muonbed {

struct SpawnOptions {
  std::string output_file;  // stdout and stderr go there (created 0600); "" keeps the parent's
  bool null_stdin = true;
  // Variables set in the child unless already set (e.g. OPENBLAS_NUM_THREADS).
  std::vector<std::pair<std::string, std::string>> default_env;
};
// Throws Error naming the program when fork fails; exec failure shows as exit code 127.
pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& options = {});
// The child's wait status. Throws Interrupted when a signal asked muonbed to stop (the child
// group is stopped and reaped first).
int wait_process(pid_t pid);
// "exited with code N" / "was killed by signal N (NAME)".
std::string describe_wait_status(int status);

// Rank side: ends this process (SIGKILL) within a second once its parent process is gone.
void exit_with_parent();

void install_interrupt_handlers();
int interrupt_signal();  // the signal that asked muonbed to stop, or 0
inline bool interrupted() {
  return interrupt_signal() != 0;
}
// A process muonbed started in its own group, stopped on an interrupt (spawn_process registers
// its children; a forked helper in muonbed's own group registers with group = false).
void register_child(pid_t pid, bool group);
void unregister_child(pid_t pid);

// Thrown where work stopped because of an interrupt; the exit code a shell expects.
struct Interrupted {
  int signal = 0;
  int exit_code() const { return 128 + signal; }
};

// A word quoted for /bin/sh ('it'\''s'), and a command line of such words: what muonbed prints
// and records as "the command that ran" can be pasted back into a shell.
std::string shell_quote(const std::string& word);
std::string shell_words(const std::vector<std::string>& argv);

// An environment variable holding a number: nullopt when unset or empty; else the whole text
// must be a finite number in [lo, hi] (an integer where `integer`), or Error names the variable,
// its text, the range and an example ("4abc", "inf", "1e308" and "0x10" are refused, never read
// as 4, infinity or a watchdog that never fires).
std::optional<double> env_number(const char* name, double lo, double hi, bool integer,
                                 const char* example);
// An environment variable that is one of `choices`: nullopt when unset or empty, else Error
// listing the choices.
std::optional<std::string> env_choice(const char* name, const std::vector<std::string>& choices);

// The folder for temporary files: $TMPDIR when set, else /tmp. A TMPDIR that is not a folder
// is an Error naming the variable and its value (not the library's "Not a directory").
std::filesystem::path temporary_folder();

// Bytes of memory this machine has available for new processes (MemAvailable of
// /proc/meminfo), or -1 when unknown.
long long available_memory_bytes();

}  // namespace muonbed
