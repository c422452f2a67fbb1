// Rendezvous (ranks, local ranks, node ranks, generations, elastic groups, errors) and the
// key-value store, through a real coordinator on 127.0.0.1.
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "dtrain/v1/coordinator.grpc.pb.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace rendezvous_test {

using ::testing::HasSubstr;

struct Seen {
  int rank, local_rank, node_rank, local_world_size, num_nodes, world_size;
  int64_t generation;
  std::string host;
};

TEST(Rendezvous, MixedHosts_DenseRanksLocalRanksAndNodeRanks) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::vector<std::string> hosts = {"b", "a", "b", "c", "a"};
  std::vector<Seen> seen(5);
  absl::Mutex mu;
  auto statuses = RunRanks(
      coordinator->address(), "mixed", 5,
      [&](ProcessGroup& pg) {
        absl::MutexLock lock(&mu);
        seen[pg.rank()] = Seen{pg.rank(),       pg.local_rank(),
                               pg.node_rank(),  pg.local_world_size(),
                               pg.num_nodes(),  pg.world_size(),
                               pg.generation(), pg.assignment().members(pg.rank()).host()};
        return absl::OkStatus();
      },
      [&](ProcessGroupOptions& o, int i) { o.host = hosts[i]; });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  // Hosts in name order a, a, b, b, c: ranks are contiguous per host.
  const std::vector<std::string> host_of = {"a", "a", "b", "b", "c"};
  const std::vector<int> local = {0, 1, 0, 1, 0}, node = {0, 0, 1, 1, 2},
                         local_world = {2, 2, 2, 2, 1};
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(seen[r].rank, r);
    EXPECT_EQ(seen[r].host, host_of[r]);
    EXPECT_EQ(seen[r].local_rank, local[r]);
    EXPECT_EQ(seen[r].node_rank, node[r]);
    EXPECT_EQ(seen[r].local_world_size, local_world[r]);
    EXPECT_EQ(seen[r].num_nodes, 3);
    EXPECT_EQ(seen[r].world_size, 5);
    EXPECT_EQ(seen[r].generation, 1);
  }
}

// A member that asks to go without the member list (omit_members) gets every other field as the
// others do, and no list; the others still get all of it, in one group.
TEST(Rendezvous, OmitMembers_ThatAnswerHasNoList_EveryOtherFieldAndMemberUnchanged) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  constexpr int kWorld = 4;
  absl::Mutex mu;
  std::vector<v1::RegisterResponse> answers(kWorld);
  auto statuses = RunRanks(
      coordinator->address(), "omit", kWorld,
      [&](ProcessGroup& pg) {
        absl::MutexLock lock(&mu);
        answers[pg.rank()] = pg.assignment();
        return absl::OkStatus();
      },
      [&](ProcessGroupOptions& o, int i) {
        o.host = "h";
        o.name = absl::StrCat("m", i);
        o.order_key = o.name;  // rank i is member i
        o.member_list = i % 2 == 0;
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(r);
    const v1::RegisterResponse& a = answers[r];
    EXPECT_EQ(a.rank(), r);
    EXPECT_EQ(a.member().rank(), r);
    EXPECT_EQ(a.local_rank(), r);
    EXPECT_EQ(a.world_size(), kWorld);
    EXPECT_EQ(a.local_world_size(), kWorld);
    EXPECT_EQ(a.num_nodes(), 1);
    EXPECT_GT(a.heartbeat_interval_ms(), 0);
    if (r % 2 == 1) {
      EXPECT_EQ(a.members_size(), 0);
      // Without the list, the answer is the others' less it, byte for byte.
      v1::RegisterResponse listless = answers[r - 1];
      listless.clear_members();
      listless.mutable_member()->set_rank(r);
      listless.mutable_member()->set_incarnation(a.member().incarnation());
      listless.set_rank(r);
      listless.set_local_rank(r);
      EXPECT_EQ(a.SerializeAsString(), listless.SerializeAsString());
    } else {
      ASSERT_EQ(a.members_size(), kWorld);
      for (int m = 0; m < kWorld; ++m) {
        EXPECT_EQ(a.members(m).rank(), m);
        EXPECT_EQ(a.members(m).name(), absl::StrCat("m", m));
        EXPECT_EQ(a.members(m).incarnation(), answers[m].member().incarnation());
      }
    }
  }
}

