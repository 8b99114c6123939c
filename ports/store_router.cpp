#include "ports/store_router.hpp"

#include "runtime/errors.hpp"
#include "runtime/metrics.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace troupe::ports {

std::uint32_t store_shard_of(const runtime::store_key& key, std::uint32_t shards) noexcept {
  return static_cast<std::uint32_t>(key.lo % std::max<std::uint32_t>(1, shards));
}

std::vector<std::uint32_t> store_copies_of(const runtime::store_key& key, std::uint32_t shards,
                                           std::uint32_t replicas) {
  shards = std::max<std::uint32_t>(1, shards);
  replicas = std::clamp<std::uint32_t>(replicas, 1, shards);
  std::vector<std::uint32_t> out;
  out.reserve(replicas);
  const auto first = store_shard_of(key, shards);
  for (std::uint32_t c = 0; c < replicas; ++c)
    out.push_back((first + c) % shards);
  return out;
}

std::filesystem::path store_shard_directory(const std::filesystem::path& root,
                                            std::uint32_t index, std::uint32_t shards) {
  if (shards <= 1)
    return root;
  return root / ("shard-" + std::to_string(index) + "-of-" + std::to_string(shards));
}

namespace {

/// Asks every shard `msg` and answers `combine(answers)` once all have answered, or the first
/// error.
template <class T, class Msg, class Combine>
caf::result<T> ask_all(runtime::store_port::pointer self,
                       const std::shared_ptr<const std::vector<runtime::store_port>>& shards,
                       std::chrono::seconds timeout, Msg msg, Combine combine) {
  auto rp = self->make_response_promise<T>();
  struct gather {
    std::vector<T> answers;
    std::size_t left = 0;
    bool failed = false;
  };
  auto g = std::make_shared<gather>();
  g->answers.resize(shards->size());
  g->left = shards->size();
  for (std::size_t i = 0; i < shards->size(); ++i)
    self->request((*shards)[i], timeout, msg)
      .then(
        [g, rp, i, combine](T& answer) mutable {
          if (g->failed)
            return;
          g->answers[i] = std::move(answer);
          if (--g->left == 0)
            rp.deliver(combine(std::move(g->answers)));
        },
        [g, rp](caf::error& e) mutable {
          if (g->failed)
            return;
          g->failed = true;
          rp.deliver(std::move(e));
        });
  return rp;
}

/// A put or delete sent to every copy: the copies still to answer, whether the answer went,
/// the first success, and the first copy's error.
struct copies_answer {
  std::size_t left = 0;
  bool answered = false;
  std::optional<runtime::store_stats> first_ok;
  caf::error first_error;
  /// The shards that failed, for `settled`.
  std::vector<std::uint32_t> failed;
};

/// The copies of a key: their shards' indices and ports.
struct copy_set {
  std::vector<std::uint32_t> shards;
  std::vector<runtime::store_port> ports;
};

/// When a message sent to every copy is answered: at the first copy that succeeds (a put: one
/// copy written can be served), or once every copy has answered (a delete: no copy is left
/// behind when it is answered).
enum class answer_at { first_success, all_copies };

/// Sends `msg` to every copy of its key; answers the stats of the first copy that succeeds (as
/// `when` says), or once every copy has failed, the first copy's error. `heard(shard, ok)`
/// learns each copy's outcome as it comes, `settled(failed shards)` the shards that failed
/// once all have answered and at least one succeeded.
template <class Msg, class Heard, class Settled>
caf::result<runtime::store_stats> to_all_copies(runtime::store_port::pointer self,
                                                const copy_set& copies,
                                                std::chrono::seconds timeout, Msg msg,
                                                answer_at when, Heard heard, Settled settled) {
  auto rp = self->make_response_promise<runtime::store_stats>();
  auto g = std::make_shared<copies_answer>();
  g->left = copies.ports.size();
  auto answer = [g, rp, when, settled]() mutable {
    if (!g->answered && g->first_ok && (when == answer_at::first_success || g->left == 0)) {
      g->answered = true;
      rp.deliver(*g->first_ok);
    }
    if (g->left != 0)
      return;
    if (!g->answered) {  // every copy failed
      g->answered = true;
      rp.deliver(g->first_error);
    } else if (!g->failed.empty()) {
      settled(g->failed);
    }
  };
  for (std::size_t i = 0; i < copies.ports.size(); ++i) {
    // The last copy takes the message; the others a copy of it (a put's payload too).
    auto m = i + 1 < copies.ports.size() ? Msg{msg} : std::move(msg);
    const auto shard = copies.shards[i];
    self->request(copies.ports[i], timeout, std::move(m))
      .then(
        [g, heard, answer, shard](runtime::store_stats& st) mutable {
          --g->left;
          heard(shard, true);
          if (!g->first_ok)
            g->first_ok = std::move(st);
          answer();
        },
        [g, i, heard, answer, shard](caf::error& e) mutable {
          --g->left;
          heard(shard, false);
          g->failed.push_back(shard);
          if (i == 0 || !g->first_error)
            g->first_error = std::move(e);
          answer();
        });
  }
  return rp;
}

/// Blocks a shard missed while it was down (a put of it failed there and succeeded on another
/// copy), to be copied to it once it answers again: hinted repair.
struct repair_hint {
  runtime::store_key key;
  /// When the put was asked and its ttl (0: never expires), on the router's clock.
  runtime::time_point put_at;
  runtime::duration ttl{0};
  /// Copies to the shard that failed (a hint is dropped after max_repair_attempts).
  std::uint32_t attempts = 0;
};

constexpr std::size_t max_repair_hints = std::size_t{1} << 18;
constexpr std::uint32_t max_repair_attempts = 3;

struct shard_repairs {
  std::vector<std::vector<repair_hint>> hints;  // per shard
  std::vector<bool> running;                    // a repair of that shard is under way
  std::vector<std::size_t> copying;             // hints of that repair not done yet
  runtime::counter* repaired = nullptr;
  runtime::counter* lost = nullptr;
  runtime::gauge* pending = nullptr;

