#include "coordinator/collectives/group_table.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/log.h"

namespace dtrain {
namespace {

// Every member's RegisterResponse lists every member, up to ~550 bytes each with the longest
// host and name: 4,096 keep one answer under 2.3 MB, within a default client's 4 MiB. The
// group's N answers share one encoding of that list (RegisterAnswer).
constexpr int kMaxWorldSize = kMostGroupRanks;
constexpr size_t kMaxNameBytes = 256;

int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

std::string StateName(v1::GroupState state) {
  switch (state) {
    case v1::GROUP_STATE_FORMING:
      return "forming";
    case v1::GROUP_STATE_ACTIVE:
      return "active";
    case v1::GROUP_STATE_FAILED:
      return "failed";
    case v1::GROUP_STATE_ENDED:
      return "ended";
    default:
      return "unknown";
  }
}

}  // namespace

std::string MemberLabel(const v1::MemberInfo& info) {
  if (info.name().empty()) return absl::StrCat("host ", info.host());
  return absl::StrCat("worker '", info.name(), "' on host ", info.host());
}

GroupTable::GroupTable(GroupTableOptions options, GroupEvents events)
    : options_(std::move(options)), events_(std::move(events)) {}

void GroupTable::Run(std::vector<Completion>& completions) {
  for (Completion& c : completions) {
    c();
    c = nullptr;  // what it captured (a formed group's answer) goes now, not after the rest
  }
  completions.clear();
}

std::string GroupTable::Describe(const Member& member) {
  return absl::StrCat("rank ", member.info.rank(), " (", MemberLabel(member.info), ")");
}

absl::Status GroupTable::ValidateRegister(const v1::RegisterRequest& r) const {
  if (r.group().empty()) return absl::InvalidArgumentError("register: group id is empty");
  if (r.group().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("register: group id is ", r.group().size(),
                                                   " bytes; at most ", kMaxNameBytes));
  }
  if (r.host().empty()) return absl::InvalidArgumentError("register: host name is empty");
  if (r.host().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError("register: host name is longer than 256 bytes");
  }
  if (r.name().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError("register: name is longer than 256 bytes");
  }
  if (r.order_key().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError("register: order_key is longer than 256 bytes");
  }
  if (r.local_devices() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: local_devices must be at least 1, got ", r.local_devices()));
  }
  if (r.incarnation() == 0) {
    return absl::InvalidArgumentError("register: incarnation must be a non-zero random id");
  }
  if (r.world_size() < 1 || r.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("register: world_size must be in [1, ",
                                                   kMaxWorldSize, "], got ", r.world_size()));
  }
  if (r.min_world_size() < 0 || r.min_world_size() > r.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: min_world_size must be in [0, world_size=", r.world_size(),
                     "], got ", r.min_world_size()));
  }
  if (r.settle_timeout_ms() < 0 || r.timeout_ms() < 0 || r.collective_timeout_ms() < 0 ||
      r.generation() < 0) {
    return absl::InvalidArgumentError("register: timeouts and generation must not be negative");
  }
  return absl::OkStatus();
}

