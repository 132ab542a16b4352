#include "ddprun/common/net.h"

#include <gtest/gtest.h>

#include "ddprun/common/error.h"

namespace ddprun::net {
namespace {

TEST(Net, ParsesHostPortForms) {
  auto a = parseHostPort("node1:29400", 29500);
  EXPECT_EQ(a.host, "node1");
  EXPECT_EQ(a.port, 29400);
  auto b = parseHostPort("node1", 29500);
  EXPECT_EQ(b.host, "node1");
  EXPECT_EQ(b.port, 29500);
  auto c = parseHostPort("[::1]:1234", 1);
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.port, 1234);
  auto d = parseHostPort("fe80::1", 7);
  EXPECT_EQ(d.host, "fe80::1");
  EXPECT_EQ(d.port, 7);
  auto e = parseHostPort("[::1]", 9);
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 9);
}

TEST(Net, RejectsBadAddressesWithHelpfulMessages) {
  for (const char* bad : {"", "host:", "host:70000", "host:-1", "host:12ab", ":80",
                          "[::1", "[]:80", "[::1]x"}) {
    try {
      parseHostPort(bad, 1);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
    }
  }
}

// Issue 40: an address with a control character is refused (no host name
// has one), and no message prints the raw bytes.
TEST(Net, RefusesControlCharactersShowingThemEscaped) {
  for (const char* bad : {"evil\nhost:80", "h\x1b[31m:5", "[::1\r]:80", "host:8\x7f" "0",
                          "a\tb"}) {
    try {
      parseHostPort(bad, 1);
      ADD_FAILURE() << "accepted a control character";
    } catch (const InvalidArgument& e) {
      for (char ch : e.message())
        EXPECT_FALSE(static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) << e.message();
      EXPECT_NE(e.message().find("control character"), std::string::npos) << e.message();
    }
  }
  try {
    parsePort("8\x1b[2J", "--master-port");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.message(),
              "invalid --master-port '8\\x1b[2J': expected an integer between 0 and 65535");
  }
}

TEST(Net, ParsesPorts) {
  EXPECT_EQ(parsePort("0"), 0);
  EXPECT_EQ(parsePort("65535"), 65535);
  EXPECT_THROW(parsePort("65536"), InvalidArgument);
  EXPECT_THROW(parsePort(""), InvalidArgument);
  EXPECT_THROW(parsePort("1.5"), InvalidArgument);
}

TEST(Net, FormatsIPv6WithBrackets) {
  EXPECT_EQ(formatHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(formatHostPort("10.0.0.1", 80), "10.0.0.1:80");
  EXPECT_EQ(formatHostPort("host", 80), "host:80");
}

}  // namespace
}  // namespace ddprun::net
