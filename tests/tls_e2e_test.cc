// TLS end to end: a coordinator and a worker process that both require mutual TLS (certificates
// from deploy/tls/make-test-certs.sh), driven by the dtrain CLI; a job runs over TLS both ways
// (worker -> coordinator, coordinator -> worker), and clients without the CA, or without a
// client certificate, are refused. Plaintext on a non-loopback address needs --insecure.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/tls_credentials.h"
#include "tests/test_support.h"
#include "tests/worker_process.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/tls-e2e-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    CommandResult made =
        RunShell(absl::StrCat("bash " DTRAIN_SOURCE_DIR "/deploy/tls/make-test-certs.sh ", dir_));
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }

  std::vector<std::string> ServerTls() const {
    return {"--tls_cert=" + dir_ + "/server.pem", "--tls_key=" + dir_ + "/server.key",
            "--tls_ca=" + dir_ + "/ca.pem", "--tls_require_client_cert"};
  }

  // Starts a coordinator with `flags`; its port, or 0 when it did not serve within 20 s.
  int StartCoordinator(const std::vector<std::string>& flags) {
    const std::string port_file = dir_ + "/coordinator.port";
    std::vector<std::string> argv = {DTRAIN_COORDINATOR_BIN, "--port_file=" + port_file,
                                     "--state-dir=" + dir_ + "/state", "--heartbeat-timeout=5s"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    coordinator_ = Subprocess::Start(argv);
    if (coordinator_ == nullptr) return 0;
    return WaitForPortFile(port_file, absl::Seconds(20));
  }

  std::string Cli(const std::string& env, const std::string& args) const {
    return absl::StrCat("DTRAIN_COORDINATOR=", address_, " ", env,
                        " " DTRAIN_CLI_BIN " --timeout=5s ", args);
  }

  std::string dir_, address_;
  std::unique_ptr<Subprocess> coordinator_;
};

TEST_F(TlsTest, MutualTlsCluster_RunsAJob_RefusesClientsWithoutCaOrCertificate) {
  std::vector<std::string> flags = ServerTls();
  flags.push_back("--listen=127.0.0.1:0");
  const int port = StartCoordinator(flags);
  ASSERT_GT(port, 0);
  address_ = absl::StrCat("127.0.0.1:", port);
  // This test process talks to the worker too (WorkerProcess checks it serves): as a client
  // with the client certificate.
  ASSERT_TRUE(
      ConfigureClientTls({dir_ + "/client.pem", dir_ + "/client.key", dir_ + "/ca.pem"}).ok());
  auto worker = WorkerProcess::Start(address_, {"--name=tls-w0", "--threads=1", ServerTls()[0],
                                                ServerTls()[1], ServerTls()[2], ServerTls()[3]});
  ASSERT_NE(worker, nullptr);

  const std::string with_cert =
      absl::StrCat("DTRAIN_TLS_CA=", dir_, "/ca.pem DTRAIN_TLS_CERT=", dir_,
                   "/client.pem DTRAIN_TLS_KEY=", dir_, "/client.key");
  ASSERT_TRUE(WaitFor(
      [&] {
        return RunShell(Cli(with_cert, "workers")).output.find("tls-w0") != std::string::npos;
      },
      absl::Seconds(15)));
  const std::string job = dir_ + "/job.yaml";
  std::ofstream(job) << R"(name: tls
model: {builtin: mlp}
data:
  synthetic: {train_size: 256, val_size: 64, test_size: 64, seed: 3}
  batch_size: 32
trainer: {max_epochs: 1, strategy: ddp, num_workers: 1, seed: 1}
optimizer: {name: sgd, lr: 0.05}
)";
  CommandResult submitted = RunShell(Cli(with_cert, "submit --wait " + job));
  EXPECT_EQ(submitted.exit_code, 0) << submitted.output;
  EXPECT_THAT(submitted.output, HasSubstr("SUCCEEDED"));

  // Plaintext to a TLS port, a client that cannot verify the server, and a client without a
  // certificate: each refused as unreachable (exit 3), never served.
  for (const std::string& env :
       {std::string(""), absl::StrCat("DTRAIN_TLS_CA=", dir_, "/client.pem"),
        absl::StrCat("DTRAIN_TLS_CA=", dir_, "/ca.pem")}) {
    CommandResult refused = RunShell(Cli(env, "list"));
    EXPECT_EQ(refused.exit_code, 3) << env << "\n" << refused.output;
    EXPECT_THAT(refused.output, Not(HasSubstr("tls-1"))) << env;
    EXPECT_THAT(refused.output, HasSubstr("if it uses TLS, set --tls_ca / DTRAIN_TLS_CA")) << env;
  }
  // A missing CA file is a usage error naming the file.
  CommandResult missing = RunShell(Cli("DTRAIN_TLS_CA=/no/such/ca.pem", "list"));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("cannot read the TLS CA file '/no/such/ca.pem'"));
}

TEST_F(TlsTest, PlaintextBeyondLoopback_RefusedUnlessInsecure) {
  for (const std::string& binary :
       {std::string(DTRAIN_COORDINATOR_BIN),
        std::string(DTRAIN_WORKER_BIN) + " --coordinator=127.0.0.1:1"}) {
    CommandResult refused = RunShell(absl::StrCat(binary, " --listen=0.0.0.0:0"));
    EXPECT_EQ(refused.exit_code, 2) << binary << "\n" << refused.output;
    EXPECT_THAT(refused.output, HasSubstr("refusing to listen on 0.0.0.0:0 without TLS"));
    EXPECT_THAT(refused.output, HasSubstr("--insecure"));
  }
  CommandResult bad =
      RunShell(absl::StrCat(DTRAIN_COORDINATOR_BIN, " --listen=127.0.0.1:0 --tls_cert=", dir_,
                            "/nothing.pem --tls_key=", dir_, "/server.key"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("cannot read the TLS certificate file"));
  // With --insecure it serves.
  EXPECT_GT(StartCoordinator({"--listen=0.0.0.0:0", "--insecure"}), 0);
}

}  // namespace
}  // namespace dtrain::testing