void GroupTable::Register(const v1::RegisterRequest& request, RegisterDone done) {
  if (absl::Status s = ValidateRegister(request); !s.ok()) return done(s);
  const absl::Time now = options_.clock();
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      completions.push_back(
          [done] { done(absl::UnavailableError("the coordinator is shutting down")); });
    } else {
      EvictEndedLocked();
      auto [it, inserted] = groups_.try_emplace(request.group());
      Group& g = it->second;
      const int min_size =
          request.min_world_size() == 0 ? request.world_size() : request.min_world_size();
      const absl::Duration settle = absl::Milliseconds(request.settle_timeout_ms());
      absl::Status error;
      if (!inserted && request.generation() != 0 && request.generation() < g.generation) {
        error = absl::FailedPreconditionError(absl::StrCat(
            "group '", g.id, "' is at generation ", g.generation, "; generation ",
            request.generation(), " is over. Register with generation 0 to join the current one"));
      } else if (!inserted &&
                 (g.state == v1::GROUP_STATE_ACTIVE || g.state == v1::GROUP_STATE_FORMING) &&
                 request.generation() > g.generation) {
        error = absl::FailedPreconditionError(
            absl::StrCat("group '", g.id, "' is at generation ", g.generation, "; generation ",
                         request.generation(), " does not exist yet"));
      } else if (!inserted && g.state == v1::GROUP_STATE_ACTIVE) {
        for (const Member& m : g.members) {
          if (m.info.incarnation() == request.incarnation()) {
            error = absl::AlreadyExistsError(
                absl::StrCat("this process (incarnation ", request.incarnation(), ") is already ",
                             Describe(m), " of group '", g.id, "' generation ", g.generation));
          }
        }
        if (error.ok()) {
          error = absl::FailedPreconditionError(absl::StrCat(
              "group '", g.id, "' generation ", g.generation, " is full: all ", g.members.size(),
              " ranks are registered and running. Use another group id, or "
              "wait until its members leave"));
        }
      }
      if (error.ok()) {
        if (inserted || g.state == v1::GROUP_STATE_FAILED || g.state == v1::GROUP_STATE_ENDED) {
          // A new generation starts; the old one's members hear "superseded" from now on.
          g.id = request.group();
          g.generation += 1;
          g.state = v1::GROUP_STATE_FORMING;
          g.world_size = request.world_size();
          g.min_world_size = min_size;
          g.settle_timeout = settle;
          g.collective_timeout = request.collective_timeout_ms() > 0
                                     ? absl::Milliseconds(request.collective_timeout_ms())
                                     : options_.default_collective_timeout;
          g.pending.clear();
          g.members.clear();
          g.failure.clear();
          g.timeout_logged = false;
        } else if (g.world_size != request.world_size() || g.min_world_size != min_size ||
                   g.settle_timeout != settle) {
          error = absl::FailedPreconditionError(absl::StrCat(
              "group '", g.id, "' is forming with world_size ", g.world_size, ", min_world_size ",
              g.min_world_size, ", settle_timeout_ms ", Millis(g.settle_timeout),
              "; this registration asks for ", request.world_size(), ", ", min_size, ", ",
              request.settle_timeout_ms(), ". Every member must ask for the same sizes"));
        } else {
          for (const Pending& p : g.pending) {
            if (p.incarnation == request.incarnation()) {
              error = absl::AlreadyExistsError(absl::StrCat(
                  "this process (incarnation ", request.incarnation(), ", host ", p.host,
                  ") already registered into group '", g.id, "' and is waiting for it to form"));
            }
          }
        }
      }
      if (!error.ok()) {
        completions.push_back([done, error] { done(error); });
      } else {
        const absl::Duration timeout = request.timeout_ms() > 0
                                           ? absl::Milliseconds(request.timeout_ms())
                                           : options_.default_register_timeout;
        g.pending.push_back(Pending{request.host(), request.order_key(), request.name(),
                                    request.local_devices(), request.incarnation(), now + timeout,
                                    std::move(done)});
        g.last_join = now;
        if (static_cast<int>(g.pending.size()) == g.world_size) Form(g, now, completions);
      }
    }
  }
  Run(completions);
}

absl::StatusOr<v1::RegisterResponse> RegisterAnswer::Whole() const {
  v1::RegisterResponse whole = own;
  if (members != nullptr && !whole.MergeFromString(*members)) {
    return absl::InternalError("a register answer's member list does not parse");
  }
  return whole;
}

