// Checkpoints in the safetensors format, so that PyTorch (or anything else
// that reads safetensors) loads our models, and a directory of them named by
// global step so that a restarted run resumes from the newest.
//
// File layout (https://github.com/huggingface/safetensors):
//   u64 little-endian N | N bytes of JSON header | tensor bytes
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets relative to the start of the tensor bytes) and may
// hold "__metadata__": {string: string}. Tensors are contiguous, without gaps
// or overlap, in offset order. As the reference writer does, we lay tensors
// out by dtype size (largest first) then name, so every tensor is aligned to
// its element size, and pad the header with spaces to a multiple of 8 bytes.
// Tensor bytes are little-endian (the host order: only little-endian hosts are
// supported).
//
// Writes are atomic: a reader sees either the old file or the whole new one,
// and after a crash at most a leftover "<name>.tmp.<pid>" (which the listing
// ignores). The loader checks every field before it trusts it; in particular
// the header length against the file size before allocating.
//
// Thread-safety: the functions keep no state; concurrent saves to the same
// path from different processes are safe (distinct temporary files, last
// rename wins), from threads of one process they are not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/common/error.h"

namespace ddprun::train {

// A malformed or unreadable checkpoint, a failed write, or tensors that
// cannot be saved. The message names the file and what is wrong.
class CheckpointError : public InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

// Bytes per element of a safetensors dtype: F64, I64 -> 8; F32, I32 -> 4;
// F16, BF16 -> 2; U8 -> 1. Throws CheckpointError for any other name.
size_t dtypeSize(const std::string& dtype);
bool isKnownDtype(const std::string& dtype);

// A tensor to save: borrowed bytes, prod(shape) * dtypeSize(dtype) of them
// (a scalar has an empty shape and one element). `data` may be null only when
// that product is zero, and must stay valid during saveSafetensors().
struct TensorView {
  std::string name;
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// A tensor read from a file; `bytes` holds exactly numel() * dtypeSize(dtype)
// bytes, allocated by operator new (so aligned for any dtype).
struct LoadedTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  size_t numel() const;  // product of shape; 1 for a scalar
};

struct SafeTensors {
  std::map<std::string, std::string> metadata;
  std::vector<LoadedTensor> tensors;  // in file (offset) order
  // The tensor called `name`, or nullptr.
  const LoadedTensor* find(const std::string& name) const;
};

// Writes `tensors` and `metadata` to `path` atomically: the bytes go to
// "<path>.tmp.<pid>" in the same directory, are fsync'ed and renamed over
// `path`, then the directory is fsync'ed. Names must be unique, non-empty and
// not "__metadata__"; dtypes known; dims >= 0. Throws CheckpointError (the
// temporary file is removed on failure).
void saveSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                     const std::map<std::string, std::string>& metadata);

// Reads and validates a whole file: header length within the file (and at
// most 100 MB, the reference limit) before allocating, the JSON, every dtype,
// shape * dtype size == offset span, offsets within the file, tensors
// contiguous from 0 to the end of the file. Throws CheckpointError.
SafeTensors loadSafetensors(const std::string& path);

// A checkpoint directory holds "ckpt-<global step, zero-padded to 9
// digits>.safetensors" files (more digits past 999999999).
std::string checkpointFileName(int64_t globalStep);  // globalStep >= 0
// The step in a checkpoint file name (no directory), or nullopt when the name
// is not one (e.g. a leftover "ckpt-000000010.safetensors.tmp.123").
std::optional<int64_t> checkpointStep(const std::string& fileName);
// Paths ("<dir>/<name>") of the checkpoints in `dir`, newest (highest step)
// first. A missing directory has none; an unreadable one throws
// CheckpointError.
std::vector<std::string> listCheckpoints(const std::string& dir);
// Removes all but the newest `keep` (>= 0) checkpoints in `dir`; other files
// are left alone. Throws CheckpointError when a removal fails.
void pruneCheckpoints(const std::string& dir, int keep);

}  // namespace ddprun::train
