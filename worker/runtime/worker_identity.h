// What a worker daemon knows about itself (its flags, mostly): passed to every job it hosts,
// which uses it to join the job's group and to spawn ddp_spawn children like itself.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

// What the daemon knows about itself, used to join the job's group.
struct WorkerIdentity {
  std::string name;                  // the worker's name (order key of its ranks on the host)
  std::string host;                  // --host: the machine's name in the rendezvous and for shm
  std::string coordinator;           // default coordinator address when the request names none
  int devices = 1;                   // --devices
  int threads = 0;                   // --threads, passed on to ddp_spawn children
  std::vector<int> cpus;             // --cpus: the step thread's cores (empty: not pinned)
  std::vector<std::string> plugins;  // --plugin libraries, loaded by ddp_spawn children too
  // --trusted_network: with TLS to the coordinator, Gloo may still carry gradients in clear.
  bool trusted_network = false;
  // Files rank children must not read (the worker's --token_file): covered by an empty file in
  // each child's own mount namespace.
  std::vector<std::string> hidden_files;
  // --cache_dir and --cache_bytes: a rank child's cache is <cache_dir>/child-<i>.
  std::string cache_dir;
  int64_t cache_bytes = 0;
  // An uploaded file ("sha256:<hex>") as a local path: the daemon's artifact cache, which a
  // job's streamed shards go through one by one. Unset in a process without one.
  std::function<absl::StatusOr<std::string>(const std::string& digest)> fetch_artifact;
};

}  // namespace dtrain
