#include "actors/engine/decode_engine.hpp"

#include "actors/engine/speculation.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <set>

namespace troupe::actors {

std::string to_string(speculation s) {
  switch (s) {
    case speculation::off:
      return "off";
    case speculation::fixed:
      return "fixed";
    case speculation::dspark:
      return "dspark";
  }
  return "?";
}

std::optional<speculation_setting> parse_speculation(std::string_view text) {
  if (text == "off")
    return speculation_setting{};
  if (text == "dspark")
    return speculation_setting{speculation::dspark, max_drafts};
  if (text.size() == 6 && text.substr(0, 5) == "fixed" && text[5] >= '1' && text[5] <= '5')
    return speculation_setting{speculation::fixed, static_cast<std::uint32_t>(text[5] - '0')};
  return std::nullopt;
}

namespace {

constexpr std::uint64_t block_size = 128;

/// A job in this engine. The fields every step reads come first, then the job (whose own
/// first fields are the ones steps read): a step walks every job of the batch twice, and this
/// keeps each job's share of that walk in few cache lines.
struct running {
  std::uint64_t generated = 0;
  std::uint64_t blocks = 0;
  /// The token the next step feeds.
  std::int32_t last = 0;
  /// How many drafts each step in flight verifies for this job, oldest first.
  std::array<std::uint32_t, 2> verifying{};
  /// Steps in flight that draw a token for this job (at most 2, with overlap).
  std::uint32_t pending = 0;
  /// The device holds the context's KV (always in the simulated world; a real job's first step
  /// computes it).
  bool on_device = true;
  bool stopped = false;
  decode_job job;
  runtime::time_point arrived{};
  runtime::time_point joined{};
  caf::typed_response_promise<decode_done> rp;
  /// Where progress notices go (the job's sender), when the job asks for them.
  caf::actor progress_to;
  runtime::draft_proposal proposal;
  /// Generated since the last progress notice.
  std::vector<std::int32_t> ids;
  std::vector<runtime::sampled_token> logprobs;
  /// Real jobs: the ids the device's cache holds (context, then each token fed), and the last
  /// block keyed so far (its key and the blocks it covers), which the next filled block's key
  /// continues.
  std::vector<std::int32_t> held;
  block_key tip;
  std::uint64_t tip_blocks = 0;
  /// The block whose window state the device last kept for this job (each keep replaces the
  /// one before), told to the prefill balancer when the job ends here.
  std::optional<block_key> kept;
};

/// Tells the prefill balancer (decode_engine_params::kept) where the device keeps the window
/// state of a job that ends here: its reply's last block boundary, which a next turn's
/// cached prefix reaches. The keeps before it were replaced on the device, so they are not
/// told.
template <class Self>
void report_kept(Self* self, const running& run) {
  if (run.kept && self->state.params.kept)
    self->state.params.kept(*run.kept, caf::actor_cast<caf::actor>(self));
}

/// A stop id ends the job: it is the last token sent.
bool is_stop(const decode_job& job, std::int32_t token) {
  return std::find(job.stop_ids.begin(), job.stop_ids.end(), token) != job.stop_ids.end();
}

struct decode_engine_state {
  decode_engine_params params;
  runtime::device_port device;
  runtime::link_port ingress;
  block_sink persist;
  store_sink store;
  std::deque<running> waiting; // KV arrived, batch full
  std::map<std::uint64_t, running> batch;
  std::uint64_t batch_kv = 0;
  std::uint64_t in_transfer = 0;
  /// Jobs whose KV is in transfer, and those of them cancelled meanwhile.
  std::set<std::uint64_t> transferring;
  std::set<std::uint64_t> cancelled;
  /// Steps sent to the device and not answered yet (at most 1; 2 with overlap), and for each,
  /// whether it was built while the previous one ran or right at its end (its gap after that
  /// one is scheduling, not a lack of work).
  std::uint32_t in_flight = 0;
  std::deque<bool> chained;
  /// Inside the result handler: a step built now follows the one just answered.
  bool answering = false;
  /// When the last answered step finished on the device.
  runtime::time_point last_finished{};
  std::uint64_t next_step = 1;
  std::function<void()> leave;
  /// Drain: a notice came; the grace ended (hand off at the next step boundary); handed off.
  bool draining = false;
  bool handoff_due = false;
  bool handed_off = false;
  std::uint64_t forwarded = 0;
  /// Forwarded jobs whose KV the device is exporting.
  std::uint64_t exporting = 0;
  caf::typed_response_promise<std::uint64_t> drain_rp;
  bool drain_answered = false;
  engine_stats stats;
  static inline const char* name = "decode_engine";
};

using engine_ptr = decode_engine_actor::stateful_pointer<decode_engine_state>;

void admit(engine_ptr self) {
  auto& st = self->state;
  auto now = self->clock().now();
  while (!st.waiting.empty() && st.batch.size() < st.params.max_batch) {
    auto r = std::move(st.waiting.front());
    st.waiting.pop_front();
    r.joined = now;
    st.batch_kv += r.job.context_tokens;
    st.batch.emplace(r.job.request, std::move(r));
  }
}

/// The drain is answered once the hand-off is done, no KV is still coming in and every
/// forwarded job's KV has left the device.
void maybe_answer_drain(engine_ptr self) {
  auto& st = self->state;
  if (st.handed_off && st.in_transfer == 0 && st.exporting == 0 && !st.drain_answered) {
    st.drain_answered = true;
    st.drain_rp.deliver(st.forwarded);
  }
}

/// Answers a job that leaves unfinished: its request continues elsewhere with its KV. A real
/// job's KV on the device (everything: blocks, State KV, SWA rings) is exported first and goes
/// with the answer, so that the next instance imports it instead of recomputing the context;
/// an export that fails leaves the next instance to recompute.
void forward(engine_ptr self, running& run, std::vector<filled_blocks>& filled) {
  auto& st = self->state;
  // The block writer forgets the request's chain tip (no block is filled by leaving).
  if (run.blocks > 0)
    filled.push_back(filled_blocks{run.job.request, run.job.parent, run.job.parent_blocks,
                                   (run.job.context_tokens + run.generated) / block_size, 0,
                                   run.job.traffic, true});
  decode_done d{run.job.request, st.params.instance, run.arrived, run.joined,
                self->clock().now(), run.generated, run.blocks};
  d.forwarded = true;
  d.ids = std::move(run.ids);
  d.logprobs = std::move(run.logprobs);
  ++st.forwarded;
  if (run.job.context.empty() || !run.on_device) {
    // Simulated (the KV moves by the modelled transfer), or nothing on the device yet.
    run.rp.deliver(std::move(d));
    self->send(st.device, runtime::device_release{run.job.request});
    return;
  }
  ++st.exporting;
  auto done = [self](caf::typed_response_promise<decode_done>& rp, decode_done& d) {
    rp.deliver(std::move(d));
    --self->state.exporting;
    maybe_answer_drain(self);
  };
  self->request(st.device, caf::infinite, runtime::kv_export{run.job.request, 0, false})
    .then(
      [done, rp = run.rp, d](runtime::kv_snapshot_ptr kv) mutable {
        d.kv = std::move(kv);
        done(rp, d);
      },
      [done, rp = run.rp, d](const caf::error&) mutable { done(rp, d); });
  // (After the export in the device's mailbox.)
  self->send(st.device, runtime::device_release{run.job.request});
}

/// The hand-off: every job still here is forwarded, all in this one step.
void hand_off(engine_ptr self) {
  auto& st = self->state;
  st.handoff_due = false;
  st.handed_off = true;
  std::vector<filled_blocks> filled;
  for (auto& [id, run] : st.batch)
    forward(self, run, filled);
  st.batch.clear();
  st.batch_kv = 0;
  for (auto& run : st.waiting)
    forward(self, run, filled);
  st.waiting.clear();
  if (!filled.empty() && st.persist)
    st.persist(filled);
  maybe_answer_drain(self);
}

/// A real job's cache just filled a block: keys every block after the last one keyed (the
/// prompt's chain, or the blocks of earlier steps) from the ids the cache holds, exports their
/// bytes from the device and hands both to the store sink.
void store_filled(engine_ptr self, running& run) {
  auto& st = self->state;
  const auto full = run.held.size() / block_size;
  if (full <= run.tip_blocks)
    return;
  store_blocks out;
  out.traffic = run.job.traffic;
  const auto first = run.tip_blocks;
  for (auto b = first; b < full; ++b) {
    std::vector<std::uint32_t> ids(run.held.begin() + static_cast<std::ptrdiff_t>(b * block_size),
                                   run.held.begin()
                                     + static_cast<std::ptrdiff_t>((b + 1) * block_size));
    run.tip = chain_hash(run.tip, ids);
    out.keys.push_back(run.tip);
  }
  run.tip_blocks = full;
  self->request(st.device, caf::infinite, runtime::kv_export{run.job.request, first, true})
    .then(
      [self, out = std::move(out)](runtime::kv_snapshot_ptr kv) mutable {
        if (!kv || kv->blocks.size() < out.keys.size())
          return;  // a device that keeps no blocks (the script device)
        out.kv = std::move(kv);
        self->state.store(std::move(out));
      },
      // The sequence is gone (cancelled meanwhile): nothing to persist.
      [](const caf::error&) {});
}

bool idle(const decode_engine_state& st) {
  return st.batch.empty() && st.waiting.empty() && st.in_transfer == 0 && st.in_flight == 0;
}

/// The drafts each job of the batch verifies this step, in batch order (empty: none verifies
/// any — speculation off): none without a proposal from the previous step (or on a step that
/// rebuilds the context), never more than the job still needs after the step's own token.
/// With a step in flight for the job (overlap) the drafts verified are the ones that step
/// proposes, not known yet: their number is chosen on the confidences of the proposal before
/// (two steps old instead of one), and the job needs at least one token fewer.
std::vector<std::uint32_t> verify_lengths(const decode_engine_state& st) {
  if (st.params.spec == speculation::off)
    return {};
  std::vector<draft_confidences> offered;
  offered.reserve(st.batch.size());
  for (const auto& [id, run] : st.batch) {
    draft_confidences d;
    if (run.on_device) {
      auto n = static_cast<std::uint64_t>(std::min<std::size_t>(run.proposal.confidences.size(),
                                                                max_drafts));
      if (!run.job.context.empty())
        n = std::min<std::uint64_t>(n, run.proposal.tokens.size());
      const auto done = run.generated + run.pending;
      const auto left = run.job.output_tokens > done ? run.job.output_tokens - done : 0;
      n = std::min<std::uint64_t>(n, left > 0 ? left - 1 : 0);
      d.count = static_cast<std::uint32_t>(n);
      std::copy_n(run.proposal.confidences.begin(), n, d.confidence.begin());
    }
    offered.push_back(d);
  }
  if (st.params.spec == speculation::dspark && st.params.step_cost) {
    const auto sequences = static_cast<std::uint32_t>(st.batch.size());
    auto cost = [&](std::uint64_t tokens) {
      runtime::device_step s{0, runtime::step_phase::decode, tokens, sequences,
                             st.batch_kv + tokens - sequences, 0, {}};
      return std::max(runtime::to_seconds(st.params.step_cost(s)), 1e-12);
    };
    return choose_verify_lengths(offered, cost).lengths;
  }
  std::vector<std::uint32_t> lengths;
  lengths.reserve(offered.size());
  for (const auto& d : offered)
    lengths.push_back(std::min(d.count, st.params.fixed_drafts));
  return lengths;
}

/// Steps that may be in flight: 2 with overlap (the next is built while one runs), else 1.
std::uint32_t depth(const decode_engine_state& st) {
  return st.params.overlap ? 2 : 1;
}

void on_result(engine_ptr self, runtime::device_result& r);

void step(engine_ptr self) {
  auto& st = self->state;
  if (st.handed_off || st.in_flight >= depth(st))
    return;
  // A draining instance whose work is all done leaves at once (nothing to forward); one whose
  // grace ended leaves once its steps in flight are answered.
  if (st.draining && (st.handoff_due || idle(st))) {
    if (st.in_flight == 0)
      hand_off(self);
    return;
  }
  admit(self);
  if (st.batch.empty())
    return;
  // With a step in flight (overlap), this one is built before that one's tokens are known.
  const bool ahead = st.in_flight > 0;
  const auto verify = verify_lengths(st);
  runtime::device_step ds{st.next_step, runtime::step_phase::decode, 0, 0, 0, 0, {}};
  ds.batch.reserve(st.batch.size());
  std::size_t at = 0;
  for (auto& [id, run] : st.batch) {
    const auto verifying = verify.empty() ? 0 : verify[at++];
    // The step in flight draws this job's last token: nothing left for this one.
    if (run.generated + run.pending >= run.job.output_tokens)
      continue;
    const auto position = run.job.context_tokens + run.generated + run.pending;
    // (Built in place: a row is 112 bytes.)
    auto& seq = ds.batch.emplace_back(id, position, std::uint32_t{1}, std::vector<std::int32_t>{},
                                      true, run.job.sampling);
    // Every job asks for drafts when speculation is on: a real device accepts a draft when it
    // equals the token it draws at that position (greedy or seeded), so a job's output is the
    // one it has without drafts.
    seq.propose = st.params.spec != speculation::off;
    seq.keep = st.store && st.params.kept && !run.job.context.empty();
    ds.proposing += seq.propose ? 1 : 0;
    ds.masks += run.job.constraint.format.empty() ? 0 : 1 + verifying;
    run.verifying[run.pending] = verifying;
    seq.verify = verifying;
    seq.count += verifying;
    seq.feed_drawn = run.pending > 0;
    ds.tokens += 1 + verifying;
    ds.context_tokens += position;
    if (!run.job.context.empty()) {
      if (!run.on_device) {
        // Rebuild the context's KV here, in the same step (decode_engine.hpp).
        seq.position = 0;
        seq.count = static_cast<std::uint32_t>(run.job.context.size() + 1);
        seq.tokens = run.job.context;
        run.on_device = true;
      }
      if (seq.feed_drawn) {
        // The token to feed and the drafts to verify are those the step in flight draws and
        // proposes: the device patches them in (the ids the cache holds get the token when it
        // arrives, and the drafts it accepts with the next answer).
        seq.tokens.resize(seq.tokens.size() + 1 + verifying, 0);
      } else {
        seq.tokens.push_back(run.last);
        if (st.store)
          run.held.push_back(run.last);
        seq.tokens.insert(seq.tokens.end(), run.proposal.tokens.begin(),
                          run.proposal.tokens.begin() + verifying);
      }
    }
    ++run.pending;
  }
  if (ds.batch.empty())
    return;
  ds.sequences = static_cast<std::uint32_t>(ds.batch.size());
  if (st.params.prepare_cost)
    ds.prepare = st.params.prepare_cost(ds);
  ++st.next_step;
  ++st.in_flight;
  st.chained.push_back(ahead || st.answering);
  self->request(st.device, caf::infinite, std::move(ds))
    .then([self](runtime::device_result& r) { on_result(self, r); },
          [self](const caf::error& err) { self->quit(err); });
  // Overlap: the next step is prepared while this one runs.
  step(self);
}

void on_result(engine_ptr self, runtime::device_result& r) {
  auto& st = self->state;
  --st.in_flight;
  ++st.stats.steps;
  st.stats.busy += r.finished - r.started;
  runtime::duration stalled{0};
  if (st.chained.front()) {
    ++st.stats.chained_steps;
    if (r.started > st.last_finished)
      stalled = r.started - st.last_finished;
    st.stats.stalled += stalled;
  }
  st.chained.pop_front();
  st.last_finished = r.finished;
  if (st.params.on_step)
    st.params.on_step(r.started, r.finished, stalled);
  std::vector<filled_blocks> filled;
  const auto verified_before = st.stats.verify_steps;
  const auto drafts_before = st.stats.drafts_verified;
  const auto accepted_before = st.stats.drafts_accepted;
  // The sampled tokens (and proposals) come in batch order, i.e. by request id; a job
  // cancelled or finished while the step ran has none of its own any more, and one that joined
  // after it was built has none yet.
  auto sampled = r.sampled.begin();
  auto proposal = r.drafts.begin();
  for (auto i = st.batch.begin(); i != st.batch.end();) {
    auto& run = i->second;
    while (sampled != r.sampled.end() && sampled->sequence < i->first)
      ++sampled;
    while (proposal != r.drafts.end() && proposal->sequence < i->first)
      ++proposal;
    if (sampled == r.sampled.end() || sampled->sequence != i->first) {
      ++i;
      continue;
    }
    --run.pending;
    const auto verified = run.verifying[0];
    run.verifying = {run.verifying[1], 0};
    // This sequence's tokens: one, plus one per accepted draft.
    const auto first = sampled;
    while (sampled != r.sampled.end() && sampled->sequence == i->first)
      ++sampled;
    const auto answered = static_cast<std::uint64_t>(sampled - first);
    if (verified > 0) {
      ++st.stats.verify_steps;
      st.stats.drafts_verified += verified;
      st.stats.drafts_accepted += answered - 1;
    }
    run.proposal = {};
    if (proposal != r.drafts.end() && proposal->sequence == i->first)
      run.proposal = std::move(*proposal++);
    // Real world: the accepted drafts are in the device's cache too, and so is the last token
    // when a step in flight feeds it.
    if (!run.job.context.empty() && st.store) {
      for (auto t = first; t + 1 < sampled; ++t)
        run.held.push_back(t->token);
      if (run.pending > 0)
        run.held.push_back((sampled - 1)->token);
    }
    // The device's cache holds the context and every token answered but the last: the step
    // left it at this length (at a block boundary, the device set the window state aside).
    const auto reached = run.job.context_tokens + run.generated + answered;
    bool done = false;
    for (auto t = first; t != sampled && !done; ++t) {
      ++st.stats.tokens;
      ++run.generated;
      ++st.batch_kv;
      run.last = t->token;
      run.ids.push_back(t->token);
      if (run.job.sampling.top_logprobs >= 0)
        run.logprobs.push_back(std::move(*t));
      run.stopped = is_stop(run.job, run.last);
      const auto length = run.job.context_tokens + run.generated;
      done = run.stopped || run.generated >= run.job.output_tokens;
      const bool full = length % block_size == 0;
      if (full)
        ++run.blocks;
      if (!run.job.context.empty()) {
        // Real world: key the blocks by their ids and store their bytes (before a release).
        if (full && st.store) {
          store_filled(self, run);
          if (length == reached && st.params.kept && run.tip_blocks == length / block_size) {
            self->send(st.device,
                       runtime::kv_keep{i->first, runtime::store_key{run.tip.hi, run.tip.lo},
                                        length});
            run.kept = run.tip;
          }
        }
      } else if (full || (done && run.blocks > 0)) {
        filled.push_back(filled_blocks{i->first, run.job.parent, run.job.parent_blocks,
                                       length / block_size - 1, full ? 1u : 0u,
                                       run.job.traffic, done});
      }
    }
    if (!done && run.job.progress_every > 0 && run.ids.size() >= run.job.progress_every
        && run.progress_to) {
      caf::anon_send(run.progress_to,
                     decode_progress{i->first, st.params.instance, run.generated,
                                     std::move(run.ids), std::move(run.logprobs)});
      run.ids.clear();
      run.ids.reserve(run.job.progress_every);
      run.logprobs.clear();
    }
    if (done) {
      // (A step in flight that still computes a token for it — it ended on a stop id — is
      // answered before the release reaches the device; that token is dropped.)
      decode_done d{i->first, st.params.instance, run.arrived, run.joined, r.finished,
                    run.generated, run.blocks};
      d.stopped = run.stopped;
      d.ids = std::move(run.ids);
      d.logprobs = std::move(run.logprobs);
      report_kept(self, run);  // (before the answer: a next turn may follow it at once)
      run.rp.deliver(std::move(d));
      self->send(st.device, runtime::device_release{i->first});
      st.batch_kv -= run.job.context_tokens + run.generated;
      ++st.stats.jobs_done;
      i = st.batch.erase(i);
    } else {
      ++i;
    }
  }
  if (!filled.empty() && st.persist)
    st.persist(filled);
  if (st.params.on_verify && st.stats.verify_steps > verified_before)
    st.params.on_verify(st.stats.verify_steps - verified_before,
                        st.stats.drafts_verified - drafts_before,
                        st.stats.drafts_accepted - accepted_before);
  st.answering = true;
  step(self);
  st.answering = false;
}

decode_engine_actor::behavior_type decode_engine_fn(engine_ptr self, decode_engine_params params,
                                                     runtime::device_port device,
                                                     runtime::link_port ingress,
                                                     block_sink persist,
                                                     std::function<void()> leave,
                                                     store_sink store) {
  auto& st = self->state;
  st.leave = std::move(leave);
  st.store = std::move(store);
  st.params = params;
  st.device = std::move(device);
  st.ingress = std::move(ingress);
  st.persist = std::move(persist);
  st.stats.instance = params.instance;
  return {
    [self](const decode_job& job) -> caf::typed_response_promise<decode_done> {
      auto& st = self->state;
      running r;
      r.job = job;
      r.last = job.next;
      r.on_device = job.context.empty();
      if (st.store && !job.context.empty()) {
        r.held = job.context;
        r.tip = job.parent;
        r.tip_blocks = job.parent_blocks;
      }
      // (Before the promise is made: making it takes over the current message's sender.)
      if (job.progress_every > 0)
        r.progress_to = caf::actor_cast<caf::actor>(self->current_sender());
      r.rp = self->make_response_promise<decode_done>();
      auto rp = r.rp;
      if (job.output_tokens == 0) {
        auto now = self->clock().now();
        r.rp.deliver(decode_done{job.request, st.params.instance, now, now, now, 0, 0});
        return rp;
      }
      auto arrive = [self](running&& run) {
        auto& st = self->state;
        run.arrived = self->clock().now();
        if (st.cancelled.erase(run.job.request) > 0) {
          run.rp.deliver(caf::make_error(caf::sec::request_receiver_down, "cancelled"));
          maybe_answer_drain(self);
          return;
        }
        if (st.handed_off) {
          // Routed here before the drain excluded the instance: straight on, with its KV.
          std::vector<filled_blocks> filled;
          forward(self, run, filled);
          maybe_answer_drain(self);
          return;
        }
        st.waiting.push_back(std::move(run));
        step(self);
      };
      // The handed-off KV goes into the device before the job joins; refused, the job
      // recomputes its context in its first step.
      auto import_then_arrive = [self, arrive](running&& run) {
        auto kv = run.job.kv;
        if (!kv) {
          arrive(std::move(run));
          return;
        }
        auto holder = std::make_shared<running>(std::move(run));
        self->request(self->state.device, caf::infinite,
                      runtime::kv_import{holder->job.request, std::move(kv)})
          .then(
            [holder, arrive](caf::ok_atom) {
              holder->on_device = true;
              holder->job.kv = nullptr;
              arrive(std::move(*holder));
            },
            [self, holder, arrive](const caf::error&) {
              ++self->state.stats.kv_import_failures;
              holder->job.kv = nullptr;
              arrive(std::move(*holder));
            });
      };
      if (job.kv_bytes == 0 || st.ingress == nullptr) {
        import_then_arrive(std::move(r));
        return rp;
      }
      ++st.in_transfer;
      st.transferring.insert(job.request);
      auto holder = std::make_shared<running>(std::move(r));
      self->request(st.ingress, caf::infinite, runtime::link_transfer{job.request, job.kv_bytes})
        .then([self, holder, import_then_arrive](const runtime::link_delivery&) {
          --self->state.in_transfer;
          self->state.transferring.erase(holder->job.request);
          import_then_arrive(std::move(*holder));
        });
      return rp;
    },
    [self](drain_atom, runtime::duration grace) -> caf::result<std::uint64_t> {
      auto& st = self->state;
      if (st.draining)
        return caf::make_error(caf::sec::invalid_argument, "already draining");
      st.draining = true;
      st.drain_rp = self->make_response_promise<std::uint64_t>();
      auto rp = st.drain_rp;
      if (st.leave)
        st.leave();
      self->delayed_send(self, grace, drain_end_atom::value);
      step(self);
      return rp;
    },
    [self](drain_end_atom) {
      auto& st = self->state;
      if (st.handed_off)
        return;
      st.handoff_due = true;
      step(self); // hands off now, or at the end of the step in flight
    },
    [self](engine_stats_atom) {
      auto s = self->state.stats;
      s.jobs_in_flight = self->state.batch.size() + self->state.waiting.size()
                         + self->state.in_transfer;
      return s;
    },
    [self](cancel_atom, std::uint64_t request) {
      auto& st = self->state;
      auto drop = [&](running& run) {
        // A client that stopped the reply may go on with the conversation from its part.
        report_kept(self, run);
        run.rp.deliver(caf::make_error(caf::sec::request_receiver_down, "cancelled"));
        // The block writer forgets the request's chain tip.
        if (run.blocks > 0 && st.persist)
          st.persist({filled_blocks{request, run.job.parent, run.job.parent_blocks,
                                    (run.job.context_tokens + run.generated) / block_size, 0,
                                    run.job.traffic, true}});
        self->send(st.device, runtime::device_release{request});
      };
      if (auto i = st.batch.find(request); i != st.batch.end()) {
        st.batch_kv -= i->second.job.context_tokens + i->second.generated;
        drop(i->second);
        st.batch.erase(i);
        return;
      }
      auto w = std::find_if(st.waiting.begin(), st.waiting.end(),
                            [&](const running& r) { return r.job.request == request; });
      if (w != st.waiting.end()) {
        drop(*w);
        st.waiting.erase(w);
      }
      // Its KV may still be in transfer: it is dropped when it arrives.
      if (st.transferring.count(request) > 0)
        st.cancelled.insert(request);
    },
    [self](const kept_state_get& g) -> caf::result<kept_state> {
      return answer_kept_state(self, self->state.device, g);
    },
    [self](const kv_part_streamed& part) {
      // The bytes occupy the link now; the job's own transfer queues behind them.
      if (self->state.ingress != nullptr && part.bytes > 0)
        self->request(self->state.ingress, caf::infinite,
                      runtime::link_transfer{part.request, part.bytes})
          .then([](const runtime::link_delivery&) {});
    },
  };
}

} // namespace

decode_engine_actor spawn_decode_engine(caf::local_actor* parent, decode_engine_params params,
                                        runtime::device_port device, runtime::link_port ingress,
                                        block_sink persist, std::function<void()> leave,
                                        store_sink store) {
  return parent->spawn(decode_engine_fn, params, std::move(device), std::move(ingress),
                       std::move(persist), std::move(leave), std::move(store));
}

} // namespace troupe::actors
