// The CPU device port (see cpu_device.hpp).
#include "ports/cpu_device.hpp"
#include "ports/rank_processes.hpp"

#include "kernels/backend.hpp"
#include "kernels/ep_group_backend.hpp"
#include "kernels/generate.hpp"
#include "kernels/model_config.hpp"
#include "kernels/safetensors.hpp"
#include "kernels/sampling.hpp"

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <vector>

namespace troupe::ports {

using runtime::device_errc;
using runtime::make_error;

namespace {

// -- model fingerprint ----------------------------------------------------------------------

/// Feeds `bytes` to `h`, sampled as model_fingerprint documents.
void hash_sampled(XXH3_state_t* h, std::span<const std::byte> bytes) {
  constexpr std::size_t whole = 8192, edge = 4096, pieces = 16, piece = 256;
  if (bytes.size() <= whole) {
    XXH3_64bits_update(h, bytes.data(), bytes.size());
    return;
  }
  XXH3_64bits_update(h, bytes.data(), edge);
  XXH3_64bits_update(h, bytes.data() + bytes.size() - edge, edge);
  const std::size_t stride = (bytes.size() - piece) / pieces;
  for (std::size_t k = 0; k < pieces; ++k)
    XXH3_64bits_update(h, bytes.data() + k * stride, piece);
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// `id` with the content of an Engram map folded in (it changes what the caches hold).
std::string with_map(const std::string& id, const std::vector<std::int64_t>& map) {
  const auto h = XXH3_64bits(map.data(), map.size() * sizeof(std::int64_t));
  return id + "+engram:" + hex64(h);
}

// -- the device -----------------------------------------------------------------------------

/// A sequence's State and SWA KV kept at a block boundary (kv_keep).
struct kept_state {
  std::uint64_t length = 0;
  /// The sequence that kept it.
  std::uint64_t sequence = 0;
  std::string state;
  std::string swa;
  std::list<runtime::store_key>::iterator recency;
};

/// The device's metrics (all null without a registry).
struct device_metrics {
  runtime::gauge* sequences = nullptr;
  runtime::gauge* blocks = nullptr;
  runtime::gauge* kept = nullptr;
  runtime::gauge* kept_bytes = nullptr;
  runtime::counter* prefill_tokens = nullptr;
  runtime::counter* decode_tokens = nullptr;
  runtime::counter* restored_exact = nullptr;
  runtime::counter* restored_pulled = nullptr;
  runtime::counter* restored_replayed = nullptr;
  runtime::counter* restore_rejected = nullptr;
  runtime::counter* checksum_failures = nullptr;
  runtime::counter* imported = nullptr;
  runtime::counter* import_refused = nullptr;
  runtime::counter* drafts_proposed = nullptr;
  runtime::counter* drafts_verified = nullptr;
  runtime::counter* drafts_accepted = nullptr;
  runtime::counter* placements_applied = nullptr;
  runtime::counter* placements_refused = nullptr;
  runtime::counter* evictions = nullptr;
};

struct cpu_device_state {
  /// The processes of the EP group's other ranks (ranks_per_process): reaped after `backend`,
  /// which holds their sockets, is gone.
  rank_processes peers;
  std::function<void(std::uint32_t)> on_ranks_lost;
  std::unique_ptr<kernels::model_backend> backend;
  /// Set when the model could not be loaded: every request is answered with it.
  caf::error load_error;
  std::string model_id;
  std::int64_t vocab = 0;
  /// The port's sequence ids -> the backend's.
  std::map<std::uint64_t, kernels::sequence_id> sequences;
  /// The last token drawn for each sequence and the drafts proposed after it: what a
  /// `feed_drawn` step feeds.
  struct last_draw {
    std::int32_t token = 0;
    std::vector<std::int32_t> drafts;
  };
  std::map<std::uint64_t, last_draw> drawn;
  /// Kept State and SWA KV by block key, and their recency (most recent first).
  std::map<runtime::store_key, kept_state> kept;
  std::list<runtime::store_key> recency;
  std::uint64_t kept_bytes = 0;
  /// A decode sequence's State and SWA KV at the newest block boundary a step left it at
  /// (step_sequence::keep), until a kv_keep at that length keeps them or it is released.
  struct boundary_copy {
    std::uint64_t length = 0;
    std::string state;
    std::string swa;
  };
  std::map<std::uint64_t, boundary_copy> boundary;
  /// The key each held sequence kept its newest copy under: its next keep replaces that copy
  /// (a decode sequence keeps at every boundary; a later prompt mostly matches up to its last).
  std::map<std::uint64_t, runtime::store_key> kept_by_sequence;
  std::uint64_t keep_limit = 0;
  device_metrics metrics;
  std::shared_ptr<runtime::token_constraints> constraints;
  std::vector<std::uint32_t> mask;  // constraints' allowed ids; masked: the row with -inf elsewhere
  std::vector<float> masked;
  /// Expert-parallel load balancing: the link, the proposal switched to, the router counts
  /// already reported.
  std::shared_ptr<expert_link> experts;
  std::uint64_t placement_seen = 0;
  std::vector<std::uint64_t> reported;
  /// troupe_device_expert_tokens_total, one child per routed expert (with a link and metrics).
  std::vector<runtime::counter*> expert_tokens;
  /// The backend's evictions already added to the metric.
  std::uint64_t evictions_counted = 0;
  static inline const char* name = "cpu_device";
};

using self_ptr = runtime::device_port::stateful_pointer<cpu_device_state>;

/// A name of its own for a loaded model that came without a directory or a name.
std::string private_model_id(const kernels::model& m) {
  static std::atomic<std::uint64_t> next{1};
  return m.text().model_type + ":private-" + std::to_string(next++);
}

/// Registers the device's metric families in `reg` (labelled device=`name`).
device_metrics register_metrics(runtime::registry* reg, const std::string& name) {
  device_metrics m;
  auto gauge = [&](const char* family, const char* help) {
    return runtime::gauge_child(reg, family, help, {"device"}, {name});
  };
  auto counter = [&](const char* family, const char* help, const char* label,
                     const char* value) {
    return runtime::counter_child(reg, family, help, {"device", label}, {name, value});
  };
  m.sequences = gauge("troupe_device_sequences", "Sequences whose KV the device holds.");
  m.blocks = gauge("troupe_device_kv_blocks",
                   "Full 128-token KV blocks held by the device's sequences.");
  m.kept = gauge("troupe_device_kept_states",
                 "State and SWA KV copies kept at block boundaries for exact prefix restores.");
  m.kept_bytes = gauge("troupe_device_kept_bytes",
                       "Host memory those copies take (at most serve --window-memory).");
  const char* computed = "Tokens the device computed, by step phase.";
  m.prefill_tokens = counter("troupe_device_tokens_total", computed, "phase", "prefill");
  m.decode_tokens = counter("troupe_device_tokens_total", computed, "phase", "decode");
  const char* restores = "Sequences opened from persisted Block KV, by how their window and "
                         "unfinished block were restored (exact: a copy this device kept; "
                         "pulled: a copy another device kept, brought by the request; replayed: "
                         "bounded replay; rejected: bad blocks or tokens).";
  m.restored_exact = counter("troupe_kv_restores_total", restores, "outcome", "exact");
  m.restored_pulled = counter("troupe_kv_restores_total", restores, "outcome", "pulled");
  m.restored_replayed = counter("troupe_kv_restores_total", restores, "outcome", "replayed");
  m.restore_rejected = counter("troupe_kv_restores_total", restores, "outcome", "rejected");
  const char* drafts = "Speculative drafts: proposed by the model's DSpark layers, verified by "
                       "a step, accepted (equal to the token drawn there).";
  m.drafts_proposed = counter("troupe_device_drafts_total", drafts, "outcome", "proposed");
  m.drafts_verified = counter("troupe_device_drafts_total", drafts, "outcome", "verified");
  m.drafts_accepted = counter("troupe_device_drafts_total", drafts, "outcome", "accepted");
  const char* placements = "Expert placements (serve --eplb: the starting contiguous one, then "
                           "the expert balancer's) switched to at a step boundary, or refused.";
  m.placements_applied = counter("troupe_device_expert_placements_total", placements, "outcome",
                                 "applied");
  m.placements_refused = counter("troupe_device_expert_placements_total", placements, "outcome",
                                 "refused");
  m.evictions = runtime::counter_child(
    reg, "troupe_device_evictions_total",
    "Sequences the device moved out of its memory to make room for a step's (a CUDA device "
    "holding more sequences than its max_sequences: they wait in host memory).",
    {"device"}, {name});
  const char* imports = "Hand-off snapshots (a prefill's or a drained decode instance's KV) the "
                        "device imported, or refused (another model's, a checksum, bytes or "
                        "blocks that do not make the sequence): those requests recompute their "
                        "context.";
  m.imported = counter("troupe_kv_imports_total", imports, "outcome", "imported");
  m.import_refused = counter("troupe_kv_imports_total", imports, "outcome", "refused");
  m.checksum_failures = runtime::counter_child(
    reg, "troupe_kv_checksum_failures_total",
    "KV handed to the device (hand-off snapshots, restored blocks) that failed its checksum "
    "and was refused.",
    {"device"}, {name});
  return m;
}

/// Sets the device's gauges from its state.
void update_gauges(const cpu_device_state& st) {
  const auto& m = st.metrics;
  if (m.sequences != nullptr)
    m.sequences->set(static_cast<double>(st.sequences.size()));
  if (m.kept != nullptr)
    m.kept->set(static_cast<double>(st.kept.size()));
  if (m.kept_bytes != nullptr)
    m.kept_bytes->set(static_cast<double>(st.kept_bytes));
  if (m.blocks != nullptr && st.backend) {
    std::int64_t blocks = 0;
    for (const auto& [seq, id] : st.sequences)
      if (auto b = st.backend->full_blocks(id))
        blocks += *b;
    m.blocks->set(static_cast<double>(blocks));
  }
}

void inc(runtime::counter* c, double amount = 1.0) {
  if (c != nullptr)
    c->inc(amount);
}

/// Measures `profile` (cpu_device_params::profile) on the loaded backend.
void measure(kernels::model_backend& be, std::int64_t vocab, step_profile& profile) {
  using clock = std::chrono::steady_clock;
  step_profile::points points;
  std::vector<std::int64_t> tokens(profile_max_tokens);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int64_t>(i * 7 + 3) % vocab;
  for (std::uint64_t n = 1; n <= profile_max_tokens; n *= 2) {
    double best = INFINITY;
    for (int round = 0; round < 3; ++round) {
      const auto id = be.open_sequence();
      const kernels::step_input in{id, std::span<const std::int64_t>(tokens).first(n)};
      const std::int64_t rows = 1;
      const auto start = clock::now();
      auto logits = be.step_tail(std::span(&in, 1), std::span(&rows, 1), nullptr);
      const auto took = std::chrono::duration<double>(clock::now() - start).count();
      (void) be.close_sequence(id);
      if (!logits)
        return;  // no profile: DSpark then verifies like fixed-length speculation
      best = std::min(best, took);
    }
    points.emplace_back(n, best);
  }
  profile.set(std::move(points));
}

} // namespace

kernels::result<std::vector<std::int64_t>> set_engram_map(kernels::model& m,
                                                          const std::string& map) {
  using r = kernels::result<std::vector<std::int64_t>>;
  if (map.empty()) {
    if (!m.text().engram_layer_ids.empty())
      return r::failure("the model has Engram layers: give engram_map (a JSON file, or identity "
                        "for a random model directory)");
    return std::vector<std::int64_t>{};
  }
  auto loaded = kernels::load_engram_token_map(m, map);
  if (!loaded)
    return r::failure(loaded.error());
  if (auto ok = m.set_engram_token_map(*loaded); !ok)
    return r::failure(ok.error());
  return loaded;
}

namespace {

/// Loads the model (on the device's thread) into the state, or sets the load error: one model,
/// or the ranks of an EP group (cpu_device_params::ep_ranks).
void load(cpu_device_state& st, cpu_device_params& p) {
  auto fail = [&](const std::string& why) {
    st.load_error = make_error(device_errc::load_failed, why);
  };
  if (p.ep_ranks > 1 && (p.model || p.backend || p.experts))
    return fail("an EP group of " + std::to_string(p.ep_ranks)
                + " ranks loads the CPU engine from a model directory, and keeps its expert "
                  "placement (no loaded model, other backend or expert balancer)");
  const bool preloaded = p.model.has_value();
  std::string id = p.model_id;
  if (id.empty() && !p.model_dir.empty()) {
    auto fp = model_fingerprint(p.model_dir);
    if (!fp)
      return fail(fp.error());
    id = *fp;
  }
  // Each loaded model (one, or every rank) gets its Engram map; the first names the id after it.
  bool named = false;
  auto prepare = [&](kernels::model& m) -> kernels::result<bool> {
    if (id.empty())
      id = private_model_id(m);  // a model loaded by the caller, without a directory or name
    if (p.engram_map.empty() && preloaded)
      return true;  // it came with its map
    auto map = set_engram_map(m, p.engram_map);
    if (!map)
      return kernels::result<bool>::failure(map.error());
    if (!map->empty() && p.model_id.empty() && !named)
      id = with_map(id, *map);
    named = true;
    return true;
  };
  kernels::result<std::unique_ptr<kernels::model_backend>> backend =
    kernels::result<std::unique_ptr<kernels::model_backend>>::failure("not loaded");
  if (p.ep_ranks > 1) {
    auto cfg = kernels::load_model_config(p.model_dir);
    if (!cfg)
      return fail(cfg.error());
    auto placement = kernels::place_experts(
      static_cast<std::int32_t>(cfg->text.n_routed_experts), static_cast<std::int32_t>(p.ep_ranks));
    if (!placement)
      return fail("an EP group of " + std::to_string(p.ep_ranks) + " ranks: " + placement.error());
    std::vector<kernels::ep_peer> peers;
    if (p.ranks_per_process > 0 && p.ranks_per_process < p.ep_ranks) {
      auto started = st.peers.start(p.rank_program,
                                    {.model_dir = p.model_dir,
                                     .engram_map = p.engram_map,
                                     .threads = p.threads,
                                     .batch_invariant = p.batch_invariant,
                                     .group = p.ep_ranks,
                                     .ranks = {}},
                                    p.ranks_per_process);
      if (!started)
        return fail(started.error());
      peers = std::move(*started);
    }
    backend = kernels::open_ep_group(
      p.model_dir, {.threads = p.threads, .batch_invariant = p.batch_invariant}, *placement,
      prepare, {}, std::move(peers));
    st.vocab = cfg->text.vocab_size;
  } else {
    std::optional<kernels::model> m = std::move(p.model);
    p.model.reset();
    if (!m) {
      auto loaded = kernels::model::load(
        p.model_dir, {.threads = p.threads, .batch_invariant = p.batch_invariant});
      if (!loaded)
        return fail(loaded.error());
      m.emplace(std::move(*loaded));
    }
    if (auto ok = prepare(*m); !ok)
      return fail(ok.error());
    st.vocab = m->text().vocab_size;
    if (p.backend)
      backend = p.backend(std::move(*m));
    else
      backend = std::unique_ptr<kernels::model_backend>(
        std::make_unique<kernels::cpu_backend>(std::move(*m)));
  }
  if (!backend)
    return fail(backend.error());
  st.model_id = std::move(id);
  st.backend = std::move(*backend);
  if (p.profile && p.profile->get().empty())
    measure(*st.backend, st.vocab, *p.profile);
}

kernels::sampling_params to_kernels(const runtime::sampling& s) {
  kernels::sampling_params k;
  k.greedy = s.temperature == 0.0;
  k.temperature = s.temperature;
  k.top_k = s.top_k;
  k.top_p = s.top_p;
  k.min_p = s.min_p;
  k.seed = s.seed;
  return k;
}

/// The sampled token's log-probability under the raw logits and the `k` most likely tokens'
/// (most likely first, lowest id on ties).
void add_logprobs(std::span<const float> row, std::int32_t k, runtime::sampled_token& out) {
  double top = -INFINITY;
  for (float v : row)
    top = std::max(top, static_cast<double>(v));
  double sum = 0.0;
  for (float v : row)
    sum += std::exp(static_cast<double>(v) - top);
  const double lse = top + std::log(sum);
  auto logprob = [&](std::size_t i) { return static_cast<float>(row[i] - lse); };
  out.logprob = logprob(static_cast<std::size_t>(out.token));
  const auto n = std::min<std::size_t>(static_cast<std::size_t>(std::max(k, 0)), row.size());
  std::vector<std::int32_t> ids(row.size());
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      const float x = row[static_cast<std::size_t>(a)];
                      const float y = row[static_cast<std::size_t>(b)];
                      return x != y ? x > y : a < b;
                    });
  out.top.clear();
  for (std::size_t i = 0; i < n; ++i)
    out.top.emplace_back(ids[i], logprob(static_cast<std::size_t>(ids[i])));
}

/// The reason `step` cannot run on this device, or none.
caf::error validate(const cpu_device_state& st, const runtime::device_step& step) {
  auto held = [&](std::uint64_t sequence) -> std::uint64_t {
    auto i = st.sequences.find(sequence);
    if (i == st.sequences.end())
      return 0;
    auto len = st.backend->length(i->second);
    return len ? static_cast<std::uint64_t>(*len) : 0;
  };
  auto extra = [&](const runtime::step_sequence& s) -> std::string {
    if (s.verify > static_cast<std::uint32_t>(kernels::swa_rollback_tokens))
      return "verifies " + std::to_string(s.verify) + " drafts; at most "
             + std::to_string(kernels::swa_rollback_tokens) + " can be rolled back";
    for (auto t : s.tokens)
      if (t < 0 || t >= st.vocab)
        return "token " + std::to_string(t) + " is outside the vocabulary of "
               + std::to_string(st.vocab);
    if (s.sample)
      if (auto ok = kernels::validate(to_kernels(s.params)); !ok)
        return ok.error();
    return {};
  };
  return runtime::validate_step(step, true, held, extra);
}

/// Fills in what a `feed_drawn` row leaves to the device (runtime::step_sequence::feed_drawn):
/// the last token drawn for the sequence, the drafts proposed after it that the row verifies,
/// and the position its cache holds. The reason it cannot, or an empty string.
std::string resolve_fed(const cpu_device_state& st, runtime::step_sequence& s) {
  auto d = st.drawn.find(s.sequence);
  if (d == st.drawn.end())
    return "feed_drawn, but no token was drawn for it";
  if (s.verify > d->second.drafts.size())
    return "feed_drawn verifies " + std::to_string(s.verify) + " drafts, but "
           + std::to_string(d->second.drafts.size()) + " were proposed";
  if (s.count != 1 + s.verify || s.tokens.size() != s.count)
    return "feed_drawn with " + std::to_string(s.count) + " new tokens and "
           + std::to_string(s.tokens.size()) + " ids: expected the drawn token and the "
           + std::to_string(s.verify) + " drafts verified";
  s.tokens[0] = d->second.token;
  std::copy_n(d->second.drafts.begin(), s.verify, s.tokens.begin() + 1);
  auto len = st.backend->length(st.sequences.at(s.sequence));
  s.position = len ? static_cast<std::uint64_t>(*len) : 0;
  return {};
}

/// Closes the port's sequence `seq` if the device holds it.
void release(cpu_device_state& st, std::uint64_t seq) {
  auto i = st.sequences.find(seq);
  if (i == st.sequences.end())
    return;
  (void) st.backend->close_sequence(i->second);
  st.sequences.erase(i);
  st.drawn.erase(seq);
  st.boundary.erase(seq);
  st.kept_by_sequence.erase(seq);
}

/// Adds the router counts since the last report to the expert link.
void report_expert_counts(cpu_device_state& st) {
  auto counts = st.backend->expert_counts();
  st.reported.resize(counts.size(), 0);
  auto delta = counts;
  for (std::size_t e = 0; e < delta.size(); ++e) {
    delta[e] -= st.reported[e];
    if (e < st.expert_tokens.size() && delta[e] > 0)
      st.expert_tokens[e]->inc(static_cast<double>(delta[e]));
  }
  st.experts->add(delta);
  st.reported = std::move(counts);
}

/// At a step boundary: reports the counts so far and switches to the balancer's newest
/// placement.
void switch_expert_placement(cpu_device_state& st) {
  report_expert_counts(st);
  auto next = st.experts->newer_than(st.placement_seen);
  if (!next)
    return;
  inc(st.backend->set_expert_placement(std::move(*next)).ok()
        ? st.metrics.placements_applied
        : st.metrics.placements_refused);
}

/// Sets sequence `seq`'s State and SWA KV aside when its cache ends at a block boundary
/// (step_sequence::keep); nothing when it does not, or when copying fails.
void set_boundary_aside(cpu_device_state& st, std::uint64_t seq) {
  auto i = st.sequences.find(seq);
  if (i == st.sequences.end())
    return;
  auto& be = *st.backend;
  auto length = be.length(i->second);
  if (!length || *length == 0 || *length % kernels::kv_block_tokens != 0)
    return;
  auto state = be.export_state(i->second);
  auto swa = be.export_swa(i->second);
  if (!state || !swa)
    return;
  st.boundary[seq] = {static_cast<std::uint64_t>(*length), std::move(*state), std::move(*swa)};
}

caf::result<runtime::device_result> run_step(self_ptr self, runtime::device_step& step) {
  auto& st = self->state;
  if (st.load_error)
    return st.load_error;
  if (st.experts)
    switch_expert_placement(st);
  runtime::device_result out;
  out.id = step.id;
  out.started = self->clock().now();
  for (auto& s : step.batch)
    if (s.feed_drawn)
      if (auto why = resolve_fed(st, s); !why.empty())
        return make_error(device_errc::invalid_step, "step " + std::to_string(step.id)
                                                       + ", sequence "
                                                       + std::to_string(s.sequence) + ": " + why);
  if (auto err = validate(st, step))
    return err;
  // A keeping sequence's step never crosses a block boundary: drafts beyond the next one are
  // not verified this step, so that its steps end on every boundary (step_sequence::keep).
  if (st.keep_limit > 0)
    for (auto& s : step.batch)
      if (s.keep && s.verify > 0) {
        constexpr auto block = static_cast<std::uint64_t>(kernels::kv_block_tokens);
        const auto boundary = (s.position / block + 1) * block;
        if (s.position + s.count > boundary) {
          const auto cut = static_cast<std::uint32_t>(s.position + s.count - boundary);
          s.count -= cut;
          s.verify -= cut;
          s.tokens.resize(s.count);
        }
      }
  // Every sequence's tokens as the backend takes them; sequences seen for the first time are
  // opened (and closed again should the step fail).
  std::vector<std::vector<std::int64_t>> tokens(step.batch.size());
  std::vector<kernels::step_input> inputs;
  std::vector<std::uint64_t> opened;
  for (std::size_t i = 0; i < step.batch.size(); ++i) {
    const auto& s = step.batch[i];
    tokens[i].assign(s.tokens.begin(), s.tokens.end());
    auto [it, fresh] = st.sequences.try_emplace(s.sequence, 0);
    if (fresh) {
      it->second = st.backend->open_sequence();
      opened.push_back(s.sequence);
    }
    inputs.push_back({it->second, tokens[i]});
  }
  // Logits for each sequence's last token, or for a verifying one's last 1 + verify tokens
  // (the token before its drafts and every draft); DSpark features when a sequence asks for
  // drafts and the model can make them.
  std::vector<std::int64_t> rows;
  bool propose = false;
  for (const auto& s : step.batch) {
    rows.push_back(s.sample ? 1 + static_cast<std::int64_t>(s.verify) : 1);
    propose = propose || s.propose;
  }
  propose = propose && st.backend->has_draft();
  std::vector<float> features;
  auto logits = inputs.empty() ? kernels::result<std::vector<float>>(std::vector<float>{})
                               : st.backend->step_tail(inputs, rows, propose ? &features : nullptr);
  if (!logits) {
    for (auto seq : opened)
      release(st, seq);
    return make_error(device_errc::compute_failed, logits.error());
  }
  // The caches advanced: a failure from here on leaves them ahead of what the callers know, so
  // it drops the batch's sequences.
  auto fail = [&](std::uint64_t sequence, const std::string& why) {
    for (const auto& b : step.batch)
      release(st, b.sequence);
    return make_error(device_errc::compute_failed,
                      "sequence " + std::to_string(sequence) + ": " + why);
  };
  const auto vocab = static_cast<std::size_t>(st.vocab);
  std::uint64_t total_tokens = 0;
  for (const auto& s : step.batch)
    total_tokens += s.count;
  const std::size_t width = total_tokens > 0 ? features.size() / total_tokens : 0;
  std::vector<kernels::draft_request> drafts;
  std::size_t row = 0;        // the sequence's first row of logits
  std::uint64_t first = 0;    // the sequence's first token in the step (features' row)
  for (std::size_t i = 0; i < step.batch.size(); ++i) {
    const auto& s = step.batch[i];
    const auto at = row;
    row += static_cast<std::size_t>(rows[i]);
    const auto token_at = first;
    first += s.count;
    if (!s.sample) {
      // A prefill chunk short of the prompt's end: its features only extend the draft
      // context (so that a hand-off carries the prompt's).
      if (propose && s.propose)
        drafts.push_back({st.sequences.at(s.sequence), static_cast<std::int64_t>(s.position),
                          std::span<const float>(features).subspan(token_at * width,
                                                                   s.count * width),
                          -1});
      continue;
    }
    // Draw the token after the last non-draft token, then, while each draw equals the next
    // draft, the token after that draft: with counter-based draws (a draw depends on the
    // request's seed and the position only) the tokens are exactly those a step without
    // drafts would have drawn, greedy or sampled.
    std::uint32_t accepted = 0;
    std::int32_t last = 0;
    for (std::uint32_t j = 0; j <= s.verify; ++j) {
      const auto raw = std::span<const float>(*logits).subspan((at + j) * vocab, vocab);
      auto use = raw;
      const std::uint64_t position = s.position + s.count - s.verify + j;
      if (st.constraints) {  // structured output: disallowed ids get -inf (never drawn)
        st.mask.assign((vocab + 31) / 32, 0u);
        if (st.constraints->allowed(s.sequence, position, st.mask)) {
          st.masked.assign(use.begin(), use.end());
          for (std::size_t id = 0; id < vocab; ++id)
            if (!((st.mask[id >> 5] >> (id & 31)) & 1u))
              st.masked[id] = -INFINITY;
          use = st.masked;
        }
      }
      auto token = kernels::sample_token(use, to_kernels(s.params), position);
      if (!token)
        return fail(s.sequence, token.error());
      last = static_cast<std::int32_t>(*token);
      if (st.constraints)
        st.constraints->accepted(s.sequence, position, last);
      runtime::sampled_token t;
      t.sequence = s.sequence;
      t.token = last;
      if (s.params.top_logprobs >= 0)
        add_logprobs(raw, s.params.top_logprobs, t);
      out.sampled.push_back(std::move(t));
      if (j == s.verify || last != s.tokens[s.count - s.verify + j])
        break;
      ++accepted;
    }
    inc(st.metrics.drafts_verified, static_cast<double>(s.verify));
    inc(st.metrics.drafts_accepted, static_cast<double>(accepted));
    const auto rejected = s.verify - accepted;
    if (rejected > 0)
      if (auto ok = st.backend->rollback(st.sequences.at(s.sequence), rejected); !ok)
        return fail(s.sequence, ok.error());
    auto& drew = st.drawn[s.sequence];
    drew.token = last;
    drew.drafts.clear();
    if (propose && s.propose) {
      const auto kept = s.count - rejected;
      drafts.push_back({st.sequences.at(s.sequence), static_cast<std::int64_t>(s.position),
                        std::span<const float>(features).subspan(token_at * width, kept * width),
                        last});
    }
  }
  if (!drafts.empty()) {
    auto made = st.backend->draft(drafts);
    if (!made)
      return fail(step.batch.front().sequence, made.error());
    const auto drafted = static_cast<std::size_t>(
      std::count_if(drafts.begin(), drafts.end(), [](const auto& d) { return d.anchor >= 0; }));
    const auto block = drafted > 0 ? made->tokens.size() / drafted : 0;
    // No more than a verify step can roll back.
    const auto n = std::min<std::size_t>(block, kernels::swa_rollback_tokens);
    std::size_t d = 0;
    for (const auto& s : step.batch) {
      if (!s.sample || !s.propose)
        continue;
      runtime::draft_proposal p;
      p.sequence = s.sequence;
      for (std::size_t k = 0; k < n; ++k) {
        p.tokens.push_back(static_cast<std::int32_t>(made->tokens[d * block + k]));
        p.confidences.push_back(made->confidences[d * block + k]);
      }
      inc(st.metrics.drafts_proposed, static_cast<double>(n));
      st.drawn[s.sequence].drafts = p.tokens;
      out.drafts.push_back(std::move(p));
      ++d;
    }
  }
  // Decode sequences that keep prefixes: the state at a block boundary a step ends on is set
  // aside for the kv_keep that follows once the engine knows the block's key.
  if (st.keep_limit > 0)
    for (const auto& s : step.batch)
      if (s.keep)
        set_boundary_aside(st, s.sequence);
  out.finished = self->clock().now();
  if (st.experts)
    report_expert_counts(st);
  const auto evictions = st.backend->evictions();
  inc(st.metrics.evictions, static_cast<double>(evictions - st.evictions_counted));
  st.evictions_counted = evictions;
  inc(step.phase == runtime::step_phase::decode ? st.metrics.decode_tokens
                                                : st.metrics.prefill_tokens,
      static_cast<double>(step.tokens));
  update_gauges(st);
  return out;
}

runtime::kv_bytes checksummed(std::string bytes) {
  runtime::kv_bytes b;
  b.checksum = XXH3_64bits(bytes.data(), bytes.size());
  b.bytes = std::move(bytes);
  return b;
}

bool intact(const runtime::kv_bytes& b) {
  return XXH3_64bits(b.bytes.data(), b.bytes.size()) == b.checksum;
}

caf::result<runtime::kv_snapshot_ptr> run_export(cpu_device_state& st,
                                                 const runtime::kv_export& x) {
  const auto seq = x.sequence;
  if (st.load_error)
    return st.load_error;
  auto i = st.sequences.find(seq);
  if (i == st.sequences.end())
    return make_error(device_errc::unknown_sequence,
                      "kv_export: no sequence " + std::to_string(seq));
  auto& be = *st.backend;
  const auto id = i->second;
  auto fail = [&](const std::string& why) {
    return make_error(device_errc::compute_failed,
                      "kv_export of sequence " + std::to_string(seq) + ": " + why);
  };
  auto snap = std::make_shared<runtime::kv_snapshot>();
  snap->model = st.model_id;
  auto length = be.length(id);
  auto blocks = be.full_blocks(id);
  if (!length)
    return fail(length.error());
  if (!blocks)
    return fail(blocks.error());
  snap->length = static_cast<std::uint64_t>(*length);
  for (auto b = static_cast<std::int64_t>(x.first_block); b < *blocks; ++b) {
    auto bytes = be.export_block(id, b);
    if (!bytes)
      return fail(bytes.error());
    snap->blocks.push_back(checksummed(std::move(*bytes)));
  }
  if (x.blocks_only)
    return runtime::kv_snapshot_ptr{std::move(snap)};
  auto state = be.export_state(id);
  auto swa = be.export_swa(id);
  if (!state)
    return fail(state.error());
  if (!swa)
    return fail(swa.error());
  snap->state = checksummed(std::move(*state));
  snap->swa = checksummed(std::move(*swa));
  auto draft = be.export_draft(id);
  if (!draft)
    return fail(draft.error());
  if (!draft->empty())
    snap->draft = checksummed(std::move(*draft));
  return runtime::kv_snapshot_ptr{std::move(snap)};
}

caf::result<caf::ok_atom> run_import(cpu_device_state& st, const runtime::kv_import& x) {
  if (st.load_error)
    return st.load_error;
  auto reject = [&](const std::string& why) {
    return make_error(device_errc::snapshot_rejected,
                      "kv_import of sequence " + std::to_string(x.sequence) + ": " + why);
  };
  const auto* snap = x.snapshot.get();
  if (snap == nullptr)
    return reject("no snapshot");
  if (snap->model != st.model_id)
    return reject("a snapshot of model " + snap->model + ", this device runs " + st.model_id);
  if (st.sequences.count(x.sequence) != 0)
    return reject("the device already holds the sequence");
  auto mismatch = [&](const std::string& what) {
    inc(st.metrics.checksum_failures);
    return reject(what + ": checksum mismatch");
  };
  for (std::size_t b = 0; b < snap->blocks.size(); ++b)
    if (!intact(snap->blocks[b]))
      return mismatch("block " + std::to_string(b));
  if (!intact(snap->state))
    return mismatch("State KV");
  if (!intact(snap->swa))
    return mismatch("SWA KV");
  if (!snap->draft.bytes.empty() && !intact(snap->draft))
    return mismatch("draft context");
  auto& be = *st.backend;
  const auto id = be.open_sequence();
  auto fail = [&](const std::string& why) {
    (void) be.close_sequence(id);
    return reject(why);
  };
  for (std::size_t b = 0; b < snap->blocks.size(); ++b)
    if (auto ok = be.import_block(id, static_cast<std::int64_t>(b), snap->blocks[b].bytes); !ok)
      return fail(ok.error());
  if (auto ok = be.import_state(id, snap->state.bytes); !ok)
    return fail(ok.error());
  if (auto ok = be.import_swa(id, snap->swa.bytes); !ok)
    return fail(ok.error());
  if (!snap->draft.bytes.empty())
    if (auto ok = be.import_draft(id, snap->draft.bytes); !ok)
      return fail(ok.error());
  auto length = be.length(id);
  if (!length || static_cast<std::uint64_t>(*length) != snap->length)
    return fail("the restored cache holds "
                + (length ? std::to_string(*length) : length.error()) + " tokens, the snapshot "
                + std::to_string(snap->length));
  st.sequences.emplace(x.sequence, id);
  update_gauges(st);
  return caf::ok_atom::value;
}

/// Drops kept state `i`.
void drop_kept(cpu_device_state& st, std::map<runtime::store_key, kept_state>::iterator i) {
  st.kept_bytes -= i->second.state.size() + i->second.swa.size();
  st.recency.erase(i->second.recency);
  st.kept.erase(i);
}

/// Drops the least recently used kept states until the rest fit the limit.
void trim_kept(cpu_device_state& st) {
  while (st.kept_bytes > st.keep_limit && !st.recency.empty())
    drop_kept(st, st.kept.find(st.recency.back()));
}

void run_keep(cpu_device_state& st, const runtime::kv_keep& x) {
  if (st.load_error || st.keep_limit == 0 || x.length == 0
      || x.length % kernels::kv_block_tokens != 0)
    return;
  auto i = st.sequences.find(x.sequence);
  if (i == st.sequences.end())
    return;
  auto& be = *st.backend;
  std::string state;
  std::string swa;
  if (auto b = st.boundary.find(x.sequence);
      b != st.boundary.end() && b->second.length == x.length) {
    state = std::move(b->second.state);
    swa = std::move(b->second.swa);
    st.boundary.erase(b);
  } else if (auto length = be.length(i->second);
             length && static_cast<std::uint64_t>(*length) == x.length) {
    auto s = be.export_state(i->second);
    auto w = be.export_swa(i->second);
    if (!s || !w)
      return;
    state = std::move(*s);
    swa = std::move(*w);
  } else {
    return;  // neither set aside at that length nor at it now
  }
  if (auto old = st.kept.find(x.key); old != st.kept.end())
    drop_kept(st, old);
  // The sequence's earlier copy (an earlier boundary of the same reply) gives way.
  if (auto prev = st.kept_by_sequence.find(x.sequence); prev != st.kept_by_sequence.end())
    if (auto old = st.kept.find(prev->second);
        old != st.kept.end() && old->second.sequence == x.sequence)
      drop_kept(st, old);
  st.kept_by_sequence[x.sequence] = x.key;
  st.recency.push_front(x.key);
  st.kept_bytes += state.size() + swa.size();
  st.kept.emplace(x.key, kept_state{x.length, x.sequence, std::move(state), std::move(swa),
                                    st.recency.begin()});
  trim_kept(st);
  update_gauges(st);
}

caf::result<runtime::kv_snapshot_ptr> run_kept_export(cpu_device_state& st,
                                                      const runtime::kv_kept_export& x) {
  if (st.load_error)
    return st.load_error;
  auto k = st.kept.find(x.key);
  if (k == st.kept.end() || k->second.length != x.length)
    return make_error(device_errc::unknown_sequence,
                      "kv_kept_export: no copy kept under that key at "
                        + std::to_string(x.length) + " tokens");
  st.recency.splice(st.recency.begin(), st.recency, k->second.recency);
  auto snap = std::make_shared<runtime::kv_snapshot>();
  snap->model = st.model_id;
  snap->length = k->second.length;
  snap->state = checksummed(k->second.state);
  snap->swa = checksummed(k->second.swa);
  return runtime::kv_snapshot_ptr{std::move(snap)};
}

caf::result<runtime::kv_restored> run_restore(cpu_device_state& st,
                                              const runtime::kv_restore& x) {
  if (st.load_error)
    return st.load_error;
  auto reject = [&](const std::string& why) {
    inc(st.metrics.restore_rejected);
    return make_error(device_errc::snapshot_rejected,
                      "kv_restore of sequence " + std::to_string(x.sequence) + ": " + why);
  };
  const auto* snap = x.blocks.get();
  if (snap == nullptr || snap->blocks.empty())
    return reject("no blocks");
  const auto n = snap->blocks.size();
  const auto length = static_cast<std::uint64_t>(kernels::kv_block_tokens) * n;
  if (snap->length != length || x.tokens.size() != length)
    return reject(std::to_string(n) + " blocks hold " + std::to_string(length) + " tokens, not "
                  + std::to_string(snap->length) + " (length) or "
                  + std::to_string(x.tokens.size()) + " (tokens)");
  for (auto t : x.tokens)
    if (t < 0 || t >= st.vocab)
      return reject("token " + std::to_string(t) + " is outside the vocabulary");
  if (st.sequences.count(x.sequence) != 0)
    return reject("the device already holds the sequence");
  for (std::size_t b = 0; b < n; ++b)
    if (!intact(snap->blocks[b])) {
      inc(st.metrics.checksum_failures);
      return reject("block " + std::to_string(b) + ": checksum mismatch");
    }
  auto& be = *st.backend;
  const auto id = be.open_sequence();
  auto fail = [&](const std::string& why) {
    (void) be.close_sequence(id);
    return reject(why);
  };
  for (std::size_t b = 0; b < n; ++b)
    if (auto ok = be.import_block(id, static_cast<std::int64_t>(b), snap->blocks[b].bytes); !ok)
      return fail("block " + std::to_string(b) + ": " + ok.error());
  // The exact state when a copy was kept at this boundary; bounded replay otherwise.
  bool exact = false;
  if (auto k = st.kept.find(x.key); k != st.kept.end() && k->second.length == length) {
    exact = static_cast<bool>(be.import_state(id, k->second.state))
            && static_cast<bool>(be.import_swa(id, k->second.swa));
    if (exact) {
      st.recency.splice(st.recency.begin(), st.recency, k->second.recency);
    } else {
      // A copy that does not fit the blocks (it cannot, for a key of the same content):
      // start again from the blocks alone.
      (void) be.close_sequence(id);
      drop_kept(st, k);
      return run_restore(st, x);
    }
  }
  // Else the copy another device kept there, when it is this model's at this length, intact.
  bool pulled = false;
  if (const auto* c = x.kept.get(); !exact && c != nullptr && c->model == st.model_id
                                      && c->length == length && c->blocks.empty()) {
    if (!intact(c->state) || !intact(c->swa)) {
      inc(st.metrics.checksum_failures);
    } else if (be.import_state(id, c->state.bytes) && be.import_swa(id, c->swa.bytes)) {
      exact = pulled = true;
    } else {
      // Half imported: start again from the blocks, without it.
      (void) be.close_sequence(id);
      auto without = x;
      without.kept = nullptr;
      return run_restore(st, without);
    }
  }
  if (!exact) {
    std::vector<std::int64_t> tokens(x.tokens.begin(), x.tokens.end());
    if (auto r = be.replay(id, tokens); !r)
      return fail("bounded replay: " + r.error());
  }
  auto held = be.length(id);
  if (!held || static_cast<std::uint64_t>(*held) != length)
    return fail("the restored cache holds "
                + (held ? std::to_string(*held) : held.error()) + " tokens, not "
                + std::to_string(length));
  st.sequences.emplace(x.sequence, id);
  inc(pulled  ? st.metrics.restored_pulled
      : exact ? st.metrics.restored_exact
              : st.metrics.restored_replayed);
  update_gauges(st);
  return runtime::kv_restored{length, !exact, pulled};
}

/// Runs `f`, turning an exception (out of memory in the kernels, say) into an error value.
template <class F>
auto guarded(F f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return make_error(device_errc::compute_failed, e.what());
  } catch (...) {
    return make_error(device_errc::compute_failed, "unknown exception");
  }
}

