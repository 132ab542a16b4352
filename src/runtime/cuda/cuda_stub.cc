// Built without CUDA: the API exists and says so.
#include "cuda_comm.h"
#include "ddprun/runtime/cuda.h"

namespace ddprun::runtime {

namespace {
[[noreturn]] void noCuda() {
  DDPRUN_THROW(InvalidArgument,
               "this ddprun runtime was built without CUDA (configure with -DDDPRUN_CUDA=ON)");
}
}  // namespace

bool cudaBuilt() { return false; }
void cudaBindThread() {}
int cudaDeviceCount() { return 0; }
int cudaSelectedDevice() { return 0; }
std::string cudaTransportName(ProcessGroup&) { return "none"; }
void* cudaAllocDevice(size_t) { noCuda(); }
void cudaFreeDevice(void*) {}
void cudaCopyToDevice(void*, const void*, size_t) { noCuda(); }
void cudaCopyToHost(void*, const void*, size_t) { noCuda(); }
void cudaCopyOnDevice(void*, const void*, size_t) { noCuda(); }
void cudaSynchronize() {}
double cudaNowSeconds() { return 0; }
std::unique_ptr<CudaComm> makeCudaComm(ProcessGroup&, Comm&, ShmComm*) { noCuda(); }
int ncclRuntimeVersion() { return 0; }
std::unique_ptr<internal::DeviceCollectives> internal::makeDeviceCollectives(ProcessGroup&) {
  noCuda();
}

}  // namespace ddprun::runtime
