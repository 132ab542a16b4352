// Runs ddprun::train's transforms and lr schedules on requests from
// tests/interop/test_transforms_vs_torchvision.py, which compares the answers
// with torchvision's and PyTorch's. One JSON request per stdin line, one JSON
// answer per stdout line; images travel as hex, CHW uint8; floats as hex of
// their little-endian float32 bytes (exact).
//
//   {"op":"pad_crop_flip","image":IMG,"pad":4,"top":1,"left":7,"flip":true} -> {"image":IMG}
//   {"op":"resized_crop","image":IMG,"top":..,"left":..,"h":..,"w":..,"out_h":..,"out_w":..}
//        -> {"image":IMG,"float":HEX}
//   {"op":"resize","image":IMG,"out_h":..,"out_w":..}                -> {"image":IMG}
//   {"op":"hflip","image":IMG}                                      -> {"image":IMG}
//   {"op":"normalize","image":IMG,"spec":"cifar10"}                   -> {"float":HEX}
//   {"op":"rrc_params","height":..,"width":..,"uniform":[..],"randint":[..],
//    "scale":[a,b],"ratio":[a,b]}  (recorded draws, used in order)   -> {"box":[i,j,h,w]}
//   {"op":"lr","spec":{...LrScheduleSpec fields...}}                 -> {"lr":[[..per step..],..]}
//   IMG = {"c":3,"h":32,"w":32,"hex":"..."}
// A bad request answers {"error": "..."} and the probe goes on.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "ddprun/common/error.h"
#include "ddprun/train/lr_schedule.h"
#include "ddprun/train/transforms.h"

using nlohmann::json;
namespace t = ddprun::train;

namespace {

std::string toHex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

std::vector<uint8_t> fromHex(const std::string& s) {
  auto nib = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    throw std::runtime_error("bad hex digit");
  };
  if (s.size() % 2) throw std::runtime_error("odd hex length");
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<uint8_t>(nib(s[2 * i]) << 4 | nib(s[2 * i + 1]));
  return out;
}

t::ImageU8 readImage(const json& j) {
  t::ImageU8 img;
  img.c = j.at("c");
  img.h = j.at("h");
  img.w = j.at("w");
  img.px = fromHex(j.at("hex"));
  if (img.px.size() != static_cast<size_t>(img.c) * img.h * img.w)
    throw std::runtime_error("image size does not match c*h*w");
  return img;
}

json imageJson(const t::ImageU8& img) {
  return {{"c", img.c}, {"h", img.h}, {"w", img.w}, {"hex", toHex(img.px.data(), img.px.size())}};
}

t::LrScheduleSpec readSpec(const json& j) {
  t::LrScheduleSpec s;
  s.baseLr = j.at("base_lr");
  s.kind = t::parseLrSchedule(j.at("kind").get<std::string>()).value();
  s.milestones = j.value("milestones", std::vector<int64_t>{});
  s.stepSize = j.value("step_size", int64_t{0});
  s.gamma = j.value("gamma", 0.1);
  s.warmupEpochs = j.value("warmup_epochs", int64_t{0});
  s.warmupStartFactor = j.value("warmup_start_factor", 0.01);
  s.epochs = j.at("epochs");
  s.stepsPerEpoch = j.at("steps_per_epoch");
  s.unit = t::parseLrStepUnit(j.at("unit").get<std::string>()).value();
  return s;
}

json handle(const json& req) {
  const std::string op = req.at("op");
  if (op == "pad_crop_flip") {
    const t::ImageU8 img = readImage(req.at("image"));
    t::CropFlipParams p{req.at("top"), req.at("left"), req.at("flip")};
    return {{"image", imageJson(t::padCropFlip(img.view(), req.at("pad"), p))}};
  }
  if (op == "resized_crop") {
    const t::ImageU8 img = readImage(req.at("image"));
    const t::CropBox box{req.at("top"), req.at("left"), req.at("h"), req.at("w")};
    const int oh = req.at("out_h"), ow = req.at("out_w");
    t::ImageU8 out(img.c, oh, ow);
    t::resizedCrop(img.view(), box, oh, ow, out.px.data());
    const std::vector<float> f = t::resizedCropFloat(img.view(), box, oh, ow);
    return {{"image", imageJson(out)}, {"float", toHex(f.data(), f.size() * sizeof(float))}};
  }
  if (op == "resize") {
    const t::ImageU8 img = readImage(req.at("image"));
    return {{"image", imageJson(t::resize(img.view(), req.at("out_h"), req.at("out_w")))}};
  }
  if (op == "hflip") return {{"image", imageJson(t::hflip(readImage(req.at("image")).view()))}};
  if (op == "normalize") {
    const t::ImageU8 img = readImage(req.at("image"));
    const t::NormalizeSpec spec = t::parseNormalize(req.at("spec"), img.c);
    std::vector<float> out(img.px.size());
    t::normalizeToFloat(img.view(), spec.mean, spec.std, out.data());
    return {{"float", toHex(out.data(), out.size() * sizeof(float))}};
  }
  if (op == "rrc_params") {
    const std::vector<float> u = req.at("uniform");
    const std::vector<int64_t> r = req.at("randint");
    size_t ui = 0, ri = 0;
    t::RrcDraws draws;
    draws.uniform = [&](float, float) {
      if (ui >= u.size()) throw std::runtime_error("ran out of uniform draws");
      return u[ui++];
    };
    draws.randint = [&](int64_t lo, int64_t hi) {
      if (ri >= r.size()) throw std::runtime_error("ran out of randint draws");
      const int64_t v = r[ri++];
      if (v < lo || v >= hi) throw std::runtime_error("recorded randint outside [lo, hi)");
      return v;
    };
    const std::array<double, 2> scale = req.at("scale"), ratio = req.at("ratio");
    const t::CropBox b =
        t::randomResizedCropParams(req.at("height"), req.at("width"), draws, scale, ratio);
    return {{"box", {b.top, b.left, b.height, b.width}},
            {"used", {ui, ri}}};
  }
  if (op == "lr") {
    const t::LrSchedule sched(readSpec(req.at("spec")));
    json epochs = json::array();
    for (int64_t e = 0; e < sched.spec().epochs; ++e) {
      json steps = json::array();
      for (int64_t s = 0; s < sched.spec().stepsPerEpoch; ++s) {
        const double lr = sched.lrAt(e, s);
        steps.push_back(toHex(&lr, sizeof lr));  // exact: little-endian float64
      }
      epochs.push_back(steps);
    }
    return {{"lr", epochs}, {"describe", sched.describe()}};
  }
  throw std::runtime_error("unknown op " + op);
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    json answer;
    try {
      answer = handle(json::parse(line));
    } catch (const std::exception& e) {
      answer = {{"error", e.what()}};
    }
    std::cout << answer.dump() << "\n" << std::flush;
  }
  return 0;
}
