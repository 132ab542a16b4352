// What a CUDA graph's capture touched of the caching allocator's blocks
// (caching_allocator.h), so that no block a live graph may use is handed to
// other work between its replays (issue 44 item 6: the allocator's addresses
// frozen for the graph).
//
// A graph replays the addresses its capture saw: every block handed out or
// given back during the capture, and every block live at its end (weights,
// activations, the layers' buffers: the graph may read or write any of them).
// While the graph lives, such a block, once given back, stays out of the free
// lists (held) instead of going to the next request; when the graph is
// released (invalidated, or the trainer stops replaying), its held blocks no
// other live graph knows go back to the free lists. Blocks first handed out
// after the capture (the eager work between replays: the optimizer's
// scratch, say) are not the graph's and cycle as before.
//
// Pure bookkeeping over block addresses, no CUDA: tested on the CPU
// (tests/unit/train/capture_ledger_test.cc). Thread-safety: none; the
// allocator calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace ddprun::train::cuda {

class CaptureLedger {
 public:
  bool capturing() const { return capturing_; }
  // Starts a capture. Precondition: none in progress (the allocator checks).
  void begin() {
    capturing_ = true;
    current_.clear();
  }
  // A block handed out or given back while capturing (nothing otherwise).
  void touched(void* p) {
    if (capturing_) current_.insert(p);
  }
  // Ends the capture. keep: the graph lives, and every block it touched or
  // `liveNow` lists (the allocator's blocks in use now) is its; returns the
  // graph's id (> 0). !keep (the capture failed): forgotten, returns 0.
  uint64_t end(bool keep, const std::vector<void*>& liveNow) {
    capturing_ = false;
    if (!keep) {
      current_.clear();
      return 0;
    }
    std::set<void*>& g = graphs_[next_];
    g.swap(current_);
    g.insert(liveNow.begin(), liveNow.end());
    return next_++;
  }
  // Whether a block given back now must stay out of the free lists: a live
  // graph knows it (never during a capture, whose frees are reused within it
  // as in an eager step).
  bool heldByGraph(void* p) const {
    if (capturing_) return false;
    for (const auto& [id, blocks] : graphs_)
      if (blocks.count(p)) return true;
    return false;
  }
  // Graph `id` is gone: of its blocks, those no other live graph knows (the
  // allocator returns those of them it holds to its free lists). An unknown
  // id: none.
  std::vector<void*> release(uint64_t id) {
    std::vector<void*> out;
    auto it = graphs_.find(id);
    if (it == graphs_.end()) return out;
    const std::set<void*> blocks = std::move(it->second);
    graphs_.erase(it);
    for (void* p : blocks)
      if (!heldByGraph(p)) out.push_back(p);
    return out;
  }
  size_t liveGraphs() const { return graphs_.size(); }

 private:
  bool capturing_ = false;
  std::set<void*> current_;
  std::map<uint64_t, std::set<void*>> graphs_;
  uint64_t next_ = 1;
};

}  // namespace ddprun::train::cuda
