// Where a rank sits and how many threads it takes, from each launcher's real variables (a fake
// environment per case). The srun case is the one that took every core per rank before. Also the
// words every count in a message goes through (plural: "1 thread", not "1 threads").
#include <map>

#include "launch/elastic.h"
#include "runtime/launch_env.h"
#include "testing.h"

using namespace loom;

namespace {
EnvGet env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* k) -> const char* {
    auto it = vars.find(k);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST(LaunchEnv, SlurmTaskListsByNode) {
  for (int node = 0; node < 3; ++node) EXPECT_EQ(slurm_tasks_on_node("2(x3),1", node), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), 0);
  EXPECT_EQ(slurm_tasks_on_node("3,1", 1), 1);
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
}

// `srun -n 2` in a one-task allocation: the step's list says 2 here, the allocation's says 1,
// and neither OMPI_COMM_WORLD_LOCAL_SIZE nor SLURM_NTASKS_PER_NODE is set.
TEST(LaunchEnv, SrunSharesTheNodeAmongItsStepsTasks) {
  const EnvGet get = env_of({{"SLURM_PROCID", "1"},
                             {"SLURM_NTASKS", "2"},
                             {"SLURM_STEP_ID", "0"},
                             {"SLURM_LOCALID", "1"},
                             {"SLURM_NODEID", "0"},
                             {"SLURM_STEP_TASKS_PER_NODE", "2"},
                             {"SLURM_TASKS_PER_NODE", "1"}});
  const LaunchEnv e = launch_env_read(get);
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.local_from, "SLURM_STEP_TASKS_PER_NODE");
  const ThreadChoice t = threads_choose(0, e, get, 16);
  EXPECT_EQ(t.threads, 8);
  EXPECT_NE(t.why.find("shared by 2 ranks"), std::string::npos) << t.why;
}

TEST(LaunchEnv, SlurmSecondNodeOfAStep) {
  const LaunchEnv e = launch_env_read(env_of({{"SLURM_PROCID", "3"},
                                              {"SLURM_NTASKS", "4"},
                                              {"SLURM_STEP_ID", "1"},
                                              {"SLURM_NODEID", "1"},
                                              {"SLURM_STEP_TASKS_PER_NODE", "3,1"}}));
  EXPECT_EQ(e.node, 1);
  EXPECT_EQ(e.local_size, 1);
}

TEST(LaunchEnv, CpusPerTaskThenOmpThenConfigWin) {
  std::map<std::string, std::string> vars = {{"SLURM_PROCID", "0"},
                                             {"SLURM_NTASKS", "2"},
                                             {"SLURM_STEP_ID", "0"},
                                             {"SLURM_STEP_TASKS_PER_NODE", "2"},
                                             {"SLURM_CPUS_PER_TASK", "3"}};
  LaunchEnv e = launch_env_read(env_of(vars));
  ThreadChoice t = threads_choose(0, e, env_of(vars), 16);
  EXPECT_EQ(t.threads, 3);
  EXPECT_EQ(t.why, "SLURM_CPUS_PER_TASK");
  vars["OMP_NUM_THREADS"] = "5";
  t = threads_choose(0, e, env_of(vars), 16);
  EXPECT_EQ(t.threads, 5);
  EXPECT_EQ(t.why, "OMP_NUM_THREADS");
  t = threads_choose(2, e, env_of(vars), 16);
  EXPECT_EQ(t.threads, 2);
  EXPECT_EQ(t.why, "train.threads");
}

TEST(LaunchEnv, MpirunAndPmixLocalSizes) {
  const EnvGet ompi = env_of({{"OMPI_COMM_WORLD_SIZE", "8"},
                              {"OMPI_COMM_WORLD_RANK", "5"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                              {"OMPI_COMM_WORLD_NODE_RANK", "1"}});
  LaunchEnv e = launch_env_read(ompi);
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.local_size, 4);
  EXPECT_EQ(threads_choose(0, e, ompi, 16).threads, 4);
  const EnvGet pmix = env_of({{"PMIX_RANK", "1"}, {"PMIX_SIZE", "2"}, {"PMIX_LOCAL_SIZE", "2"}});
  e = launch_env_read(pmix);
  EXPECT_EQ(e.launcher, "pmix");
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(threads_choose(0, e, pmix, 7).threads, 3);
}

// A batch script that runs loom without srun is one process with the job's CPUs.
TEST(LaunchEnv, BatchScriptWithoutSrunIsOneProcess) {
  const EnvGet get = env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_CPUS_PER_TASK", "6"}});
  const LaunchEnv e = launch_env_read(get);
  EXPECT_FALSE(e.distributed());
  EXPECT_EQ(threads_choose(0, e, get, 16).threads, 6);
  const LaunchEnv none = launch_env_read(env_of({}));
  EXPECT_EQ(threads_choose(0, none, env_of({}), 16).threads, 16);
}

