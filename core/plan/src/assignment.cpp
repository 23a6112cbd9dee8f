// Owner assignment policies (round robin, LPT on NS FLOPs or sizes, expert/stage-local, explicit),
// their registry, validation and load summary.
#include "core/plan/assignment.hpp"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <tuple>

#include "core/base/errors.hpp"

namespace muonbed {

double newton_schulz_flops(std::int64_t rows, std::int64_t cols, int steps, std::int64_t batch) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return static_cast<double>(steps) * (4.0 * m * m * n + 2.0 * m * m * m) *
         static_cast<double>(batch);
}

std::vector<int> Assignment::owned_by(int rank) const {
  std::vector<int> result;
  for (int p = 0; p < static_cast<int>(owner.size()); ++p)
    if (owner[p] == rank) result.push_back(p);
  return result;
}

std::vector<int> candidate_owners(const ShardedModel& model, int param) {
  const auto& dp = model.params.at(param);
  std::vector<int> result;
  for (int rank = 0; rank < model.mesh.world_size(); ++rank) {
    if (dp.layout.holds(model.mesh, rank) && dp.layout.shard_numel(model.mesh, rank) > 0)
      result.push_back(rank);
  }
  return result;
}

namespace {

double param_flops(const DistributedParam& p, int ns_steps) {
  return newton_schulz_flops(p.rows(), p.cols(), ns_steps, p.batch());
}

// Longest-processing-time-first: heaviest matrix to the least-loaded candidate. Ties break on
// the lower parameter index and then the lower rank, so the result is deterministic.
Assignment assign_lpt(const ShardedModel& model, const std::vector<double>& cost) {
  Assignment a;
  a.owner.assign(model.params.size(), Assignment::kNoOwner);
  std::vector<int> order = model.muon_params();
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return cost[x] > cost[y]; });
  std::vector<double> load(model.mesh.world_size(), 0.0);
  for (int p : order) {
    const auto candidates = candidate_owners(model, p);
    if (candidates.empty()) continue;  // validate_assignment reports it
    int best = candidates.front();
    for (int r : candidates)
      if (load[r] < load[best]) best = r;
    a.owner[p] = best;
    load[best] += cost[p];
  }
  return a;
}

class RoundRobin final : public AssignPolicy {
 public:
  std::string name() const override { return "round_robin"; }
  // Seed 000's assign_fn: the i-th Muon matrix goes to the (i mod n)-th of its candidates.
  Assignment assign(const ShardedModel& model, int) const override {
    Assignment a;
    a.owner.assign(model.params.size(), Assignment::kNoOwner);
    int counter = 0;
    for (int p : model.muon_params()) {
      const auto candidates = candidate_owners(model, p);
      if (!candidates.empty()) a.owner[p] = candidates[counter % candidates.size()];
      ++counter;
    }
    return a;
  }
};

class FlopBalanced final : public AssignPolicy {
 public:
  std::string name() const override { return "flop_balanced"; }
  Assignment assign(const ShardedModel& model, int ns_steps) const override {
    std::vector<double> cost(model.params.size(), 0.0);
    for (int p : model.muon_params()) cost[p] = param_flops(model.params[p], ns_steps);
    return assign_lpt(model, cost);
  }
};

class SizeBalanced final : public AssignPolicy {
 public:
  std::string name() const override { return "size_balanced"; }
  Assignment assign(const ShardedModel& model, int) const override {
    std::vector<double> cost(model.params.size(), 0.0);
    for (int p : model.muon_params()) cost[p] = static_cast<double>(model.params[p].numel());
    return assign_lpt(model, cost);
  }
};

