#include "ddprun/runtime/process_group.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "comm.h"
#include "cuda/cuda_comm.h"
#include "ddprun/common/env.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "ddprun/store/prefix_store.h"
#include "ddprun/store/tcp_store.h"
#include "ddprun/store/tcp_store_server.h"
#include "hier_comm.h"
#include "pg_internal.h"
#include "shm/shm_comm.h"
#include "tcp/tcp_ring.h"

namespace ddprun::runtime {

// ---------------------------------------------------------------- options
namespace {
// The variable's value, or nullopt when it is unset or empty (an empty value
// counts as unset for every runtime variable).
std::optional<std::string> envValue(const char* name) {
  auto v = env::get(name);
  if (!v || v->empty()) return std::nullopt;
  return v;
}

int envInt(const char* name, int fallback, bool required) {
  if (required && !envValue(name))
    DDPRUN_THROW(InvalidArgument, name,
                 " is not set: start this program with ddprun or torchrun, or set RANK, "
                 "WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself");
  return static_cast<int>(env::integer(name, fallback, 0, 1'000'000));
}

std::string readFirstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string defaultHostId() {
  return net::hostName() + "/" + readFirstLine("/proc/sys/kernel/random/boot_id");
}

// The local address of the route to `host` (no packet is sent).
std::string routeAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    char buf[INET6_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      const void* a = ss.ss_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
      if (::inet_ntop(ss.ss_family, a, buf, sizeof(buf))) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

// Groups created one after another on one store must not share keys, so
// each gets a sequence number. It counts per (prefix, rank), not per process:
// every rank creates the same sequence of groups, and ranks may be processes
// or threads of one process (tests/unit/rank_threads.h).
int nextGroupSeq(const std::string& prefix, int rank) {
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, int> seq;
  std::lock_guard lock(mu);
  return seq[{prefix, rank}]++;
}
}  // namespace

// The shared heap is mapped once per local rank; past 1 TiB per rank a value
// is a typo (and /dev/shm caps the heap far below that anyway).
constexpr int64_t kMaxSharedHeapMb = int64_t{1} << 20;

size_t sharedHeapBytesFromEnv(size_t fallback) {
  const auto fallbackMb = static_cast<int64_t>(fallback >> 20);
  try {
    return static_cast<size_t>(env::integer("DDPRUN_SHM_HEAP_MB", fallbackMb, 0, kMaxSharedHeapMb))
           << 20;
  } catch (const InvalidArgument& e) {
    DDPRUN_THROW(InvalidArgument, e.message(),
                 " (megabytes of shared heap per rank; the heap is also capped by the free "
                 "space in /dev/shm): give a number of megabytes up to ", kMaxSharedHeapMb,
                 ", or unset it for the default of ", fallbackMb);
  }
}

ProcessGroupOptions optionsFromEnv(ProcessGroupOptions o) {
  o.timeout = env::seconds("DDPRUN_COLLECTIVE_TIMEOUT", o.timeout);
  if (auto v = envValue("DDPRUN_TRANSPORT")) {
    try {
      o.transport = parseTransport(*v);
    } catch (const InvalidArgument& e) {
      DDPRUN_THROW(InvalidArgument, "DDPRUN_TRANSPORT: ", e.message());
    }
  }
  if (auto v = envValue("DDPRUN_HOST_ID")) o.hostId = *v;
  if (auto v = envValue("DDPRUN_SOCKET_ADDR")) o.socketAddr = *v;
  o.sharedHeapBytes = sharedHeapBytesFromEnv(o.sharedHeapBytes);
  return o;
}

// ---------------------------------------------------------------- Work
struct Work::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

void Work::wait() {
  DDPRUN_CHECK(state_ != nullptr, "wait() on an empty Work");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::completed() const {
  if (!state_) return false;
  std::lock_guard lock(state_->mu);
  return state_->done;
}

// ---------------------------------------------------------------- Impl
class ProcessGroup::Impl {
 public:
  std::unique_ptr<store::TcpStoreServer> server;
  std::shared_ptr<store::Store> store;  // prefixed
  std::unique_ptr<TcpListener> listener;
  std::unique_ptr<ShmComm> shm;
  std::unique_ptr<TcpRing> ring;
  std::unique_ptr<HierComm> hier;
  Comm* comm = nullptr;
  std::unique_ptr<CudaComm> cuda;

  // Shared-heap allocator: free blocks by offset (first fit, coalescing).
  std::mutex heapMu;
  std::map<size_t, size_t> freeBlocks;
  std::map<size_t, size_t> usedBlocks;
  std::set<void*> privateBlocks;  // allocShared without a segment

  std::mutex mu;
  std::condition_variable cv;
  struct Task {
    std::string name;
    std::function<void()> fn;
    std::shared_ptr<Work::State> state;
  };
  std::deque<Task> queue;
  bool stopping = false;
  bool busy = false;  // an operation is executing (worker or inline)
  std::exception_ptr broken;
  std::thread thread;
};

ProcessGroup::ProcessGroup(ProcessGroupOptions opts)
    : opts_(std::move(opts)), impl_(std::make_unique<Impl>()) {}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  // Tear down device state before the host transports it may use.
  impl_->cuda.reset();
  impl_->hier.reset();
  impl_->ring.reset();
  impl_->shm.reset();
  for (void* p : impl_->privateBlocks) std::free(p);
}

std::unique_ptr<ProcessGroup> ProcessGroup::fromEnv(ProcessGroupOptions opts) {
  const int size = envInt("WORLD_SIZE", 1, false);
  const int rank = envInt("RANK", 0, size > 1);
  if (rank >= size)
    DDPRUN_THROW(InvalidArgument, "RANK=", rank, " is not below WORLD_SIZE=", size);
  const auto addr = envValue("MASTER_ADDR");
  const bool hasPort = envValue("MASTER_PORT").has_value();
  std::shared_ptr<store::Store> st;
  std::unique_ptr<store::TcpStoreServer> server;
  if (size > 1 || (addr && hasPort)) {
    if (!addr || !hasPort)
      DDPRUN_THROW(InvalidArgument, addr ? "MASTER_PORT" : "MASTER_ADDR",
                   " is not set: start this program with ddprun or torchrun, or set it "
                   "(rank 0 hosts a store there)");
    const uint16_t port = *env::port("MASTER_PORT");
    const auto agent = envValue("TORCHELASTIC_USE_AGENT_STORE");
    const bool useAgent = agent && (*agent == "True" || *agent == "1" || *agent == "true");
    if (!useAgent && rank == 0) {
      store::TcpStoreServerOptions so;
      so.port = port;
      server = store::TcpStoreServer::start(so);
    }
    store::TcpStoreOptions co;
    co.host = *addr;
    co.port = port;
    co.timeout = opts.timeout;
    co.connectTimeout = std::min<std::chrono::milliseconds>(opts.timeout, std::chrono::minutes(5));
    st = store::TcpStore::connect(co);
  }
  if (opts.socketAddr.empty()) opts.socketAddr = addr ? routeAddress(*addr) : "127.0.0.1";
  const int restart = envInt("TORCHELASTIC_RESTART_COUNT", 0, false);
  opts.prefix += "/attempt" + std::to_string(restart);
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(std::move(opts)));
  pg->impl_->server = std::move(server);
  pg->init(std::move(st), rank, size);
  return pg;
}

std::unique_ptr<ProcessGroup> ProcessGroup::create(std::shared_ptr<store::Store> store, int rank,
                                                   int size, ProcessGroupOptions opts) {
  DDPRUN_CHECK(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " of ", size);
  DDPRUN_CHECK(store || size == 1, "a group of ", size, " ranks needs a store");
  if (opts.socketAddr.empty()) opts.socketAddr = "127.0.0.1";
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(std::move(opts)));
  pg->init(std::move(store), rank, size);
  return pg;
}

