// conv_bench_dnnl.cc: conv_bench's oneDNN variants (B in conv_bench.cc):
// convolution / inner product (and, where configured, eltwise / pooling)
// primitives in the layouts of one DCfg each, with the reorders between them
// timed separately.
#include <dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "conv_bench.h"

namespace convbench {
namespace {

// -------------------------------------------------------- B: oneDNN ---------
using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;
// A oneDNN configuration: the activation layout of the convolutions (any:
// oneDNN's choice; nchw; nhwc), whether weights are forced to plain OIHW, and
// whether the layouts are kept between layers (keep: reorders only where two
// primitives disagree; master weights live in oneDNN's layout) or every layer
// boundary and master weight is plain NCHW / OIHW (reorders around each conv).
struct DCfg {
  const char* name;
  tag act;
  bool plainWei, keep,
      ops;  // ops: relu/pool as oneDNN primitives (else hand-written NCHW)
};
const DCfg kDCfgs[] = {
    {"dnnl-any", tag::any, false, false, false},
    {"dnnl-nhwc", tag::nhwc, false, false, false},
    {"dnnl-plain", tag::nchw, true, false, false},
    {"dnnl-blocked", tag::any, false, true, true},
    {"dnnl-nhwc-e2e", tag::nhwc, false, true, true},
    {"dnnl-any-ops", tag::any, false, false, true},
    {"dnnl-nhwc-ops", tag::nhwc, false, false, true},
};

// oneDNN-style format string: outer dims by decreasing stride, then inner
// blocks ("abcd" = nchw/oihw, "aBcd8b" = nChw8c, "ABcd8b8a" = OIhw8i8o, ...).
std::string fmtStr(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked) return "?";
  const auto& b = d.format_desc.blocking;
  std::vector<int> order(d.ndims);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int i, int j) { return b.strides[i] > b.strides[j]; });
  std::vector<bool> blocked(d.ndims, false);
  for (int i = 0; i < b.inner_nblks; ++i) blocked[b.inner_idxs[i]] = true;
  std::string s;
  for (int i : order) s += char((blocked[i] ? 'A' : 'a') + i);
  for (int i = 0; i < b.inner_nblks; ++i)
    s += std::to_string(b.inner_blks[i]) + char('a' + b.inner_idxs[i]);
  return s;
}

memory::desc plainDesc(const memory::dims& d) {
  return memory::desc(d, dt::f32,
                      d.size() == 4   ? tag::abcd
                      : d.size() == 2 ? tag::ab
                                      : tag::a);
}
memory userMem(const memory::dims& d, const dnnl::engine& eng, const float* data) {
  memory m(plainDesc(d), eng);
  std::memcpy(m.get_data_handle(), data, m.get_desc().get_size());
  return m;
}
std::vector<float> toPlain(const memory& m, const memory::dims& d,
                           const dnnl::engine& eng, dnnl::stream& s) {
  memory p(plainDesc(d), eng);
  memory src = m;
  dnnl::reorder(src, p).execute(s, src, p);
  s.wait();
  const float* f = static_cast<const float*>(p.get_data_handle());
  return std::vector<float>(f, f + p.get_desc().get_size() / sizeof(float));
}

// `from` as `want`: a no-op when the descriptors agree, else a timed reorder
// into a buffer of its own.
struct Reo {
  bool needed = false;
  memory src, dst;
  dnnl::reorder prim;
  void init(const memory& from, const memory::desc& want, const dnnl::engine& eng) {
    src = from;
    needed = !(from.get_desc() == want);
    dst = needed ? memory(want, eng) : from;
    if (needed) prim = dnnl::reorder(src, dst);
  }
  memory& run(dnnl::stream& s, double& acc) {
    if (needed) auxTimed(acc, [&] { prim.execute(s, src, dst); });
    return dst;
  }
};

