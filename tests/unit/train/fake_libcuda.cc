// A stand-in for the NVIDIA driver's libcuda.so.1, for train_device_probe_test.py:
// the four calls train's probe makes before it loads any CUDA library, answering
// as the environment says (FAKE_CUDA_INIT: cuInit's result, 0 by default;
// FAKE_CUDA_COUNT: the number of GPUs, 0 by default). Nothing else: the test
// never lets train go past the probe with it.
#include <cstdlib>

namespace {
int fromEnv(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}
}  // namespace

extern "C" {
__attribute__((visibility("default"))) int cuInit(unsigned) {
  return fromEnv("FAKE_CUDA_INIT", 0);
}
__attribute__((visibility("default"))) int cuDeviceGetCount(int* n) {
  *n = fromEnv("FAKE_CUDA_COUNT", 0);
  return 0;
}
__attribute__((visibility("default"))) int cuGetErrorName(int e, const char** s) {
  *s = e == 34 ? "CUDA_ERROR_STUB_LIBRARY" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
__attribute__((visibility("default"))) int cuGetErrorString(int, const char** s) {
  *s = "fake driver";
  return 0;
}
}
