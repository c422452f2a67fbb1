// The process-group core without gRPC and without sleeping: GroupTable, CollectiveEngine and
// KeyValueStore on a clock the test advances, their deadlines driven through Tick(now). The same
// behaviour is tested end to end over gRPC in rendezvous_test, collectives_test and failure_test;
// here each rule is pinned down exactly and in milliseconds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/collectives/collective_engine.h"
#include "coordinator/collectives/group_table.h"
#include "coordinator/collectives/kv_store.h"

namespace dtrain {
namespace coordinator_core_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A clock the test moves by hand.
struct FakeClock {
  absl::Time now = absl::UnixEpoch() + absl::Hours(24);
  Clock AsClock() {
    return [this] { return now; };
  }
};

struct Registration {
  std::optional<absl::StatusOr<v1::RegisterResponse>> result;
  GroupTable::RegisterDone Done() {
    return [this](absl::StatusOr<RegisterAnswer> r) {
      if (r.ok()) {
        result = r->Whole();
      } else {
        result = r.status();
      }
    };
  }
};

v1::RegisterRequest Request(const std::string& group, int world, const std::string& host,
                            uint64_t incarnation, const std::string& name = "") {
  v1::RegisterRequest r;
  r.set_group(group);
  r.set_world_size(world);
  r.set_host(host);
  r.set_local_devices(1);
  r.set_incarnation(incarnation);
  r.set_name(name);
  r.set_timeout_ms(10'000);
  return r;
}

class GroupTableTest : public ::testing::Test {
 protected:
  GroupTableTest() : table_(Options(), Events()) {}

  GroupTableOptions Options() {
    GroupTableOptions o;
    o.heartbeat_timeout = absl::Seconds(5);
    o.clock = clock_.AsClock();
    return o;
  }
  GroupEvents Events() {
    GroupEvents e;
    e.failed = [this](const std::string& group, int64_t, const absl::Status& reason) {
      failures_.push_back(reason);
    };
    e.member_left = [this](const std::string&, int64_t, int rank, const std::string&) {
      left_.push_back(rank);
    };
    e.ended = [this](const std::string& group, int64_t) { ended_.push_back(group); };
    return e;
  }

  FakeClock clock_;
  std::vector<absl::Status> failures_;
  std::vector<int> left_;
  std::vector<std::string> ended_;
  GroupTable table_;
};

// Every member's answer lists every member; the list is encoded once and shared by all the
// answers (a group of N would otherwise build N² entries), and each answer reads back whole.
TEST_F(GroupTableTest, Answers_ShareOneEncodedMemberList_EachReadsBackWhole) {
  constexpr int kWorld = 64;
  std::vector<std::optional<absl::StatusOr<RegisterAnswer>>> answers(kWorld);
  for (int i = 0; i < kWorld; ++i) {
    table_.Register(Request("big", kWorld, absl::StrCat("host-", i % 4), 100 + i),
                    [&answers, i](absl::StatusOr<RegisterAnswer> r) { answers[i] = std::move(r); });
  }
  std::set<int> ranks;
  for (int i = 0; i < kWorld; ++i) {
    ASSERT_TRUE(answers[i].has_value() && answers[i]->ok()) << i;
    const RegisterAnswer& answer = **answers[i];
    EXPECT_EQ(answer.own.members_size(), 0) << "the list travels apart from the own fields";
    EXPECT_EQ(answer.members.get(), (*answers[0])->members.get()) << "one shared encoding";
    absl::StatusOr<v1::RegisterResponse> whole = answer.Whole();
    ASSERT_TRUE(whole.ok()) << whole.status();
    ASSERT_EQ(whole->members_size(), kWorld);
    EXPECT_EQ(whole->members(whole->rank()).incarnation(), static_cast<uint64_t>(100 + i));
    EXPECT_EQ(whole->local_world_size(), kWorld / 4);
    for (int r = 0; r < kWorld; ++r) EXPECT_EQ(whole->members(r).rank(), r);
    ranks.insert(whole->rank());
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kWorld));
}

// The ended groups' retention counts groups: an id abandoned again and again (each time a new
// generation, over at once) stays one record, and pushes no other group's record out.
TEST_F(GroupTableTest, AnIdAbandonedOverAndOver_PushesNoOtherEndedGroupOut) {
  for (const char* id : {"keep", "churn"}) {
    Registration r;
    table_.Register(Request(id, 1, "h", 1), r.Done());
    ASSERT_TRUE(r.result && r.result->ok()) << id;
    ASSERT_TRUE(table_.Leave((*r.result)->member()).ok()) << id;
  }
  for (int i = 0; i < static_cast<int>(kRetainedEndedGroups) + 44; ++i) {
    Registration r;
    table_.Register(Request("churn", 2, "h", 1000 + i), r.Done());
    ASSERT_FALSE(r.result.has_value()) << i;  // forming: it waits for a second member
    table_.CancelRegistration("churn", 1000 + i);
    ASSERT_TRUE(r.result.has_value() && r.result->status().code() == absl::StatusCode::kCancelled);
  }
  std::map<std::string, std::pair<v1::GroupState, int64_t>> groups;
  for (const v1::GroupInfo& g : table_.List()) groups[g.group()] = {g.state(), g.generation()};
  EXPECT_EQ(groups["keep"], std::make_pair(v1::GROUP_STATE_ENDED, int64_t{1}))
      << "the churn pushed another group's record out";
  EXPECT_EQ(groups["churn"],
            std::make_pair(v1::GROUP_STATE_ENDED, int64_t{kRetainedEndedGroups + 44 + 1}));
}

TEST_F(GroupTableTest, Forms_RanksByHostThenArrival) {
  Registration a, b, c;
  table_.Register(Request("g", 3, "host-b", 1), a.Done());
  table_.Register(Request("g", 3, "host-a", 2), b.Done());
  EXPECT_FALSE(a.result.has_value());  // waits for the third member
  table_.Register(Request("g", 3, "host-b", 3), c.Done());
  ASSERT_TRUE(a.result && a.result->ok() && b.result->ok() && c.result->ok());
  EXPECT_EQ((*b.result)->rank(), 0);  // host-a sorts first
  EXPECT_EQ((*b.result)->node_rank(), 0);
  EXPECT_EQ((*a.result)->rank(), 1);
  EXPECT_EQ((*a.result)->local_rank(), 0);
  EXPECT_EQ((*c.result)->rank(), 2);
  EXPECT_EQ((*c.result)->local_rank(), 1);
  EXPECT_EQ((*c.result)->node_rank(), 1);
  EXPECT_EQ((*c.result)->world_size(), 3);
  EXPECT_EQ((*c.result)->num_nodes(), 2);
}

TEST_F(GroupTableTest, MismatchedWorldSize_RefusedNamingBothSizes) {
  Registration a, b;
  table_.Register(Request("g", 2, "h", 1), a.Done());
  table_.Register(Request("g", 3, "h", 2), b.Done());
  ASSERT_TRUE(b.result.has_value());
  EXPECT_EQ(b.result->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.result->status().message(), HasSubstr("world_size 2"));
  EXPECT_THAT(b.result->status().message(), HasSubstr("asks for 3"));
  EXPECT_FALSE(a.result.has_value());  // the first member still waits
}

TEST_F(GroupTableTest, RegistrationDeadline_ThroughTick_NamesWhoCame) {
  Registration a;
  table_.Register(Request("g", 2, "lonely-host", 1), a.Done());
  clock_.now += absl::Seconds(9);
  table_.Tick(clock_.now);
  EXPECT_FALSE(a.result.has_value());
  clock_.now += absl::Seconds(1);
  table_.Tick(clock_.now);
  ASSERT_TRUE(a.result.has_value());
  EXPECT_EQ(a.result->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(a.result->status().message(), HasSubstr("1 of 2 members"));
  EXPECT_THAT(a.result->status().message(), HasSubstr("lonely-host"));
}

TEST_F(GroupTableTest, SilentMember_DeclaredDeadByName_GroupFails) {
  Registration a, b;
  table_.Register(Request("g", 2, "h", 1, "w0"), a.Done());
  table_.Register(Request("g", 2, "h", 2, "w1"), b.Done());
  ASSERT_TRUE(a.result->ok() && b.result->ok());
  const v1::MemberRef r0 = (*a.result)->member();
  const v1::MemberRef r1 = (*b.result)->member();
  clock_.now += absl::Seconds(4);
  ASSERT_TRUE(table_.Heartbeat(r0).ok());  // rank 0 stays alive, rank 1 goes silent
  table_.Tick(clock_.now);
  EXPECT_TRUE(failures_.empty());
  clock_.now += absl::Seconds(2);  // rank 1: 6 s silent, over the 5 s timeout
  table_.Tick(clock_.now);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0].code(), absl::StatusCode::kAborted);
  EXPECT_THAT(failures_[0].message(), HasSubstr("'w1'"));
  EXPECT_THAT(failures_[0].message(), HasSubstr("is dead"));
  EXPECT_EQ(table_.heartbeat_deaths(), 1);
  EXPECT_EQ(table_.CheckMember(r0).status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(table_.Leave(r0).ok());  // leaving a failed group is allowed
  EXPECT_EQ(table_.Heartbeat(r1).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ended_, std::vector<std::string>{"g"});  // the live one left: the group is over
  // The dead member comes back to leave: allowed, and the group does not end a second time.
  EXPECT_TRUE(table_.Leave(r1).ok());
  EXPECT_EQ(ended_, std::vector<std::string>{"g"});
}

TEST_F(GroupTableTest, Leave_ReportsRank_EndsWhenAllLeft_ThenANewGeneration) {
  Registration a, b;
  table_.Register(Request("g", 2, "h", 1), a.Done());
  table_.Register(Request("g", 2, "h", 2), b.Done());
  ASSERT_TRUE(a.result->ok() && b.result->ok());
  ASSERT_TRUE(table_.Leave((*b.result)->member()).ok());
  EXPECT_THAT(left_, ElementsAre(1));
  EXPECT_TRUE(ended_.empty());
  EXPECT_EQ(table_.CheckMember((*b.result)->member()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table_.Leave((*a.result)->member()).ok());
  EXPECT_THAT(ended_, ElementsAre("g"));
  Registration c;
  table_.Register(Request("g", 1, "h", 3), c.Done());
  ASSERT_TRUE(c.result && c.result->ok());
  EXPECT_EQ((*c.result)->member().generation(), (*a.result)->member().generation() + 1);
}

// Once stopped, a heartbeat is told of the shutdown as a final answer (a failed group keeps its
// reason), and AwaitMembersTold counts the live members of formed groups not told yet: not the
// one that left, not those of a failed group.
TEST_F(GroupTableTest, Stopped_HeartbeatsToldOfTheShutdown_AwaitCountsWhoIsNotTold) {
  Registration a, b, c, d, e;
  table_.Register(Request("g", 3, "h", 1, "w0"), a.Done());
  table_.Register(Request("g", 3, "h", 2, "w1"), b.Done());
  table_.Register(Request("g", 3, "h", 3, "w2"), c.Done());
  table_.Register(Request("f", 2, "h", 4, "x0"), d.Done());
  table_.Register(Request("f", 2, "h", 5, "x1"), e.Done());
  ASSERT_TRUE(a.result->ok() && b.result->ok() && c.result->ok());
  ASSERT_TRUE(d.result->ok() && e.result->ok());
  // Group f fails: x1 goes silent past the timeout while x0 and g's members heartbeat.
  clock_.now += absl::Seconds(4);
  for (const auto* r : {&a, &b, &c, &d}) ASSERT_TRUE(table_.Heartbeat((*r->result)->member()).ok());
  clock_.now += absl::Seconds(2);
  table_.Tick(clock_.now);
  ASSERT_EQ(failures_.size(), 1u);
  ASSERT_TRUE(table_.Leave((*c.result)->member()).ok());  // w2 leaves g

  table_.Stop();
  // w0 and w1 are live members of a formed group not told yet.
  EXPECT_EQ(table_.AwaitMembersTold(absl::ZeroDuration()), 2);
  const absl::Status told = table_.Heartbeat((*a.result)->member());
  EXPECT_EQ(told.code(), absl::StatusCode::kFailedPrecondition) << told;
  EXPECT_THAT(told.message(), HasSubstr("the coordinator is shutting down"));
  EXPECT_THAT(told.message(), HasSubstr("group 'g' ends with it"));
  EXPECT_EQ(table_.AwaitMembersTold(absl::ZeroDuration()), 1);
  // x0's group failed before the shutdown: it hears why, naming the dead peer.
  const absl::Status failed = table_.Heartbeat((*d.result)->member());
  EXPECT_EQ(failed.code(), absl::StatusCode::kAborted) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("'x1'"));
  EXPECT_EQ(table_.Heartbeat((*b.result)->member()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table_.AwaitMembersTold(absl::Seconds(10)), 0);  // at once: nobody left to tell
  // A stranger's heartbeat is told of the shutdown too.
  v1::MemberRef stranger = (*a.result)->member();
  stranger.set_group("nobody");
  EXPECT_EQ(table_.Heartbeat(stranger).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(GroupTableTest, Elastic_FormsWithMinAfterSettle) {
  v1::RegisterRequest r = Request("e", 4, "h", 1);
  r.set_min_world_size(2);
  r.set_settle_timeout_ms(3000);
  Registration a, b;
  table_.Register(r, a.Done());
  r.set_incarnation(2);
  clock_.now += absl::Seconds(1);
  table_.Register(r, b.Done());
  clock_.now += absl::Seconds(2);  // 2 s since the last join: still settling
  table_.Tick(clock_.now);
  EXPECT_FALSE(a.result.has_value());
  clock_.now += absl::Seconds(1);
  table_.Tick(clock_.now);
  ASSERT_TRUE(a.result && a.result->ok() && b.result->ok());
  EXPECT_EQ((*a.result)->world_size(), 2);
}

// Engine tests: a formed group of `world` ranks on the fake clock.
class CollectiveEngineTest : public GroupTableTest {
 protected:
  void Form(int world) {
    std::vector<Registration> regs(world);
    for (int i = 0; i < world; ++i) {
      table_.Register(Request("g", world, "h", 100 + i, "w" + std::to_string(i)), regs[i].Done());
    }
    for (Registration& r : regs) {
      ASSERT_TRUE(r.result && r.result->ok());
      members_.push_back((*r.result)->member());
    }
  }
  struct Answer {
    std::optional<absl::Status> status;
    std::shared_ptr<const CollectiveResult> result;
  };
  CollectiveDone Into(Answer& answer) {
    return [&answer](const absl::Status& s, std::shared_ptr<const CollectiveResult> r) {
      answer.status = s;
      answer.result = std::move(r);
    };
  }
  CollectiveCall Barrier(int rank, int64_t sequence, const std::string& name = "b") {
    CollectiveCall call;
    call.kind = CollectiveKind::kBarrier;
    call.member = members_[rank];
    call.sequence = sequence;
    call.barrier_name = name;
    return call;
  }
  CollectiveCall AllReduce(int rank, int64_t sequence, std::vector<float> values) {
    CollectiveCall call;
    call.kind = CollectiveKind::kAllReduce;
    call.member = members_[rank];
    call.sequence = sequence;
    call.reduce_op = v1::REDUCE_OP_SUM;
    call.has_tensor = true;
    call.meta.set_dtype(v1::DTYPE_FLOAT32);
    call.meta.add_shape(static_cast<int64_t>(values.size()));
    auto bytes = std::make_shared<Bytes>(values.size() * sizeof(float));
    std::memcpy(bytes->data(), values.data(), bytes->size());
    call.payload = std::move(bytes);
    return call;
  }
  static std::vector<float> Floats(const CollectiveResult& result) {
    std::vector<float> out;
    for (const auto& buffer : result.buffers) {
      const size_t n = buffer->size() / sizeof(float);
      const size_t at = out.size();
      out.resize(at + n);
      std::memcpy(out.data() + at, buffer->data(), buffer->size());
    }
    return out;
  }

  CollectiveEngine engine_{&table_};
  std::vector<v1::MemberRef> members_;
};

TEST_F(CollectiveEngineTest, AllReduce_MatchesBySequence_SameResultForEveryRank) {
  Form(3);
  Answer a0, a1, a2;
  engine_.Submit(AllReduce(0, 1, {1, 2}), Into(a0));
  engine_.Submit(AllReduce(2, 1, {100, 200}), Into(a2));
  EXPECT_FALSE(a0.status.has_value());
  EXPECT_EQ(engine_.WaitingRanks("g"), 2);
  engine_.Submit(AllReduce(1, 1, {10, 20}), Into(a1));
  for (Answer* a : {&a0, &a1, &a2}) {
    ASSERT_TRUE(a->status.has_value());
    ASSERT_TRUE(a->status->ok()) << *a->status;
    EXPECT_THAT(Floats(*a->result), ElementsAre(111.0f, 222.0f));
  }
  EXPECT_EQ(engine_.PendingCount(), 0);
}

TEST_F(CollectiveEngineTest, MismatchedCalls_FailedPreconditionListingEach) {
  Form(2);
  Answer a0, a1;
  engine_.Submit(Barrier(0, 1), Into(a0));
  engine_.Submit(AllReduce(1, 1, {1}), Into(a1));
  ASSERT_TRUE(a0.status && a1.status);
  for (Answer* a : {&a0, &a1}) {
    EXPECT_EQ(a->status->code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(a->status->message(), HasSubstr("barrier"));
    EXPECT_THAT(a->status->message(), HasSubstr("all_reduce"));
  }
}

TEST_F(CollectiveEngineTest, Deadline_ThroughTick_NamesTheMissingRank) {
  Form(2);
  Answer a0;
  CollectiveCall call = Barrier(0, 1);
  call.timeout = absl::Seconds(3);
  engine_.Submit(call, Into(a0));
  clock_.now += absl::Seconds(2);
  engine_.Tick(clock_.now);
  EXPECT_FALSE(a0.status.has_value());
  clock_.now += absl::Seconds(2);
  engine_.Tick(clock_.now);
  ASSERT_TRUE(a0.status.has_value());
  EXPECT_EQ(a0.status->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(a0.status->message(), HasSubstr("w1"));
  // The late rank gets the same answer rather than waiting for a partner that gave up.
  Answer late;
  engine_.Submit(Barrier(1, 1), Into(late));
  ASSERT_TRUE(late.status.has_value());
  EXPECT_EQ(late.status->code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CollectiveEngineTest, GroupFails_PendingAndLaterCallsAborted) {
  Form(2);
  Answer pending;
  engine_.Submit(Barrier(0, 1), Into(pending));
  engine_.FailGroup("g", members_[0].generation(), absl::AbortedError("w1 is dead"));
  ASSERT_TRUE(pending.status.has_value());
  EXPECT_EQ(pending.status->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(pending.status->message(), HasSubstr("w1 is dead"));
  Answer later;
  engine_.Submit(Barrier(0, 2), Into(later));
  ASSERT_TRUE(later.status.has_value());
  EXPECT_EQ(later.status->code(), absl::StatusCode::kAborted);
}

TEST_F(CollectiveEngineTest, AbandonedCall_AbortsTheOthersNamingIt) {
  Form(3);
  Answer a0, a1;
  engine_.Submit(Barrier(0, 1), Into(a0));
  engine_.Submit(Barrier(1, 1), Into(a1));
  engine_.Abandon(members_[1], 1);  // rank 1's process went away mid-call
  ASSERT_TRUE(a0.status.has_value());
  EXPECT_EQ(a0.status->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(a0.status->message(), HasSubstr("w1"));
}

// One large all_reduce travels as segments, each its own numbered call: segments of one whole
// tensor meet segment by segment, and a rank whose segment disagrees is refused naming both.
TEST_F(CollectiveEngineTest, Segments_ReducedPerSegment_MismatchedSegmentNamed) {
  Form(2);
  auto segment = [&](int rank, int64_t sequence, int index, std::vector<float> values) {
    CollectiveCall call = AllReduce(rank, sequence, std::move(values));
    call.segmented = true;
    call.segment.set_index(index);
    call.segment.set_count(2);
    call.segment.mutable_whole()->set_dtype(v1::DTYPE_FLOAT32);
    call.segment.mutable_whole()->add_shape(4);
    return call;
  };
  Answer a0, a1, b0, b1;
  // Both segments in flight at once on rank 0, arriving in the other order on rank 1.
  engine_.Submit(segment(0, 1, 0, {1, 2}), Into(a0));
  engine_.Submit(segment(0, 2, 1, {3, 4}), Into(b0));
  engine_.Submit(segment(1, 2, 1, {30, 40}), Into(b1));
  engine_.Submit(segment(1, 1, 0, {10, 20}), Into(a1));
  for (Answer* a : {&a0, &a1, &b0, &b1}) ASSERT_TRUE(a->status && a->status->ok()) << *a->status;
  EXPECT_THAT(Floats(*a0.result), ElementsAre(11.0f, 22.0f));
  EXPECT_THAT(Floats(*b1.result), ElementsAre(33.0f, 44.0f));

  Answer c0, c1;
  engine_.Submit(segment(0, 3, 0, {1, 2}), Into(c0));
  engine_.Submit(segment(1, 3, 1, {1, 2}), Into(c1));  // a different segment of call 3
  ASSERT_TRUE(c0.status && c1.status);
  EXPECT_EQ(c1.status->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c1.status->message(), HasSubstr("segment 1 of 2"));
  EXPECT_THAT(c1.status->message(), HasSubstr("segment 2 of 2"));
}

TEST(KeyValueStoreTest, SetGetAddCas) {
  FakeClock clock;
  KeyValueStore kv(clock.AsClock());
  ASSERT_TRUE(kv.Set("s", "k", "v1").ok());
  std::optional<absl::StatusOr<std::string>> got;
  kv.Get("s", "k", absl::ZeroDuration(), [&](absl::StatusOr<std::string> v) { got = v; });
  ASSERT_TRUE(got && got->ok());
  EXPECT_EQ(**got, "v1");
  kv.Get("other-scope", "k", absl::ZeroDuration(), [&](absl::StatusOr<std::string> v) { got = v; });
  EXPECT_EQ(got->status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(*kv.Add("s", "n", 5), 5);
  EXPECT_EQ(*kv.Add("s", "n", -2), 3);
  EXPECT_EQ(kv.Add("s", "k", 1).status().code(), absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<KeyValueStore::CasResult> cas = kv.CompareAndSet("s", "k", "wrong", "v2");
  ASSERT_TRUE(cas.ok());
  EXPECT_FALSE(cas->swapped);
  EXPECT_EQ(cas->value, "v1");
  cas = kv.CompareAndSet("s", "k", "v1", "v2");
  EXPECT_TRUE(cas->swapped);
  cas = kv.CompareAndSet("s", "new", "", "first");  // "" expects absence
  EXPECT_TRUE(cas->swapped);
  EXPECT_EQ(kv.Set("", "k", "v").code(), absl::StatusCode::kInvalidArgument);
}

// Issue 38: a caller allowed into a scope cannot grow the store without limit. Each limit
// answers RESOURCE_EXHAUSTED naming it; deleting makes room again, and a failed swap leaves no
// scope behind.
TEST(KeyValueStoreTest, Quotas_PerScopeAndTotal_WaitersCapped_DeleteGivesRoomBack) {
  FakeClock clock;
  KeyValueLimits limits;
  limits.max_value_bytes = 100;
  limits.scope_bytes = 250;
  limits.scope_keys = 3;
  limits.total_bytes = 400;
  limits.scope_waiters = 2;
  limits.total_waiters = 3;
  KeyValueStore kv(clock.AsClock(), limits);
  EXPECT_EQ(kv.Set("a", "k", std::string(101, 'x')).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv.Set("a", "k1", std::string(98, 'x')).ok());  // 100 bytes with its key
  ASSERT_TRUE(kv.Set("a", "k2", std::string(98, 'x')).ok());  // 200
  const absl::Status scope_full = kv.Set("a", "k3", std::string(98, 'x'));
  EXPECT_EQ(scope_full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(scope_full.message(), HasSubstr("scope 'a' holds 200 bytes; 100 more would pass "
                                              "its limit of 250"));
  ASSERT_TRUE(kv.Set("a", "k1", std::string(10, 'y')).ok()) << "a smaller value replaces";
  ASSERT_TRUE(kv.Set("a", "k3", std::string(10, 'z')).ok());
  const absl::Status keys_full = kv.Set("a", "k4", "v");
  EXPECT_EQ(keys_full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(keys_full.message(), HasSubstr("scope 'a' holds 3 keys, its limit"));
  EXPECT_EQ(kv.Add("a", "counter", 1).status().code(), absl::StatusCode::kResourceExhausted);

  ASSERT_TRUE(kv.Set("b", "k1", std::string(98, 'x')).ok());
  ASSERT_TRUE(kv.Set("b", "k2", std::string(98, 'x')).ok());  // store: 124 + 200 = 324
  const absl::Status total_full = kv.Set("c", "k1", std::string(98, 'x'));
  EXPECT_EQ(total_full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(total_full.message(), HasSubstr("the store holds 324 bytes"));
  EXPECT_EQ(kv.CompareAndSet("c", "k1", "", std::string(98, 'x')).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(*kv.Delete("b", "k1"));
  EXPECT_TRUE(kv.Set("c", "k1", std::string(98, 'x')).ok()) << "deleting gave room back";
  kv.DeleteScope("a");
  EXPECT_TRUE(kv.Set("e", "k1", std::string(98, 'x')).ok()) << "a deleted scope too";

  std::vector<absl::StatusOr<std::string>> answers;
  auto keep = [&](absl::StatusOr<std::string> v) { answers.push_back(std::move(v)); };
  kv.Get("w", "x", absl::Seconds(5), keep);
  kv.Get("w", "x", absl::Seconds(5), keep);
  kv.Get("w", "x", absl::Seconds(5), keep);  // the scope's third
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(answers[0].status().message(), HasSubstr("scope 'w' already has 2 calls waiting"));
  kv.Get("v", "x", absl::Seconds(5), keep);
  kv.Get("u", "x", absl::Seconds(5), keep);  // the store's fourth
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_THAT(answers[1].status().message(), HasSubstr("the store already has 3 calls waiting"));
  EXPECT_EQ(kv.WaitingGets(), 3);
}

TEST(KeyValueStoreTest, WaitingGet_AnsweredByASet_OrExpiredByTick) {
  FakeClock clock;
  KeyValueStore kv(clock.AsClock());
  std::optional<absl::StatusOr<std::string>> answered, expired;
  kv.Get("s", "ready", absl::Seconds(5), [&](absl::StatusOr<std::string> v) { answered = v; });
  kv.Get("s", "never", absl::Seconds(5), [&](absl::StatusOr<std::string> v) { expired = v; });
  EXPECT_FALSE(answered.has_value());
  ASSERT_TRUE(kv.Set("s", "ready", "yes").ok());
  ASSERT_TRUE(answered && answered->ok());
  EXPECT_EQ(**answered, "yes");
  clock.now += absl::Seconds(4);
  kv.Tick(clock.now);
  EXPECT_FALSE(expired.has_value());
  clock.now += absl::Seconds(2);
  kv.Tick(clock.now);
  ASSERT_TRUE(expired.has_value());
  EXPECT_EQ(expired->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(expired->status().message(), HasSubstr("never"));
}

TEST(KeyValueStoreTest, Stop_FailsWaitersUnavailable) {
  FakeClock clock;
  KeyValueStore kv(clock.AsClock());
  std::optional<absl::StatusOr<std::string>> got;
  kv.Get("s", "k", absl::Minutes(1), [&](absl::StatusOr<std::string> v) { got = v; });
  kv.Stop();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace coordinator_core_test
}  // namespace dtrain