// How many members have registered so far in the forming group `group` (-1: no such group).
int RegisteredMembers(v1::Coordinator::Stub& stub, const std::string& group) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::ListGroupsResponse groups;
  if (!stub.ListGroups(&context, v1::ListGroupsRequest(), &groups).ok()) return -1;
  for (const v1::GroupInfo& g : groups.groups()) {
    if (g.group() == group) return g.members_size();
  }
  return -1;
}

// Joins members of `group` one at a time, each only once the coordinator lists the one before
// as registered, so that their arrival order is known; returns each one's rank by arrival.
std::vector<int> JoinInArrivalOrder(const std::string& address, const std::string& group,
                                    const std::vector<std::string>& hosts,
                                    const std::vector<std::string>& order_keys) {
  auto stub = v1::Coordinator::NewStub(ConnectToCoordinator(address));
  const int n = static_cast<int>(hosts.size());
  std::vector<int> ranks(n, -1);
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> members;
  for (int i = 0; i < n; ++i) {
    members.emplace_back([&, i] {
      ProcessGroupOptions options = GroupOptions(group, n, hosts[i]);
      options.order_key = order_keys[i];
      auto pg = ProcessGroup::Join(address, options);
      statuses[i] = pg.status();
      if (pg.ok()) ranks[i] = (*pg)->rank();
    });
    // The last one completes the group (which is then no longer forming).
    if (i + 1 < n) {
      EXPECT_TRUE(
          WaitFor([&] { return RegisteredMembers(*stub, group) == i + 1; }, absl::Seconds(10)))
          << "member " << i << " did not register";
    }
  }
  for (std::thread& t : members) t.join();
  for (int i = 0; i < n; ++i)
    EXPECT_TRUE(statuses[i].ok()) << "member " << i << ": " << statuses[i];
  return ranks;
}

// Within a host, ranks follow the members' order keys, then their arrival (group_table.h); hosts
// by name. Arrivals driven one at a time, so a rule that ignored arrival (or reversed it) fails.
TEST(Rendezvous, RanksWithinAHost_FollowOrderKeysThenArrival) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  // Arrivals b, a, b, a, b: host a's two (arrivals 1, 3) are ranks 0 and 1 in that order, then
  // host b's three (arrivals 0, 2, 4) ranks 2, 3 and 4.
  EXPECT_EQ(JoinInArrivalOrder(coordinator->address(), "arrivals", {"b", "a", "b", "a", "b"},
                               {"", "", "", "", ""}),
            (std::vector<int>{2, 0, 3, 1, 4}));
  // Order keys outrank arrival (ddp_spawn's children rank by their index whenever they come).
  EXPECT_EQ(JoinInArrivalOrder(coordinator->address(), "keys", {"h", "h", "h"}, {"2", "0", "1"}),
            (std::vector<int>{2, 0, 1}));
}

absl::Status RegisterRaw(v1::Coordinator::Stub& stub, const std::string& group, int world,
                         uint64_t incarnation, int64_t generation = 0, int timeout_ms = 300) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::RegisterRequest request;
  request.set_group(group);
  request.set_host("raw");
  request.set_local_devices(1);
  request.set_world_size(world);
  request.set_incarnation(incarnation);
  request.set_generation(generation);
  request.set_timeout_ms(timeout_ms);
  v1::RegisterResponse response;
  return FromGrpcStatus(stub.Register(&context, request, &response));
}

