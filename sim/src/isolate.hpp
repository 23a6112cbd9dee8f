// Runs a piece of work in a fork()ed child process and returns what it produced. SimGrid 3.32's
// engine is a process-wide singleton (and its fat-tree zone counts leaves in a static), so each
// simulation gets a fresh process image: a copy-on-write fork of the caller, which also hands the
// child the plan without serializing it. The child's text comes back through a pipe; its peak RSS
// through wait4(). Errors thrown in the child are rethrown in the parent with their message.
#pragma once

#include <functional>
#include <string>

namespace muonbed::sim {

struct IsolatedRun {
  std::string output;
  double peak_rss_bytes = 0;  // of the child
};

IsolatedRun run_isolated(const std::function<std::string()>& body);

}  // namespace muonbed::sim
