// Assignment: one owner rank per Muon matrix, the rank that orthogonalizes it.
//
// Candidates are the ranks that hold a non-empty piece of the matrix. Across replicas (HSDP,
// DDP, CP) every replica holds a piece, so the NS work is split between replica groups instead of
// repeated in each (seed 000's CP design: zero redundancy also across replicas).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/model/parallelize.hpp"

namespace muonbed {

// NS FLOPs of one matrix: steps * (4 m^2 n + 2 m^3) with m = min(rows, cols), n = max, times
// the stack's batch. (X X^T is 2m^2n, A.A is 2m^3, B.X is 2m^2n per iteration.)
double newton_schulz_flops(std::int64_t rows, std::int64_t cols, int steps, std::int64_t batch = 1);

struct Assignment {
  static constexpr int kNoOwner = -1;
  std::vector<int> owner;  // per DistributedParam; kNoOwner for AdamW parameters

  std::vector<double> ns_flops_per_rank;  // filled by summarize()
  double imbalance = 1.0;                 // max / mean over ranks of NS FLOPs
  std::vector<int> owned_by(int rank) const;
};

// Candidate owners of a param: ranks holding a non-empty piece, ascending.
std::vector<int> candidate_owners(const ShardedModel& model, int param);

// An assignment policy chooses owners. Add one by deriving from this in a single file and
// registering it (see register_assign_policy); no backend needs to know.
class AssignPolicy {
 public:
  virtual ~AssignPolicy() = default;
  virtual std::string name() const = 0;
  virtual Assignment assign(const ShardedModel& model, int ns_steps) const = 0;
};

// Built-in names: round_robin, flop_balanced, size_balanced, topology (flop_balanced, spread
// over nodes and NIC rails), expert_local, stage_local.
// "explicit" is made by make_explicit_assign_policy. Throws Error listing known names.
std::unique_ptr<AssignPolicy> make_assign_policy(const std::string& name);
std::unique_ptr<AssignPolicy> make_explicit_assign_policy(std::map<std::string, int> owner_by_name);
std::vector<std::string> assign_policy_names();
using AssignPolicyFactory = std::unique_ptr<AssignPolicy> (*)();
void register_assign_policy(const std::string& name, AssignPolicyFactory factory);

// Throws PlanError naming the matrix when a Muon matrix has no owner, an owner is out of range
// or holds no piece of it, or an AdamW parameter has an owner.
void validate_assignment(const ShardedModel& model, const Assignment& assignment);
// Fills ns_flops_per_rank and imbalance.
void summarize(const ShardedModel& model, int ns_steps, Assignment& assignment);

}  // namespace muonbed
