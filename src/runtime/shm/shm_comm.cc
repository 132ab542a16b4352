#include "shm_comm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "../reduce.h"

namespace ddprun::runtime {

namespace {
constexpr uint64_t kMagic = 0x64647072756e5348ull;  // "ddprunSH"
constexpr uint32_t kVersion = 2;  // 2: Control::left
constexpr size_t kPage = 4096;
constexpr int kMaxMembers = 1024;
// Below this many bytes read per rank, one barrier and a full n-way reduce
// on every rank beat reduce-scatter + all-gather's two barriers.
constexpr size_t kSmallReadBytes = 256 * 1024;

size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

int futexWait(std::atomic<uint32_t>* addr, uint32_t expected, long nanos) {
  timespec ts{nanos / 1'000'000'000L, nanos % 1'000'000'000L};
  return static_cast<int>(
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0));
}
void futexWakeAll(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// True when the process is gone or a zombie (exited, not yet reaped).
bool processDead(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  if (close == std::string::npos || close + 2 >= s.size()) return false;
  const char state = s[close + 2];
  return state == 'Z' || state == 'X';
}

int onlineCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << static_cast<double>(ms.count()) / 1000.0 << " s";
  return os.str();
}
}  // namespace

struct ShmComm::Header {
  uint64_t magic;
  uint32_t version;
  int32_t members;
  uint64_t slotBytes;
  uint64_t heapBytes;
  uint64_t controlOffset, slotOffset, heapOffset, totalBytes;
  alignas(64) std::atomic<uint32_t> epoch;
  std::atomic<uint32_t> sleepers;
  alignas(64) std::atomic<int32_t> abortedBy;  // global rank + 1; 0: none
};

struct ShmComm::Control {
  alignas(128) std::atomic<uint64_t> arrived;
  std::atomic<int32_t> pid;
  // Set when this member's ShmComm is destroyed. The pid check cannot see a
  // member that leaves while its process lives on: a group destroyed during
  // an exception, or a rank run as a thread (all members share one pid).
  std::atomic<int32_t> left;
  std::atomic<int64_t> desc;  // heap offset of this member's buffer, or -1
};

std::unique_ptr<ShmComm> ShmComm::create(const std::string& name, CommContext ctx,
                                         size_t slotBytes, size_t heapBytes) {
  const int n = ctx.size();
  DDPRUN_CHECK(n >= 1 && n <= kMaxMembers, "shared-memory group of ", n, " ranks");
  slotBytes = roundUp(std::max<size_t>(slotBytes, kPage), kPage);
  heapBytes = roundUp(heapBytes, kPage);
  const size_t controlOffset = roundUp(sizeof(Header), kPage);
  const size_t slotOffset = controlOffset + roundUp(n * sizeof(Control), kPage);
  const size_t heapOffset = slotOffset + static_cast<size_t>(n) * 2 * slotBytes;
  const size_t total = heapOffset + static_cast<size_t>(n) * heapBytes;

  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    DDPRUN_THROW(IoError, "cannot create shared memory ", name, ": ", std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    const int err = errno;
    ::close(fd);
    unlink(name);
    DDPRUN_THROW(IoError, "cannot size shared memory ", name, " to ", total, " bytes: ",
                 std::strerror(err));
  }
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    unlink(name);
    DDPRUN_THROW(IoError, "cannot map shared memory ", name, ": ", std::strerror(errno));
  }
  auto* h = new (base) Header{};
  h->magic = kMagic;
  h->version = kVersion;
  h->members = n;
  h->slotBytes = slotBytes;
  h->heapBytes = heapBytes;
  h->controlOffset = controlOffset;
  h->slotOffset = slotOffset;
  h->heapOffset = heapOffset;
  h->totalBytes = total;
  for (int i = 0; i < n; ++i) {
    auto* c = new (static_cast<char*>(base) + controlOffset + i * sizeof(Control)) Control{};
    c->desc.store(-1);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return std::unique_ptr<ShmComm>(new ShmComm(std::move(ctx), base, total));
}

