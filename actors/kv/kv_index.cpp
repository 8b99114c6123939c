#include "actors/kv/kv_index.hpp"

#include "runtime/check.hpp"

#include <algorithm>

namespace troupe::actors {

runtime::duration kv_ttls::of(traffic_class c) const {
  switch (c) {
    case traffic_class::chatbot:
      return chatbot;
    case traffic_class::agent:
      return agent;
    case traffic_class::batch:
      return batch;
  }
  return chatbot;
}

void account_match(kv_stats& s, std::uint32_t hits, std::size_t chain_blocks,
                   std::uint64_t prompt_tokens) {
  auto chain_tokens = static_cast<std::uint64_t>(chain_blocks) * block_tokens;
  auto total = std::max(prompt_tokens, chain_tokens);
  auto hit_tokens = static_cast<std::uint64_t>(hits) * block_tokens;
  s.lookups += 1;
  s.hit_blocks += hits;
  s.miss_blocks += chain_blocks - hits;
  s.hit_tokens += hit_tokens;
  s.miss_tokens += total - hit_tokens;
}

kv_index::kv_index(kv_index_params params) : params_(params) {
  TROUPE_CHECK(params_.block_bytes > 0, "kv_index: block_bytes must be > 0");
  stats_.capacity_bytes = params_.capacity_bytes;
}

kv_match_result kv_index::match(std::span<const block_key> chain, traffic_class cls,
                                runtime::time_point now, std::uint64_t prompt_tokens) {
  auto hits = probe(chain, now);
  touch(chain.first(hits), cls, now);
  account_match(stats_, static_cast<std::uint32_t>(hits), chain.size(), prompt_tokens);
  return {static_cast<std::uint32_t>(hits), static_cast<std::uint64_t>(hits) * block_tokens};
}

std::size_t kv_index::probe(std::span<const block_key> blocks, runtime::time_point now) {
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    auto it = entries_.find(blocks[i]);
    if (it == entries_.end())
      return i;
    if (now >= it->second.expiry) {
      remove(it, true);
      return i;
    }
    if (it->second.pending)
      return i;
  }
  return blocks.size();
}

void kv_index::touch(std::span<const block_key> blocks, traffic_class cls,
                     runtime::time_point now) {
  auto expiry = now + params_.ttl.of(cls);
  for (const auto& k : blocks) {
    auto it = entries_.find(k);
    if (it != entries_.end() && !it->second.pending && now < it->second.expiry)
      extend(k, it->second, expiry);
  }
}

kv_insert_result kv_index::insert(std::span<const block_key> blocks, traffic_class cls,
                                  runtime::time_point now) {
  return put(blocks, cls, now, false);
}

kv_insert_result kv_index::reserve(std::span<const block_key> blocks, traffic_class cls,
                                   runtime::time_point now) {
  return put(blocks, cls, now, true);
}

kv_insert_result kv_index::put(std::span<const block_key> blocks, traffic_class cls,
                               runtime::time_point now, bool pending) {
  kv_insert_result r;
  auto expiry = now + params_.ttl.of(cls);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& k = blocks[i];
    auto it = entries_.find(k);
    if (it != entries_.end() && now >= it->second.expiry) {
      remove(it, true);
      it = entries_.end();
    }
    if (it != entries_.end()) {
      auto& e = it->second;
      if (!e.pending) {
        r.refreshed += 1;
      } else {
        r.inserted += 1;
        if (!pending) {
          e.pending = false;
          stats_.pending -= 1;
          stats_.committed += 1;
        }
      }
      e.cls = cls;
      extend(k, e, expiry);
      continue;
    }
    if (!make_room(now, expiry)) {
      r.rejected += static_cast<std::uint32_t>(blocks.size() - i);
      break;
    }
    auto& e = entries_[k];
    e.cls = cls;
    e.pending = pending;
    place(k, e, expiry);
    stats_.bytes += params_.block_bytes;
    if (pending)
      stats_.pending += 1;
    r.inserted += 1;
  }
  stats_.inserted += r.inserted;
  stats_.refreshed += r.refreshed;
  stats_.rejected += r.rejected;
  return r;
}

kv_commit_result kv_index::commit(std::span<const block_key> blocks, runtime::time_point now) {
  kv_commit_result r;
  for (const auto& k : blocks) {
    auto it = entries_.find(k);
    if (it != entries_.end() && now >= it->second.expiry) {
      remove(it, true);
      it = entries_.end();
    }
    if (it == entries_.end()) {
      r.missing += 1;
      continue;
    }
    auto& e = it->second;
    if (e.pending) {
      e.pending = false;
      stats_.pending -= 1;
      stats_.committed += 1;
      extend(k, e, now + params_.ttl.of(e.cls));
    }
    r.committed += 1;
  }
  return r;
}

bool kv_index::contains(const block_key& k, runtime::time_point now) const {
  auto it = entries_.find(k);
  return it != entries_.end() && !it->second.pending && now < it->second.expiry;
}

std::optional<runtime::time_point> kv_index::expiry(const block_key& k) const {
  auto it = entries_.find(k);
  if (it == entries_.end())
    return std::nullopt;
  return it->second.expiry;
}

kv_stats kv_index::stats() const {
  auto s = stats_;
  s.entries = entries_.size();
  return s;
}

void kv_index::place(const block_key& k, entry& e, runtime::time_point expiry) {
  if (ordered_ && e.seq != 0)
    order_.erase(order_key{e.expiry, ~e.seq, k});
  e.expiry = expiry;
  e.seq = ++next_seq_;
  if (ordered_)
    order_.insert(order_key{e.expiry, ~e.seq, k});
}

void kv_index::build_order() {
  for (const auto& [k, e] : entries_)
    order_.insert(order_key{e.expiry, ~e.seq, k});
  ordered_ = true;
}

void kv_index::extend(const block_key& k, entry& e, runtime::time_point expiry) {
  if (expiry > e.expiry)
    place(k, e, expiry);
}

void kv_index::remove(map_type::iterator it, bool expired) {
  auto& e = it->second;
  if (ordered_)
    order_.erase(order_key{e.expiry, ~e.seq, it->first});
  if (e.pending)
    stats_.pending -= 1;
  stats_.bytes -= params_.block_bytes;
  if (expired)
    stats_.expirations += 1;
  else
    stats_.evictions += 1;
  entries_.erase(it);
}

bool kv_index::make_room(runtime::time_point now, runtime::time_point expiry) {
  while (stats_.bytes + params_.block_bytes > params_.capacity_bytes) {
    if (!ordered_)
      build_order();
    if (order_.empty())
      return false;
    const auto& oldest = *order_.begin();
    bool expired = now >= oldest.expiry;
    if (!expired && oldest.expiry >= expiry)
      return false;
    auto it = entries_.find(oldest.key);
    TROUPE_CHECK(it != entries_.end(), "kv_index: eviction order names a missing entry");
    remove(it, expired);
  }
  return true;
}

} // namespace troupe::actors
