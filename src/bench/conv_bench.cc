// conv_bench: which CPU library should the trainer's convolution layers use?
// Times one full LeNet training step (forward + backward of every layer,
// batch 64, NCHW float32, one thread) with
//   A  OpenBLAS: im2col + sgemm, hand-written relu / max-pool, fc as sgemm, in
//      three GEMM arrangements:
//        blas-batched   col[CKK][N*P]: Y'=W*col (NN), dW=dY'*col^T (NT),
//                       dcol=W^T*dY' (TN), permutes to/from NCHW; fc W[out][in]
//        blas-batchedT  colT[N*P][CKK]: Y^T=colT*W^T (NT), dW=dY^T^T*colT (TN),
//                       dcolT=dY^T*W (NN), transposes to/from NCHW; fc W[in][out]
//        blas-perimage  per image col[CKK][P]: Y_n=W*col_n (NN) straight into
//                       NCHW, dW+=dY_n*col_n^T (NT), dcol=W^T*dY_n (TN)
//   B  oneDNN primitives (convolution fwd-training / bwd-data / bwd-weights,
//      inner product with fused relu; relu / max pool hand-written on NCHW
//      unless the layouts are kept, then oneDNN eltwise / pooling):
//        dnnl-any       conv layouts chosen by oneDNN (format_tag::any), with the
//                       reorders that keep every layer boundary NCHW and every
//                       master weight OIHW (what a plain-tensor trainer needs)
//        dnnl-nhwc      the same with the conv activations forced to NHWC
//        dnnl-plain     conv layouts forced to nchw/oihw (no reorders at all)
//        dnnl-blocked   oneDNN's layouts kept end to end (reorders only where two
//                       primitives disagree; weights live in oneDNN's layout, so
//                       the optimizer must update them there)
//        dnnl-nhwc-e2e  NHWC end to end (oneDNN relu / pool / fc on NHWC)
//        dnnl-any-ops, dnnl-nhwc-ops (not run by default): dnnl-any / -nhwc with
//                       oneDNN relu / pooling on the NCHW boundary tensors
// Every variant is checked against a double-precision naive reference.
//
//   conv_bench [--reps 100] [--warmup 10] [--batch 64] [--threads 1] [--json]
//              [--clock cpu|wall] [--variants blas-batched,dnnl-nhwc,...]
//
// Times are medians over --reps steps, the variants interleaved step by step so
// that load from other processes hits them alike; per-phase times are this
// thread's CPU time unless --clock wall (see phaseClock).
//
// Sources: this file (harness, reference check, reporting, main), conv_bench.h
// (what they share), conv_bench_blas.cc (A), conv_bench_dnnl.cc (B).
#include <cblas.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <CLI/CLI.hpp>
#include <dnnl.hpp>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "conv_bench.h"

