// The worker daemon end to end, one worker's life: real dtrain-worker processes on 127.0.0.1
// driven through the Worker gRPC service, with a real coordinator for their groups. Training and
// teardown, a Setup waiting for its group, --cpus, a crashed ddp_spawn child, a state dict over
// gRPC's message limit, bad input, registration, the allocator and a clean leave on SIGTERM (the
// strategies against each other: worker_service_strategies_test.cc).
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "dtrain/v1/workers.grpc.pb.h"
#include "tests/test_support.h"
#include "tests/worker_process.h"
#include "tests/worker_service_fixture.h"
#include "worker/runtime/cpu_affinity.h"

namespace dtrain::testing {
namespace worker_service_test {

using ::testing::HasSubstr;

TEST_F(WorkerServiceTest, SingleDevice_TrainsEvaluatesAndTearsDown) {
  auto w = StartWorker();
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(Health(*w).state(), v1::HealthResponse::IDLE);
  v1::SetupResponse setup;
  ASSERT_TRUE(Setup(*w, MakeSetup("single", "single_device", 1, address()), &setup).ok());
  ASSERT_EQ(setup.ranks_size(), 1);
  EXPECT_EQ(setup.ranks(0).world_size(), 1);
  EXPECT_EQ(setup.parameter_count(), 784 * 256 + 256 + 256 * 10 + 10);
  EXPECT_EQ(setup.root_device(), "cpu");
  ASSERT_EQ(setup.splits_size(), 3);
  EXPECT_EQ(setup.splits(0).size(), kTrainSize);
  EXPECT_EQ(Health(*w).state(), v1::HealthResponse::READY);
  EXPECT_EQ(Health(*w).job_id(), "single");

  // Eight batches of 32 in one RPC: the round trip is amortized over them.
  auto first = Train(*w, "single", {Slice(0, 0, 1, 32, 8)});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->results(0).batches_size(), 8);
  EXPECT_EQ(first->results(0).global_step(), 8);
  EXPECT_EQ(first->results(0).batches(0).size(), 32);
  for (int round = 1; round < 4; ++round) {
    ASSERT_TRUE(Train(*w, "single", {Slice(8 * round, 0, 1, 32, 8)}).ok());
  }
  v1::StepRequest validate;
  validate.set_job_id("single");
  v1::LocalWork* work = validate.add_work();
  v1::IndexBatch* batch = work->add_index_batches();
  batch->set_split("val");
  for (int i = 0; i < 256; ++i) batch->add_indices(i);
  v1::StepResponse val;
  ASSERT_TRUE(Call([&](auto* c) { return w->stub().ValidationStep(c, validate, &val); }).ok());
  const double first_loss = first->results(0).batches(0).scalars().at("loss");
  EXPECT_LT(val.results(0).batches(0).scalars().at("loss"), first_loss * 0.5);
  EXPECT_GT(val.results(0).batches(0).scalars().at("acc"), 0.9);

  v1::StepResponse predicted;
  ASSERT_TRUE(Call([&](auto* c) { return w->stub().PredictStep(c, validate, &predicted); }).ok());
  const auto& labels = predicted.results(0).batches(0).tensors().at("label");
  EXPECT_EQ(labels.meta().shape(0), 256);