struct DCtx {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream s{eng};
  DCfg cfg;
  nlohmann::json info = nlohmann::json::object();
  int reorders = 0;  // reorders executed per step
  void count(const Reo& r) { reorders += r.needed; }
  memory::desc want(
      const memory::dims& d) const {  // layout for a descriptor's free tensor
    return cfg.plainWei ? plainDesc(d) : memory::desc(d, dt::f32, tag::any);
  }
  memory::desc act(const memory::dims& d) const {  // conv src / dst
    return memory::desc(d, dt::f32, cfg.act);
  }
  memory::desc boundary(const memory::desc& produced) const {  // layout between layers
    return cfg.keep ? produced : plainDesc(produced.dims());
  }
};

struct DConv {
  ConvShape sh;
  bool needDx = false;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_weights bww;
  dnnl::convolution_backward_data bwd;
  memory w, b, dw, db, dwRaw, y, out, dx, dxOut;
  Reo inR, wfR, outR, srcWR, ddWR, ddDR, wdR, dwR, dxR;

  void setup(DCtx& c, const char* name, const ConvShape& s, bool need_dx,
             const memory& in, const float* w0, const float* b0) {
    sh = s;
    needDx = need_dx;
    const memory::dims sd{s.N, s.C, s.H, s.W}, wd{s.OC, s.C, s.K, s.K}, bd{s.OC},
        dd{s.N, s.OC, s.OH, s.OW}, st{1, 1}, pad{s.pad, s.pad};
    const auto srcMd = c.act(sd), wMd = c.want(wd), dstMd = c.act(dd),
               bMd = plainDesc(bd);
    using namespace dnnl;
    convolution_forward::primitive_desc fpd(
        {prop_kind::forward_training, algorithm::convolution_direct, srcMd, wMd, bMd,
         dstMd, st, pad, pad},
        c.eng);
    convolution_backward_weights::primitive_desc wpd(
        {algorithm::convolution_direct, srcMd, wMd, bMd, dstMd, st, pad, pad}, c.eng,
        fpd);
    fwd = convolution_forward(fpd);
    bww = convolution_backward_weights(wpd);
    memory wPlain = userMem(wd, c.eng, w0);
    if (c.cfg.keep) {  // master weights kept in the forward's layout
      w = memory(fpd.weights_desc(), c.eng);
      reorder(wPlain, w).execute(c.s, wPlain, w);
      c.s.wait();
    } else {
      w = wPlain;
    }
    b = userMem(bd, c.eng, b0);
    inR.init(in, fpd.src_desc(), c.eng);
    wfR.init(w, fpd.weights_desc(), c.eng);
    y = memory(fpd.dst_desc(), c.eng);
    outR.init(y, c.boundary(fpd.dst_desc()), c.eng);
    out = outR.dst;
    srcWR.init(inR.dst, wpd.src_desc(), c.eng);
    dwRaw = memory(wpd.diff_weights_desc(), c.eng);
    dwR.init(dwRaw, w.get_desc(), c.eng);  // the optimizer updates w with dw
    dw = dwR.dst;
    db = memory(wpd.diff_bias_desc(), c.eng);
    nlohmann::json j = {{"fwd",
                         {{"impl", fpd.impl_info_str()},
                          {"src", fmtStr(fpd.src_desc())},
                          {"wei", fmtStr(fpd.weights_desc())},
                          {"dst", fmtStr(fpd.dst_desc())}}},
                        {"bwd_w",
                         {{"impl", wpd.impl_info_str()},
                          {"src", fmtStr(wpd.src_desc())},
                          {"diff_wei", fmtStr(wpd.diff_weights_desc())},
                          {"diff_dst", fmtStr(wpd.diff_dst_desc())}}}};
    if (needDx) {
      convolution_backward_data::primitive_desc dpd(
          {algorithm::convolution_direct, srcMd, wMd, dstMd, st, pad, pad}, c.eng, fpd);
      bwd = convolution_backward_data(dpd);
      wdR.init(wfR.dst, dpd.weights_desc(), c.eng);
      dx = memory(dpd.diff_src_desc(), c.eng);
      dxR.init(dx, c.boundary(dpd.diff_src_desc()), c.eng);
      dxOut = dxR.dst;
      ddD_ = dpd.diff_dst_desc();
      j["bwd_d"] = {{"impl", dpd.impl_info_str()},
                    {"wei", fmtStr(dpd.weights_desc())},
                    {"diff_dst", fmtStr(dpd.diff_dst_desc())},
                    {"diff_src", fmtStr(dpd.diff_src_desc())}};
    }
    ddW_ = wpd.diff_dst_desc();
    c.info[name] = j;
    for (const Reo* r : {&inR, &wfR, &outR, &srcWR, &dwR, &wdR, &dxR}) c.count(*r);
  }
  void bindBwd(DCtx& c, const memory& ddst) {
    ddWR.init(ddst, ddW_, c.eng);
    if (needDx) ddDR.init(ddWR.dst.get_desc() == ddD_ ? ddWR.dst : ddst, ddD_, c.eng);
    c.count(ddWR);
    c.count(ddDR);
  }
  void forward(dnnl::stream& s, double& reo) {
    memory& x = inR.run(s, reo);
    memory& wf = wfR.run(s, reo);
    fwd.execute(s, {{DNNL_ARG_SRC, x},
                    {DNNL_ARG_WEIGHTS, wf},
                    {DNNL_ARG_BIAS, b},
                    {DNNL_ARG_DST, y}});
    outR.run(s, reo);
  }
  void backward(dnnl::stream& s, double& reo) {
    memory& dd = ddWR.run(s, reo);
    memory& x = srcWR.run(s, reo);
    bww.execute(s, {{DNNL_ARG_SRC, x},
                    {DNNL_ARG_DIFF_DST, dd},
                    {DNNL_ARG_DIFF_WEIGHTS, dwRaw},
                    {DNNL_ARG_DIFF_BIAS, db}});
    dwR.run(s, reo);
    if (!needDx) return;
    memory& dd2 = ddDR.run(s, reo);
    memory& wd = wdR.run(s, reo);
    bwd.execute(
        s, {{DNNL_ARG_DIFF_DST, dd2}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dx}});
    dxR.run(s, reo);
  }

 private:
  memory::desc ddW_, ddD_;
};

