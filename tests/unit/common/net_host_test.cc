// Which addresses name this machine (net::isThisHost and its parts), as the
// c10d rendezvous's is_host inference uses them. Literal checks are pure;
// the host-name checks read this machine's own name and interfaces.
#include <gtest/gtest.h>

#include "ddprun/common/net.h"

namespace ddprun::net {
namespace {

TEST(NetHost, IpLiterals) {
  for (const char* ip : {"10.0.0.1", "127.0.0.1", "::1", "fd00::2", "::ffff:10.1.2.3"})
    EXPECT_TRUE(isIpLiteral(ip)) << ip;
  for (const char* no :
       {"", "localhost", "10.0.0", "[::1]", "10.0.0.1:80", "::1::2", "h.x"})
    EXPECT_FALSE(isIpLiteral(no)) << no;
}

TEST(NetHost, LoopbackHosts) {
  for (const char* lo : {"localhost", "LocalHost", "127.0.0.1", "127.9.8.7", "::1",
                         "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"})
    EXPECT_TRUE(isLoopbackHost(lo)) << lo;
  for (const char* no : {"128.0.0.1", "10.0.0.1", "::2", "localhost.example",
                         "::ffff:10.0.0.1", "", "127.0.0"})
    EXPECT_FALSE(isLoopbackHost(no)) << no;
}

TEST(NetHost, ThisHostByNameAndLoopback) {
  EXPECT_TRUE(isThisHost("localhost"));
  EXPECT_TRUE(isThisHost("127.0.0.1"));
  EXPECT_TRUE(isThisHost("::1"));
  EXPECT_TRUE(isThisHost(hostName()));
  EXPECT_TRUE(isThisHost(hostName() + ".cluster.example"));  // qualified own name
  EXPECT_FALSE(isThisHost(""));
  // Never resolved: a name that is not this machine's is not this host, and
  // addresses from TEST-NET-3 (RFC 5737) are on no interface here.
  EXPECT_FALSE(isThisHost("not-" + hostName() + ".invalid"));
  EXPECT_FALSE(isThisHost("203.0.113.77"));
  EXPECT_FALSE(isLocalInterfaceAddress("203.0.113.77"));
  EXPECT_FALSE(isLocalInterfaceAddress("localhost"));  // names are not addresses
}

}  // namespace
}  // namespace ddprun::net