  // The worker's allocator keeps the pages a job freed for its next steps
  // (worker/runtime/worker_allocator.h), ~9 MiB of them in this job; its end gives them back.
  const long resident = ResidentKiB(w->pid());
  ASSERT_GT(resident, 0);
  ASSERT_TRUE(Teardown(*w, "single").ok());
  // Given back by the worker's executor once the Teardown is answered: waited for.
  long idle = resident;
  WaitFor(
      [&] {
        idle = ResidentKiB(w->pid());
        return idle > 0 && idle < resident - 4 * 1024;
      },
      absl::Seconds(5));
  EXPECT_GT(idle, 0);
  EXPECT_LT(idle, resident - 4 * 1024)
      << "KiB resident: " << resident << " in the job, " << idle << " after it";
  EXPECT_EQ(Health(*w).state(), v1::HealthResponse::IDLE);
  EXPECT_TRUE(Teardown(*w).ok()) << "teardown is idempotent";
}

// A Setup waits for its group; when the caller gives up (the coordinator cancelled the job
// while another rank never came) or tears the job down, the wait ends at once and the worker
// is free for the next job, rather than held until the rendezvous deadline (5 minutes).
TEST_F(WorkerServiceTest, SetupWaitingForItsGroup_EndsWhenCancelledOrTornDown) {
  auto w = StartWorker();
  ASSERT_NE(w, nullptr);
  v1::SetupRequest lonely = MakeSetup("lonely", "ddp", 2, address());  // the other rank never comes
  {
    grpc::ClientContext context;
    v1::SetupResponse response;
    bool waiting = false;
    std::thread cancel([&] {
      // Gives up once the worker waits in the rendezvous, so that the cancellation ends a wait.
      waiting = WaitForRegistered("lonely", 1);
      context.TryCancel();
    });
    const grpc::Status cancelled = w->stub().Setup(&context, lonely, &response);
    cancel.join();
    ASSERT_TRUE(waiting) << "the worker's Setup never waited for its group";
    EXPECT_EQ(cancelled.error_code(), grpc::StatusCode::CANCELLED) << cancelled.error_message();
  }
  // The worker went on: a new job sets up within seconds (the Setup queue is one at a time).
  const absl::Time start = absl::Now();
  ASSERT_TRUE(Setup(*w, MakeSetup("next", "single_device", 1, address())).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(Health(*w).job_id(), "next");
  ASSERT_TRUE(Teardown(*w, "next").ok());

  // A Teardown of the job whose Setup waits ends that wait too; the Setup answers CANCELLED.
  lonely.set_job_id("lonely2");
  absl::Status waited;
  std::thread setup([&] { waited = Setup(*w, lonely); });
  EXPECT_TRUE(WaitForRegistered("lonely2", 1)) << "the Setup never waited for its group";
  const absl::Time teardown_start = absl::Now();
  EXPECT_TRUE(Teardown(*w, "lonely2").ok());
  setup.join();
  EXPECT_LT(absl::Now() - teardown_start, absl::Seconds(10));
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
  EXPECT_EQ(Health(*w).state(), v1::HealthResponse::IDLE);

  // ddp_spawn: the daemon's cancelled Setup cancels its children's waits in turn.
  auto spawner = StartWorker({"--devices=2"});
  ASSERT_NE(spawner, nullptr);
  v1::SetupRequest spawned = MakeSetup("lonely3", "ddp_spawn", 4, address());
  absl::Status spawn_waited;
  std::thread spawn_setup([&] { spawn_waited = Setup(*spawner, spawned); });
  // Both children started and wait in the rendezvous (for 2 more ranks that never come).
  EXPECT_TRUE(WaitForRegistered("lonely3", 2)) << "the children never waited for their group";
  const absl::Time spawn_teardown = absl::Now();
  EXPECT_TRUE(Teardown(*spawner, "lonely3").ok());
  spawn_setup.join();
  EXPECT_LT(absl::Now() - spawn_teardown, absl::Seconds(15));
  EXPECT_FALSE(spawn_waited.ok());
  EXPECT_EQ(Health(*spawner).state(), v1::HealthResponse::IDLE);
}

// The Cpus_allowed_list of each of `pid`'s threads, by thread id.
std::map<std::string, std::string> ThreadCpus(pid_t pid) {
  std::map<std::string, std::string> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(dir, error)) {
    out[task.path().filename()] = CpusAllowedList(task.path() / "status");
  }
  return out;
}

// How many of `pid`'s threads may run on exactly `cpus`.
int ThreadsOn(pid_t pid, const std::string& cpus) {
  int n = 0;
  for (const auto& [tid, list] : ThreadCpus(pid)) n += list == cpus;
  return n;
}

TEST_F(WorkerServiceTest, Cpus_PinTheStepThread_SplitAmongSpawnedChildren_BadListsRefused) {
  auto allowed = AllowedCpus();
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  const std::string all = FormatCpuList(*allowed), last = absl::StrCat(allowed->back());

  // One core: the step thread (and what it starts) runs there; the rest of the daemon does not.
  auto pinned = StartWorker({"--cpus=" + last});
  ASSERT_NE(pinned, nullptr);
  EXPECT_TRUE(WaitFor([&] { return ThreadsOn(pinned->pid(), last) >= 1; }, absl::Seconds(10)));
  EXPECT_EQ(ThreadCpus(pinned->pid())[absl::StrCat(pinned->pid())], all)
      << "the main thread stays free";
  v1::SetupResponse pinned_setup;
  ASSERT_TRUE(
      Setup(*pinned, MakeSetup("pinned", "single_device", 1, address()), &pinned_setup).ok());
  EXPECT_EQ(pinned_setup.ranks(0).cpus(), last) << "RankInfo says where the rank's steps run";
  auto out = Train(*pinned, "pinned", {Slice(0, 0, 1, 16)});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(std::isfinite(out->results(0).batches(0).scalars().at("loss")));

  // ddp_spawn: each child gets its slice of the daemon's cores (all of them when fewer cores
  // than children), passed on as its own --cpus.
  auto spawner = StartWorker({"--devices=2", "--cpus=" + all});
  ASSERT_NE(spawner, nullptr);
  v1::SetupResponse setup;
  ASSERT_TRUE(Setup(*spawner, MakeSetup("pinned-spawn", "ddp_spawn", 2, address()), &setup).ok());
  ASSERT_EQ(setup.ranks_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const std::string expected = FormatCpuList(CpusOfLocalProcess(*allowed, i, 2));
    const std::string cmdline = ReadFile(absl::StrCat("/proc/", setup.ranks(i).pid(), "/cmdline"));
    EXPECT_THAT(cmdline, HasSubstr("--cpus=" + expected)) << "child " << i;
    EXPECT_EQ(setup.ranks(i).cpus(), expected) << "child " << i;
    EXPECT_TRUE(
        WaitFor([&] { return ThreadsOn(setup.ranks(i).pid(), expected) >= 1; }, absl::Seconds(10)))
        << "child " << i << " on " << expected;
  }
  ASSERT_TRUE(Train(*spawner, "pinned-spawn", {Slice(0, 0, 2, 8), Slice(0, 1, 2, 8)}).ok());

  // Cores it may not use, a list that does not parse, more threads than cores: the daemon
  // refuses to start and says why.
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--cpus=" + absl::StrCat(CPU_SETSIZE - 1), "may not run on cpu(s)"},
           {"--cpus=3-1", "runs backwards"},
           {"--cpus=0,x", "'x' is not a cpu number"},
           {"--cpus=" + last + " --threads=2", "--threads=2 is more than the 1 core(s)"}}) {
    CommandResult r = RunShell(absl::StrCat(DTRAIN_WORKER_BIN, " --listen=127.0.0.1:0 ", flags));
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr(message)) << flags;
  }
}