// Elastic restarts (launch/elastic.h): hosts parsed and refused by name, the placeholders
// filled, the largest layout the survivors hold that the config accepts, and the hosts it takes.
TEST(Elastic, HostsLayoutsAndPlaceholders) {
  const std::vector<Host> hosts = hosts_parse("n0:2,n1:2,n2");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[2].slots, 1);
  EXPECT_EQ(hosts_str(hosts), "n0:2,n1:2,n2:1");
  for (const char* bad : {"n0:0", "n0:x", ":2", "n0:2,n0:2", ""}) EXPECT_THROW(hosts_parse(bad), Error) << bad;

  const std::vector<std::string> cmd = {"mpirun", "--host", "{hosts}",         "-np", "{ranks}", "/x/loom",
                                        "train",  "--set",  "parallel.dp={dp}"};
  const auto filled = command_fill(cmd, 4, 2, "n0:2,n1:2", "n0,n1");
  EXPECT_EQ(filled[2], "n0:2,n1:2");
  EXPECT_EQ(filled[4], "4");
  EXPECT_EQ(filled[8], "parallel.dp=2");
  EXPECT_EQ(train_part(cmd).front(), "/x/loom");
  EXPECT_EQ(train_part(cmd).size(), 4u);
  EXPECT_TRUE(train_part({"mpirun", "loom", "eval"}).empty());

  ElasticOptions o;
  o.min_ranks = 2, o.max_ranks = 8, o.replica = 2, o.hosts = hosts;
  // 5 slots hold 4 ranks (two replicas of 2); a config that takes only dp 1 gets 2.
  EXPECT_EQ(elastic_ranks(o, hosts, [](int) { return true; }), 4);
  EXPECT_EQ(elastic_ranks(o, hosts, [](int r) { return r == 2; }), 2);
  EXPECT_EQ(elastic_ranks(o, {hosts[2]}, [](int) { return true; }), 0) << "1 slot holds no replica of 2";
  EXPECT_EQ(hosts_str(hosts_take(hosts, 3)), "n0:2,n1:1");
  EXPECT_EQ(hosts_str(hosts_take(hosts, 2)), "n0:2");
  EXPECT_EQ(nodelist_str(hosts_take(hosts, 3)), "n0,n1");
  EXPECT_EQ(command_fill({"srun", "-w", "{nodelist}"}, 3, 3, "", "n0,n1")[2], "n0,n1");

  // Slurm's tasks per node: the same on each, or per node from the compressed list.
  const std::vector<std::string> names = {"a", "b", "c", "d"};
  EXPECT_EQ(hosts_str(slurm_slots(names, "2", "")), "a:2,b:2,c:2,d:2");
  EXPECT_EQ(hosts_str(slurm_slots(names, "", "3(x2),1,2")), "a:3,b:3,c:1,d:2");
  EXPECT_THROW(slurm_slots(names, "", "2(x2)"), Error) << "a node the list does not cover";

  // The probe: a host answers when the command exits 0 in time.
  o.probe = "test {host} = n1";
  EXPECT_TRUE(host_answers(o, "n1"));
  EXPECT_FALSE(host_answers(o, "n0"));
  o.probe = "sleep 5", o.probe_s = 0.2;
  EXPECT_FALSE(host_answers(o, "n1")) << "a probe past its time is a host that does not answer";

  // Options that cannot work are refused before anything runs.
  ElasticOptions none;
  EXPECT_THROW(elastic_check(none, cmd), Error) << "placeholders without --ranks";
  ElasticOptions bad = o;
  bad.probe.clear(), bad.probe_s = 10;
  EXPECT_THROW(elastic_check(bad, {"mpirun", "-np", "4", "loom", "train"}), Error) << "nothing to fill";
  bad.min_ranks = 5, bad.max_ranks = 4;
  EXPECT_THROW(elastic_check(bad, cmd), Error) << "MIN > MAX";
  bad.min_ranks = 3, bad.max_ranks = 3;
  EXPECT_THROW(elastic_check(bad, cmd), Error) << "no multiple of the replica";
}

TEST(Words, PluralIsSingularAtOneOnly) {
  EXPECT_EQ(plural(1, "thread"), "1 thread");
  EXPECT_EQ(plural(2, "thread"), "2 threads");
  EXPECT_EQ(plural(0, "rank"), "0 ranks");
  EXPECT_EQ(plural(-1, "step"), "-1 steps");
  EXPECT_EQ(plural(size_t(1), "micro-batch"), "1 micro-batch");
  EXPECT_EQ(plural(int64_t(3), "micro-batch"), "3 micro-batches");
  EXPECT_EQ(plural(2u, "process"), "2 processes");
  EXPECT_EQ(plural(4, "box"), "4 boxes");
  EXPECT_EQ(plural(2, "mesh"), "2 meshes");
  EXPECT_EQ(plural(1, "thread waits", "threads wait"), "1 thread waits");
  EXPECT_EQ(plural(32, "thread waits", "threads wait"), "32 threads wait");
  // A start line at one rank, one thread, one micro-batch says no "1 threads" (through threads_choose).
  LaunchEnv one;
  one.local_size = 1;
  one.local_from = "OMPI_COMM_WORLD_LOCAL_SIZE";
  const ThreadChoice t = threads_choose(0, one, env_of({}), 1);
  EXPECT_NE(t.why.find("1 core shared by 1 rank on this node"), std::string::npos) << t.why;
}
