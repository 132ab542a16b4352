// Proves the CUDA toolchain compiles and links our code. Runs a kernel where
// a GPU is present; says plainly that it skipped where there is none.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

TEST(CudaSmoke, AxpyOnDevice) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    GTEST_SKIP() << "no CUDA GPU on this machine: CUDA kernel test skipped "
                    "(the code compiled and linked)";
  const int n = 1 << 20;
  std::vector<float> x(n, 2.0f), y(n, 1.0f);
  float *dx = nullptr, *dy = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, n * sizeof(float)), cudaSuccess);
  cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  axpy<<<(n + 255) / 256, 256>>>(3.0f, dx, dy, n);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  for (int i = 0; i < n; i += 4097) EXPECT_FLOAT_EQ(y[i], 7.0f);
}
