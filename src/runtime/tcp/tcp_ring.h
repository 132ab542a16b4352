// Collectives over a ring of TCP connections (each member sends to the next
// and receives from the previous). Internal header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../comm.h"

namespace ddprun::runtime {

// A listening socket, opened before the address is published.
class TcpListener {
 public:
  // Binds `host` (an IP literal; empty = all addresses) on an ephemeral port.
  static std::unique_ptr<TcpListener> open(const std::string& host);
  ~TcpListener();
  uint16_t port() const { return port_; }
  int fd() const { return fd_; }

 private:
  TcpListener(int fd, uint16_t port) : fd_(fd), port_(port) {}
  int fd_;
  uint16_t port_;
};

class TcpRing : public Comm {
 public:
  // Connects member i to member i+1 (addrs[i+1]) and accepts member i-1.
  // `ringId` tells connections of different rings (and stale ones) apart.
  static std::unique_ptr<TcpRing> connect(CommContext ctx, TcpListener* listener,
                                          const std::vector<std::string>& hosts,
                                          const std::vector<uint16_t>& ports, uint32_t ringId);
  ~TcpRing() override;

  DDPRUN_COMM_COLLECTIVE_OVERRIDES;
  int size() const override { return ctx_.size(); }
  int me() const override { return ctx_.me; }

 private:
  TcpRing(CommContext ctx, int sendFd, int recvFd);
  struct Xfer {
    const char* send = nullptr;
    size_t sendLen = 0;
    char* recv = nullptr;
    size_t recvLen = 0;
    bool forward = false;  // send only what has been received (pipelined relay)
    // Called as received bytes grow: (bytes received so far).
    std::function<void(size_t)> onRecv;
  };
  // Sends and receives concurrently until both are done.
  void exchange(Xfer& x, const char* what, const Deadline& deadline);
  int next() const { return (ctx_.me + 1) % size(); }
  int prev() const { return (ctx_.me + size() - 1) % size(); }
  char* scratch(size_t bytes, int which);
  // Ring reduce-scatter leaving block `me` of `in` (blocks per `part`)
  // reduced into `dst`; when `keep` is set, every intermediate block is kept
  // at its place in `keep` (allReduce), else in two rotating scratch blocks.
  void reduceScatterRing(const char* in, const Partition& part, DType t, ReduceOp op,
                         char* keep, char* dst, const char* what, const Deadline& deadline);

  CommContext ctx_;
  int sendFd_;
  int recvFd_;
  std::vector<char> scratch_[3];
};

}  // namespace ddprun::runtime