// Rendezvous: publish "hostId \t addr \t port", read everyone's, derive the
// topology, then connect the transports the topology calls for.
void ProcessGroup::init(std::shared_ptr<store::Store> base, int rank, int size) {
  Impl& m = *impl_;
  if (opts_.hostId.empty()) opts_.hostId = defaultHostId();
  topo_.rank = rank;
  topo_.size = size;
  const std::string prefix = opts_.prefix + "/g" + std::to_string(nextGroupSeq(opts_.prefix, rank));
  if (base) {
    base->setTimeout(opts_.timeout);
    m.store = std::make_shared<store::PrefixStore>(prefix, std::move(base));
  }
  std::vector<std::string> hostIds(size, opts_.hostId), hosts(size, opts_.socketAddr);
  std::vector<uint16_t> ports(size, 0);
  if (size > 1) {
    m.listener = TcpListener::open(opts_.socketAddr);
    m.store->set("rank/" + std::to_string(rank),
                 opts_.hostId + "\t" + opts_.socketAddr + "\t" + std::to_string(m.listener->port()));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back("rank/" + std::to_string(r));
    const auto values = m.store->multiGet(keys);
    for (int r = 0; r < size; ++r) {
      const auto f = str::split(values[r], '\t');
      int port = 0;
      if (f.size() != 3 || !str::parseInt(f[2], port, 1, 65535))
        DDPRUN_THROW(ProtocolError, "rank ", r, " published a malformed address '",
                     str::escape(values[r]), "' (another program using the same store prefix?)");
      hostIds[r] = f[0];
      hosts[r] = f[1];
      ports[r] = static_cast<uint16_t>(port);
    }
  }
  // Hosts are numbered in the order of their lowest rank.
  std::map<std::string, int> hostIndex;
  topo_.hostOfRank.assign(size, 0);
  for (int r = 0; r < size; ++r) {
    auto [it, fresh] = hostIndex.emplace(hostIds[r], static_cast<int>(hostIndex.size()));
    if (fresh) topo_.ranksOfHost.emplace_back();
    topo_.hostOfRank[r] = it->second;
    topo_.ranksOfHost[it->second].push_back(r);
  }
  topo_.numHosts = static_cast<int>(topo_.ranksOfHost.size());
  topo_.hostIndex = topo_.hostOfRank[rank];
  const auto& locals = topo_.ranksOfHost[topo_.hostIndex];
  topo_.localSize = static_cast<int>(locals.size());
  topo_.localRank = static_cast<int>(std::find(locals.begin(), locals.end(), rank) - locals.begin());

  transport_ = opts_.transport;
  if (transport_ == Transport::kAuto) {
    if (topo_.numHosts == 1)
      transport_ = Transport::kShm;
    else if (size == topo_.numHosts)
      transport_ = Transport::kTcp;
    else
      transport_ = Transport::kHierarchical;
  }
  if (transport_ == Transport::kShm && topo_.numHosts > 1)
    DDPRUN_THROW(InvalidArgument, "DDPRUN_TRANSPORT=shm but the ranks are on ", topo_.numHosts,
                 " hosts; shared memory only works on one host (use auto, tcp or hier)");

  const bool wantShm = size > 1 && (transport_ == Transport::kShm ||
                                    (transport_ == Transport::kHierarchical && topo_.localSize > 1));
  if (wantShm) {
    CommContext ctx{locals, topo_.localRank, opts_.timeout};
    const std::string key = "shm/" + std::to_string(topo_.hostIndex);
    if (topo_.localRank == 0) {
      const std::string name = "/ddprun." + str::randomToken(16) + "." + std::to_string(topo_.hostIndex);
      const size_t room = ShmComm::freeShmBytes() / (2 * static_cast<size_t>(topo_.localSize));
      const size_t heap = std::min(opts_.sharedHeapBytes, room);
      m.shm = ShmComm::create(name, ctx, ShmComm::kDefaultSlotBytes, heap);
      m.store->set(key, name);
      std::vector<std::string> mapped;
      for (int i = 1; i < topo_.localSize; ++i) mapped.push_back(key + "/mapped/" + std::to_string(i));
      try {
        if (!mapped.empty()) m.store->wait(mapped);
      } catch (...) {
        ShmComm::unlink(name);
        throw;
      }
      ShmComm::unlink(name);  // everyone has it mapped: nothing can leak now
    } else {
      m.shm = ShmComm::open(m.store->get(key), ctx);
      m.store->set(key + "/mapped/" + std::to_string(topo_.localRank), "1");
    }
  }

  std::vector<int> ringRanks;
  if (transport_ == Transport::kTcp || size == 1) {
    for (int r = 0; r < size; ++r) ringRanks.push_back(r);
  } else if (transport_ == Transport::kHierarchical && topo_.localRank == 0) {
    for (const auto& h : topo_.ranksOfHost) ringRanks.push_back(h.front());
  }
  if (!ringRanks.empty()) {
    std::vector<std::string> rh;
    std::vector<uint16_t> rp;
    for (int r : ringRanks) {
      rh.push_back(hosts[r]);
      rp.push_back(ports[r]);
    }
    const int me = static_cast<int>(std::find(ringRanks.begin(), ringRanks.end(), rank) - ringRanks.begin());
    CommContext ctx{ringRanks, me, opts_.timeout};
    m.ring = TcpRing::connect(ctx, m.listener.get(), rh, rp, 1);
  }
  if (transport_ == Transport::kHierarchical) {
    m.hier = std::make_unique<HierComm>(topo_, m.shm.get(), m.ring.get());
    m.comm = m.hier.get();
  } else {
    m.comm = transport_ == Transport::kShm && m.shm ? static_cast<Comm*>(m.shm.get())
                                                    : static_cast<Comm*>(m.ring.get());
  }
  // Free blocks of the shared heap (64-byte granularity).
  if (m.shm && m.shm->heapBytes() > 0) m.freeBlocks[0] = m.shm->heapBytes();
  m.thread = std::thread([this] { workerLoop(); });
  DDPRUN_DEBUG(describe());
}

