// The Artifacts service on a real in-process coordinator over loopback gRPC, driven by the C++
// ArtifactsClient and by raw stubs on default channels: uploads verified by digest and stored
// once, fetches that fit gRPC's default 4 MiB, corrupted or oversized uploads refused by name,
// and the admin token required.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "client/artifacts_client.h"
#include "common/channel.h"
#include "common/sha256.h"
#include "dtrain/v1/artifacts.grpc.pb.h"
#include "tests/raw_stream.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace artifacts_service_test {

using ::testing::HasSubstr;

class ArtifactsServiceTest : public ::testing::Test {
 protected:
  void Start(int64_t max_bytes = 0, const std::string& token = "") {
    dir_ = ::testing::TempDir() + "/artifacts-service-" + std::to_string(getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    CoordinatorOptions options = FastOptions();
    options.state_dir = dir_ + "/state";
    options.max_artifact_bytes = max_bytes;
    options.admin_token = token;
    coordinator_ = StartCoordinator(options);
    ASSERT_NE(coordinator_, nullptr);
  }
  // A channel with gRPC's default limits (4 MiB received), as any language's default client.
  std::shared_ptr<grpc::Channel> DefaultChannel() {
    return grpc::CreateChannel(coordinator_->address(), grpc::InsecureChannelCredentials());
  }
  std::string WriteFile(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static std::string Random(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>(rng());
    return out;
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> coordinator_;
};

TEST_F(ArtifactsServiceTest, UploadOnce_FetchOnDefaultChannels_BytesIdentical) {
  Start();
  ArtifactsClient client(DefaultChannel());
  const std::string bytes = Random(10 << 20, 1);  // three chunks of 4 MiB - 64 KiB
  const std::string path = WriteFile("model.pt", bytes);
  absl::StatusOr<UploadResult> first = client.Upload(path);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->sent);
  EXPECT_EQ(first->size, 10 << 20);
  EXPECT_EQ(first->digest, *Sha256OfFile(path));
  absl::StatusOr<UploadResult> second = client.Upload(path);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->sent) << "the coordinator had it: nothing sent again";
  EXPECT_EQ(*client.Stat(first->digest), 10 << 20);

  ASSERT_TRUE(client.Fetch(first->digest, dir_ + "/fetched.pt").ok());
  EXPECT_EQ(Read(dir_ + "/fetched.pt"), bytes);
  // From an offset, on a raw stub: every message within 4 MiB.
  auto stub = v1::Artifacts::NewStub(DefaultChannel());
  grpc::ClientContext context;
  v1::FetchRequest request;
  request.set_digest(first->digest);
  request.set_offset(9 << 20);
  auto reader = stub->Fetch(&context, request);
  v1::FetchResponse response;
  std::string tail;
  int messages = 0;
  while (reader->Read(&response)) {
    EXPECT_LE(response.ByteSizeLong(), size_t{4} << 20);
    if (messages++ == 0) {
      EXPECT_EQ(response.size(), 10 << 20);
    }
    tail += response.chunk();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tail, bytes.substr(9 << 20));

  // An empty file is a file too.
  absl::StatusOr<UploadResult> empty = client.Upload(WriteFile("empty", ""));
  ASSERT_TRUE(empty.ok()) << empty.status();
  ASSERT_TRUE(client.Fetch(empty->digest, dir_ + "/empty.out").ok());
  EXPECT_EQ(Read(dir_ + "/empty.out"), "");

  // Missing, malformed.
  Sha256 other;
  other.Update("not stored");
  EXPECT_EQ(client.Fetch(other.Finish(), dir_ + "/x").code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x"));
  EXPECT_EQ(client.Stat("sha256:../../etc").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.Upload(dir_ + "/nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ArtifactsServiceTest, CorruptedShortOrOversizedUploads_RefusedByName_NothingStored) {
  Start(/*max_bytes=*/8 << 20);
  auto stub = v1::Artifacts::NewStub(DefaultChannel());
  auto upload = [&](const std::string& digest, int64_t size, const std::string& bytes,
                    bool header = true) {
    grpc::ClientContext context;
    v1::UploadResponse response;
    auto writer = stub->Upload(&context, &response);
    v1::UploadRequest request;
    if (header) {
      request.mutable_header()->set_digest(digest);
      request.mutable_header()->set_size(size);
    }
    request.set_chunk(bytes);
    writer->Write(request);
    writer->WritesDone();
    return writer->Finish();
  };
  const std::string bytes = Random(1 << 20, 2);
  Sha256 hash;
  hash.Update(bytes);
  const std::string digest = hash.Finish();
  std::string flipped = bytes;
  flipped[777] ^= 1;
  grpc::Status corrupt = upload(digest, 1 << 20, flipped);
  EXPECT_EQ(corrupt.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(corrupt.error_message(), HasSubstr("not " + digest));
  grpc::Status short_upload = upload(digest, 1 << 20, bytes.substr(0, 1000));
  EXPECT_EQ(short_upload.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(short_upload.error_message(), HasSubstr("ended after 1000"));
  ArtifactsClient client(DefaultChannel());
  EXPECT_EQ(client.Stat(digest).status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(upload(digest, 1 << 20, bytes, /*header=*/false).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status big = upload(digest, 9 << 20, "");
  EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(big.error_message(), HasSubstr("--max_artifact_bytes"));
  EXPECT_EQ(upload("sha256:xyz", 3, "abc").error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // The right bytes go in.
  ASSERT_TRUE(upload(digest, 1 << 20, bytes).ok());
  EXPECT_EQ(*client.Stat(digest), 1 << 20);
  // Sent again, it is dropped, not written; more bytes than announced are refused all the same.
  grpc::ClientContext context;
  v1::UploadResponse response;
  auto writer = stub->Upload(&context, &response);
  v1::UploadRequest request;
  request.mutable_header()->set_digest(digest);
  request.mutable_header()->set_size(1 << 20);
  request.set_chunk(bytes);
  writer->Write(request);
  writer->WritesDone();
  const grpc::Status again = writer->Finish();
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_TRUE(response.already_stored());
  grpc::Status longer = upload(digest, 1 << 20, bytes + "x");
  EXPECT_EQ(longer.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(longer.error_message(),
              HasSubstr("sends more than the 1048576 bytes it announced for " + digest));
  EXPECT_EQ(*client.Stat(digest), 1 << 20);
}

// A client whose messages stop parsing mid-upload (built from other .proto files, or damaged
// bytes): refused as such by name, not as a short upload, and nothing is kept. A whole upload on
// the same raw path answers the digest and size it stored.
TEST_F(ArtifactsServiceTest, MessageThatDoesNotParseMidUpload_RefusedByName_NothingStored) {
  Start();
  const std::string bytes = Random(300000, 4);
  Sha256 hash;
  hash.Update(bytes);
  const std::string digest = hash.Finish();
  v1::UploadRequest first;
  first.mutable_header()->set_digest(digest);
  first.mutable_header()->set_size(static_cast<int64_t>(bytes.size()));
  first.set_chunk(bytes.substr(0, 100000));
  v1::UploadRequest rest;
  rest.set_chunk(bytes.substr(100000));
  // Sends `messages` as raw bytes on one Upload stream; its status and the answer's bytes.
  auto raw_upload = [&](const std::vector<std::string>& messages, std::string* answer) {
    RawStreamResult result = RawStream(DefaultChannel(), "/dtrain.v1.Artifacts/Upload", messages);
    if (!result.answers.empty()) *answer = result.answers.front();
    return result.status;
  };
  std::string ignored;
  const grpc::Status damaged = raw_upload(
      {first.SerializeAsString(), std::string("\x0f\xff\xff", 3), rest.SerializeAsString()},
      &ignored);
  EXPECT_EQ(damaged.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(damaged.error_message(),
              HasSubstr("the request to /dtrain.v1.Artifacts/Upload does not parse as "
                        "dtrain.v1.UploadRequest"));
  ArtifactsClient client(DefaultChannel());
  EXPECT_EQ(client.Stat(digest).status().code(), absl::StatusCode::kNotFound);

  std::string answer;
  ASSERT_TRUE(raw_upload({first.SerializeAsString(), rest.SerializeAsString()}, &answer).ok());
  v1::UploadResponse stored;
  ASSERT_TRUE(stored.ParseFromString(answer));
  EXPECT_EQ(stored.digest(), digest);
  EXPECT_EQ(stored.size(), 300000);
  EXPECT_FALSE(stored.already_stored());
  EXPECT_EQ(*client.Stat(digest), 300000);
  answer.clear();
  ASSERT_TRUE(raw_upload({first.SerializeAsString(), rest.SerializeAsString()}, &answer).ok());
  ASSERT_TRUE(stored.ParseFromString(answer));
  EXPECT_TRUE(stored.already_stored());
  EXPECT_EQ(stored.digest(), digest);
  EXPECT_EQ(stored.size(), 300000);
}

TEST_F(ArtifactsServiceTest, AdminTokenRequired) {
  Start(0, "artifact-admin-token");
  const std::string path = WriteFile("f", "payload");
  ArtifactsClient anonymous(DefaultChannel());
  EXPECT_EQ(anonymous.Upload(path).status().code(), absl::StatusCode::kUnauthenticated);
  ArtifactsClient admin(ConnectToCoordinator(coordinator_->address(), "artifact-admin-token"));
  absl::StatusOr<UploadResult> uploaded = admin.Upload(path);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(anonymous.Fetch(uploaded->digest, dir_ + "/out").code(),
            absl::StatusCode::kUnauthenticated);
  ASSERT_TRUE(admin.Fetch(uploaded->digest, dir_ + "/out").ok());
  EXPECT_EQ(Read(dir_ + "/out"), "payload");
}

// A job token reads only the files its job names (here its uploaded model), in any run's group
// of that job; never another job's, and it uploads nothing. The job's spec is checked at
// submission: a file not stored, another job that does not exist or keeps no such file.
TEST_F(ArtifactsServiceTest, JobTokenReadsOnlyItsOwnJobsFiles_SubmitChecksWhatTheSpecNames) {
  Start(0, "artifact-admin-token");
  ArtifactsClient admin(ConnectToCoordinator(coordinator_->address(), "artifact-admin-token"));
  absl::StatusOr<UploadResult> mine = admin.Upload(WriteFile("mine.pt", "the job's model"));
  absl::StatusOr<UploadResult> theirs = admin.Upload(WriteFile("theirs.pt", "another model"));
  ASSERT_TRUE(mine.ok() && theirs.ok());
  v1::JobSpec spec;
  spec.set_name("tok");
  spec.mutable_model()->set_torchscript("artifact:" + mine->digest);
  spec.mutable_data()->mutable_synthetic()->set_train_size(64);
  spec.mutable_trainer()->set_num_nodes(1);
  absl::StatusOr<v1::JobStatus> job = coordinator_->jobs().Submit(spec, false);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->id(), "tok-1");
  EXPECT_EQ(job->state(), v1::QUEUED) << "no workers: it waits";

  for (const std::string group : {"tok-1", "tok-1.2"}) {
    const std::string token = coordinator_->access().IssueJobToken(group);
    ArtifactsClient ranks(ConnectToCoordinator(coordinator_->address(), token));
    ASSERT_TRUE(ranks.Fetch(mine->digest, dir_ + "/fetched").ok()) << group;
    EXPECT_EQ(Read(dir_ + "/fetched"), "the job's model");
    absl::Status other = ranks.Fetch(theirs->digest, dir_ + "/stolen");
    EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << other;
    EXPECT_THAT(std::string(other.message()), HasSubstr("reads only its own job's files"));
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/stolen"));
    EXPECT_EQ(ranks.Stat(theirs->digest).status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(ranks.Upload(WriteFile("new.bin", "x")).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  const std::string stranger = coordinator_->access().IssueJobToken("other-1");
  ArtifactsClient outsider(ConnectToCoordinator(coordinator_->address(), stranger));
  EXPECT_EQ(outsider.Stat(mine->digest).status().code(), absl::StatusCode::kPermissionDenied);

  v1::JobSpec unstored = spec;
  unstored.mutable_model()->set_torchscript("artifact:sha256:" + std::string(64, 'a'));
  absl::StatusOr<v1::JobStatus> refused = coordinator_->jobs().Submit(unstored, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("model.torchscript: sha256:aaaa"));
  v1::JobSpec from_job = spec;
  from_job.set_ckpt_path("job:nosuch-1/last.ckpt");
  refused = coordinator_->jobs().Submit(from_job, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no job 'nosuch-1'"));
  from_job.set_ckpt_path("job:tok-1/last.ckpt");
  refused = coordinator_->jobs().Submit(from_job, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("job 'tok-1' keeps no file 'last.ckpt'; it keeps none"));
  from_job.set_ckpt_path("job:tok-1/../../etc/passwd");
  refused = coordinator_->jobs().Submit(from_job, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
}

// A stored file whose bytes rotted on the coordinator's disk: the fetch's hash check refuses it
// by name and keeps nothing.
TEST_F(ArtifactsServiceTest, CorruptedStoredFile_FetchRefusedByName_NothingKept) {
  Start();
  ArtifactsClient client(DefaultChannel());
  absl::StatusOr<UploadResult> up = client.Upload(WriteFile("f", Random(100000, 5)));
  ASSERT_TRUE(up.ok()) << up.status();
  const std::string hex = up->digest.substr(7);
  const std::string object =
      dir_ + "/state/artifacts/objects/" + hex.substr(0, 2) + "/" + hex.substr(2);
  ASSERT_TRUE(std::filesystem::exists(object));
  {
    std::fstream f(object, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(5000);
    const char byte = static_cast<char>(f.get() ^ 1);
    f.seekp(5000);
    f.put(byte);
  }
  absl::Status fetched = client.Fetch(up->digest, dir_ + "/out");
  EXPECT_EQ(fetched.code(), absl::StatusCode::kDataLoss) << fetched;
  EXPECT_THAT(std::string(fetched.message()), HasSubstr(up->digest));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out"));
}

}  // namespace artifacts_service_test
}  // namespace dtrain::testing
