#include "ddprun/train/checkpoint.h"

#include "ddprun/train/files.h"

#include "ddprun/common/fd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

namespace ddprun::train {

static_assert(
    std::endian::native == std::endian::little,
    "safetensors stores little-endian bytes; only little-endian hosts are supported");

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, and
// the check comes before the header is read into memory.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  DDPRUN_THROW(CheckpointError, path, ": ", what);
}

// A write failure at run time (exit 1, not bad input).
[[noreturn]] void failWrite(const std::string& path, const std::string& what) {
  DDPRUN_THROW(CheckpointWriteError, path, ": ", what);
}

std::string errnoText() { return std::strerror(errno); }

// `a * b` into *out unless it overflows uint64.
bool mulChecked(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// ---- writing ----------------------------------------------------------------

// A tensor to write and where its bytes go in the data section.
struct Placed {
  const TensorView* view;
  uint64_t bytes;
  uint64_t begin = 0;
  uint64_t end() const { return begin + bytes; }
};

uint64_t viewBytes(const std::string& path, const TensorView& t) {
  if (!isKnownDtype(t.dtype))
    fail(path, "tensor '" + t.name + "' has unknown dtype '" + t.dtype + "'");
  uint64_t bytes = dtypeSize(t.dtype);
  for (int64_t d : t.shape) {
    if (d < 0) fail(path, "tensor '" + t.name + "' has a negative dimension");
    if (!mulChecked(bytes, static_cast<uint64_t>(d), &bytes))
      fail(path, "tensor '" + t.name + "' is too large");
  }
  if (bytes > 0 && t.data == nullptr) fail(path, "tensor '" + t.name + "' has no data");
  return bytes;
}

// Validates the views and lays them out as the reference writer does: by
// dtype size, largest first, then by name; so each is aligned to its element
// size once the header is padded to 8 bytes.
std::vector<Placed> planLayout(const std::string& path,
                               const std::vector<TensorView>& tensors) {
  std::vector<Placed> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey)
      fail(path, "invalid tensor name '" + t.name + "'");
    order.push_back({&t, viewBytes(path, t)});
  }
  std::sort(order.begin(), order.end(), [](const Placed& a, const Placed& b) {
    size_t sa = dtypeSize(a.view->dtype), sb = dtypeSize(b.view->dtype);
    return sa != sb ? sa > sb : a.view->name < b.view->name;
  });
  uint64_t offset = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && order[i].view->name == order[i - 1].view->name)
      fail(path, "tensor name '" + order[i].view->name + "' appears twice");
    if (offset + order[i].bytes < offset) fail(path, "tensors are too large");
    order[i].begin = offset;
    offset += order[i].bytes;
  }
  return order;
}

// The 8-byte length prefix plus the JSON header padded with spaces to a
// multiple of 8 bytes. Keys in the reference's order: metadata, then tensors
// by offset.
std::string buildHeader(const std::string& path, const std::vector<Placed>& layout,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h[kMetadataKey] = metadata;
  for (const auto& p : layout) {
    h[p.view->name] = {{"dtype", p.view->dtype},
                       {"shape", p.view->shape},
                       {"data_offsets", {p.begin, p.end()}}};
  }
  std::string json;
  try {
    json = h.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(path,
         std::string("cannot encode the header (names and metadata must be UTF-8): ") +
             e.what());
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  uint64_t n = json.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + json;
}

void writeOrFail(const std::string& path, int fd, const void* data, uint64_t n) {
  if (!writeAll(fd, data, n)) failWrite(path, "write failed: " + errnoText());
}

void fsyncDirectoryOf(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0)
    failWrite(path, "cannot fsync directory " + dir + ": " + errnoText());
}

