// The process group's internals that the collectives, the transports and the
// runtime's own tests need, kept out of the public process_group.h so that a
// user's program cannot reach them. Internal header.
//
// Thread-safety: enqueue() and run() may be called from any thread (they are
// what the collectives call); comm() and cudaComm() are valid only inside an
// operation (on the group's thread, or inline in run()).
#pragma once

#include <functional>
#include <string>

#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

class Comm;
class CudaComm;

namespace internal {

// The transport objects (valid on the group's thread).
Comm& comm(ProcessGroup& pg);
CudaComm& cudaComm(ProcessGroup& pg);  // created on first use

// Runs `fn` after everything issued before it. Used by the collectives;
// `name` appears in error messages. enqueue() always hands it to the
// group's thread; run() with inlineOk executes it on the calling thread
// when nothing is queued or running (blocking calls: no thread hand-off,
// which is most of a small collective's latency).
Work enqueue(ProcessGroup& pg, std::string name, std::function<void()> fn);
Work run(ProcessGroup& pg, std::string name, std::function<void()> fn, bool inlineOk);

// Explains a failure: asks the store which ranks are still answering and
// returns a sentence naming the ones that are not.
std::string diagnose(ProcessGroup& pg, const std::string& what, int suspect);

}  // namespace internal
}  // namespace ddprun::runtime
