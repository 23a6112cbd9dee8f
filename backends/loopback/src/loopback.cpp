// The in-process loopback executor (see backends/loopback/loopback.hpp).
#include "backends/loopback/loopback.hpp"

#include <string>

#include "backends/cpu/data.hpp"
#include "core/base/errors.hpp"

namespace muonbed {

class LoopbackExecutor::Handler final : public OpHandler {
 public:
  explicit Handler(LoopbackExecutor& x) : x_(x) {}
  Engine* engine = nullptr;
  cpu::StepContext context;

  void start_compute(int rank, int op) override {
    const RankOp& rop = rank_op(rank, op);
    x_.options_.compute(rop, *x_.stores_[rank], context);
    ++x_.ran_[op];
    engine->finish_compute(rank, op);
  }

  void memory(int rank, int op) override {
    const RankOp& rop = rank_op(rank, op);
    if (rop.kind == OpKind::alloc)
      x_.stores_[rank]->allocate(rop.tensor);
    else
      x_.stores_[rank]->release(rop.tensor);
  }

  void start_collective(const CollectiveInstance& instance) override {
    const int op = instance.op;
    const auto& members = instance.participants;
    std::vector<const RankOp*> rops;
    for (int m : members) rops.push_back(&rank_op(m, op));
    const std::size_t phases = rops.front()->phases.size();
    for (const RankOp* r : rops)
      if (r->phases.size() != phases) fail(op, "members lowered different numbers of phases");
    if (rops.front()->kind == OpKind::split_newton_schulz) {
      // The members' compute between the all-reduces of their phases, in lockstep.
      std::vector<cpu::SplitNsState> state;
      for (std::size_t i = 0; i < members.size(); ++i)
        state.push_back(cpu::split_ns_begin(*rops[i], *x_.stores_[members[i]], context));
      for (int round = 0; round < cpu::split_ns_rounds(context); ++round) {
        for (int k = 0; k < 2; ++k)
          run_phase(op, members, rops, cpu::split_ns_phase(round, k),
                    cpu::split_ns_wire(*rops.front(), round));
        for (std::size_t i = 0; i < members.size(); ++i)
          cpu::split_ns_after_round(state[i], round, *rops[i], *x_.stores_[members[i]], context);
      }
    } else {
      for (std::size_t ph = 0; ph < phases; ++ph)
        run_phase(op, members, rops, ph, rops.front()->wire_dtype);
      for (std::size_t i = 0; i < members.size(); ++i)
        cpu::run_keep(*rops[i], *x_.stores_[members[i]]);
    }
    ++x_.ran_[op];
    engine->finish_collective(instance.id);
  }

 private:
  // One phase of a collective instance: every member reads what it sends before any member
  // writes, then every message is delivered, and counted in bytes_moved.
  void run_phase(int op, const std::vector<int>& members, const std::vector<const RankOp*>& rops,
                 std::size_t ph, DType wire) {
    std::vector<cpu::PhaseMessages> out;
    out.reserve(members.size());
    for (std::size_t i = 0; i < members.size(); ++i)
      out.push_back(cpu::begin_phase(*x_.stores_[members[i]], rops[i]->phases[ph], wire));
    for (std::size_t i = 0; i < members.size(); ++i) {
      const ExchangePhase& phase = rops[i]->phases[ph];
      std::vector<const std::vector<std::byte>*> received;
      for (const Transfer& t : phase.recvs)
        received.push_back(&message(op, members, rops, out, t.peer_rank, members[i], ph));
      cpu::finish_phase(*x_.stores_[members[i]], phase, wire, out[i], received);
    }
    // Every message that was sent was received.
    for (std::size_t i = 0; i < members.size(); ++i)
      for (const Transfer& t : rops[i]->phases[ph].sends) {
        const RankOp& peer = rank_op(t.peer_rank, op);
        bool matched = false;
        for (const Transfer& r : peer.phases[ph].recvs)
          matched = matched || r.peer_rank == members[i];
        if (!matched)
          fail(op, "rank " + std::to_string(members[i]) + " sends rank " +
                       std::to_string(t.peer_rank) + " a message it does not receive");
        x_.moved_[{op, members[i], t.peer_rank}] +=
            static_cast<std::int64_t>(out[i].sends[&t - rops[i]->phases[ph].sends.data()].size());
      }
  }

  const RankOp& rank_op(int rank, int op) const {
    const RankOp* r = x_.programs_[rank].find(op);
    if (r == nullptr) fail(op, "rank " + std::to_string(rank) + " has no part in it");
    return *r;
  }

  const std::vector<std::byte>& message(int op, const std::vector<int>& members,
                                        const std::vector<const RankOp*>& rops,
                                        const std::vector<cpu::PhaseMessages>& out, int from,
                                        int to, std::size_t phase) const {
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i] != from) continue;
      const auto& sends = rops[i]->phases[phase].sends;
      for (std::size_t k = 0; k < sends.size(); ++k)
        if (sends[k].peer_rank == to) return out[i].sends[k];
    }
    fail(op, "rank " + std::to_string(to) + " expects a message from rank " + std::to_string(from) +
                 ", which sends none");
  }

  [[noreturn]] void fail(int op, const std::string& what) const {
    throw ExecutionError("loopback, plan op " + std::to_string(op) + " ('" +
                         x_.plan_.ops.at(op).label + "'): " + what);
  }

  LoopbackExecutor& x_;
};

LoopbackExecutor::LoopbackExecutor(const StepPlan& plan, LoopbackOptions options)
    : plan_(plan), options_(std::move(options)), index_(plan) {
  cpu::check_can_run(plan);
  const int world = plan.model.mesh.world_size();
  programs_.reserve(world);
  for (int r = 0; r < world; ++r) {
    programs_.push_back(lower_rank_program(plan, r, options_.lower));
    if (options_.edit_program) options_.edit_program(programs_.back());
  }
  const std::uint64_t seed = options_.seed;
  if (!options_.compute) options_.compute = cpu::run_compute;
  if (!options_.inputs)
    options_.inputs = [this, seed](const RankProgram& p, cpu::RankStore& s, int step) {
      cpu::fill_gradients(plan_, p, s, seed, step);
    };
  if (!options_.initial)
    options_.initial = [this, seed](const RankProgram& p, cpu::RankStore& s) {
      cpu::fill_parameters(plan_, p, s, seed);
    };
  for (int r = 0; r < world; ++r) {
    stores_.push_back(std::make_unique<cpu::RankStore>(programs_[r]));
    options_.initial(programs_[r], *stores_.back());
  }
  ran_.assign(plan.ops.size(), 0);
  handler_ = std::make_unique<Handler>(*this);
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  engine_ = std::make_unique<Engine>(index_, *handler_, all);
  handler_->engine = engine_.get();
}

LoopbackExecutor::~LoopbackExecutor() = default;

void LoopbackExecutor::run_step() {
  const int step = steps_;
  for (int r = 0; r < plan_.model.mesh.world_size(); ++r)
    options_.inputs(programs_[r], *stores_[r], step);
  handler_->context = cpu::make_step_context(plan_, options_.seed, step);
  engine_->begin_step(step);
  if (!engine_->step_done())
    throw ExecutionError("loopback: step " + std::to_string(step) + " cannot finish:\n" +
                         engine_->stall_report());
  ++steps_;
}

std::int64_t LoopbackExecutor::bytes_moved(int op, int from, int to) const {
  const auto it = moved_.find({op, from, to});
  return it == moved_.end() ? 0 : it->second;
}

}  // namespace muonbed
