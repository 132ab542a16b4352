#include "ddprun/train/precision.h"

namespace ddprun::train {

const char* precisionName(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kTf32: return "tf32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

std::optional<Precision> parsePrecision(const std::string& s) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16, Precision::kFp16})
    if (s == precisionName(p)) return p;
  return std::nullopt;
}

const char* deviceChoiceName(DeviceChoice d) {
  switch (d) {
    case DeviceChoice::kCpu: return "cpu";
    case DeviceChoice::kCuda: return "cuda";
    case DeviceChoice::kAuto: return "auto";
  }
  return "?";
}

std::optional<DeviceChoice> parseDeviceChoice(const std::string& s) {
  for (DeviceChoice d : {DeviceChoice::kCpu, DeviceChoice::kCuda, DeviceChoice::kAuto})
    if (s == deviceChoiceName(d)) return d;
  return std::nullopt;
}

const char* layoutName(Layout l) {
  switch (l) {
    case Layout::kAuto: return "auto";
    case Layout::kNhwc: return "nhwc";
    case Layout::kNchw: return "nchw";
  }
  return "?";
}

std::optional<Layout> parseLayout(const std::string& s) {
  for (Layout l : {Layout::kAuto, Layout::kNhwc, Layout::kNchw})
    if (s == layoutName(l)) return l;
  return std::nullopt;
}

}  // namespace ddprun::train
