// cudnn_fusion_probe: which of cuDNN's runtime-fusion patterns this device's
// cuDNN supports for ResNet-18's layers (src/train/cuda/cudnn_fusion.h:
// scale_bias_relu_conv_genstats, bn_finalize, dgrad_drelu_dbn_weights), per
// activation type (tf32: float tensors, tensor-core engines allowed; bf16),
// so that a fused path is built only where cuDNN has one (issue 44 item 7):
//
//   cudnn_fusion_probe [--batch 128] [--dtypes tf32,bf16] [--out FILE]
//
// For each pattern, type and layer: whether the operation graph builds, how
// many engines the heuristics name, and whether one of them finalizes an
// execution plan (the first that does, with its numerical notes and
// workspace). Nothing is executed or timed: timing comes with a path built
// on a supported pattern, against our kernels.
//
// Prints a table; --out writes the rows as JSON. Exit status: 0 probed on a
// device, 2 bad flags (CLI11's message), 3 a CUDA or cuDNN error, 77 no CUDA
// device: the graphs and heuristics are built and written all the same
// (cuDNN builds them without one), no plan is tried.
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda/cudnn_fusion.h"
#include "cuda/resources.h"
#include "ddprun/common/main_guard.h"

namespace {

namespace tc = ddprun::train::cuda;
namespace kmath = ddprun::train::kmath;

struct Layer {
  const char* name;
  int64_t c, side;  // a 3x3, stride 1 convolution c -> c at side x side
};
constexpr Layer kLayers[] = {{"layer1", 64, 56}, {"layer2", 128, 28}, {"layer3", 256, 14},
                             {"layer4", 512, 7}};

std::string notes(const tc::GraphEngine& e) {
  const tc::EngineTraits t = tc::traitsOf(e.notes);
  std::string s;
  if (t.tensorCore) s += "tensor-core ";
  if (t.downConvertsInputs) s += "down-converts ";
  if (t.reducedReduction) s += "reduced-reduction ";
  if (t.nondeterministic) s += "nondeterministic ";
  if (!s.empty()) s.pop_back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  ddprun::ignoreSigpipe();
  CLI::App app{"cuDNN's runtime-fusion patterns on ResNet-18's layers: supported or not"};
  int64_t batch = 128;
  std::vector<std::string> dtypes{"tf32", "bf16"};
  std::string out;
  app.add_option("--batch", batch, "batch size")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--dtypes", dtypes, "activation types: tf32 (float tensors), bf16, fp16")
      ->delimiter(',')
      ->check(CLI::IsMember({"tf32", "bf16", "fp16"}));
  app.add_option("--out", out, "also write the rows as JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  int devices = 0;
  const bool device = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  (void)cudaGetLastError();
  try {
    tc::CudnnHandle handle;
    std::string deviceName = "none";
    if (device) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) deviceName = prop.name;
      handle = tc::CudnnHandle::create();
    }
    const size_t v = cudnnGetVersion();
    nlohmann::json doc = {{"device", deviceName},
                          {"cudnn", v},
                          {"batch", batch},
                          {"rows", nlohmann::json::array()}};
    std::printf("%s, cuDNN %zu, batch %lld\n", deviceName.c_str(), v,
                static_cast<long long>(batch));
    for (const tc::FusionPattern pat : tc::kFusionPatterns)
      for (const std::string& dt : dtypes)
        for (const Layer& l : kLayers) {
          const cudnnDataType_t t = dt == "bf16"   ? CUDNN_DATA_BFLOAT16
                                    : dt == "fp16" ? CUDNN_DATA_HALF
                                                   : CUDNN_DATA_FLOAT;
          const tc::FusionProblem p{pat, kmath::convGeom(batch, l.c, l.side, l.side, l.c, 3, 1, 1),
                                    t};
          const tc::FusionSupport r = tc::probeFusion(handle.get(), p);
          nlohmann::json row = {{"pattern", tc::fusionPatternName(pat)},
                                {"dtype", dt},
                                {"layer", l.name},
                                {"c", l.c},
                                {"side", l.side},
                                {"graph_built", r.graphBuilt},
                                {"engines", r.engines},
                                {"supported", r.supported}};
          if (!r.graphBuilt) row["graph_why"] = r.graphWhy;
          if (r.supported) {
            row["engine"] = r.engine.name();
            row["notes"] = notes(r.engine);
            row["workspace_bytes"] = r.workspace;
          } else if (r.graphBuilt) {
            row["plan_why"] = r.planWhy;
          }
          std::printf("%-30s %-5s %-7s graph %-3s engines %3d  %s\n", tc::fusionPatternName(pat),
                      dt.c_str(), l.name, r.graphBuilt ? "yes" : "no", r.engines,
                      r.supported ? ("supported: " + r.engine.name() + " " + notes(r.engine)).c_str()
                      : r.graphBuilt ? ("no plan: " + r.planWhy).c_str()
                                     : ("graph: " + r.graphWhy).c_str());
          doc["rows"].push_back(row);
        }
    if (!out.empty()) std::ofstream(out) << doc.dump(1) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cudnn_fusion_probe: %s\n", e.what());
    return 3;
  }
  if (!device) {
    std::fprintf(stderr,
                 "cudnn_fusion_probe: no CUDA device: graphs and heuristics built, no plan tried\n");
    return 77;
  }
  return 0;
}
