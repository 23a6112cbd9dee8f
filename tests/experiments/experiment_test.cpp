// Good experiment files: every shipped experiment parses, sweeps expand to the right points and
// labels, defaults resolve as documented, and each point's resolved YAML parses back to the same
// values. Also checks explicit placements reach the sharded model, and that shipped points plan.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/engine/cost_model.hpp"
#include "core/experiment/experiment.hpp"
#include "muonbed/config.hpp"

using namespace muonbed;

namespace {

std::vector<std::string> shipped_experiments() {
  std::vector<std::string> files;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(MUONBED_SOURCE_DIR) + "/experiments"))
    if (entry.path().extension() == ".yaml") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> labels(const std::vector<Experiment>& points) {
  std::vector<std::string> out;
  for (const Experiment& e : points) out.push_back(e.point_label);
  return out;
}

// Every value a point resolves to, compared field by field.
void require_same(const Experiment& a, const Experiment& b) {
  CHECK(a.name == b.name);
  CHECK(a.cluster.name == b.cluster.name);
  CHECK(a.cluster.source == b.cluster.source);
  CHECK(a.cluster.gpus_per_node == b.cluster.gpus_per_node);
  CHECK(a.cluster.nodes == b.cluster.nodes);
  CHECK(a.cluster.gpu.name == b.cluster.gpu.name);
  CHECK(a.cluster.gpu.peak_tflops == b.cluster.gpu.peak_tflops);
  CHECK(a.cluster.gpu.hbm_GBps == b.cluster.gpu.hbm_GBps);
  CHECK(a.cluster.gpu.memory_GiB == b.cluster.gpu.memory_GiB);
  REQUIRE(a.cluster.gpu.gemm_efficiency.size() == b.cluster.gpu.gemm_efficiency.size());
  for (std::size_t i = 0; i < a.cluster.gpu.gemm_efficiency.size(); ++i) {
    CHECK(a.cluster.gpu.gemm_efficiency[i].dim == b.cluster.gpu.gemm_efficiency[i].dim);
    CHECK(a.cluster.gpu.gemm_efficiency[i].efficiency ==
          b.cluster.gpu.gemm_efficiency[i].efficiency);
  }
  CHECK(a.cluster.intra.kind == b.cluster.intra.kind);
  CHECK(a.cluster.intra.bandwidth_GBps == b.cluster.intra.bandwidth_GBps);
  CHECK(a.cluster.intra.latency_us == b.cluster.intra.latency_us);
  CHECK(a.cluster.intra.pcie_switch_GBps == b.cluster.intra.pcie_switch_GBps);
  CHECK(a.cluster.nic.count_per_node == b.cluster.nic.count_per_node);
  CHECK(a.cluster.nic.bandwidth_GBps == b.cluster.nic.bandwidth_GBps);
  CHECK(a.cluster.nic.latency_us == b.cluster.nic.latency_us);
  CHECK(a.cluster.nic.rail_optimized == b.cluster.nic.rail_optimized);
  CHECK(a.cluster.network.topology == b.cluster.network.topology);
  CHECK(a.cluster.network.levels == b.cluster.network.levels);
  CHECK(a.cluster.network.nodes_per_leaf == b.cluster.network.nodes_per_leaf);
  CHECK(a.cluster.network.oversubscription == b.cluster.network.oversubscription);
  CHECK(a.cluster.network.switch_latency_us == b.cluster.network.switch_latency_us);

  CHECK(a.mesh.describe() == b.mesh.describe());
  REQUIRE(a.mesh.ndims() == b.mesh.ndims());
  for (int d = 0; d < a.mesh.ndims(); ++d) CHECK(a.mesh.dim(d).role == b.mesh.dim(d).role);

  CHECK(a.model.name == b.model.name);
  CHECK(a.model.num_layers == b.model.num_layers);
  REQUIRE(a.model.params.size() == b.model.params.size());
  for (std::size_t i = 0; i < a.model.params.size(); ++i) {
    CHECK(a.model.params[i].name == b.model.params[i].name);
    CHECK(a.model.params[i].shape == b.model.params[i].shape);
    CHECK(a.model.params[i].dtype == b.model.params[i].dtype);
    CHECK(a.model.params[i].role == b.model.params[i].role);
    CHECK(a.model.params[i].layer == b.model.params[i].layer);
  }

  CHECK(a.parallel.fsdp_tensor_dim == b.parallel.fsdp_tensor_dim);
  CHECK(a.parallel.tp_dim_per_param == b.parallel.tp_dim_per_param);
  CHECK(a.parallel.tp_shard_embeddings == b.parallel.tp_shard_embeddings);
  CHECK(a.parallel.dense_over_ep == b.parallel.dense_over_ep);
  CHECK(a.parallel.routing.embeddings_to_adamw == b.parallel.routing.embeddings_to_adamw);
  CHECK(a.parallel.routing.lm_head_to_adamw == b.parallel.routing.lm_head_to_adamw);
  CHECK(a.parallel.routing.router_to_adamw == b.parallel.routing.router_to_adamw);
  CHECK(a.parallel.routing.force_adamw == b.parallel.routing.force_adamw);

  const OptimizerConfig& o = a.optimizer;
  const OptimizerConfig& p = b.optimizer;
  CHECK(o.muon.lr == p.muon.lr);
  CHECK(o.muon.momentum == p.muon.momentum);
  CHECK(o.muon.nesterov == p.muon.nesterov);
  CHECK(o.muon.momentum_form == p.muon.momentum_form);
  CHECK(o.muon.weight_decay == p.muon.weight_decay);
  CHECK(o.muon.ns_steps == p.muon.ns_steps);
  CHECK(o.muon.ns_coefficients == p.muon.ns_coefficients);
  CHECK(o.muon.custom_coefficients == p.muon.custom_coefficients);
  CHECK(o.muon.adjust_lr_fn == p.muon.adjust_lr_fn);
  CHECK(o.muon.eps == p.muon.eps);
  CHECK(o.adamw.lr == p.adamw.lr);
  CHECK(o.adamw.beta1 == p.adamw.beta1);
  CHECK(o.adamw.beta2 == p.adamw.beta2);
  CHECK(o.adamw.eps == p.adamw.eps);
  CHECK(o.adamw.weight_decay == p.adamw.weight_decay);
  CHECK(o.qk_clip.enabled == p.qk_clip.enabled);
  CHECK(o.qk_clip.tau == p.qk_clip.tau);
  CHECK(o.qk_clip.head_dim == p.qk_clip.head_dim);
  CHECK(o.comm_dtype == p.comm_dtype);

  CHECK(a.strategy.to_json_text() == b.strategy.to_json_text());
  CHECK(a.strategy.explicit_owners == b.strategy.explicit_owners);
  CHECK(a.backends == b.backends);
  CHECK(a.sim_fidelity == b.sim_fidelity);
  CHECK(a.steps == b.steps);
  CHECK(a.repeats == b.repeats);
  CHECK(a.output_dir == b.output_dir);
}

