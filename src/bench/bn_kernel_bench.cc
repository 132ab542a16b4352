// bn_kernel_bench: the CUDA trainer's NHWC batch norm kernels
// (src/train/cuda/bn_nhwc.h) on ResNet-18's batch norm layers, each kernel
// timed alone and set against a device-to-device copy of the same tensor
// (cudaMemcpyAsync: the hardware's streaming rate at that size), so that a GPU
// session shows which kernel is off the memory limit and by how much, in
// seconds of device time (docs/benchmarks.md):
//
//   bn_kernel_bench [--batch 128] [--image 224] [--dtypes bfloat16,float32]
//                   [--reps 20] [--out FILE]
//
// Per dtype, per layer configuration (bn_bench_plan.h: 5 sizes x bn+ReLU,
// bn+add+ReLU, plain bn) and per kernel (stats, forward, backward sums,
// backward data, as a training step runs them, with the ReLU mask and the
// residual's gradient as the trainer passes them): the mean time of --reps
// back-to-back launches (CUDA events), the bytes the kernel must move
// (bn_bench_plan.h), GB/s, the copy's GB/s at that size and their ratio. The
// step total weights each configuration by its layers a step (ResNet-18: 20
// batch norms), comparable to the bench's kernel trace. Consecutive launches
// rotate over copies of the tensors that together exceed twice the L2 cache,
// so that no launch reads what the one before left in L2.
//
// Then each direction as a training step runs it, unfolded and folded
// (bn_nhwc.h's BnFold: issue 44 item 3), back to back like the layers of a
// step: forward = the statistics (partials, chunk reduction, finish) and the
// element-wise pass, 4 launches unfolded and 2 folded; backward = the sums,
// the parameter gradients and the backward data, 4 and 2; and, on a device
// of compute capability 9.0+, folded under programmatic dependent launch
// (launch_stream.h: folded_pdl). Each against the copy's time for the same
// bytes ("directions" in the JSON, and the step's forward/backward totals
// per launch shape).
//
// Prints a table; --out also writes the results as JSON (rewritten after each
// dtype). Exit status: 0 measured, 2 bad flags (CLI11's message), 3 a CUDA
// error, 77 no CUDA device (nothing measured: the skip code of our tests).
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bn_bench_plan.h"
#include "cuda/bn_nhwc.h"
#include "cuda/conv_reference.h"
#include "cuda/resources.h"
#include "ddprun/common/main_guard.h"
#include "ddprun/runtime/cuda_check.h"
#include "ddprun/runtime/types.h"

