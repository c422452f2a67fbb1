// Which data plane a job's collectives run on, and connecting it: what `collective_backend`
// in a job spec turns into on each rank. `auto` (the default) takes the fastest plane that
// works: shared memory when every rank is on this host (with the coordinator's plane under it
// for what memory cannot carry: no Gloo is connected), Gloo peer to peer across hosts, and the
// coordinator's gRPC collectives only if Gloo cannot connect its peers, decided by all ranks
// together so that no two ranks ever pick different planes.
//
// Debian's Gloo has no TLS transport, so on a cluster that runs TLS Gloo is used only when the
// operator says the network between workers is trusted (the worker's --trusted_network): auto
// then takes the coordinator's grpc plane (TLS) across hosts, and an explicit gloo is refused.
//
// Thread-safety: a function; the backend it returns is as CollectiveBackend.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/process_group.h"
#include "worker/collectives/collective_backend.h"

namespace dtrain {

struct CollectivePlane {
  std::unique_ptr<CollectiveBackend> backend;
  std::string name;  // shm | gloo | grpc: what carries the gradients
  std::string note;  // why it is not the fastest, when it is not (empty otherwise)
};

// `requested`: "", grpc, gloo, shm or auto. `coordinator` is the address `group` joined;
// `timeout` bounds each collective. Gloo's connections get at most `connect_timeout` (if
// shorter): under auto, peers that cannot reach each other then fall back to grpc; an explicit
// gloo or shm that cannot connect is an error naming the cause. `clear_peer_traffic_allowed` false
// (TLS without --trusted_network): no Gloo, as above. `host`: this rank's machine, as the
// worker's --host names it (empty: the host name); ranks share memory only with the same.
absl::StatusOr<CollectivePlane> ConnectCollectivePlane(
    const std::string& requested, const std::string& coordinator,
    std::unique_ptr<ProcessGroup> group, absl::Duration timeout, absl::Duration connect_timeout,
    bool clear_peer_traffic_allowed = true, const std::string& host = "");

}  // namespace dtrain
