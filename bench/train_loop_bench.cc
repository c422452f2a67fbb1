// The compute limit for bench/training.sh: a plain single-process libtorch training loop over the
// same TorchScript zoo model, data path (Dataset::Batch of the same indices, the same
// normalization), optimizer and compute threads (SetComputeThreads on the thread that trains) as a
// dtrain worker's rank, pinned to the cores the local cluster gives that worker (--cpus), with no
// service and no communication around it, and the worker's allocator (jemalloc). Prints one JSON
// row:
// {"system", "model", "ranks", "batch", "threads", "samples_per_s", "start", "end", "barrier_s",
// "parameters_sum", "phases_ms", "core_wait_s"}; core_wait_s is the training thread's time ready
// to run while other threads held its core (-1 where the kernel does not say), as a job's log
// gives it for each rank.
// --lockstep makes the ranks of one ceiling meet at a barrier after every step (a synchronous run
// with a free, instant all-reduce), and barrier_s is the time spent there. --average_gradients
// turns that meeting into a real all-reduce after backward, the shm plane's ddp algorithm with no
// service around it: the gradients are copied into the shared file, and between two barriers each
// rank averages its part of them, in rank order, into every rank's (barrier_s then sums both
// waits), so that their models follow a ddp job's trajectory rather than each its own (which
// changes the compute: see the flag).
// --split_step runs the optimizer step a ddp job on shm runs by default, split between its ranks:
// each rank steps its part of the parameters inside the all-reduce (with --all_ranks: one update
// for the job, copied into every replica), so that the loops do a split job's work, no more; and,
// as a split job's backward does, it makes the new gradients in the shared file (landing places,
// worker/strategies/gradient_landing.h) instead of copying them there.
// --rank/--world_size read the batches a job's rank reads (--shuffle and --seed: its sampler's
// order); --start_at (Unix seconds) starts every process of a ceiling at once, and start/end
// (Unix seconds) let the script compute their joint rate over the same interval dtrain's timer
// spans.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include <ATen/Parallel.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/lockstep_file.h"
#include "bench/plain_loop.h"
#include "common/distributed_sampler.h"
#include "common/process_tuning.h"
#include "common/status_macros.h"
#include "common/thread_schedstat.h"
#include "worker/collectives/rank_order_reduction.h"
#include "worker/collectives/reduction_partition.h"
#include "worker/data/dataset.h"
#include "worker/runtime/worker_allocator.h"
#include "worker/strategies/gradient_landing_allocator.h"

ABSL_FLAG(std::string, model, "cnn", "mlp or cnn");
ABSL_FLAG(int, batch, 128, "samples per step");
ABSL_FLAG(int, steps, 100, "timed steps");
ABSL_FLAG(int, warmup, 10, "untimed steps first");
ABSL_FLAG(int, warm_process, 0,
          "steps on a throwaway model before the measured one is made (a worker daemon's "
          "process is warm from its earlier jobs: libraries initialized, heap grown)");
ABSL_FLAG(int, threads, 0, "libtorch threads (0: one per core)");
ABSL_FLAG(int, rank, 0, "this process's slice of each global batch");
ABSL_FLAG(int, world_size, 1, "processes sharing each global batch");
ABSL_FLAG(std::string, cpus, "", "pin the training thread to these cores, as a worker's --cpus");
ABSL_FLAG(double, start_at, 0, "Unix time to start training at (0: at once)");
ABSL_FLAG(bool, nesterov, false, "Nesterov momentum (the README demo's optimizer)");
ABSL_FLAG(double, lr, 0.05, "learning rate (a job spec's optimizer.lr)");
ABSL_FLAG(bool, shuffle, false,
          "data.shuffle: each epoch's samples in the order of its permutation by --seed and the "
          "epoch, as a job's sampler draws them; else in order. Either way each rank reads the "
          "batches a job's rank reads (common/distributed_sampler.h), an epoch's "
          "smaller last batch included");
ABSL_FLAG(uint64_t, seed, 1,
          "seed_everything: the model's initial weights and, with --shuffle, each epoch's "
          "permutation (the bench's and the demo's job specs give 1)");
