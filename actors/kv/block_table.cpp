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

/// Grow when size > 93/100 of the home slots; grow by 1/16.
constexpr bool over_load(std::size_t size, std::size_t capacity) {
  return size * 100 > capacity * 93;
}
constexpr std::size_t grown(std::size_t capacity) {
  return std::max(min_capacity, capacity + capacity / 16);
}

} // namespace

block_table::block_table(const block_table& other)
    : capacity_(other.capacity_), length_(other.length_), size_(other.size_) {
  if (length_ == 0)
    return;
  auto* copy = static_cast<block_slot*>(std::malloc(length_ * sizeof(block_slot)));
  if (copy == nullptr)
    throw std::bad_alloc();
  std::memcpy(static_cast<void*>(copy), other.slots_.get(), length_ * sizeof(block_slot));
  slots_.reset(copy);
}

block_table& block_table::operator=(const block_table& other) {
  if (this != &other) {
    block_table copy(other);
    *this = std::move(copy);
  }
  return *this;
}

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
    if (s.key == k.hi)
      return &s;
    if (k.hi < s.key)
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
    while (!slots_[p].empty() && slots_[p].key < k.hi)
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
    slots_[p] = block_slot{k.hi, 0};
    ++size_;
    return slots_[p];
  }
}

void block_table::erase(block_slot* s) noexcept {
  auto p = static_cast<std::size_t>(s - slots_.get());
  // Entries after p that sit past their home move back one slot; the run ends at an empty
  // slot or at an entry in its home slot.
  auto q = p + 1;
  while (!slots_[q].empty() && home(slots_[q].key) < q)
    ++q;
  std::memmove(&slots_[p], &slots_[p + 1], (q - p - 1) * sizeof(block_slot));
  slots_[q - 1] = block_slot{};
  --size_;
}

void block_table::rehash(std::size_t capacity, std::size_t min_length) {
  auto home_in = [capacity](std::uint64_t hi) {
    return static_cast<std::size_t>((static_cast<unsigned __int128>(hi) * capacity) >> 64);
  };
  // In place, so a growing shard never holds two arrays: the j-th entry in key order goes to
  // pos_j = max(home_j, pos_{j-1} + 1) = j + max_{i<=j}(home_i - i), and the array must end
  // after pos_{n-1} + 1 = n + max_i(home_i - i) (plus the empty last slot).
  std::size_t n = 0;
  std::size_t lift = 0; // max(0, max_i(home_i - i))
  for (std::size_t i = 0; i < length_; ++i) {
    if (slots_[i].empty())
      continue;
    auto h = home_in(slots_[i].key);
    if (h > n)
      lift = std::max(lift, h - n);
    ++n;
  }
  auto length = std::max({capacity + tail_slots, min_length, n + lift + 1, length_});
  if (length != length_) {
    // realloc: a large array is remapped by the kernel, not copied.
    auto* grown_slots =
      static_cast<block_slot*>(std::realloc(slots_.get(), length * sizeof(block_slot)));
    if (grown_slots == nullptr)
      throw std::bad_alloc();
    (void) slots_.release();
    slots_.reset(grown_slots);
    std::memset(static_cast<void*>(slots_.get() + length_), 0, (length - length_) * sizeof(block_slot));
  }
  // Pack the entries, in order, against the end: [length - n, length); each moves right.
  auto w = length;
  for (auto i = length_; i-- > 0;) {
    if (slots_[i].empty())
      continue;
    if (--w != i)
      slots_[w] = slots_[i];
  }
  std::memset(static_cast<void*>(slots_.get()), 0, (length - n) * sizeof(block_slot));
  // Spread them to their places; each moves left (pos_j <= length - n + j since
  // lift <= length - n - 1), never onto an entry not yet moved.
  std::size_t pos = 0;
  for (std::size_t j = 0; j < n; ++j) {
    auto from = length - n + j;
    auto at = std::max(home_in(slots_[from].key), pos);
    if (at != from) {
      slots_[at] = slots_[from];
      slots_[from] = block_slot{};
    }
    pos = at + 1;
  }
  capacity_ = capacity;
  length_ = length;
}

} // namespace troupe::actors
