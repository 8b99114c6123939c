#include "kernels/kv_cache.hpp"

#include <algorithm>

namespace troupe::kernels {

block_id block_pool::allocate(std::int64_t floats) {
  std::lock_guard lock(mutex_);
  block_id id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<block_id>(pages_.size());
    pages_.emplace_back();
  }
  pages_[static_cast<std::size_t>(id)].assign(static_cast<std::size_t>(floats), 0.0f);
  return id;
}

void block_pool::release(block_id id) {
  std::lock_guard lock(mutex_);
  free_.push_back(id);
}

float* block_pool::data(block_id id) {
  std::lock_guard lock(mutex_);
  return pages_[static_cast<std::size_t>(id)].data();
}

std::int64_t block_pool::pages_in_use() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::int64_t>(pages_.size() - free_.size());
}

std::int64_t block_pool::pages_allocated() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::int64_t>(pages_.size());
}

paged_rows::paged_rows(std::int64_t width, std::int64_t rows_per_block,
                       std::shared_ptr<block_pool> pool)
    : width_(width),
      rows_per_block_(std::max<std::int64_t>(1, rows_per_block)),
      pool_(std::move(pool)) {}

paged_rows::paged_rows(const paged_rows& other)
    : width_(other.width_),
      rows_per_block_(other.rows_per_block_),
      pool_(other.pool_),
      flat_(other.flat_) {
  if (pool_ == nullptr) {
    size_ = other.size_;
    return;
  }
  for (std::int64_t i = 0; i < other.size_; ++i) append(other.row(i));
}

paged_rows& paged_rows::operator=(const paged_rows& other) {
  if (this != &other) {
    paged_rows copy(other);
    *this = std::move(copy);
  }
  return *this;
}

paged_rows::paged_rows(paged_rows&& other) noexcept
    : width_(other.width_),
      rows_per_block_(other.rows_per_block_),
      size_(other.size_),
      pool_(std::move(other.pool_)),
      table_(std::move(other.table_)),
      pages_(std::move(other.pages_)),
      flat_(std::move(other.flat_)) {
  other.size_ = 0;
  other.table_.clear();
  other.pages_.clear();
}

paged_rows& paged_rows::operator=(paged_rows&& other) noexcept {
  if (this != &other) {
    clear();
    width_ = other.width_;
    rows_per_block_ = other.rows_per_block_;
    size_ = other.size_;
    pool_ = std::move(other.pool_);
    table_ = std::move(other.table_);
    pages_ = std::move(other.pages_);
    flat_ = std::move(other.flat_);
    other.size_ = 0;
    other.table_.clear();
    other.pages_.clear();
  }
  return *this;
}

paged_rows::~paged_rows() { clear(); }

void paged_rows::clear() {
  if (pool_ != nullptr)
    for (block_id id : table_) pool_->release(id);
  table_.clear();
  pages_.clear();
  flat_.clear();
  size_ = 0;
}

void paged_rows::append(const float* row) {
  if (pool_ == nullptr) {
    flat_.insert(flat_.end(), row, row + width_);
    ++size_;
    return;
  }
  const auto in_block = size_ % rows_per_block_;
  if (in_block == 0) {
    table_.push_back(pool_->allocate(rows_per_block_ * width_));
    pages_.push_back(pool_->data(table_.back()));
  }
  std::copy(row, row + width_, pages_.back() + in_block * width_);
  ++size_;
}

void paged_rows::pop_back(std::int64_t n) {
  size_ -= n;
  if (pool_ == nullptr) {
    flat_.resize(static_cast<std::size_t>(size_ * width_));
    return;
  }
  const auto blocks = static_cast<std::size_t>(block_count());
  for (std::size_t b = blocks; b < table_.size(); ++b) pool_->release(table_[b]);
  table_.resize(blocks);
  pages_.resize(blocks);
}

const float* paged_rows::row(std::int64_t i) const {
  if (pool_ == nullptr) return flat_.data() + i * width_;
  return pages_[static_cast<std::size_t>(i / rows_per_block_)] + (i % rows_per_block_) * width_;
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