ABSL_FLAG(std::string, step_times, "",
          "if set, each timed step's duration in microseconds is written to this file, one per "
          "line (bench/ceiling.sh pairs the ceiling's two ranks' steps); with --all_ranks a line "
          "holds each rank's part of the step (its gradients, its share of the mean, its update)");
ABSL_FLAG(bool, cosine, false,
          "anneal the learning rate to 0 over the run (--warmup and --steps), as a job's "
          "lr_scheduler cosine does over its run (else a constant learning rate)");
ABSL_FLAG(int, epochs, 0,
          "if > 0, the run (--warmup and --steps together) is this many epochs of the training "
          "set as a job of --world_size ranks counts them (samples / (batch * world_size), "
          "rounded up), so that a ceiling runs a job's whole trajectory; it overrides --steps");

ABSL_FLAG(bool, print_allocator_env, false,
          "print the environment that gives another program the worker's allocator (NAME=value "
          "lines: LD_PRELOAD, MALLOC_CONF; bench/training.sh's torch peer) and exit");

ABSL_FLAG(std::string, lockstep, "",
          "if set, a file the ranks of one ceiling share: each step ends at a barrier there (a "
          "spin on shared counters), so the ranks step together as ddp's all-reduce makes them; "
          "with no data exchanged and a free, instant reduction unless --average_gradients");

ABSL_FLAG(bool, average_gradients, false,
          "with --lockstep: average the ranks' gradients before each update as the shm plane's "
          "ddp does (the gradients live in the shared file; each rank reduces its 1/world of "
          "them into every rank's between two barriers), so that every rank trains the model a "
          "ddp job trains. Without it each rank trains its own model on its half "
          "of the data at the full learning rate, and on the CNN that trajectory's max-pooling "
          "is measurably cheaper per sample than a ddp job's (docs/BENCHMARKS.md)");

ABSL_FLAG(bool, split_step, false,
          "the optimizer step of a ddp job whose step is split between its ranks (a job's "
          "trainer.split_optimizer_step, on by default on shm): with --all_ranks one replica "
          "steps and its parameters are copied into the others (one update for the job); with "
          "--average_gradients the parameters live in the shared file too, and each rank steps "
          "its part of them right after reducing its part of the gradients, then copies the new "
          "values into the other ranks' parameters, before the second barrier (the shm plane's "
          "split step). The parameters end as without it, bit for bit");

ABSL_FLAG(bool, all_ranks, false,
          "each step computes the gradients of every rank's batch (--world_size of them) in "
          "turn, each on its own replica of the model, averages them in rank order into every "
          "replica and updates each: a ddp job's whole computation on one core, with no "
          "communication and no waiting, so that a free ceiling trains the model a ddp job "
          "trains. samples counts --world_size batches a step, and --rank is not used");

using dtrain::bench::GradientsLanded;
using dtrain::bench::GradientsToPlaces;
using dtrain::bench::LockstepBarrier;
using dtrain::bench::MakeLanding;
using dtrain::bench::PartOptimizer;
using dtrain::bench::PlaceGradients;
using dtrain::bench::PlaceParameters;
using dtrain::bench::ReduceOwnPart;

namespace {

// Rank r's batch at a step, as a job's ranks draw theirs (TrainShard, Batches): so that the
// loops gather the rows the job gathers, in its order, with its smaller last batch of an epoch
// (until 2026-12-01 one fixed permutation read in windows, whose order proved ~4% cheaper on the
// demo's CNN than the job's: docs/BENCHMARKS.md). An epoch's shards are made at its first step.
class JobBatches {
 public:
  JobBatches(int64_t n, int world, int batch, bool shuffle, uint64_t seed)
      : n_(n),
        world_(world),
        batch_(batch),
        shuffle_(shuffle),
        seed_(seed),
        ranks_(world),
        // Counted from the sampler itself rather than by a formula that could drift from it:
        // every rank has as many (its shard is padded).
        per_epoch_(static_cast<int64_t>(
            dtrain::Batches(dtrain::TrainShard(n, world, 0, false, 0, 0), batch).size())) {}

  int64_t per_epoch() const { return per_epoch_; }