float* ptr(const memory& m) { return static_cast<float*>(m.get_data_handle()); }
size_t numel(const memory& m) { return m.get_desc().get_size() / sizeof(float); }

// relu and max-pool: oneDNN primitives, or (hand) the NCHW loops the OpenBLAS
// variants use, which is what a plain-tensor trainer would call around oneDNN convs.
struct DRelu {
  bool hand = false;
  dnnl::eltwise_forward fwd;
  dnnl::eltwise_backward bwd;
  memory in, out, dxOut;
  Reo ddR;
  memory::desc dd_;
  void setup(DCtx& c, const char* name, const memory& x, bool hand_written) {
    using namespace dnnl;
    in = x;
    hand = hand_written;
    if (hand) {
      out = memory(x.get_desc(), c.eng);
      dxOut = memory(x.get_desc(), c.eng);
      dd_ = x.get_desc();
      c.info[name] = "hand-written NCHW loop";
      return;
    }
    eltwise_forward::primitive_desc fpd(
        {prop_kind::forward_training, algorithm::eltwise_relu, x.get_desc(), 0.f, 0.f},
        c.eng);
    eltwise_backward::primitive_desc bpd(
        {algorithm::eltwise_relu, x.get_desc(), x.get_desc(), 0.f, 0.f}, c.eng, fpd);
    fwd = eltwise_forward(fpd);
    bwd = eltwise_backward(bpd);
    out = memory(fpd.dst_desc(), c.eng);
    dxOut = memory(bpd.diff_src_desc(), c.eng);
    dd_ = bpd.diff_dst_desc();
    c.info[name] = {{"fwd", fpd.impl_info_str()},
                    {"bwd", bpd.impl_info_str()},
                    {"fmt", fmtStr(x.get_desc())}};
  }
  void bindBwd(DCtx& c, const memory& ddst) {
    ddR.init(ddst, dd_, c.eng);
    c.count(ddR);
  }
  void forward(dnnl::stream& s) {
    if (hand) return reluFwd(ptr(in), ptr(out), numel(in));
    fwd.execute(s, {{DNNL_ARG_SRC, in}, {DNNL_ARG_DST, out}});
  }
  void backward(dnnl::stream& s, double& reo) {
    memory& dd = ddR.run(s, reo);
    if (hand) return reluBwd(ptr(in), ptr(dd), ptr(dxOut), numel(in));
    bwd.execute(
        s, {{DNNL_ARG_SRC, in}, {DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_SRC, dxOut}});
  }
};

