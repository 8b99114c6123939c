#include "actors/engine/prefill_engine.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace troupe::actors {

std::uint64_t exact_rebuild_tokens(std::uint64_t cached, std::uint32_t layers,
                                   std::uint64_t window) {
  if (layers == 0)
    return 0;
  std::uint64_t token_layers = 0;
  for (std::uint64_t l = 1; l <= layers; ++l)
    token_layers += std::min(cached, (layers - l + 1) * window);
  return (token_layers + layers - 1) / layers;
}

namespace {

struct job_state {
  prefill_job job;
  std::uint64_t remaining = 0;
  /// Tokens the device's cache of this sequence holds (the next chunk's position).
  std::uint64_t computed = 0;
  std::uint64_t position = 0;
  /// The token drawn by the last chunk.
  runtime::sampled_token next;
  bool ready = false;
  /// Its place in arrival order.
  std::uint64_t arrival = 0;
  bool fetched = false;
  /// Its KV is being exported (the answer waits for it).
  bool exporting = false;
  bool started = false;
  runtime::time_point started_at{};
  /// When this engine took the job.
  runtime::time_point received_at{};
  /// Real world: the context's last block boundary before its end (in blocks), where the
  /// device keeps the state for later requests with this prefix (0: none).
  std::uint64_t keep_blocks = 0;
  /// Real world: the cached blocks read, waiting for another instance's kept window state
  /// (asked of the job's keeper) before the restore; and that state once it came.
  std::shared_ptr<runtime::kv_snapshot> fetched_blocks;
  bool asking_keeper = false;
  runtime::kv_snapshot_ptr kept;
  /// A streaming job (prefill_job::stream_kv): where its runs of full blocks go (its sender),
  /// the blocks asked of the device so far, and whether one of those exports failed (the
  /// export at the end then holds every block).
  caf::actor parts_to;
  std::uint64_t streamed = 0;
  bool stream_failed = false;
  caf::typed_response_promise<prefill_done> rp;
};

struct prefill_engine_state {
  prefill_engine_params params;
  runtime::device_port device;
  runtime::link_port link;
  /// Real world: persists the blocks jobs computed, and the store cached blocks are read
  /// from (both invalid: nothing is persisted or fetched).
  block_writer_actor writer;
  runtime::store_port writer_store;
  std::map<std::uint64_t, job_state> jobs;
  /// The jobs that can compute now (ready, tokens left), by (arrival, request): what a step
  /// shares its budget among, so that a step costs what it takes, not the queue's length.
  std::set<std::pair<std::uint64_t, std::uint64_t>> computable;
  std::uint64_t arrivals = 0;
  bool stepping = false;
  std::uint64_t next_step = 1;
  engine_stats stats;
  /// Drain: the callback that has the balancer exclude the instance, and the drain request,
  /// answered when the last job is done.
  std::function<void()> leave;
  std::optional<caf::typed_response_promise<std::uint64_t>> drain;
  static inline const char* name = "prefill_engine";
};

using engine_ptr = prefill_engine_actor::stateful_pointer<prefill_engine_state>;

void step(engine_ptr self);

/// The job may compute from where it stands.
void set_ready(prefill_engine_state& st, std::uint64_t request, job_state& j) {
  j.ready = true;
  if (j.remaining > 0)
    st.computable.emplace(j.arrival, request);
}

/// Forgets a job (answered or cancelled).
void forget(prefill_engine_state& st, std::map<std::uint64_t, job_state>::iterator i) {
  st.computable.erase({i->second.arrival, i->first});
  st.jobs.erase(i);
}

/// Has the block writer persist the blocks of `kv` that the job computed (those it restored
/// are in the store already, refreshed by the CHECK role's match); `kv->blocks[0]` is sequence
/// block `kv_first`.
void persist(engine_ptr self, const job_state& j, const runtime::kv_snapshot_ptr& kv,
             std::uint64_t kv_first) {
  auto& st = self->state;
  if (!st.writer || !kv)
    return;
  const auto first = std::max(kv_first, j.job.cached_tokens / block_tokens);
  const auto end = std::min<std::uint64_t>(j.job.chain.size(), kv_first + kv->blocks.size());
  if (end <= first)
    return;
  const auto chain = j.job.chain.begin();
  self->send(st.writer,
             store_blocks{std::vector<block_key>(chain + static_cast<std::ptrdiff_t>(first),
                                                 chain + static_cast<std::ptrdiff_t>(end)),
                          kv, first - kv_first, j.job.traffic});
}

/// Answers a finished job (with its KV from block `kv_first` on, when exported) and forgets
/// it.
void deliver(engine_ptr self, std::uint64_t request, runtime::kv_snapshot_ptr kv,
             std::uint64_t kv_first = 0) {
  auto& st = self->state;
  auto i = st.jobs.find(request);
  if (i == st.jobs.end())
    return;
  auto& j = i->second;
  // The blocks it computed go to the store while the KV moves on.
  persist(self, j, kv, kv_first);
  prefill_done done{request, st.params.instance, j.started_at, self->clock().now(),
                    std::move(j.next), j.job.cached_tokens, std::move(kv)};
  done.kv_first_block = done.kv ? kv_first : j.job.tokens.empty() ? j.streamed : 0;
  j.rp.deliver(std::move(done));
  // The KV has been handed on with the answer: the device forgets the sequence.
  self->send(st.device, runtime::device_release{request});
  forget(st, i);
  ++st.stats.jobs_done;
  // A draining instance leaves once its work is done.
  if (st.drain && st.jobs.empty()) {
    st.drain->deliver(std::uint64_t{0});
    st.drain.reset();
  }
}

void try_finish(engine_ptr self, std::uint64_t request) {
  auto& st = self->state;
  auto i = st.jobs.find(request);
  if (i == st.jobs.end() || i->second.remaining > 0 || !i->second.fetched || i->second.exporting)
    return;
  if (i->second.job.tokens.empty()) {
    deliver(self, request, nullptr);  // the simulated world: the KV moves by the link model
    return;
  }
  i->second.exporting = true;
  // A streaming job's runs went out already: the rest follows them, unless one failed.
  const auto first = i->second.stream_failed ? 0 : i->second.streamed;
  self->request(st.device, caf::infinite, runtime::kv_export{request, first})
    .then(
      [self, request, first](runtime::kv_snapshot_ptr kv) {
        auto i = self->state.jobs.find(request);
        if (first > 0 && i != self->state.jobs.end() && i->second.stream_failed) {
          // A run's export failed after this one was asked: export everything.
          i->second.streamed = 0;
          i->second.exporting = false;
          try_finish(self, request);
          return;
        }
        deliver(self, request, std::move(kv), first);
      },
      // Without a snapshot the decode instance recomputes the context.
      [self, request](const caf::error&) { deliver(self, request, nullptr); });
}

/// A streaming job whose chunk completed full blocks, with more to compute: those blocks are
/// exported now and sent to its sender, to move while the rest computes (the device answers
/// after the step just done, before the next one). The simulated world moves no bytes: it
/// counts the blocks, which the hand-off after the prefill leaves out, and puts their bytes on
/// the booked decode instance's hand-off link now (kv_part_streamed).
void stream_blocks(engine_ptr self, std::uint64_t request, job_state& j) {
  if (!j.job.stream_kv || j.stream_failed || j.remaining == 0)
    return;
  const auto full = j.position / block_tokens;
  if (full <= j.streamed)
    return;
  const auto first = j.streamed;
  j.streamed = full;
  if (!j.parts_to) {
    if (j.job.kv_to && j.job.kv_bytes_per_token > 0)
      caf::anon_send(caf::actor_cast<caf::actor>(j.job.kv_to),
                     kv_part_streamed{request, (full - first) * block_tokens
                                                 * j.job.kv_bytes_per_token});
    return;
  }
  auto& st = self->state;
  self->request(st.device, caf::infinite, runtime::kv_export{request, first, true})
    .then(
      [self, request, first](runtime::kv_snapshot_ptr kv) {
        auto i = self->state.jobs.find(request);
        if (i == self->state.jobs.end())
          return;
        persist(self, i->second, kv, first);
        caf::anon_send(i->second.parts_to, prefill_kv_part{request, first, std::move(kv)});
      },
      [self, request](const caf::error&) {
        if (auto i = self->state.jobs.find(request); i != self->state.jobs.end())
          i->second.stream_failed = true;
      });
}

/// The job may compute from where it stands.
void make_ready(engine_ptr self, std::uint64_t request) {
  auto i = self->state.jobs.find(request);
  if (i == self->state.jobs.end())
    return;
  set_ready(self->state, request, i->second);
  step(self);
}

/// Opens the job's sequence on the device from the first `n` fetched blocks.
void restore(engine_ptr self, std::uint64_t request, std::shared_ptr<runtime::kv_snapshot> kv) {
  auto& st = self->state;
  auto i = st.jobs.find(request);
  if (i == st.jobs.end())
    return;
  const auto& job = i->second.job;
  const auto n = kv->blocks.size();
  const auto& key = job.chain[n - 1];
  runtime::kv_restore r{request, kv, runtime::store_key{key.hi, key.lo},
                        std::vector<std::int32_t>(job.tokens.begin(),
                                                  job.tokens.begin()
                                                    + static_cast<std::ptrdiff_t>(kv->length)),
                        std::exchange(i->second.kept, nullptr)};
  self->request(st.device, caf::infinite, std::move(r))
    .then(
      [self, request](const runtime::kv_restored& done) {
        auto& st = self->state;
        auto i = st.jobs.find(request);
        if (i == st.jobs.end())
          return;  // cancelled meanwhile: its release follows the restore on the device
        auto& j = i->second;
        j.position = j.computed = done.length;
        j.remaining = j.job.input_tokens - done.length;
        j.job.cached_tokens = done.length;
        st.stats.cached_tokens += done.length;
        if (done.pulled)
          ++st.stats.kept_pulled;
        make_ready(self, request);
      },
      [self, request](const caf::error&) {
        // The device refused the blocks: the job computes its whole context.
        ++self->state.stats.restore_failures;
        make_ready(self, request);
      });
}

/// Reads the job's first `usable` cached blocks from the store, all at once; restores the
/// leading run that arrived, or lets the job compute everything when the first is missing.
void fetch_cached(engine_ptr self, std::uint64_t request, std::uint64_t usable) {
  struct pending {
    std::vector<std::optional<runtime::kv_bytes>> blocks;
    std::size_t left = 0;
  };
  auto& st = self->state;
  auto p = std::make_shared<pending>();
  p->blocks.resize(usable);
  p->left = usable;
  auto arrived = [self, request, p](std::size_t k, std::optional<runtime::kv_bytes> b) {
    auto& st = self->state;
    if (b)
      ++st.stats.blocks_fetched;
    else
      ++st.stats.fetch_misses;
    p->blocks[k] = std::move(b);
    if (--p->left > 0)
      return;
    auto kv = std::make_shared<runtime::kv_snapshot>();
    for (auto& b : p->blocks) {
      if (!b)
        break;
      kv->blocks.push_back(std::move(*b));
    }
    kv->length = kv->blocks.size() * block_tokens;
    if (kv->blocks.empty()) {
      make_ready(self, request);
      return;
    }
    auto i = self->state.jobs.find(request);
    if (i == self->state.jobs.end())
      return;
    if (i->second.asking_keeper)
      i->second.fetched_blocks = std::move(kv);  // restored once the keeper answers
    else
      restore(self, request, std::move(kv));
  };
  const auto& chain = st.jobs.at(request).job.chain;
  for (std::size_t k = 0; k < usable; ++k)
    self->request(st.writer_store, caf::infinite, runtime::store_get{{chain[k].hi, chain[k].lo}})
      .then(
        [arrived, k](runtime::store_object& obj) {
          runtime::kv_bytes b;
          b.bytes.assign(obj.payload.begin(), obj.payload.end());
          b.checksum = obj.checksum;
          arrived(k, std::move(b));
        },
        [arrived, k](const caf::error&) { arrived(k, std::nullopt); });
}

/// Asks the job's keeper for the window state its device kept where the job's first `usable`
/// blocks end (an SWA ring pull), while the blocks are read; the restore waits for both. No
/// answer within kept_timeout, or none kept there: the device restores without it.
void ask_keeper(engine_ptr self, std::uint64_t request, std::uint64_t usable) {
  auto& st = self->state;
  auto& j = st.jobs.at(request);
  const auto& key = j.job.chain[usable - 1];
  j.asking_keeper = true;
  auto answered = [self, request](runtime::kv_snapshot_ptr kept) {
    auto i = self->state.jobs.find(request);
    if (i == self->state.jobs.end())
      return;
    if (!kept)
      ++self->state.stats.kept_misses;
    auto& j = i->second;
    j.asking_keeper = false;
    j.kept = std::move(kept);
    if (j.fetched_blocks)
      restore(self, request, std::move(j.fetched_blocks));
  };
  self
    ->request(caf::actor_cast<caf::actor>(j.job.keeper), st.params.kept_timeout,
              kept_state_get{request, runtime::store_key{key.hi, key.lo},
                             usable * block_tokens})
    .then([answered](kept_state& k) { answered(std::move(k.kv)); },
          [answered](const caf::error&) { answered(nullptr); });
}

void step(engine_ptr self) {
  auto& st = self->state;
  if (st.stepping)
    return;
  // Each ready job first gets an equal share of the budget (at least one block), so a short
  // prompt is not held behind a long one; budget left over goes to jobs in arrival order.
  // Jobs are visited in arrival order only until the budget is spent.
  if (st.computable.empty())
    return;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> take;  // request, tokens, in order
  auto budget = st.params.step_tokens;
  auto share = std::max<std::uint64_t>(budget / st.computable.size(), 128);
  for (auto c = st.computable.begin(); c != st.computable.end() && budget > 0; ++c) {
    auto n = std::min({budget, st.jobs.at(c->second).remaining, share});
    take.emplace_back(c->second, n);
    budget -= n;
  }
  // Every job had its share and budget is left: it goes to them in order.
  for (auto& [id, n] : take) {
    if (budget == 0)
      break;
    auto more = std::min(budget, st.jobs.at(id).remaining - n);
    n += more;
    budget -= more;
  }
  // A chunk does not cross the boundary where the device keeps the state (it must end there).
  for (auto& [id, n] : take) {
    auto& j = st.jobs.at(id);
    const auto boundary = j.keep_blocks * block_tokens;
    if (j.position < boundary)
      n = std::min(n, boundary - j.position);
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> batch; // request, tokens taken
  runtime::device_step ds{st.next_step, runtime::step_phase::prefill, 0, 0, 0, 0, {}};
  const auto now = self->clock().now();
  for (auto [id, n] : take) {
    if (n == 0)
      continue;
    auto& j = st.jobs.at(id);
    batch.emplace_back(id, n);
    ds.tokens += n;
    ds.sequences += 1;
    // Attention of this chunk covers everything before it in the prompt.
    ds.context_tokens += j.job.input_tokens - j.remaining + n;
    runtime::step_sequence seq{id, j.position, static_cast<std::uint32_t>(n), {},
                               n == j.remaining, j.job.sampling};
    seq.propose = st.params.draft_context;
    if (seq.sample && !j.job.constraint.format.empty()) {
      const auto age = now - j.received_at;
      if (ds.first_constraint_age < runtime::duration{0} || age < ds.first_constraint_age)
        ds.first_constraint_age = age;
    }
    if (!j.job.tokens.empty()) {
      auto from = j.job.tokens.begin() + static_cast<std::ptrdiff_t>(j.position);
      seq.tokens.assign(from, from + static_cast<std::ptrdiff_t>(n));
    }
    ds.batch.push_back(std::move(seq));
  }
  if (batch.empty())
    return;
  st.stepping = true;
  ++st.next_step;
  for (auto& [id, take] : batch) {
    auto& j = st.jobs.at(id);
    if (!j.started) {
      j.started = true;
      j.started_at = now;
    }
  }
  self->request(st.device, caf::infinite, ds)
    .then(
      [self, batch](runtime::device_result& r) {
        auto& st = self->state;
        st.stepping = false;
        ++st.stats.steps;
        st.stats.busy += r.finished - r.started;
        for (auto& s : r.sampled)
          if (auto i = st.jobs.find(s.sequence); i != st.jobs.end())
            i->second.next = std::move(s);
        for (auto& [id, take] : batch) {
          auto i = st.jobs.find(id);
          if (i == st.jobs.end())
            continue;
          auto& j = i->second;
          j.remaining -= take;
          if (j.remaining == 0)
            st.computable.erase({j.arrival, id});
          j.computed += take;
          j.position += take;
          st.stats.tokens += take;
          if (j.keep_blocks > 0 && j.position == j.keep_blocks * block_tokens) {
            const auto& key = j.job.chain[j.keep_blocks - 1];
            self->send(st.device,
                       runtime::kv_keep{id, runtime::store_key{key.hi, key.lo}, j.position});
            if (st.params.kept)
              st.params.kept(key);
          }
          stream_blocks(self, id, j);
          try_finish(self, id);
        }
        step(self);
      },
      [self](const caf::error& err) {
        // The device is gone (its rank failed): so is this instance.
        self->quit(err);
      });
}

prefill_engine_actor::behavior_type prefill_engine_fn(engine_ptr self,
                                                       prefill_engine_params params,
                                                       runtime::device_port device,
                                                       runtime::link_port link,
                                                       std::function<void()> leave) {
  auto& st = self->state;
  st.leave = std::move(leave);
  st.params = params;
  st.device = std::move(device);
  st.link = std::move(link);
  st.stats.instance = params.instance;
  if (params.writer.store && params.writer.kv) {
    st.writer_store = params.writer.store;
    auto w = params.writer;
    w.instance = params.instance;
    st.writer = spawn_block_writer(self, std::move(w));
    // The writer ends with its engine. Once it has written to a store or index in another
    // process, the middleman holds it for that node, so it would outlive its last handle and
    // keep the process from exiting.
    self->attach_functor([writer = st.writer] {
      caf::anon_send_exit(writer, caf::exit_reason::user_shutdown);
    });
  }
  return {
    [self](const prefill_job& job) -> caf::typed_response_promise<prefill_done> {
      auto& st = self->state;
      // A real job starts from its context's first token; its cached blocks are fetched and
      // restored on the device first (fetch_cached), which moves its position on.
      auto cached = job.tokens.empty() ? std::min(job.cached_tokens, job.input_tokens) : 0;
      auto replay = std::min(job.input_tokens, st.params.replay_tokens);
      job_state j;
      j.job = job;
      j.received_at = self->clock().now();
      // (The sender before the promise: making it takes over the sender.)
      if (job.stream_kv && !job.tokens.empty())
        j.parts_to = caf::actor_cast<caf::actor>(self->current_sender());
      if (!job.tokens.empty()) {
        j.job.cached_tokens = 0;
        j.job.fetch_bytes = 0;
      }
      if (st.params.exact_rebuild_layers > 0 && cached > 0)
        j.remaining = job.input_tokens - cached
                      + exact_rebuild_tokens(cached, st.params.exact_rebuild_layers,
                                             st.params.replay_tokens);
      else
        j.remaining = std::max(job.input_tokens - cached, replay);
      j.remaining = std::min(j.remaining, job.input_tokens);
      j.position = job.input_tokens - j.remaining;
      j.rp = self->make_response_promise<prefill_done>();
      auto rp = j.rp;
      auto id = job.request;
      if (!job.tokens.empty() && job.tokens.size() != job.input_tokens) {
        j.rp.deliver(caf::make_error(caf::sec::invalid_argument,
                                     "prefill_job: tokens do not match input_tokens"));
        return rp;
      }
      if (j.remaining == 0) {
        // Nothing to compute (an empty context): nothing to draw a token from either.
        j.rp.deliver(caf::make_error(caf::sec::invalid_argument, "prefill_job: empty context"));
        return rp;
      }
      if (st.params.on_job)
        st.params.on_job(j.remaining);
      // Real world: the cached blocks usable (never the one holding the last token) and the
      // boundary where the device keeps the state.
      std::uint64_t usable = 0;
      if (!job.tokens.empty() && st.writer) {
        const auto last_boundary = (job.input_tokens - 1) / block_tokens;
        j.keep_blocks = std::min<std::uint64_t>(job.chain.size(), last_boundary);
        usable = std::min(job.cached_tokens / block_tokens, j.keep_blocks);
      }
      j.arrival = st.arrivals++;
      bool ready_now = false;
      if (usable > 0) {
        j.fetched = true;  // ready once restored (or given up on)
      } else if (j.job.fetch_bytes == 0 || st.link == nullptr) {
        ready_now = true;
        j.fetched = true;
      } else {
        // Two transfers back to back on the fetch path: the first layer (compute may start
        // when it is there) and the rest (the job cannot finish before it is there).
        auto layers = std::max<std::uint32_t>(1, st.params.fetch_layers);
        auto first = job.fetch_bytes / layers;
        self->request(st.link, caf::infinite, runtime::link_transfer{id, first})
          .then([self, id](const runtime::link_delivery&) {
            auto i = self->state.jobs.find(id);
            if (i == self->state.jobs.end())
              return;
            set_ready(self->state, id, i->second);
            step(self);
          });
        self->request(st.link, caf::infinite,
                      runtime::link_transfer{id, job.fetch_bytes - first})
          .then([self, id](const runtime::link_delivery&) {
            auto i = self->state.jobs.find(id);
            if (i == self->state.jobs.end())
              return;
            i->second.fetched = true;
            try_finish(self, id);
          });
      }
      auto& placed = st.jobs.emplace(id, std::move(j)).first->second;
      if (ready_now)
        set_ready(st, id, placed);
      if (usable > 0 && placed.job.keeper)
        ask_keeper(self, id, usable);
      if (usable > 0)
        fetch_cached(self, id, usable);
      step(self);
      return rp;
    },
    [self](drain_atom, runtime::duration) -> caf::result<std::uint64_t> {
      auto& st = self->state;
      if (st.leave) {
        st.leave();
        st.leave = nullptr;
      }
      if (st.jobs.empty())
        return std::uint64_t{0};
      st.drain = self->make_response_promise<std::uint64_t>();
      return *st.drain;
    },
    [self](engine_stats_atom) {
      auto s = self->state.stats;
      s.jobs_in_flight = self->state.jobs.size();
      return s;
    },
    [self](const kept_state_get& g) -> caf::result<kept_state> {
      return answer_kept_state(self, self->state.device, g);
    },
    [self](cancel_atom, std::uint64_t request) {
      auto& st = self->state;
      auto i = st.jobs.find(request);
      if (i == st.jobs.end())
        return;
      i->second.rp.deliver(caf::make_error(caf::sec::request_receiver_down, "cancelled"));
      forget(st, i);
      // A step in flight may still hold a chunk of it: its result finds no job and is dropped.
      self->send(st.device, runtime::device_release{request});
      if (st.drain && st.jobs.empty()) {
        st.drain->deliver(std::uint64_t{0});
        st.drain.reset();
      }
    },
  };
}

} // namespace

prefill_engine_actor spawn_prefill_engine(caf::local_actor* parent, prefill_engine_params params,
                                          runtime::device_port device,
                                          runtime::link_port fetch_link,
                                          std::function<void()> leave) {
  return parent->spawn(prefill_engine_fn, params, std::move(device), std::move(fetch_link),
                       std::move(leave));
}

} // namespace troupe::actors
