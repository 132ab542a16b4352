// A test bound shared by the host and GPU checks of the NHWC batch norm:
// |got - want| <= rel * |want| + abs * max|want| per element, the first few
// violations reported. Header-only (tests include it by "train/...").
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace ddprun::testing {

inline void expectBounded(const std::vector<float>& got, const std::vector<double>& want,
                          double rel, double abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= rel * std::fabs(want[i]) + abs * scale) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i]
                    << " (scale " << scale << ")";
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " off";
}

}  // namespace ddprun::testing
