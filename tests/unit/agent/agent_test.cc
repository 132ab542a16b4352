// The agent's state machine, driven by a fake launcher (no processes: exits
// are scripted) and a fake rendezvous (rounds and round events are scripted);
// the fakes and the harness are in agent_harness.h.
#include "agent_harness.h"

namespace ddprun::agent {
namespace {

TEST(AgentStateMachine, AllSucceedFirstTime) {
  Harness h(config(3, 0));
  h.policy = [](int, int) { return Behaviour{0}; };
  EXPECT_EQ(h.run(), kExitSuccess);
  EXPECT_EQ(h.launches->starts.size(), 3u);
  EXPECT_TRUE(h.launches->signals.empty());
  EXPECT_EQ(h.rdzv->successes, std::vector<int>{0});
  EXPECT_TRUE(h.rdzv->shutdown);
  // One start line by default, in the one console style.
  EXPECT_EQ(count(h.err, "ddprun: started 3 workers (ranks 0-2 of 3); worker store at "
                         "127.0.0.1:29999; logs in "),
            1u)
      << h.err;
}

TEST(AgentStateMachine, FailureStopsTheOthersThenOneRestartSucceeds) {
  Harness h(config(2, 3));
  h.policy = [](int attempt, int lr) {
    if (attempt == 0 && lr == 1) return Behaviour{3};
    if (attempt == 0) return Behaviour{};  // runs until stopped
    return Behaviour{0};
  };
  EXPECT_EQ(h.run(), kExitSuccess);
  ASSERT_EQ(h.launches->starts.size(), 4u);
  EXPECT_EQ(h.launches->starts[2].attempt, 1);
  EXPECT_EQ(h.launches->starts[3].env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(h.launches->starts[3].env.at("TORCHELASTIC_MAX_RESTARTS"), "3");
  // Rank 0 of attempt 0 was asked to stop with SIGTERM; nothing was killed.
  ASSERT_EQ(h.launches->signals.size(), 1u);
  EXPECT_EQ(h.launches->signals[0], std::make_pair(h.launches->starts[0].pid, SIGTERM));
  // The failure went to the rendezvous, with restarts left (not closing).
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_NE(h.rdzv->failures[0].first.find("rank 1 (local_rank 1"), std::string::npos);
  EXPECT_FALSE(h.rdzv->failures[0].second);
  EXPECT_EQ(h.rdzv->joins, 2);
  EXPECT_NE(h.err.find("restart 1 of 3"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, RestartBudgetIsExactlyMaxRestartsAndCountedUp) {
  Harness h(config(2, 2));
  h.policy = [](int, int lr) { return lr == 0 ? Behaviour{1} : Behaviour{}; };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.launches->starts.size(), 6u);  // 1 attempt + 2 restarts, 2 workers each
  EXPECT_EQ(h.launches->starts.back().attempt, 2);
  EXPECT_NE(h.err.find("restart 1 of 2"), std::string::npos) << h.err;
  EXPECT_NE(h.err.find("restart 2 of 2"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("restarts left"), std::string::npos) << h.err;
  // Only the last failure closes the job.
  ASSERT_EQ(h.rdzv->failures.size(), 3u);
  EXPECT_FALSE(h.rdzv->failures[0].second);
  EXPECT_FALSE(h.rdzv->failures[1].second);
  EXPECT_TRUE(h.rdzv->failures[2].second);
  // The report: rank 0 is the root cause, rank 1 a victim.
  EXPECT_NE(h.err.find("Root Cause (first observed failure):\n[0]:"), std::string::npos);
  EXPECT_NE(h.err.find("stopped by ddprun"), std::string::npos);
}

TEST(AgentStateMachine, WorkerIgnoringSigtermGetsSigkillAfterGrace) {
  Harness h(config(2, 0));
  h.policy = [](int, int lr) {
    Behaviour b;
    if (lr == 1) b.exitCode = 2;
    else b.ignoresSigterm = true;
    return b;
  };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  EXPECT_EQ(h.launches->signals[0].second, SIGTERM);
  EXPECT_EQ(h.launches->signals[1].second, SIGKILL);
}

TEST(AgentStateMachine, TwoSimultaneousFailuresAreBothCulprits) {
  Harness h(config(3, 0));
  h.policy = [](int, int lr) { return lr < 2 ? Behaviour{lr + 1} : Behaviour{}; };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  // Only rank 2 was running when the agent stopped the group.
  ASSERT_EQ(h.launches->signals.size(), 1u);
  EXPECT_EQ(h.launches->signals[0].first, h.launches->starts[2].pid);
  // Ranks 0 and 1 failed by themselves: neither is a victim; rank 2 is.
  EXPECT_EQ(count(h.err, "stopped by ddprun"), 1u) << h.err;
  EXPECT_NE(h.err.find("rank      : 0 (local_rank: 0)"), std::string::npos);
  EXPECT_NE(h.err.find("rank      : 1 (local_rank: 1)"), std::string::npos);
  // The report also lands in the log directory.
  bool found = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(h.dir.file("logs")))
    found |= e.path().filename() == "failure_report.txt";
  EXPECT_TRUE(found);
}

TEST(AgentStateMachine, SignalDuringJoinEndsTheAgentAtOnce) {
  Harness h(config(2, 0));
  h.hook = [&h](FakeRendezvous&, int) { h.agent->signal(SIGINT); };  // the join never completes
  EXPECT_EQ(h.run(), 128 + SIGINT);
  EXPECT_TRUE(h.rdzv->cancelled);
  EXPECT_TRUE(h.launches->starts.empty());
}

// A static job cannot go on with a node missing: the others are told at once.
TEST(AgentStateMachine, SignalWhileRunningWithTheStaticRendezvousClosesTheJob) {
  LaunchConfig c = config(2, 3);
  c.minNodes = c.maxNodes = 2;
  Harness h(c);
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    h.agent->signal(SIGTERM);  // runs after the workers started
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  for (const auto& s : h.launches->signals) EXPECT_EQ(s.second, SIGTERM);
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_TRUE(h.rdzv->failures[0].second);  // closes the job for every node
  EXPECT_EQ(h.rdzv->joins, 1);              // no restart after a signal
}

// With the elastic rendezvous a signalled node leaves: nothing is reported
// (a closing report would end the job for every node); shutdown() leaves.
TEST(AgentStateMachine, SignalWithTheElasticRendezvousLeavesWithoutClosing) {
  LaunchConfig c = config(2, 3);
  c.useDynamic = true;
  c.minNodes = 1;
  c.maxNodes = 4;
  Harness h(c);
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    h.agent->signal(SIGTERM);
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  for (const auto& s : h.launches->signals) EXPECT_EQ(s.second, SIGTERM);
  EXPECT_TRUE(h.rdzv->failures.empty());  // neither a closing nor any failure report
  EXPECT_TRUE(h.rdzv->shutdown);
  EXPECT_EQ(h.rdzv->joins, 1);
}

// Same after the workers succeeded, while the node waits for the round's end.
TEST(AgentStateMachine, SignalAfterLocalSuccessWithTheElasticRendezvousLeaves) {
  LaunchConfig c = config(1, 0);
  c.useDynamic = true;
  c.maxNodes = 2;
  Harness h(c);
  h.groups = 2;
  h.autoFinish = false;
  h.policy = [](int, int) { return Behaviour{0}; };
  h.onSuccess = [&h] { h.agent->signal(SIGINT); };
  EXPECT_EQ(h.run(), 128 + SIGINT);
  EXPECT_EQ(h.rdzv->successes, std::vector<int>{0});
  EXPECT_TRUE(h.rdzv->failures.empty());
  EXPECT_TRUE(h.rdzv->shutdown);
}

TEST(AgentStateMachine, PeerFailureStopsAndRestartsTogether) {
  Harness h(config(2, 1));
  h.groupRank = 0;
  h.groups = 2;
  h.policy = [](int attempt, int) { return attempt == 0 ? Behaviour{} : Behaviour{0}; };
  h.hook = [](FakeRendezvous& r, int round) {
    r.complete(round);
    if (round == 0) r.emit({0, RoundEnd::kFailed, 1, "rank 3 exited with 1"});
  };
  EXPECT_EQ(h.run(), kExitSuccess);
  EXPECT_EQ(h.startsInAttempt(0), 2);
  EXPECT_EQ(h.startsInAttempt(1), 2);
  EXPECT_EQ(h.launches->starts.back().env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_TRUE(h.rdzv->failures.empty());  // not ours to report
  EXPECT_NE(h.err.find("the job failed on node 1 (rank 3 exited with 1)"), std::string::npos)
      << h.err;
}

TEST(AgentStateMachine, PeerClosedEndsTheJobNamingThePeerNotALocalVictim) {
  Harness h(config(2, 3));
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [](FakeRendezvous& r, int round) {
    r.complete(round);
    r.emit({round, RoundEnd::kClosed, 1, "rank 2 exited with 1"});
  };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.rdzv->joins, 1);
  EXPECT_NE(h.err.find("the job failed on node 1"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("Root Cause"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, MembershipChangeRestartsWithoutCounting) {
  Harness h(config(1, 0));  // no restart budget at all
  h.policy = [](int, int) { return Behaviour{}; };
  int joins = 0;
  h.hook = [&](FakeRendezvous& r, int round) {
    ++joins;
    r.complete(round);
    if (round == 0) r.emit({0, RoundEnd::kMembershipChanged, 2, "node 2 is waiting"});
    else h.agent->signal(SIGTERM);  // end the test from the second round
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  EXPECT_EQ(joins, 2);
  ASSERT_EQ(h.launches->starts.size(), 2u);
  EXPECT_EQ(h.launches->starts[1].env.at("TORCHELASTIC_RESTART_COUNT"), "0");
  // Who changed it is named, and the restart is said to be free; not a warning.
  EXPECT_NE(
      h.err.find("ddprun: the set of nodes changed (node 2 is waiting); restarting the "
                 "workers (not counted as a restart)"),
      std::string::npos)
      << h.err;
  EXPECT_EQ(h.err.find("warning: the set of nodes"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("restart 1 of"), std::string::npos) << h.err;
}

// Workers that fail because a peer node died (its loss broke their
// collective): the rendezvous finds the peer gone and ends the round as a
// membership change; with no restart budget at all, the job goes on, the
// restart is not counted, and no failure report is written.
void expectFailureAbsorbed(int nproc) {
  LaunchConfig c = config(nproc, 0);
  c.useDynamic = true;  // a signal then leaves without a report
  c.maxNodes = 3;
  Harness h(c);
  h.absorbs = true;
  h.failureBecomes = RoundEvent{0, RoundEnd::kMembershipChanged, 1,
                                "node 10.0.0.3 (pid 7) is gone: its connection to the "
                                "rendezvous store closed"};
  int started = 0;  // the attempt stays 0: the restart is not counted
  h.policy = [&started](int, int) {
    if (started++ == 0) return Behaviour{1};  // the first worker of round 0
    return Behaviour{};                         // runs until stopped
  };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    if (round == 1) h.agent->signal(SIGTERM);  // end the test from the second round
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  EXPECT_EQ(h.rdzv->joins, 2);
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_TRUE(h.rdzv->failures[0].second);  // asked to close: no budget; the loss won
  ASSERT_EQ(h.launches->starts.size(), 2u * nproc);
  EXPECT_EQ(h.launches->starts.back().env.at("TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_NE(h.err.find("the set of nodes changed (node 10.0.0.3 (pid 7) is gone: its "
                       "connection to the rendezvous store closed); this node's workers "
                       "failed with it (rank 0"),
            std::string::npos)
      << h.err;
  EXPECT_NE(h.err.find("not counted as a restart"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("restart 1 of"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("Root Cause"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, FailureAfterAPeersLossIsThatMembershipChange) {
  expectFailureAbsorbed(1);
}

TEST(AgentStateMachine, FailureAfterAPeersLossStopsTheOtherWorkersThenReforms) {
  expectFailureAbsorbed(2);
}

// Where the rendezvous could absorb a failure but finds no peer gone, the
// failure is what it was: with no budget, the job ends with the report.
TEST(AgentStateMachine, FailureWithEveryPeerAliveStillEndsTheJob) {
  Harness h(config(1, 0));
  h.absorbs = true;
  h.policy = [](int, int) { return Behaviour{1}; };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.rdzv->joins, 1);
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_TRUE(h.rdzv->failures[0].second);
  EXPECT_NE(h.err.find("Root Cause"), std::string::npos) << h.err;
}

// A membership change with the job-wide count: the count stays, no budget
// is needed, and the round's workers see the same TORCHELASTIC_RESTART_COUNT.
TEST(AgentStateMachine, MembershipChangeKeepsTheJobWideCount) {
  LaunchConfig c = config(1, 2);
  c.useDynamic = true;
  c.maxNodes = 3;
  Harness h(c);
  h.groups = 2;
  h.jobRestarts = [](int) { return 1; };  // one failed round before this node came
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    if (round == 0)
      r.emit({0, RoundEnd::kMembershipChanged, 1, "node 10.0.0.3 (pid 7) left"});
    else
      h.agent->signal(SIGTERM);
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  ASSERT_EQ(h.launches->starts.size(), 2u);
  for (const auto& st : h.launches->starts)
    EXPECT_EQ(st.env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_NE(h.err.find("node 10.0.0.3 (pid 7) left"), std::string::npos) << h.err;
  // Said once, when this node first learned of it.
  EXPECT_EQ(count(h.err, "the job has used 1 of 2 restarts"), 1u) << h.err;
}

// A node arriving after restarts were spent elsewhere takes the job's count
// (workers, attempt directory, budget); its own restarts continue from it
// and the "restart K of N" line agrees with the count the rendezvous gives.
TEST(AgentStateMachine, RestartCountIsTheRendezvousJobWideCount) {
  Harness h(config(1, 3));
  h.groups = 2;
  h.jobRestarts = [](int round) { return 2 + round; };  // round 0 of this node: 2 used
  h.policy = [](int, int) { return Behaviour{1}; };     // every attempt fails
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  ASSERT_EQ(h.launches->starts.size(), 2u);  // attempts 2 and 3; then the budget is spent
  EXPECT_EQ(h.launches->starts[0].env.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(h.launches->starts[1].env.at("TORCHELASTIC_RESTART_COUNT"), "3");
  EXPECT_NE(h.err.find("the job has used 2 of 3 restarts so far"), std::string::npos)
      << h.err;
  EXPECT_NE(h.err.find("restart 3 of 3"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("restart 1 of"), std::string::npos) << h.err;
  // The first failure leaves one restart (not closing), the second closes.
  ASSERT_EQ(h.rdzv->failures.size(), 2u);
  EXPECT_FALSE(h.rdzv->failures[0].second);
  EXPECT_TRUE(h.rdzv->failures[1].second);
  EXPECT_TRUE(std::filesystem::exists(h.startedDir("attempt_2")));
  EXPECT_TRUE(std::filesystem::exists(h.startedDir("attempt_3")));
  EXPECT_FALSE(std::filesystem::exists(h.startedDir("attempt_0")));
}

// A node that arrives after the job is over has nothing to do: one line, exit 0.
TEST(AgentStateMachine, JobAlreadyOverExitsZeroWithOneLine) {
  for (const auto& [message, reason] :
       {std::pair<std::string, std::string>{"the job job7 is already over: finished",
                                            "finished"},
        {"the job job7 is already over (closed by node 1: rank 3 exited with 1)",
         "closed by node 1: rank 3 exited with 1"},
        {"closed after the last restart", "closed after the last restart"}}) {
    LaunchConfig c = config(2, 1);
    c.rdzvId = "job7";
    c.useDynamic = true;
    c.maxNodes = 4;
    Harness h(c);
    h.hook = [msg = message](FakeRendezvous& r, int) {
      r.fail(std::make_exception_ptr(rendezvous::ClosedError(msg, "dyn.cc", 1)));
    };
    EXPECT_EQ(h.run(), kExitSuccess) << message;
    EXPECT_TRUE(h.launches->starts.empty());
    EXPECT_EQ(count(h.err, "ddprun: the job job7 is already over (" + reason +
                               "); nothing to do\n"),
              1u)
        << h.err;
    EXPECT_EQ(h.err.find("error"), std::string::npos) << h.err;
    EXPECT_EQ(h.err.find("dyn.cc"), std::string::npos) << h.err;
    EXPECT_TRUE(h.rdzv->failures.empty());
  }
}

// A node that ran workers of this job and, joining again after its round
// failed, finds the job over exits with the job's result (issue 40): 1 when
// the job ended failed (it exited 0 before, as a late node would), 0 when it
// finished without this node.
TEST(AgentStateMachine, ReJoiningIntoAClosedJobExitsWithTheJobsResult) {
  for (bool finished : {false, true}) {
    LaunchConfig c = config(1, 3);
    c.rdzvId = "job7";
    Harness h(c);
    h.groups = 2;
    h.policy = [](int attempt, int) { return attempt == 0 ? Behaviour{1} : Behaviour{0}; };
    h.hook = [finished](FakeRendezvous& r, int round) {
      if (round == 0) return r.complete(round);
      r.fail(std::make_exception_ptr(rendezvous::ClosedError(
          "the job job7 is already over: closed", "dyn.cc", 1, finished)));
    };
    EXPECT_EQ(h.run(), finished ? kExitSuccess : kExitWorkersFailed) << finished;
    EXPECT_EQ(h.rdzv->joins, 2);
    EXPECT_EQ(h.err.find("nothing to do"), std::string::npos) << h.err;
    if (finished)
      EXPECT_NE(h.err.find("ddprun: the job job7 finished without this node (closed)"),
                std::string::npos)
          << h.err;
    else
      EXPECT_NE(h.err.find("ddprun: error: the job job7 ended while this node was joining "
                           "again (closed)"),
                std::string::npos)
          << h.err;
  }
}

// This node's failure (restarts left) ended its round as closed, not failed:
// the rendezvous cannot restart the job (its state is gone). Exit 1 at
// once, without joining again (issue 40: a store restarted empty).
TEST(AgentStateMachine, OwnFailureEndingTheRoundAsClosedEndsTheJob) {
  Harness h(config(1, 3));
  h.groups = 2;
  h.absorbs = true;
  h.policy = [](int, int) { return Behaviour{1}; };
  h.failureBecomes = RoundEvent{0, RoundEnd::kClosed, 0,
                                "rank 0 exited with 1; the job cannot restart: the state was deleted"};
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.rdzv->joins, 1);
  EXPECT_NE(h.err.find("Root Cause"), std::string::npos) << h.err;
}

// Several nodes: the start line names the rendezvous (its describe()).
TEST(AgentStateMachine, StartLineNamesTheRendezvousAcrossNodes) {
  LaunchConfig c = config(2, 0);
  c.minNodes = 2;
  c.maxNodes = 4;
  c.useDynamic = true;
  Harness h(c);
  h.groupRank = 1;
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{0}; };
  EXPECT_EQ(h.run(), kExitSuccess);
  EXPECT_EQ(count(h.err,
                  "ddprun: started 2 workers (ranks 2-3 of 4) on node 1 of 2"
                  "; rendezvous fake; worker store at 127.0.0.1:29999; logs in "),
            1u)
      << h.err;
}

TEST(AgentConfig, DynamicRendezvousSpecFromTheFlags) {
  LaunchConfig c;
  c.script = "train.py";
  c.rdzvBackend = "c10d";
  c.rdzvEndpoint = "[fd00::1]:29411";
  c.rdzvId = "job7";
  c.minNodes = 2;
  c.maxNodes = 4;
  c.localAddr = "10.0.0.7";
  c.rdzvConf = {{"join_timeout", "90"},
                {"last_call_timeout", "2.5"},
                {"close_timeout", "7"},
                {"read_timeout", "11"},
                {"keep_alive_interval", "0.5"},
                {"keep_alive_max_attempt", "4"},
                {"is_host", "no"}};
  finalizeConfig(c);
  ASSERT_TRUE(c.useDynamic);
  const auto spec = rendezvousSpec(c);
  ASSERT_EQ(spec.kind, rendezvous::RendezvousSpec::Kind::kDynamic);
  const auto& o = spec.dynamic;
  EXPECT_EQ(o.endpointHost, "fd00::1");
  EXPECT_EQ(o.endpointPort, 29411);
  EXPECT_FALSE(o.isHost);
  EXPECT_TRUE(o.isHostExplicit);
  EXPECT_EQ(o.runId, "job7");
  EXPECT_EQ(o.minNodes, 2);
  EXPECT_EQ(o.maxNodes, 4);
  EXPECT_EQ(o.localAddr, "10.0.0.7");
  EXPECT_EQ(o.joinTimeout, std::chrono::seconds(90));
  EXPECT_EQ(o.lastCallTimeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(o.closeTimeout, std::chrono::seconds(7));
  EXPECT_EQ(o.readTimeout, std::chrono::seconds(11));
  EXPECT_EQ(o.keepAliveInterval, std::chrono::milliseconds(500));
  EXPECT_EQ(o.keepAliveMaxAttempt, 4);
}

TEST(AgentStateMachine, WaitsForTheRoundToFinishAfterLocalSuccess) {
  Harness h(config(1, 0));
  h.groups = 2;
  h.autoFinish = false;
  h.policy = [](int, int) { return Behaviour{0}; };
  // The peer is still running when our worker succeeds; it then fails. With
  // no budget the job is over: exit 1, naming the peer.
  h.afterSuccess = RoundEvent{0, RoundEnd::kClosed, 1, "rank 1 exited with 1"};
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.rdzv->successes, std::vector<int>{0});
  EXPECT_NE(h.err.find("the job failed on node 1"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, StoreLostAfterLocalSuccessIsSuccess) {
  Harness h(config(1, 0));
  h.groups = 2;
  h.autoFinish = false;
  h.policy = [](int, int) { return Behaviour{0}; };
  h.afterSuccess = RoundEvent{0, RoundEnd::kStoreLost, 0, ""};
  EXPECT_EQ(h.run(), kExitSuccess);
}

// The endpoint's store gone while the workers run: the job is over (exit 1);
// the backend's reason, which names the store, is said once, not wrapped.
TEST(AgentStateMachine, StoreLostWhileRunningEndsTheJobNamingTheStore) {
  Harness h(config(1, 3));
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [](FakeRendezvous& r, int round) {
    r.complete(round);
    r.emit({round, RoundEnd::kStoreLost, -1, "the rendezvous store at head:29400 is gone"});
  };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.rdzv->joins, 1);  // no restart: nowhere to meet
  EXPECT_NE(h.err.find("ddprun: warning: the rendezvous store at head:29400 is gone; "
                       "stopping this node's workers"),
            std::string::npos)
      << h.err;
  EXPECT_EQ(h.err.find("store is gone ("), std::string::npos) << h.err;
  EXPECT_NE(h.err.find("ddprun: the rendezvous store at head:29400 is gone; this node's "
                       "workers were stopped\n"),
            std::string::npos)
      << h.err;
}

TEST(AgentStateMachine, JoinFailureIsASetupError) {
  Harness h(config(2, 5));
  h.hook = [](FakeRendezvous& r, int) {
    r.fail(std::make_exception_ptr(
        TimeoutError("not every one of the 2 nodes joined: node 1 is missing", "x.cc", 1)));
  };
  EXPECT_EQ(h.run(), kExitSetup);
  EXPECT_TRUE(h.launches->starts.empty());
  EXPECT_NE(h.err.find("ddprun: error: not every one of the 2 nodes joined"),
            std::string::npos)
      << h.err;
  EXPECT_EQ(h.err.find("x.cc"), std::string::npos);  // no source locations
}

TEST(AgentStateMachine, SpawnFailureExitsThree) {
  Harness h(config(3, 2));
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    h.launches->failStartAt = 2;
    r.complete(round);
  };
  EXPECT_EQ(h.run(), kExitSetup);
  EXPECT_EQ(h.launches->starts.size(), 2u);
  // The two started workers were killed; the job is closed for every node.
  EXPECT_EQ(h.launches->signals.size(), 2u);
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_TRUE(h.rdzv->failures[0].second);
  EXPECT_NE(h.err.find("ddprun: error: cannot start worker"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, ACrashStormReachesItsBudget) {
  Harness h(config(2, 300));
  h.policy = [](int, int lr) { return lr == 0 ? Behaviour{1} : Behaviour{}; };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.launches->starts.size(), 602u);
  EXPECT_EQ(h.launches->starts.back().env.at("TORCHELASTIC_RESTART_COUNT"), "300");
  EXPECT_EQ(h.rdzv->joins, 301);
}

TEST(AgentStateMachine, NoUnhonouredFlagIsSilent) {
  LaunchConfig c = config(1, 0);
  c.warnings = {"--numa-binding=node is not supported yet; workers are not bound"};
  Harness h(c);
  h.policy = [](int, int) { return Behaviour{0}; };
  EXPECT_EQ(h.run(), kExitSuccess);
  EXPECT_EQ(count(h.err, "ddprun: warning: --numa-binding=node is not supported yet"), 1u);
}

}  // namespace
}  // namespace ddprun::agent

