// The files a job carries and keeps, end to end on a real local cluster driven by the dtrain
// command line: local files uploaded at submit and fetched once into each worker's cache;
// checkpoints sent by rank 0 to the coordinator, kept top-k, downloaded (and fetched again when
// their bytes come damaged) and deleted; job:<id>/<name> references resolved at submission;
// checkpoints on a directory the workers share; the coordinator's storage quota.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "tests/checkpoint_comparison.h"
#include "tests/jobs_e2e_fixture.h"

namespace dtrain::testing {
namespace job_files_e2e_test {

using ::testing::HasSubstr;
using ::testing::Not;

// The SyntheticJob spec with the checkpoint section `checkpoint` instead of its own.
std::string WithCheckpoint(std::string spec, const std::string& checkpoint) {
  const std::string own = "checkpoint: {monitor: val_acc, save_top_k: 1}";
  return spec.replace(spec.find(own), own.size(), checkpoint);
}

// The regular files under `dir`, by name relative to it (none when it does not exist).
std::set<std::string> FilesUnder(const std::string& dir) {
  std::set<std::string> names;
  std::error_code error;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, error)) {
    if (e.is_regular_file()) names.insert(std::filesystem::relative(e.path(), dir).string());
  }
  return names;
}

// Checkpoints come home: rank 0 sends each checkpoint to the coordinator, which keeps the top k
// (evicted ones leave its store) and last.ckpt with the job; `dtrain results` lists them with
// sizes, `dtrain download` brings the best back verified and Python's torch loads it (weights
// only, as torch 2.6 and later do by default), and `dtrain delete` gives the space back, refusing
// a job that has not ended.
TEST_F(JobsE2eTest, CheckpointsComeHome_TopKOnTheCoordinator_DownloadedAndDeleted) {
  std::string spec = SyntheticJob("home", 2);
  spec.replace(spec.find("save_top_k: 1"), 13, "save_top_k: 2");
  CommandResult fit = Dtrain("fit --wait --config " + WriteJob("home", spec));
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const v1::JobStatus job = GetJob("home-1");
  const std::string objects = dir() + "/state/artifacts/objects";
  auto stored = [&] {
    int n = 0;
    std::error_code error;
    for (const auto& e : std::filesystem::recursive_directory_iterator(objects, error)) {
      n += e.is_regular_file();
    }
    return n;
  };
  int checkpoints = 0, monitored = 0;
  std::set<std::string> digests;
  const v1::JobFile* best = nullptr;
  for (const v1::JobFile& file : job.files()) {
    EXPECT_EQ(file.kind(), "checkpoint") << file.name();
    EXPECT_TRUE(absl::StartsWith(file.digest(), "sha256:")) << file.name();
    EXPECT_GT(file.size_bytes(), 10000) << file.name();
    EXPECT_EQ(file.location(), "job:home-1/" + file.name());
    ++checkpoints;
    digests.insert(file.digest());
    if (file.has_monitored()) {
      ++monitored;
      if (best == nullptr || file.monitored() > best->monitored()) best = &file;
    }
  }
  // Four validations, the top 2 by val_acc kept (the others evicted from the store), and last.
  EXPECT_EQ(checkpoints, 3);
  EXPECT_EQ(monitored, 2);
  ASSERT_NE(best, nullptr);
  EXPECT_EQ(job.best_checkpoint(), best->location());
  EXPECT_EQ(job.checkpoint(), "job:home-1/last.ckpt");
  EXPECT_EQ(stored(), static_cast<int>(digests.size())) << "an evicted checkpoint stayed stored";
  CommandResult logs = Dtrain("logs home-1");
  EXPECT_THAT(logs.output, HasSubstr("checkpoint written: job:home-1/epoch=0-step=16.ckpt"));

  CommandResult results = Dtrain("results home-1");
  EXPECT_THAT(results.output, HasSubstr("dtrain download home-1"));
  EXPECT_THAT(results.output, HasSubstr(best->name()));
  EXPECT_THAT(results.output, HasSubstr(" MB  step "));
  EXPECT_THAT(results.output, HasSubstr("val_acc="));

  // The best, fetched and verified, is the checkpoint Python's torch reads.
  const std::string out = dir() + "/downloads";
  CommandResult download = Dtrain("download home-1 best -o " + out);
  ASSERT_EQ(download.exit_code, 0) << download.output;
  const std::string path = out + "/" + best->name();
  EXPECT_THAT(download.output, HasSubstr(path));
  // As a user of torch 2.6 or later loads it by default: weights only.
  CommandResult python = RunTorchPython(
      absl::StrCat(kWeightsOnlyLoad, "import hashlib\nc = weights_only_load('", path,
                   "')\nprint('step', c['global_step'], 'sha256:' + hashlib.sha256(open('", path,
                   "', 'rb').read()).hexdigest())\n"));
  ASSERT_EQ(python.exit_code, 0) << python.output;
  EXPECT_THAT(python.output, HasSubstr(absl::StrCat("step ", best->step(), " ", best->digest())));
  CommandResult missing = Dtrain("download home-1 nosuch.ckpt -o " + out);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("it keeps "));
  EXPECT_THAT(missing.output, HasSubstr("last.ckpt"));

  // A job that has not ended is not deleted; an ended one is, with its stored files.
  std::string big = SyntheticJob("big", 1);
  big.replace(big.find("num_nodes: 2"), 12, "num_nodes: 3");
  CommandResult queued = Dtrain("fit --config " + WriteJob("big", big));
  ASSERT_EQ(queued.exit_code, 0) << queued.output;
  CommandResult refused = Dtrain("delete big-1");
  EXPECT_EQ(refused.exit_code, 3) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(refused.output, HasSubstr("cancel it first"));
  ASSERT_EQ(Dtrain("cancel big-1").exit_code, 0);
  CommandResult deleted = Dtrain("delete home-1");
  ASSERT_EQ(deleted.exit_code, 0) << deleted.output;
  EXPECT_THAT(deleted.output, HasSubstr("deleted home-1: 3 stored file(s)"));
  EXPECT_EQ(stored(), 0);
  EXPECT_FALSE(std::filesystem::exists(dir() + "/state/jobs/home-1"));
  CommandResult gone = Dtrain("status home-1");
  EXPECT_EQ(gone.exit_code, 3) << gone.output;
  EXPECT_THAT(gone.output, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(Dtrain("list").output, Not(HasSubstr("home-1")));
}

