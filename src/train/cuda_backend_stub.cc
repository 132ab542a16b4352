// makeCudaBackend in a build without CUDA: says so.
#include "ddprun/common/error.h"
#include "ddprun/train/layers.h"

namespace ddprun::train {

std::unique_ptr<Backend> makeCudaBackend(const CudaBackendOptions&) {
  DDPRUN_THROW(InvalidArgument, "this train was built without CUDA (configure with "
               "-DDDPRUN_CUDA=ON on a machine with the CUDA toolkit); use --device cpu");
}

}  // namespace ddprun::train