  const std::vector<int64_t>& Of(int64_t step, int r) {
    const int64_t epoch = step / per_epoch();
    if (epoch != epoch_) {
      for (auto& batches : ranks_) batches.clear();
      epoch_ = epoch;
    }
    if (ranks_[r].empty()) {
      ranks_[r] =
          dtrain::Batches(dtrain::TrainShard(n_, world_, r, shuffle_, seed_, epoch), batch_);
    }
    return ranks_[r][step % per_epoch()];
  }

 private:
  int64_t n_;
  int world_, batch_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<std::vector<std::vector<int64_t>>> ranks_;  // [rank][batch of the epoch]
  int64_t per_epoch_;
};

// The averaging reads gradients as flat float arrays.
absl::Status CheckGradient(const torch::Tensor& grad) {
  if (!grad.defined() || !grad.is_contiguous() || grad.scalar_type() != torch::kFloat32) {
    return absl::FailedPreconditionError(
        "averaging gradients: a parameter's gradient is missing or not contiguous float32");
  }
  return absl::OkStatus();
}

// The replicas' mean of every parameter's gradient (--all_ranks), in rank order with the shm
// plane's kernel (so the bits of a ddp job's mean of the same gradients), written into every
// replica's gradients (the kernel may write over its inputs).
absl::Status MeanOfGradients(const std::vector<const std::vector<torch::Tensor>*>& replicas) {
  const size_t world = replicas.size();
  std::vector<const float*> in(world);
  std::vector<float*> out(world);
  for (size_t i = 0; i < replicas[0]->size(); ++i) {
    for (size_t r = 0; r < world; ++r) {
      const torch::Tensor& grad = (*replicas[r])[i].grad();
      DTRAIN_RETURN_IF_ERROR(CheckGradient(grad));
      in[r] = out[r] = grad.data_ptr<float>();
    }
    dtrain::ReduceInRankOrder<float>(in.data(), static_cast<int>(world), out.data(),
                                     static_cast<int>(world), (*replicas[0])[i].numel(),
                                     dtrain::ReductionKind::kMean);
  }
  return absl::OkStatus();
}

// The trained model's parameters summed in double: ranks that averaged their gradients, and a
// process that computed every rank (--all_ranks), end with the same sum when they trained the
// same model, which checks the averaging.
double ParametersSum(const dtrain::bench::PlainLoop& loop) {
  double sum = 0;
  for (const torch::Tensor& p : loop.Parameters()) sum += p.sum(torch::kFloat64).item<double>();
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_print_allocator_env)) {
    for (const std::string& line : dtrain::WorkerAllocatorEnvironment()) {
      std::printf("%s\n", line.c_str());
    }
    return 0;
  }
  // The worker's process settings (worker/main.cc); PrepareTrainingThread checks its allocator.
  dtrain::TuneLocking();
  // As a worker does: every allocation goes through the lending allocator, lending or not.
  dtrain::InstallGradientLandingAllocator();
  if (absl::Status ready = dtrain::bench::PrepareTrainingThread(absl::GetFlag(FLAGS_threads),
                                                                absl::GetFlag(FLAGS_cpus));
      !ready.ok()) {
    std::fprintf(stderr, "--cpus: %s\n", ready.ToString().c_str());
    return 2;
  }
  dtrain::v1::DataConfig spec;
  spec.set_builtin("fashion-mnist");
  auto data = dtrain::Dataset::Load(spec);
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
    return 1;
  }
  const int batch = absl::GetFlag(FLAGS_batch);
  const int64_t n = (*data)->Splits()[0].second;
  const int rank = absl::GetFlag(FLAGS_rank), world = absl::GetFlag(FLAGS_world_size);
  if (batch < 1 || int64_t{batch} * world >= n || world < 1 || world > 64 || rank < 0 ||
      rank >= world || absl::GetFlag(FLAGS_steps) < 1 || absl::GetFlag(FLAGS_warmup) < 0) {
    std::fprintf(stderr,
                 "want 1 <= --batch, --batch * --world_size < %lld (the training set), "
                 "1 <= --world_size <= 64, "
                 "0 <= --rank < --world_size, --steps >= 1 and --warmup >= 0\n",
                 static_cast<long long>(n));
    return 2;
  }
  const bool average = absl::GetFlag(FLAGS_average_gradients);
  const bool all_ranks = absl::GetFlag(FLAGS_all_ranks);
  const bool split = absl::GetFlag(FLAGS_split_step);
  if (split && !all_ranks && !average) {
    std::fprintf(stderr, "--split_step needs --all_ranks or --average_gradients\n");
    return 2;
  }
  if (average && absl::GetFlag(FLAGS_lockstep).empty()) {
    std::fprintf(stderr, "--average_gradients needs --lockstep (the file the ranks share)\n");
    return 2;
  }
  if (all_ranks && !absl::GetFlag(FLAGS_lockstep).empty()) {
    std::fprintf(stderr, "--all_ranks computes every rank here; it takes no --lockstep\n");
    return 2;
  }
  if (const int epochs = absl::GetFlag(FLAGS_epochs); epochs < 0 || epochs > 1000) {
    std::fprintf(stderr, "--epochs must be in 0..1000 (0: --steps counts the steps)\n");
    return 2;
  }
  JobBatches job_batches(n, world, batch, absl::GetFlag(FLAGS_shuffle), absl::GetFlag(FLAGS_seed));
  if (const int epochs = absl::GetFlag(FLAGS_epochs); epochs > 0) {
    const int64_t per_epoch = job_batches.per_epoch();
    const int64_t timed = epochs * per_epoch - absl::GetFlag(FLAGS_warmup);
    if (timed < 1) {
      std::fprintf(stderr, "--epochs %d is %lld steps, not more than --warmup\n", epochs,
                   static_cast<long long>(epochs * per_epoch));
      return 2;
    }
    absl::SetFlag(&FLAGS_steps, static_cast<int>(timed));
  }
  // The step loop counts in int.
  const int64_t run_steps = int64_t{absl::GetFlag(FLAGS_warmup)} + absl::GetFlag(FLAGS_steps);
  if (run_steps > std::numeric_limits<int>::max()) {
    std::fprintf(stderr, "--warmup + --steps must be at most %d\n",
                 std::numeric_limits<int>::max());
    return 2;
  }
  // --step_times keeps every timed step's times in memory until the run ends: bounded, so that a
  // long run asks for less instead of failing to allocate.
  const bool keep_step_times = !absl::GetFlag(FLAGS_step_times).empty();
  constexpr int64_t kMostStepTimes = int64_t{1} << 26;  // 512 MiB of doubles
  if (keep_step_times && int64_t{absl::GetFlag(FLAGS_steps)} * world > kMostStepTimes) {
    std::fprintf(stderr, "--step_times keeps at most %lld step times: fewer --steps\n",
                 static_cast<long long>(kMostStepTimes));
    return 2;
  }
  using Replicas = std::vector<dtrain::bench::PlainLoop>;
  // The models one process trains: one, or with --all_ranks one per rank (the same zoo model and
  // seed, so the same weights, kept the same by the same averaged gradients and updates).
  auto make = [&]() -> absl::StatusOr<Replicas> {
    Replicas replicas;
    for (int r = 0; r < (all_ranks ? world : 1); ++r) {
      absl::StatusOr<dtrain::bench::PlainLoop> loop = dtrain::bench::PlainLoop::Make(
          absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_lr), 0.9, absl::GetFlag(FLAGS_nesterov),
          absl::GetFlag(FLAGS_cosine) ? run_steps : 0, absl::GetFlag(FLAGS_seed));
      if (!loop.ok()) return loop.status();
      // The ceiling's replicas make their gradients in places as the job's split step does (the
      // lockstep loops in the file's, below).
      if (split && all_ranks) loop->LandGradientsInPlaces();
      replicas.push_back(*std::move(loop));
    }
    return replicas;
  };
  // Each timed step's time, for --step_times, `columns` to a step: per rank with --all_ranks
  // (that rank's gradients, its share of the mean and its update), else this rank's whole step.
  const int columns = all_ranks ? world : 1;
  std::vector<double> step_us;
  std::vector<double> scratch_us(columns);  // a timed step's times when --step_times is not given
  absl::Duration waited;                    // at the --lockstep barrier, over the timed steps
  absl::Duration averaging;  // --average_gradients: copy, barriers and reduction, timed steps
  std::unique_ptr<LockstepBarrier> lockstep;  // opened once the measured model exists
  std::vector<torch::Tensor> places;  // --average_gradients: each gradient's part of the file
  std::unique_ptr<torch::optim::Optimizer> part;  // --split_step with --lockstep: this rank's
  int64_t samples = 0;  // in the timed steps' batches, all ranks this process computes
  auto batch_of = [&](int step, int r) -> const std::vector<int64_t>& {
    return job_batches.Of(step, r);
  };
  // One step: with --all_ranks every rank's batch on its replica in turn, then their mean and
  // every replica's update; else this rank's batch, meeting the other ranks if `meet`. `times`,
  // if set, receives the step's `columns` times.
  auto one_step = [&](Replicas& loops, int step, bool meet, double* times) -> absl::Status {
    if (all_ranks) {
      std::vector<const std::vector<torch::Tensor>*> into;
      absl::Time at = absl::Now();
      for (int r = 0; r < world; ++r) {
        if (times != nullptr) samples += static_cast<int64_t>(batch_of(step, r).size());
        DTRAIN_RETURN_IF_ERROR(loops[r].Gradients(**data, batch_of(step, r), step));
        into.push_back(&loops[r].Parameters());
        if (times != nullptr) times[r] = absl::ToDoubleMicroseconds(absl::Now() - at);
        at = absl::Now();
      }
      DTRAIN_RETURN_IF_ERROR(MeanOfGradients(into));
      const double mean_us = absl::ToDoubleMicroseconds(absl::Now() - at) / world;
      if (split) {
        // One update for the job, and its values in every replica, each rank's share of it.
        at = absl::Now();
        loops[0].Update(step);
        torch::NoGradGuard no_grad;
        for (int r = 1; r < world; ++r) {
          for (size_t i = 0; i < loops[0].Parameters().size(); ++i) {
            torch::Tensor p = loops[r].Parameters()[i];
            p.copy_(loops[0].Parameters()[i]);
          }
        }
        const double update_us = absl::ToDoubleMicroseconds(absl::Now() - at) / world;
        if (times != nullptr) {
          for (int r = 0; r < world; ++r) times[r] += mean_us + update_us;
        }
        return absl::OkStatus();
      }
      for (int r = 0; r < world; ++r) {
        at = absl::Now();
        loops[r].Update(step);
        if (times != nullptr) times[r] += mean_us + absl::ToDoubleMicroseconds(absl::Now() - at);
      }
      return absl::OkStatus();
    }
    dtrain::bench::PlainLoop& loop = loops[0];
    if (times != nullptr) samples += static_cast<int64_t>(batch_of(step, rank).size());
    const absl::Time step_start = absl::Now();
    if (!(meet && average)) {
      DTRAIN_RETURN_IF_ERROR(loop.Step(**data, batch_of(step, rank), step));
      if (meet) {
        const absl::Time arrived = absl::Now();
        DTRAIN_RETURN_IF_ERROR(lockstep->ArriveAndWait());
        if (times != nullptr) waited += absl::Now() - arrived;
      }
    } else {
      // Backward made new gradients; they go into the shared file (with --split_step backward
      // makes them there, in the landing places, as a job's does). The first barrier: every
      // rank's are there; the second: every rank's part of the mean is written (everywhere, or
      // with --split_step, as a job's steps inside a call, only where it updates), so the update
      // may read them and the next step's gradients overwrite this rank's.
      DTRAIN_RETURN_IF_ERROR(loop.Gradients(**data, batch_of(step, rank), step));
      const absl::Time exchange = absl::Now();
      if (loop.landing() != nullptr) {
        DTRAIN_RETURN_IF_ERROR(GradientsLanded(*loop.landing(), loop.Parameters(), places));
      } else {
        GradientsToPlaces(loop.Parameters(), places);
      }
      absl::Time arrived = absl::Now();
      DTRAIN_RETURN_IF_ERROR(lockstep->ArriveAndWait());
      if (times != nullptr) waited += absl::Now() - arrived;
      ReduceOwnPart(*lockstep, rank, world, loop.landing() != nullptr, part != nullptr);
      absl::Duration updating;
      if (part != nullptr) {
        // The split step: this rank's part, stepped while its mean is in cache, and its new
        // values into the other ranks' parameters (the optimizer phase, as a job's log counts it;
        // the copy stays in the averaging).
        const absl::Time update = absl::Now();
        loop.UpdatePart(step, *part);
        updating = absl::Now() - update;
        const auto [begin, end] =
            dtrain::ReductionPartOf(lockstep->exchange(), rank, world, 0, sizeof(float));
        for (int r = 0; r < world; ++r) {
          if (r != rank) {
            std::memcpy(lockstep->Parameters(r) + begin, lockstep->Parameters(rank) + begin,
                        static_cast<size_t>(end - begin) * sizeof(float));
          }
        }
      }
      arrived = absl::Now();
      DTRAIN_RETURN_IF_ERROR(lockstep->ArriveAndWait());
      if (times != nullptr) {
        waited += absl::Now() - arrived;
        averaging += absl::Now() - exchange - updating;
      }
      if (part == nullptr) loop.Update(step);
    }
    if (times != nullptr) times[0] = absl::ToDoubleMicroseconds(absl::Now() - step_start);
    return absl::OkStatus();
  };
  // This thread's run-queue time when the clock starts: the wait for its core that a dtrain
  // job's log gives per rank ("for its core"), measured the same way here.
  absl::StatusOr<dtrain::ThreadSchedstat> sched_start = absl::UnavailableError("not started");
  // `steps` steps of `loops`; the clock starts (into `start`) at step `timed_from`, and each step
  // from there on is timed. The warm steps of a throwaway model (timed_from < 0) meet no one.
  auto train = [&](Replicas& loops, int steps, int timed_from, absl::Time& start) -> absl::Status {
    for (int step = 0; step < steps; ++step) {
      if (step == timed_from) {
        for (dtrain::bench::PlainLoop& loop : loops) loop.ResetPhases();
        start = absl::Now();
        sched_start = dtrain::ThisThreadSchedstat();
      }
      const bool timed = timed_from >= 0 && step >= timed_from;
      double* times = nullptr;
      if (timed && keep_step_times) {
        step_us.resize(step_us.size() + columns);
        times = step_us.data() + step_us.size() - columns;
      } else if (timed) {
        times = scratch_us.data();
      }
      DTRAIN_RETURN_IF_ERROR(one_step(loops, step, lockstep != nullptr && timed_from >= 0, times));
    }
    return absl::OkStatus();
  };
  absl::Time start;
  absl::Status trained = absl::OkStatus();
  if (const int warm = absl::GetFlag(FLAGS_warm_process); warm > 0) {
    absl::StatusOr<Replicas> throwaway = make();
    trained = throwaway.ok() ? train(*throwaway, warm, -1, start) : throwaway.status();
  }
  absl::StatusOr<Replicas> measured = make();
  if (trained.ok() && !measured.ok()) trained = measured.status();
  if (trained.ok()) {
    if (const std::string path = absl::GetFlag(FLAGS_lockstep); !path.empty()) {
      // --average_gradients' regions each hold one model's gradients.
      int64_t gradient_floats = 0;
      if (average) {
        for (const torch::Tensor& p : (*measured)[0].Parameters()) gradient_floats += p.numel();
      }
      absl::StatusOr<std::unique_ptr<LockstepBarrier>> opened =
          LockstepBarrier::Open(path, rank, world, gradient_floats, split ? 3 : 1);
      if (opened.ok()) {
        lockstep = *std::move(opened);
        if (average) {
          absl::StatusOr<std::vector<torch::Tensor>> placed =
              PlaceGradients((*measured)[0].Parameters(), lockstep->Gradients(rank));
          if (placed.ok()) {
            places = *std::move(placed);
          } else {
            trained = placed.status();
          }
          if (trained.ok() && split) {
            PlaceParameters((*measured)[0].Parameters(), lockstep->Parameters(rank));
            (*measured)[0].LandGradientsIn(
                MakeLanding((*measured)[0].Parameters(), lockstep->Landing(rank)));
            const auto [begin, end] =
                dtrain::ReductionPartOf(gradient_floats, rank, world, 0, sizeof(float));
            absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> made = PartOptimizer(
                (*measured)[0], lockstep->Parameters(rank), lockstep->Gradients(rank), begin, end);
            if (made.ok()) {
              part = *std::move(made);
            } else {
              trained = made.status();
            }
          }
        }
      } else {
        trained = opened.status();
      }
    }
  }
  if (trained.ok()) {
    const double start_at = absl::GetFlag(FLAGS_start_at);
    if (start_at > 0) {
      const absl::Duration wait = absl::FromUnixSeconds(0) + absl::Seconds(start_at) - absl::Now();
      // A late start would leave the ceiling's processes staggered and its joint rate low.
      if (wait < absl::ZeroDuration())
        std::fprintf(stderr, "warning: --start_at passed %s ago\n",
                     absl::FormatDuration(-wait).c_str());
      absl::SleepFor(wait);
    }
    // Every timed step's times, allocated before the clock starts.
    if (keep_step_times) step_us.reserve(static_cast<size_t>(absl::GetFlag(FLAGS_steps)) * columns);
    trained = train(*measured, static_cast<int>(run_steps), absl::GetFlag(FLAGS_warmup), start);
  }
  if (!trained.ok()) {
    std::fprintf(stderr, "%s\n", trained.ToString().c_str());
    return 1;
  }
  const absl::Time end = absl::Now();
  // -1 where the kernel keeps no scheduler statistics.
  double core_wait_s = -1;
  if (absl::StatusOr<dtrain::ThreadSchedstat> now = dtrain::ThisThreadSchedstat();
      now.ok() && sched_start.ok()) {
    core_wait_s = static_cast<double>(now->run_queue_ns - sched_start->run_queue_ns) / 1e9;
  }
  if (const std::string path = absl::GetFlag(FLAGS_step_times); !path.empty()) {
    FILE* out = std::fopen(path.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "--step_times: cannot write %s\n", path.c_str());
      return 1;
    }
    for (size_t k = 0; k < step_us.size(); ++k) {
      std::fprintf(out, (k + 1) % columns != 0 ? "%.3f " : "%.3f\n", step_us[k]);
    }
    std::fclose(out);
  }
  const double seconds = absl::ToDoubleSeconds(end - start);
  // A rank's mean step by phase in ms, as the job log's "time per batch by rank" gives a job's:
  // data, forward, backward, averaging (with --average_gradients), optimizer. Not with
  // --all_ranks, whose step holds every rank's.
  std::string phases = "null";
  if (!all_ranks) {
    const dtrain::bench::PlainLoop::Phases& p = (*measured)[0].phases();
    const double ms = 1000.0 / absl::GetFlag(FLAGS_steps);
    phases = absl::StrFormat(
        "[%.4f, %.4f, %.4f, %.4f, %.4f]", absl::ToDoubleSeconds(p.data) * ms,
        absl::ToDoubleSeconds(p.forward) * ms, absl::ToDoubleSeconds(p.backward) * ms,
        absl::ToDoubleSeconds(averaging) * ms, absl::ToDoubleSeconds(p.update) * ms);
  }
  std::printf(
      "{\"system\": \"libtorch-loop\", \"model\": \"%s\", \"ranks\": 1, \"batch\": %d, "
      "\"threads\": %d, \"samples_per_s\": %.1f, \"samples\": %lld, \"start\": %.6f, "
      "\"end\": %.6f, \"barrier_s\": %.3f, \"parameters_sum\": %.9g, \"phases_ms\": %s, "
      "\"core_wait_s\": %.4f}\n",
      absl::GetFlag(FLAGS_model).c_str(), batch, at::get_num_threads(),
      static_cast<double>(samples) / seconds, static_cast<long long>(samples),
      absl::ToUnixMicros(start) / 1e6, absl::ToUnixMicros(end) / 1e6, absl::ToDoubleSeconds(waited),
      ParametersSum((*measured)[0]), phases.c_str(), core_wait_s);
  return 0;
}