void ProcessGroup::workerLoop() {
  Impl& im = *impl_;
  while (true) {
    Impl::Task t;
    {
      std::unique_lock lock(im.mu);
      im.cv.wait(lock, [&] { return !im.busy && (im.stopping || !im.queue.empty()); });
      if (im.queue.empty()) break;
      t = std::move(im.queue.front());
      im.queue.pop_front();
      im.busy = true;
    }
    std::exception_ptr err = execute(t.name, t.fn);
    {
      std::lock_guard lock(im.mu);
      im.busy = false;
    }
    im.cv.notify_all();
    {
      std::lock_guard lock(t.state->mu);
      t.state->done = true;
      t.state->error = err;
    }
    t.state->cv.notify_all();
  }
}

// Runs one operation; a transport failure breaks the group for good (peers
// are in an unknown state), a caller mistake does not.
std::exception_ptr ProcessGroup::execute(const std::string& name, const std::function<void()>& fn) {
  Impl& im = *impl_;
  if (im.broken) return im.broken;
  try {
    fn();
    return nullptr;
  } catch (const PeerFailure& e) {
    im.comm->abort(topo_.rank);
    const std::string msg = name + " failed on rank " + std::to_string(topo_.rank) + ": " +
                            e.message() + diagnose(e.message(), e.peer());
    DDPRUN_ERROR(msg);
    im.broken = e.timedOut() ? std::make_exception_ptr(TimeoutError(msg, e.file(), e.line()))
                             : std::make_exception_ptr(IoError(msg, e.file(), e.line()));
    return im.broken;
  } catch (const InvalidArgument&) {
    return std::current_exception();
  } catch (...) {
    im.broken = std::current_exception();
    im.comm->abort(topo_.rank);
    return im.broken;
  }
}