void require_round_trip(const Experiment& e) {
  INFO("resolved YAML of " << e.file << " [" << e.point_label << "]:\n" << e.resolved_yaml);
  const std::vector<Experiment> again = parse_experiment(e.resolved_yaml, "resolved.yaml");
  REQUIRE(again.size() == 1);
  CHECK(again[0].point_label.empty());
  require_same(e, again[0]);
  // Resolving is idempotent: the resolved YAML of the resolved YAML is the same text, up to the
  // leading comment that names the source.
  auto body = [](const std::string& yaml) { return yaml.substr(yaml.find('\n')); };
  CHECK(body(again[0].resolved_yaml) == body(e.resolved_yaml));
}

}  // namespace

TEST_CASE("every shipped experiment parses and round-trips", "[experiments]") {
  const std::vector<std::string> files = shipped_experiments();
  REQUIRE(files.size() >= 8);
  for (const std::string& file : files) {
    INFO(file);
    const std::vector<Experiment> points = load_experiment(file);
    REQUIRE_FALSE(points.empty());
    for (const Experiment& e : points) {
      CHECK(e.file == file);
      CHECK_FALSE(e.resolved_yaml.empty());
      CHECK(e.mesh.world_size() >= 1);
      CHECK_NOTHROW(shard_model(e));
      require_round_trip(e);
    }
  }
}

