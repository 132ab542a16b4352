// Signals that are not the agent's to act on: a cluster manager that signals
// every process of the job (Slurm), and one that enforces its own grace
// period after SIGTERM.
#include "agent_harness.h"

namespace ddprun::agent {
namespace {

// Under Slurm, SIGUSR1/SIGUSR2 reach every process of the step from Slurm:
// the agent lives through them, forwards nothing and stops nothing.
TEST(AgentSignals, ASurvivedSignalNeitherStopsNorIsForwarded) {
  LaunchConfig c = config(2, 0);
  c.survivedSignals = {SIGUSR1, SIGUSR2};
  Harness h(c);
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    h.agent->signal(SIGUSR1);
    h.agent->signal(SIGUSR2);
    h.agent->signal(SIGTERM);  // ends the test
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  for (const auto& s : h.launches->signals) EXPECT_EQ(s.second, SIGTERM);
  EXPECT_NE(h.err.find("received SIGUSR1; the sender signalled every process"),
            std::string::npos)
      << h.err;
  EXPECT_NE(h.err.find("received SIGUSR2"), std::string::npos) << h.err;
  EXPECT_EQ(h.rdzv->joins, 1);
}

// The sender of SIGTERM enforces its grace period (Slurm's KillWait or
// GraceTime): no SIGKILL from the agent, even with a 0 s shutdown timeout.
// Nothing else is pending, so run() returns with the worker still running.
TEST(AgentSignals, NoSigkillAfterASignalWhoseSenderEnforcesTheGrace) {
  for (bool killAfterSignal : {true, false}) {
    LaunchConfig c = config(2, 0);
    c.killAfterSignal = killAfterSignal;
    Harness h(c);
    h.policy = [](int, int lr) {
      Behaviour b;
      b.ignoresSigterm = lr == 0;
      return b;
    };
    h.hook = [&h](FakeRendezvous& r, int round) {
      r.complete(round);
      h.agent->signal(SIGTERM);
    };
    int rc = h.run();
    bool killed = false;
    for (const auto& s : h.launches->signals) killed |= s.second == SIGKILL;
    EXPECT_EQ(killed, killAfterSignal);
    if (killAfterSignal) {
      EXPECT_EQ(rc, 128 + SIGTERM);
    }
  }
}

// A stop of the agent's own making (a failure) is still bounded.
TEST(AgentSignals, AFailureStopIsStillBoundedWithoutKillAfterSignal) {
  LaunchConfig c = config(2, 0);
  c.killAfterSignal = false;
  Harness h(c);
  h.policy = [](int, int lr) {
    Behaviour b;
    if (lr == 1) b.exitCode = 2;
    else b.ignoresSigterm = true;
    return b;
  };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  EXPECT_EQ(h.launches->signals[1].second, SIGKILL);
}

}  // namespace
}  // namespace ddprun::agent