void GroupTable::Form(Group& g, absl::Time now, std::vector<Completion>& completions) {
  // Node ranks order hosts by name; ranks are contiguous per host, ordered within it by the
  // members' order keys and then by arrival, so that local ranks are dense, a host's ranks
  // are neighbours (as torchrun does), and a worker's spawned ranks follow their indices.
  std::vector<size_t> order(g.pending.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Pending& x = g.pending[a];
    const Pending& y = g.pending[b];
    return x.host != y.host ? x.host < y.host : x.order_key < y.order_key;
  });
  g.members.assign(order.size(), Member{});
  int node_rank = -1;
  int local_rank = 0;
  std::string previous_host;
  for (size_t rank = 0; rank < order.size(); ++rank) {
    const Pending& p = g.pending[order[rank]];
    if (rank == 0 || p.host != previous_host) {
      ++node_rank;
      local_rank = 0;
      previous_host = p.host;
    }
    Member& m = g.members[rank];
    m.info.set_rank(static_cast<int>(rank));
    m.info.set_local_rank(local_rank++);
    m.info.set_node_rank(node_rank);
    m.info.set_host(p.host);
    m.info.set_name(p.name);
    m.info.set_local_devices(p.local_devices);
    m.info.set_incarnation(p.incarnation);
    m.last_heartbeat = now;
  }
  const int num_nodes = node_rank + 1;
  // Members are contiguous per host: one pass counts each node's.
  std::vector<int> node_members(num_nodes, 0);
  for (const Member& m : g.members) ++node_members[m.info.node_rank()];
  auto labels = std::make_shared<std::vector<std::string>>();
  for (const Member& m : g.members) labels->push_back(MemberLabel(m.info));
  g.member_labels = std::move(labels);
  g.state = v1::GROUP_STATE_ACTIVE;
  g.world_size = static_cast<int>(g.members.size());
  // The member list is encoded once, by the first completion to run: outside the table's lock
  // (completions run after it), so forming a large group does not stall every other group's
  // heartbeats, and once for all N answers, which share it.
  struct Encoded {
    std::vector<v1::MemberInfo> members;
    std::once_flag once;
    std::shared_ptr<const std::string> bytes;
    std::shared_ptr<const std::string> Get() {
      std::call_once(once, [this] {
        v1::RegisterResponse only;
        only.mutable_members()->Reserve(static_cast<int>(members.size()));
        for (v1::MemberInfo& info : members) *only.add_members() = std::move(info);
        std::vector<v1::MemberInfo>().swap(members);
        bytes = std::make_shared<const std::string>(only.SerializeAsString());
      });
      return bytes;
    }
  };
  auto encoded = std::make_shared<Encoded>();
  encoded->members.reserve(g.members.size());
  for (const Member& m : g.members) encoded->members.push_back(m.info);
  for (size_t rank = 0; rank < order.size(); ++rank) {
    Pending& p = g.pending[order[rank]];
    const Member& m = g.members[rank];
    v1::RegisterResponse response;
    response.mutable_member()->set_group(g.id);
    response.mutable_member()->set_generation(g.generation);
    response.mutable_member()->set_rank(m.info.rank());
    response.mutable_member()->set_incarnation(m.info.incarnation());
    response.set_rank(m.info.rank());
    response.set_local_rank(m.info.local_rank());
    response.set_node_rank(m.info.node_rank());
    response.set_world_size(g.world_size);
    response.set_local_world_size(node_members[m.info.node_rank()]);
    response.set_num_nodes(num_nodes);
    response.set_generation(g.generation);
    response.set_heartbeat_interval_ms(Millis(options_.heartbeat_interval));
    response.set_heartbeat_timeout_ms(Millis(options_.heartbeat_timeout));
    response.set_collective_timeout_ms(Millis(g.collective_timeout));
    completions.push_back(
        [done = std::move(p.done), response = std::move(response), encoded]() mutable {
          done(RegisterAnswer{std::move(response), encoded->Get()});
        });
  }
  g.pending.clear();
  LogInfo(absl::StrCat("group '", g.id, "' formed"), {{"group", g.id},
                                                      {"generation", g.generation},
                                                      {"world_size", g.world_size},
                                                      {"num_nodes", num_nodes}});
}