/// A device whose backend can serve nothing more (kernels::model_backend::broken) stops with
/// that reason once it has answered, so that the ranks watching it take its instance down and
/// the instance re-forms.
/// Reports the ranks of the rank processes a signal ended (on_ranks_lost); returns whether any
/// did.
bool report_lost_ranks(cpu_device_state& st) {
  if (st.peers.empty())
    return false;
  const auto lost = st.peers.killed_ranks(std::chrono::milliseconds(500));
  if (lost > 0 && st.on_ranks_lost)
    st.on_ranks_lost(lost);
  return lost > 0;
}

/// Stops the device when its backend can serve nothing more (an EP group whose rank failed),
/// after it told which ranks went with a rank process that died: its instance re-forms.
void stop_if_broken(self_ptr self) {
  if (!self->state.backend)
    return;
  auto why = self->state.backend->broken();
  if (why.empty())
    return;
  report_lost_ranks(self->state);
  self->quit(make_error(device_errc::compute_failed, why));
}

runtime::device_port::behavior_type cpu_device_fn(self_ptr self,
                                                  std::shared_ptr<cpu_device_params> params) {
  self->state.keep_limit = params->keep_bytes;
  self->state.on_ranks_lost = params->on_ranks_lost;
  self->state.constraints = params->constraints;
  self->state.experts = params->experts;
  self->state.metrics = register_metrics(params->metrics, params->name);
  if (params->experts && params->metrics != nullptr)
    for (std::size_t e = 0; e < params->experts->totals().size(); ++e)
      if (auto* c = runtime::counter_child(
            params->metrics, "troupe_device_expert_tokens_total",
            "Tokens the router sent to each routed expert, summed over the main layers' MoEs "
            "(serve --eplb): the load the expert balancer places by.",
            {"device", "expert"}, {params->name, std::to_string(e)}))
        self->state.expert_tokens.push_back(c);
  // The detached actor's first act, on its own thread: load the model.
  try {
    load(self->state, *params);
  } catch (const std::exception& e) {
    self->state.load_error = make_error(device_errc::load_failed, e.what());
  }
  params.reset();
  // A rank process that died while the group loaded: a load failure that re-forming cures.
  if (self->state.load_error && report_lost_ranks(self->state))
    self->quit(self->state.load_error);
  // One that dies while the group waits for work: the device stops without waiting for its
  // next step to find out, and the instance re-forms on the ranks left.
  if (!self->state.load_error && !self->state.peers.empty())
    self->state.peers.watch([lost = self->state.on_ranks_lost,
                             me = caf::actor_cast<caf::actor_addr>(self)](std::uint32_t ranks,
                                                                           const std::string& why) {
      if (lost)
        lost(ranks);
      if (auto device = caf::actor_cast<caf::actor>(me))
        caf::anon_send(device, caf::exit_msg{device.address(),
                                             make_error(device_errc::compute_failed,
                                                        "the EP group lost ranks: " + why)});
    });
  return {
    [self](runtime::device_step& step) {
      auto r = guarded([&] { return run_step(self, step); });
      stop_if_broken(self);
      return r;
    },
    [self](const runtime::device_release& r) {
      if (self->state.load_error)
        return;
      try {
        release(self->state, r.sequence);
        update_gauges(self->state);
      } catch (...) {
      }
    },
    [self](const runtime::kv_export& x) {
      return guarded([&] { return run_export(self->state, x); });
    },
    [self](const runtime::kv_import& x) {
      auto r = guarded([&] { return run_import(self->state, x); });
      inc(r.flag == caf::rt_error ? self->state.metrics.import_refused : self->state.metrics.imported);
      stop_if_broken(self);
      return r;
    },
    [self](const runtime::kv_keep& x) {
      try {
        run_keep(self->state, x);
      } catch (...) {
        // Out of memory while copying: nothing kept; a later restore replays.
      }
    },
    [self](const runtime::kv_kept_export& x) {
      return guarded([&] { return run_kept_export(self->state, x); });
    },
    [self](const runtime::kv_restore& x) {
      auto r = guarded([&] { return run_restore(self->state, x); });
      stop_if_broken(self);
      return r;
    },
  };
}

} // namespace

