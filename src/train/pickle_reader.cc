#include "ddprun/train/pickle_reader.h"

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include "ddprun/common/strings.h"

namespace ddprun::train {

namespace {

// Every pickle opcode by its byte, so that a refused one is named.
const char* opcodeName(uint8_t op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

std::string opcodeLabel(uint8_t op) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", op);
  const char* name = opcodeName(op);
  return name != nullptr ? std::string(name) + " (" + hex + ")"
                         : std::string("unknown opcode ") + hex;
}


// Thrown inside the parser only; parsePickle turns it into a result.
struct Bad {
  std::string what;
};

// The globals a pickle may name, by module and name.
bool resolveGlobal(std::string_view module, std::string_view name, PickleGlobal* out) {
  const bool numpyCore = module == "numpy.core.multiarray" || module == "numpy._core.multiarray";
  const bool numpyNumeric = module == "numpy.core.numeric" || module == "numpy._core.numeric";
  if (numpyCore && name == "_reconstruct") *out = PickleGlobal::kReconstruct;
  else if (module == "numpy" && name == "ndarray") *out = PickleGlobal::kNdarray;
  else if (module == "numpy" && name == "dtype") *out = PickleGlobal::kDtype;
  else if (numpyNumeric && name == "_frombuffer") *out = PickleGlobal::kFromBuffer;
  else if (module == "_codecs" && name == "encode") *out = PickleGlobal::kCodecsEncode;
  else if ((module == "__builtin__" || module == "builtins") && name == "bytes")
    *out = PickleGlobal::kBytes;
  else
    return false;
  return true;
}

// The element size of a numpy type string ("u1", "<i8", "|b1", "f4"), or 0
// when it is not a plain numeric type.
int64_t itemSize(std::string_view t) {
  if (!t.empty() && (t[0] == '<' || t[0] == '>' || t[0] == '|' || t[0] == '=')) t.remove_prefix(1);
  if (t == "uint8" || t == "int8" || t == "bool") return 1;
  if (t.size() < 2 || std::strchr("biufc", t[0]) == nullptr) return 0;
  int64_t n = 0;
  for (char c : t.substr(1)) {
    if (c < '0' || c > '9' || n > 64) return 0;
    n = n * 10 + (c - '0');
  }
  return (n == 1 || n == 2 || n == 4 || n == 8 || n == 16) ? n : 0;
}

class Parser {
 public:
  Parser(std::string_view in, const PickleLimits& limits) : in_(in), lim_(limits) {}

  PickleDoc run() {
    while (true) {
      if (pos_ >= in_.size())
        throw Bad{"truncated: the pickle ends at offset " + std::to_string(pos_) +
                  " without STOP"};
      opPos_ = pos_;
      op_ = static_cast<uint8_t>(in_[pos_++]);
      if (op_ == '.') break;
      step();
    }
    if (!marks_.empty() || stack_.size() != 1)
      bad("STOP with " + std::to_string(stack_.size()) + " values on the stack and " +
          std::to_string(marks_.size()) + " open MARKs (want one value, no MARK)");
    if (pos_ != in_.size())
      throw Bad{std::to_string(in_.size() - pos_) + " unexpected bytes after STOP at offset " +
                std::to_string(opPos_)};
    doc_.root = stack_.back();
    return std::move(doc_);
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    throw Bad{what + " (" + opcodeLabel(op_) + " at offset " + std::to_string(opPos_) + ")"};
  }

