// Correctness check of every collective against a float64 (or exact integer)
// reference, run as one rank of a group: `ddprun --nproc_per_node=N
// --no_python coll_check [flags]`. Every rank derives every rank's input from
// (seed, rank, op, element) so it can compute the reference locally.
//
// Tolerance for floating point (sum, avg): |got - ref| <= (n + 2) * eps *
// sum_i |x_i| / (n for avg else 1) + eps * |ref|, eps of the dtype (fp32 2^-23,
// fp64 2^-52, fp16 2^-10, bf16 2^-7): each of the up to n roundings of a
// partial sum costs at most eps times the running magnitude. Product: relative
// 2 (n + 1) eps. Min, max and all integer results: exact (integers wrap like
// the hardware; integer avg truncates toward zero).
//
// --device cuda also checks the stream-ordered path the Reducer uses (see
// orderedChecks).
//
// Exit 0: all passed; 1: a mismatch (first one printed); 2: bad flags.
// --loop: all-reduce forever printing "iter N" (for the fault tests).
// --nccl-version: print "nccl_runtime_version CODE X.Y.Z gpus N" (CODE 0,
// "none": built without CUDA) and exit; needs no GPU and no process group.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_comm.h"  // ncclVersionString
#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/cuda.h"
#include "device_order.h"

#ifdef DDPRUN_WITH_CUDA
#include <cuda_runtime.h>
#endif

using namespace ddprun::runtime;

namespace {

struct Args {
  std::vector<size_t> sizes{0, 1, 7, 4097, 1048579};
  std::vector<DType> dtypes{std::begin(kAllDTypes), std::end(kAllDTypes)};
  std::vector<ReduceOp> ops{std::begin(kAllReduceOps), std::end(kAllReduceOps)};
  Device device = Device::kCpu;
  uint64_t seed = 1234;
  bool loop = false;
  bool shared = false;  // use allocShared buffers (the in-place fast path)
  bool ncclVersion = false;
  size_t loopCount = 1 << 22;
};

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Value of element i of rank r's input to operation `tag`, as double,
// already representable in dtype t.
double gen(const Args& a, DType t, ReduceOp op, int r, uint64_t tag, size_t i) {
  const uint64_t h = mix(a.seed ^ mix(tag * 1315423911ull + r) ^ mix(i));
  const double u = static_cast<double>(h >> 11) / 9007199254740992.0;  // [0,1)
  double v;
  if (isFloating(t)) {
    v = op == ReduceOp::kProduct ? 0.5 + u : 2.0 * u - 1.0;
  } else if (op == ReduceOp::kProduct) {
    v = t == DType::kUInt8 ? static_cast<double>(h % 4) : static_cast<double>(static_cast<int>(h % 5) - 2);
  } else {
    v = t == DType::kUInt8 ? static_cast<double>(h % 9) : static_cast<double>(static_cast<int>(h % 17) - 8);
  }
  // Round to the dtype so the reference sees exactly what the rank sends.
  switch (t) {
    case DType::kFloat32: return static_cast<float>(v);
    case DType::kFloat16: return halfToFloat(floatToHalf(static_cast<float>(v)));
    case DType::kBFloat16: return bf16ToFloat(floatToBf16(static_cast<float>(v)));
    default: return v;
  }
}

void store(DType t, void* buf, size_t i, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(buf)[i] = v; break;
    case DType::kFloat16: static_cast<uint16_t*>(buf)[i] = floatToHalf(static_cast<float>(v)); break;
    case DType::kBFloat16: static_cast<uint16_t*>(buf)[i] = floatToBf16(static_cast<float>(v)); break;
    case DType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case DType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int>(v)); break;
  }
}