TEST_F(WorkerServiceTest, DdpSpawn_CrashedChildFailsTheJobWithItsExitStatus) {
  auto spawner = StartWorker({"--devices=2"});
  ASSERT_NE(spawner, nullptr);
  v1::SetupResponse setup;
  ASSERT_TRUE(Setup(*spawner, MakeSetup("crash", "ddp_spawn", 2, address()), &setup).ok());
  ASSERT_TRUE(Train(*spawner, "crash", {Slice(0, 0, 2, 8), Slice(0, 1, 2, 8)}).ok());
  const pid_t victim = setup.ranks(1).pid();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const absl::Time start = absl::Now();
  auto out = Train(*spawner, "crash", {Slice(1, 0, 2, 8), Slice(1, 1, 2, 8)});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kAborted) << out.status();
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr(absl::StrCat("local rank 1 (pid ", victim, ") was killed by signal 9")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  // The daemon stays up: the job is torn down (its other child reaped) and a new one runs.
  const pid_t survivor = setup.ranks(0).pid();
  ASSERT_TRUE(Teardown(*spawner).ok());
  EXPECT_TRUE(WaitFor([&] { return kill(survivor, 0) != 0; }, absl::Seconds(5)));
  ASSERT_TRUE(Setup(*spawner, MakeSetup("after-crash", "single_device", 1, address())).ok());
  EXPECT_TRUE(Train(*spawner, "after-crash", {Slice(0, 0, 1, 8)}).ok());
}