TEST(Rendezvous, FullGroupTwiceAndWrongSize_ClearErrors) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  auto channel = ConnectToCoordinator(coordinator->address());
  auto stub = v1::Coordinator::NewStub(channel);
  auto options = GroupOptions("full", 1, "h");
  options.incarnation = 99;
  auto pg = ProcessGroup::Join(coordinator->address(), options);
  ASSERT_TRUE(pg.ok()) << pg.status();

  absl::Status twice = RegisterRaw(*stub, "full", 1, 99);
  EXPECT_EQ(twice.code(), absl::StatusCode::kAlreadyExists) << twice;
  EXPECT_THAT(std::string(twice.message()), HasSubstr("already rank 0 (host h)"));

  absl::Status full = RegisterRaw(*stub, "full", 1, 100);
  EXPECT_EQ(full.code(), absl::StatusCode::kFailedPrecondition) << full;
  EXPECT_THAT(std::string(full.message()), HasSubstr("is full"));

  // A forming group refuses members that ask for another size, and a second registration.
  std::thread first([&] { RegisterRaw(*stub, "forming", 3, 1, 0, 6000).IgnoreError(); });
  ASSERT_TRUE(WaitFor(
      [&] {
        grpc::ClientContext c;
        v1::ListGroupsResponse groups;
        stub->ListGroups(&c, v1::ListGroupsRequest(), &groups);
        for (const auto& g : groups.groups()) {
          if (g.group() == "forming" && g.members_size() == 1) return true;
        }
        return false;
      },
      absl::Seconds(5)));
  absl::Status size = RegisterRaw(*stub, "forming", 4, 2);
  EXPECT_EQ(size.code(), absl::StatusCode::kFailedPrecondition) << size;
  EXPECT_THAT(std::string(size.message()), HasSubstr("forming with world_size 3"));
  absl::Status again = RegisterRaw(*stub, "forming", 3, 1);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  first.join();
}

TEST(Rendezvous, GroupNeverForms_DeadlineExceededNamesWhoCame) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  auto options = GroupOptions("lonely", 3, "only-host");
  options.register_timeout = absl::Milliseconds(300);
  auto pg = ProcessGroup::Join(coordinator->address(), options);
  EXPECT_EQ(pg.status().code(), absl::StatusCode::kDeadlineExceeded) << pg.status();
  EXPECT_THAT(std::string(pg.status().message()),
              HasSubstr("1 of 3 members registered (hosts: only-host)"));
}