// Files travel with the job: a data file that exists only in the client's directory is
// uploaded at submit, the spec names it by content, each worker fetches it once into its own
// cache, and a later job naming the same content runs from those caches even after the client
// and the coordinator no longer have it. Content nobody has fails the job naming it.
TEST_F(JobsE2eTest, FilesTravelWithTheJob_FetchedOnceIntoEachWorkersCache) {
  const std::string data = dir() + "/client/data.pt";
  std::filesystem::create_directories(dir() + "/client");
  CommandResult made = RunShell(
      "/usr/bin/python3 -c 'import torch; g = torch.Generator().manual_seed(0); "
      "x = torch.randn(384, 784, generator=g); y = (x[:, :10].argmax(1)); "
      "torch.save({\"train\": (x[:256], y[:256]), \"val\": (x[256:], y[256:]), "
      "\"test\": (x[256:], y[256:])}, \"" +
      data + "\")'");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string spec = R"(name: carried
model: {builtin: mlp}
data: {tensors_file: client/data.pt, batch_size: 32}
trainer: {max_epochs: 2, num_nodes: 2}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
)";
  CommandResult run = Dtrain("fit --wait --config " + WriteJob("carried", spec));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("data.tensors_file: data.pt ("));
  EXPECT_THAT(run.output, HasSubstr(") sent as sha256:"));
  v1::GetJobRequest get;
  get.set_id("carried-1");
  v1::JobStatus first;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(cluster_->jobs().GetJob(&context, get, &first).ok());
  }
  const std::string reference = first.spec().data().tensors_file();
  ASSERT_EQ(reference.rfind("artifact:sha256:", 0), 0u) << reference;
  const std::string hex = reference.substr(std::string("artifact:sha256:").size());
  for (const char* worker : {"w0", "w1"}) {
    EXPECT_TRUE(std::filesystem::exists(dir() + "/cache-" + worker + "/" + hex)) << worker;
  }
  // Submitting it again sends nothing: the coordinator has it.
  CommandResult again = Dtrain("fit --config " + WriteJob("carried", spec));
  EXPECT_THAT(again.output, HasSubstr("already on the coordinator as sha256:" + hex));
  ASSERT_EQ(Dtrain("cancel carried-2").exit_code, 0);
  ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(20)));

  // Gone from the client: the spec names the content, which the workers' caches hold (the
  // cache hits are counted in metrics_endpoint_test).
  std::filesystem::remove(data);
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = first.spec();
  submit.mutable_spec()->set_name("cached");
  submit.mutable_spec()->clear_ckpt_path();
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(cluster_->jobs().SubmitJob(&context, submit, &submitted).ok());
  }
  CommandResult cached = Dtrain("watch " + submitted.job().id());
  EXPECT_EQ(cached.exit_code, 0) << cached.output;
  // The same content, seed and spec: the same run, metric for metric.
  const v1::JobStatus rerun = GetJob(submitted.job().id());
  EXPECT_NEAR(rerun.metrics().at("val_loss"), first.metrics().at("val_loss"), 1e-6);
  EXPECT_DOUBLE_EQ(rerun.metrics().at("test_acc"), first.metrics().at("test_acc"));

  // Content the coordinator does not have: refused at submit, naming the field and digest.
  submit.mutable_spec()->set_name("missing");
  submit.mutable_spec()->mutable_data()->set_tensors_file("artifact:sha256:" +
                                                          std::string(64, 'a'));
  {
    grpc::ClientContext context;
    grpc::Status refused = cluster_->jobs().SubmitJob(&context, submit, &submitted);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(refused.error_message(),
                HasSubstr("data.tensors_file: sha256:" + std::string(64, 'a') +
                          " is not stored on the coordinator; upload it first"));
  }
  // A malformed reference never becomes a file name: refused at submit.
  submit.mutable_spec()->mutable_data()->set_tensors_file("artifact:sha256:../../etc/passwd");
  grpc::ClientContext context;
  const grpc::Status malformed = cluster_->jobs().SubmitJob(&context, submit, &submitted);
  EXPECT_EQ(malformed.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(malformed.error_message(), HasSubstr("data.tensors_file: "));
  EXPECT_THAT(malformed.error_message(), HasSubstr("is not a digest"));
}

