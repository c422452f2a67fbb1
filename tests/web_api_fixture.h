// The fixture of the tests of the dashboard's HTTP JSON API (web_api_test.cc: routes and reads;
// web_api_auth_test.cc: tokens, sessions and TLS; web_api_attacks_test.cc: hostile sites and
// clients): a coordinator of a real local cluster serving /api/v1/ on 127.0.0.1 and an HTTP
// client to it, and the API's JSON read back as protobuf messages.
#pragma once

#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "tests/local_cluster.h"

// A named (inline) namespace, not an anonymous one: the three files' tests are in the suite
// WebApiTest of one test executable, so they must share one fixture type.
namespace dtrain::testing {
inline namespace web_api_fixture {

template <typename Message>
inline Message Parse(const std::string& json) {
  Message out;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &out).ok()) << json;
  return out;
}

// {"error": {"code": ..., "message": ...}}: the code.
inline std::string ErrorCode(const std::string& json) {
  google::protobuf::Struct out = Parse<google::protobuf::Struct>(json);
  if (out.fields().count("error") == 0) return "";
  return out.fields().at("error").struct_value().fields().at("code").string_value();
}

class WebApiTest : public ::testing::Test {
 protected:
  // `seed`, when given, writes into the state directory (<dir>/state) before the coordinator
  // starts on it, as an earlier run of the coordinator would have.
  void Start(const std::vector<std::string>& flags = {},
             const std::function<void(const std::string& state_dir)>& seed = nullptr) {
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/web-api-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    if (seed) {
      ASSERT_NO_FATAL_FAILURE(seed(cluster_->dir() + "/state"));
    }
    std::vector<std::string> all = {"--http_listen=127.0.0.1:0",
                                    "--http_port_file=" + cluster_->dir() + "/http.port"};
    all.insert(all.end(), flags.begin(), flags.end());
    ASSERT_TRUE(cluster_->StartCoordinator("127.0.0.1:0", all));
    port_ = WaitForPortFile(cluster_->dir() + "/http.port", absl::Seconds(5));
    ASSERT_GT(port_, 0);
    http_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    http_->set_read_timeout(10, 0);
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<httplib::Client> http_;
  int port_ = 0;
};

}  // namespace web_api_fixture
}  // namespace dtrain::testing