void step_profile::set(points p) {
  std::lock_guard lock{mutex_};
  points_ = std::move(p);
}

step_profile::points step_profile::get() const {
  std::lock_guard lock{mutex_};
  return points_;
}

double step_profile::seconds(std::uint64_t tokens) const {
  std::lock_guard lock{mutex_};
  if (points_.empty())
    return 0.0;
  if (points_.size() == 1)
    return points_.front().second;
  std::size_t hi = 1;
  while (hi + 1 < points_.size() && points_[hi].first < tokens)
    ++hi;
  const auto [x0, y0] = points_[hi - 1];
  const auto [x1, y1] = points_[hi];
  const double t = (static_cast<double>(tokens) - static_cast<double>(x0))
                   / (static_cast<double>(x1) - static_cast<double>(x0));
  const double low = std::min_element(points_.begin(), points_.end(), [](auto a, auto b) {
                       return a.second < b.second;
                     })->second;
  return std::max(low, y0 + t * (y1 - y0));
}

expert_link::expert_link(std::size_t experts) : totals_(experts, 0) {}

void expert_link::add(const std::vector<std::uint64_t>& routed) {
  std::lock_guard lock{mutex_};
  for (std::size_t e = 0; e < std::min(routed.size(), totals_.size()); ++e)
    totals_[e] += routed[e];
}