// A model over 4 MiB through a client with gRPC's default limits: the one-message StateDict
// says to stream, and StreamStateDict delivers every tensor in messages that fit.
TEST_F(WorkerServiceTest, StateDictOver4MiB_RefusedWhole_StreamedInChunks) {
  const std::string path = TestTempPath("wide.pt");
  torch::jit::Module m("Wide");
  m.register_parameter("embedding", torch::arange(1500000, torch::kFloat).reshape({1500, 1000}),
                       false);
  m.register_parameter("bias", torch::ones({7}), false);
  m.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return self.embedding.sum() * 0.0 + self.bias.sum()

def predict_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    return {"everything": self.embedding}
)");
  m.save(path);
  auto w = StartWorker();
  ASSERT_NE(w, nullptr);
  v1::SetupRequest request = MakeSetup("wide", "single_device", 1, address());
  request.mutable_spec()->mutable_model()->set_torchscript(path);
  ASSERT_TRUE(Setup(*w, request).ok());

  auto stub = v1::Worker::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", w->port()),
                                                      grpc::InsecureChannelCredentials()));
  v1::StateDictRequest dict_request;
  dict_request.set_job_id("wide");
  v1::StateDictResponse whole;
  absl::Status refused = Call([&](auto* c) { return stub->StateDict(c, dict_request, &whole); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("read it with StreamStateDict"));

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = stub->StreamStateDict(&context, dict_request);
  std::map<std::string, std::string> bytes;
  std::map<std::string, v1::TensorMeta> metas;
  int messages = 0;
  v1::StateDictChunk chunk;
  while (reader->Read(&chunk)) {
    ++messages;
    if (chunk.has_meta()) metas[chunk.name()] = chunk.meta();
    bytes[chunk.name()] += chunk.data();
  }
  grpc::Status finished = reader->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_message();
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(bytes["embedding"].size(), 1500000u * 4);
  EXPECT_GE(messages, 3) << "6 MiB in messages of at most 4 MiB";
  EXPECT_EQ(metas["embedding"].shape_size(), 2);
  float last = 0;
  std::memcpy(&last, bytes["embedding"].data() + bytes["embedding"].size() - 4, 4);
  EXPECT_EQ(last, 1499999.0f);
  EXPECT_EQ(bytes["bias"].size(), 7u * 4);

  // A step whose outputs would not fit one response fails, saying what to change.
  v1::StepRequest predict;
  predict.set_job_id("wide");
  predict.set_return_outputs(true);
  v1::IndexBatch* batch = predict.add_work()->add_index_batches();
  batch->set_split("train");
  batch->add_indices(0);
  v1::StepResponse predicted;
  absl::Status too_big = Call([&](auto* c) { return stub->PredictStep(c, predict, &predicted); });
  EXPECT_EQ(too_big.code(), absl::StatusCode::kFailedPrecondition) << too_big;
  EXPECT_THAT(std::string(too_big.message()), HasSubstr("trainer.batches_per_call"));
}

// Writes a TorchScript module with forward but no training_step.
std::string ModelWithoutTrainingStep() {
  torch::jit::Module m("NoSteps");
  m.define("def forward(self, x):\n  return x * 2\n");
  const std::string path = TestTempPath("no-steps.pt");
  m.save(path);
  return path;
}