namespace convbench {

// The per-phase clock and --breakdown, described in conv_bench.h.
double (*phaseClock)() = threadCpuNow;
bool breakdown = false;

namespace {

Params makeParams(const Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  auto uni = [&](size_t n, float a) {
    std::uniform_real_distribution<float> d(-a, a);
    std::vector<float> v(n);
    for (auto& e : v) e = d(rng);
    return v;
  };
  Params p;
  p.w1 = uni(6 * 25, 1 / std::sqrt(25.f));
  p.b1 = uni(6, 1 / std::sqrt(25.f));
  p.w2 = uni(16 * 150, 1 / std::sqrt(150.f));
  p.b2 = uni(16, 1 / std::sqrt(150.f));
  p.wf1 = uni(120 * 400, 1 / std::sqrt(400.f));
  p.bf1 = uni(120, 1 / std::sqrt(400.f));
  p.wf2 = uni(84 * 120, 1 / std::sqrt(120.f));
  p.bf2 = uni(84, 1 / std::sqrt(120.f));
  p.wf3 = uni(10 * 84, 1 / std::sqrt(84.f));
  p.bf3 = uni(10, 1 / std::sqrt(84.f));
  std::uniform_real_distribution<float> px(0.f, 1.f);
  p.x.resize(size_t(m.N) * 784);
  for (auto& e : p.x) e = px(rng);
  p.dlogits = uni(size_t(m.N) * 10, 1.f / m.N);
  return p;
}

// ----------------------------------------------------- double reference ---
std::vector<double> toD(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<float> toF(const std::vector<double>& v) { return {v.begin(), v.end()}; }

void refConvFwd(const ConvShape& s, const std::vector<double>& x,
                const std::vector<double>& w, const std::vector<double>& b,
                std::vector<double>& y) {
  y.assign(size_t(s.N) * s.OC * s.P(), 0);
  for (int n = 0; n < s.N; ++n)
    for (int oc = 0; oc < s.OC; ++oc)
      for (int oh = 0; oh < s.OH; ++oh)
        for (int ow = 0; ow < s.OW; ++ow) {
          double acc = b[oc];
          for (int c = 0; c < s.C; ++c)
            for (int kh = 0; kh < s.K; ++kh)
              for (int kw = 0; kw < s.K; ++kw) {
                const int ih = oh + kh - s.pad, iw = ow + kw - s.pad;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                acc += x[((size_t(n) * s.C + c) * s.H + ih) * s.W + iw] *
                       w[((size_t(oc) * s.C + c) * s.K + kh) * s.K + kw];
              }
          y[((size_t(n) * s.OC + oc) * s.OH + oh) * s.OW + ow] = acc;
        }
}
void refConvBwd(const ConvShape& s, const std::vector<double>& x,
                const std::vector<double>& w, const std::vector<double>& dy,
                std::vector<double>& dw, std::vector<double>& db,
                std::vector<double>* dx) {
  dw.assign(w.size(), 0);
  db.assign(s.OC, 0);
  if (dx) dx->assign(x.size(), 0);
  for (int n = 0; n < s.N; ++n)
    for (int oc = 0; oc < s.OC; ++oc)
      for (int oh = 0; oh < s.OH; ++oh)
        for (int ow = 0; ow < s.OW; ++ow) {
          const double g = dy[((size_t(n) * s.OC + oc) * s.OH + oh) * s.OW + ow];
          db[oc] += g;
          for (int c = 0; c < s.C; ++c)
            for (int kh = 0; kh < s.K; ++kh)
              for (int kw = 0; kw < s.K; ++kw) {
                const int ih = oh + kh - s.pad, iw = ow + kw - s.pad;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                const size_t xi = ((size_t(n) * s.C + c) * s.H + ih) * s.W + iw;
                const size_t wi = ((size_t(oc) * s.C + c) * s.K + kh) * s.K + kw;
                dw[wi] += g * x[xi];
                if (dx) (*dx)[xi] += g * w[wi];
              }
        }
}
void refPool(const std::vector<double>& x, std::vector<double>& y, std::vector<int>& arg,
             int NC, int H, int W) {
  const int OH = H / 2, OW = W / 2;
  y.assign(size_t(NC) * OH * OW, 0);
  arg.assign(y.size(), 0);
  for (int p = 0; p < NC; ++p)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        size_t best = (size_t(p) * H + 2 * oh) * W + 2 * ow;
        for (int k = 1; k < 4; ++k) {
          const size_t i = (size_t(p) * H + 2 * oh + k / 2) * W + 2 * ow + k % 2;
          if (x[i] > x[best]) best = i;
        }
        const size_t o = (size_t(p) * OH + oh) * OW + ow;
        y[o] = x[best];
        arg[o] = int(best);
      }
}
void refFcFwd(const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<double>& b, std::vector<double>& y, int N, int in,
              int out, bool relu) {
  y.assign(size_t(N) * out, 0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      double acc = b[o];
      for (int i = 0; i < in; ++i) acc += x[size_t(n) * in + i] * w[size_t(o) * in + i];
      y[size_t(n) * out + o] = relu && acc < 0 ? 0 : acc;
    }
}
// dy is the gradient of the (relu'd) output y.
void refFcBwd(const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<double>& y, std::vector<double> dy,
              std::vector<double>& dw, std::vector<double>& db, std::vector<double>& dx,
              int N, int in, int out, bool relu) {
  if (relu)
    for (size_t i = 0; i < dy.size(); ++i)
      if (!(y[i] > 0)) dy[i] = 0;
  dw.assign(size_t(out) * in, 0);
  db.assign(out, 0);
  dx.assign(size_t(N) * in, 0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      const double g = dy[size_t(n) * out + o];
      db[o] += g;
      for (int i = 0; i < in; ++i) {
        dw[size_t(o) * in + i] += g * x[size_t(n) * in + i];
        dx[size_t(n) * in + i] += g * w[size_t(o) * in + i];
      }
    }
}

Grads reference(const Model& m, const Params& p) {
  const int N = m.N;
  std::vector<double> a1, r1, p1, a2, r2, p2, h1, h2, lg;
  std::vector<int> g1, g2;
  auto relu = [](const std::vector<double>& a) {
    std::vector<double> r(a);
    for (auto& v : r) v = v > 0 ? v : 0;
    return r;
  };
  refConvFwd(m.c1, toD(p.x), toD(p.w1), toD(p.b1), a1);
  r1 = relu(a1);
  refPool(r1, p1, g1, N * 6, 28, 28);
  refConvFwd(m.c2, p1, toD(p.w2), toD(p.b2), a2);
  r2 = relu(a2);
  refPool(r2, p2, g2, N * 16, 10, 10);
  refFcFwd(p2, toD(p.wf1), toD(p.bf1), h1, N, 400, 120, true);
  refFcFwd(h1, toD(p.wf2), toD(p.bf2), h2, N, 120, 84, true);
  refFcFwd(h2, toD(p.wf3), toD(p.bf3), lg, N, 84, 10, false);
  std::vector<double> dwf3, dbf3, dh2, dwf2, dbf2, dh1, dwf1, dbf1, dp2, dw2, db2, dp1,
      dw1, db1;
  refFcBwd(h2, toD(p.wf3), lg, toD(p.dlogits), dwf3, dbf3, dh2, N, 84, 10, false);
  refFcBwd(h1, toD(p.wf2), h2, dh2, dwf2, dbf2, dh1, N, 120, 84, true);
  refFcBwd(p2, toD(p.wf1), h1, dh1, dwf1, dbf1, dp2, N, 400, 120, true);
  std::vector<double> da2(a2.size(), 0), da1(a1.size(), 0);
  for (size_t o = 0; o < dp2.size(); ++o) da2[g2[o]] = a2[g2[o]] > 0 ? dp2[o] : 0;
  refConvBwd(m.c2, p1, toD(p.w2), da2, dw2, db2, &dp1);
  for (size_t o = 0; o < dp1.size(); ++o) da1[g1[o]] = a1[g1[o]] > 0 ? dp1[o] : 0;
  refConvBwd(m.c1, toD(p.x), toD(p.w1), da1, dw1, db1, nullptr);
  Grads g;
  g.logits = toF(lg);
  g.dw1 = toF(dw1);
  g.db1 = toF(db1);
  g.dw2 = toF(dw2);
  g.db2 = toF(db2);
  g.dwf1 = toF(dwf1);
  g.dbf1 = toF(dbf1);
  g.dwf2 = toF(dwf2);
  g.dbf2 = toF(dbf2);
  g.dwf3 = toF(dwf3);
  g.dbf3 = toF(dbf3);
  return g;
}

// max over tensors of max|a-b| / max|b| (relative to each tensor's scale).
std::pair<double, std::string> maxRelDiff(const Grads& a, const Grads& b) {
  double worst = 0;
  std::string which = "-";
  const auto la = a.list(), lb = b.list();
  for (size_t t = 0; t < la.size(); ++t) {
    const auto& x = *la[t].second;
    const auto& y = *lb[t].second;
    if (x.size() != y.size()) return {INFINITY, std::string(la[t].first) + " (size)"};
    double d = 0, s = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      d = std::max(d, double(std::fabs(x[i] - y[i])));
      s = std::max(s, double(std::fabs(y[i])));
    }
    const double r = s > 0 ? d / s : d;
    if (!(r <= worst)) worst = r, which = la[t].first;
  }
  return {worst, which};
}

// ------------------------------------------------------------- reporting ---
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[size_t(q * (v.size() - 1) + 0.5)];
}
int threadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}
std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace
}  // namespace convbench

