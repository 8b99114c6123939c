#include "kernels/ep_exchange.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace troupe::kernels {
namespace {

// Two phases per call: every rank posts its buffer (then each copies the others' segments
// straight from their buffers), and every rank reports its copy done (then the buffers may
// change again). A generation number tells one call's waits from the next one's.
class local_group final : public ep_exchange {
 public:
  explicit local_group(std::int32_t ranks) : buffers_(static_cast<std::size_t>(ranks)) {}

  std::int32_t ranks() const override { return static_cast<std::int32_t>(buffers_.size()); }

  result<bool> all_gather(std::int32_t rank, std::span<float> buffer,
                          std::span<const std::int64_t> offsets) override {
    using r = result<bool>;
    const auto n = ranks();
    if (rank < 0 || rank >= n || offsets.size() != buffers_.size() + 1
        || offsets.back() > static_cast<std::int64_t>(buffer.size()))
      return r::failure("EP exchange: rank " + std::to_string(rank) + " of " + std::to_string(n)
                        + " called with " + std::to_string(offsets.size())
                        + " offsets for a buffer of " + std::to_string(buffer.size()) + " floats");
    std::unique_lock lock(mutex_);
    if (!failure_.empty()) return r::failure(failure_);
    const auto generation = generation_;
    buffers_[static_cast<std::size_t>(rank)] = buffer.data();
    if (++posted_ == n) {
      posted_ = 0;
      ready_ = generation + 1;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return ready_ > generation || !failure_.empty(); });
      if (!failure_.empty()) return r::failure(failure_);
    }
    lock.unlock();
    for (std::int32_t other = 0; other < n; ++other) {
      if (other == rank) continue;
      const auto b = offsets[static_cast<std::size_t>(other)];
      const auto e = offsets[static_cast<std::size_t>(other) + 1];
      const float* src = buffers_[static_cast<std::size_t>(other)];
      std::copy(src + b, src + e, buffer.data() + b);
    }
    lock.lock();
    if (++copied_ == n) {
      copied_ = 0;
      ++generation_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return generation_ > generation || !failure_.empty(); });
      if (!failure_.empty()) return r::failure(failure_);
    }
    return true;
  }

  void abort(const std::string& why) override {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = "EP group aborted: " + why;
    changed_.notify_all();
  }

  void reset() override {
    std::lock_guard lock(mutex_);
    failure_.clear();
    posted_ = copied_ = 0;
    ready_ = generation_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<const float*> buffers_;
  std::int32_t posted_ = 0, copied_ = 0;
  std::uint64_t generation_ = 0, ready_ = 0;
  std::string failure_;
};

}  // namespace

std::shared_ptr<ep_exchange> local_exchange(std::int32_t ranks) {
  return std::make_shared<local_group>(std::max(1, ranks));
}

}  // namespace troupe::kernels
