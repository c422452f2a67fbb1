// A c10d::Store over the coordinator's key-value RPCs, so that libtorch's process groups (Gloo)
// rendezvous through the coordinator: no TCPStore, no extra port to open. c10d's Store API
// reports errors by throwing; this class throws c10::Error with the RPC's status in it, and the
// caller (GlooCollectiveBackend) turns that back into a status at its edge.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "client/kv_client.h"

namespace dtrain {

class CoordinatorStore : public c10d::Store {
 public:
  // `client` is scoped (keys of different scopes never meet). A bounded wait lasts at least
  // `min_wait`: Gloo waits for its peers' addresses with its context's timeout, which
  // GlooCollectiveBackend sets to a fifth of its connect budget (Gloo's pairs wait five times
  // that to connect), and the peers' arrival should get the whole budget.
  explicit CoordinatorStore(std::shared_ptr<KeyValueClient> client,
                            std::chrono::milliseconds timeout = kDefaultTimeout,
                            std::chrono::milliseconds min_wait = std::chrono::milliseconds(0));

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  // Waits up to the store's timeout for the key, as c10d's stores do.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<KeyValueClient> client_;
  const std::chrono::milliseconds min_wait_;
};

}  // namespace dtrain
