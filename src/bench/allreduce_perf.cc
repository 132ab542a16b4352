// allreduce_perf: all-reduce bandwidth and latency of ddprun_runtime, in the
// manner of nccl-tests' all_reduce_perf. Run one per rank:
//
//   ddprun --nproc_per_node=N --no_python allreduce_perf -b 8 -e 256M -f 2
//
//   -b/-e MIN/MAX bytes (K, M, G suffixes), -f FACTOR, or --sizes LIST
//   (comma-separated sizes, e.g. 1M,25M: the reducer's bucket sizes), -t dtype, -o op,
//   -n iters (batches of n repeated to fill --min-time-ms, default 50), -w warmup,
//   -c 0|1 (check results), -d cpu|cuda,
//   --shared 0|1 (cpu: buffers from allocShared, the in-place fast path;
//   default 1), --json (one JSON object per size on stdout, rank 0 only),
//   --membw (measure this machine's memcpy bandwidth instead, one JSON line).
//
// time_us is the mean per all-reduce over -n back-to-back operations, the
// slowest rank's; algbw = bytes / time; busbw = algbw * 2(n-1)/n.
//
// On CUDA buffers the transport follows DDPRUN_CUDA_TRANSPORT (nccl, ipc,
// staged; auto by default), so NCCL and IPC compare on ranks sharing one GPU:
//   DDPRUN_CUDA_TRANSPORT=nccl ddprun --nproc_per_node=2 --no_python
//       allreduce_perf -d cuda --sizes 1M,25M --json
// (two ranks on one GPU through NCCL need NCCL >= 2.30: see runtime/cuda.h).
// The header (and each JSON line) names the CUDA transport and the NCCL
// library version loaded.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/common/main_guard.h"
#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/runtime/process_group.h"

using namespace ddprun::runtime;
using Clock = std::chrono::steady_clock;

namespace {

size_t parseBytes(const std::string& s) {
  size_t pos = 0;
  const double v = std::stod(s, &pos);
  const std::string suf = s.substr(pos);
  double mult = 1;
  if (suf == "K" || suf == "k" || suf == "KiB") mult = 1024;
  else if (suf == "M" || suf == "m" || suf == "MiB") mult = 1024.0 * 1024;
  else if (suf == "G" || suf == "g" || suf == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!suf.empty()) throw CLI::ValidationError("size", "bad size suffix in '" + s + "'");
  return static_cast<size_t>(v * mult);
}

// "1M,25M" -> {1048576, 26214400}.
std::vector<size_t> parseSizes(const std::string& list) {
  std::vector<size_t> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    if (item.empty()) throw CLI::ValidationError("--sizes", "empty size in '" + list + "'");
    out.push_back(parseBytes(item));
    at = comma + 1;
  }
  return out;
}

std::string ncclVersionName(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// memcpy bandwidth (bytes copied per second) with `threads` threads, each
// copying its own 256 MiB / threads region; best of 5.
double copyBandwidth(int threads) {
  const size_t total = size_t{256} << 20, per = total / threads;
  std::vector<char> src(total, 1), dst(total, 0);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] { std::memcpy(dst.data() + t * per, src.data() + t * per, per); });
    for (auto& t : ts) t.join();
    best = std::min(best, now() - t0);
  }
  return static_cast<double>(total) / best;
}

// Cold start: a fresh group's first operations (first use of its channels
// and threads, first page touches, idle cores still clocked down) are far
// slower than later ones; the first size read a p50 of 270 us where warm it
// reads 1.4 us. So before anything is timed: rounds of untimed operations of
// the first size, blocking and back to back as the timed loop issues them,
// until kWarmUpSeconds passed on the slowest rank. The ranks agree on that
// time (max all-reduce), so all run the same number of rounds.
void warmUp(ProcessGroup& pg, const AllReduceOptions& o, int warmup) {
  constexpr double kWarmUpSeconds = 0.2;
  const size_t bytes = o.count * dtypeSize(o.dtype);
  const size_t perRound = std::min<size_t>(200, (size_t{64} << 20) / bytes);  // few if large
  const int ops = std::max({1, warmup, static_cast<int>(perRound)});
  const double t0 = now();
  double elapsed[1] = {0};
  do {
    for (int i = 0; i < ops; ++i) allReduce(pg, o);
    Work last;
    for (int i = 0; i < ops; ++i) last = allReduceAsync(pg, o);
    last.wait();
    elapsed[0] = now() - t0;
    AllReduceOptions agree;
    agree.output = elapsed;
    agree.count = 1;
    agree.dtype = DType::kFloat64;
    agree.op = ReduceOp::kMax;
    allReduce(pg, agree);
  } while (elapsed[0] < kWarmUpSeconds);
  barrier(pg);
}

}  // namespace