// A forming group that every registrant left holds nobody: a first generation is forgotten (a
// stream of abandoned ids must not grow the table), a later one is over, and either way the
// next registration forms the group as it would have.
TEST(Rendezvous, GroupsEveryRegistrantLeft_ForgottenOrOver_NotKeptForming) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  auto stub = v1::Coordinator::NewStub(ConnectToCoordinator(coordinator->address()));
  // The groups listed (state, generation), or nullopt when ListGroups failed.
  auto listed = [&]() -> std::optional<std::map<std::string, std::pair<v1::GroupState, int64_t>>> {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::ListGroupsResponse response;
    if (!stub->ListGroups(&context, v1::ListGroupsRequest(), &response).ok()) return std::nullopt;
    std::map<std::string, std::pair<v1::GroupState, int64_t>> out;
    for (const v1::GroupInfo& g : response.groups()) out[g.group()] = {g.state(), g.generation()};
    return out;
  };
  auto listed_none = [&] {
    auto groups = listed();
    return groups.has_value() && groups->empty();
  };
  // Timed out by the coordinator's own tick.
  auto abandon = [&](const std::string& id) {
    auto options = GroupOptions(id, 2, "h");
    options.register_timeout = absl::Milliseconds(200);
    auto pg = ProcessGroup::Join(coordinator->address(), options);
    EXPECT_EQ(pg.status().code(), absl::StatusCode::kDeadlineExceeded) << id << pg.status();
  };
  for (int i = 0; i < 3; ++i) abandon(absl::StrCat("abandoned-", i));
  EXPECT_TRUE(WaitFor(listed_none, absl::Seconds(10))) << "abandoned groups still listed";

  // Cancelled by the client: the coordinator would wait a minute, the call gives up first.
  {
    absl::Status cancelled;
    std::thread registering([&] {
      v1::RegisterRequest request;
      request.set_group("cancelled");
      request.set_host("h");
      request.set_world_size(2);
      request.set_local_devices(1);
      request.set_incarnation(99);
      request.set_timeout_ms(60'000);
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      v1::RegisterResponse response;
      cancelled = FromGrpcStatus(stub->Register(&context, request, &response));
    });
    const bool forming = WaitFor(
        [&] {
          auto groups = listed();
          return groups.has_value() && groups->count("cancelled") == 1 &&
                 (*groups)["cancelled"].first == v1::GROUP_STATE_FORMING;
        },
        absl::Seconds(10));
    registering.join();
    EXPECT_TRUE(forming) << "the registration never waited in a forming group";
    EXPECT_EQ(cancelled.code(), absl::StatusCode::kDeadlineExceeded) << cancelled;
    EXPECT_TRUE(WaitFor(listed_none, absl::Seconds(10))) << "the cancelled group is still listed";
  }

  {
    auto pg = ProcessGroup::Join(coordinator->address(), GroupOptions("abandoned-0", 1, "h"));
    ASSERT_TRUE(pg.ok()) << pg.status();
    EXPECT_EQ((*pg)->generation(), 1) << "the abandoned generation was forgotten";
  }                        // leaves: generation 1 ends
  abandon("abandoned-0");  // generation 2 forms no further
  EXPECT_TRUE(WaitFor(
      [&] {
        auto groups = listed();
        return groups.has_value() && groups->size() == 1 &&
               (*groups)["abandoned-0"] == std::make_pair(v1::GROUP_STATE_ENDED, int64_t{2});
      },
      absl::Seconds(10)))
      << "generation 2 should be over (ENDED), not left forming";
  auto pg = ProcessGroup::Join(coordinator->address(), GroupOptions("abandoned-0", 1, "h"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  EXPECT_EQ((*pg)->generation(), 3);
}

TEST(Rendezvous, NewGenerationAfterGroupEnds_OldGenerationRefused) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  auto channel = ConnectToCoordinator(coordinator->address());
  auto stub = v1::Coordinator::NewStub(channel);
  v1::MemberRef old_member;
  {
    auto pg = ProcessGroup::Join(coordinator->address(), GroupOptions("gens", 1, "h"));
    ASSERT_TRUE(pg.ok()) << pg.status();
    EXPECT_EQ((*pg)->generation(), 1);
    old_member = (*pg)->assignment().member();
  }  // leaves: generation 1 ends
  auto pg2 = ProcessGroup::Join(coordinator->address(), GroupOptions("gens", 1, "h"));
  ASSERT_TRUE(pg2.ok()) << pg2.status();
  EXPECT_EQ((*pg2)->generation(), 2);

  absl::Status old_gen = RegisterRaw(*stub, "gens", 1, 555, /*generation=*/1);
  EXPECT_EQ(old_gen.code(), absl::StatusCode::kFailedPrecondition) << old_gen;
  EXPECT_THAT(std::string(old_gen.message()), HasSubstr("generation 1 is over"));

  grpc::ClientContext context;
  v1::HeartbeatRequest heartbeat;
  *heartbeat.mutable_member() = old_member;
  v1::HeartbeatResponse response;
  absl::Status stale = FromGrpcStatus(stub->Heartbeat(&context, heartbeat, &response));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_THAT(std::string(stale.message()), HasSubstr("belongs to generation 1"));
}

TEST(Rendezvous, ElasticGroup_FormsWithMinimumAfterSettle) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<int> sizes(3, 0);
  absl::Mutex mu;
  auto statuses = RunRanks(
      coordinator->address(), "elastic", 3,
      [&](ProcessGroup& pg) {
        {
          absl::MutexLock lock(&mu);
          sizes[pg.rank()] = pg.world_size();
        }
        return pg.Barrier("elastic-ok");
      },
      [](ProcessGroupOptions& o, int) {
        o.world_size = 5;
        o.min_world_size = 2;
        // Long enough that all three threads join on a loaded machine before it settles.
        o.settle_timeout = absl::Seconds(5);
      });
  for (const auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(sizes, (std::vector<int>{3, 3, 3}));
}

TEST(KeyValue, SetGetAddCasDeleteList_Semantics) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  KeyValueClient kv(ConnectToCoordinator(coordinator->address()), "scope-a");
  KeyValueClient other(ConnectToCoordinator(coordinator->address()), "scope-b");
  ASSERT_TRUE(kv.Set("k1", std::string("v\0x", 3)).ok());
  EXPECT_EQ(kv.Get("k1").value(), std::string("v\0x", 3));
  EXPECT_EQ(other.Get("k1").status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(kv.Add("counter", 5).value(), 5);
  EXPECT_EQ(kv.Add("counter", -7).value(), -2);
  EXPECT_EQ(kv.Get("counter").value(), "-2");
  EXPECT_EQ(kv.Add("k1", 1).status().code(), absl::StatusCode::kFailedPrecondition);

  auto cas = kv.CompareAndSet("lock", "", "owner-1");
  ASSERT_TRUE(cas.ok());
  EXPECT_TRUE(cas->swapped);
  cas = kv.CompareAndSet("lock", "", "owner-2");
  EXPECT_FALSE(cas->swapped);
  EXPECT_EQ(cas->value, "owner-1");
  cas = kv.CompareAndSet("lock", "owner-1", "owner-2");
  EXPECT_TRUE(cas->swapped);
  EXPECT_EQ(kv.Get("lock").value(), "owner-2");

  auto listed = kv.List("");
  ASSERT_TRUE(listed.ok());
  std::vector<std::string> keys;
  for (const auto& [k, v] : *listed) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"counter", "k1", "lock"}));
  EXPECT_EQ(kv.List("lo")->size(), 1u);

  EXPECT_TRUE(kv.Delete("k1").value());
  EXPECT_FALSE(kv.Delete("k1").value());
  EXPECT_EQ(kv.Get("k1").status().code(), absl::StatusCode::kNotFound);
  // The largest value is one a default client reads back; a byte more is refused.
  constexpr size_t kMostValue = (size_t{4} << 20) - (64 << 10);
  EXPECT_EQ(kv.Set("big", std::string(kMostValue + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv.Set("big", std::string(kMostValue, 'x')).ok());
  KeyValueClient plain(
      grpc::CreateChannel(coordinator->address(), grpc::InsecureChannelCredentials()), "scope-a");
  absl::StatusOr<std::string> big = plain.Get("big");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->size(), kMostValue);
}

