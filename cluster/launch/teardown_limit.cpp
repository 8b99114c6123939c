#include "cluster/launch/teardown_limit.hpp"

#include <caf/abstract_actor.hpp>
#include <caf/actor_cast.hpp>

#include <unistd.h>

namespace troupe::cluster {

teardown_limit::teardown_limit(std::string command, std::chrono::milliseconds limit)
  : command_(std::move(command)), limit_(limit) {
}

teardown_limit::~teardown_limit() {
  {
    std::lock_guard<std::mutex> guard{mtx_};
    done_ = true;
  }
  done_cv_.notify_all();
  if (timer_.joinable())
    timer_.join();
}

void teardown_limit::watch(const caf::actor& a, std::string name) {
  if (!a)
    return;
  auto ended = std::make_shared<std::atomic<bool>>(false);
  caf::actor_cast<caf::abstract_actor*>(a)->attach_functor([ended] { ended->store(true); });
  watched_.push_back({std::move(name), std::move(ended)});
}

void teardown_limit::arm(int status) {
  if (timer_.joinable())
    return;
  timer_ = std::thread([this, status] {
    std::unique_lock<std::mutex> lock{mtx_};
    if (!done_cv_.wait_for(lock, limit_, [this] { return done_; }))
      expire(status);
  });
}

void teardown_limit::expire(int status) {
  std::string running;
  for (const auto& w : watched_)
    if (!w.ended->load())
      running += (running.empty() ? "" : ", ") + w.name;
  const auto ms = limit_.count();
  const auto limit = ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
  std::string line = command_ + ": still stopping after " + limit + " ("
                     + (watched_.empty()   ? "its actors have not all ended"
                        : running.empty() ? "the actors it watched ended; the actor system has not stopped"
                                          : "not ended: " + running)
                     + "); exiting with status " + std::to_string(status) + "\n";
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, line.data(), line.size());
  ::_exit(status);
}

} // namespace troupe::cluster