void writeTemp(const std::string& tmp, const std::string& header,
               const std::vector<Placed>& layout) {
  // A leftover of an earlier process with our pid is ours to replace; the
  // new file is created exclusively and never through a symbolic link.
  ::unlink(tmp.c_str());
  UniqueFd fd(
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (fd.get() < 0) failWrite(tmp, "cannot create: " + errnoText());
  writeOrFail(tmp, fd.get(), header.data(), header.size());
  for (const auto& p : layout) writeOrFail(tmp, fd.get(), p.view->data, p.bytes);
  if (::fsync(fd.get()) != 0) failWrite(tmp, "fsync failed: " + errnoText());
  if (!fd.close()) failWrite(tmp, "close failed: " + errnoText());
}

// ---- reading ----------------------------------------------------------------

void readAt(const std::string& path, int fd, void* dst, uint64_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<uint64_t>(n, uint64_t{1} << 30),
                        static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(path, "read failed: " + errnoText());
    if (r == 0) fail(path, "truncated while reading (file shrank?)");
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

// A non-negative JSON integer, or fail.
uint64_t jsonIndex(const std::string& path, const std::string& what, const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<uint64_t>();
  fail(path, what + " must be a non-negative integer, got " + v.dump());
}

struct Entry {
  LoadedTensor tensor;
  uint64_t begin = 0, end = 0;
};

Entry parseEntry(const std::string& path, const std::string& name, const Json& v) {
  const std::string where = "tensor '" + name + "'";
  if (!v.is_object()) fail(path, where + " is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail(path, where + " has no \"" + key + "\"");
  Entry e;
  e.tensor.name = name;
  const Json& dtype = v["dtype"];
  if (!dtype.is_string() || !isKnownDtype(dtype.get<std::string>()))
    fail(path, where + " has unknown dtype " + dtype.dump());
  e.tensor.dtype = dtype.get<std::string>();
  const Json& shape = v["shape"];
  if (!shape.is_array()) fail(path, where + ": \"shape\" is not an array");
  uint64_t bytes = dtypeSize(e.tensor.dtype);
  for (const Json& d : shape) {
    uint64_t dim = jsonIndex(path, where + ": a dimension", d);
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        !mulChecked(bytes, dim, &bytes))
      fail(path, where + ": shape " + shape.dump() + " is too large");
    e.tensor.shape.push_back(static_cast<int64_t>(dim));
  }
  const Json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail(path, where + ": \"data_offsets\" must be [begin, end]");
  e.begin = jsonIndex(path, where + ": begin offset", off[0]);
  e.end = jsonIndex(path, where + ": end offset", off[1]);
  if (e.end < e.begin)
    fail(path, where + ": data_offsets " + off.dump() + " end before they begin");
  if (e.end - e.begin != bytes) {
    fail(path, where + ": shape " + shape.dump() + " of " + e.tensor.dtype + " needs " +
                   std::to_string(bytes) + " bytes but data_offsets " + off.dump() +
                   " span " + std::to_string(e.end - e.begin));
  }
  return e;
}

std::map<std::string, std::string> parseMetadata(const std::string& path, const Json& v) {
  if (!v.is_object()) fail(path, "\"__metadata__\" is not a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [k, val] : v.items()) {
    if (!val.is_string()) fail(path, "metadata value of '" + k + "' is not a string");
    out[k] = val.get<std::string>();
  }
  return out;
}

// Tensors must tile [0, dataBytes) exactly, in offset order.
void checkTiling(const std::string& path, std::vector<Entry>& entries,
                 uint64_t dataBytes) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const auto& e : entries) {
    const std::string where = "tensor '" + e.tensor.name + "'";
    if (e.end > dataBytes) {
      fail(path, where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                     std::to_string(e.end) + "] run past the end of the data (" +
                     std::to_string(dataBytes) + " bytes)");
    }
    if (e.begin < expected) fail(path, where + " overlaps the tensor before it");
    if (e.begin > expected)
      fail(path, "gap in the data before " + where + " (at byte " +
                     std::to_string(expected) + ")");
    expected = e.end;
  }
  if (expected != dataBytes) {
    fail(path, "the tensors cover " + std::to_string(expected) +
                   " bytes but the file holds " + std::to_string(dataBytes) +
                   " bytes of data");
  }
}

Json readHeader(const std::string& path, int fd, uint64_t fileBytes,
                uint64_t* headerBytes) {
  if (fileBytes < 8) {
    fail(path, "truncated: " + std::to_string(fileBytes) +
                   " bytes, less than the 8-byte header length");
  }
  uint64_t n = 0;
  readAt(path, fd, &n, 8, 0);
  if (n > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > fileBytes - 8) {
    fail(path, "header length " + std::to_string(n) + " is larger than the file (" +
                   std::to_string(fileBytes) + " bytes): truncated or not safetensors");
  }
  std::string text(n, '\0');
  readAt(path, fd, text.data(), n, 8);
  *headerBytes = n;
  try {
    Json h = Json::parse(text);
    if (!h.is_object()) fail(path, "the header is not a JSON object");
    return h;
  } catch (const Json::parse_error& e) {
    fail(path, std::string("the header is not valid JSON: ") + e.what());
  }
}

}  // namespace

size_t dtypeSize(const std::string& dtype) {
  static const std::map<std::string, size_t, std::less<>> kSizes = {
      {"F64", 8}, {"I64", 8}, {"F32", 4}, {"I32", 4}, {"F16", 2}, {"BF16", 2}, {"U8", 1}};
  auto it = kSizes.find(dtype);
  if (it == kSizes.end())
    DDPRUN_THROW(CheckpointError, "unknown safetensors dtype '", dtype, "'");
  return it->second;
}

bool isKnownDtype(const std::string& dtype) {
  for (const char* d : {"F64", "I64", "F32", "I32", "F16", "BF16", "U8"})
    if (dtype == d) return true;
  return false;
}

size_t LoadedTensor::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

const LoadedTensor* SafeTensors::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void saveSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<Placed> layout = planLayout(path, tensors);
  std::string header = buildHeader(path, layout, metadata);
  if (const std::string problem = replaceTargetProblem(path); !problem.empty())
    fail(path, problem);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    writeTemp(tmp, header, layout);
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      failWrite(path, "cannot rename " + tmp + " over it: " + errnoText());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsyncDirectoryOf(path);
}

SafeTensors loadSafetensors(const std::string& path) {
  // O_NONBLOCK: opening a FIFO returns at once (and fstat refuses it)
  // instead of waiting for a writer; a regular file ignores the flag.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) fail(path, "cannot open: " + errnoText());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(path, "cannot stat: " + errnoText());
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const auto fileBytes = static_cast<uint64_t>(st.st_size);

  uint64_t headerBytes = 0;
  Json h = readHeader(path, fd.get(), fileBytes, &headerBytes);
  SafeTensors out;
  std::vector<Entry> entries;
  for (const auto& [key, value] : h.items()) {
    if (key == kMetadataKey)
      out.metadata = parseMetadata(path, value);
    else
      entries.push_back(parseEntry(path, key, value));
  }
  const uint64_t dataStart = 8 + headerBytes;
  checkTiling(path, entries, fileBytes - dataStart);

  out.tensors.reserve(entries.size());
  for (auto& e : entries) {
    e.tensor.bytes.resize(e.end - e.begin);
    readAt(path, fd.get(), e.tensor.bytes.data(), e.end - e.begin, dataStart + e.begin);
    out.tensors.push_back(std::move(e.tensor));
  }
  return out;
}

}  // namespace ddprun::train