TEST_CASE("quickstart sweeps every strategy in file order", "[experiments][sweep]") {
  const auto points =
      load_experiment(std::string(MUONBED_SOURCE_DIR) + "/experiments/quickstart.yaml");
  REQUIRE(points.size() == 5);
  CHECK(labels(points) ==
        std::vector<std::string>{"strategy.name=sequential", "strategy.name=replicated",
                                 "strategy.name=owner", "strategy.name=all_to_all",
                                 "strategy.name=owner_allgather"});
  for (const Experiment& e : points) {
    CHECK(e.name == "quickstart");
    CHECK(e.mesh.world_size() == 8);
    CHECK(e.model.name == "llama-7b");
    CHECK(e.cluster.name == "dgx-h100");
    CHECK(e.overrides.at("strategy.name") == e.strategy.name);
  }
}

TEST_CASE("a sweep is a cartesian product, last key fastest", "[experiments][sweep]") {
  const auto points = parse_experiment(
      "name: s\nmesh: {dims: {dp_shard: 2, tp: 2}}\nmodel: {preset: tiny-dense}\n"
      "sweep:\n  strategy.name: [owner, all_to_all]\n  mesh.dp_shard: [1, 2, 4]\n",
      "s.yaml");
  REQUIRE(points.size() == 6);
  CHECK(labels(points) == std::vector<std::string>{"strategy.name=owner,mesh.dp_shard=1",
                                                   "strategy.name=owner,mesh.dp_shard=2",
                                                   "strategy.name=owner,mesh.dp_shard=4",
                                                   "strategy.name=all_to_all,mesh.dp_shard=1",
                                                   "strategy.name=all_to_all,mesh.dp_shard=2",
                                                   "strategy.name=all_to_all,mesh.dp_shard=4"});
  CHECK(points[0].mesh.world_size() == 2);
  CHECK(points[2].mesh.world_size() == 8);
  CHECK(points[2].mesh.dim(0).name == "dp_shard");
  CHECK(points[2].mesh.size(0) == 4);
  CHECK(points[4].strategy.name == "all_to_all");
  CHECK(points[4].overrides.at("mesh.dp_shard") == "2");
}

TEST_CASE("mesh dim sweeps work on list-form dims too", "[experiments][sweep]") {
  const auto points = parse_experiment(
      "name: s\nmesh:\n  dims: [{name: pp, size: 2}, {name: dp_shard, size: 2}]\n"
      "model: {preset: tiny-dense}\nsweep: {mesh.dp_shard: [2, 8]}\n",
      "s.yaml");
  REQUIRE(points.size() == 2);
  CHECK(points[1].mesh.world_size() == 16);
  CHECK(points[1].mesh.dim(0).role == DimRole::pp);
}

TEST_CASE("cluster fields can be swept over a named cluster", "[experiments][sweep]") {
  const auto points = parse_experiment(
      "name: s\ncluster: dgx-h100\nmesh: {dims: {dp_shard: 8}}\nmodel: {preset: tiny-dense}\n"
      "sweep:\n  cluster.nic.bandwidth_GBps: [25, 48]\n  cluster.gpu.peak_tflops: [500]\n",
      "s.yaml");
  REQUIRE(points.size() == 2);
  CHECK(points[0].cluster.nic.bandwidth_GBps == 25);
  CHECK(points[1].cluster.nic.bandwidth_GBps == 48);
  CHECK(points[0].cluster.gpu.peak_tflops == 500);
  CHECK(points[0].cluster.gpu.hbm_GBps == 3000);  // untouched fields keep the preset's value
  for (const Experiment& e : points) require_round_trip(e);
}

