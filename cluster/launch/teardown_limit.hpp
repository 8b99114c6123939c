// teardown_limit: a node process that said it stops also ends, within a bounded time.
//
// After `troupe node` prints "stopped" its actor system still waits for every actor to end
// (ports join their threads, the fabric link closes its endpoint). If one of them never ends
// (a library call that does not return on teardown), the process would stay: under Slurm its
// step never completes and the job with it, under `troupe launch` the launcher waits. Armed
// once the process stops, the limit lets the teardown run for its time; past that, it writes
// which of the watched actors have not ended (or that they all did and the actor system
// itself still stops) and exits the process with the status it meant to end with.
#pragma once

#include <caf/actor.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace troupe::cluster {

class teardown_limit {
public:
  /// `command` prefixes the message ("troupe node[store]"); `limit` is the time allowed.
  teardown_limit(std::string command, std::chrono::milliseconds limit);
  /// Disarms the limit: the teardown ended in time.
  ~teardown_limit();

  teardown_limit(const teardown_limit&) = delete;
  teardown_limit& operator=(const teardown_limit&) = delete;

  /// Notes `a`'s end under `name`, for the message. Call while `a` runs (before `arm`).
  void watch(const caf::actor& a, std::string name);

  /// Starts the clock: after the limit the process writes its message to stderr and calls
  /// _exit(status), unless this object was destroyed first. Arming twice keeps the first.
  void arm(int status);

private:
  struct watched {
    std::string name;
    std::shared_ptr<std::atomic<bool>> ended;
  };

  void expire(int status);

  std::string command_;
  std::chrono::milliseconds limit_;
  std::vector<watched> watched_;
  std::mutex mtx_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread timer_;
};

} // namespace troupe::cluster
