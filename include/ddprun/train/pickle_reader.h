// A minimal, safe reader of Python pickles: just enough of the format to read
// the CIFAR-10/100 "python version" batch files (cifar.h), as Python 2's
// cPickle wrote them (protocol 2, str keys, the array's bytes as a str) and as
// Python 3's pickle writes them (protocols 2 to 5, numpy arrays through
// numpy's _reconstruct / ndarray / dtype and BUILD, or _frombuffer).
//
// Nothing is executed. The only globals a pickle may name are the numpy
// array constructors (numpy.core.multiarray._reconstruct and
// numpy._core.multiarray._reconstruct, numpy.ndarray, numpy.dtype,
// numpy(._)core.numeric._frombuffer) and the two helpers Python 3 uses for bytes
// in protocol 2 (_codecs.encode, __builtin__/builtins.bytes); each is
// interpreted here as a value (an array, a dtype, a byte string), never
// called. Any other global, and every opcode outside the list in
// pickle_reader.cc, is refused with a message that names the opcode and its
// offset.
//
// Bounded memory: every length is checked against the bytes left before
// anything is allocated for it, str/bytes values are views into the input
// (no copy; only _codecs.encode's latin-1 conversion makes one, and those
// copies together may not exceed the input's size), and the number of
// values, list/tuple/dict slots, stack entries, nested MARKs and memo entries
// are all capped (PickleLimits). Values live in one arena and refer to each
// other by index, so a self-referencing list (legal in a pickle) costs
// nothing and cannot leak.
//
// Thread-safety: parsePickle is a pure function; a PickleDoc is a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::train {

enum class PickleKind : uint8_t {
  kNone,
  kBool,     // integer: 0 or 1
  kInt,      // integer
  kFloat,    // real
  kStr,      // text: UTF-8 (BINUNICODE, integer 1) or raw bytes (Python 2 str, integer 0)
  kBytes,    // text: the bytes
  kList,     // items
  kTuple,    // items
  kDict,     // items: key, value, key, value, ... (in insertion order)
  kGlobal,   // integer: a PickleGlobal
  kNdarray,  // integer: index into PickleDoc::arrays
  kDtype,    // text: the dtype's type string ("u1", "<i8", ...)
};

// The globals a pickle may name (anything else is refused).
enum class PickleGlobal : int64_t {
  kReconstruct,    // numpy(._)core.multiarray._reconstruct
  kNdarray,        // numpy.ndarray
  kDtype,          // numpy.dtype
  kFromBuffer,     // numpy(._)core.numeric._frombuffer (protocol 5)
  kCodecsEncode,   // _codecs.encode (Python 3's bytes in protocol 2)
  kBytes,          // __builtin__.bytes / builtins.bytes (empty bytes in protocol 2)
};

struct PickleValue {
  PickleKind kind = PickleKind::kNone;
  int64_t integer = 0;
  double real = 0;
  std::string_view text;        // into the input or PickleDoc's own storage
  std::vector<uint32_t> items;  // indexes into PickleDoc::values
};

// A numpy array as its BUILD state (or _frombuffer's arguments) described it.
struct PickleArray {
  bool built = false;        // false: made by _reconstruct but never given a state
  std::vector<int64_t> shape;
  std::string dtype;         // the dtype's type string, e.g. "u1"
  std::string byteOrder;     // from the dtype's state: "|", "<", ">", "=" (or empty)
  bool fortranOrder = false;
  std::string_view data;     // the raw element bytes (C order unless fortranOrder)
};

// What parsePickle accepts at most. The defaults fit the CIFAR files (a
// CIFAR-100 train file has about 200000 values) with room to spare.
struct PickleLimits {
  size_t maxValues = size_t{1} << 20;    // values in the arena
  size_t maxSlots = size_t{1} << 22;     // list/tuple/dict entries, all together
  size_t maxStack = size_t{1} << 20;     // entries on the stack
  size_t maxMarks = 64;                  // MARKs open at once (nesting depth)
  size_t maxMemo = size_t{1} << 20;      // memo entries
  int maxDims = 8;                       // an array's dimensions
};

// A parsed pickle. `values[root]` is the object STOP returned. str/bytes
// views point into the input given to parsePickle (which must outlive the
// doc) or into `owned`.
struct PickleDoc {
  std::vector<PickleValue> values;
  std::vector<PickleArray> arrays;
  uint32_t root = 0;
  std::vector<std::unique_ptr<std::string>> owned;

  const PickleValue& at(uint32_t i) const { return values[i]; }
  // The value of `key` in dict `dict` (a str or bytes key equal to `key`),
  // or nullptr when there is none or `dict` is not a dict.
  const PickleValue* dictGet(const PickleValue& dict, std::string_view key) const;
};

struct PickleResult {
  bool ok = false;
  PickleDoc doc;       // valid when ok
  std::string error;   // when !ok: one line, naming the opcode and its offset
};

// "None", "int", "list", ... for messages.
const char* pickleKindName(PickleKind kind);

// Parses one pickle occupying all of `data` (bytes after STOP are refused).
// Never throws for bad input (only std::bad_alloc when memory runs out
// within the limits).
PickleResult parsePickle(std::string_view data, const PickleLimits& limits = {});

}  // namespace ddprun::train
