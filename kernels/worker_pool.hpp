// A fixed set of worker threads that a CPU model reuses for every parallel section of a
// forward pass, instead of starting threads per call: a decode step runs hundreds of small
// projections, and starting and joining a thread costs about as much as one of them.
//
// Idle workers spin briefly (a decode step's next section usually follows within
// microseconds), then sleep on a condition variable, so an idle model takes no CPU from other
// work on the same cores.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::kernels {

class worker_pool {
 public:
  /// A pool that runs sections on `threads` threads in all: the caller's and threads - 1
  /// workers.
  explicit worker_pool(int threads);
  ~worker_pool();
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  /// The threads a section can use, the caller's included.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Runs fn(part) for every part in [0, parts) and returns when all have finished; part 0 on
  /// the calling thread, part i on worker i. parts is capped at size(). A call made while the
  /// pool runs another (from another thread, or from inside fn) runs its parts in turn on the
  /// calling thread.
  void run(int parts, const std::function<void(int)>& fn);

 private:
  void work(int index);

  std::vector<std::thread> workers_;
  std::mutex busy_;  // held by the thread whose section the workers run
  std::mutex m_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  int parts_ = 0;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
};

}  // namespace troupe::kernels