struct DPool {
  bool hand = false;
  int NC = 0, H = 0, W = 0;
  std::vector<uint8_t> idx;
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward bwd;
  memory in, out, ws, dxOut;
  Reo ddR;
  memory::desc dd_;
  void setup(DCtx& c, const char* name, const memory& x, bool hand_written) {
    using namespace dnnl;
    in = x;
    hand = hand_written;
    const auto d = x.get_desc().dims();
    const memory::dims od{d[0], d[1], d[2] / 2, d[3] / 2}, k{2, 2}, z{0, 0};
    if (hand) {
      NC = int(d[0] * d[1]), H = int(d[2]), W = int(d[3]);
      out = memory(plainDesc(od), c.eng);
      idx.resize(numel(out));
      dxOut = memory(x.get_desc(), c.eng);
      dd_ = plainDesc(od);
      c.info[name] = "hand-written NCHW loop";
      return;
    }
    const memory::desc dstMd =
        c.cfg.keep ? memory::desc(od, dt::f32, tag::any) : plainDesc(od);
    pooling_forward::primitive_desc fpd(
        {prop_kind::forward_training, algorithm::pooling_max, x.get_desc(), dstMd, k, k,
         z, z},
        c.eng);
    pooling_backward::primitive_desc bpd(
        {algorithm::pooling_max, x.get_desc(), fpd.dst_desc(), k, k, z, z}, c.eng, fpd);
    fwd = pooling_forward(fpd);
    bwd = pooling_backward(bpd);
    out = memory(fpd.dst_desc(), c.eng);
    ws = memory(fpd.workspace_desc(), c.eng);
    dxOut = memory(bpd.diff_src_desc(), c.eng);
    dd_ = bpd.diff_dst_desc();
    c.info[name] = {{"fwd", fpd.impl_info_str()},
                    {"bwd", bpd.impl_info_str()},
                    {"fmt", fmtStr(x.get_desc())}};
  }
  void bindBwd(DCtx& c, const memory& ddst) {
    ddR.init(ddst, dd_, c.eng);
    c.count(ddR);
  }
  void forward(dnnl::stream& s) {
    if (hand) return poolFwd(ptr(in), ptr(out), idx.data(), NC, H, W);
    fwd.execute(s, {{DNNL_ARG_SRC, in}, {DNNL_ARG_DST, out}, {DNNL_ARG_WORKSPACE, ws}});
  }
  void backward(dnnl::stream& s, double& reo) {
    memory& dd = ddR.run(s, reo);
    if (hand) return poolBwd(ptr(dd), idx.data(), ptr(dxOut), NC, H, W);
    bwd.execute(
        s,
        {{DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_SRC, dxOut}, {DNNL_ARG_WORKSPACE, ws}});
  }
};

// Inner product, relu fused into the forward as a post-op; its backward is an
// eltwise relu_use_dst_for_bwd.
struct DFc {
  bool relu = false;
  dnnl::inner_product_forward fwd;
  dnnl::inner_product_backward_data bwd;
  dnnl::inner_product_backward_weights bww;
  dnnl::eltwise_backward rbwd;
  memory w, b, dw, db, dwRaw, y, dz, dx;
  memory::dims wDims;
  Reo inR, wfR, wdR, srcWR, ddR, dwR;
  memory::desc dd_;