void GroupTable::CancelRegistration(const std::string& group, uint64_t incarnation) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group);
    if (it == groups_.end() || it->second.state != v1::GROUP_STATE_FORMING) return;
    auto& pending = it->second.pending;
    for (auto p = pending.begin(); p != pending.end(); ++p) {
      if (p->incarnation == incarnation) {
        completions.push_back([done = std::move(p->done)] {
          done(absl::CancelledError("registration cancelled by the client"));
        });
        pending.erase(p);
        break;
      }
    }
    ForgetAbandonedLocked(it);
  }
  Run(completions);
}

std::map<std::string, GroupTable::Group>::iterator GroupTable::ForgetAbandonedLocked(
    std::map<std::string, Group>::iterator it) {
  Group& g = it->second;
  if (g.state != v1::GROUP_STATE_FORMING || !g.pending.empty()) return std::next(it);
  if (g.generation <= 1) {
    if (g.ended_at.has_value()) ended_.erase(*g.ended_at);  // none: it never ended; kept exact
    LogDebug(absl::StrCat("group '", g.id, "' forgotten: every registrant left before it formed"),
             {{"group", g.id}});
    return groups_.erase(it);
  }
  g.state = v1::GROUP_STATE_ENDED;
  LogDebug(absl::StrCat("group '", g.id, "' generation ", g.generation,
                        " is over: every registrant left before it formed"),
           {{"group", g.id}, {"generation", g.generation}});
  NoteEndedLocked(g);
  return std::next(it);
}

absl::StatusOr<const GroupTable::Member*> GroupTable::FindMember(const v1::MemberRef& ref,
                                                                 bool allow_failed) const {
  auto it = groups_.find(ref.group());
  if (ref.group().empty()) return absl::InvalidArgumentError("member ref has an empty group id");
  if (it == groups_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no group '", ref.group(), "' on this coordinator; register first"));
  }
  const Group& g = it->second;
  if (ref.generation() != g.generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", g.id, "' is at generation ", g.generation, " (", StateName(g.state),
                     "); this member belongs to generation ", ref.generation(),
                     ", which is over. Register again"));
  }
  if (g.state == v1::GROUP_STATE_FORMING) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", g.id, "' generation ", g.generation, " has not formed yet"));
  }
  if (ref.rank() < 0 || ref.rank() >= static_cast<int>(g.members.size())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", ref.rank(),
                                                   " is out of range for group '", g.id,
                                                   "' of world size ", g.members.size()));
  }
  const Member& m = g.members[ref.rank()];
  if (m.info.incarnation() != ref.incarnation()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(m), " of group '", g.id, "' is held by incarnation ",
                     m.info.incarnation(), ", not by the caller's ", ref.incarnation()));
  }
  if (g.state == v1::GROUP_STATE_FAILED && !allow_failed) return absl::AbortedError(g.failure);
  if (g.state == v1::GROUP_STATE_ENDED || m.left) {
    return absl::FailedPreconditionError(absl::StrCat(Describe(m), " has left group '", g.id, "'"));
  }
  return &m;
}

absl::StatusOr<MemberView> GroupTable::CheckMember(const v1::MemberRef& member) const {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<const Member*> found = FindMember(member, /*allow_failed=*/false);
  if (!found.ok()) return found.status();
  const Group& g = groups_.at(member.group());
  MemberView view;
  view.group = g.id;
  view.generation = g.generation;
  view.rank = member.rank();
  view.world_size = g.world_size;
  view.collective_timeout = g.collective_timeout;
  view.member_labels = g.member_labels;
  return view;
}

absl::Status GroupTable::Heartbeat(const v1::MemberRef& member) {
  absl::MutexLock lock(&mu_);
  if (stopped_) {
    // gRPC answers UNAVAILABLE once the server stops, which a member takes for transport
    // trouble and waits out for the heartbeat timeout; this answer is a verdict at once.
    absl::StatusOr<const Member*> found = FindMember(member, /*allow_failed=*/true);
    if (found.ok()) {
      const_cast<Member*>(*found)->told_shutdown = true;
      // A group that failed just before keeps its reason: it names the dead peer.
      const Group& g = groups_.at(member.group());
      if (g.state == v1::GROUP_STATE_FAILED) return absl::AbortedError(g.failure);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator is shutting down; group '", member.group(),
        "' ends with it (groups live in the coordinator's memory): register again once a "
        "coordinator is back"));
  }
  absl::StatusOr<const Member*> found = FindMember(member, /*allow_failed=*/false);
  if (!found.ok()) return found.status();
  const_cast<Member*>(*found)->last_heartbeat = options_.clock();
  return absl::OkStatus();
}

