// The CUDA backend's one-launch optimizer step and the no-zeroing gradient
// contract, on a GPU:
// - the multi-tensor SGD/Adam step (Backend::sgdStep/adamStep, more chunks
//   than one launch takes, sizes from 1 element to a few million) bitwise
//   equal to one per-parameter kernel per chunk;
// - its 16-bit weight copies bitwise equal to launchTo16 of the updated
//   weights (bf16 and fp16), refused in fp32;
// - the Optimizer's flat layout on device memory, with its 16-bit copies;
// - a step captured in a CUDA graph reading its learning rate and step from
//   the staged slot (Backend::stageOptimizerStep);
// - Param::overwriteGrad in the linear layer (fp32, bf16) and batch norm
//   (cuDNN, SyncBatchNorm over one rank);
// - the shared num_batches_tracked counter of a model's batch norms.
// Without a GPU every test skips (GTEST_SKIP); ctest reports them as skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cuda/elementwise.h"
#include "cuda/optim_kernels.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/runtime/cuda_check.h"
#include "ddprun/train/layers.h"
#include "train/random_vector.h"
#include "require_gpu.h"
#include "ddprun/train/optim.h"
#include "rank_threads.h"

namespace ddprun::train {
namespace {


constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using ddprun::testing::randomVector;

Tensor onDevice(Backend& be, const std::vector<float>& v, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  Tensor t(shape, be.allocator());
  be.upload(v.data(), t.data(), v.size());
  return t;
}
std::vector<float> toHost(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(t.data(), v.data(), v.size());
  return v;
}
// n 16-bit elements at device address p (after the backend's work).
std::vector<uint16_t> bits16(Backend& be, const void* p, size_t n) {
  be.synchronize();
  std::vector<uint16_t> out(n);
  DDPRUN_CUDA_OK(cudaMemcpy(out.data(), p, n * 2, cudaMemcpyDeviceToHost));
  return out;
}
// launchTo16 of n floats at device address src, on a stream of our own.
std::vector<uint16_t> reference16(Backend& be, const float* src, size_t n, bool bf16) {
  be.synchronize();
  cudaStream_t s = nullptr;
  DDPRUN_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Tensor dst({static_cast<int64_t>((n + 1) / 2)}, be.allocator());
  cuda::launchTo16(src, dst.data(), n, bf16, s);
  DDPRUN_CUDA_OK(cudaStreamSynchronize(s));
  DDPRUN_CUDA_OK(cudaStreamDestroy(s));
  return bits16(be, dst.data(), n);
}
bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Chunk sizes: single elements, block edges (1024 elements per block), and
// a few large ones; 150 chunks, so at least three launches of 64.
std::vector<size_t> chunkSizes() {
  std::vector<size_t> n = {1, 3, 255, 1023, 1024, 1025, 4096, 70001, 3 * 1000 * 1000 + 7};
  for (size_t i = 0; n.size() < 150; ++i) n.push_back(1 + (i * 7919) % 3000);
  return n;
}

// The same chunks twice on the device: A for the multi-tensor step, B for
// the per-chunk kernels.
struct Chunks {
  std::vector<Tensor> w, g, s1, s2;
  std::vector<Backend::OptimChunk> list(bool withS1, bool withS2) {
    std::vector<Backend::OptimChunk> out;
    for (size_t i = 0; i < w.size(); ++i)
      out.push_back({w[i].data(), g[i].data(), withS1 ? s1[i].data() : nullptr,
                     withS2 ? s2[i].data() : nullptr, nullptr, static_cast<size_t>(w[i].numel())});
    return out;
  }
};
Chunks makeChunks(Backend& be, uint64_t seed) {
  Chunks c;
  uint64_t k = seed;
  for (size_t n : chunkSizes()) {
    c.w.push_back(onDevice(be, randomVector(n, k++)));
    c.g.push_back(onDevice(be, randomVector(n, k++)));
    c.s1.push_back(onDevice(be, randomVector(n, k++)));
    c.s2.push_back(onDevice(be, randomVector(n, k++, 0.0f, 1.0f)));  // exp_avg_sq >= 0
  }
  return c;
}
void expectSame(Backend& be, Chunks& a, Chunks& b, const std::string& what) {
  for (size_t i = 0; i < a.w.size(); ++i) {
    ASSERT_TRUE(sameBits(toHost(be, a.w[i]), toHost(be, b.w[i]))) << what << " w, chunk " << i;
    ASSERT_TRUE(sameBits(toHost(be, a.s1[i]), toHost(be, b.s1[i]))) << what << " s1, chunk " << i;
    ASSERT_TRUE(sameBits(toHost(be, a.s2[i]), toHost(be, b.s2[i]))) << what << " s2, chunk " << i;
  }
}

TEST(CudaOptim, MultiTensorSgdEqualsPerChunkKernels) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  auto be = makeCudaBackend({.device = 0, .precision = Precision::kFp32});
  for (const float momentum : {0.9f, 0.0f})
    for (const bool nesterov : {false, true}) {
      if (nesterov && momentum == 0.0f) continue;  // refused by the optimizer (as PyTorch)
      Chunks a = makeChunks(*be, 100), b = makeChunks(*be, 100);
      for (int s = 0; s < 3; ++s) {
        const bool first = s == 0;
        be->sgdStep(a.list(momentum != 0.0f, false), 0.05f, momentum, 1e-4f, first, nesterov);
        for (const auto& c : b.list(momentum != 0.0f, false))
          be->sgdUpdate(c.w, c.g, c.s1, c.n, 0.05f, momentum, 1e-4f, first, nesterov);
        expectSame(*be, a, b, "sgd momentum " + std::to_string(momentum) + " nesterov " +
                                  std::to_string(nesterov) + " step " + std::to_string(s));
      }
    }
}

// Nesterov in the multi-tensor kernel against the CPU backend's step on the
// same chunks (host copies), within float rounding (nvcc may fuse a*b+c).
TEST(CudaOptim, MultiTensorNesterovMatchesCpu) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  auto be = makeCudaBackend({.device = 0, .precision = Precision::kFp32});
  auto cpu = makeCpuBackend(1);
  Chunks a = makeChunks(*be, 400);
  std::vector<std::vector<float>> w, g, buf;
  for (size_t i = 0; i < a.w.size(); ++i) {
    w.push_back(toHost(*be, a.w[i]));
    g.push_back(toHost(*be, a.g[i]));
    buf.push_back(toHost(*be, a.s1[i]));
  }
  for (int s = 0; s < 3; ++s) {
    be->sgdStep(a.list(true, false), 0.05f, 0.9f, 1e-4f, s == 0, true);
    for (size_t i = 0; i < w.size(); ++i)
      cpu->sgdUpdate(w[i].data(), g[i].data(), buf[i].data(), w[i].size(), 0.05f, 0.9f, 1e-4f,
                     s == 0, true);
  }
  for (size_t i = 0; i < w.size(); ++i) {
    const auto wd = toHost(*be, a.w[i]), bd = toHost(*be, a.s1[i]);
    for (size_t k = 0; k < w[i].size(); ++k) {
      ASSERT_NEAR(wd[k], w[i][k], 1e-6f * (1.0f + std::fabs(w[i][k]))) << "chunk " << i;
      ASSERT_NEAR(bd[k], buf[i][k], 1e-6f * (1.0f + std::fabs(buf[i][k]))) << "chunk " << i;
    }
  }
}

