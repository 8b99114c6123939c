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

}  // namespace troupe::kernels