  void update_pending() {
    if (pending == nullptr)
      return;
    std::size_t n = 0;
    for (const auto& h : hints)
      n += h.size();
    for (auto c : copying)
      n += c;
    pending->set(static_cast<double>(n));
  }
};

/// Asks the copies of a key in order, from copy `i` on, until one answers `accept`ably; the
/// answer is that one's, else the first definite answer (a value, or not_found: a copy that
/// was reached), else the first copy's error (`first`). `heard(shard, up)` learns of each
/// copy asked whether it answered definitely.
template <class T, class Msg, class Accept, class Heard>
void ask_copies(runtime::store_port::pointer self, std::shared_ptr<const copy_set> copies,
                std::chrono::seconds timeout, Msg msg, Accept accept, Heard heard,
                caf::typed_response_promise<T> rp, std::size_t i,
                std::shared_ptr<caf::expected<T>> first) {
  auto next = [self, copies, timeout, msg, accept, heard, rp, i,
               first](caf::expected<T> a) mutable {
    auto definite = [](const caf::expected<T>& x) {
      return x || runtime::is(x.error(), runtime::errc::not_found);
    };
    heard(copies->shards[i], definite(a));  // a definite answer: the shard is up
    if (a && accept(*a)) {
      rp.deliver(std::move(*a));
      return;
    }
    if (i == 0 || (!definite(*first) && definite(a)))
      *first = std::move(a);
    if (i + 1 < copies->ports.size()) {
      ask_copies<T>(self, copies, timeout, msg, accept, heard, rp, i + 1, first);
      return;
    }
    if (*first)
      rp.deliver(std::move(**first));
    else
      rp.deliver(first->error());
  };
  self->request(copies->ports[i], timeout, msg)
    .then([next](T& x) mutable { next(std::move(x)); },
          [next](caf::error& e) mutable { next(std::move(e)); });
}

using shard_list = std::shared_ptr<const std::vector<runtime::store_port>>;

void repair_next(runtime::store_port::pointer self, shard_list shards, std::uint32_t replicas,
                 std::chrono::seconds timeout, std::shared_ptr<shard_repairs> st,
                 std::uint32_t target, std::shared_ptr<std::vector<repair_hint>> work,
                 std::size_t i);

/// Copies hint `i` of `work` to shard `target` from the key's copy `source` (its j-th other
/// copy), or from the next, then goes on with the next hint.
void repair_from(runtime::store_port::pointer self, shard_list shards, std::uint32_t replicas,
                 std::chrono::seconds timeout, std::shared_ptr<shard_repairs> st,
                 std::uint32_t target, std::shared_ptr<std::vector<repair_hint>> work,
                 std::size_t i, std::size_t j) {
  const auto h = (*work)[i];
  std::vector<std::uint32_t> sources;
  for (auto c : store_copies_of(h.key, static_cast<std::uint32_t>(shards->size()), replicas))
    if (c != target)
      sources.push_back(c);
  if (j >= sources.size()) {  // no other copy has it (evicted, expired or lost there too)
    if (st->lost != nullptr)
      st->lost->inc();
    repair_next(self, shards, replicas, timeout, st, target, work, i + 1);
    return;
  }
  self->request((*shards)[sources[j]], timeout, runtime::store_get{h.key})
    .then(
      [=](runtime::store_object& obj) {
        auto ttl = runtime::duration{0};
        if (h.ttl > runtime::duration{0}) {
          ttl = h.put_at + h.ttl - self->clock().now();
          if (ttl <= runtime::duration{0}) {  // expired while it was copied
            repair_next(self, shards, replicas, timeout, st, target, work, i + 1);
            return;
          }
        }
        self
          ->request((*shards)[target], timeout,
                    runtime::store_put{h.key, obj.size, std::move(obj.payload), ttl})
          .then(
            [=](const runtime::store_stats&) {
              if (st->repaired != nullptr)
                st->repaired->inc();
              repair_next(self, shards, replicas, timeout, st, target, work, i + 1);
            },
            [=](const caf::error&) {
              // The shard failed again: the hints not copied wait for its next answer.
              auto& pending = st->hints[target];
              for (auto k = i; k < work->size(); ++k) {
                auto left = (*work)[k];
                if (k == i && ++left.attempts >= max_repair_attempts) {
                  if (st->lost != nullptr)
                    st->lost->inc();
                  continue;
                }
                if (pending.size() < max_repair_hints)
                  pending.push_back(left);
                else if (st->lost != nullptr)
                  st->lost->inc();
              }
              st->running[target] = false;
              st->copying[target] = 0;
              st->update_pending();
            });
      },
      [=](const caf::error&) {
        repair_from(self, shards, replicas, timeout, st, target, work, i, j + 1);
      });
}

void repair_next(runtime::store_port::pointer self, shard_list shards, std::uint32_t replicas,
                 std::chrono::seconds timeout, std::shared_ptr<shard_repairs> st,
                 std::uint32_t target, std::shared_ptr<std::vector<repair_hint>> work,
                 std::size_t i) {
  const auto now = self->clock().now();
  while (i < work->size() && (*work)[i].ttl > runtime::duration{0}
         && (*work)[i].put_at + (*work)[i].ttl <= now)
    ++i;  // expired: nothing to copy
  st->copying[target] = work->size() - i;
  st->update_pending();
  if (i >= work->size()) {
    st->running[target] = false;
    return;
  }
  repair_from(self, std::move(shards), replicas, timeout, std::move(st), target, std::move(work),
              i, 0);
}

/// Starts copying the blocks `target` missed, one at a time, unless that is under way.
void start_repair(runtime::store_port::pointer self, shard_list shards, std::uint32_t replicas,
                  std::chrono::seconds timeout, std::shared_ptr<shard_repairs> st,
                  std::uint32_t target) {
  if (st->running[target] || st->hints[target].empty())
    return;
  st->running[target] = true;
  auto work = std::make_shared<std::vector<repair_hint>>(std::move(st->hints[target]));
  st->hints[target].clear();
  repair_next(self, std::move(shards), replicas, timeout, std::move(st), target, std::move(work),
              0);
}

runtime::store_port::behavior_type
store_router(runtime::store_port::pointer self,
             std::shared_ptr<const std::vector<runtime::store_port>> shards,
             std::uint32_t replicas, std::chrono::seconds timeout, runtime::registry* metrics) {
  // The shards end with the router; a shard that ends alone fails only its own blocks.
  self->attach_functor([shards] {
    for (const auto& s : *shards)
      caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  });
  const auto count = static_cast<std::uint32_t>(shards->size());
  auto shard = [shards, count](const runtime::store_key& k) {
    return (*shards)[store_shard_of(k, count)];
  };
  auto copy_set_of = [shards, count, replicas](const runtime::store_key& k) {
    copy_set out;
    out.shards = store_copies_of(k, count, replicas);
    for (auto c : out.shards)
      out.ports.push_back((*shards)[c]);
    return out;
  };
  auto copies = [copy_set_of](const runtime::store_key& k) {
    return std::make_shared<const copy_set>(copy_set_of(k));
  };
  // Hinted repair (replicas only): a put a shard failed is copied to it once it answers again.
  auto repairs = std::make_shared<shard_repairs>();
  repairs->hints.resize(count);
  repairs->running.assign(count, false);
  repairs->copying.assign(count, 0);
  if (replicas > 1) {
    const char* help = "Blocks a store shard missed while it was down (a put that failed there "
                       "and succeeded on another copy), copied to it when it answered again "
                       "(repaired) or not copied (lost: no other copy had it any more, or the "
                       "shard kept refusing it).";
    repairs->repaired = runtime::counter_child(metrics, "troupe_store_repairs_total", help,
                                               {"outcome"}, {"repaired"});
    repairs->lost = runtime::counter_child(metrics, "troupe_store_repairs_total", help,
                                           {"outcome"}, {"lost"});
    repairs->pending = runtime::gauge_child(metrics, "troupe_store_repairs_pending",
                                            "Blocks waiting to be copied to a store shard that "
                                            "missed them while it was down.");
  }
  auto heard = [self, shards, replicas, timeout, repairs](std::uint32_t s, bool ok) {
    if (ok)
      start_repair(self, shards, replicas, timeout, repairs, s);
  };
  return {
    [self, shard, copy_set_of, replicas, timeout, repairs,
     heard](runtime::store_put& p) -> caf::result<runtime::store_stats> {
      if (replicas <= 1)
        return self->delegate(shard(p.key), std::move(p));
      // The copies a put reached the others' shards missed: hints, once all have answered.
      repair_hint hint{p.key, self->clock().now(), p.ttl};
      auto missed = [repairs, hint](const std::vector<std::uint32_t>& failed) {
        for (auto s : failed)
          if (repairs->hints[s].size() < max_repair_hints)
            repairs->hints[s].push_back(hint);
          else if (repairs->lost != nullptr)
            repairs->lost->inc();  // beyond what the router keeps: never copied
        repairs->update_pending();
      };
      return to_all_copies(self, copy_set_of(p.key), timeout, std::move(p),
                           answer_at::first_success, heard, missed);
    },
    [self, shard, copies, replicas, timeout,
     heard](const runtime::store_get& g) -> caf::result<runtime::store_object> {
      if (replicas <= 1)
        return self->delegate(shard(g.key), g);
      auto rp = self->make_response_promise<runtime::store_object>();
      ask_copies<runtime::store_object>(
        self, copies(g.key), timeout, g, [](const runtime::store_object&) { return true; }, heard,
        rp, 0, std::make_shared<caf::expected<runtime::store_object>>(caf::error{}));
      return rp;
    },
    [self, shard, copies, replicas, timeout,
     heard](const runtime::store_has& h) -> caf::result<bool> {
      if (replicas <= 1)
        return self->delegate(shard(h.key), h);
      auto rp = self->make_response_promise<bool>();
      ask_copies<bool>(self, copies(h.key), timeout, h, [](bool has) { return has; }, heard, rp,
                       0, std::make_shared<caf::expected<bool>>(caf::error{}));
      return rp;
    },
    [self, shard, copy_set_of, replicas, timeout,
     heard](const runtime::store_delete& d) -> caf::result<runtime::store_stats> {
      if (replicas <= 1)
        return self->delegate(shard(d.key), d);
      return to_all_copies(self, copy_set_of(d.key), timeout, d, answer_at::all_copies, heard,
                           [](const std::vector<std::uint32_t>&) {});
    },
    [self, shards, timeout](const runtime::store_list& l) {
      using entries = std::vector<runtime::store_entry>;
      return ask_all<entries>(self, shards, timeout, l, [](std::vector<entries> parts) {
        entries all;
        for (auto& p : parts)
          all.insert(all.end(), p.begin(), p.end());
        // Each block once (its copies list it on several shards), with its latest expiry.
        std::sort(all.begin(), all.end(),
                  [](const runtime::store_entry& a, const runtime::store_entry& b) {
                    return a.key != b.key ? a.key < b.key : a.expires_at > b.expires_at;
                  });
        all.erase(std::unique(all.begin(), all.end(),
                              [](const runtime::store_entry& a, const runtime::store_entry& b) {
                                return a.key == b.key;
                              }),
                  all.end());
        return all;
      });
    },
    [self, shards, timeout](runtime::store_stats_atom a) {
      return ask_all<runtime::store_stats>(
        self, shards, timeout, a, [](std::vector<runtime::store_stats> parts) {
          runtime::store_stats sum;
          for (const auto& s : parts) {
            sum.capacity += s.capacity;
            sum.used += s.used;
            sum.objects += s.objects;
            sum.hits += s.hits;
            sum.misses += s.misses;
            sum.corrupt += s.corrupt;
            sum.evicted += s.evicted;
            sum.expired += s.expired;
          }
          return sum;
        });
    },
  };
}

} // namespace