TEST(CudaOptim, MultiTensorAdamEqualsPerChunkKernels) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  auto be = makeCudaBackend({.device = 0, .precision = Precision::kFp32});
  Chunks a = makeChunks(*be, 200), b = makeChunks(*be, 200);
  for (int64_t step = 1; step <= 3; ++step) {
    be->adamStep(a.list(true, true), 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, step);
    for (const auto& c : b.list(true, true))
      be->adamUpdate(c.w, c.g, c.s1, c.s2, c.n, 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, step);
    expectSame(*be, a, b, "adam step " + std::to_string(step));
  }
  std::vector<Backend::OptimChunk> bad = a.list(true, false);
  EXPECT_THROW(be->adamStep(bad, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 4), InvalidArgument);
}

// The optimizer step inside a CUDA graph (Backend::stageOptimizerStep): the
// step captured once with arguments that must not matter (a learning rate
// of 123, SGD's first-step flag off, Adam's step 99) and replayed after each
// staging of the step's learning rate, first-step flag and step equals the
// eager steps with those values bitwise, over several launches' worth of
// chunks; the capture itself ran nothing.
TEST(CudaOptim, CapturedStepReadsTheStagedScalars) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  for (const bool adam : {false, true}) {
    SCOPED_TRACE(adam ? "adam" : "sgd");
    auto be = makeCudaBackend({.device = 0, .precision = Precision::kFp32, .cudaGraph = true});
    Chunks a = makeChunks(*be, 300), b = makeChunks(*be, 300);
    const std::vector<float> before = toHost(*be, a.w[0]);
    auto lrAt = [](int s) { return 0.01f * (1.0f + 0.5f * static_cast<float>(s)); };
    auto stage = [&](int s) { be->stageOptimizerStep(lrAt(s), s == 0, s + 1, 0.9f, 0.999f); };
    stage(0);
    std::string why;
    auto graph = be->capture(
        [&] {
          if (adam)
            be->adamStep(a.list(true, true), 123.0f, 0.9f, 0.999f, 1e-8f, 1e-2f, 99);
          else
            be->sgdStep(a.list(true, false), 123.0f, 0.9f, 1e-4f, false, false);
        },
        &why);
    ASSERT_NE(graph, nullptr) << why;
    ASSERT_TRUE(sameBits(toHost(*be, a.w[0]), before)) << "the capture ran the step";
    for (int s = 0; s < 4; ++s) {
      if (s > 0) stage(s);
      graph->replay();
      if (adam)
        be->adamStep(b.list(true, true), lrAt(s), 0.9f, 0.999f, 1e-8f, 1e-2f, s + 1);
      else
        be->sgdStep(b.list(true, false), lrAt(s), 0.9f, 1e-4f, s == 0, false);
      expectSame(*be, a, b, "step " + std::to_string(s));
    }
  }
}

