// libddprun_kernel_trace.so: a kernel-level summary of one profiled range of
// any CUDA program, ours or PyTorch, through CUPTI.
//
//   CUDA_INJECTION64_PATH=build/bin/libddprun_kernel_trace.so
//   DDPRUN_KERNEL_TRACE_OUT=/tmp/trace_%p.json   (both in the program's environment)
//
// The CUDA driver loads the library named by CUDA_INJECTION64_PATH when the
// program initialises CUDA and calls its InitializeInjection(). The tracer
// then listens to the CUDA runtime's cudaProfilerStart and cudaProfilerStop
// only: between the first start and the stop after it, CUPTI records every
// kernel (concurrent kernel activity), memcpy and memset with its GPU start
// and end. At the stop it stops recording, flushes the records and writes a
// JSON summary (kernel_trace_summary.h: counts, kernel time, the GPU's busy
// time, the span, the top kernels) to DDPRUN_KERNEL_TRACE_OUT, "%p" replaced
// by the process id (default ./ddprun_kernel_trace_%p.json). At exit it
// flushes once more (forced) and writes the file again if records that were
// still in flight at the stop arrived, or if no stop came ("range": "exit"),
// or if no start came at all ("range": "none", nothing recorded).
//
// It must never break the program it traces: every CUPTI failure is printed
// on stderr, recorded in the JSON's "errors" and tracing goes on without the
// failed part; nothing here throws out of a callback, and the entry point
// always reports success to the driver.
//
// Threads: the start/stop callbacks run on the program's thread, the buffer
// callbacks on CUPTI's; stateMu orders starts, stops and the exit, dataMu
// guards the records. No CUPTI call is made while dataMu is held (a flush
// calls bufferCompleted on the calling thread).
#include <cupti.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>

#include "kernel_trace_summary.h"

namespace {

using ddprun::bench::TraceMeta;
using ddprun::bench::TraceSummary;

constexpr size_t kBufferBytes = size_t{8} << 20;  // per CUPTI activity buffer
constexpr size_t kBufferAlign = 8;                // CUPTI's required alignment
constexpr const char* kDefaultOut = "ddprun_kernel_trace_%p.json";

enum class State { kIdle, kTracing, kStopped };

struct Tracer {
  std::mutex stateMu;
  State state = State::kIdle;
  bool wroteAtStop = false;
  uint64_t recordsWritten = 0;
  std::string outPattern = kDefaultOut;
  CUpti_SubscriberHandle subscriber = nullptr;

  std::mutex dataMu;  // guards everything below
  TraceSummary summary;
  TraceMeta meta;
};

// Never destroyed: CUPTI's thread and the exit handler may use it after
// static destructors have run.
Tracer& tracer() {
  static Tracer* t = new Tracer;
  return *t;
}

void noteError(const std::string& msg) {
  std::fprintf(stderr, "ddprun_kernel_trace: %s\n", msg.c_str());
  Tracer& t = tracer();
  std::lock_guard<std::mutex> lk(t.dataMu);
  t.meta.errors.push_back(msg);
}

bool cuptiOk(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* s = nullptr;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS) s = nullptr;
  noteError(std::string(what) + " failed: " + (s ? s : "unknown CUPTI error") + " (" +
            std::to_string(static_cast<int>(r)) + ")");
  return false;
}

void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* maxNumRecords) {
  *maxNumRecords = 0;  // as many as fit
  void* p = nullptr;
  if (posix_memalign(&p, kBufferAlign, kBufferBytes) != 0) p = nullptr;
  *buffer = static_cast<uint8_t*>(p);
  *size =
      p != nullptr ? kBufferBytes : 0;  // no buffer: CUPTI drops and counts the records
}

// One record into the summary (dataMu held).
void take(TraceSummary& s, const CUpti_Activity* rec) {
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      s.addKernel(k->name != nullptr ? k->name : "<unnamed>", k->start, k->end);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      s.addMemcpy(m->start, m->end, m->bytes);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      s.addMemset(m->start, m->end, m->bytes);
      break;
    }
    default:
      break;
  }
}

