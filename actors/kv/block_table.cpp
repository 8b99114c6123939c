#include "actors/kv/block_table.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

namespace troupe::actors {

namespace {

static_assert(std::is_trivially_copyable_v<block_slot>, "block_slot: moved with memmove");

/// The smallest number of home slots.
constexpr std::size_t min_capacity = 1024;
/// Spare slots after the last home slot at least (runs spill there instead of wrapping around).
constexpr std::size_t tail_slots = 1024;

/// Grow when size > 9/10 of the home slots; grow by 1/8.
constexpr bool over_load(std::size_t size, std::size_t capacity) {
  return size * 10 > capacity * 9;
}
constexpr std::size_t grown(std::size_t capacity) {
  return std::max(min_capacity, capacity + capacity / 8);
}

} // namespace

block_slot* block_table::find(const block_key& k) noexcept {
  return const_cast<block_slot*>(std::as_const(*this).find(k));
}

const block_slot* block_table::find(const block_key& k) const noexcept {
  if (size_ == 0)
    return nullptr;
  for (auto i = home(k.hi);; ++i) {
    const auto& s = slots_[i];
    if (s.empty())
      return nullptr;
    if (s.key == k)
      return &s;
    if (k < s.key)
      return nullptr;
  }
}

block_slot& block_table::insert(const block_key& k) {
  for (;;) {
    if (capacity_ == 0 || over_load(size_ + 1, capacity_)) {
      rehash(grown(capacity_), 0);
      continue;
    }
    auto p = home(k.hi);
    while (!slots_[p].empty() && slots_[p].key < k)
      ++p;
    auto e = p;
    while (!slots_[e].empty())
      ++e;
    if (e + 1 >= length_) {
      // The last slot stays empty: a run reached it. Lengthen the tail, not the capacity, so
      // keys crowding the top of the key space (chosen, not hashed) cannot grow it unbounded.
      rehash(capacity_, length_ + (length_ - capacity_));
      continue;
    }
    std::memmove(&slots_[p + 1], &slots_[p], (e - p) * sizeof(block_slot));
    slots_[p] = block_slot{k, 0, 0};
    ++size_;
    return slots_[p];
  }
}

void block_table::erase(block_slot* s) noexcept {
  auto p = static_cast<std::size_t>(s - slots_.get());
  // Entries after p that sit past their home move back one slot; the run ends at an empty
  // slot or at an entry in its home slot.
  auto q = p + 1;
  while (!slots_[q].empty() && home(slots_[q].key.hi) < q)
    ++q;
  std::memmove(&slots_[p], &slots_[p + 1], (q - p - 1) * sizeof(block_slot));
  slots_[q - 1] = block_slot{};
  --size_;
}

void block_table::rehash(std::size_t capacity, std::size_t min_length) {
  auto home_in = [capacity](std::uint64_t hi) {
    return static_cast<std::size_t>((static_cast<unsigned __int128>(hi) * capacity) >> 64);
  };
  // The old slots are in key order and the home is monotone in the key: each entry goes to
  // max(its home, the slot after the previous one). A first pass finds the length needed.
  std::size_t end = 0;
  for (std::size_t i = 0; i < length_; ++i)
    if (!slots_[i].empty())
      end = std::max(home_in(slots_[i].key.hi), end) + 1;
  auto length = std::max({capacity + tail_slots, min_length, end + 1});
  // calloc: an all-zero slot is empty, and large zeroed blocks come from the kernel untouched.
  auto* fresh = static_cast<block_slot*>(std::calloc(length, sizeof(block_slot)));
  if (fresh == nullptr)
    throw std::bad_alloc();
  std::size_t pos = 0;
  for (std::size_t i = 0; i < length_; ++i) {
    const auto& s = slots_[i];
    if (s.empty())
      continue;
    auto at = std::max(home_in(s.key.hi), pos);
    fresh[at] = s;
    pos = at + 1;
  }
  slots_.reset(fresh);
  capacity_ = capacity;
  length_ = length;
}

} // namespace troupe::actors