// The 16-bit copies written by the step are launchTo16 of the updated
// weights, element for element (round to nearest even), also at odd offsets;
// chunks without w16 next to them are updated alike.
TEST(CudaOptim, Weights16AreTheRoundedUpdatedWeights) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  for (const Precision p : {Precision::kBf16, Precision::kFp16}) {
    const bool bf16 = p == Precision::kBf16;
    auto be = makeCudaBackend({.device = 0, .precision = p});
    Chunks a = makeChunks(*be, 300);
    Tensor store({static_cast<int64_t>(a.w.size() * 4 + 3000 * 1000 + 200000)}, be->allocator());
    auto* base = static_cast<uint16_t*>(static_cast<void*>(store.data())) + 1;  // odd offsets
    auto list = a.list(true, true);
    std::vector<uint16_t*> w16(list.size(), nullptr);
    size_t at = 0;
    for (size_t i = 0; i < list.size(); i += 2) {  // every other chunk
      w16[i] = base + at;
      list[i].w16 = w16[i];
      at += list[i].n + (i % 3);
    }
    for (int64_t step = 1; step <= 2; ++step) {
      if (step == 1)
        be->sgdStep(list, 0.05f, 0.9f, 0.0f, true);
      else
        be->adamStep(list, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, step);
      for (size_t i = 0; i < list.size(); i += 2)
        ASSERT_EQ(bits16(*be, w16[i], list[i].n), reference16(*be, list[i].w, list[i].n, bf16))
            << precisionName(p) << " chunk " << i << " after step " << step;
    }
  }
  auto fp32 = makeCudaBackend({.device = 0, .precision = Precision::kFp32});
  Tensor w = onDevice(*fp32, {1.0f, 2.0f}), g = onDevice(*fp32, {0.5f, 0.5f});
  EXPECT_THROW(fp32->sgdStep({{w.data(), g.data(), nullptr, nullptr, w.data(), 2}}, 0.1f, 0.0f,
                             0.0f, true),
               InvalidArgument);
}

