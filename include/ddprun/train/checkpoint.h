// Checkpoints in the safetensors format, so that PyTorch (or anything else
// that reads safetensors) loads our models. The directory of them, named by
// run and global step, is checkpoint_dir.h.
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
// ignores and the trainer removes at its next start, files.h). Only a regular
// file (or nothing) is ever replaced: a device node, FIFO or symbolic link at
// the target is refused. The loader checks every field before it trusts it; in particular
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

// A malformed or unreadable checkpoint, a target that may not be replaced, or
// tensors that cannot be saved: bad input (the trainer exits 2). The message
// names the file and what is wrong.
class CheckpointError : public InvalidArgument {
  using InvalidArgument::InvalidArgument;
};
// Writing failed at run time (disk full, I/O error, rename refused): not bad
// input (the trainer exits 1). The message names the file and the errno text.
class CheckpointWriteError : public IoError {
  using IoError::IoError;
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
// not "__metadata__"; dtypes known; dims >= 0; `path` absent or a regular file
// (else CheckpointError). Throws CheckpointError for those, CheckpointWriteError
// when writing fails (the temporary file is removed on failure).
void saveSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                     const std::map<std::string, std::string>& metadata);

// Reads and validates a whole file (a regular file: a FIFO is refused, never
// waited on): header length within the file (and at
// most 100 MB, the reference limit) before allocating, the JSON, every dtype,
// shape * dtype size == offset span, offsets within the file, tensors
// contiguous from 0 to the end of the file. Throws CheckpointError.
SafeTensors loadSafetensors(const std::string& path);

}  // namespace ddprun::train
