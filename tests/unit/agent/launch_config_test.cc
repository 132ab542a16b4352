// finalizeConfig: every rule across flags, on configs built directly (the
// command line's part is in tests/unit/cli/launch_cli_test.cc, the flags'
// values in tests/unit/cli/launch_values_test.cc).
#include "ddprun/agent/launch_config.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>

#include "ddprun/common/error.h"
#include "ddprun/common/net.h"
#include "temp_dir.h"

namespace ddprun::agent {
namespace {

LaunchConfig base() {
  LaunchConfig c;
  c.script = "train.py";
  return c;
}

// A config made static on several nodes: no one-node default applies.
LaunchConfig twoNodes() {
  LaunchConfig c = base();
  c.minNodes = c.maxNodes = 2;
  return c;
}

// The message of the InvalidArgument that finalizeConfig throws, or
// "accepted" when it throws nothing.
std::string rejection(LaunchConfig c) {
  try {
    finalizeConfig(c);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "accepted";
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

int countWarningsAbout(const LaunchConfig& c, const std::string& needle) {
  return static_cast<int>(
      std::count_if(c.warnings.begin(), c.warnings.end(),
                    [&](const std::string& w) { return contains(w, needle); }));
}

TEST(LaunchConfig, OneNodeDefaultIsTorchrunsStandalonePath) {
  LaunchConfig a = base(), b = base();
  finalizeConfig(a);
  finalizeConfig(b);
  EXPECT_TRUE(a.standaloneByDefault);
  EXPECT_EQ(a.masterPort, 0);
  EXPECT_EQ(a.masterAddr, "localhost");
  EXPECT_EQ(a.rdzvBackend, "c10d");
  EXPECT_EQ(a.rdzvEndpoint, "localhost:0");
  EXPECT_EQ(a.rdzvId.size(), 36u);
  EXPECT_EQ(a.rdzvId[14], '4') << "a version 4 uuid: " << a.rdzvId;
  EXPECT_NE(a.rdzvId, b.rdzvId);
  EXPECT_TRUE(a.warnings.empty());
}

TEST(LaunchConfig, OneNodeDefaultKeepsAnExplicitRunIdAndLocalAddr) {
  LaunchConfig c = base();
  c.rdzvId = "job7";
  c.explicitFlags = {"rdzv_id"};
  c.localAddr = "10.1.2.3";
  finalizeConfig(c);
  EXPECT_TRUE(c.standaloneByDefault);
  EXPECT_EQ(c.rdzvId, "job7");
  EXPECT_EQ(c.masterAddr, "10.1.2.3");
  EXPECT_TRUE(c.warnings.empty());
}

TEST(LaunchConfig, OneNodeDefaultWarnsThatMasterAddrIsIgnored) {
  LaunchConfig c = base();
  c.masterAddr = "10.0.0.1";
  c.explicitFlags = {"master_addr"};
  finalizeConfig(c);
  EXPECT_EQ(c.masterAddr, "localhost");
  EXPECT_EQ(countWarningsAbout(c, "--master-addr ignored"), 1);
  EXPECT_EQ(countWarningsAbout(c, "--master-port"), 1) << "says how to keep it";
}

// When the one-node default does not apply.
TEST(LaunchConfig, OneNodeDefaultNeedsStaticOneNodeNoPortNoEndpoint) {
  LaunchConfig port = base();
  port.explicitFlags = {"master_port"};
  finalizeConfig(port);
  EXPECT_FALSE(port.standaloneByDefault);
  EXPECT_EQ(port.masterPort, 29500);
  EXPECT_EQ(port.masterAddr, "127.0.0.1");
  EXPECT_EQ(port.rdzvId, "none");
  EXPECT_EQ(port.rdzvBackend, "static");

  LaunchConfig endpoint = base();
  endpoint.rdzvEndpoint = "127.0.0.1:4000";
  finalizeConfig(endpoint);
  EXPECT_FALSE(endpoint.standaloneByDefault);
  EXPECT_EQ(endpoint.masterPort, 4000);

  LaunchConfig nodes = twoNodes();
  finalizeConfig(nodes);
  EXPECT_FALSE(nodes.standaloneByDefault);
  EXPECT_EQ(nodes.masterPort, 29500);
  EXPECT_EQ(nodes.rdzvBackend, "static");

  LaunchConfig c10d = base();
  c10d.rdzvBackend = "c10d";
  c10d.rdzvId = "job";
  finalizeConfig(c10d);
  EXPECT_FALSE(c10d.standaloneByDefault);
  EXPECT_EQ(c10d.rdzvId, "job");
  EXPECT_EQ(c10d.masterPort, 0);
  EXPECT_EQ(c10d.masterAddr, "localhost");

  LaunchConfig standalone = base();
  standalone.standalone = true;
  finalizeConfig(standalone);
  EXPECT_FALSE(standalone.standaloneByDefault);
  EXPECT_EQ(standalone.masterPort, 0);
}

TEST(LaunchConfig, StandaloneIgnoresGivenRendezvousValuesWithOneWarning) {
  LaunchConfig c = base();
  c.standalone = true;
  c.rdzvBackend = "etcd";  // replaced, so not an error, as in torchrun
  c.rdzvId = "job7";
  c.masterPort = 1234;
  c.explicitFlags = {"rdzv_backend", "rdzv_id", "master_port"};
  finalizeConfig(c);
  EXPECT_EQ(c.rdzvBackend, "c10d");
  EXPECT_NE(c.rdzvId, "job7");
  EXPECT_EQ(c.masterPort, 0);
  ASSERT_EQ(c.warnings.size(), 1u);
  for (const char* flag :
       {"--rdzv-backend", "--rdzv-id", "--master-port", "--standalone"})
    EXPECT_TRUE(contains(c.warnings[0], flag)) << c.warnings[0];
}

TEST(LaunchConfig, StaticEndpointBecomesMasterAddressAndPort) {
  LaunchConfig c = twoNodes();
  c.rdzvEndpoint = "node0.example:29600";
  finalizeConfig(c);
  EXPECT_EQ(c.masterAddr, "node0.example");
  EXPECT_EQ(c.masterPort, 29600);
  EXPECT_TRUE(c.warnings.empty());

  LaunchConfig v6 = twoNodes();
  v6.rdzvEndpoint = "[fd00::1]:5000";
  finalizeConfig(v6);
  EXPECT_EQ(v6.masterAddr, "fd00::1");
  EXPECT_EQ(v6.masterPort, 5000);

  LaunchConfig both = twoNodes();
  both.rdzvEndpoint = "a:1";
  both.explicitFlags = {"master_addr", "master_port"};
  finalizeConfig(both);
  EXPECT_EQ(both.masterAddr, "a");
  EXPECT_EQ(countWarningsAbout(both, "--master-addr and --master-port ignored"), 1);

  for (const char* bad : {"node0", "node0:99999", "node0:http", ":5", "[fd00::1"}) {
    LaunchConfig b = twoNodes();
    b.rdzvEndpoint = bad;
    std::string msg = rejection(b);
    EXPECT_TRUE(contains(msg, "--rdzv-endpoint")) << bad << ": " << msg;
  }
  LaunchConfig noPort = twoNodes();
  noPort.rdzvEndpoint = "node0";
  EXPECT_TRUE(contains(rejection(noPort), "needs a port")) << rejection(noPort);
}

TEST(LaunchConfig, StaticTimeoutFromRdzvConf) {
  LaunchConfig c = twoNodes();
  finalizeConfig(c);
  EXPECT_EQ(c.rdzvTimeout, std::chrono::seconds(900));
  LaunchConfig t = twoNodes();
  t.rdzvConf = {{"timeout", "60"}};
  finalizeConfig(t);
  EXPECT_EQ(t.rdzvTimeout, std::chrono::seconds(60));
  for (const char* bad : {"abc", "-5", "0", "1.5", "inf", "99999999999999999999"}) {
    LaunchConfig b = twoNodes();
    b.rdzvConf = {{"timeout", bad}};
    EXPECT_TRUE(contains(rejection(b), std::string("--rdzv-conf timeout='") + bad + "'"))
        << rejection(b);
  }
}

TEST(LaunchConfig, C10dRdzvConfKeysAreValidated) {
  LaunchConfig c = base();
  c.rdzvBackend = "c10d";
  c.rdzvConf = {{"join_timeout", "900"},         {"last_call_timeout", "2.5"},
                {"close_timeout", "10"},         {"read_timeout", "120"},
                {"heartbeat_timeout", "1"},      {"keep_alive_interval", "0.5"},
                {"keep_alive_max_attempt", "7"}, {"is_host", "Yes"},
                {"store_type", "file"},          {"use_libuv", "0"}};
  finalizeConfig(c);
  EXPECT_EQ(c.c10d.joinTimeout, std::chrono::seconds(900));
  EXPECT_EQ(c.c10d.lastCallTimeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.c10d.closeTimeout, std::chrono::seconds(10));
  EXPECT_EQ(c.c10d.readTimeout, std::chrono::seconds(120));
  EXPECT_EQ(c.c10d.heartbeatTimeout, std::chrono::seconds(1));
  EXPECT_EQ(c.c10d.keepAliveInterval, std::chrono::milliseconds(500));
  EXPECT_EQ(c.c10d.keepAliveMaxAttempt, 7);
  EXPECT_EQ(c.c10d.isHost, true);
  EXPECT_EQ(c.c10d.storeType, "file");
  EXPECT_FALSE(c.c10d.useLibuv);
  EXPECT_TRUE(c.warnings.empty());

  const std::vector<std::pair<const char*, const char*>> bad = {
      {"join_timeout", "0"},
      {"join_timeout", "-1"},
      {"last_call_timeout", "x"},
      {"close_timeout", "inf"},
      {"read_timeout", "nan"},
      {"heartbeat_timeout", "1e30"},
      {"keep_alive_interval", "-0.5"},
      {"keep_alive_max_attempt", "0"},
      {"keep_alive_max_attempt", "1.5"},
      {"is_host", "maybe"},
      {"use_libuv", "2"},
      {"store_type", "etcd"}};
  for (const auto& [key, value] : bad) {
    LaunchConfig b = base();
    b.rdzvBackend = "c10d";
    b.rdzvConf = {{key, value}};
    std::string msg = rejection(b);
    EXPECT_TRUE(contains(msg, std::string("--rdzv-conf ") + key + "='" + value + "'"))
        << key << "=" << value << ": " << msg;
  }
}

// The rendezvous store's secret: token_file wins over $DDPRUN_RDZV_TOKEN; a
// file anyone may read is refused naming the file, never echoing the secret.
TEST(LaunchConfig, RdzvTokenFromTheFileThenTheEnvironment) {
  ddprun::testing::TempDir dir;
  const std::string path = dir.file("job.token");
  {
    std::ofstream(path) << "s3cret-from-file\n";
  }
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  ::setenv("DDPRUN_RDZV_TOKEN", "s3cret-from-env", 1);
  LaunchConfig c = base();
  c.rdzvBackend = "c10d";
  c.rdzvConf = {{"token_file", path}};
  finalizeConfig(c);
  EXPECT_EQ(c.rdzvSecret, "s3cret-from-file");
  EXPECT_TRUE(c.warnings.empty());

  LaunchConfig e = base();
  e.rdzvBackend = "c10d";
  finalizeConfig(e);
  EXPECT_EQ(e.rdzvSecret, "s3cret-from-env");
  ::unsetenv("DDPRUN_RDZV_TOKEN");
  LaunchConfig open = base();
  finalizeConfig(open);
  EXPECT_EQ(open.rdzvSecret, "");

  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  LaunchConfig w = base();
  w.rdzvConf = {{"token_file", path}};
  std::string msg = rejection(w);
  EXPECT_TRUE(contains(msg, path)) << msg;
  EXPECT_FALSE(contains(msg, "s3cret")) << msg;
  LaunchConfig empty = base();
  empty.rdzvConf = {{"token_file", ""}};
  EXPECT_TRUE(contains(rejection(empty), "token_file")) << rejection(empty);
}

TEST(LaunchConfig, UnknownRdzvConfKeysWarnOnce) {
  LaunchConfig c = twoNodes();
  c.rdzvConf = {{"join_timout", "5"}, {"colour", "blue"}, {"rank", "3"}};
  finalizeConfig(c);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(contains(c.warnings[0], "colour, join_timout")) << c.warnings[0];
  EXPECT_FALSE(contains(c.warnings[0], "rank,")) << "rank is set from --node-rank";
}

TEST(LaunchConfig, ConfBoolsAsTorchrun) {
  for (const char* t : {"1", "true", "T", "yes", "Y", " TRUE "})
    EXPECT_EQ(parseConfBool(t), true) << t;
  for (const char* f : {"0", "false", "f", "NO", "n"})
    EXPECT_EQ(parseConfBool(f), false) << f;
  for (const char* x : {"", "2", "on", "off", "tru"}) EXPECT_FALSE(parseConfBool(x)) << x;
}

TEST(LaunchConfig, NodeRules) {
  // A range with the static backend runs with MAX nodes, as torchrun's static
  // rendezvous does, with a warning; c10d makes it elastic.
  LaunchConfig range = base();
  range.minNodes = 1;
  range.maxNodes = 4;
  range.nodeRank = 3;
  EXPECT_EQ(rejection(range), "accepted");
  finalizeConfig(range);
  EXPECT_EQ(range.rdzvBackend, "static");
  EXPECT_FALSE(range.useDynamic);
  EXPECT_EQ(range.maxNodes, 4);
  EXPECT_EQ(range.masterPort, 29500);
  ASSERT_EQ(range.warnings.size(), 1u);
  EXPECT_TRUE(contains(range.warnings[0],
                       "--nnodes 1:4: the static rendezvous waits for all 4 nodes"))
      << range.warnings[0];
  LaunchConfig outside = base();
  outside.minNodes = 1;
  outside.maxNodes = 2;
  outside.nodeRank = 2;  // ranks run to MAX - 1
  EXPECT_TRUE(
      contains(rejection(outside), "--node-rank 2 is out of range for --nnodes 2"))
      << rejection(outside);
  range = base();
  range.minNodes = 1;
  range.maxNodes = 4;
  range.rdzvBackend = "c10d";
  range.rdzvEndpoint = "head:29400";
  EXPECT_EQ(rejection(range), "accepted");

  LaunchConfig standalone = twoNodes();
  standalone.standalone = true;
  EXPECT_TRUE(
      contains(rejection(standalone), "--standalone runs one node, but --nnodes is 2"))
      << rejection(standalone);
  standalone.minNodes = 1;
  EXPECT_TRUE(contains(rejection(standalone), "--nnodes is 1:2"))
      << rejection(standalone);

  LaunchConfig rank = twoNodes();
  rank.nodeRank = 2;
  EXPECT_TRUE(
      contains(rejection(rank), "--node-rank 2 is out of range for --nnodes 2 (0..1)"))
      << rejection(rank);
  rank.nodeRank = 1;
  EXPECT_EQ(rejection(rank), "accepted");

  LaunchConfig staticOne = base();  // static on one node: the rank must be 0
  staticOne.nodeRank = 1;
  staticOne.explicitFlags = {"master_port"};
  EXPECT_TRUE(contains(rejection(staticOne), "--node-rank 1")) << rejection(staticOne);
  staticOne.explicitFlags.clear();  // the one-node default ignores it, as torchrun
  EXPECT_EQ(rejection(staticOne), "accepted");

  LaunchConfig port0 = twoNodes();
  port0.masterPort = 0;
  EXPECT_TRUE(contains(rejection(port0), "--master-port 0")) << rejection(port0);
  LaunchConfig port0One = base();
  port0One.masterPort = 0;
  port0One.explicitFlags = {"master_port"};
  EXPECT_EQ(rejection(port0One), "accepted");

  LaunchConfig noAddr = twoNodes();
  noAddr.masterAddr = "";
  EXPECT_TRUE(contains(rejection(noAddr), "--master-addr")) << rejection(noAddr);
}

TEST(LaunchConfig, ProgramRules) {
  LaunchConfig none = base();
  none.script = "";
  EXPECT_TRUE(contains(rejection(none), "missing training script"));
  LaunchConfig both = base();
  both.module = true;
  both.noPython = true;
  EXPECT_TRUE(contains(rejection(both), "-m/--module and --no-python"))
      << rejection(both);
  both.runPath = true;  // torchrun: --run-path wins over both
  EXPECT_EQ(rejection(both), "accepted");
}

TEST(LaunchConfig, BackendRules) {
  for (const char* etcd : {"etcd", "etcd-v2"}) {
    LaunchConfig c = base();
    c.rdzvBackend = etcd;
    EXPECT_TRUE(contains(rejection(c), std::string("'") + etcd + "' is not supported"))
        << rejection(c);
    // What to use instead: c10d (elastic, with its endpoint) or static.
    EXPECT_TRUE(contains(rejection(c), "--rdzv-backend c10d --rdzv-endpoint HOST[:PORT]"))
        << rejection(c);
    EXPECT_TRUE(contains(rejection(c), "static rendezvous")) << rejection(c);
  }
  LaunchConfig bogus = base();
  bogus.rdzvBackend = "zk";
  EXPECT_TRUE(contains(rejection(bogus), "--rdzv-backend: unknown backend 'zk'"));
}

TEST(LaunchConfig, LocalAddrAndEndpointWarnings) {
  LaunchConfig fixed = base();
  fixed.explicitFlags = {"master_port"};
  fixed.localAddr = "h1";
  finalizeConfig(fixed);
  EXPECT_EQ(countWarningsAbout(fixed, "--local-addr has no effect with the static"), 1);
  EXPECT_EQ(fixed.masterAddr, "127.0.0.1");

  for (const std::string& here :
       {std::string("localhost:0"), std::string("127.0.0.1:29400"),
        std::string("[::1]:5"), std::string("localhost"), net::hostName() + ":29400"}) {
    LaunchConfig local = base();
    local.rdzvBackend = "c10d";
    local.rdzvEndpoint = here;
    finalizeConfig(local);
    EXPECT_TRUE(local.warnings.empty()) << here;
    EXPECT_EQ(local.masterPort, 0) << here;
    EXPECT_FALSE(local.useDynamic) << here;  // one node hosting it: the local rendezvous
    EXPECT_TRUE(local.isHost) << here;
  }
  LaunchConfig badLocal = base();
  badLocal.rdzvBackend = "c10d";
  badLocal.rdzvEndpoint = "h:70000";
  EXPECT_TRUE(contains(rejection(badLocal), "--rdzv-endpoint")) << rejection(badLocal);
}

// ------------------------------------------------------------ c10d
LaunchConfig c10d(const std::string& endpoint, int minNodes, int maxNodes) {
  LaunchConfig c = base();
  c.rdzvBackend = "c10d";
  c.rdzvEndpoint = endpoint;
  c.minNodes = minNodes;
  c.maxNodes = maxNodes;
  return c;
}

TEST(LaunchConfig, C10dAcrossNodesTakesTheDynamicRendezvous) {
  LaunchConfig c = c10d("head.example:29411", 2, 4);
  c.rdzvId = "job7";
  finalizeConfig(c);
  EXPECT_TRUE(c.useDynamic);
  EXPECT_EQ(c.endpointHost, "head.example");
  EXPECT_EQ(c.endpointPort, 29411);
  EXPECT_FALSE(c.isHost);  // not this machine
  EXPECT_FALSE(c.isHostExplicit);
  EXPECT_EQ(c.rdzvId, "job7");
  EXPECT_EQ(c.minNodes, 2);
  EXPECT_EQ(c.maxNodes, 4);
  EXPECT_TRUE(c.warnings.empty());

  LaunchConfig fixed = c10d("head.example", 3, 3);  // N nodes, not a range: dynamic too
  finalizeConfig(fixed);
  EXPECT_TRUE(fixed.useDynamic);
  EXPECT_EQ(fixed.endpointPort, 29400);  // torchrun's default c10d port
}

TEST(LaunchConfig, C10dEndpointForms) {
  LaunchConfig v6 = c10d("[::1]:29500", 1, 2);
  finalizeConfig(v6);
  EXPECT_EQ(v6.endpointHost, "::1");
  EXPECT_EQ(v6.endpointPort, 29500);
  EXPECT_TRUE(v6.isHost);
  LaunchConfig v6NoPort = c10d("[fd00::5]", 2, 2);
  finalizeConfig(v6NoPort);
  EXPECT_EQ(v6NoPort.endpointHost, "fd00::5");
  EXPECT_EQ(v6NoPort.endpointPort, 29400);
  for (const char* bad : {"head:70000", "head:x", "[::1", ":29400"}) {
    auto why = rejection(c10d(bad, 2, 2));
    EXPECT_TRUE(contains(why, "--rdzv-endpoint")) << bad << ": " << why;
  }
}

TEST(LaunchConfig, C10dAcrossNodesNeedsAnEndpoint) {
  auto why = rejection(c10d("", 2, 4));
  EXPECT_TRUE(contains(why,
                       "--rdzv-endpoint: required with --rdzv-backend=c10d on several "
                       "nodes"))
      << why;
  EXPECT_TRUE(contains(why, "e.g. --rdzv-endpoint head:29400")) << why;
  // One node: torchrun's default, localhost.
  LaunchConfig one = c10d("", 1, 1);
  finalizeConfig(one);
  EXPECT_FALSE(one.useDynamic);
  EXPECT_EQ(one.endpointHost, "localhost");
}

// The one-node forms of PyTorch's docs.
TEST(LaunchConfig, C10dOneNodeFormsFromPytorchDocs) {
  LaunchConfig one = c10d("localhost:0", 1, 1);  // --nnodes=1: the local rendezvous
  one.rdzvId = "job";
  finalizeConfig(one);
  EXPECT_FALSE(one.useDynamic);
  EXPECT_EQ(one.masterPort, 0);
  EXPECT_EQ(one.rdzvId, "job");

  LaunchConfig range = c10d("localhost:0", 1, 2);  // --nnodes=1:2: waits last call
  finalizeConfig(range);
  EXPECT_TRUE(range.useDynamic);
  EXPECT_TRUE(range.isHost);
  EXPECT_EQ(range.endpointPort, 0);  // hosted on a free port
  EXPECT_TRUE(range.warnings.empty());
}

TEST(LaunchConfig, C10dPortZeroOnlyForTheHost) {
  auto why = rejection(c10d("head.example:0", 2, 2));
  EXPECT_TRUE(contains(why,
                       "port 0 (a free port) works only on the agent that hosts the "
                       "rendezvous"))
      << why;
  EXPECT_TRUE(contains(why, "head.example:29400")) << why;
  LaunchConfig client =
      c10d("localhost:0", 1, 1);  // forced client: it cannot find port 0
  client.rdzvConf = {{"is_host", "false"}};
  EXPECT_TRUE(contains(rejection(client), "port 0")) << rejection(client);
}

TEST(LaunchConfig, C10dIsHostInferredOrExplicit) {
  for (const std::string& here :
       {std::string("localhost"), std::string("127.0.0.1"), std::string("127.1.2.3"),
        std::string("::1"), net::hostName()}) {
    LaunchConfig c = c10d(net::formatHostPort(here, 29400), 2, 2);
    finalizeConfig(c);
    EXPECT_TRUE(c.isHost) << here;
    EXPECT_FALSE(c.isHostExplicit) << here;
  }
  LaunchConfig forced = c10d("head.example", 2, 2);
  forced.rdzvConf = {{"is_host", "yes"}};
  finalizeConfig(forced);
  EXPECT_TRUE(forced.isHost);
  EXPECT_TRUE(forced.isHostExplicit);
  LaunchConfig notHost = c10d("localhost", 2, 2);
  notHost.rdzvConf = {{"is_host", "0"}};
  finalizeConfig(notHost);
  EXPECT_FALSE(notHost.isHost);
  EXPECT_TRUE(notHost.isHostExplicit);
  // One node whose endpoint is a separate store (is_host=false) meets there.
  LaunchConfig oneClient = c10d("localhost:29400", 1, 1);
  oneClient.rdzvConf = {{"is_host", "false"}};
  finalizeConfig(oneClient);
  EXPECT_TRUE(oneClient.useDynamic);
  // One node and a remote endpoint: the dynamic rendezvous connects there.
  LaunchConfig oneRemote = c10d("far.example:29400", 1, 1);
  finalizeConfig(oneRemote);
  EXPECT_TRUE(oneRemote.useDynamic);
  EXPECT_FALSE(oneRemote.isHost);
}

TEST(LaunchConfig, C10dWarnsAboutStaticOnlyFlags) {
  LaunchConfig c = c10d("head.example", 2, 2);
  c.explicitFlags = {"master_addr", "master_port", "node_rank"};
  finalizeConfig(c);
  EXPECT_EQ(countWarningsAbout(c, "--master-addr and --master-port ignored"), 1);
  EXPECT_EQ(countWarningsAbout(c, "--node-rank ignored with --rdzv-backend=c10d"), 1);
}

TEST(LaunchConfig, C10dStoreTypeFileRefusedAcrossNodes) {
  LaunchConfig c = c10d("head.example", 2, 2);
  c.rdzvConf = {{"store_type", "file"}};
  EXPECT_TRUE(contains(rejection(c), "--rdzv-conf store_type=file")) << rejection(c);
  LaunchConfig one = c10d("localhost", 1, 1);  // one node: nothing is stored
  one.rdzvConf = {{"store_type", "file"}};
  EXPECT_EQ(rejection(one), "accepted");
}

TEST(LaunchConfig, LocalAddrIsValidatedNeverResolved) {
  for (const char* ok : {"10.0.0.5", "fd00::1", "node3.cluster", "n-1", "host_a"}) {
    LaunchConfig c = c10d("head.example", 2, 2);
    c.localAddr = ok;
    finalizeConfig(c);
    EXPECT_EQ(c.localAddr, ok);
  }
  LaunchConfig bracketed = c10d("head.example", 2, 2);
  bracketed.localAddr = "[fd00::1]";
  finalizeConfig(bracketed);
  EXPECT_EQ(bracketed.localAddr, "fd00::1");
  for (const char* bad : {"10.0.0.5:29400", "a b", "-x", "[x", "host/1", "::1::2"}) {
    LaunchConfig c = c10d("head.example", 2, 2);
    c.localAddr = bad;
    auto why = rejection(c);
    EXPECT_TRUE(contains(why, "--local-addr")) << bad << ": " << why;
    EXPECT_TRUE(contains(why, "without a port")) << why;
  }
}

TEST(LaunchConfig, UnhonouredFlagsWarnOnceEach) {
  LaunchConfig c = base();
  c.numaBinding = "socket";
  c.logsSpecs = "custom";
  c.eventLogHandler = "console";
  finalizeConfig(c);
  ASSERT_EQ(c.warnings.size(), 3u);
  EXPECT_EQ(countWarningsAbout(c, "--numa-binding=socket"), 1);
  EXPECT_EQ(countWarningsAbout(c, "--logs-specs=custom"), 1);
  EXPECT_EQ(countWarningsAbout(c, "--event-log-handler=console"), 1);
  for (const char* quiet : {"null", "dynamic_rendezvous"}) {
    LaunchConfig q = base();
    q.eventLogHandler = quiet;
    q.startMethod = "fork";
    q.monitorInterval = 5;
    q.runPath = true;
    finalizeConfig(q);
    EXPECT_TRUE(q.warnings.empty()) << quiet;
  }
  LaunchConfig unknown = base();
  unknown.eventLogHandler = "syslog";
  EXPECT_TRUE(
      contains(rejection(unknown), "--event-log-handler: unknown handler 'syslog'"));
}

// The config yields the rendezvous as a value: local for one node, static
// for a fixed set of nodes, dynamic for c10d; the agent builds whatever it
// names (rendezvous/spec.h) without knowing which.
TEST(RendezvousSpecFromConfig, LocalStaticAndDynamicFromTheFlags) {
  using Kind = rendezvous::RendezvousSpec::Kind;
  LaunchConfig one;
  one.script = "train.py";
  finalizeConfig(one);
  auto spec = rendezvousSpec(one);
  EXPECT_EQ(spec.kind, Kind::kLocal) << rendezvous::toString(spec.kind);
  EXPECT_EQ(spec.local.port, 0);  // torchrun 2.x's one-node default: a free port

  LaunchConfig fixed;
  fixed.script = "train.py";
  fixed.minNodes = fixed.maxNodes = 3;
  fixed.nodeRank = 2;
  fixed.masterAddr = "10.0.0.1";
  fixed.masterPort = 29512;
  finalizeConfig(fixed);
  spec = rendezvousSpec(fixed);
  EXPECT_EQ(spec.kind, Kind::kStatic) << rendezvous::toString(spec.kind);
  EXPECT_EQ(spec.fixed.nnodes, 3);
  EXPECT_EQ(spec.fixed.nodeRank, 2);
  EXPECT_EQ(spec.fixed.masterAddr, "10.0.0.1");
  EXPECT_EQ(spec.fixed.masterPort, 29512);

  LaunchConfig elastic;
  elastic.script = "train.py";
  elastic.rdzvBackend = "c10d";
  elastic.rdzvEndpoint = "head:29400";
  elastic.minNodes = 1;
  elastic.maxNodes = 4;
  finalizeConfig(elastic);
  spec = rendezvousSpec(elastic);
  EXPECT_EQ(spec.kind, Kind::kDynamic) << rendezvous::toString(spec.kind);
  EXPECT_EQ(spec.dynamic.endpointHost, "head");
  EXPECT_EQ(spec.dynamic.maxNodes, 4);
}

// Run id, keep-alives and the store's secret reach the static and the
// dynamic rendezvous alike (rendezvous::CommonOptions, filled once).
TEST(RendezvousSpecFromConfig, SharedFieldsReachBothBackends) {
  auto shared = [](LaunchConfig c) {
    c.script = "train.py";
    c.rdzvId = "job-7";
    c.rdzvConf = {{"keep_alive_interval", "2.5"}, {"keep_alive_max_attempt", "7"}};
    finalizeConfig(c);
    c.rdzvSecret = "s3cret";  // as finalizeConfig sets it from a token file
    return rendezvousSpec(c);
  };
  auto check = [](const rendezvous::CommonOptions& o, const char* which) {
    EXPECT_EQ(o.runId, "job-7") << which;
    EXPECT_EQ(o.keepAliveInterval, std::chrono::milliseconds(2500)) << which;
    EXPECT_EQ(o.keepAliveMaxAttempt, 7) << which;
    EXPECT_EQ(o.authSecret, "s3cret") << which;
  };
  LaunchConfig fixed;
  fixed.minNodes = fixed.maxNodes = 2;
  auto spec = shared(fixed);
  ASSERT_EQ(spec.kind, rendezvous::RendezvousSpec::Kind::kStatic);
  check(spec.fixed, "static");

  LaunchConfig elastic;
  elastic.rdzvBackend = "c10d";
  elastic.rdzvEndpoint = "head:29400";
  elastic.maxNodes = 4;
  spec = shared(elastic);
  ASSERT_EQ(spec.kind, rendezvous::RendezvousSpec::Kind::kDynamic);
  check(spec.dynamic, "dynamic");
}

}  // namespace
}  // namespace ddprun::agent
