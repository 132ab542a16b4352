#pragma once

namespace ddprun {
inline constexpr const char* kVersion = "0.1.0";
}
