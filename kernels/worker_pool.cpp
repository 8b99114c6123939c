#include "kernels/worker_pool.hpp"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace troupe::kernels {

namespace {

// Roughly 50 µs of polling before an idle worker (or a waiting caller) goes to sleep.
constexpr int spin_rounds = 4096;

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

worker_pool::worker_pool(int threads) {
  const int workers = std::max(threads, 1) - 1;
  workers_.reserve(static_cast<std::size_t>(workers));
  for (int i = 1; i <= workers; ++i) workers_.emplace_back([this, i] { work(i); });
}

worker_pool::~worker_pool() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void worker_pool::run(int parts, const std::function<void(int)>& fn) {
  parts = std::min(parts, size());
  if (parts <= 1 || !busy_.try_lock()) {
    for (int p = 0; p < parts; ++p) fn(p);
    return;
  }
  std::unique_lock busy(busy_, std::adopt_lock);
  {
    std::lock_guard lock(m_);
    fn_ = &fn;
    parts_ = parts;
    pending_.store(parts - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  fn(0);
  for (int i = 0; i < spin_rounds && pending_.load(std::memory_order_acquire) != 0; ++i) relax();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock lock(m_);
    done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

void worker_pool::work(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < spin_rounds && generation_.load(std::memory_order_acquire) == seen; ++i)
      relax();
    const std::function<void(int)>* fn = nullptr;
    int parts = 0;
    {
      std::unique_lock lock(m_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      seen = generation_.load(std::memory_order_acquire);
      if (stop_) return;
      fn = fn_;
      parts = parts_;
    }
    if (index >= parts) continue;
    (*fn)(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(m_);
      done_.notify_one();
    }
  }
}

}  // namespace troupe::kernels