std::unique_ptr<ShmComm> ShmComm::open(const std::string& name, CommContext ctx) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0)
    DDPRUN_THROW(IoError, "cannot open shared memory ", name, ": ", std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const size_t total = static_cast<size_t>(st.st_size);
  void* base = total >= sizeof(Header) ? ::mmap(nullptr, total, PROT_READ | PROT_WRITE,
                                                MAP_SHARED | MAP_NORESERVE, fd, 0)
                                       : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED)
    DDPRUN_THROW(IoError, "cannot map shared memory ", name, " (", total, " bytes)");
  auto* h = static_cast<Header*>(base);
  if (h->magic != kMagic || h->version != kVersion || h->members != ctx.size() ||
      h->totalBytes != total) {
    ::munmap(base, total);
    DDPRUN_THROW(ProtocolError, "shared memory ", name, " has an unexpected layout (",
                 h->members, " members, this rank expects ", ctx.size(), ")");
  }
  return std::unique_ptr<ShmComm>(new ShmComm(std::move(ctx), base, total));
}

void ShmComm::unlink(const std::string& name) noexcept { ::shm_unlink(name.c_str()); }

size_t ShmComm::freeShmBytes() {
  struct statvfs vfs {};
  if (::statvfs("/dev/shm", &vfs) != 0) return 0;
  return static_cast<size_t>(vfs.f_bavail) * vfs.f_frsize;
}

ShmComm::ShmComm(CommContext ctx, void* base, size_t mapBytes)
    : ctx_(std::move(ctx)), base_(base), mapBytes_(mapBytes) {
  control(ctx_.me)->pid.store(static_cast<int32_t>(::getpid()));
  // Spinning only helps when every rank has a core; oversubscribed ranks
  // must sleep so that the rank they wait for can run.
  spinIters_ = ctx_.size() <= onlineCpus() ? 4000 : 0;
}

ShmComm::~ShmComm() {
  // Peers still waiting for this member fail now instead of at the timeout.
  control(ctx_.me)->left.store(1, std::memory_order_seq_cst);
  header()->epoch.fetch_add(1, std::memory_order_seq_cst);
  futexWakeAll(&header()->epoch);
  ::munmap(base_, mapBytes_);
}

ShmComm::Header* ShmComm::header() const { return static_cast<Header*>(base_); }
ShmComm::Control* ShmComm::control(int m) const {
  return reinterpret_cast<Control*>(static_cast<char*>(base_) + header()->controlOffset +
                                    m * sizeof(Control));
}
size_t ShmComm::slotBytes() const { return header()->slotBytes; }
char* ShmComm::slot(int m, int buf) const {
  return static_cast<char*>(base_) + header()->slotOffset + (2 * m + buf) * slotBytes();
}
char* ShmComm::heap(int m) const {
  return static_cast<char*>(base_) + header()->heapOffset + m * header()->heapBytes;
}
size_t ShmComm::heapBytes() const { return header()->heapBytes; }
int64_t ShmComm::heapOffset(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  const char* h = heap(ctx_.me);
  if (c < h || c + bytes > h + heapBytes()) return -1;
  return c - h;
}

void ShmComm::arrive() {
  Header* h = header();
  control(ctx_.me)->arrived.store(++seq_, std::memory_order_seq_cst);
  h->epoch.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleepers.load(std::memory_order_seq_cst) > 0) futexWakeAll(&h->epoch);
}

bool ShmComm::allArrived(uint64_t target) const {
  for (int j = 0; j < ctx_.size(); ++j)
    if (control(j)->arrived.load(std::memory_order_acquire) < target) return false;
  return true;
}

void ShmComm::checkPeers(uint64_t target, const char* what, const Deadline& deadline) const {
  if (int by = header()->abortedBy.load(); by != 0)
    DDPRUN_PEER_FAILURE(by - 1, false, what, ": rank ", by - 1,
                        " aborted the collective after a failure");
  std::vector<int> missing;
  for (int j = 0; j < ctx_.size(); ++j) {
    if (control(j)->arrived.load(std::memory_order_acquire) >= target) continue;
    if (control(j)->left.load() != 0)
      DDPRUN_PEER_FAILURE(ctx_.ranks[j], false, what, ": rank ", ctx_.ranks[j],
                          " left the group (destroyed its process group) while this rank "
                          "waited for it");
    const int pid = control(j)->pid.load();
    if (processDead(pid))
      DDPRUN_PEER_FAILURE(ctx_.ranks[j], false, what, ": rank ", ctx_.ranks[j], " (pid ", pid,
                          ") exited while this rank waited for it");
    missing.push_back(ctx_.ranks[j]);
  }
  if (!missing.empty() && deadline.expired()) {
    std::ostringstream os;
    for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
    DDPRUN_PEER_FAILURE(missing.front(), true, what, ": timed out after ",
                        seconds(ctx_.timeout), " waiting for rank(s) ", os.str(),
                        " (stalled or deadlocked; raise DDPRUN_COLLECTIVE_TIMEOUT if they are "
                        "just slow)");
  }
}