TEST(KeyValue, GetWithWait_WokenByWriterOrTimesOut) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  KeyValueClient reader(ConnectToCoordinator(coordinator->address()), "s");
  KeyValueClient writer(ConnectToCoordinator(coordinator->address()), "s");
  bool reader_waited = false;
  absl::Status written;
  std::thread t([&] {
    // The write comes once the reader waits at the coordinator, never before: a Get that
    // answered at once, or whose wait a write does not end, fails below.
    reader_waited =
        WaitFor([&] { return coordinator->kv().WaitingGets() == 1; }, absl::Seconds(10));
    written = writer.Set("late", "here");
  });
  const absl::Time start = absl::Now();
  auto value = reader.Get("late", absl::Seconds(20));
  const absl::Duration took = absl::Now() - start;
  t.join();
  ASSERT_TRUE(reader_waited) << "the reader's Get never waited at the coordinator";
  ASSERT_TRUE(written.ok()) << written;
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
  EXPECT_LT(took, absl::Seconds(10)) << "woken by the write, not by its deadline";
  EXPECT_EQ(coordinator->kv().WaitingGets(), 0);

  auto missing = reader.Get("never", absl::Milliseconds(200));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("'never' in scope 's' was not set"));
  // A wait is bounded: its waiter outlives a vanished client only that long.
  auto too_long = reader.Get("never", absl::Hours(2));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_long.status().message()), HasSubstr("between 0 and 1h"));
}