// accumulate_grad_batches 3 over 32 batches per epoch: each epoch's last, partial window still
// steps (as Lightning's), so 11 optimizer steps per epoch.
// The coordinator's storage quota holds for checkpoints too: a job whose checkpoint does not fit
// fails saying which flag sets the quota and what frees space, and nothing partial is kept.
TEST_F(JobsE2eTest, StorageQuota_CheckpointAboveIt_JobFailsNamingTheFlag) {
  ASSERT_TRUE(cluster_->StopCoordinator(SIGTERM));
  ASSERT_TRUE(cluster_->StartCoordinator(cluster_->address(), {"--artifact_quota_bytes=100000"}));
  ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(20)));
  CommandResult run = Dtrain("fit --wait --config " + WriteJob("full", SyntheticJob("full", 1)));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("was written on worker 'w"));
  EXPECT_THAT(run.output, HasSubstr("but not sent to the coordinator"));
  EXPECT_THAT(run.output, HasSubstr("--artifact_quota_bytes"));
  EXPECT_THAT(run.output, HasSubstr("dtrain delete"));
  int stored = 0;
  std::error_code error;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(dir() + "/state/artifacts", error)) {
    stored += e.is_regular_file();
  }
  EXPECT_EQ(stored, 0);
}

// ckpt_path: job:<id>/<name> names that file's content at submission (docs/jobs.md), so deleting
// the other job later takes nothing from this one: a job still queued with such a ckpt_path
// resumes from it after that job is deleted, exactly after its last step (mid-epoch here), and
// ends in the state of the uninterrupted run the checkpoint came from, bit for bit. Submitted
// after the deletion, the same reference is refused naming the job.
TEST_F(JobsE2eTest, CkptPathJobFile_ResolvedAtSubmission_ResumesExactlyAfterTheJobIsDeleted) {
  // The uninterrupted run, every validation's checkpoint kept: val_check_interval 0.5 over two
  // epochs of 32 steps validates at steps 16, 32, 48 and 64.
  auto spec = [](const std::string& name) {
    return WithCheckpoint(SyntheticJob(name, 2), "checkpoint: {monitor: val_loss, save_top_k: 4}");
  };
  const std::string whole = RunToTheEnd(*cluster_, "whole", spec("whole"));
  ASSERT_FALSE(whole.empty());
  std::string digest;
  const v1::JobStatus whole_status = GetJob(whole);
  for (const v1::JobFile& file : whole_status.files()) {
    if (file.name() == "epoch=1-step=48.ckpt") digest = file.digest();
  }
  ASSERT_FALSE(digest.empty()) << "no mid-epoch checkpoint kept at step 48";
  const std::string uninterrupted = DownloadCheckpoint(*cluster_, whole);
  ASSERT_FALSE(uninterrupted.empty());

  // A long job holds both workers, so the next one waits in the queue.
  const std::string hold = cluster_->Submit("hold", SyntheticJob("hold", 1000));
  ASSERT_TRUE(WaitFor([&] { return GetJob(hold).state() == v1::RUNNING; }, absl::Seconds(60)));
  const std::string rest = cluster_->Submit(
      "rest", absl::StrCat(spec("rest"), "ckpt_path: job:", whole, "/epoch=1-step=48.ckpt\n"));
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(GetJob(rest).state(), v1::QUEUED);
  EXPECT_EQ(GetJob(rest).spec().ckpt_path(), "artifact:" + digest);

  const CommandResult deleted = Dtrain("delete " + whole);
  ASSERT_EQ(deleted.exit_code, 0) << deleted.output;
  EXPECT_THAT(deleted.output, HasSubstr("deleted " + whole));
  const CommandResult late =
      Dtrain("fit --config " + WriteJob("late", absl::StrCat(spec("late"), "ckpt_path: job:", whole,
                                                             "/epoch=1-step=48.ckpt\n")));
  EXPECT_EQ(late.exit_code, 3) << late.output;
  EXPECT_THAT(late.output, HasSubstr("'job:" + whole + "/epoch=1-step=48.ckpt': no job '" + whole +
                                     "' (deleted?)"));

  ASSERT_EQ(Dtrain("cancel " + hold).exit_code, 0);
  ASSERT_TRUE(WaitFor([&] { return IsTerminal(GetJob(rest).state()); }, absl::Seconds(180)));
  const v1::JobStatus done = GetJob(rest);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.progress().global_step(), 64);
  EXPECT_THAT(Dtrain("logs " + rest).output,
              HasSubstr("resumed from artifact:" + digest + " at step 48 (epoch 1, batch 16)"));
  const std::string resumed = DownloadCheckpoint(*cluster_, rest);
  ASSERT_FALSE(resumed.empty());
  const ::testing::AssertionResult same = SameTrainingState(resumed, uninterrupted);
  EXPECT_TRUE(same);
  std::printf("%s", same.message());
}

