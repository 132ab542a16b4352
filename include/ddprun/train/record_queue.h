// A bounded queue of text records between a producer that must never wait
// (the training thread) and one consumer (the metrics writer thread).
// push() never blocks: when the queue holds `maxRecords` records or
// `maxBytes` bytes, the new record is dropped and counted. pop() waits for a
// record or for close().
// Thread-safety: every member may be called from any thread; one consumer.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

namespace ddprun::train {

class RecordQueue {
 public:
  struct Limits {
    size_t maxRecords = 4096;       // >= 1
    size_t maxBytes = 8u << 20;     // a record longer than this is always dropped
  };
  explicit RecordQueue(Limits limits);
  RecordQueue(const RecordQueue&) = delete;
  RecordQueue& operator=(const RecordQueue&) = delete;

  // Queues `record`, or drops it (false) when the queue is full or closed.
  bool push(std::string record);
  // The oldest record; waits while the queue is empty and open. nullopt once
  // closed and empty.
  std::optional<std::string> pop();
  // The oldest record if there is one, without waiting.
  std::optional<std::string> tryPop();
  // No more records: pop() returns what is queued, then nullopt.
  void close();
  // Empties the queue, counting what it held as dropped (a consumer that gives
  // up); returns how many records that was.
  uint64_t discard();

  uint64_t pushed() const;   // records offered to push()
  uint64_t dropped() const;  // records push() refused plus those discard() removed
  size_t size() const;

 private:
  const Limits limits_;
  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::string> records_;
  size_t bytes_ = 0;
  bool closed_ = false;
  uint64_t pushed_ = 0, dropped_ = 0;
};

}  // namespace ddprun::train