void ShmComm::waitAll(uint64_t target, const char* what) {
  if (allArrived(target)) return;
  for (int i = 0; i < spinIters_; ++i) {
    cpuRelax();
    if (allArrived(target)) return;
  }
  if (spinIters_ == 0) {
    for (int i = 0; i < 4; ++i) {
      sched_yield();
      if (allArrived(target)) return;
    }
  }
  Header* h = header();
  const Deadline deadline(ctx_.timeout);
  while (true) {
    h->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t e = h->epoch.load(std::memory_order_seq_cst);
    const bool done = allArrived(target);
    if (!done && h->abortedBy.load() == 0) futexWait(&h->epoch, e, 50'000'000L);
    h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (done || allArrived(target)) return;
    checkPeers(target, what, deadline);
  }
}

void ShmComm::sync(const char* what) {
  arrive();
  waitAll(seq_, what);
}

void ShmComm::abort(int by) noexcept {
  int32_t expected = 0;
  header()->abortedBy.compare_exchange_strong(expected, by + 1);
  header()->epoch.fetch_add(1);
  futexWakeAll(&header()->epoch);
}

// One barrier: everyone stages its whole input, then every rank reduces the
// whole vector from all slots. Reads n*S per rank, but for small S the cost
// is the barrier, and this has one instead of two.
void ShmComm::allReduceSmall(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  const int b = nextBuf();
  std::memcpy(slot(ctx_.me, b), in, count * dtypeSize(t));
  sync("allReduce");
  const void* srcs[kMaxMembers];
  for (int j = 0; j < size(); ++j) srcs[j] = slot(j, b);
  void* dsts[1] = {out};
  reduceNTo(t, op, dsts, 1, srcs, size(), count, op == ReduceOp::kAvg ? size() : 1);
}

// Reduce-scatter + all-gather through shared memory, per chunk of up to one
// slot: (1) each rank publishes its chunk — in place when the buffer lives in
// its shared heap, else copied into its slot; barrier; (2) rank i reduces
// slice i (1/n of the chunk) reading it from all n ranks, writes the result
// into its output, into every in-place peer's buffer and (if anyone staged)
// into its own slot; barrier; (3) staged ranks copy the other n-1 slices out.
// Bytes, per rank, S = chunk: in place (every buffer in the heap) reads S and
// writes S, the 2nS system floor of the reference; staged reads ~3S and writes
// ~2S (the 5nS staged bound). Slots alternate between two buffers, so the next
// chunk's staging overlaps peers' copy-out without a third barrier.
void ShmComm::allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  const size_t es = dtypeSize(t);
  const int n = size();
  if (count == 0) return;
  if (n == 1) {
    if (in != out) std::memcpy(out, in, count * es);
    return;
  }
  if (count * es * n <= kSmallReadBytes && count * es <= slotBytes())
    return allReduceSmall(in, out, count, t, op);
  const int me = ctx_.me;
  const int64_t myOff = in == out ? heapOffset(out, count * es) : -1;
  const size_t chunkElems = slotBytes() / es;
  const void* srcs[kMaxMembers];
  int64_t desc[kMaxMembers];
  for (size_t e0 = 0; e0 < count; e0 += chunkElems) {
    const size_t len = std::min(chunkElems, count - e0);
    const int b = nextBuf();
    char* dst = static_cast<char*>(out) + e0 * es;
    if (myOff >= 0) {
      control(me)->desc.store(myOff + static_cast<int64_t>(e0 * es), std::memory_order_relaxed);
    } else {
      std::memcpy(slot(me, b), static_cast<const char*>(in) + e0 * es, len * es);
      control(me)->desc.store(-1, std::memory_order_relaxed);
    }
    sync("allReduce");
    const Partition part(len, n);
    const size_t lo = part.offset(me) * es, mine = part.length(me);
    bool anyStaged = false;
    for (int j = 0; j < n; ++j) {
      desc[j] = control(j)->desc.load(std::memory_order_relaxed);
      srcs[j] = desc[j] >= 0 ? heap(j) + desc[j] + lo : slot(j, b) + lo;
      anyStaged |= desc[j] < 0;
    }
    // One pass: reduce, divide (avg), store to my output, to every in-place
    // peer's buffer and (if anyone staged) to my slot for their copy-out.
    void* dsts[kMaxMembers + 1];
    int m = 0;
    dsts[m++] = dst + lo;
    for (int j = 0; j < n; ++j)
      if (j != me && desc[j] >= 0) dsts[m++] = heap(j) + desc[j] + lo;
    if (anyStaged) dsts[m++] = slot(me, b) + lo;
    reduceNTo(t, op, dsts, m, srcs, n, mine, op == ReduceOp::kAvg ? n : 1);
    sync("allReduce");
    if (myOff < 0)
      for (int j = 0; j < n; ++j)
        if (j != me)
          std::memcpy(dst + part.offset(j) * es, slot(j, b) + part.offset(j) * es,
                      part.length(j) * es);
  }
}

