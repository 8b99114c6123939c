#include "actors/kv/kv_index.hpp"

#include "runtime/check.hpp"

#include <algorithm>

namespace troupe::actors {

namespace {

std::int64_t to_ns(runtime::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

runtime::time_point from_ns(std::int64_t ns) {
  return runtime::time_point{std::chrono::duration_cast<runtime::time_point::duration>(
    std::chrono::nanoseconds{ns})};
}

runtime::time_point expiry_of(const block_slot& e) {
  return from_ns(e.expiry_ns());
}

/// The expiry of the i-th block of one call's span: i nanoseconds before the call's. The
/// blocks of a chain placed at one instant with one TTL so expire deepest first, and the
/// eviction order (by expiry) takes a chain's tail before its prefix with no sequence number
/// held per entry. Each block expires at most its depth in nanoseconds early, never late.
runtime::time_point at_depth(runtime::time_point expiry, std::size_t i) {
  return expiry - std::chrono::nanoseconds(static_cast<std::int64_t>(i));
}

/// How many blocks of a chain ahead of the one looked up are prefetched (block_table::prefetch).
constexpr std::size_t prefetch_ahead = 8;

/// Prefetches block i + prefetch_ahead of `blocks` (and at i = 0 the ones before it).
void prefetch_ahead_of(const block_table& t, std::span<const block_key> blocks, std::size_t i) {
  if (i == 0)
    for (std::size_t j = 0; j < std::min(prefetch_ahead, blocks.size()); ++j)
      t.prefetch(blocks[j]);
  if (i + prefetch_ahead < blocks.size())
    t.prefetch(blocks[i + prefetch_ahead]);
}

} // namespace

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
  // probe, then touch the hits, in one pass: each block is looked up once.
  auto hits = probe(chain, now, now + params_.ttl.of(cls));
  account_match(stats_, static_cast<std::uint32_t>(hits), chain.size(), prompt_tokens);
  return {static_cast<std::uint32_t>(hits), static_cast<std::uint64_t>(hits) * block_tokens};
}

std::size_t kv_index::probe(std::span<const block_key> blocks, runtime::time_point now,
                            std::optional<runtime::time_point> extend_to) {
  auto hits = blocks.size();
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    prefetch_ahead_of(entries_, blocks, i);
    auto* e = entries_.find(blocks[i]);
    if (e == nullptr) {
      hits = i;
      break;
    }
    const bool expired = now >= expiry_of(*e);
    if (expired && !params_.test_ignore_expiry) {
      remove(e, true);
      hits = i;
      break;
    }
    if (e->pending()) {
      hits = i;
      break;
    }
    // The TTL audit: a block served at or after its expiry (only the planted bug gets here).
    if (expired)
      ++stats_.served_expired;
    else if (extend_to)
      extend(*e, at_depth(*extend_to, i));
  }
  return hits;
}

void kv_index::touch(std::span<const block_key> blocks, traffic_class cls,
                     runtime::time_point now) {
  auto expiry = now + params_.ttl.of(cls);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    prefetch_ahead_of(entries_, blocks, i);
    auto* e = entries_.find(blocks[i]);
    if (e != nullptr && !e->pending() && now < expiry_of(*e))
      extend(*e, at_depth(expiry, i));
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
  const auto call_expiry = now + params_.ttl.of(cls);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    prefetch_ahead_of(entries_, blocks, i);
    const auto& k = blocks[i];
    const auto expiry = at_depth(call_expiry, i);
    auto* e = entries_.find(k);
    if (e != nullptr && now >= expiry_of(*e)) {
      remove(e, true);
      e = nullptr;
    }
    if (e != nullptr) {
      if (!e->pending()) {
        r.refreshed += 1;
      } else {
        r.inserted += 1;
        if (!pending) {
          e->set_pending(false);
          stats_.pending -= 1;
          stats_.committed += 1;
        }
      }
      e->set_cls(cls);
      extend(*e, expiry);
      continue;
    }
    if (!make_room(now, expiry)) {
      r.rejected += static_cast<std::uint32_t>(blocks.size() - i);
      break;
    }
    auto& n = entries_.insert(k);
    n.set_cls(cls);
    n.set_pending(pending);
    place(n, expiry);
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
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    prefetch_ahead_of(entries_, blocks, i);
    const auto& k = blocks[i];
    auto* e = entries_.find(k);
    if (e != nullptr && now >= expiry_of(*e)) {
      remove(e, true);
      e = nullptr;
    }
    if (e == nullptr) {
      r.missing += 1;
      continue;
    }
    if (e->pending()) {
      e->set_pending(false);
      stats_.pending -= 1;
      stats_.committed += 1;
      extend(*e, at_depth(now + params_.ttl.of(e->cls()), i));
    }
    r.committed += 1;
  }
  return r;
}

bool kv_index::contains(const block_key& k, runtime::time_point now) const {
  const auto* e = entries_.find(k);
  return e != nullptr && !e->pending() && now < expiry_of(*e);
}

std::optional<runtime::time_point> kv_index::expiry(const block_key& k) const {
  const auto* e = entries_.find(k);
  if (e == nullptr)
    return std::nullopt;
  return expiry_of(*e);
}

kv_stats kv_index::stats() const {
  auto s = stats_;
  s.entries = entries_.size();
  return s;
}

void kv_index::place(block_slot& e, runtime::time_point expiry) {
  if (ordered_ && !e.empty())
    order_.erase(order_key{e.expiry_ns(), e.key});
  e.set_expiry_ns(to_ns(expiry));
  if (ordered_)
    order_.insert(order_key{e.expiry_ns(), e.key});
}

void kv_index::build_order() {
  entries_.for_each(
    [this](const block_slot& e) { order_.insert(order_key{e.expiry_ns(), e.key}); });
  ordered_ = true;
}

void kv_index::extend(block_slot& e, runtime::time_point expiry) {
  if (expiry > expiry_of(e))
    place(e, expiry);
}

void kv_index::remove(block_slot* e, bool expired) {
  if (ordered_)
    order_.erase(order_key{e->expiry_ns(), e->key});
  if (e->pending())
    stats_.pending -= 1;
  stats_.bytes -= params_.block_bytes;
  if (expired)
    stats_.expirations += 1;
  else
    stats_.evictions += 1;
  entries_.erase(e);
}

bool kv_index::make_room(runtime::time_point now, runtime::time_point expiry) {
  while (stats_.bytes + params_.block_bytes > params_.capacity_bytes) {
    if (!ordered_)
      build_order();
    if (order_.empty())
      return false;
    const auto oldest = *order_.begin();
    const auto oldest_expiry = from_ns(oldest.expiry_ns);
    bool expired = now >= oldest_expiry;
    if (!expired && oldest_expiry >= expiry)
      return false;
    auto* e = entries_.find(block_key{oldest.key, 0});
    TROUPE_CHECK(e != nullptr, "kv_index: eviction order names a missing entry");
    remove(e, expired);
  }
  return true;
}

} // namespace troupe::actors
