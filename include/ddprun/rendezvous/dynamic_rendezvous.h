// The dynamic (c10d-style, elastic) rendezvous: --rdzv-backend=c10d with
// --nnodes MIN:MAX. Any number of agents between MIN and MAX, typed the same
// command on every node, meet at one store (the endpoint), agree on a round
// and its ranks, and notice nodes that arrive, leave or die.
//
// The store at the endpoint is hosted by the agent whose address is the
// endpoint's (isHost), or is a separate ddprun-store; the others connect with
// backoff. The job's state is one JSON value under
// "ddprun/<run_id>/state", changed only by compare_set (write what you read
// with your change; if the store returns something else, adopt it and
// retry). Waiting for a round to complete or end is a WAIT on keys, never a
// poll. The protocol (keys, fields, transitions) is described in
// src/rendezvous/dynamic_state.h and docs/rendezvous.md.
//
// Semantics the agent relies on:
//   - A round completes at once when MAX nodes joined, when every node the
//     previous round expected back (survivors and waiting nodes) has
//     rejoined and there are at least MIN, or lastCallTimeout after the MIN-th
//     node joined. Fewer than MIN until joinTimeout: TimeoutError naming who
//     joined and who is missing.
//   - Group rank 0 is the agent hosting the endpoint's store, then the order
//     of first arrival, kept across rounds. Group rank 0 hosts each round's
//     fresh worker store and publishes it.
//   - A node arriving at a running round (fewer than MAX) goes to the wait
//     list and ends the round as kMembershipChanged; beyond MAX it waits in
//     the redundancy list until a round has room.
//   - Every node beats every keepAliveInterval; a node silent for
//     keepAliveInterval * keepAliveMaxAttempt is dropped by whoever notices
//     first, and the running round ends as kMembershipChanged on every node.
//   - RoundInfo.restartCount is the job's count of failed rounds, kept in
//     the state: the same on every node.
//   - shutdown() after the job finished (or after a closing report) closes
//     the rendezvous: later joins get ClosedError. shutdown() otherwise (a
//     signal) leaves: the node is removed and the others re-form without it.
//   - The job-wide settings (--nnodes, last_call_timeout, the heartbeat
//     timeout) are recorded in the state by the node that creates it; a
//     node whose settings differ is refused with JobMismatchError without
//     touching the state (the agent exits 2), and the others go on.
//   - Everything read from the store is validated before use (state size,
//     integer bounds, counts within MAX). A state that is deleted, changed
//     or invalid under a running round ends that round (the workers'
//     outcome still decides: finished, or closed on a failure since the
//     job cannot restart); an invalid one closes the job on every node. A
//     round's end key that the state does not back is ignored (deleted)
//     and the genuine end awaited. See docs/rendezvous.md, "What a rogue
//     or broken client can and cannot do".
//   - The endpoint is a single point of failure, as in torchrun: once its
//     store is gone, the round ends as kStoreLost on every other node and
//     joins fail with IoError naming the endpoint.
//
// Threading as in rendezvous.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ddprun/rendezvous/common_options.h"
#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::rendezvous {

// join() found a state whose job-wide settings differ from this node's; the
// message names both ("--nnodes 1:2 differs from the job's 3:4 (set by node
// X)"). The state is left untouched. The agent exits 2 (a usage error).
class JobMismatchError : public ProtocolError {
  using ProtocolError::ProtocolError;
};

// From CommonOptions: runId; the liveness beat (a node silent for
// keepAliveInterval * keepAliveMaxAttempt is dropped); authSecret (the store
// at the endpoint, when this agent hosts it, admits only clients that know
// it; the round's worker store stays open).
struct DynamicOptions : CommonOptions {
  std::string endpointHost = "localhost";  // --rdzv-endpoint host (no brackets)
  uint16_t endpointPort = 29400;           // 0: the host picks a free port (one node)
  // This agent hosts the store at the endpoint. isHostExplicit: forced by
  // --rdzv-conf is_host (a port in use is an error); otherwise inferred (a
  // port in use makes it a client of whoever listens there, as torchrun).
  bool isHost = false;
  bool isHostExplicit = false;
  int minNodes = 1;
  int maxNodes = 1;
  // The address this node advertises (--local-addr); never reverse-resolved.
  // Empty: the endpoint's host when this node hosts the store, else the
  // local address of this node's connection to the endpoint.
  std::string localAddr;
  std::chrono::milliseconds joinTimeout{600'000};
  std::chrono::milliseconds lastCallTimeout{30'000};
  std::chrono::milliseconds closeTimeout{30'000};
  std::chrono::milliseconds readTimeout{60'000};  // one store request
};

// Validates (InvalidArgument: 1 <= minNodes <= maxNodes, positive timeouts).
// A host binds the endpoint's port at once (IoError naming the holder when
// explicit); connecting happens in join(), off the agent's thread.
std::unique_ptr<Rendezvous> makeDynamicRendezvous(const DynamicOptions& opts,
                                                  Rendezvous::Post post);

}  // namespace ddprun::rendezvous