  // in: the layer input (2D nc, or 4D in whatever layout the pool left it).
  void setup(DCtx& c, const char* name, const memory& in, int out, bool has_relu,
             const float* w0, const float* b0) {
    using namespace dnnl;
    relu = has_relu;
    const auto sd = in.get_desc().dims();
    const memory::dim N = sd[0];
    wDims = sd;
    wDims[0] = out;
    const memory::desc srcMd = c.cfg.plainWei ? plainDesc(sd)
                               : sd.size() == 4
                                   ? in.get_desc()  // Blocked: keep the pool's layout
                                   : memory::desc(sd, dt::f32, tag::any);
    // Weights as oneDNN likes them when layouts are kept, else plain [out][in].
    const memory::desc wMd = c.cfg.keep ? c.want(wDims) : plainDesc(wDims);
    const memory::desc bMd = plainDesc({out}), dMd = plainDesc({N, out});
    post_ops po;
    if (relu) po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
    primitive_attr attr;
    attr.set_post_ops(po);
    inner_product_forward::primitive_desc fpd(
        {prop_kind::forward_training, srcMd, wMd, bMd, dMd}, attr, c.eng);
    inner_product_backward_data::primitive_desc dpd({srcMd, wMd, dMd}, c.eng, fpd);
    inner_product_backward_weights::primitive_desc wpd({srcMd, wMd, bMd, dMd}, c.eng,
                                                       fpd);
    fwd = inner_product_forward(fpd);
    bwd = inner_product_backward_data(dpd);
    bww = inner_product_backward_weights(wpd);
    memory wPlain = userMem(wDims, c.eng, w0);
    if (c.cfg.keep) {
      w = memory(fpd.weights_desc(), c.eng);
      reorder(wPlain, w).execute(c.s, wPlain, w);
      c.s.wait();
    } else {
      w = wPlain;
    }
    b = userMem({out}, c.eng, b0);
    inR.init(in, fpd.src_desc(), c.eng);
    wfR.init(w, fpd.weights_desc(), c.eng);
    wdR.init(wfR.dst, dpd.weights_desc(), c.eng);
    srcWR.init(inR.dst, wpd.src_desc(), c.eng);
    y = memory(fpd.dst_desc(), c.eng);
    dz = memory(dpd.diff_dst_desc(), c.eng);
    dd_ = dpd.diff_dst_desc();
    dx = memory(dpd.diff_src_desc(), c.eng);
    dwRaw = memory(wpd.diff_weights_desc(), c.eng);
    dwR.init(dwRaw, w.get_desc(), c.eng);
    dw = dwR.dst;
    db = memory(wpd.diff_bias_desc(), c.eng);
    if (relu) {
      eltwise_forward::primitive_desc hint(
          {prop_kind::forward_training, algorithm::eltwise_relu_use_dst_for_bwd,
           y.get_desc(), 0.f, 0.f},
          c.eng);
      rbwd = eltwise_backward(eltwise_backward::primitive_desc(
          {algorithm::eltwise_relu_use_dst_for_bwd, dd_, y.get_desc(), 0.f, 0.f}, c.eng,
          hint));
    }
    c.info[name] = {
        {"fwd",
         {{"impl", fpd.impl_info_str()},
          {"src", fmtStr(fpd.src_desc())},
          {"wei", fmtStr(fpd.weights_desc())}}},
        {"bwd_d",
         {{"impl", dpd.impl_info_str()},
          {"wei", fmtStr(dpd.weights_desc())},
          {"diff_src", fmtStr(dpd.diff_src_desc())}}},
        {"bwd_w",
         {{"impl", wpd.impl_info_str()}, {"diff_wei", fmtStr(wpd.diff_weights_desc())}}}};
    for (const Reo* r : {&inR, &wfR, &wdR, &srcWR, &dwR}) c.count(*r);
  }
  void bindBwd(DCtx& c, const memory& ddst) {
    ddR.init(ddst, relu ? y.get_desc() : dd_, c.eng);
    c.count(ddR);
  }
  void forward(dnnl::stream& s, double& reo) {
    memory& x = inR.run(s, reo);
    memory& wf = wfR.run(s, reo);
    fwd.execute(s, {{DNNL_ARG_SRC, x},
                    {DNNL_ARG_WEIGHTS, wf},
                    {DNNL_ARG_BIAS, b},
                    {DNNL_ARG_DST, y}});
  }
  void backward(dnnl::stream& s, double& reo) {
    memory& dd = ddR.run(s, reo);
    memory g = dd;
    if (relu) {
      rbwd.execute(s,
                   {{DNNL_ARG_DST, y}, {DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_SRC, dz}});
      g = dz;
    }
    memory& wd = wdR.run(s, reo);
    bwd.execute(
        s, {{DNNL_ARG_DIFF_DST, g}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dx}});
    memory& x = srcWR.run(s, reo);
    bww.execute(s, {{DNNL_ARG_SRC, x},
                    {DNNL_ARG_DIFF_DST, g},
                    {DNNL_ARG_DIFF_WEIGHTS, dwRaw},
                    {DNNL_ARG_DIFF_BIAS, db}});
    dwR.run(s, reo);
  }
};

