#include "runtime/ports/store_index.hpp"

#include "runtime/check.hpp"

namespace troupe::runtime {

store_index::instant store_index::expiry_after(instant now, std::int64_t ttl_ns) {
  TROUPE_CHECK(ttl_ns >= 0, "store_index: negative ttl");
  if (ttl_ns == 0)
    return never;
  if (now > never - 1 - ttl_ns)
    return never - 1;
  return now + ttl_ns;
}

const store_index::entry* store_index::find(const store_key& key) const {
  auto i = entries_.find(key);
  return i == entries_.end() ? nullptr : &i->second.e;
}

std::vector<store_key> store_index::sweep(instant now) {
  std::vector<store_key> out;
  while (!expiry_.empty() && expiry_.begin()->first <= now) {
    auto key = expiry_.begin()->second;
    remove(entries_.find(key));
    ++stats_.expired;
    out.push_back(key);
  }
  return out;
}

std::optional<std::vector<store_key>> store_index::make_room(const store_key& key,
                                                             std::uint64_t bytes) {
  if (bytes > capacity_)
    return std::nullopt;
  auto old = entries_.find(key);
  auto freed = old != entries_.end() ? old->second.e.bytes : 0;
  // used - freed + bytes <= capacity  <=>  used <= capacity - bytes + freed
  return evict_until(capacity_ - bytes + freed, key);
}

std::vector<store_key> store_index::evict_until(std::uint64_t target, const store_key& keep) {
  std::vector<store_key> out;
  auto i = lru_.begin();
  while (used_ > target && i != lru_.end()) {
    auto key = i->second;
    ++i; // `remove` erases the current position
    if (key == keep)
      continue;
    remove(entries_.find(key));
    ++stats_.evicted;
    out.push_back(key);
  }
  return out;
}

void store_index::insert(const store_key& key, entry e) {
  auto old = entries_.find(key);
  auto freed = old != entries_.end() ? old->second.e.bytes : 0;
  TROUPE_CHECK(used_ - freed + e.bytes <= capacity_, "store_index: insert without room");
  if (old != entries_.end())
    remove(old);
  auto tick = ++clock_;
  entries_.emplace(key, slot{e, tick});
  lru_.emplace(tick, key);
  if (e.expiry != never)
    expiry_.emplace(e.expiry, key);
  used_ += e.bytes;
}

void store_index::touch(const store_key& key) {
  auto i = entries_.find(key);
  if (i == entries_.end())
    return;
  lru_.erase(i->second.last_use);
  i->second.last_use = ++clock_;
  lru_.emplace(i->second.last_use, key);
}

bool store_index::erase(const store_key& key) {
  auto i = entries_.find(key);
  if (i == entries_.end())
    return false;
  remove(i);
  return true;
}

void store_index::remove(std::map<store_key, slot>::iterator i) {
  TROUPE_CHECK(i != entries_.end(), "store_index: removing an absent entry");
  lru_.erase(i->second.last_use);
  if (i->second.e.expiry != never)
    expiry_.erase({i->second.e.expiry, i->first});
  used_ -= i->second.e.bytes;
  entries_.erase(i);
}

store_stats store_index::stats() const {
  auto s = stats_;
  s.capacity = capacity_;
  s.used = used_;
  s.objects = entries_.size();
  return s;
}

} // namespace troupe::runtime