absl::Status GroupTable::Leave(const v1::MemberRef& member) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<const Member*> found = FindMember(member, /*allow_failed=*/true);
    if (!found.ok()) return found.status();
    Member* m = const_cast<Member*>(*found);
    Group& g = groups_.at(member.group());
    // A member declared dead already counted as gone: the group ended (or will) without it, and
    // its ended event must not fire twice.
    const bool counted_gone = m->dead;
    m->left = true;
    if (g.state == v1::GROUP_STATE_ACTIVE && events_.member_left) {
      completions.push_back([this, id = g.id, gen = g.generation, rank = m->info.rank(),
                             who = Describe(*m)] { events_.member_left(id, gen, rank, who); });
    }
    if (!counted_gone) MaybeEnd(g, completions);
  }
  Run(completions);
  return absl::OkStatus();
}

void GroupTable::EvictEndedLocked() {
  while (ended_.size() > kRetainedEndedGroups) {
    auto it = groups_.find(ended_.front());
    ended_.pop_front();
    if (it == groups_.end()) continue;
    Group& g = it->second;
    g.ended_at.reset();
    // Only if it is still over: the id may have started a new generation since.
    const bool over = (g.state == v1::GROUP_STATE_ENDED || g.state == v1::GROUP_STATE_FAILED) &&
                      g.pending.empty() &&
                      std::all_of(g.members.begin(), g.members.end(),
                                  [](const Member& m) { return m.left || m.dead; });
    if (over) groups_.erase(it);
  }
}

void GroupTable::NoteEndedLocked(Group& g) {
  if (g.ended_at.has_value()) ended_.erase(*g.ended_at);
  g.ended_at = ended_.insert(ended_.end(), g.id);
}

void GroupTable::MaybeEnd(Group& g, std::vector<Completion>& completions) {
  for (const Member& m : g.members) {
    if (!m.left && !m.dead) return;
  }
  if (g.state == v1::GROUP_STATE_ACTIVE) {
    g.state = v1::GROUP_STATE_ENDED;
    LogDebug(absl::StrCat("group '", g.id, "' ended: every member left"),
             {{"group", g.id}, {"generation", g.generation}});
  }
  NoteEndedLocked(g);
  if (events_.ended) {
    completions.push_back([this, id = g.id, gen = g.generation] { events_.ended(id, gen); });
  }
}

void GroupTable::Fail(Group& g, const std::string& reason, std::vector<Completion>& completions) {
  g.state = v1::GROUP_STATE_FAILED;
  g.failure = reason;
  LogWarning(reason, {{"group", g.id}, {"generation", g.generation}});
  if (events_.failed) {
    completions.push_back([this, id = g.id, gen = g.generation, reason] {
      events_.failed(id, gen, absl::AbortedError(reason));
    });
  }
  MaybeEnd(g, completions);
}