// Same memory under another plain shape (2D nc <-> 4D nchw flatten).
memory view(const memory& m, const memory::dims& d, const dnnl::engine& eng) {
  return memory(plainDesc(d), eng, m.get_data_handle());
}

class DnnlNet final : public Variant {
 public:
  // dnnl_ops: relu and pooling as oneDNN primitives too (always so when Blocked).
  DnnlNet(const Model& m, const Params& p, const DCfg& cfg) : m_(m) {
    name = cfg.name;
    c_.cfg = cfg;
    const bool dnnl_ops = cfg.ops;
    const double t0 = now(), tc0 = threadCpuNow();
    const auto& e = c_.eng;
    const memory::dim N = m.N;
    x_ = memory(plainDesc({N, 1, 28, 28}), e, const_cast<float*>(p.x.data()));
    dl_ = memory(plainDesc({N, 10}), e, const_cast<float*>(p.dlogits.data()));
    conv1_.setup(c_, "conv1", m.c1, false, x_, p.w1.data(), p.b1.data());
    relu1_.setup(c_, "relu1", conv1_.out, !dnnl_ops);
    pool1_.setup(c_, "pool1", relu1_.out, !dnnl_ops);
    conv2_.setup(c_, "conv2", m.c2, true, pool1_.out, p.w2.data(), p.b2.data());
    relu2_.setup(c_, "relu2", conv2_.out, !dnnl_ops);
    pool2_.setup(c_, "pool2", relu2_.out, !dnnl_ops);
    const bool blocked = cfg.keep;
    const memory fc1in = blocked ? pool2_.out : view(pool2_.out, {N, 400}, e);
    fc1_.setup(c_, "fc1", fc1in, 120, true, p.wf1.data(), p.bf1.data());
    fc2_.setup(c_, "fc2", fc1_.y, 84, true, p.wf2.data(), p.bf2.data());
    fc3_.setup(c_, "fc3", fc2_.y, 10, false, p.wf3.data(), p.bf3.data());
    fc3_.bindBwd(c_, dl_);
    fc2_.bindBwd(c_, fc3_.dx);
    fc1_.bindBwd(c_, fc2_.dx);
    pool2_.bindBwd(c_, blocked ? fc1_.dx : view(fc1_.dx, {N, 16, 5, 5}, e));
    relu2_.bindBwd(c_, pool2_.dxOut);
    conv2_.bindBwd(c_, relu2_.dxOut);
    pool1_.bindBwd(c_, conv2_.dxOut);
    relu1_.bindBwd(c_, pool1_.dxOut);
    conv1_.bindBwd(c_, relu1_.dxOut);
    setupUs_ = (now() - t0) * 1e6;
    setupCpuUs_ = (threadCpuNow() - tc0) * 1e6;
  }
  double setupUs() const { return setupUs_; }
  double setupCpuUs() const { return setupCpuUs_; }

