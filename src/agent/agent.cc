// Placeholder while the agent is split into its parts (issue 9).
#include "ddprun/agent/agent.h"

namespace ddprun::agent {
class Agent::Impl {};
Agent::Agent(LaunchConfig, AgentParts) {}
Agent::~Agent() = default;
int Agent::run() { return kExitSetup; }
void Agent::signal(int) {}
}  // namespace ddprun::agent