namespace {

using ddprun::bench::BnKernel;
using ddprun::bench::BnLayerGroup;
using ddprun::runtime::DType;
namespace tc = ddprun::train::cuda;

using ddprun::runtime::cuda::DeviceMemory;

template <class T>
T* as(const DeviceMemory& m) {
  return static_cast<T*>(m.get());
}

// One configuration's tensors, `sets` copies of each activation-sized one.
struct LayerBuffers {
  size_t bytes;  // one activation tensor
  int sets;
  DeviceMemory x, z, y, dy, g, dx, ws;
  DeviceMemory mean, invstd, gamma, beta, sums, dgamma, dbeta, counters;
  LayerBuffers(const BnLayerGroup& l, size_t elementBytes, int sets_)
      : bytes(static_cast<size_t>(l.elements()) * elementBytes),
        sets(sets_),
        x(DeviceMemory::alloc(bytes * sets)),
        z(DeviceMemory::alloc(bytes * sets)),
        y(DeviceMemory::alloc(bytes * sets)),
        dy(DeviceMemory::alloc(bytes * sets)),
        g(DeviceMemory::alloc(bytes * sets)),
        dx(DeviceMemory::alloc(bytes * sets)),
        ws(DeviceMemory::alloc(tc::bnNhwcWorkspaceBytes(l.rows(), l.c))),
        mean(DeviceMemory::alloc(l.c * 4)),
        invstd(DeviceMemory::alloc(l.c * 4)),
        gamma(DeviceMemory::alloc(l.c * 4)),
        beta(DeviceMemory::alloc(l.c * 4)),
        sums(DeviceMemory::alloc((2 * l.c + 1) * 8)),
        dgamma(DeviceMemory::alloc(l.c * 4)),
        dbeta(DeviceMemory::alloc(l.c * 4)),
        counters(DeviceMemory::alloc(tc::bnNhwcFoldCounters(l.c) * sizeof(unsigned))) {}
  void* at(const DeviceMemory& b, int set) const { return as<char>(b) + bytes * set; }
};

void fill(void* p, size_t n, DType t, uint64_t seed, cudaStream_t s) {
  if (t == DType::kFloat32)
    tc::launchFillUniform(static_cast<float*>(p), n, seed, s);
  else
    tc::launchFillUniform16(p, n, seed, t == DType::kBFloat16, s);
}

// Launches kernel k of layer l on tensor set `set`.
void launch(BnKernel k, const BnLayerGroup& l, const LayerBuffers& b, DType t, int set,
            tc::LaunchStream s) {
  const bool relu = ddprun::bench::bnKindRelu(l.kind);
  const bool residual = ddprun::bench::bnKindResidual(l.kind);
  void* x = b.at(b.x, set);
  void* y = b.at(b.y, set);
  void* dy = b.at(b.dy, set);
  void* g = b.at(b.g, set);
  switch (k) {
    case BnKernel::kStats:
      tc::launchBnNhwcStats(x, t, l.rows(), l.c, b.ws.get(), as<double>(b.sums), s);
      break;
    case BnKernel::kForward:
      tc::launchBnNhwcForward(x, residual ? b.at(b.z, set) : nullptr, y, t, l.rows(), l.c,
                              as<float>(b.mean), as<float>(b.invstd), as<float>(b.gamma),
                              as<float>(b.beta), relu, s);
      break;
    case BnKernel::kBackwardSums:
      tc::launchBnNhwcBackwardSums(x, relu ? y : nullptr, dy, residual ? g : nullptr, t,
                                   l.rows(), l.c, as<float>(b.mean), as<float>(b.invstd),
                                   relu, b.ws.get(), as<double>(b.sums), s);
      break;
    case BnKernel::kBackwardData:
      if (residual)
        tc::launchBnNhwcBackwardData(x, nullptr, nullptr, g, b.at(b.dx, set), t, l.rows(),
                                     l.c, as<double>(b.sums), as<float>(b.gamma),
                                     as<float>(b.mean), as<float>(b.invstd), relu, s);
      else
        tc::launchBnNhwcBackwardData(x, relu ? y : nullptr, dy, nullptr, b.at(b.dx, set),
                                     t, l.rows(), l.c, as<double>(b.sums),
                                     as<float>(b.gamma), as<float>(b.mean),
                                     as<float>(b.invstd), relu, s);
      break;
  }
}

// One direction of layer l as a step runs it, on tensor set `set`: forward
// (statistics with their finish, then the element-wise pass) or backward
// (sums with the parameter gradients, then the data), folded into the sums'
// launch or not.
void runDirection(bool forward, bool folded, const BnLayerGroup& l, const LayerBuffers& b,
                  DType t, int set, tc::LaunchStream s) {
  tc::BnFold f;
  if (folded) f.counters = as<unsigned>(b.counters);
  if (forward) {
    f.finish = {1e-5, 0.1, as<float>(b.mean), as<float>(b.invstd), nullptr, nullptr};
    tc::launchBnNhwcStats(b.at(b.x, set), t, l.rows(), l.c, b.ws.get(), as<double>(b.sums), s,
                          &f);
    launch(BnKernel::kForward, l, b, t, set, s);
    return;
  }
  const bool relu = ddprun::bench::bnKindRelu(l.kind);
  const bool residual = ddprun::bench::bnKindResidual(l.kind);
  f.grads = {as<float>(b.dgamma), as<float>(b.dbeta), true, true};
  tc::launchBnNhwcBackwardSums(b.at(b.x, set), relu ? b.at(b.y, set) : nullptr, b.at(b.dy, set),
                               residual ? b.at(b.g, set) : nullptr, t, l.rows(), l.c,
                               as<float>(b.mean), as<float>(b.invstd), relu, b.ws.get(),
                               as<double>(b.sums), s, &f);
  launch(BnKernel::kBackwardData, l, b, t, set, s);
}

// Mean milliseconds of `reps` launches of f(set) rotating over the sets,
// after two untimed rounds.
template <class F>
double timeMs(int reps, int sets, cudaStream_t s, F&& f) {
  for (int i = 0; i < 2 * sets; ++i) f(i % sets);
  const tc::Event a = tc::Event::createTiming(), b = tc::Event::createTiming();
  a.record(s);
  for (int i = 0; i < reps; ++i) f(i % sets);
  b.record(s);
  b.synchronize();
  float ms = 0;
  DDPRUN_CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  return static_cast<double>(ms) / reps;
}

// Both directions of layer l, unfolded, folded and (where the device has
// programmatic dependent launch, `pdl`) folded under PDL: a "directions" row
// each and the step's totals (forward_unfolded_ms, ..., weighted by the
// layers).
void timeDirections(const BnLayerGroup& l, const LayerBuffers& b, DType t,
                    const std::string& dtype, int sets, int reps, int eb, double copyGbps,
                    cudaStream_t s, bool pdl, nlohmann::json& doc, nlohmann::json& step) {
  using ddprun::bench::bnKernelBytes;
  for (const bool forward : {true, false}) {
    const double moved =
        forward ? bnKernelBytes(BnKernel::kStats, l, eb) + bnKernelBytes(BnKernel::kForward, l, eb)
                : bnKernelBytes(BnKernel::kBackwardSums, l, eb) +
                      bnKernelBytes(BnKernel::kBackwardData, l, eb);
    const double copyMs = moved / (copyGbps * 1e6);
    nlohmann::json row = {{"dtype", dtype},
                          {"where", l.where},
                          {"kind", ddprun::bench::bnKindName(l.kind)},
                          {"c", l.c},
                          {"layers", l.count},
                          {"direction", forward ? "forward" : "backward"},
                          {"bytes", moved},
                          {"at_copy_rate_ms", copyMs}};
    struct Variant {
      const char* name;
      bool folded, pdl;
    };
    for (const Variant v : {Variant{"unfolded", false, false}, Variant{"folded", true, false},
                            Variant{"folded_pdl", true, true}}) {
      if (v.pdl && !pdl) continue;
      const double ms = timeMs(reps, sets, s, [&](int set) {
        runDirection(forward, v.folded, l, b, t, set, tc::LaunchStream(s, v.pdl));
      });
      const std::string key = std::string(forward ? "forward_" : "backward_") + v.name + "_ms";
      row[std::string(v.name) + "_ms"] = ms;
      step[key] = step.value(key, 0.0) + ms * l.count;
    }
    const double un = row["unfolded_ms"], fo = row["folded_ms"];
    std::printf("%-9s %-7s %-11s c=%-4lld x%d %-8s unfolded %8.4f ms folded %8.4f ms (%.2fx) "
                "copy-rate %8.4f ms\n",
                dtype.c_str(), l.where.c_str(), ddprun::bench::bnKindName(l.kind),
                static_cast<long long>(l.c), l.count, forward ? "forward" : "backward", un, fo,
                un / fo, copyMs);
    doc["directions"].push_back(row);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ddprun::ignoreSigpipe();  // as every ddprun program (main_guard.h): EPIPE, not death
  CLI::App app{
      "the CUDA trainer's NHWC batch norm kernels on ResNet-18's layers, against a copy"};
  int64_t batch = 128, image = 224;
  int reps = 20;
  std::vector<std::string> dtypeNames{"bfloat16", "float32"};
  std::string out;
  app.add_option("--batch", batch, "batch size")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--image", image, "square image side (ResNet-18 needs >= 32)")
      ->check(CLI::Range(int64_t{32}, int64_t{1024}));
  app.add_option("--dtypes", dtypeNames, "activation storage: bfloat16, float16, float32")
      ->delimiter(',')
      ->check(CLI::IsMember({"bfloat16", "float16", "float32"}));
  app.add_option("--reps", reps, "timed launches per kernel")
      ->check(CLI::Range(1, 10000));
  app.add_option("--out", out, "also write the results as JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bn_kernel_bench: no CUDA device: nothing to measure\n");
    return 77;
  }
  try {
    cudaDeviceProp prop{};
    DDPRUN_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    const tc::Stream s = tc::Stream::create();
    nlohmann::json doc = {{"device", prop.name},
                          {"l2_bytes", prop.l2CacheSize},
                          {"batch", batch},
                          {"image", image},
                          {"reps", reps},
                          {"rows", nlohmann::json::array()},
                          {"directions", nlohmann::json::array()},
                          {"step", nlohmann::json::object()}};
    const auto layers = ddprun::bench::resnet18BnLayers(batch, image);
    const size_t l2 = static_cast<size_t>(std::max(prop.l2CacheSize, 1 << 20));
    std::printf(
        "%s, batch %lld, image %lld: ms per launch, GB/s, and against a copy of the "
        "same tensor\n",
        prop.name, static_cast<long long>(batch), static_cast<long long>(image));
    for (const std::string& name : dtypeNames) {
      const DType t = *ddprun::runtime::parseDType(name);
      const size_t eb = ddprun::runtime::dtypeSize(t);
      nlohmann::json step = nlohmann::json::object();
      double stepMs = 0, stepCopyMs = 0;
      for (const BnLayerGroup& l : layers) {
        const size_t bytes = static_cast<size_t>(l.elements()) * eb;
        // Rotate over copies that exceed twice the L2 (6 tensors a set).
        const int sets =
            static_cast<int>(std::min<size_t>(16, (2 * l2) / (6 * bytes) + 1));
        LayerBuffers b(l, eb, sets);
        for (int k = 0; k < sets; ++k) {
          fill(b.at(b.x, k), l.elements(), t, 11 + k, s);
          fill(b.at(b.z, k), l.elements(), t, 101 + k, s);
          fill(b.at(b.dy, k), l.elements(), t, 211 + k, s);
        }
        tc::launchFillUniform(as<float>(b.gamma), l.c, 5, s);
        tc::launchFillUniform(as<float>(b.beta), l.c, 6, s);
        DDPRUN_CUDA_OK(cudaMemsetAsync(b.counters.get(), 0,
                                       tc::bnNhwcFoldCounters(l.c) * sizeof(unsigned), s));
        // Real statistics and outputs (the ReLU's mask) before timing.
        launch(BnKernel::kStats, l, b, t, 0, s.get());
        tc::launchBnNhwcFinish(as<double>(b.sums), l.c, 1e-5, 0.1, as<float>(b.mean),
                               as<float>(b.invstd), nullptr, nullptr, s.get());
        for (int k = 0; k < sets; ++k) launch(BnKernel::kForward, l, b, t, k, s.get());
        for (int k = 0; k < sets; ++k) launch(BnKernel::kBackwardSums, l, b, t, k, s.get());
        s.synchronize();
        const double copyMs = timeMs(reps, sets, s, [&](int k) {
          DDPRUN_CUDA_OK(cudaMemcpyAsync(b.at(b.dx, k), b.at(b.x, k), bytes,
                                         cudaMemcpyDeviceToDevice, s));
        });
        const double copyGbps = 2.0 * static_cast<double>(bytes) / (copyMs * 1e6);
        for (BnKernel k : ddprun::bench::kBnKernels) {
          const double ms =
              timeMs(reps, sets, s, [&](int set) { launch(k, l, b, t, set, s.get()); });
          const double moved = ddprun::bench::bnKernelBytes(k, l, static_cast<int>(eb));
          const double gbps = moved / (ms * 1e6);
          const char* kname = ddprun::bench::bnKernelName(k);
          std::printf(
              "%-9s %-7s %-11s %4lldx%-3lld c=%-4lld x%d %-14s %8.4f ms %7.0f GB/s "
              "copy %7.0f GB/s %5.2f\n",
              name.c_str(), l.where.c_str(), ddprun::bench::bnKindName(l.kind),
              static_cast<long long>(l.h), static_cast<long long>(l.w),
              static_cast<long long>(l.c), l.count, kname, ms, gbps, copyGbps,
              gbps / copyGbps);
          doc["rows"].push_back({{"dtype", name},
                                 {"where", l.where},
                                 {"kind", ddprun::bench::bnKindName(l.kind)},
                                 {"n", l.n},
                                 {"h", l.h},
                                 {"w", l.w},
                                 {"c", l.c},
                                 {"layers", l.count},
                                 {"kernel", kname},
                                 {"ms", ms},
                                 {"bytes", moved},
                                 {"gbps", gbps},
                                 {"copy_ms", copyMs},
                                 {"copy_gbps", copyGbps},
                                 {"vs_copy", gbps / copyGbps}});
          step[kname] = step.value(kname, 0.0) + ms * l.count;
          stepMs += ms * l.count;
          // The copy's time for the same bytes: the kernel at the copy's rate.
          stepCopyMs += moved / (copyGbps * 1e6) * l.count;
        }
        timeDirections(l, b, t, name, sets, reps, static_cast<int>(eb), copyGbps, s,
                       prop.major >= 9, doc, step);
      }
      step["total_ms"] = stepMs;
      step["at_copy_rate_ms"] = stepCopyMs;
      doc["step"][name] = step;
      std::printf(
          "%s step (ResNet-18's 20 batch norms): %.3f ms of batch norm kernels; %.3f ms "
          "at the copy's rate\n",
          name.c_str(), stepMs, stepCopyMs);
      std::printf(
          "%s step by direction: forward %.3f ms unfolded, %.3f ms folded, %.3f ms folded "
          "under PDL; backward %.3f ms unfolded, %.3f ms folded, %.3f ms folded under PDL "
          "(0: no PDL on this device)\n",
          name.c_str(), step.value("forward_unfolded_ms", 0.0),
          step.value("forward_folded_ms", 0.0), step.value("forward_folded_pdl_ms", 0.0),
          step.value("backward_unfolded_ms", 0.0), step.value("backward_folded_ms", 0.0),
          step.value("backward_folded_pdl_ms", 0.0));
      if (!out.empty()) std::ofstream(out) << doc.dump(1) << "\n";
    }
  } catch (const std::exception& e) {  // CudaError and the launchers' InvalidArgument
    std::fprintf(stderr, "bn_kernel_bench: %s\n", e.what());
    return 3;
  }
  return 0;
}