// The Optimizer's flat layout on device memory: bucketed device gradients,
// one chunk per bucket; the same values and state as the per-parameter
// optimizer, and 16-bit copies current after each step and after a refresh.
TEST(CudaOptim, FlatLayoutOnTheDevice) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  const std::vector<Shape> shapes = {{64, 3, 7, 7}, {64}, {10}, {128, 64, 3, 3}, {7, 5}};
  const std::vector<std::vector<size_t>> buckets = {{2, 4}, {3, 1, 0}};
  for (const Precision prec : {Precision::kFp32, Precision::kBf16}) {
    auto be = makeCudaBackend({.device = 0, .precision = prec});
    for (const std::string kind : {"sgd", "adam"}) {
      std::vector<Param> ref(shapes.size()), flat(shapes.size());
      for (size_t i = 0; i < shapes.size(); ++i) {
        const auto v = randomVector(static_cast<size_t>(numelOf(shapes[i])), 400 + i);
        std::string name = "p";  // (not "p" + ...: g++ 12 warns wrongly)
        name += std::to_string(i);
        for (std::vector<Param>* ps : {&ref, &flat}) {
          (*ps)[i].name = name;
          (*ps)[i].value = onDevice(*be, v, shapes[i]);
          (*ps)[i].grad = Tensor(shapes[i], be->allocator());
        }
      }
      std::vector<Tensor> storage;  // the buckets' gradient memory
      for (const auto& b : buckets) {
        int64_t n = 0;
        for (size_t i : b) n += numelOf(shapes[i]);
        storage.emplace_back(Shape{n}, be->allocator());
        int64_t off = 0;
        for (size_t i : b) {
          flat[i].grad = Tensor::view(storage.back().data() + off, shapes[i], Device::kCuda);
          off += numelOf(shapes[i]);
        }
      }
      std::vector<Param*> pr, pf;
      for (size_t i = 0; i < shapes.size(); ++i) {
        pr.push_back(&ref[i]);
        pf.push_back(&flat[i]);
      }
      auto ro = Optimizer::create({.kind = kind, .weightDecay = 1e-3f}, *be, pr);
      auto fo = Optimizer::create({.kind = kind, .weightDecay = 1e-3f}, *be, pf);
      const bool with16 = prec == Precision::kBf16;
      fo->adoptLayout(buckets, with16);
      for (int s = 0; s < 3; ++s) {
        for (size_t i = 0; i < shapes.size(); ++i) {
          const auto g = randomVector(static_cast<size_t>(numelOf(shapes[i])), 500 + 10 * s + i);
          be->upload(g.data(), ref[i].grad.data(), g.size());
          be->upload(g.data(), flat[i].grad.data(), g.size());
        }
        ro->step();
        fo->step();
      }
      for (size_t i = 0; i < shapes.size(); ++i)
        EXPECT_TRUE(sameBits(toHost(*be, ref[i].value), toHost(*be, flat[i].value)))
            << precisionName(prec) << " " << kind << " " << ref[i].name;
      auto sr = ro->state(), sf = fo->state();
      for (size_t k = 0; k < sr.size(); ++k)
        EXPECT_TRUE(sameBits(toHost(*be, *sr[k].second), toHost(*be, *sf[k].second)))
            << precisionName(prec) << " " << kind << " " << sr[k].first;
      if (!with16) {
        EXPECT_THROW(fo->adoptLayout(buckets, true), InvalidArgument);
        EXPECT_EQ(fo->weights16(0), nullptr);
        continue;
      }
      const size_t n0 = static_cast<size_t>(numelOf(shapes[0]));
      for (size_t i = 0; i < shapes.size(); ++i) {
        const size_t n = static_cast<size_t>(numelOf(shapes[i]));
        ASSERT_NE(fo->weights16(i), nullptr);
        EXPECT_EQ(bits16(*be, fo->weights16(i), n), reference16(*be, flat[i].value.data(), n, true))
            << kind << " " << flat[i].name;
      }
      // A load from outside (a checkpoint): stale until refreshed; the
      // refresh leaves the values' bits alone.
      const auto loaded = randomVector(n0, 600);
      be->upload(loaded.data(), flat[0].value.data(), n0);
      fo->refreshWeights16();
      EXPECT_EQ(bits16(*be, fo->weights16(0), n0),
                reference16(*be, flat[0].value.data(), n0, true));
      EXPECT_TRUE(sameBits(toHost(*be, flat[0].value), loaded));
    }
  }
}