bool GroupTable::Tick(absl::Time now) {
  std::vector<Completion> completions;
  bool waiting = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = groups_.begin(); it != groups_.end();) {
      Group& g = it->second;
      if (g.state == v1::GROUP_STATE_FORMING) {
        for (auto p = g.pending.begin(); p != g.pending.end();) {
          if (now < p->deadline) {
            ++p;
            continue;
          }
          std::vector<std::string> hosts;
          for (const Pending& q : g.pending) hosts.push_back(q.host);
          std::string message =
              absl::StrCat("group '", g.id, "' did not form in time: ", g.pending.size(), " of ",
                           g.world_size, " members registered (hosts: ", absl::StrJoin(hosts, ", "),
                           "); start the missing workers or lower world_size");
          Log(g.timeout_logged ? LogLevel::kDebug : LogLevel::kWarning, message, {{"group", g.id}});
          g.timeout_logged = true;
          completions.push_back([done = std::move(p->done), message = std::move(message)] {
            done(absl::DeadlineExceededError(message));
          });
          p = g.pending.erase(p);
        }
        if (g.pending.empty()) g.timeout_logged = false;
        const bool elastic = g.min_world_size < g.world_size;
        if (elastic && static_cast<int>(g.pending.size()) >= g.min_world_size &&
            now - g.last_join >= g.settle_timeout) {
          Form(g, now, completions);
        }
        waiting = waiting || (g.state == v1::GROUP_STATE_FORMING && !g.pending.empty());
        it = ForgetAbandonedLocked(it);
        continue;
      }
      if (g.state == v1::GROUP_STATE_ACTIVE) {
        for (Member& m : g.members) {
          if (m.left || now - m.last_heartbeat <= options_.heartbeat_timeout) continue;
          m.dead = true;
          ++heartbeat_deaths_;
          Fail(g,
               absl::StrCat(
                   Describe(m), " of group '", g.id, "' generation ", g.generation,
                   " is dead: no heartbeat for ",
                   absl::FormatDuration(absl::Trunc(now - m.last_heartbeat, absl::Milliseconds(1))),
                   " (timeout ", absl::FormatDuration(options_.heartbeat_timeout),
                   "); every collective of this group now fails"),
               completions);
          break;
        }
      }
      ++it;
    }
  }
  Run(completions);
  return waiting;
}

void GroupTable::Stop() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (auto& [id, g] : groups_) {
      for (Pending& p : g.pending) {
        completions.push_back([done = std::move(p.done)] {
          done(absl::UnavailableError("the coordinator is shutting down"));
        });
      }
      g.pending.clear();
    }
  }
  Run(completions);
}

int GroupTable::MembersNotToldLocked() const {
  int not_told = 0;
  for (const auto& [id, g] : groups_) {
    if (g.state != v1::GROUP_STATE_ACTIVE) continue;
    for (const Member& m : g.members) not_told += !m.left && !m.dead && !m.told_shutdown;
  }
  return not_told;
}

int GroupTable::AwaitMembersTold(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto all_told = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return MembersNotToldLocked() == 0; };
  mu_.AwaitWithTimeout(absl::Condition(&all_told), timeout);
  return MembersNotToldLocked();
}

std::vector<v1::GroupInfo> GroupTable::List(KeyPage* page) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::GroupInfo> out;
  auto it =
      page != nullptr && page->resumes() ? groups_.upper_bound(page->after()) : groups_.begin();
  for (; it != groups_.end(); ++it) {
    const auto& [id, g] = *it;
    v1::GroupInfo info;
    info.set_group(g.id);
    info.set_generation(g.generation);
    info.set_state(g.state);
    info.set_world_size(g.world_size);
    info.set_failure(g.failure);
    for (const Pending& p : g.pending) {
      v1::MemberInfo* m = info.add_members();
      m->set_rank(-1);
      m->set_host(p.host);
      m->set_local_devices(p.local_devices);
      m->set_incarnation(p.incarnation);
    }
    for (const Member& m : g.members) *info.add_members() = m.info;
    if (page != nullptr && !page->Take(id, info.ByteSizeLong() + 8)) break;
    out.push_back(std::move(info));
  }
  return out;
}

std::map<v1::GroupState, int> GroupTable::CountByState() const {
  absl::MutexLock lock(&mu_);
  std::map<v1::GroupState, int> count;
  for (const auto& [id, g] : groups_) ++count[g.state];
  return count;
}

int64_t GroupTable::heartbeat_deaths() const {
  absl::MutexLock lock(&mu_);
  return heartbeat_deaths_;
}

}  // namespace dtrain