// checkpoint.dirpath naming a directory every worker shares (worker:<dir>): rank 0 writes each
// checkpoint there and nothing is sent to the coordinator; the job lists them as worker:
// locations with no digest, `dtrain results` shows those paths and `dtrain download` says where
// they are instead of fetching. A later job resumes from one by job:<id>/<name>, which names
// that path, and ends in the state of the run that wrote it, bit for bit.
TEST_F(JobsE2eTest, SharedDirpath_RankZeroWritesThere_ListedAsWorkerPaths_ResumedExactly) {
  const std::string shared = dir() + "/shared-ckpts";
  const std::string id = RunToTheEnd(
      *cluster_, "shared",
      WithCheckpoint(
          SyntheticJob("shared", 2),
          "checkpoint: {monitor: val_loss, save_top_k: 4, dirpath: \"worker:" + shared + "\"}"));
  ASSERT_FALSE(id.empty());
  const v1::JobStatus job = GetJob(id);
  std::set<std::string> listed;
  for (const v1::JobFile& file : job.files()) {
    EXPECT_EQ(file.location(), "worker:" + shared + "/" + file.name());
    EXPECT_EQ(file.digest(), "") << file.name() << " was sent to the coordinator";
    listed.insert(file.name());
  }
  const std::set<std::string> expected = {"epoch=0-step=16.ckpt", "epoch=0-step=32.ckpt",
                                          "epoch=1-step=48.ckpt", "epoch=1-step=64.ckpt",
                                          "last.ckpt"};
  EXPECT_EQ(listed, expected);
  // There and nowhere else: no temporary or probe file left, nothing in the coordinator's store
  // nor in either worker's own directory for the job.
  EXPECT_EQ(FilesUnder(shared), expected);
  EXPECT_EQ(FilesUnder(dir() + "/state/artifacts/objects"), std::set<std::string>());
  for (const char* worker : {"w0", "w1"}) {
    for (const std::string& name : FilesUnder(dir() + "/jobs-" + worker)) {
      EXPECT_FALSE(absl::EndsWith(name, ".ckpt")) << worker << " kept " << name;
    }
  }
  EXPECT_EQ(job.checkpoint(), "worker:" + shared + "/last.ckpt");
  EXPECT_THAT(Dtrain("logs " + id).output,
              HasSubstr("checkpoint written: worker:" + shared + "/last.ckpt (step 64, "));
  EXPECT_THAT(Dtrain("results " + id).output, HasSubstr("worker:" + shared + "/last.ckpt"));
  const std::string out = dir() + "/not-fetched";
  const CommandResult download = Dtrain("download " + id + " last -o " + out);
  EXPECT_EQ(download.exit_code, 2) << download.output;
  EXPECT_THAT(download.output,
              HasSubstr("last.ckpt is on the workers' shared directory, not on the coordinator: "
                        "worker:" +
                        shared + "/last.ckpt (copy it from there)"));
  EXPECT_EQ(FilesUnder(out), std::set<std::string>());

  // Resumed mid-epoch from the step-48 file, the job ends where the run that wrote it ended.
  const std::string onward = RunToTheEnd(
      *cluster_, "onward",
      absl::StrCat(SyntheticJob("onward", 2), "ckpt_path: job:", id, "/epoch=1-step=48.ckpt\n"));
  ASSERT_FALSE(onward.empty());
  EXPECT_EQ(GetJob(onward).spec().ckpt_path(), "worker:" + shared + "/epoch=1-step=48.ckpt");
  EXPECT_THAT(Dtrain("logs " + onward).output,
              HasSubstr("resumed from worker:" + shared +
                        "/epoch=1-step=48.ckpt at step 48 (epoch 1, batch 16)"));
  EXPECT_EQ(GetJob(onward).progress().global_step(), 64);
  const std::string resumed = DownloadCheckpoint(*cluster_, onward);
  ASSERT_FALSE(resumed.empty());
  const ::testing::AssertionResult same = SameTrainingState(resumed, shared + "/last.ckpt");
  EXPECT_TRUE(same);
  std::printf("%s", same.message());
}

