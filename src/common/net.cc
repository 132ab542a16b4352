#include "ddprun/common/net.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "ddprun/common/user_input.h"

namespace ddprun::net {

std::string hostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

namespace {

// The text form of an AF_INET/AF_INET6 socket address; "" for others.
std::string addressText(const sockaddr* sa) {
  if (sa == nullptr) return "";
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = nullptr;
  if (sa->sa_family == AF_INET) raw = &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr;
  if (sa->sa_family == AF_INET6)
    raw = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
  if (raw == nullptr || ::inet_ntop(sa->sa_family, raw, text, sizeof text) == nullptr)
    return "";
  return text;
}

// Host names compare without regard to case (RFC 4343).
bool sameName(const std::string& a, const std::string& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](unsigned char x, unsigned char y) {
           return std::tolower(x) == std::tolower(y);
         });
}

// Two address literals are the same address (::1 and 0:0::1 are).
bool sameAddress(const std::string& a, const std::string& b) {
  in6_addr x6{}, y6{};
  if (::inet_pton(AF_INET6, a.c_str(), &x6) == 1 &&
      ::inet_pton(AF_INET6, b.c_str(), &y6) == 1)
    return std::equal(x6.s6_addr, x6.s6_addr + 16, y6.s6_addr);
  in_addr x4{}, y4{};
  return ::inet_pton(AF_INET, a.c_str(), &x4) == 1 &&
         ::inet_pton(AF_INET, b.c_str(), &y4) == 1 && x4.s_addr == y4.s_addr;
}

bool resolvesImpl(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return false;
  ::freeaddrinfo(list);
  return true;
}

// getaddrinfo(gethostname()): its canonical name or one of its addresses is `host`.
bool matchesResolvedHostName(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_CANONNAME;
  addrinfo* list = nullptr;
  if (::getaddrinfo(hostName().c_str(), nullptr, &hints, &list) != 0) return false;
  bool found = false;
  for (addrinfo* a = list; a != nullptr && !found; a = a->ai_next) {
    if (a->ai_canonname != nullptr && sameName(host, a->ai_canonname)) found = true;
    const std::string text = addressText(a->ai_addr);
    if (!text.empty() && isIpLiteral(host) && sameAddress(host, text)) found = true;
  }
  ::freeaddrinfo(list);
  return found;
}

}  // namespace

bool resolves(const std::string& host) { return resolvesImpl(host); }

bool isIpLiteral(const std::string& host) {
  in6_addr a6{};
  in_addr a4{};
  return ::inet_pton(AF_INET, host.c_str(), &a4) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

bool isLoopbackHost(const std::string& host) {
  if (sameName(host, "localhost")) return true;
  in_addr a4{};
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1)
    return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (::inet_pton(AF_INET6, host.c_str(), &a6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
}

bool isLocalInterfaceAddress(const std::string& host) {
  if (!isIpLiteral(host)) return false;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    const std::string text = addressText(a->ifa_addr);
    found = !text.empty() && sameAddress(host, text);
  }
  ::freeifaddrs(list);
  return found;
}

bool isThisHost(const std::string& host) {
  if (host.empty()) return false;
  if (isLoopbackHost(host) || isLocalInterfaceAddress(host)) return true;
  const std::string me = hostName();
  if (sameName(host, me)) return true;
  if (host.size() > me.size() + 1 && sameName(host.substr(0, me.size() + 1), me + "."))
    return true;
  return matchesResolvedHostName(host);
}

uint16_t parsePort(const std::string& text, const std::string& what) {
  unsigned value = 0;
  auto [ptr, ec] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() ||
      value > 65535) {
    DDPRUN_THROW(InvalidArgument, "invalid ", what, " '", str::escape(text),
                 "': expected an integer between 0 and 65535");
  }
  return static_cast<uint16_t>(value);
}

HostPort parseHostPort(const std::string& text, uint16_t defaultPort) {
  const char* forms =
      "expected HOST, HOST:PORT, [IPV6]:PORT or a bare IPv6 address";
  if (text.empty()) DDPRUN_THROW(InvalidArgument, "empty address: ", forms);
  const std::string shown = str::escape(text);
  if (input::hasControlChar(text))
    DDPRUN_THROW(InvalidArgument, "invalid address '", shown,
                 "': it holds a control character, which no host name has: ", forms);
  HostPort hp{text, defaultPort};
  if (text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close == 1)
      DDPRUN_THROW(InvalidArgument, "invalid address '", shown, "': ", forms);
    hp.host = text.substr(1, close - 1);
    std::string rest = text.substr(close + 1);
    if (rest.empty()) return hp;
    if (rest.front() != ':')
      DDPRUN_THROW(InvalidArgument, "invalid address '", shown, "': ", forms);
    hp.port = parsePort(rest.substr(1), "port in address '" + shown + "'");
    return hp;
  }
  auto colon = text.find(':');
  if (colon == std::string::npos) return hp;
  if (text.find(':', colon + 1) != std::string::npos) return hp;  // bare IPv6
  hp.host = text.substr(0, colon);
  if (hp.host.empty())
    DDPRUN_THROW(InvalidArgument, "invalid address '", shown, "': missing host: ", forms);
  hp.port = parsePort(text.substr(colon + 1), "port in address '" + shown + "'");
  return hp;
}

std::string formatHostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos)
    return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {
// Inodes of sockets in LISTEN state (st == 0A) on `port`, from one
// /proc/net/tcp{,6} table.
void listeningInodes(const char* table, uint16_t port, std::set<std::string>& out) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
    ls >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >>
        inode;
    auto colon = local.rfind(':');
    if (colon == std::string::npos || st != "0A") continue;
    if (std::stoul(local.substr(colon + 1), nullptr, 16) == port)
      out.insert(inode);
  }
}
}  // namespace

std::optional<std::string> findListeningProcess(uint16_t port) {
  std::set<std::string> inodes;
  listeningInodes("/proc/net/tcp", port, inodes);
  listeningInodes("/proc/net/tcp6", port, inodes);
  if (inodes.empty()) return std::nullopt;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return std::nullopt;
  std::optional<std::string> found;
  while (dirent* pe = readdir(proc)) {
    std::string pid = pe->d_name;
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string fdDir = "/proc/" + pid + "/fd";
    DIR* fds = opendir(fdDir.c_str());
    if (fds == nullptr) continue;
    while (dirent* fe = readdir(fds)) {
      char target[128];
      std::string link = fdDir + "/" + fe->d_name;
      ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      std::string t(target, static_cast<size_t>(n));
      if (t.rfind("socket:[", 0) != 0) continue;
      if (inodes.count(t.substr(8, t.size() - 9)) == 0) continue;
      std::string comm;
      std::ifstream(("/proc/" + pid + "/comm").c_str()) >> comm;
      found = "pid " + pid + " (" + comm + ")";
      break;
    }
    closedir(fds);
    if (found) break;
  }
  closedir(proc);
  return found;
}

bool setNoDelay(int fd) {
  int one = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0;
}

uint64_t raiseFileLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

}  // namespace ddprun::net