void CUPTIAPI bufferCompleted(CUcontext ctx, uint32_t streamId, uint8_t* buffer, size_t,
                              size_t validSize) {
  try {
    Tracer& t = tracer();
    std::string error;
    {
      std::lock_guard<std::mutex> lk(t.dataMu);
      CUpti_Activity* rec = nullptr;
      for (;;) {
        const CUptiResult r = cuptiActivityGetNextRecord(buffer, validSize, &rec);
        if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // the end of the buffer
        if (r != CUPTI_SUCCESS) {
          error = "cuptiActivityGetNextRecord returned " +
                  std::to_string(static_cast<int>(r));
          break;
        }
        take(t.summary, rec);
      }
    }
    if (!error.empty()) noteError(error);
    size_t dropped = 0;
    if (cuptiOk(cuptiActivityGetNumDroppedRecords(ctx, streamId, &dropped),
                "cuptiActivityGetNumDroppedRecords") &&
        dropped > 0) {
      std::lock_guard<std::mutex> lk(t.dataMu);
      t.meta.droppedRecords += dropped;
    }
  } catch (...) {
    std::fprintf(stderr,
                 "ddprun_kernel_trace: an error while reading an activity buffer\n");
  }
  std::free(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

void enableActivities(bool on) {
  for (CUpti_ActivityKind k : kKinds) {
    const std::string what =
        std::string(on ? "cuptiActivityEnable(" : "cuptiActivityDisable(") +
        std::to_string(static_cast<int>(k)) + ")";
    cuptiOk(on ? cuptiActivityEnable(k) : cuptiActivityDisable(k), what.c_str());
  }
}

// Writes the summary (atomically: a temporary file, then a rename).
void writeJson(const std::string& range, bool atExit) {
  Tracer& t = tracer();
  std::string json;
  {
    std::lock_guard<std::mutex> lk(t.dataMu);
    t.meta.pid = static_cast<long>(getpid());
    t.meta.range = range;
    t.meta.flushedAtExit = t.meta.flushedAtExit || atExit;
    json = t.summary.toJson(t.meta);
    t.recordsWritten = t.summary.records();
  }
  const std::string path =
      ddprun::bench::expandPid(t.outPattern, static_cast<long>(getpid()));
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "ddprun_kernel_trace: cannot write %s\n", tmp.c_str());
    return;
  }
  const bool written = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (std::fclose(f) != 0 || !written || std::rename(tmp.c_str(), path.c_str()) != 0)
    std::fprintf(stderr, "ddprun_kernel_trace: writing %s failed\n", path.c_str());
}

void startRange() {
  Tracer& t = tracer();
  std::lock_guard<std::mutex> lk(t.stateMu);
  if (t.state != State::kIdle) {
    std::lock_guard<std::mutex> dl(t.dataMu);
    ++t.meta.rangesIgnored;  // only the first range is traced
    return;
  }
  t.state = State::kTracing;
  {
    std::lock_guard<std::mutex> dl(t.dataMu);
    ++t.meta.rangesStarted;
  }
  enableActivities(true);
}

void stopRange() {
  Tracer& t = tracer();
  std::lock_guard<std::mutex> lk(t.stateMu);
  if (t.state != State::kTracing) return;
  t.state = State::kStopped;
  enableActivities(false);
  // Delivers the buffers whose records are complete; kernels still running
  // (the program did not synchronise before the stop) come at exit.
  cuptiOk(cuptiActivityFlushAll(0), "cuptiActivityFlushAll");
  writeJson("stop", false);
  t.wroteAtStop = true;
}

void atExit() {
  try {
    Tracer& t = tracer();
    std::lock_guard<std::mutex> lk(t.stateMu);
    if (t.state == State::kTracing) enableActivities(false);
    if (t.state != State::kIdle)
      cuptiOk(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED),
              "cuptiActivityFlushAll(forced)");
    uint64_t records = 0;
    {
      std::lock_guard<std::mutex> dl(t.dataMu);
      records = t.summary.records();
    }
    if (t.state == State::kTracing)
      writeJson("exit", true);
    else if (t.state == State::kIdle)
      writeJson("none", false);
    else if (!t.wroteAtStop || records != t.recordsWritten)
      writeJson("stop", true);
  } catch (...) {
    std::fprintf(stderr, "ddprun_kernel_trace: an error at exit\n");
  }
}

void CUPTIAPI onRuntimeApi(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                           const void* data) {
  try {
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API || data == nullptr) return;
    const auto* info = static_cast<const CUpti_CallbackData*>(data);
    if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 &&
        info->callbackSite == CUPTI_API_ENTER)
      startRange();
    else if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 &&
             info->callbackSite == CUPTI_API_EXIT)
      stopRange();
  } catch (...) {
    std::fprintf(stderr, "ddprun_kernel_trace: an error in the profiler callback\n");
  }
}

void initialize() {
  Tracer& t = tracer();
  if (const char* out = std::getenv("DDPRUN_KERNEL_TRACE_OUT");
      out != nullptr && *out != '\0')
    t.outPattern = out;
  else
    std::fprintf(stderr,
                 "ddprun_kernel_trace: DDPRUN_KERNEL_TRACE_OUT is not set; writing %s\n",
                 kDefaultOut);
  uint32_t version = 0;
  if (cuptiOk(cuptiGetVersion(&version), "cuptiGetVersion")) {
    std::lock_guard<std::mutex> lk(t.dataMu);
    t.meta.cuptiApiVersion = version;
  }
  cuptiOk(cuptiActivityRegisterCallbacks(bufferRequested, bufferCompleted),
          "cuptiActivityRegisterCallbacks");
  if (cuptiOk(cuptiSubscribe(&t.subscriber, onRuntimeApi, nullptr), "cuptiSubscribe")) {
    cuptiOk(cuptiEnableCallback(1, t.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000),
            "cuptiEnableCallback(cudaProfilerStart)");
    cuptiOk(cuptiEnableCallback(1, t.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000),
            "cuptiEnableCallback(cudaProfilerStop)");
  }
  if (std::atexit(atExit) != 0) noteError("atexit() refused the exit handler");
}

}  // namespace

// The entry point the CUDA driver looks up (by this name, with default
// visibility) in the library CUDA_INJECTION64_PATH names. Returns 1
// (success) whatever happened: a tracer that failed must not stop the program.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::once_flag once;
  try {
    std::call_once(once, initialize);
  } catch (...) {
    std::fprintf(stderr, "ddprun_kernel_trace: initialisation failed; not tracing\n");
  }
  return 1;
}