// Topology-aware LPT ("topology"): the heaviest matrix first, to the least-loaded candidate
// (so the NS balance is flop_balanced's), and among equally loaded candidates to the node with
// the least NS work so far, then to the NIC rail (the GPU's index in its node: on DGX-style
// rail-optimized clusters GPU i uses NIC i and leaf switch i) with the least work, then the
// lower rank. flop_balanced's tie-break (lowest rank) puts the first ranks' owners on the first
// nodes: at 1,024 GPUs its 240 largest matrices land on 30 nodes, 8 per node, and their gathers
// queue on those nodes' NICs; spread, they land on 8 times as many nodes and rails and their
// gathers use distinct links at the same time.
class TopologySpread final : public AssignPolicy {
 public:
  std::string name() const override { return "topology"; }
  Assignment assign(const ShardedModel& model, int ns_steps) const override {
    const DeviceMesh& mesh = model.mesh;
    Assignment a;
    a.owner.assign(model.params.size(), Assignment::kNoOwner);
    std::vector<double> cost(model.params.size(), 0.0);
    for (int p : model.muon_params()) cost[p] = param_flops(model.params[p], ns_steps);
    std::vector<int> order = model.muon_params();
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return cost[x] > cost[y]; });
    std::vector<double> load(mesh.world_size(), 0.0);
    std::vector<double> node_load(mesh.num_nodes(), 0.0);
    std::vector<double> rail_load(mesh.gpus_per_node(), 0.0);
    auto key = [&](int r) {
      return std::make_tuple(load[r], node_load[mesh.node_of(r)],
                             rail_load[r % mesh.gpus_per_node()], r);
    };
    for (int p : order) {
      const auto candidates = candidate_owners(model, p);
      if (candidates.empty()) continue;  // validate_assignment reports it
      int best = candidates.front();
      for (int r : candidates)
        if (key(r) < key(best)) best = r;
      a.owner[p] = best;
      load[best] += cost[p];
      node_load[mesh.node_of(best)] += cost[p];
      rail_load[best % mesh.gpus_per_node()] += cost[p];
    }
    return a;
  }
};

// Matrices that live on one coordinate of an independent dim (an EP slice, a PP stage) are
// balanced among the ranks of that coordinate only, round-robin in parameter order, so each
// expert group or stage spreads its own matrices over its own ranks. Others: flop_balanced.
class LocalRoundRobin final : public AssignPolicy {
 public:
  LocalRoundRobin(std::string name, DimRole role) : name_(std::move(name)), role_(role) {}
  std::string name() const override { return name_; }
  Assignment assign(const ShardedModel& model, int ns_steps) const override {
    Assignment a = FlopBalanced().assign(model, ns_steps);
    const auto role_dims = model.mesh.dims_with_role(role_);
    std::map<std::vector<int>, int> counters;  // independent coords -> next candidate
    for (int p : model.muon_params()) {
      const auto& layout = model.params[p].layout;
      std::vector<int> key;
      bool independent = false;
      for (int d : role_dims) {
        if (layout.independent_dims().contains(d)) {
          independent = true;
          key.push_back(layout.placements()[d].coord);
        } else {
          key.push_back(-1);
        }
      }
      if (!independent) continue;
      const auto candidates = candidate_owners(model, p);
      if (candidates.empty()) continue;
      int& counter = counters[key];
      a.owner[p] = candidates[counter % candidates.size()];
      ++counter;
    }
    return a;
  }

 private:
  std::string name_;
  DimRole role_;
};

class ExplicitOwners final : public AssignPolicy {
 public:
  explicit ExplicitOwners(std::map<std::string, int> owners) : owners_(std::move(owners)) {}
  std::string name() const override { return "explicit"; }
  Assignment assign(const ShardedModel& model, int) const override {
    Assignment a;
    a.owner.assign(model.params.size(), Assignment::kNoOwner);
    std::map<std::string, int> unused = owners_;
    for (int p : model.muon_params()) {
      const auto it = owners_.find(model.params[p].name);
      if (it == owners_.end()) {
        throw PlanError("explicit assignment gives no owner for Muon matrix '" +
                        model.params[p].name + "'; add '" + model.params[p].name +
                        ": RANK' to strategy.explicit_owners");
      }
      a.owner[p] = it->second;
      unused.erase(it->first);
    }
    if (!unused.empty()) {
      throw PlanError("explicit assignment names '" + unused.begin()->first +
                      "', which is not a Muon matrix of this model; remove it or fix the name "
                      "(muonbed plan --json lists the names)");
    }
    return a;
  }