TEST_CASE("list-valued sweeps label with flow YAML", "[experiments][sweep]") {
  const auto points = parse_experiment(
      "name: s\nmesh: {dims: {dp_shard: 8}}\nmodel: {preset: tiny-dense}\n"
      "sweep:\n  backend: [[sim, analytic], mpi]\n",
      "s.yaml");
  REQUIRE(points.size() == 2);
  CHECK(points[0].point_label == "backend=[sim, analytic]");
  CHECK(points[0].backends == std::vector<std::string>{"sim", "analytic"});
  CHECK(points[1].backends == std::vector<std::string>{"mpi"});
}

TEST_CASE("a zip group's keys vary together, crossed with the other sweep keys",
          "[experiments][sweep]") {
  // Issue 23 item 6: dp_shard and the cluster's node count grow together (a fixed 8 GPUs per
  // node); the strategy is crossed with each pair. 2 strategies x 3 pairs = 6 points, the zip
  // group's keys in its place in the label, the last axis fastest.
  const auto points = parse_experiment(
      "name: s\ncluster: dgx-h100\nmesh: {dims: {dp_shard: 8}}\nmodel: {preset: tiny-dense}\n"
      "sweep:\n"
      "  strategy.name: [owner, all_to_all]\n"
      "  zip:\n"
      "    mesh.dp_shard: [8, 16, 32]\n"
      "    cluster.nodes: [1, 2, 4]\n",
      "s.yaml");
  REQUIRE(points.size() == 6);
  CHECK(labels(points) ==
        std::vector<std::string>{"strategy.name=owner,mesh.dp_shard=8,cluster.nodes=1",
                                 "strategy.name=owner,mesh.dp_shard=16,cluster.nodes=2",
                                 "strategy.name=owner,mesh.dp_shard=32,cluster.nodes=4",
                                 "strategy.name=all_to_all,mesh.dp_shard=8,cluster.nodes=1",
                                 "strategy.name=all_to_all,mesh.dp_shard=16,cluster.nodes=2",
                                 "strategy.name=all_to_all,mesh.dp_shard=32,cluster.nodes=4"});
  for (const Experiment& e : points) {
    CHECK(e.cluster.nodes * 8 == e.mesh.world_size());
    CHECK(e.overrides.size() == 3);
    CHECK(e.overrides.at("mesh.dp_shard") == std::to_string(e.mesh.world_size()));
    require_round_trip(e);
  }
  CHECK(points[4].strategy.name == "all_to_all");
  CHECK(points[4].cluster.nodes == 2);
}

TEST_CASE("several zip groups form a product of their own", "[experiments][sweep]") {
  // A list of groups: each group is one axis; values may repeat within one key of a group.
  const auto points = parse_experiment(
      "name: s\ncluster: dgx-h100\nmesh: {dims: {dp_shard: 8}}\nmodel: {preset: tiny-dense}\n"
      "sweep:\n"
      "  zip:\n"
      "    - {mesh.dp_shard: [8, 16], cluster.nodes: [1, 2]}\n"
      "    - {strategy.name: [owner, owner, all_to_all], strategy.prefetch_count: [0, 2, 1]}\n",
      "s.yaml");
  REQUIRE(points.size() == 6);
  CHECK(points[0].point_label ==
        "mesh.dp_shard=8,cluster.nodes=1,strategy.name=owner,strategy.prefetch_count=0");
  CHECK(points[1].strategy.prefetch_count == 2);
  CHECK(points[2].strategy.name == "all_to_all");
  CHECK(points[5].point_label ==
        "mesh.dp_shard=16,cluster.nodes=2,strategy.name=all_to_all,strategy.prefetch_count=1");
  CHECK(points[5].mesh.world_size() == 16);
}