// Root copies each chunk into its slot; barrier; everyone else copies it out.
// Root writes S, every other rank reads S and writes S.
void ShmComm::broadcast(void* buf, size_t bytes, int root) {
  if (size() == 1) return;
  for (size_t off = 0; off < bytes; off += slotBytes()) {
    const size_t len = std::min(slotBytes(), bytes - off);
    const int b = nextBuf();
    if (ctx_.me == root) std::memcpy(slot(root, b), static_cast<char*>(buf) + off, len);
    sync("broadcast");
    if (ctx_.me != root) std::memcpy(static_cast<char*>(buf) + off, slot(root, b), len);
  }
}

// Each rank copies its piece (chunk by chunk) into its slot; barrier; each
// copies every peer's piece out. Per rank: writes S_me + sum S_j, reads the same.
void ShmComm::allGather(const void* in, void* out, const std::vector<size_t>& bytes) {
  const int n = size(), me = ctx_.me;
  const std::vector<size_t> off = prefixOffsets(bytes);
  char* o = static_cast<char*>(out);
  if (in != o + off[me] && bytes[me] > 0) std::memcpy(o + off[me], in, bytes[me]);
  if (n == 1) return;
  const size_t maxLen = *std::max_element(bytes.begin(), bytes.end());
  const char* src = o + off[me];
  for (size_t k0 = 0; k0 < maxLen; k0 += slotBytes()) {
    const int b = nextBuf();
    if (bytes[me] > k0) std::memcpy(slot(me, b), src + k0, std::min(slotBytes(), bytes[me] - k0));
    sync("allGather");
    for (int j = 0; j < n; ++j)
      if (j != me && bytes[j] > k0)
        std::memcpy(o + off[j] + k0, slot(j, b), std::min(slotBytes(), bytes[j] - k0));
  }
}

// Each rank stages the n-1 blocks that others own; barrier; rank i reduces
// block i from every slot (its own block straight from its input). Per rank,
// S = count: writes (n-1)S and reads (n-1)S staging, reads nS and writes S
// reducing — the staged bound; the output is written once.
void ShmComm::reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  const size_t es = dtypeSize(t);
  const int n = size(), me = ctx_.me;
  const char* src = static_cast<const char*>(in);
  if (n == 1) {
    if (in != out && count) std::memmove(out, in, count * es);
    return;
  }
  const size_t chunk = std::max<size_t>(1, slotBytes() / (n * es));
  const void* srcs[kMaxMembers];
  for (size_t e0 = 0; e0 < count; e0 += chunk) {
    const size_t len = std::min(chunk, count - e0);
    const int b = nextBuf();
    for (int j = 0; j < n; ++j)
      if (j != me) std::memcpy(slot(me, b) + j * len * es, src + (j * count + e0) * es, len * es);
    sync("reduceScatter");
    for (int j = 0; j < n; ++j)
      srcs[j] = j == me ? src + (me * count + e0) * es : slot(j, b) + me * len * es;
    void* dsts[1] = {static_cast<char*>(out) + e0 * es};
    reduceNTo(t, op, dsts, 1, srcs, n, len, op == ReduceOp::kAvg ? n : 1);
  }
}

void ShmComm::barrier() {
  if (size() > 1) sync("barrier");
}

}  // namespace ddprun::runtime
