// conv_bench.h: internal to the conv_bench benchmark program, not a library
// interface. What its translation units share:
//   conv_bench.cc       harness: parameters, double reference and check, timing
//                       loop, table / JSON report, main
//   conv_bench_blas.cc  A: the OpenBLAS im2col + sgemm variants
//   conv_bench_dnnl.cc  B: the oneDNN primitive variants
// namely the clocks and per-phase timers, the LeNet shapes and parameters, what
// the correctness check compares (Grads), the Variant interface and the
// factories of the two variant families, and the hand-written NCHW relu /
// max-pool loops that both families use. See conv_bench.cc for the variants.
#pragma once

#include <time.h>
#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace convbench {

using Clock = std::chrono::steady_clock;
inline double now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}
inline double cpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
inline double threadCpuNow() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
// The clock of the per-phase times: this thread's CPU time by default (the
// work runs on this one thread, which cpu_per_wall and thread_cpu_share check),
// so that other processes on the machine inflate the numbers less; --clock wall
// for wall time. The sub-timers (`aux`: time in sgemm, or in reorders) use the
// same clock but only with --breakdown: a CPU-time clock read is a system call
// (~0.3-0.7 us), and blas-perimage makes 320 sgemm calls a step.
extern double (*phaseClock)();  // threadCpuNow, or now with --clock wall
extern bool breakdown;          // --breakdown
template <class F>
void auxTimed(double& acc, F&& f) {
  if (!breakdown) return f();
  const double t0 = phaseClock();
  f();
  acc += phaseClock() - t0;
}

// ---------------------------------------------------------------- phases ---
enum Ph {
  C1F,
  R1F,
  P1F,
  C2F,
  R2F,
  P2F,
  F1F,
  F2F,
  F3F,
  F3B,
  F2B,
  F1B,
  P2B,
  R2B,
  C2B,
  P1B,
  R1B,
  C1B,
  NPH
};
inline const char* const kPhName[NPH] = {
    "conv1 fwd",    "relu1 fwd",    "pool1 fwd",
    "conv2 fwd",    "relu2 fwd",    "pool2 fwd",
    "fc1+relu fwd", "fc2+relu fwd", "fc3 fwd",
    "fc3 bwd",      "fc2+relu bwd", "fc1+relu bwd",
    "pool2 bwd",    "relu2 bwd",    "conv2 bwd (dW,db,dX)",
    "pool1 bwd",    "relu1 bwd",    "conv1 bwd (dW,db)"};

// Per step: time of each phase (phaseClock), `aux`: the part of it spent in
// sgemm (OpenBLAS variants) or in reorders (oneDNN variants), --breakdown only;
// the whole step's wall, process CPU and thread CPU time.
struct StepTimes {
  std::array<double, NPH> t{}, aux{};
  double total = 0, cpu = 0, tcpu = 0, pclock = 0;
};
struct Stamp {
  StepTimes& st;
  double last;
  explicit Stamp(StepTimes& s) : st(s), last(phaseClock()) {}
  void mark(Ph p) {
    const double t = phaseClock();
    st.t[p] = t - last;
    last = t;
  }
};

// ----------------------------------------------------------------- model ---
struct ConvShape {
  int N, C, H, W, OC, K, pad, OH, OW;
  int P() const { return OH * OW; }
  int CKK() const { return C * K * K; }
  double flops() const { return 2.0 * N * OC * P() * CKK(); }  // one of fwd / dW / dX
};

struct Model {
  int N;
  ConvShape c1, c2;
  static constexpr int F0 = 400, F1 = 120, F2 = 84, F3 = 10;
  explicit Model(int n)
      : N(n), c1{n, 1, 28, 28, 6, 5, 2, 28, 28}, c2{n, 6, 14, 14, 16, 5, 0, 10, 10} {}
  double phaseFlops(Ph p) const {
    const double f1 = 2.0 * N * F0 * F1, f2 = 2.0 * N * F1 * F2, f3 = 2.0 * N * F2 * F3;
    switch (p) {
      case C1F:
        return c1.flops();
      case C2F:
        return c2.flops();
      case F1F:
        return f1;
      case F2F:
        return f2;
      case F3F:
        return f3;
      case F3B:
        return 2 * f3;
      case F2B:
        return 2 * f2;
      case F1B:
        return 2 * f1;
      case C2B:
        return 2 * c2.flops();
      case C1B:
        return c1.flops();  // no data gradient for the input image
      default:
        return 0;
    }
  }
};

