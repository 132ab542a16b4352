// Joins the group from the environment (one rank when launched bare) and
// all-reduces a vector; prints the result so the test can check it.
#include <cstdio>
#include <vector>

#include "ddprun/runtime/collectives.h"

int main() {
  auto pg = ddprun::runtime::ProcessGroup::fromEnv();
  std::vector<double> v{1.0 + pg->rank(), 2.0};
  ddprun::runtime::AllReduceOptions o;
  o.output = v.data();
  o.count = v.size();
  o.dtype = ddprun::runtime::DType::kFloat64;
  allReduce(*pg, o);
  std::printf("rank %d of %d: %g %g\n", pg->rank(), pg->size(), v[0], v[1]);
  return 0;
}
