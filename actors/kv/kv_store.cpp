#include "actors/kv/kv_store.hpp"

#include "runtime/check.hpp"
#include "runtime/ports/delayed_reply.hpp"

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

namespace troupe::actors {

namespace {

// -- one shard ------------------------------------------------------------------------------

struct shard_state {
  std::optional<kv_index> index;
  kv_index_params params;
  /// Failed by a fault (kv_shard_fault_atom): answers as a failed shard until it comes back.
  bool down = false;
  /// The factors of the slowdowns in force (kv_shard_slow_atom); the largest applies.
  std::multiset<double> slow;
  static inline const char* name = "kv_store";
};

using shard_ptr = kv_shard_actor::stateful_pointer<shard_state>;

/// Records `act` on `blocks` at `now` in the shard's history, if it keeps one.
void record(shard_ptr self, std::span<const block_key> blocks, kv_act act, traffic_class cls,
            runtime::time_point now) {
  auto& h = self->state.params.history;
  if (!h)
    return;
  std::vector<kv_fact> facts;
  facts.reserve(blocks.size());
  for (const auto& k : blocks)
    facts.push_back(kv_fact{now, k, act, cls});
  h->add(facts);
}

/// The blocks a put placed or refreshed: all but the rejected tail.
std::span<const block_key> placed(const std::vector<block_key>& blocks,
                                  const kv_insert_result& r) {
  return std::span<const block_key>{blocks}.first(blocks.size() - r.rejected);
}

/// `r`, answered after the shard's operation latency (times its slowdown): at once when that
/// is zero.
template <class T>
caf::result<T> answer(shard_ptr self, T r) {
  auto& st = self->state;
  auto latency = st.params.op_latency;
  if (!st.slow.empty())
    latency = runtime::from_seconds(runtime::to_seconds(latency) * *st.slow.rbegin());
  if (latency.count() <= 0)
    return r;
  runtime::detail::reply_at(self, self->clock().now() + latency, std::move(r));
  return caf::delegated<T>{};
}

kv_shard_actor::behavior_type shard_fn(shard_ptr self, kv_index_params params) {
  self->state.index.emplace(params);
  self->state.params = params;
  auto now = [self] { return self->clock().now(); };
  auto rejected = [](std::size_t n) {
    kv_insert_result r;
    r.rejected = static_cast<std::uint32_t>(n);
    return r;
  };
  return {
    [self](kv_shard_fault_atom, std::uint32_t, bool down) {
      // Down or back up, the shard's metadata is gone: it starts over empty.
      auto& st = self->state;
      st.down = down;
      st.index.emplace(st.params);
    },
    [self](kv_shard_slow_atom, std::uint32_t, double factor, bool on) {
      auto& slow = self->state.slow;
      if (on)
        slow.insert(factor);
      else if (auto i = slow.find(factor); i != slow.end())
        slow.erase(i);
    },
    [self, now](const kv_match& m) {
      if (self->state.down)
        return answer(self, kv_match_result{});
      auto r = self->state.index->match(m.chain, m.traffic, now(), m.prompt_tokens);
      auto served = std::span<const block_key>{m.chain}.first(r.hit_blocks);
      record(self, served, kv_act::hit, m.traffic, now());
      record(self, served, kv_act::refresh, m.traffic, now());
      return answer(self, r);
    },
    [self, now, rejected](const kv_insert& m) {
      if (self->state.down)
        return answer(self, rejected(m.blocks.size()));
      auto r = self->state.index->insert(m.blocks, m.traffic, now());
      record(self, placed(m.blocks, r), kv_act::write, m.traffic, now());
      return answer(self, r);
    },
    // Reserve and commit answer at once: the simulated writer's pair is one step (it carries
    // no bytes), and a delay between them would leave a reservation behind whenever the
    // writer's instance stops in between (no reservation lease yet: kv-store.md).
    [self, now, rejected](const kv_reserve& m) {
      if (self->state.down)
        return rejected(m.blocks.size());
      auto r = self->state.index->reserve(m.blocks, m.traffic, now());
      record(self, placed(m.blocks, r), kv_act::reserve, m.traffic, now());
      return r;
    },
    [self, now](const kv_commit& m) {
      if (self->state.down) {
        kv_commit_result r;
        r.missing = static_cast<std::uint32_t>(m.blocks.size());
        return r;
      }
      record(self, m.blocks, kv_act::commit, traffic_class::chatbot, now());
      return self->state.index->commit(m.blocks, now());
    },
    [self](kv_stats_atom) { return self->state.index->stats(); },
    [self, now](const kv_probe& m) {
      if (self->state.down)
        return answer(self, std::uint32_t{0});
      auto lead = self->state.index->probe(m.blocks, now());
      record(self, std::span<const block_key>{m.blocks}.first(lead), kv_act::hit,
             traffic_class::chatbot, now());
      return answer(self, static_cast<std::uint32_t>(lead));
    },
    [self, now](const kv_touch& m) {
      if (self->state.down)
        return;
      self->state.index->touch(m.blocks, m.traffic, now());
      record(self, m.blocks, kv_act::refresh, m.traffic, now());
    },
  };
}

// -- the sharding front ---------------------------------------------------------------------

struct router_state {
  kv_router_params params;
  /// Match accounting (lookups, hits, misses); the shards hold the rest.
  kv_stats matches;
  static inline const char* name = "kv_router";
};

using router_actor = kv_check_actor::stateful_pointer<router_state>;

/// Called first in every handler of a shard's answer: removes the answered request's timeout
/// from the clock. CAF 0.17 leaves it there otherwise, and it fires later as a second event
/// (a timer, then a request_timeout error the router drops) for every shard request: a fifth
/// of all the simulator's events before this.
void settle(router_actor self) {
  self->clock().cancel_request_timeout(self, self->current_message_id());
}

/// One chain split by shard: each shard's blocks and their positions in the chain, in order.
struct split_chain {
  std::vector<std::vector<block_key>> blocks;
  std::vector<std::vector<std::uint32_t>> positions;
};

split_chain split(const std::vector<block_key>& chain, std::size_t shards) {
  split_chain out;
  out.blocks.resize(shards);
  out.positions.resize(shards);
  for (std::uint32_t i = 0; i < chain.size(); ++i) {
    auto s = shard_of(chain[i], static_cast<std::uint32_t>(shards));
    out.blocks[s].push_back(chain[i]);
    out.positions[s].push_back(i);
  }
  return out;
}

/// A match in flight: waits for every asked shard's probe.
struct match_job {
  caf::typed_response_promise<kv_match_result> promise;
  split_chain parts;
  std::size_t chain_size = 0;
  traffic_class traffic = traffic_class::chatbot;
  std::uint64_t prompt_tokens = 0;
  std::size_t waiting = 0;
  /// The earliest first miss seen so far (chain_size: none).
  std::size_t leading = 0;
};

void finish_match(router_actor self, match_job& job) {
  auto hits = job.leading;
  for (std::size_t s = 0; s < job.parts.blocks.size(); ++s) {
    const auto& pos = job.parts.positions[s];
    auto n = static_cast<std::size_t>(std::lower_bound(pos.begin(), pos.end(), hits)
                                      - pos.begin());
    if (n == 0)
      continue;
    auto& blocks = job.parts.blocks[s];
    blocks.resize(n);
    self->send(self->state.params.shards[s], kv_touch{std::move(blocks), job.traffic});
  }
  account_match(self->state.matches, static_cast<std::uint32_t>(hits), job.chain_size,
                job.prompt_tokens);
  job.promise.deliver(
    kv_match_result{static_cast<std::uint32_t>(hits),
                    static_cast<std::uint64_t>(hits) * block_tokens});
}

caf::typed_response_promise<kv_match_result> route_match(router_actor self, kv_match& m) {
  auto rp = self->make_response_promise<kv_match_result>();
  auto job = std::make_shared<match_job>();
  job->promise = rp;
  job->chain_size = m.chain.size();
  job->leading = m.chain.size();
  job->traffic = m.traffic;
  job->prompt_tokens = m.prompt_tokens;
  job->parts = split(m.chain, self->state.params.shards.size());
  for (const auto& b : job->parts.blocks)
    if (!b.empty())
      job->waiting += 1;
  if (job->waiting == 0) {
    finish_match(self, *job);
    return rp;
  }
  for (std::size_t s = 0; s < job->parts.blocks.size(); ++s) {
    if (job->parts.blocks[s].empty())
      continue;
    auto first_miss = [job, s](std::size_t lead) {
      const auto& pos = job->parts.positions[s];
      auto at = lead < pos.size() ? pos[lead] : job->chain_size;
      job->leading = std::min<std::size_t>(job->leading, at);
    };
    self
      ->request(self->state.params.shards[s], self->state.params.shard_timeout,
                kv_probe{job->parts.blocks[s]})
      .then(
        [self, job, first_miss](std::uint32_t lead) {
          settle(self);
          first_miss(lead);
          if (--job->waiting == 0)
            finish_match(self, *job);
        },
        [self, job, first_miss](caf::error&) {
          settle(self);
          first_miss(0);
          if (--job->waiting == 0)
            finish_match(self, *job);
        });
  }
  return rp;
}

/// Sends each shard its part of `blocks` as `Msg{part, extra...}` and folds the replies into
/// one Result with `fold(acc, reply)`; a failed shard is folded with `failed(acc, part)`.
template <class Msg, class Result, class Fold, class Failed, class... Extra>
caf::typed_response_promise<Result> scatter(router_actor self, const std::vector<block_key>& blocks,
                                            Fold fold, Failed failed, Extra... extra) {
  struct job {
    caf::typed_response_promise<Result> promise;
    Result acc;
    std::size_t waiting = 0;
  };
  auto rp = self->make_response_promise<Result>();
  auto j = std::make_shared<job>();
  j->promise = rp;
  auto parts = split(blocks, self->state.params.shards.size());
  for (const auto& b : parts.blocks)
    if (!b.empty())
      j->waiting += 1;
  if (j->waiting == 0) {
    rp.deliver(Result{});
    return rp;
  }
  for (std::size_t s = 0; s < parts.blocks.size(); ++s) {
    if (parts.blocks[s].empty())
      continue;
    auto n = parts.blocks[s].size();
    self
      ->request(self->state.params.shards[s], self->state.params.shard_timeout,
                Msg{std::move(parts.blocks[s]), extra...})
      .then(
        [self, j, fold](Result& r) {
          settle(self);
          fold(j->acc, r);
          if (--j->waiting == 0)
            j->promise.deliver(j->acc);
        },
        [self, j, failed, n](caf::error&) {
          settle(self);
          failed(j->acc, n);
          if (--j->waiting == 0)
            j->promise.deliver(j->acc);
        });
  }
  return rp;
}

void add_insert(kv_insert_result& acc, const kv_insert_result& r) {
  acc.inserted += r.inserted;
  acc.refreshed += r.refreshed;
  acc.rejected += r.rejected;
}

void reject_all(kv_insert_result& acc, std::size_t n) {
  acc.rejected += static_cast<std::uint32_t>(n);
}

void add_stats(kv_stats& acc, const kv_stats& s) {
  acc.entries += s.entries;
  acc.pending += s.pending;
  acc.bytes += s.bytes;
  acc.capacity_bytes += s.capacity_bytes;
  acc.lookups += s.lookups;
  acc.hit_blocks += s.hit_blocks;
  acc.miss_blocks += s.miss_blocks;
  acc.hit_tokens += s.hit_tokens;
  acc.miss_tokens += s.miss_tokens;
  acc.inserted += s.inserted;
  acc.refreshed += s.refreshed;
  acc.rejected += s.rejected;
  acc.committed += s.committed;
  acc.evictions += s.evictions;
  acc.expirations += s.expirations;
  acc.served_expired += s.served_expired;
}

kv_check_actor::behavior_type router_fn(router_actor self, kv_router_params params) {
  TROUPE_CHECK(!params.shards.empty(), "kv_router: needs at least one shard");
  self->state.params = std::move(params);
  return {
    [self](kv_shard_fault_atom, std::uint32_t shard, bool down) {
      auto& shards = self->state.params.shards;
      if (shard < shards.size())
        self->send(shards[shard], kv_shard_fault_atom::value, shard, down);
    },
    [self](kv_shard_slow_atom, std::uint32_t shard, double factor, bool on) {
      auto& shards = self->state.params.shards;
      if (shard < shards.size())
        self->send(shards[shard], kv_shard_slow_atom::value, shard, factor, on);
    },
    [self](kv_match& m) { return route_match(self, m); },
    [self](kv_insert& m) {
      return scatter<kv_insert, kv_insert_result>(self, m.blocks, add_insert, reject_all,
                                                  m.traffic);
    },
    [self](kv_reserve& m) {
      return scatter<kv_reserve, kv_insert_result>(self, m.blocks, add_insert, reject_all,
                                                   m.traffic);
    },
    [self](kv_commit& m) {
      return scatter<kv_commit, kv_commit_result>(
        self, m.blocks,
        [](kv_commit_result& acc, const kv_commit_result& r) {
          acc.committed += r.committed;
          acc.missing += r.missing;
        },
        [](kv_commit_result& acc, std::size_t n) {
          acc.missing += static_cast<std::uint32_t>(n);
        });
    },
    [self](kv_stats_atom) {
      struct job {
        caf::typed_response_promise<kv_stats> promise;
        kv_stats acc;
        std::size_t waiting = 0;
      };
      auto j = std::make_shared<job>();
      j->promise = self->make_response_promise<kv_stats>();
      j->acc = self->state.matches;
      j->waiting = self->state.params.shards.size();
      for (const auto& shard : self->state.params.shards)
        self->request(shard, self->state.params.shard_timeout, kv_stats_atom::value)
          .then(
            [self, j](kv_stats& s) {
              settle(self);
              add_stats(j->acc, s);
              if (--j->waiting == 0)
                j->promise.deliver(j->acc);
            },
            [self, j](caf::error&) {
              settle(self);
              if (--j->waiting == 0)
                j->promise.deliver(j->acc);
            });
      return j->promise;
    },
  };
}

} // namespace

kv_shard_actor spawn_kv_store(caf::actor_system& sys, kv_index_params params) {
  TROUPE_CHECK(params.block_bytes > 0, "kv_store: block_bytes must be > 0");
  return sys.spawn(shard_fn, params);
}

kv_check_actor spawn_kv_router(caf::actor_system& sys, kv_router_params params) {
  TROUPE_CHECK(!params.shards.empty(), "kv_router: needs at least one shard");
  return sys.spawn(router_fn, std::move(params));
}

kv_check_actor spawn_sharded_kv_store(caf::actor_system& sys, kv_index_params per_shard,
                                      std::uint32_t shards) {
  TROUPE_CHECK(shards > 0, "kv_store: needs at least one shard");
  kv_router_params p;
  for (std::uint32_t s = 0; s < shards; ++s)
    p.shards.push_back(spawn_kv_store(sys, per_shard));
  return spawn_kv_router(sys, std::move(p));
}

} // namespace troupe::actors
