// The result record's JSON: the writer (stable key order, point_id and checksum filled in,
// non-finite numbers refused), the reader (strict: every field typed, the schema version and
// checksum checked), and the identity of a point's result. See core/results/results.hpp.
#include "core/results/results.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "core/base/errors.hpp"
#include "core/base/output_files.hpp"
#include "core/base/sha256.hpp"
#include "core/experiment/backends.hpp"

namespace muonbed {

namespace {

using ojson = nlohmann::ordered_json;

}  // namespace

namespace {

ojson aw(const AverageWorst& v) {
  return ojson{{"average", v.average}, {"worst", v.worst}};
}

ojson breakdown(const TimeBreakdown& t) {
  return ojson{{"compute_s", t.compute_s},
               {"communication_s", t.communication_s},
               {"exposed_comm_s", t.exposed_comm_s},
               {"idle_s", t.idle_s},
               {"finish_s", t.finish_s}};
}

AverageWorst read_aw(const nlohmann::json& j) {
  return {j.at("average").get<double>(), j.at("worst").get<double>()};
}

TimeBreakdown read_breakdown(const nlohmann::json& j) {
  TimeBreakdown t;
  t.compute_s = j.at("compute_s").get<double>();
  t.communication_s = j.at("communication_s").get<double>();
  t.exposed_comm_s = j.at("exposed_comm_s").get<double>();
  t.idle_s = j.at("idle_s").get<double>();
  t.finish_s = j.at("finish_s").get<double>();
  return t;
}

}  // namespace

namespace {

// A JSON path to every non-finite number, for the error message (nlohmann writes NaN as null,
// which no reader takes for a number).
void find_non_finite(const ojson& j, const std::string& path, std::vector<std::string>& out) {
  if (j.is_number_float() && !std::isfinite(j.get<double>())) out.push_back(path);
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      find_non_finite(it.value(), path.empty() ? it.key() : path + "." + it.key(), out);
  if (j.is_array())
    for (std::size_t i = 0; i < j.size(); ++i)
      find_non_finite(j[i], path + "[" + std::to_string(i) + "]", out);
}

constexpr std::string_view kChecksumField = "\"checksum\": \"";

}  // namespace

bool verify_checksum(const std::string& text) {
  // The field is the last one: `"checksum": "<64 hex>"` then only the closing brace and spaces.
  const std::size_t at = text.rfind(kChecksumField);
  if (at == std::string::npos) return false;
  const std::size_t begin = at + kChecksumField.size();
  if (text.size() < begin + 65 || text[begin + 64] != '"') return false;
  const std::string digest = text.substr(begin, 64);
  if (digest.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  if (text.find_first_not_of("} \n\r\t", begin + 65) != std::string::npos) return false;
  return sha256_hex(text.substr(0, begin) + text.substr(begin + 64)) == digest;
}

std::string result_identity(const std::string& resolved_yaml, const std::string& backend) {
  YAML::Node root = YAML::Load(resolved_yaml);
  if (root.IsMap()) {
    root.remove("backend");
    root.remove("output");
    if (backend != "sim") root.remove("sim");
    // The measured backends' warm-up and timed steps and data seed do not change a
    // deterministic model's result.
    if (const BackendFacts* facts = backend_facts(backend); facts && !facts->measures)
      for (const char* key : {"steps", "repeats", "seed"}) root.remove(key);
  }
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

std::string point_identity(const std::string& experiment, const std::string& point,
                           const std::string& backend, const std::string& resolved_yaml) {
  const std::string text = "muonbed point\n" + experiment + "\n" + point + "\n" + backend + "\n" +
                           result_identity(resolved_yaml, backend);
  return sha256_hex(text).substr(0, 16);
}

std::string result_to_json(const ResultRecord& r) {
  ojson j;
  j["schema_version"] = r.schema_version;
  j["backend"] = r.backend;
  j["fidelity"] = r.fidelity;
  j["timestamp"] = r.timestamp;
  const Provenance& p = r.provenance;
  j["provenance"] =
      ojson{{"muonbed_version", p.muonbed_version},
            {"git_hash", p.git_hash},
            {"simgrid_version", p.simgrid_version},
            {"host_name", p.host_name},
            {"experiment", p.experiment},
            {"experiment_file", p.experiment_file},
            {"point", p.point},
            {"resolved_config", p.resolved_config},
            {"point_id", point_identity(p.experiment, p.point, r.backend, p.resolved_config)}};
  const SetupInfo& s = r.setup;
  j["setup"] = ojson{{"strategy", s.strategy},
                     {"cluster", s.cluster},
                     {"model", s.model},
                     {"mesh", s.mesh},
                     {"world_size", s.world_size},
                     {"nodes", s.nodes},
                     {"gpus_per_node", s.gpus_per_node},
                     {"params", s.params},
                     {"muon_matrices", s.muon_matrices},
                     {"hyper_period", s.hyper_period},
                     {"rank_kind", s.rank_kind}};
  ojson patterns = ojson::array();
  for (const auto& pt : r.step.patterns)
    patterns.push_back(ojson{{"step", pt.step}, {"count", pt.count}, {"time_s", pt.time_s}});
  j["step"] = ojson{{"average_s", r.step.average_s},
                    {"worst_s", r.step.worst_s},
                    {"worst_step", r.step.worst_step},
                    {"patterns", patterns}};
  if (const StepStatistics& m = r.step.measured; m.timed_steps > 0) {
    j["step"]["warmup_steps"] = m.warmup_steps;
    j["step"]["timed_steps"] = m.timed_steps;
    j["step"]["median_s"] = m.median_s;
    j["step"]["p95_s"] = m.p95_s;
    j["step"]["stddev_s"] = m.stddev_s;
    j["step"]["min_s"] = m.min_s;
  }
  const BoundResult& b = r.bound;
  j["bound"] = ojson{{"step_s", b.step_s},
                     {"ratio", b.ratio},
                     {"binding", b.binding},
                     {"ns_total_s", b.ns_total_s},
                     {"ns_balanced_s", b.ns_balanced_s},
                     {"ns_longest_s", b.ns_longest_s},
                     {"gather_s", b.gather_s},
                     {"scatter_s", b.scatter_s},
                     {"owner_ranks", b.owner_ranks},
                     {"longest", b.longest}};
  const ThroughputResult& t = r.throughput;
  j["throughput"] =
      ojson{{"params_per_s_per_gpu", aw(t.params_per_s_per_gpu)},
            {"computation", ojson{{"time_s", aw(t.compute_time_s)},
                                  {"tflops_per_gpu", aw(t.compute_tflops_per_gpu)},
                                  {"useful_tflops_per_gpu", aw(t.useful_tflops_per_gpu)},
                                  {"utilization", aw(t.compute_utilization)}}},
            {"communication", ojson{{"time_s", aw(t.comm_time_s)},
                                    {"exposed_time_s", aw(t.comm_exposed_time_s)},
                                    {"GBps_per_gpu", aw(t.comm_GBps_per_gpu)}}}};
  j["traffic"] = ojson{{"model", r.traffic.model},
                       {"intra_node_bytes", aw(r.traffic.intra_node_bytes)},
                       {"network_bytes", aw(r.traffic.network_bytes)}};
  ojson colls = ojson::array();
  for (const auto& c : r.collectives) {
    colls.push_back(ojson{{"op", c.op},
                          {"label", c.label},
                          {"kind", c.kind},
                          {"group_size", c.group_size},
                          {"instances", c.instances},
                          {"steps", c.steps},
                          {"bytes", c.bytes},
                          {"time_s", c.time_s},
                          {"max_time_s", c.max_time_s},
                          {"algbw_GBps", c.algbw_GBps},
                          {"busbw_GBps", c.busbw_GBps},
                          {"crosses_nodes", c.crosses_nodes}});
    if (!c.step_times_s.empty()) colls.back()["step_times_s"] = c.step_times_s;
  }
  j["collectives"] = std::move(colls);
  ojson ranks = ojson::array();
  for (const auto& rr : r.ranks) {
    ojson memory{{"static_bytes", rr.memory.static_bytes},
                 {"peak_transient_bytes", rr.memory.peak_transient_bytes},
                 {"peak_bytes", rr.memory.peak_bytes}};
    if (rr.memory.measured_peak_bytes >= 0)  // measured backends only
      memory["measured_peak_bytes"] = rr.memory.measured_peak_bytes;
    ranks.push_back(ojson{{"rank", rr.rank},
                          {"node", rr.node},
                          {"average", breakdown(rr.average)},
                          {"worst", breakdown(rr.worst)},
                          {"bytes_sent", rr.bytes_sent},
                          {"bytes_received", rr.bytes_received},
                          {"memory", std::move(memory)}});
  }
  j["ranks"] = std::move(ranks);
  if (const TrainingResult& t = r.training; t.present) {
    j["training"] = ojson{{"tokens_per_step", t.tokens_per_step},
                          {"seq_len", t.seq_len},
                          {"micro_batches", t.micro_batches},
                          {"micro_batch_groups", t.micro_batch_groups},
                          {"overlap", t.overlap},
                          {"step_s", t.step_s},
                          {"forward_s", t.forward_s},
                          {"backward_s", t.backward_s},
                          {"parameter_gather_s", t.parameter_gather_s},
                          {"activation_comm_s", t.activation_comm_s},
                          {"gradient_sync_s", t.gradient_sync_s},
                          {"optimizer_s", t.optimizer_s},
                          {"exposed_optimizer_s", t.exposed_optimizer_s},
                          {"model_tflops", t.model_tflops},
                          {"mfu", t.mfu},
                          {"adamw_step_s", t.adamw_step_s},
                          {"muon_overhead", t.muon_overhead}};
    if (t.overhead_pairs > 0) {  // only a paired twin has them (goldens stay as they were)
      j["training"]["overhead_pairs"] = t.overhead_pairs;
      j["training"]["overhead_spread"] = t.overhead_spread;
    }
  }
  if (const MemoryFeasibilityResult& m = r.memory; m.present) {
    const TrainingMemory& b = m.breakdown;
    j["memory"] = ojson{{"model", m.model},
                        {"limit_bytes", m.limit_bytes},
                        {"peak_bytes", m.peak_bytes},
                        {"peak_rank", m.peak_rank},
                        {"over_ranks", m.over_ranks},
                        {"feasible", m.feasible},
                        {"breakdown", ojson{{"parameters", b.parameters},
                                            {"master_weights", b.master_weights},
                                            {"gradients", b.gradients},
                                            {"optimizer_state", b.optimizer_state},
                                            {"transients", b.transients()},
                                            {"activations", b.activations},
                                            {"reserved", b.reserved}}}};
  }
  if (const ExecutionInfo& e = r.execution; !e.library.empty())
    j["execution"] = ojson{{"library", e.library},
                           {"mpi_standard", e.mpi_standard},
                           {"launcher", e.launcher},
                           {"hosts", e.hosts},
                           {"ranks_per_host", e.ranks_per_host},
                           {"oversubscribed", e.oversubscribed},
                           {"blas", e.blas},
                           {"blas_threads", e.blas_threads},
                           {"compute_threads", e.compute_threads},
                           {"compute_mode", e.compute_mode},
                           {"engine_s", e.engine_s},
                           {"handlers_s", e.handlers_s},
                           {"mpi_s", e.mpi_s},
                           {"overhead_fraction", e.overhead_fraction}};
  if (const ExecutionInfo& e = r.execution; !e.library.empty() && e.has_speed_probe())
    j["execution"]["speed_probe"] = ojson{{"shape", e.probe_shape},
                                          {"predicted_s", e.probe_predicted_s},
                                          {"before_s", e.probe_before_s},
                                          {"after_s", e.probe_after_s}};
  j["notes"] = r.notes;
  if (!r.cross_check.empty()) {
    ojson checks = ojson::array();
    for (const CrossCheck& c : r.cross_check)
      checks.push_back(ojson{{"backend", c.backend},
                             {"fidelity", c.fidelity},
                             {"step_s", c.step_s},
                             {"difference_pct", c.difference_pct},
                             {"agree", c.agree}});
    j["cross_check"] = std::move(checks);
  }
  std::vector<std::string> bad;
  find_non_finite(j, "", bad);
  if (!bad.empty())
    throw Error(
        "results: the " + r.backend + " backend produced a non-finite number (NaN or " +
        "infinity) for " + bad.front() +
        (bad.size() > 1 ? " and " + std::to_string(bad.size() - 1) + " more field(s)" : "") +
        "; nothing was written. fix: check the cluster's numbers (README, 'Limits'); if "
        "they are in range, this is a muonbed bug: please report it with the experiment");
  // The checksum covers the whole text with its own value empty; it is the last key.
  j["checksum"] = "";
  std::string text = j.dump(1) + "\n";
  const std::size_t at = text.rfind(kChecksumField);
  text.insert(at + kChecksumField.size(), sha256_hex(text));
  return text;
}

ResultRecord result_from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    ResultRecord r;
    r.schema_version = j.at("schema_version").get<int>();
    if (r.schema_version != kResultsSchemaVersion)
      throw Error("results: schema_version " + std::to_string(r.schema_version) +
                  " is not the supported " + std::to_string(kResultsSchemaVersion) +
                  "; fix: rerun the experiment with this build");
    if (!verify_checksum(text))
      throw Error(
          "results: the checksum does not match the file's content (the file was edited or "
          "damaged after muonbed wrote it); fix: rerun the point (muonbed run EXP --point LABEL "
          "--force), never edit result files by hand");
    r.checksum = j.at("checksum").get<std::string>();
    r.backend = j.at("backend").get<std::string>();
    r.fidelity = j.at("fidelity").get<std::string>();
    r.timestamp = j.at("timestamp").get<std::string>();
    const auto& p = j.at("provenance");
    r.provenance = {
        p.at("muonbed_version").get<std::string>(), p.at("git_hash").get<std::string>(),
        p.at("simgrid_version").get<std::string>(), p.at("host_name").get<std::string>(),
        p.at("experiment").get<std::string>(),      p.at("experiment_file").get<std::string>(),
        p.at("point").get<std::string>(),           p.at("resolved_config").get<std::string>(),
        p.at("point_id").get<std::string>()};
    const auto& s = j.at("setup");
    r.setup.strategy = s.at("strategy").get<std::string>();
    r.setup.cluster = s.at("cluster").get<std::string>();
    r.setup.model = s.at("model").get<std::string>();
    r.setup.mesh = s.at("mesh").get<std::string>();
    r.setup.world_size = s.at("world_size").get<int>();
    r.setup.nodes = s.at("nodes").get<int>();
    r.setup.gpus_per_node = s.at("gpus_per_node").get<int>();
    r.setup.params = s.at("params").get<std::int64_t>();
    r.setup.muon_matrices = s.at("muon_matrices").get<int>();
    r.setup.hyper_period = s.at("hyper_period").get<int>();
    r.setup.rank_kind = s.value("rank_kind", r.backend == "mpi" ? "cpu" : "gpu");
    const auto& st = j.at("step");
    r.step.average_s = st.at("average_s").get<double>();
    r.step.worst_s = st.at("worst_s").get<double>();
    r.step.worst_step = st.at("worst_step").get<int>();
    for (const auto& pt : st.at("patterns"))
      r.step.patterns.push_back(
          {pt.at("step").get<int>(), pt.at("count").get<int>(), pt.at("time_s").get<double>()});
    if (st.contains("timed_steps")) {  // measured backends only
      StepStatistics& m = r.step.measured;
      m.warmup_steps = st.at("warmup_steps").get<int>();
      m.timed_steps = st.at("timed_steps").get<int>();
      m.median_s = st.at("median_s").get<double>();
      m.p95_s = st.at("p95_s").get<double>();
      m.stddev_s = st.at("stddev_s").get<double>();
      m.min_s = st.at("min_s").get<double>();
    }
    if (j.contains("bound")) {  // records written before the bound existed have none
      const auto& b = j.at("bound");
      r.bound.step_s = b.at("step_s").get<double>();
      r.bound.ratio = b.at("ratio").get<double>();
      r.bound.binding = b.at("binding").get<std::string>();
      r.bound.ns_total_s = b.at("ns_total_s").get<double>();
      r.bound.ns_balanced_s = b.at("ns_balanced_s").get<double>();
      r.bound.ns_longest_s = b.at("ns_longest_s").get<double>();
      r.bound.gather_s = b.at("gather_s").get<double>();
      r.bound.scatter_s = b.at("scatter_s").get<double>();
      r.bound.owner_ranks = b.at("owner_ranks").get<int>();
      r.bound.longest = b.at("longest").get<std::string>();
    }
    const auto& t = j.at("throughput");
    r.throughput.params_per_s_per_gpu = read_aw(t.at("params_per_s_per_gpu"));
    r.throughput.compute_time_s = read_aw(t.at("computation").at("time_s"));
    r.throughput.compute_tflops_per_gpu = read_aw(t.at("computation").at("tflops_per_gpu"));
    if (t.at("computation").contains("useful_tflops_per_gpu"))
      r.throughput.useful_tflops_per_gpu = read_aw(t.at("computation").at("useful_tflops_per_gpu"));
    r.throughput.compute_utilization = read_aw(t.at("computation").at("utilization"));
    r.throughput.comm_time_s = read_aw(t.at("communication").at("time_s"));
    r.throughput.comm_exposed_time_s = read_aw(t.at("communication").at("exposed_time_s"));
    r.throughput.comm_GBps_per_gpu = read_aw(t.at("communication").at("GBps_per_gpu"));
    const auto& tr = j.at("traffic");
    r.traffic.model = tr.at("model").get<std::string>();
    r.traffic.intra_node_bytes = read_aw(tr.at("intra_node_bytes"));
    r.traffic.network_bytes = read_aw(tr.at("network_bytes"));
    for (const auto& c : j.at("collectives")) {
      CollectiveResult x;
      x.op = c.at("op").get<int>();
      x.label = c.at("label").get<std::string>();
      x.kind = c.at("kind").get<std::string>();
      x.group_size = c.at("group_size").get<int>();
      x.instances = c.at("instances").get<int>();
      x.steps = c.at("steps").get<int>();
      x.bytes = c.at("bytes").get<double>();
      x.time_s = c.at("time_s").get<double>();
      x.max_time_s = c.at("max_time_s").get<double>();
      x.algbw_GBps = c.at("algbw_GBps").get<double>();
      x.busbw_GBps = c.at("busbw_GBps").get<double>();
      x.crosses_nodes = c.at("crosses_nodes").get<bool>();
      if (c.contains("step_times_s"))
        x.step_times_s = c.at("step_times_s").get<std::vector<double>>();
      r.collectives.push_back(std::move(x));
    }
    for (const auto& rr : j.at("ranks")) {
      RankResult x;
      x.rank = rr.at("rank").get<int>();
      x.node = rr.at("node").get<int>();
      x.average = read_breakdown(rr.at("average"));
      x.worst = read_breakdown(rr.at("worst"));
      x.bytes_sent = rr.at("bytes_sent").get<double>();
      x.bytes_received = rr.at("bytes_received").get<double>();
      const auto& m = rr.at("memory");
      x.memory = {
          m.at("static_bytes").get<std::int64_t>(),
          m.at("peak_transient_bytes").get<std::int64_t>(), m.at("peak_bytes").get<std::int64_t>(),
          m.contains("measured_peak_bytes") ? m.at("measured_peak_bytes").get<std::int64_t>()
                                            : std::int64_t{-1}};
      r.ranks.push_back(x);
    }
    if (j.contains("execution")) {  // measured backends only
      const auto& e = j.at("execution");
      ExecutionInfo& x = r.execution;
      x.library = e.at("library").get<std::string>();
      x.mpi_standard = e.at("mpi_standard").get<std::string>();
      x.launcher = e.at("launcher").get<std::string>();
      x.hosts = e.at("hosts").get<std::vector<std::string>>();
      x.ranks_per_host = e.at("ranks_per_host").get<std::vector<int>>();
      x.oversubscribed = e.at("oversubscribed").get<bool>();
      x.blas = e.at("blas").get<std::string>();
      x.blas_threads = e.at("blas_threads").get<int>();
      x.compute_threads = e.at("compute_threads").get<int>();
      x.compute_mode = e.value("compute_mode", std::string());
      x.engine_s = e.at("engine_s").get<double>();
      x.handlers_s = e.at("handlers_s").get<double>();
      x.mpi_s = e.at("mpi_s").get<double>();
      x.overhead_fraction = e.at("overhead_fraction").get<double>();
      if (e.contains("speed_probe")) {
        const auto& p = e.at("speed_probe");
        x.probe_shape = p.at("shape").get<std::vector<std::int64_t>>();
        x.probe_predicted_s = p.at("predicted_s").get<double>();
        x.probe_before_s = p.at("before_s").get<double>();
        x.probe_after_s = p.at("after_s").get<double>();
      }
    }
    if (j.contains("training")) {  // training steps only
      const auto& x = j.at("training");
      TrainingResult& t = r.training;
      t.present = true;
      t.tokens_per_step = x.at("tokens_per_step").get<std::int64_t>();
      t.seq_len = x.at("seq_len").get<std::int64_t>();
      t.micro_batches = x.at("micro_batches").get<std::int64_t>();
      t.micro_batch_groups = x.at("micro_batch_groups").get<int>();
      t.overlap = x.at("overlap").get<std::string>();
      t.step_s = x.at("step_s").get<double>();
      t.forward_s = x.at("forward_s").get<double>();
      t.backward_s = x.at("backward_s").get<double>();
      t.parameter_gather_s = x.at("parameter_gather_s").get<double>();
      t.activation_comm_s = x.at("activation_comm_s").get<double>();
      t.gradient_sync_s = x.at("gradient_sync_s").get<double>();
      t.optimizer_s = x.at("optimizer_s").get<double>();
      t.exposed_optimizer_s = x.at("exposed_optimizer_s").get<double>();
      t.model_tflops = x.at("model_tflops").get<double>();
      t.mfu = x.at("mfu").get<double>();
      t.adamw_step_s = x.at("adamw_step_s").get<double>();
      t.muon_overhead = x.at("muon_overhead").get<double>();
      if (x.contains("overhead_pairs")) {
        t.overhead_pairs = x.at("overhead_pairs").get<int>();
        t.overhead_spread = x.at("overhead_spread").get<double>();
      }
    }
    if (j.contains("memory")) {  // files written before the feasibility check have none
      const auto& m = j.at("memory");
      MemoryFeasibilityResult& x = r.memory;
      x.present = true;
      x.model = m.at("model").get<std::string>();
      x.limit_bytes = m.at("limit_bytes").get<std::int64_t>();
      x.peak_bytes = m.at("peak_bytes").get<std::int64_t>();
      x.peak_rank = m.at("peak_rank").get<int>();
      x.over_ranks = m.at("over_ranks").get<int>();
      x.feasible = m.at("feasible").get<bool>();
      const auto& b = m.at("breakdown");
      x.breakdown.parameters = b.at("parameters").get<std::int64_t>();
      x.breakdown.master_weights = b.at("master_weights").get<std::int64_t>();
      x.breakdown.gradients = b.at("gradients").get<std::int64_t>();
      x.breakdown.optimizer_state = b.at("optimizer_state").get<std::int64_t>();
      // The file gives transients as one figure (step buffers + NS scratch).
      x.breakdown.step_buffers = b.at("transients").get<std::int64_t>();
      x.breakdown.activations = b.at("activations").get<std::int64_t>();
      x.breakdown.reserved = b.at("reserved").get<std::int64_t>();
    }
    for (const auto& n : j.at("notes")) r.notes.push_back(n.get<std::string>());
    if (j.contains("cross_check"))
      for (const auto& c : j.at("cross_check"))
        r.cross_check.push_back({c.at("backend").get<std::string>(),
                                 c.at("fidelity").get<std::string>(), c.at("step_s").get<double>(),
                                 c.at("difference_pct").get<double>(), c.at("agree").get<bool>()});
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("results: malformed result JSON (") + e.what() +
                "); fix: regenerate the file with `muonbed run`");
  }
}

ResultRecord read_result_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    throw Error("cannot read result file '" + path + "': " + std::strerror(error) +
                "; fix: " + path_error_fix(error));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return result_from_json(buffer.str());
}

}  // namespace muonbed