std::vector<std::uint64_t> expert_link::totals() const {
  std::lock_guard lock{mutex_};
  return totals_;
}

void expert_link::propose(kernels::expert_placement placement) {
  std::lock_guard lock{mutex_};
  placement_ = std::move(placement);
  ++version_;
}

std::optional<kernels::expert_placement> expert_link::newer_than(std::uint64_t& seen) const {
  std::lock_guard lock{mutex_};
  if (version_ == seen)
    return std::nullopt;
  seen = version_;
  return placement_;
}

runtime::device_port spawn_cpu_device(caf::actor_system& sys, cpu_device_params params) {
  return sys.spawn<caf::detached>(cpu_device_fn,
                                  std::make_shared<cpu_device_params>(std::move(params)));
}

kernels::result<std::string> model_fingerprint(const std::filesystem::path& dir) {
  using fail = kernels::result<std::string>;
  std::ifstream f(dir / "config.json", std::ios::binary);
  if (!f)
    return fail::failure((dir / "config.json").string() + ": cannot be read");
  const std::string config{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  auto cfg = kernels::parse_model_config(config, (dir / "config.json").string());
  if (!cfg)
    return fail::failure(cfg.error());
  auto ck = kernels::checkpoint::open(dir);
  if (!ck)
    return fail::failure(ck.error());
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> h{XXH3_createState(), XXH3_freeState};
  XXH3_64bits_reset(h.get());
  XXH3_64bits_update(h.get(), config.data(), config.size());
  for (const auto& name : ck->names()) {
    auto t = ck->get(name);
    if (!t)
      return fail::failure(t.error());
    XXH3_64bits_update(h.get(), name.data(), name.size() + 1); // with its terminator
    const auto type = kernels::dtype_name(t->type());
    XXH3_64bits_update(h.get(), type.data(), type.size());
    const auto& shape = t->shape();
    XXH3_64bits_update(h.get(), shape.data(), shape.size() * sizeof(std::int64_t));
    hash_sampled(h.get(), t->bytes);
  }
  return cfg->model_type + ":" + hex64(XXH3_64bits_digest(h.get()));
}

} // namespace troupe::ports
