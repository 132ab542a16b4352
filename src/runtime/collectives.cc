#include "ddprun/runtime/collectives.h"

#include <numeric>
#include <sstream>

#include "comm.h"
#include "cuda/cuda_comm.h"
#include "pg_internal.h"

namespace ddprun::runtime {

namespace {
Comm& commFor(ProcessGroup& pg, Device d) {
  if (d == Device::kCpu) return internal::comm(pg);
  cudaBindThread();  // inline operations run on the caller's thread
  return internal::cudaComm(pg);
}

struct Op {
  std::string name;
  std::function<void()> fn;
};

std::string label(const char* op, size_t count, DType t, Device d) {
  std::ostringstream os;
  os << op << "(" << count << " x " << dtypeName(t) << " on " << deviceName(d) << ")";
  return os.str();
}

void checkBuffer(const void* p, size_t count, const char* what) {
  DDPRUN_CHECK(p != nullptr || count == 0, what, " is null but count is ", count);
}
}  // namespace

static Op prepare_allReduce(ProcessGroup& pg, const AllReduceOptions& o) {
  checkBuffer(o.output, o.count, "AllReduceOptions::output");
  const AllReduceOptions c = o;
  return Op{label("allReduce", o.count, o.dtype, o.device), [&pg, c] {
    commFor(pg, c.device).allReduce(c.input ? c.input : c.output, c.output, c.count, c.dtype,
                                    c.op);
  }};
}

static Op prepare_broadcast(ProcessGroup& pg, const BroadcastOptions& o) {
  checkBuffer(o.buffer, o.count, "BroadcastOptions::buffer");
  DDPRUN_CHECK(o.root >= 0 && o.root < pg.size(), "broadcast root ", o.root,
               " is not a rank of this group of ", pg.size());
  const BroadcastOptions c = o;
  return Op{label("broadcast", o.count, o.dtype, o.device), [&pg, c] {
    commFor(pg, c.device).broadcast(c.buffer, c.count * dtypeSize(c.dtype), c.root);
  }};
}

static Op prepare_allGather(ProcessGroup& pg, const AllGatherOptions& o) {
  std::vector<size_t> counts = o.counts;
  if (counts.empty()) counts.assign(pg.size(), o.count);
  DDPRUN_CHECK(static_cast<int>(counts.size()) == pg.size(), "AllGatherOptions::counts has ",
               counts.size(), " entries for a group of ", pg.size());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  checkBuffer(o.output, total, "AllGatherOptions::output");
  size_t before = 0;
  for (int r = 0; r < pg.rank(); ++r) before += counts[r];
  const size_t es = dtypeSize(o.dtype);
  const void* in = o.input ? o.input : static_cast<const char*>(o.output) + before * es;
  checkBuffer(in, counts[pg.rank()], "AllGatherOptions::input");
  std::vector<size_t> bytes(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * es;
  const Device dev = o.device;
  void* out = o.output;
  return Op{label("allGather", total, o.dtype, o.device),
                    [&pg, in, out, bytes = std::move(bytes), dev] {
                      commFor(pg, dev).allGather(in, out, bytes);
                    }};
}

static Op prepare_reduceScatter(ProcessGroup& pg, const ReduceScatterOptions& o) {
  checkBuffer(o.input, o.count, "ReduceScatterOptions::input");
  checkBuffer(o.output, o.count, "ReduceScatterOptions::output");
  const ReduceScatterOptions c = o;
  return Op{label("reduceScatter", o.count, o.dtype, o.device), [&pg, c] {
    commFor(pg, c.device).reduceScatter(c.input, c.output, c.count, c.dtype, c.op);
  }};
}

Work barrierAsync(ProcessGroup& pg, const BarrierOptions&) {
  return internal::enqueue(pg, "barrier", [&pg] { internal::comm(pg).barrier(); });
}
void barrier(ProcessGroup& pg, const BarrierOptions&) {
  internal::run(pg, "barrier", [&pg] { internal::comm(pg).barrier(); }, true).wait();
}


namespace {
// Async: the group's thread runs it. Blocking: run inline when the group is idle.
template <typename Options>
Work submit(ProcessGroup& pg, Op (*prepare)(ProcessGroup&, const Options&), const Options& o,
            bool blocking) {
  Op op = prepare(pg, o);
  return blocking ? internal::run(pg, std::move(op.name), std::move(op.fn), true)
                  : internal::enqueue(pg, std::move(op.name), std::move(op.fn));
}
}  // namespace

Work allReduceAsync(ProcessGroup& pg, const AllReduceOptions& o) {
  return submit(pg, prepare_allReduce, o, false);
}
void allReduce(ProcessGroup& pg, const AllReduceOptions& o) {
  submit(pg, prepare_allReduce, o, true).wait();
}
Work broadcastAsync(ProcessGroup& pg, const BroadcastOptions& o) {
  return submit(pg, prepare_broadcast, o, false);
}
void broadcast(ProcessGroup& pg, const BroadcastOptions& o) {
  submit(pg, prepare_broadcast, o, true).wait();
}
Work allGatherAsync(ProcessGroup& pg, const AllGatherOptions& o) {
  return submit(pg, prepare_allGather, o, false);
}
void allGather(ProcessGroup& pg, const AllGatherOptions& o) {
  submit(pg, prepare_allGather, o, true).wait();
}
Work reduceScatterAsync(ProcessGroup& pg, const ReduceScatterOptions& o) {
  return submit(pg, prepare_reduceScatter, o, false);
}
void reduceScatter(ProcessGroup& pg, const ReduceScatterOptions& o) {
  submit(pg, prepare_reduceScatter, o, true).wait();
}

}  // namespace ddprun::runtime
