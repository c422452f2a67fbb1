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
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace tls_e2e_test {

using ::testing::HasSubstr;
using ::testing::Not;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/tls-e2e-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    CommandResult made =
        RunShell(absl::StrCat("bash " DTRAIN_SOURCE_DIR "/deploy/tls/make-test-certs.sh ", dir()));
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }

  const std::string& dir() const { return cluster_->dir(); }
  std::vector<std::string> ServerTls() const {
    return {"--tls_cert=" + dir() + "/server.pem", "--tls_key=" + dir() + "/server.key",
            "--tls_ca=" + dir() + "/ca.pem", "--tls_require_client_cert"};
  }
  CommandResult Cli(const std::string& env, const std::string& args) {
    return cluster_->Dtrain("--timeout=5s " + args, env);
  }

  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(TlsTest, MutualTlsCluster_RunsAJob_RefusesClientsWithoutCaOrCertificate) {
  // This test process talks to the coordinator and the worker too (LocalCluster's stubs,
  // WorkerProcess checking that it serves): as a client with the client certificate.
  ASSERT_TRUE(
      ConfigureClientTls({dir() + "/client.pem", dir() + "/client.key", dir() + "/ca.pem"}).ok());
  ASSERT_TRUE(cluster_->StartCoordinator("127.0.0.1:0", ServerTls()));
  ASSERT_TRUE(cluster_->AddWorker("tls-w0", ServerTls()));
  ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 1; }, absl::Seconds(15)));

  const std::string with_cert =
      absl::StrCat("DTRAIN_TLS_CA=", dir(), "/ca.pem DTRAIN_TLS_CERT=", dir(),
                   "/client.pem DTRAIN_TLS_KEY=", dir(), "/client.key");
  EXPECT_THAT(Cli(with_cert, "workers").output, HasSubstr("tls-w0"));
  const std::string job = cluster_->WriteSpec("job", R"(name: tls
model: {builtin: mlp}
data:
  synthetic: {train_size: 256, val_size: 64, test_size: 64, seed: 3}
  batch_size: 32
trainer: {max_epochs: 1, strategy: ddp, num_nodes: 1}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05}
)");
  CommandResult submitted = Cli(with_cert, "fit --wait --config " + job);
  EXPECT_EQ(submitted.exit_code, 0) << submitted.output;
  EXPECT_THAT(submitted.output, HasSubstr("SUCCEEDED"));

  // Plaintext to a TLS port, a client that cannot verify the server, and a client without a
  // certificate: each refused as unreachable (exit 3), never served.
  for (const std::string& env :
       {std::string(""), absl::StrCat("DTRAIN_TLS_CA=", dir(), "/client.pem"),
        absl::StrCat("DTRAIN_TLS_CA=", dir(), "/ca.pem")}) {
    CommandResult refused = Cli(env, "list");
    EXPECT_EQ(refused.exit_code, 3) << env << "\n" << refused.output;
    EXPECT_THAT(refused.output, Not(HasSubstr("tls-1"))) << env;
    EXPECT_THAT(refused.output, HasSubstr("if it uses TLS, set --tls_ca / DTRAIN_TLS_CA")) << env;
  }
  // A missing CA file is a usage error naming the file.
  CommandResult missing = Cli("DTRAIN_TLS_CA=/no/such/ca.pem", "list");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("cannot read the TLS CA file '/no/such/ca.pem'"));
}

// Gloo has no encryption (issue 38): on a TLS cluster, gradients travel between workers in clear
// only when every worker says the network is trusted. Without that, auto takes the TLS planes
// and says why, and an explicit gloo is refused naming the flag; with it, gloo runs.
TEST_F(TlsTest, GlooOnlyWithTrustedNetwork_AutoTakesTheTlsPlanesAndSaysWhy) {
  ASSERT_TRUE(
      ConfigureClientTls({dir() + "/client.pem", dir() + "/client.key", dir() + "/ca.pem"}).ok());
  ASSERT_TRUE(cluster_->StartCoordinator("127.0.0.1:0", ServerTls()));
  // Two "hosts" (--host): on one, the ranks would share memory and Gloo would not matter.
  auto on_host = [&](const std::string& host) {
    std::vector<std::string> flags = ServerTls();
    flags.push_back("--host=" + host);
    return flags;
  };
  ASSERT_TRUE(cluster_->AddWorker("tls-w0", on_host("tls-host0")));
  ASSERT_TRUE(cluster_->AddWorker("tls-w1", on_host("tls-host1")));
  ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 2; }, absl::Seconds(15)));
  const std::string with_cert =
      absl::StrCat("DTRAIN_TLS_CA=", dir(), "/ca.pem DTRAIN_TLS_CERT=", dir(),
                   "/client.pem DTRAIN_TLS_KEY=", dir(), "/client.key");
  auto spec = [&](const std::string& name, const std::string& plane) {
    return cluster_->WriteSpec(name, absl::StrCat("name: ", name, R"(
model: {builtin: mlp}
data:
  synthetic: {train_size: 256, val_size: 64, test_size: 64, seed: 3}
  batch_size: 32
trainer: {max_epochs: 1, strategy: ddp, num_nodes: 2, collective_backend: )",
                                                  plane, R"(}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05}
)"));
  };
  CommandResult gloo = Cli(with_cert, "fit --wait --config " + spec("clear", "gloo"));
  EXPECT_NE(gloo.exit_code, 0) << gloo.output;
  EXPECT_THAT(gloo.output, HasSubstr("would carry gradients between workers in clear"));
  EXPECT_THAT(gloo.output, HasSubstr("--trusted_network"));
  CommandResult automatic = Cli(with_cert, "fit --wait --config " + spec("tls-auto", "auto"));
  EXPECT_EQ(automatic.exit_code, 0) << automatic.output;
  CommandResult log = Cli(with_cert, "logs tls-auto-1");
  EXPECT_THAT(log.output, HasSubstr("Gloo is not used: this cluster runs TLS")) << log.output;

  LocalCluster trusted(dir() + "/trusted");
  ASSERT_TRUE(trusted.StartCoordinator("127.0.0.1:0", ServerTls()));
  std::vector<std::string> flags = ServerTls();
  flags.push_back("--trusted_network");
  ASSERT_TRUE(trusted.AddWorker("trusted-w0", flags));
  ASSERT_TRUE(trusted.AddWorker("trusted-w1", flags));
  ASSERT_TRUE(WaitFor([&] { return trusted.AliveWorkers() == 2; }, absl::Seconds(15)));
  CommandResult opted =
      trusted.Dtrain("--timeout=5s fit --wait --config " + spec("opted", "gloo"), with_cert);
  EXPECT_EQ(opted.exit_code, 0) << opted.output;
  CommandResult opted_log = trusted.Dtrain("--timeout=5s logs opted-1", with_cert);
  EXPECT_THAT(opted_log.output, Not(HasSubstr("Gloo is not used"))) << opted_log.output;
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
      RunShell(absl::StrCat(DTRAIN_COORDINATOR_BIN, " --listen=127.0.0.1:0 --tls_cert=", dir(),
                            "/nothing.pem --tls_key=", dir(), "/server.key"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("cannot read the TLS certificate file"));
  // With --insecure it serves.
  EXPECT_TRUE(cluster_->StartCoordinator("0.0.0.0:0", {"--insecure"}));
}

}  // namespace tls_e2e_test
}  // namespace dtrain::testing
