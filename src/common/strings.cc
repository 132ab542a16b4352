#include "ddprun/common/strings.h"

#include <algorithm>
#include <random>

#include "ddprun/common/user_input.h"

namespace ddprun::str {

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == sep) {
      out.emplace_back(text.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

bool startsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string replaceAll(std::string s, std::string_view from, std::string_view to) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

bool parseInt(std::string_view text, int64_t& out, int64_t min, int64_t max) {
  return input::parseNumber(text, out, min, max) == input::NumberProblem::kNone;
}

bool parseInt(std::string_view text, int& out, int min, int max) {
  int64_t v = 0;
  if (!parseInt(text, v, min, max)) return false;
  out = static_cast<int>(v);
  return true;
}

bool parseDouble(std::string_view text, double& out) {
  return input::parseNumber(text, out) == input::NumberProblem::kNone;
}

std::string escape(std::string_view s, size_t maxBytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  size_t n = std::min(s.size(), maxBytes);
  out.reserve(n + 16);
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (n < s.size()) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string randomToken(size_t n) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kChars[rd() % 36];
  return s;
}

std::string uuid4() {
  static const char kHex[] = "0123456789abcdef";
  std::random_device rd;
  unsigned char b[16];
  for (auto& x : b) x = static_cast<unsigned char>(rd() & 0xff);
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += kHex[b[i] >> 4];
    s += kHex[b[i] & 15];
  }
  return s;
}

}  // namespace ddprun::str
