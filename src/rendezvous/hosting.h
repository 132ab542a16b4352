// Starting the stores a rendezvous hosts (the agent store, a round's worker
// store), with errors that name the port's holder and the flag that fixes it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/store/tcp_store_server.h"

namespace ddprun::rendezvous::detail {

// Starts a store server on bindHost:port ("" = every address, 0 = a free
// port). Throws IoError: for a port in use, "<role> cannot listen on port P:
// it is in use by pid N (name); <fix>"; otherwise the server's message and
// the fix. A non-empty `secret` makes the store admit only clients that
// prove they know it (store/auth.h): the rendezvous store of a job given
// --rdzv-conf token_file; a round's worker store stays open to PyTorch.
// `leases`: keys bound to their connection (store::LeaseRule). Without
// `nameHolder` a port in use names no holder (the scan of /proc is for an
// error someone reads: an agent that only tries the port skips it).
std::unique_ptr<store::TcpStoreServer> hostStore(const std::string& bindHost,
                                                 uint16_t port, const std::string& role,
                                                 const std::string& fix,
                                                 const std::string& secret = "",
                                                 std::vector<store::LeaseRule> leases = {},
                                                 bool nameHolder = true);

}  // namespace ddprun::rendezvous::detail