TEST_CASE("defaults resolve as documented", "[experiments]") {
  const auto points = parse_experiment("mesh: {dims: {dp_shard: 8}}\nmodel: {preset: llama-7b}\n",
                                       "some/dir/my-study.yaml");
  REQUIRE(points.size() == 1);
  const Experiment& e = points[0];
  CHECK(e.name == "my-study");  // the file's stem
  CHECK(e.cluster.name == "dgx-h100");
  CHECK(e.mesh.gpus_per_node() == 8);
  CHECK(e.mesh.dim(0).role == DimRole::fsdp);
  CHECK(e.strategy.name == "owner");
  CHECK(e.strategy.assign == "flop_balanced");
  CHECK(e.optimizer.muon.ns_steps == 5);
  CHECK(e.optimizer.muon.ns_coefficients == "keller");
  // torch.optim.Muon's and AdamW's defaults.
  CHECK(e.optimizer.muon.lr == 1e-3);
  CHECK(e.optimizer.muon.weight_decay == 0.1);
  CHECK(e.optimizer.muon.momentum == 0.95);
  CHECK(e.optimizer.muon.nesterov);
  CHECK(e.optimizer.muon.momentum_form == MomentumForm::lerp);
  CHECK(e.optimizer.muon.eps == 1e-7);
  CHECK(e.optimizer.muon.adjust_lr_fn == LrScaleRule::original);
  CHECK(e.optimizer.adamw.lr == 1e-3);
  CHECK(e.optimizer.adamw.beta2 == 0.999);
  CHECK(e.optimizer.adamw.weight_decay == 0.01);
  CHECK(e.backends == std::vector<std::string>{"sim"});
  CHECK(e.sim_fidelity == "auto");
  CHECK(e.steps == 2);  // warm-up steps of the measured backends
  CHECK(e.repeats == 10);
  CHECK(e.seed == 1);
  CHECK(e.output_dir == "results/my-study");
  CHECK(e.point_label.empty());
  CHECK(e.plan_settings().ns_steps() == 5);
  CHECK(e.plan_settings().comm_dtype() == DType::bf16);
}