using namespace convbench;

int main(int argc, char** argv) {
  CLI::App app{
      "conv_bench: LeNet training step, OpenBLAS im2col+sgemm vs oneDNN, one thread"};
  int reps = 100, warmup = 10, batch = 64, threads = 1;
  bool json = false, noCheck = false;
  std::string clock = "cpu";
  std::string variants =
      "blas-batched,blas-batchedT,blas-perimage,dnnl-any,dnnl-nhwc,dnnl-plain,dnnl-"
      "blocked,"
      "dnnl-nhwc-e2e";
  app.add_option("--reps", reps, "timed steps per variant (median reported)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "untimed steps per variant first");
  app.add_option("--batch", batch, "batch size")->check(CLI::Range(1, 4096));
  app.add_option("--threads", threads, "threads for OpenBLAS and oneDNN (OpenMP)");
  app.add_option("--variants", variants, "comma-separated subset of the variants");
  app.add_option("--clock", clock,
                 "per-phase clock: cpu (this thread's CPU time) or wall")
      ->check(CLI::IsMember({"cpu", "wall"}));
  app.add_flag(
      "--breakdown", breakdown,
      "also time the sgemm calls / reorders inside each phase (adds clock reads)");
  app.add_flag("--json", json, "print one JSON object instead of the table");
  app.add_flag("--no-check", noCheck, "skip the comparison with the double reference");
  CLI11_PARSE(app, argc, argv);
  if (clock == "wall") phaseClock = now;

  // Before any oneDNN or OpenBLAS work. Debian's libdnnl uses the OpenMP (libgomp)
  // runtime: omp_set_num_threads fixes the team size it queries via
  // omp_get_max_threads, whatever OMP_NUM_THREADS says.
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);

  const Model m(batch);
  const Params p = makeParams(m, 12345);
  const std::string load0 = loadavg();

  std::vector<std::unique_ptr<Variant>> vs;
  nlohmann::json setup = nlohmann::json::object();
  std::stringstream ss(variants);
  for (std::string v; std::getline(ss, v, ',');) {
    if (v.rfind("blas-", 0) == 0) {
      const BlasMode bm = v == "blas-batched"    ? BlasMode::Batched
                          : v == "blas-batchedT" ? BlasMode::BatchedT
                          : v == "blas-perimage"
                              ? BlasMode::PerImage
                              : throw CLI::ValidationError("--variants", v);
      vs.push_back(makeBlasNet(m, p, bm));
    } else {
      // First construction: descriptor dispatch + JIT; the second hits oneDNN's
      // primitive cache. The second one is benchmarked.
      auto first = makeDnnlNet(m, p, v);
      if (!first.net) throw CLI::ValidationError("--variants", v);
      auto second = makeDnnlNet(m, p, v);
      setup[v] = {{"first_us", first.setupUs},
                  {"cached_us", second.setupUs},
                  {"first_cpu_us", first.setupCpuUs},
                  {"cached_cpu_us", second.setupCpuUs}};
      vs.push_back(std::move(second.net));
    }
  }

  // Correctness: one step each from the same parameters, against a double reference.
  nlohmann::json check = nlohmann::json::object();
  bool checkOk = true;
  if (!noCheck) {
    const Grads ref = reference(m, p);
    std::vector<Grads> gs;
    for (auto& v : vs) {
      StepTimes st;
      v->step(st);
      gs.push_back(v->grads());
    }
    for (size_t i = 0; i < vs.size(); ++i) {
      const auto [r, w] = maxRelDiff(gs[i], ref);
      const auto [r0, w0] = maxRelDiff(gs[i], gs[0]);
      check[vs[i]->name] = {{"vs_reference", r},
                            {"worst_tensor", w},
                            {"vs_" + vs[0]->name, r0},
                            {"worst_tensor_vs_first", w0}};
      checkOk = checkOk && r < 1e-4;
    }
  }

  for (auto& v : vs) {
    StepTimes st;
    for (int i = 0; i < warmup; ++i) v->step(st);
  }
  std::vector<std::vector<StepTimes>> times(vs.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < vs.size(); ++i) {
      StepTimes st;
      const double t0 = now(), c0 = cpuNow(), tc0 = threadCpuNow(), p0 = phaseClock();
      vs[i]->step(st);
      st.pclock = phaseClock() - p0;
      st.total = now() - t0;
      st.cpu = cpuNow() - c0;
      st.tcpu = threadCpuNow() - tc0;
      times[i].push_back(st);
    }
  const int nthreads = threadCount();

  // Summaries.
  nlohmann::json out;
  out["config"] = {
      {"batch", batch},
      {"reps", reps},
      {"warmup", warmup},
      {"threads", threads},
      {"clock", clock},
      {"breakdown", breakdown},
      {"omp_max_threads", omp_get_max_threads()},
      {"openblas_threads", openblas_get_num_threads()},
      {"openblas_core", openblas_get_corename()},
      {"dnnl_version", std::to_string(dnnl_version()->major) + "." +
                           std::to_string(dnnl_version()->minor) + "." +
                           std::to_string(dnnl_version()->patch)},
      {"dnnl_isa", dnnl_cpu_isa2str(dnnl_cpu_isa_t(dnnl::get_effective_cpu_isa()))},
      {"process_threads", nthreads},
      {"loadavg_before", load0},
      {"loadavg_after", loadavg()},
      {"step_mflop", 0.0}};
  double stepFlops = 0;
  for (int ph = 0; ph < NPH; ++ph) stepFlops += m.phaseFlops(Ph(ph));
  out["config"]["step_mflop"] = stepFlops * 1e-6;
  out["check"] = check;
  out["dnnl_setup"] = setup;
  out["variants"] = nlohmann::json::array();
  for (size_t i = 0; i < vs.size(); ++i) {
    const auto& T = times[i];
    auto col = [&](auto f) {
      std::vector<double> v;
      for (const auto& st : T) v.push_back(f(st));
      return v;
    };
    nlohmann::json phases = nlohmann::json::object();
    for (int ph = 0; ph < NPH; ++ph) {
      const double med = median(col([&](const StepTimes& s) { return s.t[ph]; })) * 1e6;
      const double aux = median(col([&](const StepTimes& s) { return s.aux[ph]; })) * 1e6;
      const double fl = m.phaseFlops(Ph(ph));
      phases[kPhName[ph]] = {{"median_us", med},
                             {"aux_us", aux},
                             {"gflops", fl > 0 && med > 0 ? fl / (med * 1e3) : 0.0}};
    }
    auto sumPh = [&](int a, int b) {
      return median(col([&](const StepTimes& s) {
               double x = 0;
               for (int ph = a; ph < b; ++ph) x += s.t[ph];
               return x;
             })) *
             1e6;
    };
    auto sumAux = median(col([&](const StepTimes& s) {
                    double x = 0;
                    for (double a : s.aux) x += a;
                    return x;
                  })) *
                  1e6;
    auto convSum = median(col([&](const StepTimes& s) {
                     return s.t[C1F] + s.t[C2F] + s.t[C2B] + s.t[C1B];
                   })) *
                   1e6;
    const auto tot = col([](const StepTimes& s) { return s.total; });
    const double step = median(col([](const StepTimes& s) { return s.pclock; })) * 1e6;
    out["variants"].push_back(
        {{"name", vs[i]->name},
         {"phases", phases},
         {"fwd_us", sumPh(0, F3B)},
         {"bwd_us", sumPh(F3B, NPH)},
         {"conv_us", convSum},
         {"aux_step_us", sumAux},
         {"step_us", step},
         {"step_gflops", stepFlops / (step * 1e3)},
         {"step_wall_us", median(tot) * 1e6},
         {"step_wall_p10_us", quantile(tot, 0.1) * 1e6},
         {"step_wall_p90_us", quantile(tot, 0.9) * 1e6},
         {"step_cpu_p10_us",
          quantile(col([](const StepTimes& s) { return s.pclock; }), 0.1) * 1e6},
         {"step_cpu_p90_us",
          quantile(col([](const StepTimes& s) { return s.pclock; }), 0.9) * 1e6},
         {"cpu_per_wall",
          median(col([](const StepTimes& s) { return s.cpu / s.total; }))},
         {"thread_cpu_share",
          median(col([](const StepTimes& s) { return s.tcpu / s.cpu; }))},
         {"info", vs[i]->info()}});
  }

  if (json) {
    std::printf("%s\n", out.dump(1).c_str());
    return checkOk ? 0 : 1;
  }

  const auto& cfg = out["config"];
  std::printf(
      "LeNet training step, batch %d, %d thread(s); median of %d steps after %d warm-up; "
      "clock: %s\n",
      batch, threads, reps, warmup, clock == "cpu" ? "this thread's CPU time" : "wall");
  std::printf(
      "OpenBLAS core %s, %d thread(s); oneDNN %s, OpenMP max threads %d, isa %s; "
      "process threads %d; loadavg %s -> %s\n",
      openblas_get_corename(), openblas_get_num_threads(),
      cfg["dnnl_version"].get<std::string>().c_str(), omp_get_max_threads(),
      cfg["dnnl_isa"].get<std::string>().c_str(), nthreads, load0.c_str(),
      loadavg().c_str());
  std::printf("cells: median us (GFLOP/s)%s\n\n",
              breakdown ? " [us in sgemm for blas-*, in reorders for dnnl-*]" : "");
  std::printf("%-21s", "phase");
  for (auto& v : vs) std::printf(" %22s", v->name.c_str());
  std::printf("\n");
  for (int ph = 0; ph < NPH; ++ph) {
    std::printf("%-21s", kPhName[ph]);
    for (const auto& v : out["variants"]) {
      const auto& c = v["phases"][kPhName[ph]];
      char buf[64];
      const double g = c["gflops"], a = c["aux_us"];
      if (g > 0 && breakdown)
        std::snprintf(buf, sizeof buf, "%.0f (%.1f) [%.0f]", double(c["median_us"]), g,
                      a);
      else if (g > 0)
        std::snprintf(buf, sizeof buf, "%.0f (%.1f)", double(c["median_us"]), g);
      else if (a > 0)
        std::snprintf(buf, sizeof buf, "%.0f [%.0f]", double(c["median_us"]), a);
      else
        std::snprintf(buf, sizeof buf, "%.0f", double(c["median_us"]));
      std::printf(" %22s", buf);
    }
    std::printf("\n");
  }
  auto row = [&](const char* label, auto f) {
    std::printf("%-21s", label);
    for (const auto& v : out["variants"]) std::printf(" %22s", f(v).c_str());
    std::printf("\n");
  };
  auto num = [](double x, const char* fmt = "%.0f") {
    char b[64];
    std::snprintf(b, sizeof b, fmt, x);
    return std::string(b);
  };
  std::printf("\n");
  row("forward", [&](const auto& v) { return num(v["fwd_us"]); });
  row("backward", [&](const auto& v) { return num(v["bwd_us"]); });
  row("conv layers fwd+bwd", [&](const auto& v) { return num(v["conv_us"]); });
  if (breakdown)
    row("sgemm / reorders", [&](const auto& v) { return num(v["aux_step_us"]); });
  row("STEP", [&](const auto& v) {
    return num(v["step_us"]) + " (" + num(v["step_gflops"], "%.1f") + ")";
  });
  row("step p10..p90", [&](const auto& v) {
    return num(v["step_cpu_p10_us"]) + ".." + num(v["step_cpu_p90_us"]);
  });
  row("step wall median", [&](const auto& v) { return num(v["step_wall_us"]); });
  row("wall p10..p90", [&](const auto& v) {
    return num(v["step_wall_p10_us"]) + ".." + num(v["step_wall_p90_us"]);
  });
  row("process cpu / wall",
      [&](const auto& v) { return num(v["cpu_per_wall"], "%.2f"); });
  row("thread cpu / process",
      [&](const auto& v) { return num(v["thread_cpu_share"], "%.2f"); });
  std::printf("\nstep = %.1f MFLOP (conv fwd/dW/dX + fc GEMMs)\n", stepFlops * 1e-6);
  if (!setup.empty()) {
    std::printf(
        "oneDNN net setup (descriptors + primitives + buffers), CPU us first / cached: ");
    for (auto& [k, v] : setup.items())
      std::printf("%s %.0f / %.0f; ", k.c_str(), double(v["first_cpu_us"]),
                  double(v["cached_cpu_us"]));
    std::printf("\n");
  }
  for (const auto& v : out["variants"]) {
    const auto& inf = v["info"];
    if (!inf.contains("reorders_per_step")) continue;
    std::printf("%s: %d reorders/step;", v["name"].get<std::string>().c_str(),
                inf["reorders_per_step"].get<int>());
    for (const char* l : {"pool1", "relu1"})
      std::printf(" %s %s;", l,
                  inf[l].is_string() ? inf[l].get<std::string>().c_str()
                                     : inf[l]["fwd"].get<std::string>().c_str());
    for (const char* l : {"conv1", "conv2", "fc1"}) {
      const auto& c = inf[l];
      std::printf(
          " %s fwd %s src %s wei %s%s%s;", l, c["fwd"]["impl"].get<std::string>().c_str(),
          c["fwd"]["src"].get<std::string>().c_str(),
          c["fwd"]["wei"].get<std::string>().c_str(),
          c["fwd"].contains("dst")
              ? (" dst " + c["fwd"]["dst"].get<std::string>()).c_str()
              : "",
          (" bwd_w " + c["bwd_w"]["impl"].get<std::string>() +
           (c.contains("bwd_d") ? " bwd_d " + c["bwd_d"]["impl"].get<std::string>() : ""))
              .c_str());
    }
    std::printf("\n");
  }
  if (!noCheck) {
    std::printf("check (max over tensors of max|diff| / max|ref|):");
    for (auto& [k, v] : check.items())
      std::printf(" %s %.1e vs ref (%s), %.1e vs %s;", k.c_str(),
                  double(v["vs_reference"]), v["worst_tensor"].get<std::string>().c_str(),
                  double(v["vs_" + vs[0]->name]), vs[0]->name.c_str());
    std::printf("\n%s\n", checkOk ? "check OK" : "CHECK FAILED (> 1e-4)");
  }
  return checkOk ? 0 : 1;
}
