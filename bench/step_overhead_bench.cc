// What a dtrain rank costs per step beyond the plain libtorch loop, in one process: the
// compute ceiling's loop (bench/plain_loop.h) and a Job made by Job::Setup (single_device, the
// same model, data and optimizer) driven by Job::Train with index batches as the coordinator
// sends them, both on the same thread and cores, over the same indices, alternating in rounds
// so drifts of the machine hit both alike. Prints one JSON row per round and a summary row with
// the median of the job's rate over the loop's. --side=loop or --side=job runs only one of
// them, e.g. under `valgrind --tool=callgrind` to count the instructions each spends per step.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <ATen/Parallel.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "bench/plain_loop.h"
#include "worker/data/dataset.h"
#include "worker/runtime/hosted_job.h"
#include "worker/runtime/job.h"
#include "worker/service/setup_paths.h"

ABSL_FLAG(std::string, model, "mlp", "mlp or cnn");
ABSL_FLAG(int, batch, 64, "samples per step");
ABSL_FLAG(int, steps, 250, "steps per round and side (one Job::Train call of this many batches)");
ABSL_FLAG(int, rounds, 10, "timed rounds, each side once per round, alternating who goes first");
ABSL_FLAG(int, warmup_rounds, 1, "untimed rounds first");
ABSL_FLAG(std::string, side, "both", "both, loop or job");
ABSL_FLAG(bool, shuffle, true, "random sample order (as a fit's sampler); else consecutive");
ABSL_FLAG(int, threads, 1, "libtorch threads");
ABSL_FLAG(std::string, cpus, "", "pin the training thread to these cores, as a worker's --cpus");

namespace {

constexpr double kLr = 0.05, kMomentum = 0.9;

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string side = absl::GetFlag(FLAGS_side);
  if (side != "both" && side != "loop" && side != "job") {
    std::fprintf(stderr, "--side: '%s' is not one of both, loop, job\n", side.c_str());
    return 2;
  }
  if (absl::Status ready = dtrain::bench::PrepareTrainingThread(absl::GetFlag(FLAGS_threads),
                                                                absl::GetFlag(FLAGS_cpus));
      !ready.ok()) {
    std::fprintf(stderr, "--cpus: %s\n", ready.ToString().c_str());
    return 2;
  }
  const std::string model_name = absl::GetFlag(FLAGS_model);
  const int batch = absl::GetFlag(FLAGS_batch), steps = absl::GetFlag(FLAGS_steps);

  dtrain::v1::DataConfig data_spec;
  data_spec.set_builtin("fashion-mnist");
  auto data = dtrain::Dataset::Load(data_spec);
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
    return 1;
  }
  const int64_t n = (*data)->Splits()[0].second;

  auto loop = dtrain::bench::PlainLoop::Make(model_name, kLr, kMomentum);
  if (!loop.ok()) {
    std::fprintf(stderr, "%s\n", loop.status().ToString().c_str());
    return 1;
  }

  dtrain::v1::SetupRequest request;
  request.set_job_id("step-overhead");
  request.mutable_spec()->mutable_model()->set_builtin(model_name);
  request.mutable_spec()->mutable_optimizer()->set_name("sgd");
  request.mutable_spec()->mutable_optimizer()->set_lr(kLr);
  request.mutable_spec()->mutable_optimizer()->set_momentum(kMomentum);
  request.mutable_spec()->mutable_trainer()->set_strategy("single_device");
  request.mutable_spec()->set_seed_everything(1);
  *request.mutable_spec()->mutable_data() = data_spec;
  dtrain::WorkerIdentity identity;
  identity.name = "bench";
  identity.host = "localhost";
  identity.threads = absl::GetFlag(FLAGS_threads);
  // As the worker's service prepares a Setup: the spec normalized, its paths local.
  if (absl::Status prepared = dtrain::PrepareSetup(&request, 1, nullptr); !prepared.ok()) {
    std::fprintf(stderr, "%s\n", prepared.ToString().c_str());
    return 1;
  }
  auto job = dtrain::Job::Setup(request, identity);
  if (!job.ok()) {
    std::fprintf(stderr, "%s\n", job.status().ToString().c_str());
    return 1;
  }

  // Each round's batches: the same indices for both sides.
  std::mt19937_64 rng(7);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  int64_t next = 0;
  auto round_indices = [&] {
    std::vector<std::vector<int64_t>> batches(steps, std::vector<int64_t>(batch));
    for (auto& b : batches) {
      for (int64_t& index : b) {
        if (next % n == 0 && absl::GetFlag(FLAGS_shuffle)) {
          std::shuffle(order.begin(), order.end(), rng);
        }
        index = order[next++ % n];
      }
    }
    return batches;
  };

  auto run_loop = [&](const std::vector<std::vector<int64_t>>& batches) -> absl::StatusOr<double> {
    const absl::Time start = absl::Now();
    for (size_t i = 0; i < batches.size(); ++i) {
      absl::Status stepped = loop->Step(**data, batches[i], static_cast<int64_t>(i));
      if (!stepped.ok()) return stepped;
    }
    return absl::ToDoubleSeconds(absl::Now() - start);
  };
  int64_t epoch_batches = 0;
  auto run_job = [&](const std::vector<std::vector<int64_t>>& batches) -> absl::StatusOr<double> {
    dtrain::v1::LocalWork work;
    work.set_first_batch_idx(epoch_batches);
    for (const auto& b : batches) {
      dtrain::v1::IndexBatch* index_batch = work.add_index_batches();
      index_batch->set_split("train");
      index_batch->mutable_indices()->Add(b.begin(), b.end());
    }
    epoch_batches += static_cast<int64_t>(batches.size());
    const absl::Time start = absl::Now();
    auto result = (*job)->Train(work, /*epoch=*/0);
    if (!result.ok()) return result.status();
    return absl::ToDoubleSeconds(absl::Now() - start);
  };

  const int rounds = absl::GetFlag(FLAGS_rounds), warmup = absl::GetFlag(FLAGS_warmup_rounds);
  std::vector<double> ratios;
  for (int round = 0; round < warmup + rounds; ++round) {
    const auto batches = round_indices();
    double loop_s = 0, job_s = 0;
    // Alternate who goes first: the second of a pair may find caches warmer.
    for (int turn = 0; turn < 2; ++turn) {
      const bool loop_turn = (turn == 0) == (round % 2 == 0);
      if (loop_turn && side == "job") continue;
      if (!loop_turn && side == "loop") continue;
      absl::StatusOr<double> seconds = loop_turn ? run_loop(batches) : run_job(batches);
      if (!seconds.ok()) {
        std::fprintf(stderr, "%s\n", seconds.status().ToString().c_str());
        return 1;
      }
      (loop_turn ? loop_s : job_s) = *seconds;
    }
    if (round < warmup) continue;
    const double samples = static_cast<double>(steps) * batch;
    std::printf("{\"round\": %d, \"loop_samples_per_s\": %.1f, \"job_samples_per_s\": %.1f}\n",
                round - warmup, loop_s > 0 ? samples / loop_s : 0.0,
                job_s > 0 ? samples / job_s : 0.0);
    if (loop_s > 0 && job_s > 0) ratios.push_back(loop_s / job_s);
  }
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    std::printf(
        "{\"model\": \"%s\", \"batch\": %d, \"threads\": %d, \"rounds\": %zu, "
        "\"job_over_loop_median\": %.4f, \"min\": %.4f, \"max\": %.4f}\n",
        model_name.c_str(), batch, at::get_num_threads(), ratios.size(), ratios[ratios.size() / 2],
        ratios.front(), ratios.back());
  }
  return 0;
}