// Parameters in PyTorch layouts (conv OIHW, fc [out][in]), input, loss gradient.
struct Params {
  std::vector<float> w1, b1, w2, b2, wf1, bf1, wf2, bf2, wf3, bf3, x, dlogits;
};

// What the check compares, in PyTorch layouts.
struct Grads {
  std::vector<float> logits, dw1, db1, dw2, db2, dwf1, dbf1, dwf2, dbf2, dwf3, dbf3;
  std::vector<std::pair<const char*, const std::vector<float>*>> list() const {
    return {{"logits", &logits}, {"dw1", &dw1},   {"db1", &db1},   {"dw2", &dw2},
            {"db2", &db2},       {"dwf1", &dwf1}, {"dbf1", &dbf1}, {"dwf2", &dwf2},
            {"dbf2", &dbf2},     {"dwf3", &dwf3}, {"dbf3", &dbf3}};
  }
};

struct Variant {
  std::string name;
  virtual ~Variant() = default;
  virtual void step(StepTimes& st) = 0;
  virtual Grads grads() = 0;
  virtual nlohmann::json info() const { return nlohmann::json::object(); }
};

// --------------------------------------------- shared CPU kernels (A, B) ---
// The relu and max-pool loops of the OpenBLAS variants; the oneDNN variants run
// them too on their NCHW boundary tensors unless oneDNN's primitives are used.
inline void reluFwd(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
inline void reluBwd(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float d = dy[i];  // loaded unconditionally, so that the loop vectorises
    dx[i] = x[i] > 0.f ? d : 0.f;
  }
}
// 2x2 / stride 2 max pool over NC planes of HxW; idx = argmax in the window
// (first maximum in (kh,kw) order, as oneDNN).
inline void poolFwd(const float* x, float* y, uint8_t* idx, int NC, int H, int W) {
  const int OH = H / 2, OW = W / 2;
  for (int p = 0; p < NC; ++p)
    for (int oh = 0; oh < OH; ++oh) {
      const float* r0 = x + (size_t(p) * H + 2 * oh) * W;
      const float* r1 = r0 + W;
      float* yr = y + (size_t(p) * OH + oh) * OW;
      uint8_t* ir = idx + (size_t(p) * OH + oh) * OW;
      for (int ow = 0; ow < OW; ++ow) {
        float m = r0[2 * ow];
        uint8_t k = 0;
        if (r0[2 * ow + 1] > m) m = r0[2 * ow + 1], k = 1;
        if (r1[2 * ow] > m) m = r1[2 * ow], k = 2;
        if (r1[2 * ow + 1] > m) m = r1[2 * ow + 1], k = 3;
        yr[ow] = m;
        ir[ow] = k;
      }
    }
}
inline void poolBwd(const float* dy, const uint8_t* idx, float* dx, int NC, int H,
                    int W) {
  const int OH = H / 2, OW = W / 2;
  std::memset(dx, 0, sizeof(float) * size_t(NC) * H * W);
  for (int p = 0; p < NC; ++p)
    for (int oh = 0; oh < OH; ++oh) {
      float* r = dx + (size_t(p) * H + 2 * oh) * W;
      const float* dyr = dy + (size_t(p) * OH + oh) * OW;
      const uint8_t* ir = idx + (size_t(p) * OH + oh) * OW;
      for (int ow = 0; ow < OW; ++ow)
        r[(ir[ow] >> 1) * W + 2 * ow + (ir[ow] & 1)] = dyr[ow];
    }
}

// ------------------------------------------------------------- variants ---
// A: OpenBLAS, one GEMM arrangement each (conv_bench_blas.cc).
enum class BlasMode { Batched, BatchedT, PerImage };
std::unique_ptr<Variant> makeBlasNet(const Model& m, const Params& p, BlasMode mode);

// B: the oneDNN configuration called `name` (conv_bench_dnnl.cc); net is null
// when there is no such configuration. setupUs / setupCpuUs: wall and this
// thread's CPU time the construction took (descriptors + primitives + buffers).
struct DnnlNetBuilt {
  std::unique_ptr<Variant> net;
  double setupUs = 0, setupCpuUs = 0;
};
DnnlNetBuilt makeDnnlNet(const Model& m, const Params& p, const std::string& name);

}  // namespace convbench
