#include "comm.h"

namespace ddprun::runtime {

Partition::Partition(size_t count, int parts) : offsets(parts + 1) {
  const size_t base = count / parts, extra = count % parts;
  offsets[0] = 0;
  for (int i = 0; i < parts; ++i)
    offsets[i + 1] = offsets[i] + base + (static_cast<size_t>(i) < extra ? 1 : 0);
}

std::vector<size_t> prefixOffsets(const std::vector<size_t>& bytes) {
  std::vector<size_t> off(bytes.size() + 1, 0);
  for (size_t i = 0; i < bytes.size(); ++i) off[i + 1] = off[i] + bytes[i];
  return off;
}

}  // namespace ddprun::runtime