// ------------------------------------------------- the gradient contract
// fresh: zero gradients plus a backward; then garbage with the flag set: the
// same values (== : cuBLASLt/cuDNN with beta 0 may give -0 where 0 + -0 gives
// +0), flags cleared; then no flag: twice the fresh gradient; then an empty
// batch: flagged gradients zero.
void checkContract(Backend& be, Layer& layer, const Shape& in, double tol) {
  for (Param* p : layer.params()) {
    const auto v = randomVector(static_cast<size_t>(p->value.numel()), 700, 0.5f, 1.5f);
    be.upload(v.data(), p->value.data(), v.size());
  }
  const Tensor x = onDevice(be, randomVector(static_cast<size_t>(numelOf(in)), 701), in);
  Tensor y, dx;
  layer.forward(x, y, true);
  const Tensor dy = onDevice(be, randomVector(static_cast<size_t>(y.numel()), 702), y.shape());
  const auto ps = layer.params();
  auto pass = [&] {
    layer.forward(x, y, true);
    layer.backward(x, y, dy, &dx);
  };
  for (Param* p : ps) be.zero(p->grad);
  pass();
  std::vector<std::vector<float>> fresh;
  for (Param* p : ps) fresh.push_back(toHost(be, p->grad));
  for (Param* p : ps) {
    const std::vector<float> nan(static_cast<size_t>(p->grad.numel()), kNaN);
    be.upload(nan.data(), p->grad.data(), nan.size());
    p->overwriteGrad = true;
  }
  pass();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(toHost(be, ps[i]->grad), fresh[i]) << layer.name() << " " << ps[i]->name;
    EXPECT_FALSE(ps[i]->overwriteGrad);
  }
  pass();
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto got = toHost(be, ps[i]->grad);
    for (size_t k = 0; k < got.size(); ++k)
      ASSERT_NEAR(got[k], 2.0f * fresh[i][k], tol * (1.0 + std::fabs(2.0f * fresh[i][k])))
          << ps[i]->name << "[" << k << "]";
  }
  Shape none = in, yNone = y.shape();
  none[0] = yNone[0] = 0;
  const Tensor x0(none, be.allocator()), dy0(yNone, be.allocator());
  for (Param* p : ps) {
    const std::vector<float> nan(static_cast<size_t>(p->grad.numel()), kNaN);
    be.upload(nan.data(), p->grad.data(), nan.size());
    p->overwriteGrad = true;
  }
  Tensor dx0;
  layer.backward(x0, y, dy0, &dx0);
  for (Param* p : ps) {
    EXPECT_EQ(toHost(be, p->grad), std::vector<float>(static_cast<size_t>(p->grad.numel()), 0.0f))
        << layer.name() << " " << p->name << ": an empty batch";
    EXPECT_FALSE(p->overwriteGrad);
  }
}

TEST(CudaGradContract, Linear) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  for (const Precision p : {Precision::kFp32, Precision::kBf16}) {
    auto be = makeCudaBackend({.device = 0, .precision = p});
    auto fc = be->linear("fc", 64, 32);
    checkContract(*be, *fc, {16, 64}, p == Precision::kFp32 ? 1e-6 : 1e-5);
  }
}