  // ---- input
  std::string_view take(uint64_t n) {
    if (n > in_.size() - pos_)
      bad("truncated: needs " + std::to_string(n) + " bytes, " +
          std::to_string(in_.size() - pos_) + " are left");
    std::string_view s = in_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  uint64_t le(int bytes) {
    std::string_view s = take(static_cast<uint64_t>(bytes));
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[i]);
    return v;
  }
  std::string_view line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos || end - pos_ > 256)
      bad("truncated or overlong GLOBAL name (no newline within 256 bytes)");
    std::string_view s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  // ---- values and the stack
  uint32_t make(PickleValue v) {
    if (doc_.values.size() >= lim_.maxValues)
      bad("more than " + std::to_string(lim_.maxValues) + " values");
    doc_.values.push_back(std::move(v));
    return static_cast<uint32_t>(doc_.values.size() - 1);
  }
  void push(uint32_t id) {
    if (stack_.size() >= lim_.maxStack)
      bad("stack deeper than " + std::to_string(lim_.maxStack) + " entries");
    stack_.push_back(id);
  }
  void pushNew(PickleKind kind, int64_t integer = 0, std::string_view text = {}) {
    PickleValue v;
    v.kind = kind;
    v.integer = integer;
    v.text = text;
    push(make(std::move(v)));
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  uint32_t pop() {
    if (stack_.size() <= floor()) bad("stack underflow");
    uint32_t id = stack_.back();
    stack_.pop_back();
    return id;
  }
  uint32_t top() {
    if (stack_.size() <= floor()) bad("stack underflow");
    return stack_.back();
  }
  // Closes the innermost MARK: the values above it, in order.
  std::vector<uint32_t> popMark() {
    if (marks_.empty()) bad("no MARK open");
    const size_t at = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
    stack_.resize(at);
    return items;
  }
  PickleValue& val(uint32_t id) { return doc_.values[id]; }
  void addSlots(size_t n) {
    if (n > lim_.maxSlots - slots_)
      bad("more than " + std::to_string(lim_.maxSlots) + " list, tuple and dict entries");
    slots_ += n;
  }
  void pushSequence(PickleKind kind, std::vector<uint32_t> items) {
    addSlots(items.size());
    PickleValue v;
    v.kind = kind;
    v.items = std::move(items);
    push(make(std::move(v)));
  }
  void extend(uint32_t target, PickleKind want, const std::vector<uint32_t>& items) {
    PickleValue& t = val(target);
    if (t.kind != want)
      bad(std::string("adding items to a ") + pickleKindName(t.kind) + " (want a " +
          pickleKindName(want) + ")");
    if (want == PickleKind::kDict && items.size() % 2 != 0) bad("odd number of dict entries");
    addSlots(items.size());
    t.items.insert(t.items.end(), items.begin(), items.end());
  }
  void memoPut(uint64_t index) {
    const uint32_t id = top();
    auto it = memo_.find(index);
    if (it != memo_.end()) {
      it->second = id;
      return;
    }
    if (memo_.size() >= lim_.maxMemo)
      bad("more than " + std::to_string(lim_.maxMemo) + " memo entries");
    memo_.emplace(index, id);
  }
  void memoGet(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) bad("memo entry " + std::to_string(index) + " was never stored");
    push(it->second);
  }