  void step(StepTimes& st) override {
    st.aux.fill(0);
    auto& s = c_.s;
    Stamp t(st);
    conv1_.forward(s, st.aux[C1F]);
    t.mark(C1F);
    relu1_.forward(s);
    t.mark(R1F);
    pool1_.forward(s);
    t.mark(P1F);
    conv2_.forward(s, st.aux[C2F]);
    t.mark(C2F);
    relu2_.forward(s);
    t.mark(R2F);
    pool2_.forward(s);
    t.mark(P2F);
    fc1_.forward(s, st.aux[F1F]);
    t.mark(F1F);
    fc2_.forward(s, st.aux[F2F]);
    t.mark(F2F);
    fc3_.forward(s, st.aux[F3F]);
    t.mark(F3F);
    fc3_.backward(s, st.aux[F3B]);
    t.mark(F3B);
    fc2_.backward(s, st.aux[F2B]);
    t.mark(F2B);
    fc1_.backward(s, st.aux[F1B]);
    t.mark(F1B);
    pool2_.backward(s, st.aux[P2B]);
    t.mark(P2B);
    relu2_.backward(s, st.aux[R2B]);
    t.mark(R2B);
    conv2_.backward(s, st.aux[C2B]);
    t.mark(C2B);
    pool1_.backward(s, st.aux[P1B]);
    t.mark(P1B);
    relu1_.backward(s, st.aux[R1B]);
    t.mark(R1B);
    conv1_.backward(s, st.aux[C1B]);
    s.wait();
    t.mark(C1B);
  }

  Grads grads() override {
    auto& e = c_.eng;
    auto& s = c_.s;
    const memory::dim N = m_.N;
    Grads g;
    g.logits = toPlain(fc3_.y, {N, 10}, e, s);
    g.dw1 = toPlain(conv1_.dw, {6, 1, 5, 5}, e, s);
    g.db1 = toPlain(conv1_.db, {6}, e, s);
    g.dw2 = toPlain(conv2_.dw, {16, 6, 5, 5}, e, s);
    g.db2 = toPlain(conv2_.db, {16}, e, s);
    g.dwf1 = toPlain(fc1_.dw, fc1_.wDims, e, s);
    g.dbf1 = toPlain(fc1_.db, {120}, e, s);
    g.dwf2 = toPlain(fc2_.dw, {84, 120}, e, s);
    g.dbf2 = toPlain(fc2_.db, {84}, e, s);
    g.dwf3 = toPlain(fc3_.dw, {10, 84}, e, s);
    g.dbf3 = toPlain(fc3_.db, {10}, e, s);
    return g;
  }

  nlohmann::json info() const override {
    nlohmann::json j = c_.info;
    j["reorders_per_step"] = c_.reorders;
    j["aux"] = "reorder time";
    return j;
  }

 private:
  const Model& m_;
  DCtx c_;
  memory x_, dl_;
  DConv conv1_, conv2_;
  DRelu relu1_, relu2_;
  DPool pool1_, pool2_;
  DFc fc1_, fc2_, fc3_;
  double setupUs_ = 0, setupCpuUs_ = 0;
};

}  // namespace

DnnlNetBuilt makeDnnlNet(const Model& m, const Params& p, const std::string& name) {
  const DCfg* cfg = nullptr;
  for (const auto& c : kDCfgs)
    if (name == c.name) cfg = &c;
  DnnlNetBuilt b;
  if (!cfg) return b;
  auto net = std::make_unique<DnnlNet>(m, p, *cfg);
  b.setupUs = net->setupUs();
  b.setupCpuUs = net->setupCpuUs();
  b.net = std::move(net);
  return b;
}

}  // namespace convbench