TEST_F(WorkerServiceTest, BadInput_ClearErrorsAndTheWorkerKeepsServing) {
  auto w = StartWorker();
  ASSERT_NE(w, nullptr);
  struct Case {
    std::string name;
    std::function<void(v1::SetupRequest&)> edit;
    absl::StatusCode code;
    std::string message;
  };
  const std::string no_steps = ModelWithoutTrainingStep();
  const std::vector<Case> cases = {
      {"missing model file",
       [](auto& r) { r.mutable_spec()->mutable_model()->set_torchscript("/nonexistent/m.pt"); },
       absl::StatusCode::kNotFound, "/nonexistent/m.pt"},
      {"no training_step",
       [&](auto& r) { r.mutable_spec()->mutable_model()->set_torchscript(no_steps); },
       absl::StatusCode::kInvalidArgument, "has no training_step"},
      {"unknown builtin", [](auto& r) { r.mutable_spec()->mutable_model()->set_builtin("resnet"); },
       absl::StatusCode::kInvalidArgument, "mlp, cnn"},
      {"unknown optimizer",
       [](auto& r) { r.mutable_spec()->mutable_optimizer()->set_name("lion"); },
       absl::StatusCode::kInvalidArgument, "unknown optimizer 'lion'"},
      {"unknown precision",
       [](auto& r) { r.mutable_spec()->mutable_trainer()->set_precision("8-true"); },
       absl::StatusCode::kInvalidArgument, "8-true"},
      {"unknown strategy",
       [](auto& r) { r.mutable_spec()->mutable_trainer()->set_strategy("fsdp9"); },
       absl::StatusCode::kInvalidArgument, "unknown strategy 'fsdp9'"},
      {"tpu_spawn", [](auto& r) { r.mutable_spec()->mutable_trainer()->set_strategy("tpu_spawn"); },
       absl::StatusCode::kFailedPrecondition, "XLA runtime"},
      {"gpu without CUDA",
       [](auto& r) { r.mutable_spec()->mutable_trainer()->set_accelerator("gpu"); },
       absl::StatusCode::kFailedPrecondition, "no CUDA support"},
      {"16-mixed on CPU",
       [](auto& r) { r.mutable_spec()->mutable_trainer()->set_precision("16-mixed"); },
       absl::StatusCode::kFailedPrecondition, "bf16-mixed"},
      {"bad job id", [](auto& r) { r.set_job_id("a/b"); }, absl::StatusCode::kInvalidArgument,
       "job_id"},
      {"empty job id", [](auto& r) { r.set_job_id(""); }, absl::StatusCode::kInvalidArgument,
       "job_id is empty"},
      // A job's directory is jobs_dir/<id>, which teardown removes: never the parent or itself.
      {"job id ..", [](auto& r) { r.set_job_id(".."); }, absl::StatusCode::kInvalidArgument,
       "job_id '..' names a directory, not a job"},
      {"job id .", [](auto& r) { r.set_job_id("."); }, absl::StatusCode::kInvalidArgument,
       "job_id '.' names a directory, not a job"},
      {"job id .. for ddp_spawn",
       [](auto& r) {
         r.mutable_spec()->mutable_trainer()->set_strategy("ddp_spawn");
         r.set_job_id("..");
       },
       absl::StatusCode::kInvalidArgument, "job_id '..' names a directory"},
      {"bad job id for ddp_spawn",
       [](auto& r) {
         r.mutable_spec()->mutable_trainer()->set_strategy("ddp_spawn");
         r.set_job_id("../x");
       },
       absl::StatusCode::kInvalidArgument, "job_id '../x' may hold only"},
      {"negative clip",
       [](auto& r) { r.mutable_spec()->mutable_trainer()->set_gradient_clip_val(-1); },
       absl::StatusCode::kInvalidArgument, "gradient_clip_val"},
      {"bad scheduler",
       [](auto& r) { r.mutable_spec()->mutable_lr_scheduler()->set_name("cyclic"); },
       absl::StatusCode::kInvalidArgument, "lr_scheduler"},
      {"missing dataset dir",
       [](auto& r) {
         r.mutable_spec()->mutable_data()->set_builtin("fashion-mnist");
         r.mutable_spec()->mutable_data()->set_data_dir("/nonexistent");
       },
       absl::StatusCode::kNotFound, "dataset-fashion-mnist"},
  };
  for (const Case& c : cases) {
    v1::SetupRequest r = MakeSetup("bad", "single_device", 1, address());
    c.edit(r);
    absl::Status s = Setup(*w, r);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(Health(*w).state(), v1::HealthResponse::IDLE) << c.name;
  }

  // Steps without a job.
  auto orphan = Train(*w, "nobody", {Slice(0, 0, 1, 4)});
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(orphan.status().message()), HasSubstr("call Setup first"));

  ASSERT_TRUE(Setup(*w, MakeSetup("good", "single_device", 1, address())).ok());
  EXPECT_EQ(Setup(*w, MakeSetup("second", "single_device", 1, address())).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Train(*w, "other", {Slice(0, 0, 1, 4)}).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A batch of the wrong shape: libtorch's message, and the job goes on.
  v1::LocalWork bad;
  v1::Batch* batch = bad.add_batches();
  ToProto(HostTensor::FromVector<float>(v1::DTYPE_FLOAT32, {2, 5}, std::vector<float>(10, 1.0f)),
          batch->add_tensors());
  ToProto(HostTensor::FromVector<int64_t>(v1::DTYPE_INT64, {2}, {1, 2}), batch->add_tensors());
  auto shape = Train(*w, "good", {bad});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shape.status().message()),
              HasSubstr("training_step of model 'builtin:mlp' failed"));
  EXPECT_THAT(std::string(shape.status().message()), HasSubstr("784"));
  // A malformed wire tensor and an index out of range.
  v1::LocalWork malformed;
  v1::Tensor* t = malformed.add_batches()->add_tensors();
  t->mutable_meta()->set_dtype(v1::DTYPE_FLOAT32);
  t->mutable_meta()->add_shape(4);
  t->set_data("abc");
  EXPECT_EQ(Train(*w, "good", {malformed}).status().code(), absl::StatusCode::kInvalidArgument);
  v1::LocalWork out_of_range;
  out_of_range.add_index_batches()->set_split("train");
  out_of_range.mutable_index_batches(0)->add_indices(kTrainSize);
  auto range = Train(*w, "good", {out_of_range});
  EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(range.status().message()), HasSubstr("outside split 'train'"));
  EXPECT_EQ(Train(*w, "good", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Train(*w, "good", {v1::LocalWork()}).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Monitored values and callback states are bounded in count and name length.
  v1::StepRequest crowded;
  crowded.set_job_id("good");
  *crowded.add_work() = Slice(0, 0, 1, 8);
  for (int i = 0; i < 257; ++i) (*crowded.mutable_monitored())[absl::StrCat("m", i)] = 1.0;
  v1::StepResponse ignored;
  absl::Status many = Call([&](auto* c) { return w->stub().TrainingStep(c, crowded, &ignored); });
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(many.message()), HasSubstr("monitored: 257 entries; at most 256"));
  v1::SaveCheckpointRequest long_key;
  long_key.set_job_id("good");
  long_key.set_name("x.ckpt");
  long_key.add_callbacks()->set_key(std::string(300, 'k'));
  v1::SaveCheckpointResponse saved;
  absl::Status key = Call([&](auto* c) { return w->stub().SaveCheckpoint(c, long_key, &saved); });
  EXPECT_EQ(key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(key.message()), HasSubstr("key of 300 bytes; at most 256"));

  auto ok = Train(*w, "good", {Slice(0, 0, 1, 8)});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->results(0).global_step(), 1);
  EXPECT_EQ(Health(*w).state(), v1::HealthResponse::READY);
}