TEST_CASE("every section parses into its struct", "[experiments]") {
  const auto points = parse_experiment(R"yaml(name: full
cluster:
  preset: dgx-h200
  nodes: 2
mesh:
  dims:
    dp_replicate: 2
    data: {size: 2, role: fsdp}
    tp: 4
  world_size: 16
model:
  preset: tiny-dense
  name: tiny
  dtype: fp32
parallel:
  fsdp_tensor_dim: 1
  tp_dim_per_param: {layers.0.attn.o: 0}
  tp_shard_embeddings: false
optimizer:
  lr: 0.01
  momentum: 0.9
  nesterov: false
  momentum_form: classic
  weight_decay: 0.2
  ns_steps: 2
  ns_coefficients: [[3.4445, -4.775, 2.0315], [2, -1.5, 0.5]]
  adjust_lr_fn: match_rms_adamw
  eps: 1e-6
  adamw: {lr: 1e-3, betas: [0.8, 0.99], eps: 1e-10, weight_decay: 0.05}
  qk_clip: {enabled: true, tau: 50}
  comm_dtype: fp32
  routing: {embeddings_to_adamw: false, lm_head_to_adamw: false, router_to_adamw: true,
            force_adamw: [layers.1.mlp.down]}
strategy:
  name: owner
  assign: round_robin
  async_gpu_parallelism: false
  prefetch_count: 0
  gather: flat
  small_param_threshold: 1e3
  grad_sync: {enabled: true, level_periods: [1, 2]}
backend: [sim, analytic]
sim: {fidelity: flow}
steps: 3
repeats: 2
output: out/full
)yaml",
                                       "full.yaml");
  REQUIRE(points.size() == 1);
  const Experiment& e = points[0];
  CHECK(e.cluster.name == "dgx-h200");
  CHECK(e.cluster.nodes == 2);
  CHECK(e.cluster.gpu.hbm_GBps == 4300);
  CHECK(e.mesh.describe().find("data=2") != std::string::npos);
  CHECK(e.mesh.dim(1).role == DimRole::fsdp);
  CHECK(e.mesh.dim(0).role == DimRole::replicate);
  CHECK(e.mesh.world_size() == 16);
  CHECK(e.model.name == "tiny");
  CHECK(e.model.params.front().dtype == DType::fp32);
  CHECK(e.parallel.fsdp_tensor_dim == 1);
  CHECK(e.parallel.tp_dim_per_param.at("layers.0.attn.o") == 0);
  CHECK_FALSE(e.parallel.tp_shard_embeddings);
  CHECK_FALSE(e.parallel.routing.embeddings_to_adamw);
  CHECK(e.parallel.routing.router_to_adamw);
  CHECK(e.parallel.routing.force_adamw == std::vector<std::string>{"layers.1.mlp.down"});
  CHECK(e.optimizer.muon.lr == 0.01);
  CHECK(e.optimizer.muon.momentum == 0.9);
  CHECK_FALSE(e.optimizer.muon.nesterov);
  CHECK(e.optimizer.muon.weight_decay == 0.2);
  CHECK(e.optimizer.muon.momentum_form == MomentumForm::classic);
  CHECK(e.optimizer.muon.ns_coefficients == "custom");
  CHECK(e.optimizer.muon.custom_coefficients.size() == 2);
  CHECK(e.optimizer.muon.custom_coefficients[0].b == -4.775);
  CHECK(e.optimizer.muon.custom_coefficients[1].c == 0.5);
  CHECK(e.optimizer.muon.adjust_lr_fn == LrScaleRule::match_rms_adamw);
  CHECK(e.optimizer.muon.eps == 1e-6);
  CHECK(e.optimizer.adamw.lr == 1e-3);
  CHECK(e.optimizer.adamw.beta1 == 0.8);
  CHECK(e.optimizer.adamw.beta2 == 0.99);
  CHECK(e.optimizer.adamw.eps == 1e-10);
  CHECK(e.optimizer.adamw.weight_decay == 0.05);
  CHECK(e.optimizer.qk_clip.enabled);
  CHECK(e.optimizer.qk_clip.tau == 50);
  CHECK(e.optimizer.qk_clip.head_dim == e.model.head_dim);
  CHECK(e.optimizer.qk_clip.head_dim > 0);
  // The resolved configuration reads back to the same optimizer and plan settings.
  const Experiment again = parse_experiment(e.resolved_yaml, "again.yaml").at(0);
  CHECK(again.optimizer.muon.custom_coefficients == e.optimizer.muon.custom_coefficients);
  CHECK(again.optimizer.adamw.beta1 == 0.8);
  CHECK(again.plan_settings().optimizer.qk_clip.head_dim == e.optimizer.qk_clip.head_dim);
  CHECK(e.optimizer.comm_dtype == DType::fp32);
  CHECK(e.strategy.name == "owner");
  CHECK(e.strategy.assign == "round_robin");
  CHECK_FALSE(e.strategy.async_gpu_parallelism);
  CHECK(e.strategy.prefetch_count == 0);
  CHECK(e.strategy.gather == "flat");
  CHECK(e.strategy.small_param_threshold == 1000);
  CHECK(e.strategy.grad_sync.enabled);
  CHECK(e.strategy.grad_sync.level_periods == std::vector<int>{1, 2});
  CHECK(e.backends == std::vector<std::string>{"sim", "analytic"});
  CHECK(e.sim_fidelity == "flow");
  CHECK(e.steps == 3);
  CHECK(e.output_dir == "out/full");
  require_round_trip(e);
  // The chunk options, which all_to_all reads (owner does not).
  const Experiment a2a = parse_experiment(
                             "name: c\nmesh: {dims: {dp_shard: 4}}\nmodel: {preset: tiny-dense}\n"
                             "strategy: {name: all_to_all, chunk_size: 4, max_chunks_in_flight: "
                             "3, chunk_by_shape: true, comm_lanes: 2, order: lpt}\n",
                             "c.yaml")
                             .at(0);
  CHECK(a2a.strategy.chunk_size == 4);
  CHECK(a2a.strategy.max_chunks_in_flight == 3);
  CHECK(a2a.strategy.chunk_by_shape);
  CHECK(a2a.strategy.comm_lanes == 2);
  CHECK(a2a.strategy.order == "lpt");
  require_round_trip(a2a);
}