 private:
  std::map<std::string, int> owners_;
};

std::map<std::string, AssignPolicyFactory>& registry() {
  static std::map<std::string, AssignPolicyFactory> factories = {
      {"round_robin", [] { return std::unique_ptr<AssignPolicy>(new RoundRobin()); }},
      {"flop_balanced", [] { return std::unique_ptr<AssignPolicy>(new FlopBalanced()); }},
      {"size_balanced", [] { return std::unique_ptr<AssignPolicy>(new SizeBalanced()); }},
      {"topology", [] { return std::unique_ptr<AssignPolicy>(new TopologySpread()); }},
      {"expert_local",
       [] {
         return std::unique_ptr<AssignPolicy>(new LocalRoundRobin("expert_local", DimRole::ep));
       }},
      {"stage_local",
       [] {
         return std::unique_ptr<AssignPolicy>(new LocalRoundRobin("stage_local", DimRole::pp));
       }},
  };
  return factories;
}

}  // namespace

std::unique_ptr<AssignPolicy> make_assign_policy(const std::string& name) {
  const auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const auto& n : assign_policy_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error("unknown assign policy '" + name + "'; known policies: " + known);
  }
  return it->second();
}

std::unique_ptr<AssignPolicy> make_explicit_assign_policy(std::map<std::string, int> owners) {
  return std::make_unique<ExplicitOwners>(std::move(owners));
}

std::vector<std::string> assign_policy_names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : registry()) names.push_back(name);
  names.push_back("explicit");
  return names;
}

void register_assign_policy(const std::string& name, AssignPolicyFactory factory) {
  registry()[name] = factory;
}

void validate_assignment(const ShardedModel& model, const Assignment& assignment) {
  if (assignment.owner.size() != model.params.size()) {
    throw PlanError("assignment covers " + std::to_string(assignment.owner.size()) +
                    " parameters but the model has " + std::to_string(model.params.size()));
  }
  const int world = model.mesh.world_size();
  for (std::size_t p = 0; p < model.params.size(); ++p) {
    const auto& dp = model.params[p];
    const int owner = assignment.owner[p];
    if (dp.optimizer != OptimizerKind::muon) {
      if (owner != Assignment::kNoOwner) {
        throw PlanError("parameter '" + dp.name +
                        "' is updated by AdamW but has an owner; only Muon matrices are assigned");
      }
      continue;
    }
    if (owner == Assignment::kNoOwner) {
      throw PlanError("Muon matrix '" + dp.name +
                      "' has no owner; every matrix must be assigned exactly once");
    }
    if (owner < 0 || owner >= world) {
      throw PlanError("Muon matrix '" + dp.name + "' is assigned to rank " + std::to_string(owner) +
                      ", outside the mesh's ranks 0.." + std::to_string(world - 1));
    }
    if (!dp.layout.holds(model.mesh, owner) || dp.layout.shard_numel(model.mesh, owner) == 0) {
      throw PlanError("Muon matrix '" + dp.name + "' is assigned to rank " + std::to_string(owner) +
                      ", which holds no piece of it; choose one of the ranks that hold it "
                      "(its placements: " +
                      dp.layout.describe(model.mesh) + ")");
    }
  }
}

void summarize(const ShardedModel& model, int ns_steps, Assignment& assignment) {
  assignment.ns_flops_per_rank.assign(model.mesh.world_size(), 0.0);
  for (std::size_t p = 0; p < model.params.size(); ++p) {
    const int owner = assignment.owner[p];
    if (owner >= 0) assignment.ns_flops_per_rank[owner] += param_flops(model.params[p], ns_steps);
  }
  const auto& f = assignment.ns_flops_per_rank;
  const double total = std::accumulate(f.begin(), f.end(), 0.0);
  const double mean = total / static_cast<double>(f.size());
  const double max = f.empty() ? 0.0 : *std::max_element(f.begin(), f.end());
  assignment.imbalance = mean > 0 ? max / mean : 1.0;
}

}  // namespace muonbed
