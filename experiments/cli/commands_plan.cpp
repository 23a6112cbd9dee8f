// `muonbed plan EXP.yaml`: builds the step plan of every sweep point and prints what each rank
// does in it (matrices owned, Newton-Schulz GFLOPs, bytes sent and received, peak memory), the
// assignment's imbalance, and the analytic step-time estimate (average and worst step, and the
// worst rank's compute / communication / exposed communication) beside T_bound, the step's lower
// bound (core/engine/bound.hpp), and the ratio of the two. Big meshes show the first and
// last ranks and column-wise min / median / max over all ranks. --json writes each plan.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "core/base/errors.hpp"
#include "core/engine/bound.hpp"
#include "core/engine/cost_model.hpp"
#include "core/experiment/experiment.hpp"
#include "core/plan/plan_json.hpp"
#include "core/results/results.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/format.hpp"

namespace muonbed::cli {

namespace {

namespace fs = std::filesystem;

struct PlanOptions {
  std::string file;
  std::string json_dir;
  std::vector<std::string> points;
  std::string ranks = "8";
};

std::vector<std::string> summary_row(const std::string& label, const std::string& node,
                                     double matrices, double gflop, double sent, double received,
                                     double peak) {
  return {label,
          node,
          fmt::format("{:.0f}", matrices),
          fmt::format("{:.1f}", gflop),
          mib(sent),
          mib(received),
          gib(peak)};
}

void print_point(const Experiment& e, std::size_t index, std::size_t count, int show_ranks,
                 const std::string& json_dir) {
  const std::string title =
      e.point_label.empty() ? e.name : e.name + " " + point_text(e, index, count);
  std::cout << "== " << title << " ==\n";
  const StepPlan plan = plan_experiment(e);
  const ShardedModel& model = plan.model;
  const std::vector<int> muon = model.muon_params();
  std::int64_t matrices = 0, muon_elements = 0;
  for (int p : muon) {
    matrices += model.params[p].batch();
    muon_elements += model.params[p].numel();
  }
  std::cout << fmt::format(
      "model     {}: {} parameters; {} Muon matrices ({} elements) in {} tensors, {} AdamW "
      "tensors\n",
      e.model.name, human_count(static_cast<double>(e.model.numel())), matrices,
      human_count(static_cast<double>(muon_elements)), muon.size(), model.adamw_params().size());
  std::cout << fmt::format("mesh      {} on {} ({})\n", mesh_text(e.mesh), e.cluster.name,
                           e.cluster.gpu.name);
  std::cout << fmt::format("strategy  {}; ns_steps {}, comm {}\n", strategy_text(e.strategy),
                           e.optimizer.muon.ns_steps, to_string(e.optimizer.comm_dtype));
  std::cout << fmt::format("plan      {} ops on {} streams, {} buffers, hyper-period {}\n",
                           plan.ops.size(), plan.streams.size(), plan.buffers.size(),
                           plan.hyper_period());

  const int world = e.mesh.world_size();
  // Every rank's training state once: the feasibility below and the table's peak column.
  const std::vector<TrainingMemory> training = training_memories(plan);
  const std::vector<RankSummary> ranks = summarize_ranks(plan, &training);

  Table table({"rank", "node", "matrices", "NS GFLOP", "sent MiB", "recv MiB", "peak GiB"});
  auto row = [&](const RankSummary& s) {
    return summary_row(std::to_string(s.rank), std::to_string(e.mesh.node_of(s.rank)),
                       s.matrices_owned, s.ns_flops / 1e9, static_cast<double>(s.bytes_sent),
                       static_cast<double>(s.bytes_received),
                       static_cast<double>(s.memory.peak_bytes()));
  };
  const bool all = show_ranks <= 0 || world <= show_ranks;
  if (all) {
    for (const RankSummary& s : ranks) table.add(row(s));
  } else {
    const int head = (show_ranks + 1) / 2, tail = show_ranks / 2;
    for (int r = 0; r < head; ++r) table.add(row(ranks[r]));
    table.add({"...", "", "", "", "", "", ""});
    for (int r = world - tail; r < world; ++r) table.add(row(ranks[r]));
  }
  if (world > 1) {
    // Column-wise statistics over every rank (each column sorted on its own).
    auto column = [&](auto get) {
      std::vector<double> v;
      v.reserve(ranks.size());
      for (const RankSummary& s : ranks) v.push_back(static_cast<double>(get(s)));
      std::sort(v.begin(), v.end());
      return v;
    };
    const auto owned = column([](const RankSummary& s) { return s.matrices_owned; });
    const auto flops = column([](const RankSummary& s) { return s.ns_flops / 1e9; });
    const auto sent = column([](const RankSummary& s) { return s.bytes_sent; });
    const auto recv = column([](const RankSummary& s) { return s.bytes_received; });
    const auto peak = column([](const RankSummary& s) { return s.memory.peak_bytes(); });
    table.add_separator();
    for (const auto& [label, pick] : {std::pair<std::string, std::size_t>{"min", 0},
                                      {"median", ranks.size() / 2},
                                      {"max", ranks.size() - 1}})
      table.add(
          summary_row(label, "", owned[pick], flops[pick], sent[pick], recv[pick], peak[pick]));
  }
  table.print(std::cout);
  if (!all)
    std::cout << fmt::format("  ({} of {} ranks shown; --ranks all shows every rank)\n", show_ranks,
                             world);
  // The training state around the step (parameters, fp32 master weights, gradients, state,
  // transients, activations) against the device's memory, on every rank.
  const auto limit = static_cast<std::int64_t>(e.cluster.gpu.memory_GiB * 1024.0 * 1024.0 * 1024.0);
  const MemoryFeasibility feasibility = memory_feasibility(training, limit);
  std::cout << fmt::format(
      "{}  training memory {}{}\n", feasibility.feasible() ? "memory   " : "INFEASIBLE",
      memory_feasibility_text(feasibility, e.cluster.gpu.name, world),
      feasibility.feasible() ? ""
                             : ": step times of this point assume memory that is not there "
                               "(shard more, use a larger device, or change memory: in the "
                               "experiment)");
  std::cout << fmt::format("imbalance {:.3f} (max / mean NS FLOPs over ranks, assignment {})\n",
                           plan.assignment.imbalance, e.strategy.assign);

  const EstimateSummary est = estimate(plan, e.cluster);
  std::cout << fmt::format(
      "estimate  average step {}, worst step {} (step {} of hyper-period {}; "
      "analytic model on {}: closed-form collectives sharing links max-min, "
      "core/engine/link_sharing.hpp)\n",
      human_seconds(est.average_step_s), human_seconds(est.worst_step_s), est.worst.step,
      plan.hyper_period(), e.cluster.name);
  const StepBound bound = step_bound(plan, e.cluster);
  if (bound.binding == "training compute")
    std::cout << fmt::format(
        "bound     T_bound {} (training compute: the busiest rank's forward and backward); "
        "average step / T_bound = {:.2f}\n",
        human_seconds(bound.bound_s), bound.bound_s > 0 ? est.average_step_s / bound.bound_s : 0.0);
  else
    std::cout << fmt::format(
        "bound     T_bound {} ({}: NS {} {}, first gather {}, last scatter {}); "
        "average step / T_bound = {:.2f}\n",
        human_seconds(bound.bound_s), bound.binding,
        human_seconds(bound.binding == "balanced" ? bound.ns_balanced_s : bound.ns_longest_s),
        bound.binding == "balanced" ? fmt::format("over {} ranks", bound.owner_ranks)
                                    : "of " + bound.longest,
        human_seconds(bound.gather_s), human_seconds(bound.scatter_s),
        bound.bound_s > 0 ? est.average_step_s / bound.bound_s : 0.0);
  if (!est.worst.ranks.empty()) {
    const auto worst = std::max_element(
        est.worst.ranks.begin(), est.worst.ranks.end(),
        [](const TimeBreakdown& a, const TimeBreakdown& b) { return a.finish_s < b.finish_s; });
    const int r = static_cast<int>(worst - est.worst.ranks.begin());
    std::cout << fmt::format(
        "          worst rank {} (node {}): compute {}, communication {}, "
        "exposed communication {}, idle {}, finish {}\n",
        r, e.mesh.node_of(r), human_seconds(worst->compute_s),
        human_seconds(worst->communication_s), human_seconds(worst->exposed_comm_s),
        human_seconds(worst->idle_s), human_seconds(worst->finish_s));
  }
  if (!json_dir.empty()) {
    // point_slug keeps the name one safe path component (no '/', at most 200 bytes).
    const std::string name =
        point_slug(e.name + (e.point_label.empty() ? "" : "-" + e.point_label)) + ".plan.json";
    const fs::path path = fs::path(json_dir) / name;
    write_file_atomically(path.string(), plan_to_json(plan).dump() + "\n");
    std::cout << "json      " << path.string() << "\n";
  }
  std::cout << "\n";
}

int run_plan(const PlanOptions& o) {
  int show_ranks = 0;
  if (o.ranks != "all") {
    try {
      std::size_t used = 0;
      show_ranks = std::stoi(o.ranks, &used);
      if (used != o.ranks.size() || show_ranks < 1) throw std::invalid_argument(o.ranks);
    } catch (const std::exception&) {
      throw ConfigError(SourceLocation{},
                        "--ranks must be 'all' or a positive number, got '" + o.ranks + "'",
                        "use --ranks all or e.g. --ranks 16");
    }
  }
  const std::vector<Experiment> points = load_experiment(o.file);
  const std::vector<std::size_t> selected = select_points(points, o.points, o.file);
  // An unusable --json folder is found before any point is planned.
  if (!o.json_dir.empty()) check_writable_folder(o.json_dir);
  int failures = 0;
  for (std::size_t i : selected) {
    try {
      print_point(points[i], i, points.size(), show_ranks, o.json_dir);
    } catch (const ConfigError&) {
      throw;
    } catch (const Error& err) {
      // One point that cannot be planned does not hide the others.
      ++failures;
      std::cout << "\n";
      std::cerr << "muonbed: error: " << points[i].name
                << (points[i].point_label.empty() ? "" : " [" + points[i].point_label + "]") << ": "
                << err.what() << "\n";
    }
  }
  if (failures > 0)
    std::cerr << fmt::format("muonbed: error: {} of {} points could not be planned\n", failures,
                             selected.size());
  return failures > 0 ? 1 : 0;
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Build each sweep point's step plan; print per-rank work, traffic, memory and the "
      "analytic step time");
  cmd->add_option("experiment", options->file, "experiment YAML file")
      ->required()
      ->type_name("EXP.yaml");
  cmd->add_option("--json", options->json_dir, "write each plan as DIR/<name>[-<point>].plan.json")
      ->type_name("DIR");
  cmd->add_option("--point", options->points,
                  "only points whose label is LABEL or includes every key=value of it "
                  "(repeatable)")
      ->type_name("LABEL");
  cmd->add_option("--ranks", options->ranks,
                  "rows of the rank table: 'all', or N (first N/2 and last N/2 ranks plus "
                  "min/median/max)")
      ->type_name("all|N")
      ->capture_default_str();
  cmd->footer(R"(Examples:
  muonbed plan experiments/quickstart.yaml
  muonbed plan experiments/quickstart.yaml --point strategy.name=owner --ranks all
  muonbed plan experiments/fsdp_tp.yaml --json plans/       then inspect plans/*.plan.json
Columns: matrices = Muon matrices the rank orthogonalizes (owner); NS GFLOP = its Newton-Schulz
work; sent/recv = bytes it moves in one step; peak = static state + peak transient buffers.
The estimate is the analytic model: closed-form collectives whose concurrent instances share GPU
links, NICs, PCIe bridges and leaf uplinks, NS from the cluster's table or GEMM curve (README "What
each backend models"); the sim backend replays every transfer.)");
  cmd->callback([options, &exit_code] { exit_code = run_plan(*options); });
}

}  // namespace muonbed::cli
