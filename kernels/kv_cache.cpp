#include "kernels/kv_cache.hpp"

#include <algorithm>

namespace troupe::kernels {

paged_rows::paged_rows(std::int64_t width, std::int64_t rows_per_block)
    : width_(width), rows_per_block_(std::max<std::int64_t>(1, rows_per_block)) {}

void paged_rows::append(const float* row) {
  const auto in_block = size_ % rows_per_block_;
  if (in_block == 0) blocks_.emplace_back(static_cast<std::size_t>(rows_per_block_ * width_), 0.0f);
  std::copy(row, row + width_, blocks_.back().data() + in_block * width_);
  ++size_;
}

void paged_rows::pop_back(std::int64_t n) {
  size_ -= n;
  blocks_.resize(static_cast<std::size_t>((size_ + rows_per_block_ - 1) / rows_per_block_));
}

const float* paged_rows::row(std::int64_t i) const {
  return blocks_[static_cast<std::size_t>(i / rows_per_block_)].data() +
         (i % rows_per_block_) * width_;
}

std::span<const float> paged_rows::block(std::int64_t b) const {
  return blocks_[static_cast<std::size_t>(b)];
}

swa_ring::swa_ring(std::int64_t width, std::int64_t capacity)
    : width_(width), capacity_(capacity), rows_(static_cast<std::size_t>(width * capacity), 0.0f) {}

void swa_ring::push(const float* row) {
  std::copy(row, row + width_, rows_.data() + (end_ % capacity_) * width_);
  ++end_;
}

const float* swa_ring::at(std::int64_t position) const {
  return rows_.data() + (position % capacity_) * width_;
}

result<bool> rollback(sequence_cache& s, std::int64_t k) {
  auto fail = [](std::string msg) { return result<bool>::failure(std::move(msg)); };
  if (k < 0 || k > swa_rollback_tokens)
    return fail("rollback: " + std::to_string(k) + " tokens, expected 0 to " +
                std::to_string(swa_rollback_tokens));
  if (s.length - k < s.rollback_floor)
    return fail("rollback: " + std::to_string(k) + " tokens, only " +
                std::to_string(s.length - s.rollback_floor) +
                " since the start or the previous rollback");
  const std::int64_t length = s.length - k;
  for (auto& layer : s.layers) {
    layer.window.truncate(length);
    if (!layer.is_kv_source) continue;
    auto& c = layer.compressed;
    const std::int64_t r = c.ratio;
    const std::int64_t groups = r > 1 ? length / r : length;
    c.kv.pop_back(c.kv.size() - std::min(c.kv.size(), groups));
    c.index_keys.pop_back(c.index_keys.size() - std::min(c.index_keys.size(), groups));
    c.groups = groups;
    if (r > 1) {
      const std::int64_t width = c.kv.width();
      // recent rows cover positions [s.length - recent_tokens, s.length).
      const std::int64_t first = s.length - c.recent_tokens;
      const std::int64_t from = groups * r - first, to = length - first;
      c.pending_kv.assign(c.recent_kv.begin() + from * width, c.recent_kv.begin() + to * width);
      c.pending_gate.assign(c.recent_gate.begin() + from * width,
                            c.recent_gate.begin() + to * width);
      c.pending_tokens = to - from;
      c.recent_kv.resize(static_cast<std::size_t>(to * width));
      c.recent_gate.resize(static_cast<std::size_t>(to * width));
      c.recent_tokens = to;
    }
  }
  s.engram_recent.resize(
      s.engram_recent.size() -
      std::min<std::size_t>(s.engram_recent.size(), static_cast<std::size_t>(k)));
  s.length = length;
  s.rollback_floor = length;
  return true;
}

}  // namespace troupe::kernels
