#include "ddprun/train/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string_view>

#include "ddprun/common/error.h"
#include "ddprun/common/hash.h"
#include "ddprun/train/checkpoint.h"

namespace ddprun::train {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "ckpt-";
constexpr std::string_view kSuffix = ".safetensors";
constexpr size_t kMaxTagChars = 64;

bool tagChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '.' || c == '-';
}

std::string paddedStep(int64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < 9) digits.insert(0, 9 - digits.size(), '0');
  return digits;
}

// The step in `digits` (1..18 decimal digits), or -1.
int64_t parseStep(std::string_view digits) {
  if (digits.empty() || digits.size() > 18) return -1;
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

}  // namespace

std::string runTag(const std::string& runId) {
  DDPRUN_CHECK(!runId.empty(), "empty run id");
  if (runId.size() <= kMaxTagChars && std::all_of(runId.begin(), runId.end(), tagChar))
    return runId;
  char b[20];
  std::snprintf(b, sizeof b, "x%016llx", static_cast<unsigned long long>(fnv1a(runId)));
  return b;
}

std::string checkpointFileName(const std::string& tag, int64_t globalStep) {
  DDPRUN_CHECK(globalStep >= 0, "global step ", globalStep);
  const std::string mid = tag.empty() ? "" : tag + "-";
  return std::string(kPrefix) + mid + paddedStep(globalStep) + std::string(kSuffix);
}

std::optional<CheckpointFile> parseCheckpointName(const std::string& fileName) {
  const std::string_view name(fileName);
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return std::nullopt;
  const std::string_view body =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  const size_t dash = body.rfind('-');
  CheckpointFile f;
  f.path = fileName;
  f.tag = dash == std::string_view::npos ? "" : std::string(body.substr(0, dash));
  f.step = parseStep(dash == std::string_view::npos ? body : body.substr(dash + 1));
  if (f.step < 0) return std::nullopt;
  if (!f.tag.empty() && runTag(f.tag) != f.tag) return std::nullopt;
  // Only the canonical spelling counts, so we never list (or prune) a file
  // we would not have written.
  if (checkpointFileName(f.tag, f.step) != fileName) return std::nullopt;
  return f;
}

std::vector<CheckpointFile> listCheckpoints(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec) && !ec) return {};
  std::vector<CheckpointFile> found;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code typeEc;
    if (!it->is_regular_file(typeEc) || it->is_symlink(typeEc)) continue;
    if (auto f = parseCheckpointName(it->path().filename().string())) {
      f->path = it->path().string();
      found.push_back(std::move(*f));
    }
  }
  if (ec)
    DDPRUN_THROW(CheckpointError, dir,
                 ": cannot list the checkpoint directory: ", ec.message());
  std::sort(found.begin(), found.end(),
            [](const CheckpointFile& a, const CheckpointFile& b) {
              return a.step != b.step ? a.step > b.step : a.path > b.path;
            });
  return found;
}

std::vector<CheckpointFile> listCheckpoints(const std::string& dir,
                                            const std::string& tag) {
  std::vector<CheckpointFile> all = listCheckpoints(dir), mine;
  for (auto& f : all)
    if (f.tag == tag) mine.push_back(std::move(f));
  return mine;
}

std::optional<std::string> lastWrittenRun(const std::string& dir) {
  std::optional<std::string> tag;
  fs::file_time_type newest{};
  for (const CheckpointFile& f : listCheckpoints(dir)) {
    std::error_code ec;
    const auto t = fs::last_write_time(f.path, ec);
    if (!ec && (!tag || t > newest)) {
      newest = t;
      tag = f.tag;
    }
  }
  return tag;
}

void pruneCheckpoints(const std::string& dir, const std::string& tag, int keep) {
  DDPRUN_CHECK(keep >= 0, "keep is ", keep);
  DDPRUN_CHECK(!tag.empty(), "pruning needs a run tag");
  const std::vector<CheckpointFile> mine = listCheckpoints(dir, tag);
  for (size_t i = static_cast<size_t>(keep); i < mine.size(); ++i) {
    std::error_code ec;
    if (!fs::remove(mine[i].path, ec) && ec)
      DDPRUN_THROW(IoError, mine[i].path,
                   ": cannot remove an old checkpoint: ", ec.message());
  }
}

}  // namespace ddprun::train