TEST(CudaGradContract, BatchNorm) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  auto be = makeCudaBackend({.device = 0, .precision = Precision::kFp32});
  auto bn = be->batchNorm2d("bn", 6, nullptr);
  checkContract(*be, *bn, {4, 6, 5, 3}, 1e-6);
  // Only one of the two flagged: cuDNN's one betaParamDiff cannot say so;
  // the flagged gradient is zeroed first.
  const Tensor x = onDevice(*be, randomVector(4 * 6 * 15, 800), {4, 6, 5, 3});
  const Tensor dy = onDevice(*be, randomVector(4 * 6 * 15, 801), {4, 6, 5, 3});
  Tensor y, dx;
  auto ps = bn->params();
  for (Param* p : ps) be->zero(p->grad);
  bn->forward(x, y, true);
  bn->backward(x, y, dy, &dx);
  const auto w1 = toHost(*be, ps[0]->grad), b1 = toHost(*be, ps[1]->grad);
  const std::vector<float> nan(6, kNaN);
  be->upload(nan.data(), ps[0]->grad.data(), 6);
  ps[0]->overwriteGrad = true;
  bn->forward(x, y, true);
  bn->backward(x, y, dy, &dx);
  EXPECT_EQ(toHost(*be, ps[0]->grad), w1);
  const auto b2 = toHost(*be, ps[1]->grad);
  for (size_t c = 0; c < 6; ++c) EXPECT_NEAR(b2[c], 2.0f * b1[c], 1e-5f * (1 + std::fabs(b1[c])));
  EXPECT_FALSE(ps[0]->overwriteGrad);
}

TEST(CudaGradContract, SyncBatchNormOneRank) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  testing::runRanks(1, [&](runtime::ProcessGroup& pg) {
    auto be = makeCudaBackend({.device = runtime::cudaSelectedDevice(),
                               .precision = Precision::kFp32});
    auto bn = be->batchNorm2d("bn", 5, &pg);
    checkContract(*be, *bn, {3, 5, 4, 4}, 1e-6);
  });
}

// --------------------------------------------- num_batches_tracked, shared
TEST(CudaBatchNormCounter, OneDeviceCounterPerModel) {
  DDPRUN_REQUIRE_GPU("CUDA optimizer");
  auto be = makeCudaBackend({.device = 0, .precision = Precision::kFp32});
  auto bn1 = be->batchNorm2d("bn1", 4, nullptr);
  auto bn2 = be->batchNorm2d("bn2", 4, nullptr);
  auto bn3 = be->batchNorm2d("layer1.0.bn1", 4, nullptr);
  const std::vector<Layer*> model = {bn1.get(), bn2.get(), bn3.get()};
  auto counter = [&](Layer& l) { return l.buffers()[2]; };
  for (Layer* l : model) {
    EXPECT_EQ(counter(*l)->value.data(), counter(*bn1)->value.data()) << l->name();
    EXPECT_TRUE(counter(*l)->isCount);
    EXPECT_EQ(counter(*l)->name, l->name() + ".num_batches_tracked");
  }
  const Tensor x = onDevice(*be, randomVector(2 * 4 * 9, 900), {2, 4, 3, 3});
  auto step = [&](bool training) {
    Tensor y;
    for (Layer* l : model) l->forward(x, y, training);
  };
  for (int s = 0; s < 3; ++s) step(true);
  step(false);  // evaluation does not count
  for (Layer* l : model) EXPECT_EQ(toHost(*be, counter(*l)->value), std::vector<float>{3.0f});
  // A checkpoint load writes each buffer: every batch norm then reads it.
  const float seven = 7.0f;
  for (Layer* l : model) be->upload(&seven, counter(*l)->value.data(), 1);
  step(true);
  for (Layer* l : model) EXPECT_EQ(toHost(*be, counter(*l)->value), std::vector<float>{8.0f});
  // A second model on the same backend (a name seen again) counts apart.
  auto other1 = be->batchNorm2d("bn1", 4, nullptr);
  auto other2 = be->batchNorm2d("bn2", 4, nullptr);
  EXPECT_NE(counter(*other1)->value.data(), counter(*bn1)->value.data());
  EXPECT_EQ(counter(*other2)->value.data(), counter(*other1)->value.data());
  Tensor y;
  other1->forward(x, y, true);
  other2->forward(x, y, true);
  EXPECT_EQ(toHost(*be, counter(*other1)->value), std::vector<float>{1.0f});
  EXPECT_EQ(toHost(*be, counter(*bn1)->value), std::vector<float>{8.0f});
  // A member training out of step with its leader would show a wrong count.
  bn2->forward(x, y, true);  // one ahead: a step whose leader runs later
  EXPECT_THROW(bn2->forward(x, y, true), InvalidArgument);
}

}  // namespace
}  // namespace ddprun::train