// KeyValueList pages: values whose sum passes a default client's 4 MiB arrive a page each
// (page_size 0 fills an answer to about 4 MiB), and the client library asks for every page.
TEST(KeyValue, ListPastADefaultClientsLimit_ArrivesInPages_EachKeyOnce) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  auto channel = ConnectToCoordinator(coordinator->address());
  KeyValueClient kv(channel, "pages");
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        kv.Set(absl::StrCat("big-", i), std::string(3'000'000, static_cast<char>('a' + i))).ok());
  }
  ASSERT_TRUE(kv.Set("other", "x").ok());
  // A default client: grpc::CreateChannel's channels take answers of 4 MiB at most.
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(coordinator->address(), grpc::InsecureChannelCredentials()));
  v1::KeyValueListRequest request;
  request.set_scope("pages");
  request.set_prefix("big-");
  std::vector<std::string> keys;
  int pages = 0;
  do {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::KeyValueListResponse response;
    const absl::Status s = FromGrpcStatus(stub->KeyValueList(&context, request, &response));
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(response.entries_size(), 1) << "two 3 MB values do not fit one answer";
    for (const v1::KeyValueEntry& e : response.entries()) {
      keys.push_back(e.key());
      EXPECT_EQ(e.value(), std::string(3'000'000, static_cast<char>('a' + pages)));
    }
    request.set_page_token(response.next_page_token());
    ++pages;
  } while (!request.page_token().empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(keys, (std::vector<std::string>{"big-0", "big-1", "big-2"}));

  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> all = kv.List("");
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> listed;
  for (const auto& [key, value] : *all) listed.push_back(key);
  EXPECT_EQ(listed, (std::vector<std::string>{"big-0", "big-1", "big-2", "other"}));

  // The byte budget binds before page_size: one 3 MB value a page, whatever the size asked.
  request.set_prefix("");
  request.set_page_size(3);
  request.set_page_token("");
  {
    grpc::ClientContext context;
    v1::KeyValueListResponse response;
    ASSERT_TRUE(stub->KeyValueList(&context, request, &response).ok());
    EXPECT_EQ(response.entries_size(), 1);
  }
  // page_size bounds a page of small entries.
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(kv.Set(absl::StrCat("s-", i), "v").ok());
  request.set_prefix("s-");
  std::vector<int> sizes;
  keys.clear();
  do {
    grpc::ClientContext context;
    v1::KeyValueListResponse response;
    ASSERT_TRUE(stub->KeyValueList(&context, request, &response).ok());
    sizes.push_back(response.entries_size());
    for (const v1::KeyValueEntry& e : response.entries()) keys.push_back(e.key());
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty() && sizes.size() < 10);
  EXPECT_EQ(sizes, (std::vector<int>{3, 3, 1}));
  EXPECT_EQ(keys, (std::vector<std::string>{"s-0", "s-1", "s-2", "s-3", "s-4", "s-5", "s-6"}));
  // A foreign token is refused.
  request.set_page_token("$$$");
  grpc::ClientContext refused_context;
  v1::KeyValueListResponse response;
  const absl::Status refused =
      FromGrpcStatus(stub->KeyValueList(&refused_context, request, &response));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("page_token (3 bytes) is not one this service gave"));
}

