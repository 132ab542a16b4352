#include "ddprun/train/record_queue.h"

#include <algorithm>
#include <utility>

namespace ddprun::train {

RecordQueue::RecordQueue(Limits limits) : limits_(limits) {}

bool RecordQueue::push(std::string record) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++pushed_;
    const bool fits = records_.size() < std::max<size_t>(limits_.maxRecords, 1) &&
                      record.size() <= limits_.maxBytes &&
                      bytes_ <= limits_.maxBytes - record.size();
    if (closed_ || !fits) {
      ++dropped_;
      return false;
    }
    bytes_ += record.size();
    records_.push_back(std::move(record));
  }
  ready_.notify_one();
  return true;
}

std::optional<std::string> RecordQueue::pop() {
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait(lock, [&] { return closed_ || !records_.empty(); });
  if (records_.empty()) return std::nullopt;
  std::string r = std::move(records_.front());
  records_.pop_front();
  bytes_ -= r.size();
  return r;
}

std::optional<std::string> RecordQueue::tryPop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (records_.empty()) return std::nullopt;
  std::string r = std::move(records_.front());
  records_.pop_front();
  bytes_ -= r.size();
  return r;
}

void RecordQueue::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  ready_.notify_all();
}

uint64_t RecordQueue::discard() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t n = records_.size();
  dropped_ += n;
  records_.clear();
  bytes_ = 0;
  return n;
}

uint64_t RecordQueue::pushed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pushed_;
}

uint64_t RecordQueue::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

size_t RecordQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_.size();
}

}  // namespace ddprun::train