std::string ProcessGroup::describe() const {
  std::ostringstream os;
  os << "rank " << topo_.rank << "/" << topo_.size << " on host " << topo_.hostIndex << " of "
     << topo_.numHosts << " (local " << topo_.localRank << "/" << topo_.localSize
     << "), transport " << transportName(transport_);
  return os.str();
}

Work ProcessGroup::enqueue(std::string name, std::function<void()> fn) {
  return run(std::move(name), std::move(fn), false);
}

Work ProcessGroup::run(std::string name, std::function<void()> fn, bool inlineOk) {
  auto state = std::make_shared<Work::State>();
  Impl& im = *impl_;
  {
    std::unique_lock lock(im.mu);
    DDPRUN_CHECK(!im.stopping, "the process group is being destroyed");
    if (!inlineOk || im.busy || !im.queue.empty()) {
      im.queue.push_back({std::move(name), std::move(fn), state});
      lock.unlock();
      im.cv.notify_all();
      return Work(state);
    }
    im.busy = true;
  }
  state->error = execute(name, fn);
  state->done = true;
  {
    std::lock_guard lock(im.mu);
    im.busy = false;
  }
  im.cv.notify_all();  // the worker may have been handed work meanwhile
  return Work(state);
}

Comm& ProcessGroup::comm() { return *impl_->comm; }

CudaComm& ProcessGroup::cudaComm() {
  if (!impl_->cuda) impl_->cuda = makeCudaComm(*this, *impl_->comm, impl_->shm.get());
  return *impl_->cuda;
}