// ListGroups pages by group id, as KeyValueList by key.
TEST(Rendezvous, ListGroups_PagesByGroupId) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<std::unique_ptr<ProcessGroup>> groups;
  for (const char* id : {"g-c", "g-a", "g-e", "g-b", "g-d"}) {
    auto pg = ProcessGroup::Join(coordinator->address(), GroupOptions(id, 1, "h"));
    ASSERT_TRUE(pg.ok()) << pg.status();
    groups.push_back(std::move(*pg));
  }
  auto stub = v1::Coordinator::NewStub(ConnectToCoordinator(coordinator->address()));
  v1::ListGroupsRequest request;
  request.set_page_size(2);
  std::vector<std::vector<std::string>> pages;
  do {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::ListGroupsResponse response;
    const absl::Status s = FromGrpcStatus(stub->ListGroups(&context, request, &response));
    ASSERT_TRUE(s.ok()) << s;
    pages.emplace_back();
    for (const v1::GroupInfo& g : response.groups()) {
      pages.back().push_back(g.group());
      EXPECT_EQ(g.state(), v1::GROUP_STATE_ACTIVE) << g.group();
      EXPECT_EQ(g.members_size(), 1) << g.group();
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty() && pages.size() < 10);
  EXPECT_EQ(pages,
            (std::vector<std::vector<std::string>>{{"g-a", "g-b"}, {"g-c", "g-d"}, {"g-e"}}));
}

TEST(KeyValue, GroupScope_DeletedWhenGroupEnds) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  auto channel = ConnectToCoordinator(coordinator->address());
  {
    auto pg = ProcessGroup::Join(coordinator->address(), GroupOptions("scoped", 1, "h"));
    ASSERT_TRUE(pg.ok());
    ASSERT_TRUE((*pg)->store().Set("addr", "1.2.3.4").ok());
    EXPECT_EQ((*pg)->store().Get("addr").value(), "1.2.3.4");
  }
  KeyValueClient kv(channel, "scoped");
  EXPECT_EQ(kv.Get("addr").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace rendezvous_test
}  // namespace dtrain::testing

namespace dtrain::testing {
namespace rendezvous_test {

// A long-lived coordinator forgets the oldest ended groups beyond kRetainedEndedGroups, so its
// table does not grow with every job it ever ran; a live group is never forgotten.
TEST(Rendezvous, EndedGroupsBeyondTheRetentionAreForgotten_LiveOnesKept) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  auto live = ProcessGroup::Join(coordinator->address(), GroupOptions("live", 1, "h"));
  ASSERT_TRUE(live.ok()) << live.status();
  const int total = static_cast<int>(kRetainedEndedGroups) + 40;
  for (int i = 0; i < total; ++i) {
    auto pg =
        ProcessGroup::Join(coordinator->address(), GroupOptions(absl::StrCat("g", i), 1, "h"));
    ASSERT_TRUE(pg.ok()) << pg.status();
  }  // each leaves as it goes out of scope
  // One more registration evicts.
  auto last = ProcessGroup::Join(coordinator->address(), GroupOptions("last", 1, "h"));
  ASSERT_TRUE(last.ok()) << last.status();
  auto stub = v1::Coordinator::NewStub(ConnectToCoordinator(coordinator->address()));
  grpc::ClientContext context;
  v1::ListGroupsResponse groups;
  ASSERT_TRUE(stub->ListGroups(&context, {}, &groups).ok());
  std::set<std::string> ids;
  for (const auto& g : groups.groups()) ids.insert(g.group());
  EXPECT_EQ(ids.size(), kRetainedEndedGroups + 2);  // the retained ended ones, live and last
  EXPECT_EQ(ids.count("live"), 1u);
  EXPECT_EQ(ids.count("last"), 1u);
  EXPECT_EQ(ids.count("g0"), 0u);                          // the oldest: forgotten
  EXPECT_EQ(ids.count(absl::StrCat("g", total - 1)), 1u);  // the newest: kept
  EXPECT_TRUE((*live)->Barrier("still").ok());
}

}  // namespace rendezvous_test
}  // namespace dtrain::testing
