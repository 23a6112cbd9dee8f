// The MPI executor under the shared measuring loop (see backends/mpi/measure.hpp).
#include "backends/mpi/measure.hpp"

#include "core/base/errors.hpp"

namespace muonbed::mpi {

namespace {

class MpiRank final : public MeasuredRank {
 public:
  MpiRank(const StepPlan& plan, MPI_Comm world, const ExecutorOptions& options)
      : executor_(plan, world, options), inline_(options.inline_compute) {}
  void run_step(int step) override { executor_.run_step(step); }
  const StepTimings& timings() const override { return executor_.timings(); }
  int rank() const override { return executor_.rank(); }
  const std::vector<int>& host_of() const override { return executor_.host_of(); }
  const std::vector<std::string>& hosts() const override { return executor_.hosts(); }
  int compute_threads() const override { return executor_.compute_threads(); }
  std::string compute_mode() const override {
    return inline_ ? "inline" : std::string(to_string(executor_.compute_mode()));
  }
  void run_check_step(int step) override { executor_.run_check_step(step); }
  std::int64_t pool_peak_bytes() const override { return executor_.store().peak_bytes(); }

 private:
  Executor executor_;
  bool inline_ = false;
};

}  // namespace

std::optional<Measured> measure(const StepPlan& plan, MPI_Comm world,
                                const ExecutorOptions& options, const MeasureSettings& settings,
                                const StepPlan* twin) {
  if (settings.timed_steps < 1) throw Error("mpi: at least one timed step (repeats >= 1)");
  set_blas_threads(settings.blas_threads);
  MpiRank executor(plan, world, options);
  if (twin == nullptr) return measure_rank(plan, world, executor, options.timeout_s, settings);
  ExecutorOptions twin_options = options;
  twin_options.fault = {};
  MpiRank twin_executor(*twin, world, twin_options);
  return measure_paired(plan, *twin, world, executor, twin_executor, options.timeout_s, settings);
}

}  // namespace muonbed::mpi