TEST_F(WorkerServiceTest, Registration_ListedWhileServing_GoneAfterSigterm) {
  auto w = StartWorker({"--name=reg-worker", "--devices=3"});
  ASSERT_NE(w, nullptr);
  auto stub = v1::Workers::NewStub(ConnectToCoordinator(address()));
  auto list = [&] {
    v1::ListWorkersResponse response;
    grpc::ClientContext context;
    stub->ListWorkers(&context, v1::ListWorkersRequest(), &response);
    return response;
  };
  ASSERT_TRUE(WaitFor([&] { return list().workers_size() == 1; }, absl::Seconds(10)));
  const v1::WorkerInfo info = list().workers(0);
  EXPECT_EQ(info.name(), "reg-worker");
  EXPECT_EQ(info.address(), absl::StrCat("127.0.0.1:", w->port()));
  EXPECT_EQ(info.devices(), 3);
  EXPECT_EQ(info.state(), v1::WorkerInfo::ALIVE);
  ASSERT_TRUE(Setup(*w, MakeSetup("listed", "single_device", 1, address())).ok());
  EXPECT_TRUE(WaitFor([&] { return list().workers(0).job_id() == "listed"; }, absl::Seconds(5)));
  const int status = w->Stop();
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(list().workers_size(), 0);
}