runtime::store_port spawn_store_router(caf::actor_system& sys,
                                       std::vector<runtime::store_port> shards,
                                       std::uint32_t replicas, std::chrono::seconds timeout,
                                       runtime::registry* metrics) {
  if (shards.size() == 1)
    return shards.front();
  replicas = std::clamp<std::uint32_t>(replicas, 1, static_cast<std::uint32_t>(shards.size()));
  auto all = std::make_shared<const std::vector<runtime::store_port>>(std::move(shards));
  return sys.spawn(store_router, std::move(all), replicas, timeout, metrics);
}

runtime::store_port spawn_sharded_posix_store(caf::actor_system& sys, posix_store_params params,
                                              std::uint32_t shards, std::uint32_t replicas) {
  shards = std::max<std::uint32_t>(1, shards);
  std::vector<runtime::store_port> ports;
  for (std::uint32_t i = 0; i < shards; ++i) {
    auto p = params;
    p.directory = store_shard_directory(params.directory, i, shards);
    p.capacity = params.capacity / shards;
    if (shards > 1)
      p.metrics_shard = std::to_string(i);
    ports.push_back(spawn_posix_store(sys, std::move(p)));
  }
  return spawn_store_router(sys, std::move(ports), replicas, std::chrono::seconds(60),
                            params.metrics);
}

} // namespace troupe::ports
