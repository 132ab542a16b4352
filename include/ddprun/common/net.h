// Address parsing and socket helpers shared by the store, rendezvous and
// runtime. Pure functions here do no network I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ddprun::net {

struct HostPort {
  std::string host;  // without brackets; may be an IPv6 literal
  uint16_t port = 0;
};

// Parses "host:port", "[v6addr]:port", "host" (port = defaultPort) and
// "v6addr" (a bare IPv6 literal, port = defaultPort). Throws InvalidArgument
// with a message naming the accepted forms, the text shown escaped; a text
// with a control character is refused (input::hasControlChar).
HostPort parseHostPort(const std::string& text, uint16_t defaultPort);

// Parses a port number 0..65535. Throws InvalidArgument naming `what`.
uint16_t parsePort(const std::string& text, const std::string& what = "port");

// "host:port", with brackets around IPv6 literals.
std::string formatHostPort(const std::string& host, uint16_t port);

// Who is listening on TCP `port` (any address), found through /proc. Returns
// e.g. "pid 4242 (python3)" or nullopt when it cannot be determined (another
// user's process, another network namespace, not Linux).
std::optional<std::string> findListeningProcess(uint16_t port);

// This machine's host name (gethostname), "localhost" if it has none.
std::string hostName();

// True for an IPv4 or IPv6 literal ("10.0.0.1", "::1"; no brackets).
bool isIpLiteral(const std::string& host);

// Whether getaddrinfo finds an address for `host` (a name or a literal).
// May ask DNS; blocks for as long as the resolver does.
bool resolves(const std::string& host);

// True for "localhost" and loopback literals (127.0.0.0/8, ::1, and
// IPv4-mapped ::ffff:127.x). No name lookup.
bool isLoopbackHost(const std::string& host);

// True when `host` is an address literal of one of this machine's network
// interfaces (getifaddrs). No name lookup.
bool isLocalInterfaceAddress(const std::string& host);

// Whether `host` names this machine, as torchrun infers is_host for the c10d
// rendezvous (_matches_machine_hostname), plus this machine's interface
// addresses: localhost or a loopback literal; gethostname() itself (or a
// name that starts with it and a dot); the canonical name or an address of
// gethostname() as getaddrinfo resolves it (usually /etc/hosts; may ask DNS);
// an address of a local interface. Never reverse-resolves `host`.
bool isThisHost(const std::string& host);

// Sets TCP_NODELAY; returns false on failure (never throws).
bool setNoDelay(int fd);

// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the new soft
// limit. A server with thousands of clients needs more than the default 1024.
uint64_t raiseFileLimit();

}  // namespace ddprun::net