  // ---- the opcodes
  void step() {
    switch (op_) {
      case 0x80: {
        const uint64_t proto = le(1);
        if (proto > 5) bad("protocol " + std::to_string(proto) + " (at most 5 is understood)");
        return;
      }
      case 0x95: {  // FRAME: only its length is checked (the opcodes follow)
        const uint64_t n = le(8);
        if (n > in_.size() - pos_)
          bad("truncated: a frame of " + std::to_string(n) + " bytes, " +
              std::to_string(in_.size() - pos_) + " are left");
        return;
      }
      case '(':
        if (marks_.size() >= lim_.maxMarks)
          bad("more than " + std::to_string(lim_.maxMarks) + " nested MARKs");
        marks_.push_back(stack_.size());
        return;
      case '0': pop(); return;
      case '1': popMark(); return;
      case '2': push(top()); return;
      case 'N': return pushNew(PickleKind::kNone);
      case 0x88: return pushNew(PickleKind::kBool, 1);
      case 0x89: return pushNew(PickleKind::kBool, 0);
      case 'K': return pushNew(PickleKind::kInt, static_cast<int64_t>(le(1)));
      case 'M': return pushNew(PickleKind::kInt, static_cast<int64_t>(le(2)));
      case 'J':
        return pushNew(PickleKind::kInt, static_cast<int32_t>(static_cast<uint32_t>(le(4))));
      case 0x8a: return long1();
      case 'G': return binFloat();
      case 'T': {
        const auto n = static_cast<int32_t>(static_cast<uint32_t>(le(4)));
        if (n < 0) bad("negative string length " + std::to_string(n));
        return pushNew(PickleKind::kStr, 0, take(static_cast<uint64_t>(n)));
      }
      case 'U': return pushNew(PickleKind::kStr, 0, take(le(1)));
      case 'X': return pushNew(PickleKind::kStr, 1, take(le(4)));
      case 0x8c: return pushNew(PickleKind::kStr, 1, take(le(1)));
      case 0x8d: return pushNew(PickleKind::kStr, 1, take(le(8)));
      case 'C': return pushNew(PickleKind::kBytes, 0, take(le(1)));
      case 'B': return pushNew(PickleKind::kBytes, 0, take(le(4)));
      case 0x8e: case 0x96: return pushNew(PickleKind::kBytes, 0, take(le(8)));
      case '}': return pushSequence(PickleKind::kDict, {});
      case ']': return pushSequence(PickleKind::kList, {});
      case ')': return pushSequence(PickleKind::kTuple, {});
      case 'd': {
        std::vector<uint32_t> items = popMark();
        if (items.size() % 2 != 0) bad("odd number of dict entries");
        return pushSequence(PickleKind::kDict, std::move(items));
      }
      case 'l': return pushSequence(PickleKind::kList, popMark());
      case 't': return pushSequence(PickleKind::kTuple, popMark());
      case 0x85: case 0x86: case 0x87: {
        std::vector<uint32_t> items(static_cast<size_t>(op_ - 0x84));
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        return pushSequence(PickleKind::kTuple, std::move(items));
      }
      case 'a': {
        const uint32_t item = pop();
        return extend(top(), PickleKind::kList, {item});
      }
      case 'e': {
        std::vector<uint32_t> items = popMark();
        return extend(top(), PickleKind::kList, items);
      }
      case 's': {
        const uint32_t value = pop(), key = pop();
        return extend(top(), PickleKind::kDict, {key, value});
      }
      case 'u': {
        std::vector<uint32_t> items = popMark();
        return extend(top(), PickleKind::kDict, items);
      }
      case 'q': return memoPut(le(1));
      case 'r': return memoPut(le(4));
      case 0x94: return memoPut(memo_.size());
      case 'h': return memoGet(le(1));
      case 'j': return memoGet(le(4));
      case 'c': {
        std::string_view module = line();
        std::string_view name = line();
        return global(module, name);
      }
      case 0x93: {
        const uint32_t name = pop(), module = pop();
        if (val(module).kind != PickleKind::kStr || val(name).kind != PickleKind::kStr)
          bad("STACK_GLOBAL needs two str values");
        return global(val(module).text, val(name).text);
      }
      case 'R': return reduce();
      case 'b': return build();
      default:
        bad(opcodeName(op_) != nullptr ? "unsupported pickle opcode"
                                       : "not a pickle opcode (corrupt file?)");
    }
  }
  void long1() {
    const uint64_t n = le(1);
    if (n > 8) bad("an integer of " + std::to_string(n) + " bytes (at most 8 are supported)");
    std::string_view s = take(n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<uint8_t>(s[i]);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(s[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
    pushNew(PickleKind::kInt, static_cast<int64_t>(v));
  }
  void binFloat() {
    std::string_view s = take(8);
    uint64_t bits = 0;
    for (char c : s) bits = (bits << 8) | static_cast<uint8_t>(c);
    double d;
    std::memcpy(&d, &bits, sizeof d);
    PickleValue v;
    v.kind = PickleKind::kFloat;
    v.real = d;
    push(make(std::move(v)));
  }
  void global(std::string_view module, std::string_view name) {
    PickleGlobal g;
    if (!resolveGlobal(module, name, &g))
      bad("refused global " + str::escape(module, 64) + "." + str::escape(name, 64) +
          " (only numpy's array and dtype constructors are allowed)");
    pushNew(PickleKind::kGlobal, static_cast<int64_t>(g));
  }

  // ---- REDUCE and BUILD: interpreted, never called
  const PickleValue& arg(const PickleValue& args, size_t i) { return val(args.items[i]); }
  void wantArgs(const PickleValue& args, size_t lo, size_t hi, const char* what) {
    if (args.items.size() < lo || args.items.size() > hi)
      bad(std::string(what) + " with " + std::to_string(args.items.size()) + " arguments");
  }
  void reduce() {
    const uint32_t argsId = pop(), fnId = pop();
    const PickleValue& fn = val(fnId);
    const PickleValue args = val(argsId);  // a copy: make() may move the arena
    if (fn.kind != PickleKind::kGlobal) bad(std::string("REDUCE of a ") + pickleKindName(fn.kind));
    if (args.kind != PickleKind::kTuple) bad("REDUCE with arguments that are not a tuple");
    switch (static_cast<PickleGlobal>(fn.integer)) {
      case PickleGlobal::kReconstruct: {
        wantArgs(args, 1, 3, "_reconstruct");
        const PickleValue& cls = arg(args, 0);
        if (cls.kind != PickleKind::kGlobal ||
            static_cast<PickleGlobal>(cls.integer) != PickleGlobal::kNdarray)
          bad("_reconstruct of something other than numpy.ndarray");
        doc_.arrays.emplace_back();
        return pushNew(PickleKind::kNdarray, static_cast<int64_t>(doc_.arrays.size() - 1));
      }
      case PickleGlobal::kDtype: {
        wantArgs(args, 1, 3, "numpy.dtype");
        const PickleValue& t = arg(args, 0);
        if (t.kind != PickleKind::kStr && t.kind != PickleKind::kBytes)
          bad("numpy.dtype of a " + std::string(pickleKindName(t.kind)));
        return pushNew(PickleKind::kDtype, 0, t.text);
      }
      case PickleGlobal::kCodecsEncode: {
        wantArgs(args, 1, 2, "_codecs.encode");
        const PickleValue& s = arg(args, 0);
        if (s.kind != PickleKind::kStr) bad("_codecs.encode of a " + std::string(pickleKindName(s.kind)));
        if (args.items.size() == 2) {
          const PickleValue& enc = arg(args, 1);
          if (enc.kind != PickleKind::kStr || (enc.text != "latin1" && enc.text != "latin-1"))
            bad("_codecs.encode with an encoding other than latin1");
        }
        return pushNew(PickleKind::kBytes, 0, latin1(s));
      }
      case PickleGlobal::kBytes:
        wantArgs(args, 0, 0, "bytes");
        return pushNew(PickleKind::kBytes);
      case PickleGlobal::kFromBuffer: return fromBuffer(args);
      case PickleGlobal::kNdarray: bad("REDUCE of numpy.ndarray itself");
    }
    bad("REDUCE of an unknown global");
  }

  // A str as bytes, the way Python 3 turns the latin-1 text of a Python 2 str
  // back into its bytes: each code point (< 256) one byte.
  std::string_view latin1(const PickleValue& s) {
    if (s.integer == 0) return s.text;  // a Python 2 str: already the raw bytes
    if (s.text.size() > in_.size() - ownedBytes_)
      bad("latin-1 conversions larger than the input");
    auto out = std::make_unique<std::string>();
    out->reserve(s.text.size());
    const auto* p = reinterpret_cast<const unsigned char*>(s.text.data());
    const size_t n = s.text.size();
    for (size_t i = 0; i < n;) {
      if (p[i] < 0x80) {
        out->push_back(static_cast<char>(p[i++]));
      } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80 &&
                 p[i] <= 0xC3 && p[i] >= 0xC2) {
        out->push_back(static_cast<char>(((p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F)));
        i += 2;
      } else {
        bad("a str that is not latin-1 text (a byte string encoded as latin1 has only code "
            "points below 256)");
      }
    }
    ownedBytes_ += out->size();
    doc_.owned.push_back(std::move(out));
    return *doc_.owned.back();
  }

  std::vector<int64_t> shapeOf(const PickleValue& t) {
    if (t.kind != PickleKind::kTuple && t.kind != PickleKind::kList)
      bad(std::string("an array shape that is a ") + pickleKindName(t.kind));
    if (t.items.size() > static_cast<size_t>(lim_.maxDims))
      bad("an array of " + std::to_string(t.items.size()) + " dimensions");
    std::vector<int64_t> shape;
    for (uint32_t id : t.items) {
      const PickleValue& d = val(id);
      if (d.kind != PickleKind::kInt || d.integer < 0) bad("an array dimension that is not an int >= 0");
      shape.push_back(d.integer);
    }
    return shape;
  }
  // Shape times element size equals the data's size (the product saturates
  // just above the input's size, so it cannot overflow).
  void checkArray(const PickleArray& a) {
    const int64_t item = itemSize(a.dtype);
    if (item == 0) bad("unsupported array dtype '" + a.dtype + "'");
    const auto cap = static_cast<unsigned __int128>(in_.size()) + 1;
    unsigned __int128 need = static_cast<unsigned __int128>(item);
    bool empty = false;
    for (int64_t d : a.shape) {
      if (d == 0) empty = true;
      need = std::min(cap, need * static_cast<uint64_t>(d));
    }
    if (empty) need = 0;
    if (need != a.data.size())
      bad("array data of " + std::to_string(a.data.size()) + " bytes, its shape and dtype '" +
          a.dtype + "' need " +
          (need >= cap ? std::string("more") : std::to_string(static_cast<uint64_t>(need))));
  }
  std::string_view dataBytes(const PickleValue& d) {
    if (d.kind == PickleKind::kBytes) return d.text;
    if (d.kind == PickleKind::kStr) return latin1(d);
    bad(std::string("array data that is a ") + pickleKindName(d.kind) + " (want bytes)");
  }
  void dtypeOf(uint32_t id, PickleArray& a) {
    const PickleValue& d = val(id);
    if (d.kind != PickleKind::kDtype)
      bad(std::string("an array dtype that is a ") + pickleKindName(d.kind));
    a.dtype = std::string(d.text);
    auto it = dtypeOrder_.find(id);
    if (it != dtypeOrder_.end()) a.byteOrder = it->second;
  }
  void fromBuffer(const PickleValue& args) {
    wantArgs(args, 4, 4, "_frombuffer");
    PickleArray a;
    a.data = dataBytes(arg(args, 0));
    dtypeOf(args.items[1], a);
    a.shape = shapeOf(arg(args, 2));
    const PickleValue& order = arg(args, 3);
    if (order.kind != PickleKind::kStr || (order.text != "C" && order.text != "F"))
      bad("_frombuffer with an order other than 'C' or 'F'");
    a.fortranOrder = order.text == "F";
    a.built = true;
    checkArray(a);
    doc_.arrays.push_back(std::move(a));
    pushNew(PickleKind::kNdarray, static_cast<int64_t>(doc_.arrays.size() - 1));
  }
  void build() {
    const uint32_t stateId = pop();
    const uint32_t objId = top();
    const PickleValue& obj = val(objId);
    const PickleValue& state = val(stateId);
    if (state.kind != PickleKind::kTuple) bad("BUILD with a state that is not a tuple");
    if (obj.kind == PickleKind::kDtype) {
      // (version, byte order, subarray, names, fields, elsize, alignment, flags)
      if (state.items.size() >= 2 && val(state.items[1]).kind == PickleKind::kStr)
        dtypeOrder_[objId] = std::string(val(state.items[1]).text);
      return;
    }
    if (obj.kind != PickleKind::kNdarray) bad(std::string("BUILD of a ") + pickleKindName(obj.kind));
    PickleArray& target = doc_.arrays[static_cast<size_t>(obj.integer)];
    if (target.built) bad("BUILD of an array that already has its state");
    // (version, shape, dtype, is_fortran, data), or the same without version.
    const size_t n = state.items.size();
    if (n != 4 && n != 5) bad("array state of " + std::to_string(n) + " items (want 4 or 5)");
    const size_t o = n - 4;
    PickleArray a;
    a.shape = shapeOf(val(state.items[o]));
    dtypeOf(state.items[o + 1], a);
    const PickleValue& fortran = val(state.items[o + 2]);
    if (fortran.kind != PickleKind::kBool && fortran.kind != PickleKind::kInt)
      bad("an array's Fortran flag that is not a bool");
    a.fortranOrder = fortran.integer != 0;
    a.data = dataBytes(val(state.items[o + 3]));
    a.built = true;
    checkArray(a);
    doc_.arrays[static_cast<size_t>(val(objId).integer)] = std::move(a);
  }

  std::string_view in_;
  const PickleLimits& lim_;
  size_t pos_ = 0, opPos_ = 0;
  uint8_t op_ = 0;
  PickleDoc doc_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::unordered_map<uint32_t, std::string> dtypeOrder_;
  size_t slots_ = 0, ownedBytes_ = 0;
};

}  // namespace

const char* pickleKindName(PickleKind kind) {
  switch (kind) {
    case PickleKind::kNone: return "None";
    case PickleKind::kBool: return "bool";
    case PickleKind::kInt: return "int";
    case PickleKind::kFloat: return "float";
    case PickleKind::kStr: return "str";
    case PickleKind::kBytes: return "bytes";
    case PickleKind::kList: return "list";
    case PickleKind::kTuple: return "tuple";
    case PickleKind::kDict: return "dict";
    case PickleKind::kGlobal: return "global";
    case PickleKind::kNdarray: return "ndarray";
    case PickleKind::kDtype: return "dtype";
  }
  return "?";
}

const PickleValue* PickleDoc::dictGet(const PickleValue& dict, std::string_view key) const {
  if (dict.kind != PickleKind::kDict) return nullptr;
  // The last entry wins, as in Python when a key is set twice.
  for (size_t i = dict.items.size(); i >= 2; i -= 2) {
    const PickleValue& k = values[dict.items[i - 2]];
    if ((k.kind == PickleKind::kStr || k.kind == PickleKind::kBytes) && k.text == key)
      return &values[dict.items[i - 1]];
  }
  return nullptr;
}

PickleResult parsePickle(std::string_view data, const PickleLimits& limits) {
  PickleResult r;
  try {
    r.doc = Parser(data, limits).run();
    r.ok = true;
  } catch (const Bad& b) {
    r.error = b.what;
  }
  return r;
}

}  // namespace ddprun::train
