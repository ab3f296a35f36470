// Fault handling's pure parts: the hang verdict from flight records, the update guard, the
// straggler watch, the fault.* keys' validation, and the supervisor's restart rule.
#include <gtest/gtest.h>

#include "launch/supervise.h"
#include "runtime/comm/hang_report.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "train/fault.h"

namespace loom {
namespace {

// A rank's dump with one group 'dp' over `members` whose ops 1..issued are all_reduce, but
// `other_at` (if > 0) is a broadcast; the op `timed` (if > 0) timed out there.
nlohmann::json dump(int rank, const std::vector<int>& members, int64_t issued, int64_t other_at = 0,
                    int64_t timed = 0) {
  nlohmann::json recs = nlohmann::json::array();
  for (int64_t s = 1; s <= issued; ++s)
    recs.push_back({{"seq", s},
                    {"op", s == other_at ? "broadcast" : "all_reduce"},
                    {"bytes", 8},
                    {"peer", -1},
                    {"issued", 1.0},
                    {"started", 1.0},
                    {"finished", s == issued ? 0.0 : 2.0}});
  nlohmann::json j = {{"rank", rank},
                      {"groups", {{{"name", "dp"}, {"world_ranks", members}, {"issued", issued}, {"records", recs}}}}};
  if (timed) j["timed_out"] = {{"group", "dp"}, {"seq", timed}, {"waited_s", 5.0}};
  return j;
}

TEST(HangVerdict, NamesTheRanksThatNeverReachedTheOp) {
  const std::vector<int> members = {0, 1, 2, 3};
  // Ranks 0 and 2 wait in #7; rank 1 stopped at #6; rank 3 wrote nothing (dead or stuck).
  const std::map<int, nlohmann::json> dumps = {
      {0, dump(0, members, 7, 0, 7)}, {1, dump(1, members, 6)}, {2, dump(2, members, 7, 0, 7)}};
  const std::string v = hang_verdict("dp", members, 7, 5.0, dumps);
  EXPECT_NE(v.find("all_reduce #7 on group 'dp'"), std::string::npos) << v;
  EXPECT_NE(v.find("rank 1 (its last op there is #6 all_reduce)"), std::string::npos) << v;
  EXPECT_NE(v.find("rank 3 (no record"), std::string::npos) << v;
  EXPECT_NE(v.find("waiting in it: rank 0, 2"), std::string::npos) << v;
  EXPECT_EQ(v.find("rank 0 ("), std::string::npos) << v;
}

// dp 2 x tp 2: rank 1 hangs; its tp peer 0 waits in tp #5, so rank 0 never reaches dp #9,
// where rank 2 waits. The verdict on dp follows rank 0 to its wait and names silent rank 1.
TEST(HangVerdict, FollowsAWaitToItsRoot) {
  nlohmann::json r0 = dump(0, {0, 2}, 8);
  r0["groups"].push_back({{"name", "tp"},
                          {"world_ranks", {0, 1}},
                          {"issued", 5},
                          {"records", {{{"seq", 5}, {"op", "all_reduce"}, {"bytes", 8}, {"peer", -1}}}}});
  r0["timed_out"] = {{"group", "tp"}, {"seq", 5}, {"waited_s", 5.0}};
  const std::map<int, nlohmann::json> dumps = {{0, r0}, {2, dump(2, {0, 2}, 9, 0, 9)}, {3, dump(3, {1, 3}, 9, 0, 9)}};
  const std::string v = hang_verdict("dp", {0, 2}, 9, 5.0, dumps, {0, 1, 2, 3});
  EXPECT_NE(v.find("rank 0 (its last op there is #8 all_reduce; itself waiting in all_reduce #5 on 'tp')"),
            std::string::npos)
      << v;
  EXPECT_NE(v.find("no record from rank 1 (dead"), std::string::npos) << v;
  EXPECT_EQ(v.find("rank 3"), std::string::npos) << v;
}

// A pipeline: rank 0 waits in recv #39 from stage rank 1 of 'pp' {0, 1, 2}; rank 1 wrote nothing.
TEST(HangVerdict, PointToPointNamesThePeer) {
  nlohmann::json r0 = {{"rank", 0},
                       {"timed_out", {{"group", "pp"}, {"seq", 39}, {"waited_s", 5.0}}},
                       {"groups",
                        {{{"name", "pp"},
                          {"world_ranks", {0, 1, 2}},
                          {"issued", 39},
                          {"records", {{{"seq", 39}, {"op", "recv"}, {"bytes", 8}, {"peer", 1}}}}}}}};
  nlohmann::json r2 = r0;
  r2["rank"] = 2;
  r2["timed_out"]["seq"] = 23;  // its own numbering
  const std::string v = hang_verdict("pp", {0, 1, 2}, 39, 5.0, {{0, r0}, {2, r2}}, {0, 1, 2});
  EXPECT_NE(v.find("recv #39 on group 'pp' (rank 0) has waited 5 s: its peer, rank 1, never sent it (no record"),
            std::string::npos)
      << v;
}

TEST(HangVerdict, NamesAMismatchedOp) {
  const std::vector<int> members = {0, 1};
  const std::map<int, nlohmann::json> dumps = {{0, dump(0, members, 7, 0, 7)}, {1, dump(1, members, 7, 7, 7)}};
  const std::string v = hang_verdict("dp", members, 7, 5.0, dumps);
  EXPECT_NE(v.find("a different op at #7 on rank 1 (broadcast there)"), std::string::npos) << v;
  EXPECT_EQ(v.find("never reached"), std::string::npos) << v;
}

TEST(HangVerdict, EveryMemberInsideIsAStall) {
  const std::vector<int> members = {0, 1};
  const std::map<int, nlohmann::json> dumps = {{0, dump(0, members, 7, 0, 7)}, {1, dump(1, members, 7, 0, 7)}};
  EXPECT_NE(hang_verdict("dp", members, 7, 5.0, dumps).find("every member reached it"), std::string::npos);
}

TEST(UpdateGuard, SkipsNonFiniteAndSpikesAndCountsInARow) {
  FaultConfig f;
  f.spike_factor = 4;
  f.max_skips = 2;
  UpdateGuard g(f);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(g.check(2.0, 1.0 + 0.01 * i), "");
  EXPECT_EQ(g.check(2.0, 100.0), "");  // fewer than 8 norms seen: no median yet
  EXPECT_NE(g.check(2.0, 1000.0).find("running median"), std::string::npos);
  EXPECT_NE(g.check(NAN, 1.0).find("non-finite loss"), std::string::npos);
  EXPECT_EQ(g.skips_in_a_row(), 2);
  EXPECT_FALSE(g.rollback_due());
  EXPECT_NE(g.check(2.0, INFINITY).find("non-finite gradient norm"), std::string::npos);
  EXPECT_TRUE(g.rollback_due());  // 3 in a row > max_skips 2
  g.rolled_back();
  EXPECT_EQ(g.check(2.0, 1.0), "");
  EXPECT_EQ(g.skips_in_a_row(), 0);
  EXPECT_EQ(g.skips_total(), 3);
}

TEST(UpdateGuard, NoSpikeCheckWhenOff) {
  FaultConfig f;  // spike_factor 0
  UpdateGuard g(f);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(g.check(2.0, 1.0), "");
  EXPECT_EQ(g.check(2.0, 1e6), "");
}

TEST(StragglerWatch, NamesARankSlowForSeveralStepsInARow) {
  StragglerWatch w(4, 0.2, 3);
  std::vector<int> fresh;
  EXPECT_TRUE(w.update({10, 10, 30, 10}, &fresh).empty());
  EXPECT_TRUE(w.update({10, 10, 30, 10}, &fresh).empty());
  EXPECT_EQ(w.update({10, 10, 30, 10}, &fresh), std::vector<int>{2});
  EXPECT_EQ(fresh, std::vector<int>{2});
  fresh.clear();
  EXPECT_EQ(w.update({10, 10, 30, 10}, &fresh), std::vector<int>{2});
  EXPECT_TRUE(fresh.empty());                                 // named once per streak
  EXPECT_TRUE(w.update({10, 10, 10.5, 10}, &fresh).empty());  // within the margin: over
  // Two ranks: the slower one is measured against the faster.
  StragglerWatch two(2, 0.2, 1);
  EXPECT_EQ(two.update({5, 50}, nullptr), std::vector<int>{1});
  // Noise below 2 ms is never a straggler, whatever the ratio.
  EXPECT_TRUE(two.update({0.2, 1.5}, nullptr).empty());
  // Pipeline stages differ by design: ranks are compared within their stage only.
  StragglerWatch staged(4, 0.2, 1);
  EXPECT_TRUE(staged.update({5, 5, 50, 50}, nullptr, {0, 0, 1, 1}).empty());
  EXPECT_EQ(staged.update({5, 5, 50, 90}, nullptr, {0, 0, 1, 1}), std::vector<int>{3});
}

Config with(std::initializer_list<const char*> sets) {
  Config c = config_defaults();
  for (const char* s : sets) config_set(c, s);
  config_validate(c);
  return c;
}

TEST(FaultKeys, ParseAndRefuseWithTheFix) {
  const FaultAt k = fault_parse("fault.kill", "1:7:backward", true, true);
  EXPECT_EQ(k.rank, 1);
  EXPECT_EQ(k.step, 7);
  EXPECT_EQ(k.phase, "backward");
  EXPECT_EQ(fault_parse("fault.enospc", "12", false).step, 12);
  EXPECT_FALSE(fault_parse("fault.nan", "").set());
  auto refused = [](std::initializer_list<const char*> sets, const char* says) {
    try {
      with(sets);
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({"fault.kill=1"}, "expected RANK:STEP[:PHASE]");
  refused({"fault.kill=1:5:sideways"}, "fault.kill phase");
  refused({"fault.hang=1:5:forward"}, "expected RANK:STEP");
  refused({"fault.nan=x:5"}, "not a non-negative number");
  refused({"fault.nan=2:5"}, "names rank 2, but the job has 1 rank (pp");
  refused({"fault.enospc=10"}, "checkpoint.every = 0");
  refused({"parallel.dp=2", "parallel.zero=2", "fault.sdc_every=5"}, "ZeRO-2 does not hold");
  refused({"parallel.dp=2", "parallel.zero=3", "fault.bitflip=0:3"}, "ZeRO-3 does not hold");
  refused({"fault.spike_factor=0.5"}, "0 (off) or above 1");
  // Drills that could never fire.
  refused({"fault.nan=0:0"}, "step 0 is never run");
  refused({"fault.nan=0:500"}, "step 500 is never run");
  refused({"checkpoint.dir=/tmp/x", "checkpoint.every=5", "fault.kill=0:7:checkpoint"},
          "no checkpoint is saved after step 7");
  refused({"checkpoint.dir=/tmp/x", "checkpoint.every=5", "fault.enospc=7"}, "no checkpoint is saved after step 7");
  refused({"fault.hang=0:3"}, "at one rank: nothing would notice");
  EXPECT_NO_THROW(
      with({"checkpoint.dir=/tmp/x", "checkpoint.every=5", "fault.ckpt_corrupt=400"}));  // the last step saves
  EXPECT_NO_THROW(with({"fault.grace_s=0"}));                                            // no limit
  EXPECT_NO_THROW(with({"parallel.dp=2", "checkpoint.dir=/tmp/x", "checkpoint.every=7", "fault.kill=1:7:checkpoint",
                        "fault.slow=0:40", "fault.sdc_every=1"}));
}

TEST(Supervise, RestartsWhatARestartCanCure) {
  EXPECT_FALSE(status_restartable(0));   // done
  EXPECT_FALSE(status_restartable(2));   // fix the config first
  EXPECT_TRUE(status_restartable(3));    // a rank exited
  EXPECT_TRUE(status_restartable(4));    // the watchdog
  EXPECT_TRUE(status_restartable(74));   // a checkpoint write failed
  EXPECT_TRUE(status_restartable(75));   // preempted
  EXPECT_TRUE(status_restartable(137));  // SIGKILL
}

}  // namespace
}  // namespace loom