// A downloaded file whose bytes do not hash to its digest is refused with DATA_LOSS and fetched
// again, three attempts in all, and never kept (docs/jobs.md). Damaged once on the way (a proxy
// flips a byte of it, as a faulty link would), the second attempt brings it intact; damaged in
// the coordinator's store, every attempt is refused and the download fails saying so.
TEST_F(JobsE2eTest, Download_BytesNotMatchingTheDigest_FetchedAgain_ThreeAttemptsAtMost) {
  const std::string id = RunToTheEnd(*cluster_, "small", SyntheticJob("small", 1, 512));
  ASSERT_FALSE(id.empty());
  std::string digest;
  const v1::JobStatus job = GetJob(id);
  for (const v1::JobFile& file : job.files()) {
    if (file.name() == "last.ckpt") digest = file.digest();
  }
  ASSERT_EQ(digest.rfind("sha256:", 0), 0u);
  const std::string stored =
      absl::StrCat(dir(), "/state/artifacts/objects/", digest.substr(7, 2), "/", digest.substr(9));
  const std::string bytes = ReadFile(stored);
  ASSERT_GT(bytes.size(), 100000u) << stored;
  // Four pieces of the file spread over it, each found once in it: whichever comes first in the
  // stream is damaged (one could straddle two HTTP/2 frames, not all four).
  std::vector<std::string> proxy = {"/usr/bin/python3",
                                    DTRAIN_SOURCE_DIR "/tests/python/corrupting_proxy.py",
                                    cluster_->address(), "1"};
  for (int k = 1; k <= 4; ++k) {
    const std::string piece = bytes.substr(bytes.size() * k / 5, 32);
    ASSERT_EQ(bytes.find(piece), bytes.rfind(piece)) << "piece " << k << " is not unique";
    proxy.push_back(absl::BytesToHexString(piece));
  }
  std::unique_ptr<Subprocess> faulty = Subprocess::Start(proxy);
  ASSERT_NE(faulty, nullptr);
  const std::string listening = faulty->ReadLine(absl::Seconds(30));
  ASSERT_EQ(listening.rfind("listening ", 0), 0u) << listening;
  const std::string through = "127.0.0.1:" + listening.substr(10);

  const std::string once = dir() + "/damaged-once";
  const CommandResult fetched =
      Dtrain(absl::StrCat("download ", id, " last -o ", once, " --coordinator ", through));
  ASSERT_EQ(fetched.exit_code, 0) << fetched.output;
  EXPECT_EQ(faulty->ReadLine(absl::Seconds(5)), "corrupted 1") << "the proxy damaged nothing";
  EXPECT_EQ(Sha256OfFile(once + "/last.ckpt").value_or(""), digest);
  EXPECT_EQ(FilesUnder(once), std::set<std::string>{"last.ckpt"});
  faulty.reset();

  // The stored copy itself damaged: one byte flipped in the middle.
  {
    std::fstream file(stored, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(bytes.size() / 2));
    file.put(static_cast<char>(bytes[bytes.size() / 2] ^ 0xFF));
  }
  const std::string never = dir() + "/damaged-always";
  const CommandResult refused =
      Dtrain(absl::StrCat("download ", id, " last --output json -o ", never));
  EXPECT_EQ(refused.exit_code, 3) << refused.output;
  const google::protobuf::Struct error = ParseJsonLine(refused.output);
  const auto& fields = error.fields().at("error").struct_value().fields();
  EXPECT_EQ(fields.at("code").string_value(), "DATA_LOSS");
  EXPECT_THAT(fields.at("message").string_value(),
              HasSubstr("cannot download last.ckpt (" + digest +
                        ") in 3 attempts: the fetched "
                        "bytes hash to sha256:"));
  EXPECT_THAT(fields.at("message").string_value(), HasSubstr("corrupted in transit"));
  EXPECT_EQ(FilesUnder(never), std::set<std::string>()) << "a refused file was kept";
}

}  // namespace job_files_e2e_test
}  // namespace dtrain::testing