// The worker allocates with jemalloc and its own options (worker/runtime/worker_allocator.h),
// and says so at start; given other options (a user's MALLOC_CONF) it still serves, and warns
// what it runs with.
TEST_F(WorkerServiceTest, Allocator_JemallocWithTheWorkersOptions_OthersWarnedAbout) {
  // A worker whose stderr goes to the file `log`, started with `environment` added to its own.
  auto start_logged = [&](const std::string& log, const std::vector<std::string>& environment) {
    std::vector<std::string> launcher = {"/usr/bin/env"};
    launcher.insert(launcher.end(), environment.begin(), environment.end());
    launcher.insert(launcher.end(), {"/bin/sh", "-c", absl::StrCat("exec \"$@\" 2> ", log), "sh"});
    return WorkerProcess::Start(address(), {}, launcher);
  };
  const std::string log = TestTempPath("worker.log");
  auto w = start_logged(log, {});
  ASSERT_NE(w, nullptr);
  EXPECT_THAT(ReadFile(absl::StrCat("/proc/", w->pid(), "/maps")), HasSubstr("/libjemalloc.so"));
  EXPECT_EQ(Health(*w).state(), v1::HealthResponse::IDLE);
  ASSERT_NE(w->Stop(), -1);
  EXPECT_THAT(ReadFile(log), HasSubstr("(oversize_threshold:0,dirty_decay_ms:-1)"));
  EXPECT_THAT(ReadFile(log), HasSubstr("jemalloc 5."));

  const std::string other_log = TestTempPath("other.log");
  auto other = start_logged(other_log, {"MALLOC_CONF=oversize_threshold:8388608"});
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(Health(*other).state(), v1::HealthResponse::IDLE);
  ASSERT_NE(other->Stop(), -1);
  EXPECT_THAT(ReadFile(other_log),
              HasSubstr("jemalloc runs with oversize_threshold:8388608,dirty_decay_ms:-1 and the "
                        "options of MALLOC_CONF=oversize_threshold:8388608, not the worker's "
                        "oversize_threshold:0,dirty_decay_ms:-1 alone"));
  // Any option, also one that is not read back, is reported: it changes the measured allocator.
  const std::string narenas_log = TestTempPath("narenas.log");
  auto narenas = start_logged(narenas_log, {"MALLOC_CONF=narenas:1"});
  ASSERT_NE(narenas, nullptr);
  ASSERT_NE(narenas->Stop(), -1);
  EXPECT_THAT(ReadFile(narenas_log),
              HasSubstr("jemalloc runs with oversize_threshold:0,dirty_decay_ms:-1 and the options "
                        "of MALLOC_CONF=narenas:1, not the worker's"));
}

// SIGTERM during a ddp job: the worker leaves its group cleanly, so its peer's next step fails
// at once naming it (rather than waiting out a deadline).
TEST_F(WorkerServiceTest, Sigterm_LeavesTheGroupCleanly_PeerIsToldWho) {
  auto a = StartWorker(), b = StartWorker();
  ASSERT_TRUE(a && b);
  std::vector<WorkerProcess*> ranks = {a.get(), b.get()};
  std::vector<v1::SetupResponse> setups(2);
  std::vector<absl::Status> statuses(2);
  Parallel(2, [&](int i) {
    statuses[i] = Setup(*ranks[i], MakeSetup("leave", "ddp", 2, address()), &setups[i]);
  });
  ASSERT_TRUE(statuses[0].ok() && statuses[1].ok());
  if (setups[0].ranks(0).rank() == 1) std::swap(ranks[0], ranks[1]);
  const int status = ranks[1]->Stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const absl::Time start = absl::Now();
  auto out = Train(*ranks[0], "leave", {Slice(0, 0, 2, 8)});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("rank 1"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace worker_service_test
}  // namespace dtrain::testing
