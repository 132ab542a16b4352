// The trainer's device flags as values: --device (which backend),
// --precision (the arithmetic of the device's compute) and --layout (how
// CUDA keeps activations). train_config parses the spellings once;
// everything after it takes these enums.
// Thread-safety: constants and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ddprun::train {

// Arithmetic of the device's compute: fp32; tf32 (tensor-core inputs rounded
// to 10-bit mantissas, fp32 accumulate); bf16/fp16 (autocast: convolutions and
// matrix products take 16-bit inputs, everything else and the master weights
// stay fp32). The CPU backend computes fp32 only.
enum class Precision : uint8_t { kFp32, kTf32, kBf16, kFp16 };
// "fp32" | "tf32" | "bf16" | "fp16": the flag's spelling.
const char* precisionName(Precision p);
// The spelling's value; nullopt for anything else (the caller names the
// accepted values: kPrecisionChoices).
std::optional<Precision> parsePrecision(const std::string& s);
inline constexpr const char* kPrecisionChoices = "fp32, tf32, bf16, fp16";

// --device: the CPU, CUDA, or CUDA when a GPU is visible (backend_choice.h
// decides against the machine).
enum class DeviceChoice : uint8_t { kCpu, kCuda, kAuto };
// "cpu" | "cuda" | "auto".
const char* deviceChoiceName(DeviceChoice d);
std::optional<DeviceChoice> parseDeviceChoice(const std::string& s);
inline constexpr const char* kDeviceChoices = "cpu, cuda, auto";

// --layout: CUDA's activations NHWC (channels_last) or NCHW in memory, or
// auto, which picks by precision (nhwcLayout(), backend_choice.h). The CPU
// computes NCHW whatever it says.
enum class Layout : uint8_t { kAuto, kNhwc, kNchw };
// "auto" | "nhwc" | "nchw".
const char* layoutName(Layout l);
std::optional<Layout> parseLayout(const std::string& s);
inline constexpr const char* kLayoutChoices = "auto, nhwc, nchw";

}  // namespace ddprun::train