int main(int argc, char** argv) {
  ddprun::ignoreSigpipe();  // as every ddprun program (main_guard.h): EPIPE, not death
  CLI::App app{"all-reduce bandwidth and latency of ddprun_runtime"};
  std::string minS = "8", maxS = "64M", dtypeS = "float32", opS = "sum", devS = "cpu", sizesS;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, shared = 1;
  double minTimeMs = 50;
  bool json = false, membw = false;
  app.add_option("-b,--minbytes", minS, "smallest size in bytes (K/M/G suffixes)");
  app.add_option("-e,--maxbytes", maxS, "largest size in bytes");
  app.add_option("--sizes", sizesS, "comma-separated sizes in bytes (K/M/G suffixes), instead of -b/-e/-f");
  app.add_option("-f,--stepfactor", factor, "multiply the size by this between steps")->check(CLI::Range(1.01, 1e6));
  app.add_option("-t,--datatype", dtypeS, "float32|float64|float16|bfloat16|int32|int64|uint8");
  app.add_option("-o,--op", opS, "sum|avg|min|max|prod");
  app.add_option("-n,--iters", iters, "timed iterations per size")->check(CLI::Range(1, 1000000));
  app.add_option("--min-time-ms", minTimeMs, "repeat the -n batch until this much time passed")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations per size")->check(CLI::Range(0, 1000000));
  app.add_option("-c,--check", check, "verify results (0|1)");
  app.add_option("-d,--device", devS, "cpu|cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--shared", shared, "cpu buffers from the shared heap (0|1)");
  app.add_flag("--json", json, "one JSON object per size");
  app.add_flag("--membw", membw, "print this machine's memcpy bandwidth and exit");
  CLI11_PARSE(app, argc, argv);

  if (membw && devS == "cuda") {  // device-to-device copy: the HBM floor
    const size_t bytes = size_t{1} << 30;
    void* a = cudaAllocDevice(bytes);
    void* b = cudaAllocDevice(bytes);
    cudaCopyOnDevice(b, a, bytes);
    double best = 1e30;
    for (int i = 0; i < 10; ++i) {
      const double t0 = cudaNowSeconds();
      cudaCopyOnDevice(b, a, bytes);
      best = std::min(best, cudaNowSeconds() - t0);
    }
    std::printf("{\"d2d_copy_gbps\": %.1f, \"hbm_traffic_gbps\": %.1f}\n", bytes / best / 1e9,
                2 * bytes / best / 1e9);
    cudaFreeDevice(a);
    cudaFreeDevice(b);
    return 0;
  }
  if (membw) {
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    std::printf("{\"copy_1thread_gbps\": %.3f, \"copy_allthreads_gbps\": %.3f, \"threads\": %u}\n",
                copyBandwidth(1) / 1e9, copyBandwidth(static_cast<int>(hw)) / 1e9, hw);
    return 0;
  }
  const auto dtype = parseDType(dtypeS);
  const auto op = parseReduceOp(opS);
  if (!dtype || !op) {
    std::cerr << "allreduce_perf: unknown " << (dtype ? "op '" + opS + "'" : "dtype '" + dtypeS + "'") << "\n";
    return 2;
  }
  const Device dev = devS == "cuda" ? Device::kCuda : Device::kCpu;
  std::vector<size_t> sizeList;  // bytes, in order
  try {
    if (!sizesS.empty()) {
      sizeList = parseSizes(sizesS);
    } else {
      const size_t minBytes = parseBytes(minS), maxBytes = parseBytes(maxS);
      const double first = static_cast<double>(std::max(minBytes, dtypeSize(*dtype)));
      for (double sz = first; sz <= static_cast<double>(maxBytes) * 1.0001;
           sz *= factor)
        sizeList.push_back(static_cast<size_t>(sz));
    }
  } catch (const std::exception& e) {
    std::cerr << "allreduce_perf: " << e.what() << "\n";
    return 2;
  }
  if (dev == Device::kCuda && cudaDeviceCount() == 0) {
    std::cerr << "allreduce_perf: -d cuda but no CUDA GPU is visible here\n";
    return 2;
  }
  try {
    auto pg = ProcessGroup::fromEnv();
    const int n = pg->size();
    const size_t es = dtypeSize(*dtype);
    const bool useShared = dev == Device::kCpu && shared;
    for (size_t& b : sizeList) b = std::max(b, es);
    const size_t maxBytes = sizeList.empty() ? es : *std::max_element(sizeList.begin(), sizeList.end());
    const size_t maxCount = std::max<size_t>(1, maxBytes / es);
    void* buf = dev == Device::kCuda ? cudaAllocDevice(maxCount * es)
                                     : (useShared ? pg->allocShared(maxCount * es) : std::malloc(maxCount * es));
    std::vector<char> host(maxCount * es);
    if (dev == Device::kCpu) std::memset(buf, 0, maxCount * es);
    const bool root = pg->rank() == 0;
    auto optionsFor = [&](size_t sz) {
      AllReduceOptions o;
      o.output = buf;
      o.count = std::max<size_t>(1, sz / es);
      o.dtype = *dtype;
      o.op = *op;
      o.device = dev;
      return o;
    };
    if (!sizeList.empty()) {
      if (dev == Device::kCuda) cudaCopyToDevice(buf, host.data(), maxCount * es);  // touch it
      warmUp(*pg, optionsFor(sizeList.front()), warmup);
    }
    // The CUDA transport exists once the warm-up ran a CUDA collective.
    const std::string cudaTransport = dev == Device::kCuda ? cudaTransportName(*pg) : "none";
    const std::string nccl = ncclVersionName(ncclRuntimeVersion());
    if (root && !json)
      std::printf("# ddprun allreduce_perf: %d ranks, %s, %s %s, device %s%s%s\n"
                  "# %12s %12s %10s %12s %12s %12s %8s\n",
                  n, pg->describe().c_str(), dtypeName(*dtype), reduceOpName(*op), deviceName(dev),
                  useShared ? ", shared-heap buffers" : "",
                  dev == Device::kCuda ? (", cuda transport " + cudaTransport + ", NCCL " + nccl).c_str()
                                       : "",
                  "bytes", "count", "time_us", "algbw_GB/s", "busbw_GB/s", "lat_p50_us", "wrong");
    for (const size_t sz : sizeList) {
      const AllReduceOptions o = optionsFor(sz);
      const size_t count = o.count;
      const size_t bytes = count * es;
      for (int i = 0; i < warmup; ++i) allReduce(*pg, o);
      barrier(*pg);
      // Throughput: batches of n operations back to back, as many as fill
      // minTimeMs (a batch of 20 tiny operations would mostly measure the
      // wake-up of the group's idle thread); latency: each op alone. A first,
      // untimed batch sizes the run; ranks agree on the slowest estimate so
      // they all run the same number of batches and nothing else is timed.
      auto batch = [&] {
        Work last;
        for (int i = 0; i < iters; ++i) last = allReduceAsync(*pg, o);
        last.wait();
      };
      double probe[1] = {now()};
      batch();
      probe[0] = now() - probe[0];
      AllReduceOptions agree;
      agree.output = probe;
      agree.count = 1;
      agree.dtype = DType::kFloat64;
      agree.op = ReduceOp::kMax;
      allReduce(*pg, agree);
      const long batches = std::max(1L, static_cast<long>(std::ceil(minTimeMs / 1e3 / probe[0])));
      barrier(*pg);
      const double t0 = now();
      for (long b = 0; b < batches; ++b) batch();
      double t = (now() - t0) / (batches * iters);
      std::vector<double> lat;
      for (int i = 0; i < std::min(iters, 50); ++i) {
        const double s = now();
        allReduce(*pg, o);
        lat.push_back(now() - s);
      }
      std::sort(lat.begin(), lat.end());
      double stats[2] = {t, lat[lat.size() / 2]};
      AllReduceOptions mx;
      mx.output = stats;
      mx.count = 2;
      mx.dtype = DType::kFloat64;
      mx.op = ReduceOp::kMax;
      allReduce(*pg, mx);  // the slowest rank's figures
      t = stats[0];
      long wrong = 0;
      if (check && *dtype == DType::kFloat32 && *op == ReduceOp::kSum) {
        std::vector<float> v(count, static_cast<float>(pg->rank() + 1));
        if (dev == Device::kCuda) cudaCopyToDevice(buf, v.data(), bytes);
        else std::memcpy(buf, v.data(), bytes);
        allReduce(*pg, o);
        if (dev == Device::kCuda) cudaCopyToHost(v.data(), buf, bytes);
        else std::memcpy(v.data(), buf, bytes);
        const float want = static_cast<float>(n) * (n + 1) / 2;
        for (float x : v) wrong += x != want;
      }
      const double algbw = bytes / t / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
      if (root) {
        if (json)
          std::printf("{\"bytes\": %zu, \"count\": %zu, \"dtype\": \"%s\", \"op\": \"%s\", \"ranks\": %d, "
                      "\"device\": \"%s\", \"transport\": \"%s\", \"cuda_transport\": \"%s\", "
                      "\"nccl_version\": \"%s\", \"shared\": %s, \"time_us\": %.3f, "
                      "\"lat_p50_us\": %.3f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, \"wrong\": %ld}\n",
                      bytes, count, dtypeName(*dtype), reduceOpName(*op), n, deviceName(dev),
                      transportName(pg->transport()), cudaTransport.c_str(), nccl.c_str(),
                      useShared ? "true" : "false", t * 1e6, stats[1] * 1e6, algbw, busbw, wrong);
        else
          std::printf("  %12zu %12zu %10.2f %12.3f %12.3f %12.2f %8ld\n", bytes, count, t * 1e6, algbw,
                      busbw, stats[1] * 1e6, wrong);
        std::fflush(stdout);
      }
      if (wrong) return 1;
    }
    barrier(*pg);
    if (dev == Device::kCuda) cudaFreeDevice(buf);
    else if (useShared) pg->freeShared(buf);
    else std::free(buf);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "allreduce_perf: " << e.what() << "\n";
    return 1;
  }
}