double load(DType t, const void* buf, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(buf)[i];
    case DType::kFloat64: return static_cast<const double*>(buf)[i];
    case DType::kFloat16: return halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::kBFloat16: return bf16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

double eps(DType t) {
  switch (t) {
    case DType::kFloat32: return std::ldexp(1.0, -23);
    case DType::kFloat64: return std::ldexp(1.0, -52);
    case DType::kFloat16: return std::ldexp(1.0, -10);
    case DType::kBFloat16: return std::ldexp(1.0, -7);
    default: return 0;
  }
}

// Integer reference with the dtype's wrap-around.
double wrapInt(DType t, int64_t v) {
  if (t == DType::kUInt8) return static_cast<uint8_t>(v);
  if (t == DType::kInt32) return static_cast<int32_t>(v);
  return static_cast<double>(v);
}

struct Failure {
  std::string msg;
};

// Checks element i of a reduction result against the reference.
void checkReduced(const Args& a, DType t, ReduceOp op, int n, uint64_t tag, size_t genIndex,
                  double got, const std::string& what, size_t i) {
  double ref, absSum = 0;
  if (isFloating(t)) {
    ref = gen(a, t, op, 0, tag, genIndex);
    absSum = std::fabs(ref);
    for (int r = 1; r < n; ++r) {
      const double x = gen(a, t, op, r, tag, genIndex);
      absSum += std::fabs(x);
      switch (op) {
        case ReduceOp::kSum: case ReduceOp::kAvg: ref += x; break;
        case ReduceOp::kMin: ref = std::min(ref, x); break;
        case ReduceOp::kMax: ref = std::max(ref, x); break;
        case ReduceOp::kProduct: ref *= x; break;
      }
    }
    if (op == ReduceOp::kAvg) {
      ref /= n;
      absSum /= n;
    }
  } else {
    int64_t acc = static_cast<int64_t>(gen(a, t, op, 0, tag, genIndex));
    for (int r = 1; r < n; ++r) {
      const int64_t x = static_cast<int64_t>(gen(a, t, op, r, tag, genIndex));
      switch (op) {
        case ReduceOp::kSum: case ReduceOp::kAvg: acc += x; break;
        case ReduceOp::kMin: acc = std::min(acc, x); break;
        case ReduceOp::kMax: acc = std::max(acc, x); break;
        case ReduceOp::kProduct: acc = static_cast<int64_t>(wrapInt(t, acc * x)); break;
      }
    }
    ref = wrapInt(t, acc);
    if (op == ReduceOp::kAvg) ref = static_cast<double>(static_cast<int64_t>(ref) / n);
  }
  double tol = 0;
  if (isFloating(t)) {
    const double e = eps(t);
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) tol = (n + 2) * e * absSum + e * std::fabs(ref);
    if (op == ReduceOp::kProduct) tol = 2 * (n + 1) * e * std::fabs(ref);
  }
  if (!(std::fabs(got - ref) <= tol)) {
    std::ostringstream os;
    os << what << ": element " << i << " is " << got << ", expected " << ref << " (tolerance "
       << tol << ")";
    throw Failure{os.str()};
  }
}

// Host or device buffer holding `bytes`.
struct Buffer {
  Buffer(ProcessGroup& pg, const Args& a, size_t bytes) : pg(pg), dev(a.device), shared(a.shared), bytes(bytes) {
    host.resize(bytes ? bytes : 1);
    if (dev == Device::kCuda) p = cudaAllocDevice(bytes);
    else if (shared) p = pg.allocShared(bytes);
    else p = host.data();
  }
  ~Buffer() {
    if (dev == Device::kCuda) cudaFreeDevice(p);
    else if (shared) pg.freeShared(p);
  }
  void upload() {
    if (dev == Device::kCuda) cudaCopyToDevice(p, host.data(), bytes);
    else if (p != host.data()) std::memcpy(p, host.data(), bytes);
  }
  const std::vector<char>& download() {
    if (dev == Device::kCuda) cudaCopyToHost(host.data(), p, bytes);
    else if (p != host.data()) std::memcpy(host.data(), p, bytes);
    return host;
  }
  ProcessGroup& pg;
  Device dev;
  bool shared;
  size_t bytes;
  std::vector<char> host;
  void* p = nullptr;
};

struct Checker {
  ProcessGroup& pg;
  const Args& a;
  uint64_t tag = 0;
  int checks = 0;

