// GroupTable: rendezvous, membership, generations and liveness of every group the coordinator
// knows. It knows nothing of gRPC and nothing of collectives; what other parts must learn
// (a group failed, a member left, a generation ended) it reports through GroupEvents, always
// outside its lock.
//
// Thread-safety: every method may be called from any thread. Completion callbacks run on the
// calling thread of whichever method completed them, never under the table's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/key_page.h"
#include "dtrain/v1/coordinator.pb.h"

namespace dtrain {

inline constexpr size_t kRetainedEndedGroups = 256;

struct GroupTableOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A member silent for this long is declared dead and its group fails.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  absl::Duration default_collective_timeout = absl::Minutes(10);
  absl::Duration default_register_timeout = absl::Minutes(5);
  // The time registrations and heartbeats are stamped with (deadlines are checked by Tick).
  Clock clock = absl::Now;
};

// Callbacks to the rest of the coordinator. Each is optional.
struct GroupEvents {
  // The generation failed (a member died); `reason` is ABORTED and names the member.
  std::function<void(const std::string& group, int64_t generation, const absl::Status& reason)>
      failed;
  // `rank` left cleanly; `who` describes it ("rank 2 (host h)").
  std::function<void(const std::string& group, int64_t generation, int rank,
                     const std::string& who)>
      member_left;
  // No live member of the generation remains: its state may be dropped.
  std::function<void(const std::string& group, int64_t generation)> ended;
};

// What a collective needs to know about the caller's group.
struct MemberView {
  std::string group;
  int64_t generation = 0;
  int rank = 0;
  int world_size = 0;
  // By rank; fixed once the group forms and shared, so a check costs no copies.
  std::shared_ptr<const std::vector<std::string>> member_labels;
  absl::Duration collective_timeout;
};

// "worker 'w1' on host a" (or "host a" for a member without a name): how errors name a member.
std::string MemberLabel(const v1::MemberInfo& info);

// A member's RegisterResponse in two parts: its own fields, and the group's member list, encoded
// once and shared by every member's answer. Each answer lists every member, so a group of N
// would otherwise build and hold N² entries (about 9 GB at 4,096 members with the longest
// names); protobuf's wire format lets the service send the two parts one after the other as
// one message.
struct RegisterAnswer {
  v1::RegisterResponse own;  // every field but `members`
  // RegisterResponse.members (field 12), encoded: a RegisterResponse holding only them.
  std::shared_ptr<const std::string> members;
  // The answer as one message (in-process callers and tests).
  absl::StatusOr<v1::RegisterResponse> Whole() const;
};

class GroupTable {
 public:
  using RegisterDone = std::function<void(absl::StatusOr<RegisterAnswer>)>;

  GroupTable(GroupTableOptions options, GroupEvents events);

  // Joins a group; `done` runs once, when the group forms or the registration fails.
  // Error codes: see Register in coordinator.proto.
  void Register(const v1::RegisterRequest& request, RegisterDone done);

  // The registering process went away (its call was cancelled): forget its registration.
  void CancelRegistration(const std::string& group, uint64_t incarnation);

  // NOT_FOUND, FAILED_PRECONDITION (other generation or incarnation, left), ABORTED (failed).
  absl::StatusOr<MemberView> CheckMember(const v1::MemberRef& member) const;

  // Same errors as CheckMember; records the member as alive. Once stopped, FAILED_PRECONDITION
  // "the coordinator is shutting down", so that members on the Gloo and shared-memory planes
  // (whose collectives do not pass through here) end at once rather than after the heartbeat
  // timeout of silence.
  absl::Status Heartbeat(const v1::MemberRef& member);

  // Same errors as CheckMember, except that leaving a failed group is allowed.
  absl::Status Leave(const v1::MemberRef& member);

  // Expires registrations, forms settled elastic groups, declares silent members dead. Returns
  // whether registrations still wait for their group to form (each with a deadline a later
  // tick enforces).
  bool Tick(absl::Time now);

  // Fails every pending registration with UNAVAILABLE.
  void Stop();
  // After Stop: waits until every live member of a formed group has been told of the shutdown
  // by a heartbeat, or for `timeout`. Returns the members not told (0 when all were).
  int AwaitMembersTold(absl::Duration timeout);

  // By group id; with `page`, the groups it holds.
  std::vector<v1::GroupInfo> List(KeyPage* page = nullptr) const;
  // How many groups are in each state (the /metrics gauge), without copying their members.
  std::map<v1::GroupState, int> CountByState() const;
  // Members declared dead for missing heartbeats since start.
  int64_t heartbeat_deaths() const;

  const GroupTableOptions& options() const { return options_; }

 private:
  struct Pending {
    std::string host;
    std::string order_key;
    std::string name;
    int local_devices = 0;
    uint64_t incarnation = 0;
    absl::Time deadline;
    RegisterDone done;
  };
  struct Member {
    v1::MemberInfo info;
    absl::Time last_heartbeat;
    bool left = false;
    bool dead = false;
    bool told_shutdown = false;
  };
  struct Group {
    std::string id;
    int64_t generation = 0;
    v1::GroupState state = v1::GROUP_STATE_FORMING;
    int world_size = 0;
    int min_world_size = 0;
    absl::Duration settle_timeout;
    absl::Duration collective_timeout;
    absl::Time last_join;
    std::vector<Pending> pending;  // while forming, in arrival order
    std::vector<Member> members;   // once formed, by rank
    std::shared_ptr<const std::vector<std::string>> member_labels;  // once formed, by rank
    std::string failure;
    // A forming group's members that time out together are one event: one warning, the rest
    // at debug, until the group has no member waiting again.
    bool timeout_logged = false;
    // Its place in ended_, while it has one: a group is listed there once, at its latest end.
    std::optional<std::list<std::string>::iterator> ended_at;
  };
  using Completion = std::function<void()>;

  absl::Status ValidateRegister(const v1::RegisterRequest& request) const;
  // Assigns ranks to the pending members and activates the group.
  void Form(Group& group, absl::Time now, std::vector<Completion>& completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(Group& group, const std::string& reason, std::vector<Completion>& completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the generation's engine state when no live member remains.
  void MaybeEnd(Group& group, std::vector<Completion>& completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the oldest over-retained ended groups (called where groups are added, never while
  // a Group reference is held).
  void EvictEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts `g` last in ended_ (taking it from where it was): the retention counts groups, so a
  // group ending again and again cannot push the others' records out.
  void NoteEndedLocked(Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A forming generation whose every registrant left (cancelled or timed out) holds nobody, and
  // a stream of such group ids would grow the table without bound. A first generation is
  // forgotten, as if never registered (the next registration starts generation 1 again); a
  // later one is over, and retained as ended groups are. Returns the iterator after `it`.
  std::map<std::string, Group>::iterator ForgetAbandonedLocked(
      std::map<std::string, Group>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<const Member*> FindMember(const v1::MemberRef& ref, bool allow_failed) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  static std::string Describe(const Member& member);
  int MembersNotToldLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  static void Run(std::vector<Completion>& completions);

  const GroupTableOptions options_;
  const GroupEvents events_;
  mutable absl::Mutex mu_;
  std::map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  int64_t heartbeat_deaths_ ABSL_GUARDED_BY(mu_) = 0;
  // Groups in the order their generations ended, each once (at its latest end); the table keeps
  // the newest
  // kRetainedEndedGroups of them (for ListGroups and for "generation N is over" answers), so a
  // long-lived coordinator's memory does not grow with every job it ever ran.
  std::list<std::string> ended_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dtrain
