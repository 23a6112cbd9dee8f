// Runs pieces of work in fork()ed child processes and returns what they produced. SimGrid 3.32's
// engine is a process-wide singleton (and its fat-tree zone counts leaves in a static), so each
// simulation gets a fresh process image: a copy-on-write fork of the caller, which also hands the
// child the plan without serializing it. The child's texts come back through a pipe, each read
// straight into a string of its announced size (a 1,024-GPU point's trace is ~100 MB: growing one
// buffer, then cutting it into parts, copied it four times); its peak RSS through wait4(). Errors
// thrown in the child are rethrown in the parent with their message.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace muonbed::sim {

struct IsolatedRun {
  std::vector<std::string> parts;  // what the body returned, in order
  double peak_rss_bytes = 0;       // of the child
};

// What a child runs: its texts (a result's record, its trace, ...), sent as they are.
using IsolatedBody = std::function<std::vector<std::string>()>;

// One body returning one text: parts holds just that text.
IsolatedRun run_isolated(const std::function<std::string()>& body);

// Each body in a child of its own, at most `at_once` children at a time (independent
// simulations, e.g. a training point and its AdamW twin, side by side on a machine's cores); the
// outputs in the bodies' order. Every child is waited for before an error is rethrown (the first
// failed body's), so none is left running.
std::vector<IsolatedRun> run_isolated_each(const std::vector<IsolatedBody>& bodies, int at_once);

// CPUs this process may run on (its affinity mask: taskset, Slurm's --cpus-per-task), at least 1.
int usable_cores();

}  // namespace muonbed::sim