  // Every (op, size, in/out-of-place) all-reduce of one dtype in flight at
  // once, then verified.
  void allReduces(DType t) {
    struct Case {
      ReduceOp op;
      size_t count;
      bool inPlace;
      uint64_t tag;
      std::unique_ptr<Buffer> in, out;
      Work work;
    };
    std::vector<Case> cases;
    const size_t es = dtypeSize(t);
    for (ReduceOp op : a.ops)
      for (size_t count : a.sizes)
        for (bool inPlace : {true, false}) {
          Case c{op, count, inPlace, ++tag, nullptr, nullptr, {}};
          c.out = std::make_unique<Buffer>(pg, a, count * es);
          Buffer& src = inPlace ? *c.out : *(c.in = std::make_unique<Buffer>(pg, a, count * es));
          for (size_t i = 0; i < count; ++i) store(t, src.host.data(), i, gen(a, t, op, pg.rank(), c.tag, i));
          src.upload();
          AllReduceOptions o;
          o.input = inPlace ? nullptr : c.in->p;
          o.output = c.out->p;
          o.count = count;
          o.dtype = t;
          o.op = op;
          o.device = a.device;
          c.work = allReduceAsync(pg, o);
          cases.push_back(std::move(c));
        }
    for (auto& c : cases) {
      c.work.wait();
      const auto& h = c.out->download();
      const std::string what = std::string("allReduce ") + dtypeName(t) + " " + reduceOpName(c.op) +
                               " x" + std::to_string(c.count) + (c.inPlace ? " in-place" : " out-of-place");
      for (size_t i = 0; i < c.count; ++i)
        checkReduced(a, t, c.op, pg.size(), c.tag, i, load(t, h.data(), i), what, i);
      ++checks;
    }
  }

  void broadcasts(DType t) {
    const size_t es = dtypeSize(t);
    for (size_t count : a.sizes) {
      const int root = static_cast<int>(++tag % pg.size());
      Buffer b(pg, a, count * es);
      for (size_t i = 0; i < count; ++i)
        store(t, b.host.data(), i, gen(a, t, ReduceOp::kSum, pg.rank(), tag, i));
      b.upload();
      BroadcastOptions o;
      o.buffer = b.p;
      o.count = count;
      o.dtype = t;
      o.root = root;
      o.device = a.device;
      broadcast(pg, o);
      const auto& h = b.download();
      for (size_t i = 0; i < count; ++i)
        if (load(t, h.data(), i) != gen(a, t, ReduceOp::kSum, root, tag, i))
          throw Failure{std::string("broadcast ") + dtypeName(t) + " from root " + std::to_string(root) +
                        ": element " + std::to_string(i) + " differs"};
      ++checks;
    }
  }

  void allGathers(DType t, bool unequal) {
    const size_t es = dtypeSize(t);
    const int n = pg.size();
    for (size_t count : a.sizes) {
      if (count > 100000 && n > 4) count = 100003;  // n pieces each: bound memory
      std::vector<size_t> counts(n, count);
      if (unequal)
        for (int r = 0; r < n; ++r) counts[r] = r % 3 == 1 ? 0 : count + 3 * r;
      size_t total = 0, before = 0;
      for (int r = 0; r < n; ++r) {
        if (r < pg.rank()) before += counts[r];
        total += counts[r];
      }
      ++tag;
      const bool inPlace = tag % 2 == 0;
      Buffer out(pg, a, total * es);
      std::unique_ptr<Buffer> in;
      const size_t mine = counts[pg.rank()];
      if (inPlace) {
        for (size_t i = 0; i < mine; ++i)
          store(t, out.host.data() + before * es, i, gen(a, t, ReduceOp::kSum, pg.rank(), tag, i));
        out.upload();
      } else {
        in = std::make_unique<Buffer>(pg, a, mine * es);
        for (size_t i = 0; i < mine; ++i) store(t, in->host.data(), i, gen(a, t, ReduceOp::kSum, pg.rank(), tag, i));
        in->upload();
      }
      AllGatherOptions o;
      o.input = inPlace ? nullptr : in->p;
      o.output = out.p;
      o.count = count;
      if (unequal) o.counts = counts;
      o.dtype = t;
      o.device = a.device;
      allGather(pg, o);
      const auto& h = out.download();
      size_t off = 0;
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < counts[r]; ++i)
          if (load(t, h.data(), off + i) != gen(a, t, ReduceOp::kSum, r, tag, i))
            throw Failure{std::string("allGather ") + dtypeName(t) + (unequal ? " unequal" : "") +
                          ": piece of rank " + std::to_string(r) + " element " + std::to_string(i) + " differs"};
        off += counts[r];
      }
      ++checks;
    }
  }

  void reduceScatters(DType t) {
    const size_t es = dtypeSize(t);
    const int n = pg.size();
    for (ReduceOp op : a.ops)
      for (size_t count : a.sizes) {
        if (count > 100000) count = 100003;  // input is n * count
        ++tag;
        const bool inPlace = tag % 2 == 0;
        Buffer in(pg, a, n * count * es);
        for (size_t i = 0; i < n * count; ++i) store(t, in.host.data(), i, gen(a, t, op, pg.rank(), tag, i));
        in.upload();
        std::unique_ptr<Buffer> out;
        if (!inPlace) out = std::make_unique<Buffer>(pg, a, count * es);
        ReduceScatterOptions o;
        o.input = in.p;
        o.output = inPlace ? static_cast<char*>(in.p) + pg.rank() * count * es : out->p;
        o.count = count;
        o.dtype = t;
        o.op = op;
        o.device = a.device;
        reduceScatter(pg, o);
        const auto& h = inPlace ? in.download() : out->download();
        const char* res = h.data() + (inPlace ? pg.rank() * count * es : 0);
        const std::string what = std::string("reduceScatter ") + dtypeName(t) + " " + reduceOpName(op);
        for (size_t i = 0; i < count; ++i)
          checkReduced(a, t, op, n, tag, pg.rank() * count + i, load(t, res, i), what, i);
        ++checks;
      }
  }
};