TEST_CASE("strategy options: one no point reads is an error, others apply where read",
          "[experiments][strategy_options]") {
  const std::string head = "name: k\nmesh: {dims: {dp_shard: 4}}\nmodel: {preset: tiny-dense}\n";
  // Before: each of these parsed, and the option silently did nothing.
  CHECK_THROWS_WITH(
      parse_experiment(head + "strategy: {name: owner, chunk_sizing: ns_cost}\n", "k.yaml"),
      Catch::Contains("k.yaml:4:25") &&
          Catch::Contains("'strategy.chunk_sizing' does not apply to strategy owner") &&
          Catch::Contains("all_to_all, owner_allgather"));
  CHECK_THROWS_WITH(
      parse_experiment(head + "strategy: {name: sequential, comm_lanes: 4}\n", "k.yaml"),
      Catch::Contains("'strategy.comm_lanes' does not apply to strategy sequential"));
  CHECK_THROWS_WITH(parse_experiment(head + "strategy: {name: replicated, order: lpt}\n", "k.yaml"),
                    Catch::Contains("'strategy.order' does not apply to strategy replicated"));
  CHECK_THROWS_WITH(
      parse_experiment(head + "strategy: {name: replicated, assign: round_robin}\n", "k.yaml"),
      Catch::Contains("'strategy.assign' does not apply to strategy replicated"));
  // A default value is no setting: nothing to refuse.
  CHECK_NOTHROW(
      parse_experiment(head + "strategy: {name: owner, chunk_sizing: count}\n", "k.yaml"));
  // Shared by a sweep over strategies: kept where read, reset to its default where not, so each
  // point's resolved configuration, summary and plan carry only what applies to it.
  const auto points =
      parse_experiment(head +
                           "strategy: {name: owner, prefetch_count: 3, comm_lanes: 2}\n"
                           "sweep: {strategy.name: [owner, sequential, replicated]}\n",
                       "k.yaml");
  REQUIRE(points.size() == 3);
  CHECK(points[0].strategy.prefetch_count == 3);
  CHECK(points[1].strategy.prefetch_count == 1);  // sequential: no prefetch
  CHECK(points[1].strategy.comm_lanes == 1);      // sequential: one lane
  CHECK(points[2].strategy.prefetch_count == 3);
  CHECK(points[2].strategy.comm_lanes == 2);
  CHECK(points[1].resolved_yaml.find("prefetch_count: 1") != std::string::npos);
  for (const Experiment& p : points) require_round_trip(p);
  // With small matrices replicated, every strategy reads prefetch, lanes and order.
  CHECK_NOTHROW(parse_experiment(
      head + "strategy: {name: sequential, small_param_threshold: 100, prefetch_count: 2}\n",
      "k.yaml"));
}

TEST_CASE("dense and moe specs build their models", "[experiments]") {
  const auto dense = parse_experiment(
      "name: d\nmesh: {dims: {tp: 4}}\nmodel:\n  dense: {name: my-llama, hidden: 512, layers: 3, "
      "heads: 8, kv_heads: 4, ffn: 1376, vocab: 1000}\n",
      "d.yaml");
  REQUIRE(dense.size() == 1);
  CHECK(dense[0].model.name == "my-llama");
  CHECK(dense[0].model.num_layers == 3);
  require_round_trip(dense[0]);

  const auto moe = parse_experiment(
      "name: m\nmesh: {dims: {ep: 4, dp_shard: 2}}\nmodel:\n  moe: {hidden: 256, layers: 4, "
      "heads: 4, ffn: 512, vocab: 1000, experts: 16, expert_ffn: 64, shared_experts: 1, "
      "dense_layers: 1}\n",
      "m.yaml");
  REQUIRE(moe.size() == 1);
  const ShardedModel sharded = shard_model(moe[0]);
  int slices = 0;
  for (const DistributedParam& p : sharded.params)
    if (p.name.find("[ep=") != std::string::npos) ++slices;
  CHECK(slices == 3 * 3 * 4);  // 3 MoE layers x (gate, up, down) x 4 EP slices
  require_round_trip(moe[0]);
}