// Every failing rank records what it saw; ranks that never record anything
// within a short grace period are the dead or stalled ones.
std::string ProcessGroup::diagnose(const std::string& what, int suspect) {
  if (!impl_->store || topo_.size == 1) return "";
  auto& st = *impl_->store;
  try {
    st.set("fault/" + std::to_string(topo_.rank), what);
    const auto grace = std::min<std::chrono::milliseconds>(std::chrono::milliseconds(1500),
                                                           opts_.timeout / 4);
    const Deadline deadline(grace);
    std::vector<int> silent;
    do {
      silent.clear();
      for (int r = 0; r < topo_.size; ++r)
        if (r != topo_.rank && !st.check({"fault/" + std::to_string(r)})) silent.push_back(r);
      if (silent.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    } while (!deadline.expired());
    // The rank hosting the store stays a little longer, so that ranks which
    // noticed the failure later can still ask.
    if (impl_->server) std::this_thread::sleep_for(grace);
    if (silent.empty()) return "";
    std::ostringstream os;
    os << ". " << (silent.size() == 1 ? "Rank " : "Ranks ");
    for (size_t i = 0; i < silent.size(); ++i) os << (i ? ", " : "") << silent[i];
    os << (silent.size() == 1 ? " is the likely culprit: it" : " are the likely culprits: they")
       << " reported no failure within " << grace.count() << " ms (dead, stalled or gone)";
    if (std::find(silent.begin(), silent.end(), suspect) == silent.end() && suspect >= 0)
      os << "; rank " << suspect << " only passed the failure on";
    return os.str();
  } catch (const std::exception& e) {
    std::string out = suspect >= 0 ? ". Rank " + std::to_string(suspect) + " is the likely culprit" : "";
    return out + " (the store is unreachable too, so other ranks could not be asked: " +
           e.what() + ")";
  }
}

void* ProcessGroup::allocShared(size_t bytes) {
  Impl& m = *impl_;
  bytes = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  std::lock_guard lock(m.heapMu);
  if (!m.shm || m.shm->heapBytes() == 0) {
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    m.privateBlocks.insert(p);
    return p;
  }
  for (auto it = m.freeBlocks.begin(); it != m.freeBlocks.end(); ++it) {
    if (it->second < bytes) continue;
    const size_t off = it->first, len = it->second;
    m.freeBlocks.erase(it);
    if (len > bytes) m.freeBlocks[off + bytes] = len - bytes;
    m.usedBlocks[off] = bytes;
    return m.shm->heap(m.shm->me()) + off;
  }
  DDPRUN_THROW(InvalidArgument, "shared heap exhausted: ", bytes, " bytes wanted of ",
               m.shm->heapBytes(), " per rank; raise DDPRUN_SHM_HEAP_MB (and the size of /dev/shm)");
}

void ProcessGroup::freeShared(void* p) {
  Impl& m = *impl_;
  if (!p) return;
  std::lock_guard lock(m.heapMu);
  if (m.privateBlocks.erase(p)) {
    std::free(p);
    return;
  }
  DDPRUN_CHECK(m.shm != nullptr, "freeShared of a pointer allocShared did not return");
  const int64_t off64 = m.shm->heapOffset(p, 1);
  DDPRUN_CHECK(off64 >= 0 && m.usedBlocks.count(static_cast<size_t>(off64)),
               "freeShared of a pointer allocShared did not return");
  size_t off = static_cast<size_t>(off64), len = m.usedBlocks[off];
  m.usedBlocks.erase(off);
  auto next = m.freeBlocks.lower_bound(off);
  if (next != m.freeBlocks.end() && off + len == next->first) {
    len += next->second;
    next = m.freeBlocks.erase(next);
  }
  if (next != m.freeBlocks.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  m.freeBlocks[off] = len;
}

// ---------------------------------------------------------------- internal
namespace internal {
struct Access {
  static Comm& comm(ProcessGroup& pg) { return pg.comm(); }
  static CudaComm& cudaComm(ProcessGroup& pg) { return pg.cudaComm(); }
  static Work run(ProcessGroup& pg, std::string name, std::function<void()> fn, bool inlineOk) {
    return pg.run(std::move(name), std::move(fn), inlineOk);
  }
  static std::string diagnose(ProcessGroup& pg, const std::string& what, int suspect) {
    return pg.diagnose(what, suspect);
  }
};

Comm& comm(ProcessGroup& pg) { return Access::comm(pg); }
CudaComm& cudaComm(ProcessGroup& pg) { return Access::cudaComm(pg); }
Work enqueue(ProcessGroup& pg, std::string name, std::function<void()> fn) {
  return Access::run(pg, std::move(name), std::move(fn), false);
}
Work run(ProcessGroup& pg, std::string name, std::function<void()> fn, bool inlineOk) {
  return Access::run(pg, std::move(name), std::move(fn), inlineOk);
}
std::string diagnose(ProcessGroup& pg, const std::string& what, int suspect) {
  return Access::diagnose(pg, what, suspect);
}
}  // namespace internal

}  // namespace ddprun::runtime