#ifdef DDPRUN_WITH_CUDA
#define COLL_CUDA(call)                                                                     \
  do {                                                                                      \
    const cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess)                                                                  \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_));         \
  } while (0)

// The stream-ordered path (the Reducer's: internal::DeviceCollectives) with a
// producer still running when the collectives are issued. A non-blocking
// "compute" stream first writes a large scratch buffer (a delay), then
// uploads each bucket's input and records the bucket's ready event; every
// ordered all-reduce is issued at once (the host never waits for the
// uploads); then the compute stream waits for each done event and downloads.
// A collective reading its input before the upload landed (no device-side
// wait), or a download overtaking a collective, gives wrong values. The
// timing events must be ordered: ready <= start <= end. Three rounds reuse
// the events, as the Reducer does; then an ordered broadcast of three buffers.
struct Pinned {
  explicit Pinned(size_t n) { COLL_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&p), n * 4, cudaHostAllocDefault)); }
  ~Pinned() { cudaFreeHost(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  float* p = nullptr;
};

struct OrderedChecker {
  explicit OrderedChecker(ProcessGroup& g) : pg(g), dc(internal::makeDeviceCollectives(g)) {}
  ProcessGroup& pg;
  std::unique_ptr<internal::DeviceCollectives> dc;
  cudaStream_t s = nullptr;
  std::vector<void*> owned;
  std::vector<internal::DeviceEvent> events;

  ~OrderedChecker() {
    if (s) cudaStreamSynchronize(s);
    for (void* p : owned) cudaFree(p);
    for (auto e : events) dc->destroyEvent(e);
    if (s) cudaStreamDestroy(s);
  }
  void* deviceBuffer(size_t bytes) {
    void* p = nullptr;
    COLL_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    owned.push_back(p);
    return p;
  }
  internal::DeviceEvent event() {
    events.push_back(dc->createEvent(true));
    return events.back();
  }
  static float value(int rank, int round, size_t b, size_t i) {
    return static_cast<float>((rank + 1) * static_cast<int>((i + round + b) % 13 + 1));
  }
  void delay(void* scratch, size_t bytes) {
    for (int k = 0; k < 4; ++k) COLL_CUDA(cudaMemsetAsync(scratch, k, bytes, s));
  }

  int run() {
    COLL_CUDA(cudaSetDevice(cudaSelectedDevice()));
    COLL_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t scratchBytes = size_t{256} << 20;
    void* scratch = deviceBuffer(scratchBytes);
    // Up to the reducer's default bucket (25 MiB).
    const std::vector<size_t> counts = {7, 4097, size_t{1} << 18, (size_t{25} << 20) / 4};
    const size_t nb = counts.size();
    std::vector<float*> dev(nb), in(nb), out(nb);
    std::vector<std::unique_ptr<Pinned>> pinned;
    std::vector<internal::DeviceEvent> ready(nb), start(nb), done(nb);
    for (size_t b = 0; b < nb; ++b) {
      dev[b] = static_cast<float*>(deviceBuffer(counts[b] * 4));
      in[b] = pinned.emplace_back(std::make_unique<Pinned>(counts[b]))->p;
      out[b] = pinned.emplace_back(std::make_unique<Pinned>(counts[b]))->p;
      ready[b] = event();
      start[b] = event();
      done[b] = event();
    }
    int checks = 0;
    const int n = pg.size();
    {
      for (int round = 0; round < 3; ++round) {
        delay(scratch, scratchBytes);
        std::vector<Work> works;
        for (size_t b = 0; b < nb; ++b) {
          for (size_t i = 0; i < counts[b]; ++i) in[b][i] = value(pg.rank(), round, b, i);
          COLL_CUDA(cudaMemcpyAsync(dev[b], in[b], counts[b] * 4, cudaMemcpyHostToDevice, s));
          dc->record(ready[b], s);
          AllReduceOptions o;
          o.output = dev[b];
          o.count = counts[b];
          o.op = ReduceOp::kAvg;
          o.device = Device::kCuda;
          works.push_back(dc->allReduce(o, {ready[b], start[b], done[b]}));
        }
        for (auto& w : works) w.wait();  // issued
        for (size_t b = 0; b < nb; ++b) {
          dc->streamWait(s, done[b]);
          COLL_CUDA(cudaMemcpyAsync(out[b], dev[b], counts[b] * 4, cudaMemcpyDeviceToHost, s));
        }
        COLL_CUDA(cudaStreamSynchronize(s));
        for (size_t b = 0; b < nb; ++b) {
          for (size_t i = 0; i < counts[b]; ++i) {
            const double want = value(0, round, b, i) * (n + 1) / 2.0;
            if (!(std::fabs(out[b][i] - want) <= 1e-6 * want))
              throw Failure{"ordered allReduce avg x" + std::to_string(counts[b]) + " round " +
                            std::to_string(round) + ": element " + std::to_string(i) + " is " +
                            std::to_string(out[b][i]) + ", expected " + std::to_string(want)};
          }
          const double wait = dc->elapsedMs(ready[b], start[b]);
          const double run = dc->elapsedMs(start[b], done[b]);
          if (wait < -0.01 || run < -0.01)
            throw Failure{"ordered allReduce x" + std::to_string(counts[b]) +
                          ": timing events out of order (ready->start " + std::to_string(wait) +
                          " ms, start->end " + std::to_string(run) + " ms)"};
          ++checks;
        }
      }
      checks += broadcasts(scratch, scratchBytes);
    }
    return checks;
  }

  int broadcasts(void* scratch, size_t scratchBytes) {
    const std::vector<size_t> counts = {5, 4097, size_t{1} << 18};
    std::vector<std::unique_ptr<Pinned>> host;
    std::vector<std::pair<void*, size_t>> bufs;
    for (size_t k = 0; k < counts.size(); ++k) {
      float* h = host.emplace_back(std::make_unique<Pinned>(counts[k]))->p;
      for (size_t i = 0; i < counts[k]; ++i) h[i] = value(pg.rank(), 7, k, i);
      bufs.emplace_back(deviceBuffer(counts[k] * 4), counts[k] * 4);
    }
    const auto ready = event(), done = event();
    delay(scratch, scratchBytes);
    for (size_t k = 0; k < counts.size(); ++k)
      COLL_CUDA(cudaMemcpyAsync(bufs[k].first, host[k]->p, bufs[k].second,
                                cudaMemcpyHostToDevice, s));
    dc->record(ready, s);
    dc->broadcast(bufs, 0, {ready, nullptr, done}).wait();
    dc->streamWait(s, done);
    for (size_t k = 0; k < counts.size(); ++k)
      COLL_CUDA(cudaMemcpyAsync(host[k]->p, bufs[k].first, bufs[k].second,
                                cudaMemcpyDeviceToHost, s));
    COLL_CUDA(cudaStreamSynchronize(s));
    for (size_t k = 0; k < counts.size(); ++k)
      for (size_t i = 0; i < counts[k]; ++i)
        if (host[k]->p[i] != value(0, 7, k, i))
          throw Failure{"ordered broadcast buffer " + std::to_string(k) + ": element " +
                        std::to_string(i) + " differs from rank 0's"};
    return 1;
  }
};

int orderedChecks(ProcessGroup& pg) { return OrderedChecker(pg).run(); }
#else
int orderedChecks(ProcessGroup&) { return 0; }
#endif

int loop(ProcessGroup& pg, const Args& a) {
  std::vector<float> buf(a.loopCount, 1.0f);
  for (long it = 0;; ++it) {
    AllReduceOptions o;
    o.output = buf.data();
    o.count = buf.size();
    allReduce(pg, o);
    std::cout << "iter " << it << std::endl;
  }
}

template <typename T, typename F>
std::vector<T> parseList(const std::string& s, F f) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(f(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--sizes") a.sizes = parseList<size_t>(value(), [](const std::string& x) { return std::stoull(x); });
      else if (arg == "--dtypes") a.dtypes = parseList<DType>(value(), [](const std::string& x) {
        auto t = parseDType(x);
        if (!t) throw std::invalid_argument("unknown dtype " + x);
        return *t;
      });
      else if (arg == "--ops") a.ops = parseList<ReduceOp>(value(), [](const std::string& x) {
        auto o = parseReduceOp(x);
        if (!o) throw std::invalid_argument("unknown op " + x);
        return *o;
      });
      else if (arg == "--device") {
        const std::string d = value();
        if (d != "cpu" && d != "cuda") throw std::invalid_argument("--device is cpu or cuda");
        a.device = d == "cuda" ? Device::kCuda : Device::kCpu;
      } else if (arg == "--seed") a.seed = std::stoull(value());
      else if (arg == "--shared") a.shared = true;
      else if (arg == "--loop") a.loop = true;
      else if (arg == "--nccl-version") a.ncclVersion = true;
      else throw std::invalid_argument("unknown flag " + arg);
    }
  } catch (const std::exception& e) {
    std::cerr << "coll_check: " << e.what() << "\n";
    return 2;
  }
  if (a.ncclVersion) {
    const int v = ncclRuntimeVersion();
    std::cout << "nccl_runtime_version " << v << " " << ncclVersionString(v) << " gpus "
              << cudaDeviceCount() << std::endl;
    return 0;
  }
  if (a.device == Device::kCuda && cudaDeviceCount() == 0) {
    std::cout << "SKIPPED: no CUDA GPU on this machine (" << (cudaBuilt() ? "built with" : "built without")
              << " CUDA): CUDA collectives not checked" << std::endl;
    return 77;  // skipped, as ctest's SKIP_RETURN_CODE reads it
  }
  try {
    auto pg = ProcessGroup::fromEnv();
    if (a.loop) return loop(*pg, a);
    Checker c{*pg, a};
    for (DType t : a.dtypes) {
      c.allReduces(t);
      c.broadcasts(t);
      c.allGathers(t, false);
      c.allGathers(t, true);
      c.reduceScatters(t);
    }
    if (a.device == Device::kCuda) c.checks += orderedChecks(*pg);
    barrier(*pg);
    std::string cudaName = a.device == Device::kCuda ? " cuda transport " + cudaTransportName(*pg) : "";
    std::cout << "coll_check rank " << pg->rank() << "/" << pg->size() << ": " << c.checks
              << " checks passed (" << pg->describe() << cudaName << ")" << std::endl;
    return 0;
  } catch (const Failure& f) {
    std::cerr << "coll_check rank " << std::getenv("RANK") << ": MISMATCH: " << f.msg << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "coll_check rank " << (std::getenv("RANK") ? std::getenv("RANK") : "0")
              << ": error: " << e.what() << std::endl;
    return 3;
  }
}