TEST_CASE("explicit params with placements reach the sharded model", "[experiments]") {
  const auto points = parse_experiment(R"yaml(name: explicit
mesh: {dims: {dp_shard: 2, tp: 2}}
model:
  placements: {dp_shard: "S(0)"}
  params:
    - {name: w1, shape: [64, 32], role: attn_q, layer: 0, placements: {dp_shard: "SS(0,2)", tp: "S(0)"}}
    - {name: w2, shape: [32, 64], layer: 1}
    - {name: n, shape: [64]}
)yaml",
                                       "explicit.yaml");
  REQUIRE(points.size() == 1);
  const Experiment& e = points[0];
  CHECK(e.model.num_layers == 2);
  CHECK(e.model.params[1].role == ParamRole::other_matrix);
  CHECK(e.model.params[2].role == ParamRole::norm);
  const ShardedModel sharded = shard_model(e);
  REQUIRE(sharded.params.size() == 3);
  CHECK(sharded.params[0].layout.placements()[0] == Placement::strided_shard(0, 2));
  CHECK(sharded.params[0].layout.placements()[1] == Placement::shard(0));
  CHECK(sharded.params[1].layout.placements()[0] == Placement::shard(0));  // model default
  CHECK(sharded.params[1].layout.placements()[1] == Placement::replicate());
  CHECK(sharded.params[2].optimizer == OptimizerKind::adamw);
  require_round_trip(e);
  // The round trip keeps the layouts.
  const ShardedModel again = shard_model(parse_experiment(e.resolved_yaml, "r.yaml")[0]);
  for (std::size_t i = 0; i < sharded.params.size(); ++i)
    CHECK(again.params[i].layout.placements() == sharded.params[i].layout.placements());
}

TEST_CASE("explicit params without placements use the parallel rules", "[experiments]") {
  const auto points = parse_experiment(
      "name: p\nmesh: {dims: {dp_shard: 2}}\nmodel:\n  params:\n"
      "    - {name: w, shape: [8, 8], role: mlp_up, layer: 0}\n",
      "p.yaml");
  const ShardedModel sharded = shard_model(points.at(0));
  CHECK(sharded.params.at(0).layout.placements()[0] == Placement::shard(0));
}

TEST_CASE("clusters resolve relative to the experiment file", "[experiments]") {
  const std::string dir = MUONBED_TEST_DATA_DIR;
  const auto points = parse_experiment(
      "name: c\ncluster: small-cluster.yaml\nmesh: {dims: {dp_shard: 8}}\nmodel: {preset: "
      "tiny-dense}\n",
      dir + "/exp.yaml");
  CHECK(points.at(0).cluster.name == "small-cluster");
  CHECK(points.at(0).mesh.gpus_per_node() == 4);
  CHECK(points.at(0).mesh.num_nodes() == 2);
  CHECK_THROWS_AS(parse_experiment("name: c\ncluster: small-cluster.yaml\nmesh: {dims: "
                                   "{dp_shard: 16}}\nmodel: {preset: tiny-dense}\n",
                                   dir + "/exp.yaml"),
                  ConfigError);
}

TEST_CASE("shipped points plan, and their plans cost finite, positive time",
          "[experiments][plan]") {
  for (const char* name : {"quickstart", "ddp", "pp"}) {
    const auto points =
        load_experiment(std::string(MUONBED_SOURCE_DIR) + "/experiments/" + name + ".yaml");
    for (const Experiment& e : points) {
      INFO(name << " [" << e.point_label << "]");
      const StepPlan plan = plan_experiment(e);  // validates the plan itself
      CHECK(plan.strategy == e.strategy.name);
      // Every Muon matrix has an owner on the mesh, except under `replicated` (every rank
      // orthogonalizes every matrix, so none has one).
      const ShardedModel& model = plan.model;
      REQUIRE_FALSE(model.muon_params().empty());
      for (int p : model.muon_params()) {
        const int owner = plan.assignment.owner.at(p);
        if (e.strategy.name == "replicated")
          CHECK(owner == Assignment::kNoOwner);
        else
          CHECK((owner >= 0 && owner < e.mesh.world_size()));
      }
      // The estimate of the step is a real duration, the worst step no faster than the average.
      const EstimateSummary est = estimate(plan, e.cluster);
      CHECK(std::isfinite(est.average_step_s));
      CHECK(est.average_step_s > 0);
      CHECK(est.worst_step_s >= est.average_step_s * (1 - 1e-12));
    }
  }
}
