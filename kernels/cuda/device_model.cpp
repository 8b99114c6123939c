// The forward pass on the device (kernels/cuda/device_model.hpp). Each step mirrors a line of
// kernels/model.cpp's `run`, `engram_site`, `attention_site` and `moe_site`; the comments name
// what differs.
#include "kernels/cuda/device_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "kernels/cpu_ops.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/cuda/paging.hpp"
#include "kernels/ep_dispatch.hpp"
#include "kernels/kv_blocks.hpp"
#include "kernels/kv_cache.hpp"
#include "kernels/model_weights.hpp"

namespace troupe::kernels::cuda {

namespace {

using i64 = std::int64_t;
using buffer = device_array<float>;
using index_buffer = device_array<i64>;

std::size_t sz(i64 v) { return static_cast<std::size_t>(v); }

struct device_expert {
  buffer w1, w2, w3;
};

struct device_layer {
  buffer wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink;
  buffer hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  buffer attn_norm, ffn_norm, gate, gate_bias;
  std::vector<device_expert> experts;
  device_expert shared;
  buffer rings;  // [max_sequences, capacity, head_dim]: each sequence's SWA ring at its slot
  // Engram layers: the key / value projection and the per-channel key weights q ⊙ k.
  buffer engram_wkv, engram_weight;
  // CSA2: the compressor (KV sources), the indexer (index sources; wk / k_norm: key owners).
  buffer c_wkv, c_wgate, c_norm, i_wq_b, i_weights, i_wk, i_k_norm;
  // In pages (kernels/cuda/paging.hpp), page_tokens / ratio rows each: a KV source's compressed
  // KV [*, head_dim] and, when it owns them, its indexer keys [*, index_head_dim]. Per sequence
  // slot, when ratio > 1: the projected rows of its last recent_rows(ratio) positions, the row
  // of position p at p mod recent_rows: the unfinished group's, and those a rollback rebuilds it
  // from [recent_rows per slot, head_dim].
  buffer compressed, index_keys, recent_kv, recent_gate;
};

// Rows of a KV source's recent store per slot: the unfinished group (< ratio rows) after a
// rollback of up to swa_rollback_tokens, as the CPU cache's recent rows.
i64 recent_rows(i64 ratio) { return ratio + swa_rollback_tokens; }

// A sequence's place in the rings and how far it has run.
struct sequence_state {
  i64 slot = 0;
  i64 length = 0;                  // tokens run = the ring's end
  std::vector<i64> engram_recent;  // its last compressed ids (engram_remember)
  std::vector<i64> pages;          // its compressed KV's pages, in context order
  // Per layer: no window row before ring_first (a cache imported after a bounded replay or an
  // encoder–decoder prefill), compressed groups held, the unfinished group's rows.
  std::vector<i64> ring_first, groups, pending;
  i64 rollback_floor = 0;  // a rollback cannot go below it (kernels::rollback's rule)
  // Its DSpark draft context (the draft stages' rings at its slot): whether it has one, and the
  // positions it holds, as a draft_state's rings (no row before draft_first).
  bool drafting = false;
  i64 draft_first = 0, draft_end = 0;
};

// One draft call's blocks: per block token its own position, the block's last, its sequence's
// slot, the block's first position and first row; per slot the oldest context row held.
struct draft_call {
  i64 T = 0;
  device_array<i64> d_positions, d_last, d_slots, d_start, d_row, d_ring_begin;
};

// One forward call: its sequences' token ranges and the indexer's state the CPU model keeps in
// its per-call `shared` dict, for every sequence at once.
struct call_state {
  i64 T = 0;
  std::vector<i64> begin;       // sequence b owns call rows [begin[b], begin[b + 1])
  std::vector<sequence_state*> seqs;
  std::vector<i64> positions;   // per row
  device_array<i64> d_positions, d_slots, d_start, d_row, d_ring_begin, d_ring_src, d_ring_dst;
  // The page ids of every sequence of the call, one after another, and per row where its
  // sequence's begin.
  device_array<i64> d_pages, d_pages_at;
  i64 ring_rows = 0;
  // The last KV source and key owner run in this call (-1: none yet), each sequence's
  // selected compressed entries [T, index_topk] (its group numbers) and count [T] (0 until an
  // index source selects), and its candidate blocks [T, candidate_topk_blocks] and count.
  i64 compress_src = -1, index_src = -1;
  device_array<i64> topk, topk_n, kept, kept_n;
  std::vector<bool> has_candidates;
};

// A failure passed on as the failure of whatever result the caller returns.
struct failed {
  std::string error;
  template <class T>
  operator result<T>() const {
    return result<T>::failure(error);
  }
};

// Returns the failure of `expr` (any result) from the enclosing function.
#define TROUPE_TRY(expr)                                        \
  do {                                                          \
    if (auto&& troupe_try_ = (expr); !troupe_try_)              \
      return failed{troupe_try_.error()};                       \
  } while (false)

// The mHC streams of T tokens [T, hc, hidden] and what one site needs: the mix the next site
// collapses by (`pre`, stream 0's at first), the site's input x and output out [T, hidden].
struct attention_buffers {
  buffer q_res, q, kv, attn, grouped;

  // An attention site's buffers for T tokens: q_res [T, q_lora_rank], q and attn [T, heads,
  // head_dim], kv [T, head_dim], grouped [T, o_groups · o_lora_rank].
  static result<attention_buffers> make(const text_config& c, i64 T) {
    const i64 qh = c.num_attention_heads * c.head_dim;
    const i64 sizes[] = {c.q_lora_rank, qh, c.head_dim, qh, c.o_groups * c.o_lora_rank};
    attention_buffers a;
    buffer* into[] = {&a.q_res, &a.q, &a.kv, &a.attn, &a.grouped};
    for (std::size_t i = 0; i < 5; ++i) {
      auto b = buffer::zeros(sz(T * sizes[i]));
      TROUPE_TRY(b);
      *into[i] = std::move(*b);
    }
    return a;
  }
};

struct mhc_streams {
  i64 T = 0;
  buffer streams, expanded, flat, mix, pre, next_pre, post, comb, x, out;

  static result<mhc_streams> make(const text_config& c, i64 T) {
    const i64 hc = c.hc_mult, D = c.hidden_size;
    std::vector<float> first_stream(sz(T * hc), 0.0f);
    for (i64 t = 0; t < T; ++t) first_stream[sz(t * hc)] = 1.0f;
    mhc_streams m;
    m.T = T;
    auto zeros = [](buffer& b, i64 n) -> result<bool> {
      auto z = buffer::zeros(sz(n));
      TROUPE_TRY(z);
      b = std::move(*z);
      return true;
    };
    for (auto* b : {&m.streams, &m.expanded, &m.flat}) TROUPE_TRY(zeros(*b, T * hc * D));
    TROUPE_TRY(zeros(m.mix, T * (2 + hc) * hc));
    for (auto* b : {&m.next_pre, &m.post}) TROUPE_TRY(zeros(*b, T * hc));
    TROUPE_TRY(zeros(m.comb, T * hc * hc));
    for (auto* b : {&m.x, &m.out}) TROUPE_TRY(zeros(*b, T * D));
    auto pre = buffer::of(first_stream);
    TROUPE_TRY(pre);
    m.pre = std::move(*pre);
    return m;
  }
};

}  // namespace

struct device_model::state {
  const model* model_ = nullptr;      // the CPU model uploaded: new caches for export
  const model::weights* W = nullptr;  // its weights: the Engram tables and token map
  text_config c;
  std::int64_t max_sequences = 0, max_context = 0, capacity = 0;  // capacity: a ring's rows
  // The compressed KV's pages: context tokens per page, and the pages no sequence holds (the
  // next one taken from the back).
  std::int64_t page_tokens = 0, pages = 0, page_bytes = 0;
  std::vector<i64> free_pages;
  bool batch_invariant = false;
  lt_gemm gemm;
  buffer embed, norm, lm_head;
  // RoPE of the window layers (rope_main) and of the compressed layers and the indexer
  // (rope_compress).
  struct rope {
    buffer inv_freq;
    float scaling = 1.0f;
    std::int64_t dim = 0;
  } rope_main, rope_compress;
  std::vector<device_layer> layers;
  // The routed experts' placement: every one on one rank, or the expert balancer's (ranks
  // evaluated one after another on this device); and the tokens routed to each expert.
  expert_placement placement;
  std::vector<std::uint64_t> routed;
  std::map<sequence_id, sequence_state> sequences;
  std::vector<bool> slot_used;
  sequence_id next_id = 1;
  // The DSpark draft stages (model.cpp's draft), when the checkpoint has them: their layers
  // (each one's `rings` holds every slot's draft context for that stage), the context's
  // projection and norm, the final norm, and their MoEs' config and one-rank placement.
  struct draft_stages {
    std::vector<device_layer> stages;
    buffer main_proj, main_norm, norm;
    text_config cfg;
    expert_placement placement;
  };
  std::optional<draft_stages> draft;

  explicit state(lt_gemm g) : gemm(std::move(g)) {}

  // Why `need` more pages cannot be had.
  std::string pages_short(i64 need) const {
    return "device_model: " + std::to_string(need) + " more KV pages needed, " +
           std::to_string(free_pages.size()) + " free (pages of " + std::to_string(page_tokens) +
           " tokens)";
  }
  // A page's rows in the compressed stores of KV-source layer l.
  i64 page_rows(std::size_t l) const { return page_tokens / std::max<i64>(1, W->layers[l].ratio); }
  // Pages a sequence of `tokens` tokens holds.
  i64 pages_for(i64 tokens) const { return (tokens + page_tokens - 1) / page_tokens; }
  // Pages a sequence takes from the pool to hold `tokens` tokens.
  i64 pages_to_grow(const sequence_state& seq, i64 tokens) const {
    return std::max<i64>(0, pages_for(tokens) - static_cast<i64>(seq.pages.size()));
  }
  // Gives a sequence the pages it lacks for `tokens` tokens; the caller checked there are.
  void grow(sequence_state& seq, i64 tokens) {
    for (i64 n = pages_to_grow(seq, tokens); n > 0; --n) {
      seq.pages.push_back(free_pages.back());
      free_pages.pop_back();
    }
  }
  // The store row of a sequence's group g in KV-source layer l.
  i64 row_of(const sequence_state& seq, std::size_t l, i64 g) const {
    return paged_row(seq.pages.data(), page_rows(l), g);
  }
  // Groups [first, first + n) of a sequence in a store of layer l, `width` floats a row, into
  // host memory, a page's run of rows at a time.
  result<bool> download_groups(const sequence_state& seq, std::size_t l, const float* store,
                               i64 first, i64 n, i64 width, float* host) const {
    const i64 per = page_rows(l);
    for (i64 g = first; g < first + n;) {
      const i64 run = std::min(first + n - g, per - g % per);
      TROUPE_TRY(copy_to_host(host + (g - first) * width, store + row_of(seq, l, g) * width,
                              sz(run * width) * sizeof(float)));
      g += run;
    }
    return true;
  }

  // y[m, n] (stride ldy) = x[m, k] (stride ldx) · w[n, k]ᵀ.
  result<bool> project(const float* x, i64 m, i64 k, const float* w, i64 n, float* y,
                       i64 ldx = 0, i64 ldy = 0) {
    if (ldx == 0) ldx = k;
    if (ldy == 0) ldy = n;
    if (batch_invariant) return project_rows(x, ldx, w, k, y, ldy, m, n, k);
    return gemm.run_f32(x, ldx, w, k, y, ldy, m, n, k);
  }

  result<bool> mixes(const buffer& streams, i64 T, const buffer& fn, const buffer& scale,
                     const buffer& base, buffer& flat, buffer& mix, buffer& pre, buffer& post,
                     buffer& comb);
  // One mHC site over the streams (model.cpp's run): the mixes of the streams as they are,
  // the collapse by the previous site's mix, the site's norm, run() from m.x into m.out, the
  // expansion back into the streams.
  template <class Run>
  result<bool> site(mhc_streams& m, const buffer& fn, const buffer& scale, const buffer& base,
                    const buffer& site_norm, Run&& run) {
    const i64 T = m.T, hc = c.hc_mult, D = c.hidden_size;
    TROUPE_TRY(mixes(m.streams, T, fn, scale, base, m.flat, m.mix, m.next_pre, m.post, m.comb));
    TROUPE_TRY(hc_collapse(m.streams.data(), m.pre.data(), T, hc, D, m.x.data()));
    TROUPE_TRY(rms_norm(m.x.data(), T, D, site_norm.data(), static_cast<float>(c.rms_norm_eps)));
    TROUPE_TRY(run());
    TROUPE_TRY(hc_expand(m.streams.data(), m.out.data(), m.post.data(), m.comb.data(), T, hc, D,
                         m.expanded.data()));
    std::swap(m.streams, m.expanded);
    std::swap(m.pre, m.next_pre);
    return true;
  }
  // The queries q_res [T, q_lora_rank] and q [T, heads, head_dim] (rotated at each row's
  // position) of a site's normed input a [T, hidden].
  result<bool> queries(const device_layer& L, const float* a, i64 T, const rope& rp,
                       const i64* positions, float* q_res, float* q);
  // The shared K=V rows kv [T, head_dim] of a: projected, normed, rotated, FP8-rounded.
  result<bool> kv_rows(const device_layer& L, const float* a, i64 T, const rope& rp,
                       const i64* positions, float* kv);
  // The attention kernel's arguments of T queries q of a layer, in the prefill form over its
  // rings, into out; the caller adds positions, ring starts, window and the chunk's rows.
  swa_decode_args window_args(const device_layer& L, const rope& rp, const float* q, float* out,
                              i64 T) const {
    swa_decode_args a;
    a.q = q;
    a.rings = L.rings.data();
    a.sinks = L.attn_sink.data();
    a.inv_freq = rp.inv_freq.data();
    a.out = out;
    a.batch = T;
    a.heads = c.num_attention_heads;
    a.head_dim = c.head_dim;
    a.capacity = capacity;
    a.rope_dim = rp.dim;
    a.scaling = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    a.rope_scaling = rp.scaling;
    return a;
  }
  // The grouped output projection of the heads' outputs attn [T, heads · head_dim] into out.
  result<bool> output(const device_layer& L, const float* attn, i64 T, float* grouped,
                      float* out);
  result<bool> attention(std::size_t l, const buffer& a, call_state& call, buffer& out);
  result<bool> compress(std::size_t l, const buffer& a, call_state& call);
  result<bool> select(std::size_t l, const buffer& q_res, const buffer& a, call_state& call);
  // The MoE of a layer whose experts cfg counts, by a placement; counts (null: none) the
  // tokens routed to each expert.
  result<bool> moe(const text_config& cfg, device_layer& L, const expert_placement& by,
                   std::vector<std::uint64_t>* counts, const buffer& a, i64 T, buffer& y);
  result<bool> draft_attention(const device_layer& L, const buffer& a, const draft_call& call,
                               buffer& out);
  result<bool> engram(const loaded::layer_weights& host, const device_layer& L,
                      const std::vector<i64>& hash_ids, i64 T, buffer& streams);
};

device_model::device_model(std::unique_ptr<state> s) : s_(std::move(s)) {}
device_model::device_model(device_model&&) noexcept = default;
device_model& device_model::operator=(device_model&&) noexcept = default;
device_model::~device_model() = default;

result<device_model> device_model::upload(const model& m, const device_model_options& options) {
  using r = result<device_model>;
  const auto& W = m.tensors();
  const auto& c = W.cfg.text;
  if (options.max_sequences < 1)
    return r::failure("device_model: max_sequences must be at least 1, not " +
                      std::to_string(options.max_sequences));
  if (options.max_context < 1)
    return r::failure("device_model: max_context must be at least 1, not " +
                      std::to_string(options.max_context));
  if (options.page_tokens < 1 || options.kv_tokens < 0)
    return r::failure("device_model: pages of " + std::to_string(options.page_tokens) +
                      " tokens, a pool of " + std::to_string(options.kv_tokens) +
                      " tokens: expected at least 1 and 0 (what the memory has room for)");
  if (!(options.memory_fraction > 0 && options.memory_fraction <= 1) || options.work_bytes < 0)
    return r::failure("device_model: a memory fraction of " +
                      std::to_string(options.memory_fraction) + " and " +
                      std::to_string(options.work_bytes) +
                      " bytes for a call's work: expected a fraction in (0, 1] and bytes >= 0");
  for (const auto& L : W.layers)
    if (L.kv_source && L.ratio > 1 && options.page_tokens % L.ratio != 0)
      return r::failure("device_model: pages of " + std::to_string(options.page_tokens) +
                        " tokens do not hold whole groups of the compressor's ratio " +
                        std::to_string(L.ratio));
  const i64 capacity = c.sliding_window + swa_rollback_tokens;
  const bool csa2 = std::any_of(W.layers.begin(), W.layers.end(),
                                [](const auto& L) { return L.ratio != 0; });
  // A DSpark block's tokens see the window and the whole block.
  const i64 keys = std::max({capacity, c.sliding_window + (csa2 ? c.index_topk : 0),
                             W.draft_layers.empty() ? 0 : c.sliding_window + c.dspark_block_size});
  if (keys > swa_max_keys || c.sliding_window < 1)
    return r::failure("device_model: a window of " + std::to_string(c.sliding_window) +
                      " tokens (ring " + std::to_string(capacity) + ", " +
                      std::to_string(csa2 ? c.index_topk : 0) + " selected compressed entries, " +
                      std::to_string(W.draft_layers.empty() ? 0 : c.dspark_block_size) +
                      " draft block tokens) is more than the " +
                      std::to_string(swa_max_keys) + " keys the attention kernel takes");
  // Free memory before anything of this model is on the device: what it takes is its own.
  auto free_before = device_memory();
  if (!free_before) return r::failure("device_model: " + free_before.error());
  auto gemm = lt_gemm::create();
  if (!gemm) return r::failure(gemm.error());
  auto s = std::make_unique<state>(std::move(*gemm));
  s->model_ = &m;
  s->W = &W;
  s->c = c;
  s->max_sequences = options.max_sequences;
  s->max_context = options.max_context;
  s->batch_invariant = options.batch_invariant;
  s->capacity = capacity;
  s->slot_used.assign(sz(options.max_sequences), false);
  s->page_tokens = options.page_tokens;
  auto placement = place_experts(static_cast<std::int32_t>(c.n_routed_experts), 1);
  if (!placement) return r::failure(placement.error());
  s->placement = std::move(*placement);
  s->routed.assign(sz(c.n_routed_experts), 0);

  std::string error;
  auto up = [&](const loaded::matrix& x) {
    if (!error.empty()) return buffer{};
    auto b = buffer::of(x.values());
    if (!b) {
      error = b.error();
      return buffer{};
    }
    return std::move(*b);
  };
  auto up_expert = [&](const loaded::expert_weights& e) {
    return device_expert{up(e.w1), up(e.w2), up(e.w3)};
  };
  s->embed = up(W.embed);
  s->norm = up(W.norm);
  s->lm_head = up(W.lm_head);
  s->rope_main = {up(loaded::matrix{W.rope_main.inv_freq}), W.rope_main.scaling,
                  W.rope_main.rope_dim};
  s->rope_compress = {up(loaded::matrix{W.rope_compress.inv_freq}), W.rope_compress.scaling,
                      W.rope_compress.rope_dim};
  auto zeros = [&](i64 n) {
    if (!error.empty()) return buffer{};
    auto b = buffer::zeros(sz(n));
    if (!b) {
      error = b.error();
      return buffer{};
    }
    return std::move(*b);
  };
  // A store of `rows` rows per sequence slot (the paged stores come once the pool is sized).
  const i64 slots = options.max_sequences;
  auto store = [&](i64 rows, i64 width) { return zeros(slots * rows * width); };
  // What every layer has, backbone or draft stage: the attention, the mHC sites, the MoE, and
  // each sequence slot's window ring.
  auto up_layer = [&](const loaded::layer_weights& L) {
    device_layer d;
    d.wq_a = up(L.wq_a);
    d.q_norm = up(L.q_norm);
    d.wq_b = up(L.wq_b);
    d.wkv = up(L.wkv);
    d.kv_norm = up(L.kv_norm);
    d.wo_a = up(L.wo_a);
    d.wo_b = up(L.wo_b);
    d.attn_sink = up(L.attn_sink);
    d.hc_attn_fn = up(L.hc_attn_fn);
    d.hc_attn_base = up(L.hc_attn_base);
    d.hc_attn_scale = up(L.hc_attn_scale);
    d.hc_ffn_fn = up(L.hc_ffn_fn);
    d.hc_ffn_base = up(L.hc_ffn_base);
    d.hc_ffn_scale = up(L.hc_ffn_scale);
    d.attn_norm = up(L.attn_norm);
    d.ffn_norm = up(L.ffn_norm);
    d.gate = up(L.gate);
    d.gate_bias = up(L.gate_bias);
    for (const auto& e : L.experts) d.experts.push_back(up_expert(e));
    d.shared = up_expert(L.shared);
    d.rings = store(capacity, c.head_dim);
    return d;
  };
  for (const auto& L : W.layers) {
    device_layer d = up_layer(L);
    if (L.engram_index >= 0) {
      std::vector<float> product(L.engram_q.size());
      for (std::size_t i = 0; i < product.size(); ++i)
        product[i] = L.engram_q[i] * L.engram_k[i];
      const loaded::matrix weight{std::move(product)};
      d.engram_wkv = up(L.engram_wkv);
      d.engram_weight = up(weight);
    }
    if (L.kv_source) {
      d.c_wkv = up(L.c_wkv);
      d.c_norm = up(L.c_norm);
      if (L.ratio > 1) {
        d.c_wgate = up(L.c_wgate);
        d.recent_kv = store(recent_rows(L.ratio), c.head_dim);
        d.recent_gate = store(recent_rows(L.ratio), c.head_dim);
      }
    }
    if (L.index_source) {
      d.i_wq_b = up(L.i_wq_b);
      d.i_weights = up(L.i_weights);
    }
    if (L.owns_index_keys) {
      d.i_wk = up(L.i_wk);
      d.i_k_norm = up(L.i_k_norm);
    }
    s->layers.push_back(std::move(d));
  }
  if (!W.draft_layers.empty()) {
    auto draft_placement = place_experts(static_cast<std::int32_t>(W.draft_cfg.n_routed_experts), 1);
    if (!draft_placement) return r::failure(draft_placement.error());
    state::draft_stages d{{}, up(W.main_proj), up(W.main_norm), up(W.draft_norm), W.draft_cfg,
                          std::move(*draft_placement)};
    for (const auto& L : W.draft_layers) d.stages.push_back(up_layer(L));
    s->draft = std::move(d);
  }
  if (!error.empty()) return r::failure("device_model: uploading the weights: " + error);

  // The page pool: kv_tokens, or what the memory left within memory_fraction has room for.
  auto page_floats = [&](const loaded::layer_weights& L, i64 width) {
    return options.page_tokens / std::max<i64>(1, L.ratio) * width;
  };
  for (const auto& L : W.layers)
    s->page_bytes += static_cast<i64>(sizeof(float)) *
                     ((L.kv_source ? page_floats(L, c.head_dim) : 0) +
                      (L.owns_index_keys ? page_floats(L, c.index_head_dim) : 0));
  const i64 most = s->pages_for(options.max_sequences * options.max_context);
  if (options.kv_tokens > 0) {
    s->pages = s->pages_for(options.kv_tokens);
  } else if (s->page_bytes == 0) {
    s->pages = most;  // no layer keeps compressed KV: pages hold nothing
  } else {
    auto mem = device_memory();
    if (!mem) return r::failure("device_model: " + mem.error());
    const auto size_text = [](double b) {  // in GiB, MiB or KiB, whichever reads best
      const char* unit = b >= 0x1p30 ? "GiB" : b >= 0x1p20 ? "MiB" : "KiB";
      const double scale = b >= 0x1p30 ? 0x1p30 : b >= 0x1p20 ? 0x1p20 : 0x1p10;
      char text[32];
      std::snprintf(text, sizeof text, "%.2f %s", b / scale, unit);
      return std::string(text);
    };
    // This model may fill its share of the device (what other processes or models hold is
    // theirs: several may share a GPU, each with its own fraction), within what is free.
    const double share = options.memory_fraction * static_cast<double>(mem->total_bytes);
    const double own = static_cast<double>(free_before->free_bytes - mem->free_bytes);
    const double room = std::min(share - own, static_cast<double>(mem->free_bytes)) -
                        static_cast<double>(options.work_bytes);
    const i64 fit = room > 0 ? static_cast<i64>(room / static_cast<double>(s->page_bytes)) : 0;
    s->pages = std::min(most, fit);
    if (s->pages < s->pages_for(options.max_context)) {
      char share_text[32];
      std::snprintf(share_text, sizeof share_text, "%g", options.memory_fraction);
      return r::failure(
        "device_model: no room for one sequence of " + std::to_string(options.max_context) +
        " tokens: it takes " + std::to_string(s->pages_for(options.max_context)) +
        " KV pages of " + size_text(static_cast<double>(s->page_bytes)) + ", and " +
        std::to_string(fit) + " fit: of " + size_text(share) + " (" + share_text +
        " of the device's " + size_text(static_cast<double>(mem->total_bytes)) +
        ") the weights and rings take " + size_text(own) + ", " +
        size_text(static_cast<double>(mem->free_bytes)) + " is free, and " +
        size_text(static_cast<double>(options.work_bytes)) +
        " is kept for a call's work; lower the context or raise the memory fraction");
    }
  }
  for (std::size_t l = 0; l < W.layers.size(); ++l) {
    const auto& L = W.layers[l];
    if (L.kv_source) s->layers[l].compressed = zeros(s->pages * page_floats(L, c.head_dim));
    if (L.owns_index_keys)
      s->layers[l].index_keys = zeros(s->pages * page_floats(L, c.index_head_dim));
  }
  if (!error.empty())
    return r::failure("device_model: allocating " + std::to_string(s->pages) + " KV pages: " + error);
  for (i64 p = s->pages - 1; p >= 0; --p) s->free_pages.push_back(p);  // page 0 is taken first
  return device_model(std::move(s));
}

result<sequence_id> device_model::open_sequence() {
  auto& s = *s_;
  const auto free = std::find(s.slot_used.begin(), s.slot_used.end(), false);
  if (free == s.slot_used.end())
    return result<sequence_id>::failure("device_model: all " + std::to_string(s.max_sequences) +
                                        " sequences are open");
  *free = true;
  const sequence_id id = s.next_id++;
  const std::vector<i64> zeros(s.layers.size(), 0);
  auto& seq = s.sequences[id];
  seq.slot = free - s.slot_used.begin();
  seq.ring_first = seq.groups = seq.pending = zeros;
  return id;
}

result<bool> device_model::close_sequence(sequence_id id) {
  auto it = s_->sequences.find(id);
  if (it == s_->sequences.end())
    return result<bool>::failure("device_model: no sequence " + std::to_string(id));
  s_->slot_used[sz(it->second.slot)] = false;
  const auto& pages = it->second.pages;
  s_->free_pages.insert(s_->free_pages.end(), pages.rbegin(), pages.rend());
  s_->sequences.erase(it);
  return true;
}

result<std::int64_t> device_model::length(sequence_id id) const {
  auto it = s_->sequences.find(id);
  if (it == s_->sequences.end())
    return result<std::int64_t>::failure("device_model: no sequence " + std::to_string(id));
  return it->second.length;
}

std::int64_t device_model::pages() const { return s_->pages; }

std::int64_t device_model::kv_tokens() const { return s_->pages * s_->page_tokens; }

std::int64_t device_model::page_bytes() const { return s_->page_bytes; }

std::int64_t device_model::free_pages() const {
  return static_cast<std::int64_t>(s_->free_pages.size());
}

std::int64_t device_model::pages_for(std::int64_t tokens) const { return s_->pages_for(tokens); }

result<std::int64_t> device_model::pages_to_grow(sequence_id id, std::int64_t tokens) const {
  auto it = s_->sequences.find(id);
  if (it == s_->sequences.end())
    return result<std::int64_t>::failure("device_model: no sequence " + std::to_string(id));
  return s_->pages_to_grow(it->second, tokens);
}

result<bool> device_model::set_expert_placement(std::optional<expert_placement> placement) {
  auto& s = *s_;
  const auto experts = static_cast<std::int32_t>(s.c.n_routed_experts);
  if (!placement) {
    auto one = place_experts(experts, 1);
    if (!one) return result<bool>::failure(one.error());
    s.placement = std::move(*one);
    return true;
  }
  if (auto ok = check_placement(*placement, experts); !ok) return ok;
  s.placement = std::move(*placement);
  return true;
}

std::vector<std::uint64_t> device_model::expert_counts() const { return s_->routed; }

result<std::int64_t> device_model::full_blocks(sequence_id id) const {
  const auto& s = *s_;
  const auto it = s.sequences.find(id);
  if (it == s.sequences.end())
    return result<std::int64_t>::failure("device_model: no sequence " + std::to_string(id));
  i64 blocks = -1;
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    const auto& host = s.W->layers[l];
    if (!host.kv_source) continue;
    const i64 b = it->second.groups[l] / std::max<i64>(1, kv_block_tokens / host.ratio);
    blocks = blocks < 0 ? b : std::min(blocks, b);
  }
  return std::max<i64>(0, blocks);
}

result<std::string> device_model::export_block(sequence_id id, std::int64_t block) const {
  using r = result<std::string>;
  const auto& s = *s_;
  const auto it = s.sequences.find(id);
  if (it == s.sequences.end()) return r::failure("device_model: no sequence " + std::to_string(id));
  auto full = full_blocks(id);
  if (!full) return r::failure(full.error());
  if (block < 0 || block >= *full)
    return r::failure("serialize_block: block " + std::to_string(block) + " is not full (" +
                      std::to_string(*full) + " full blocks)");
  const auto& seq = it->second;
  const i64 hd = s.c.head_dim, idh = s.c.index_head_dim;
  // Each KV source's rows of the block: groups [block · rows, (block + 1) · rows) of its store.
  std::vector<std::vector<float>> held;
  std::vector<block_layer_rows> layers;
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    const auto& host = s.W->layers[l];
    if (!host.kv_source) continue;
    const auto& L = s.layers[l];
    const i64 rows = kv_block_tokens / std::max<i64>(1, host.ratio);
    const bool keys = L.index_keys.size() > 0;
    // (The rows' buffers move with `held`, their addresses stay.)
    auto& kv = held.emplace_back(sz(rows * hd));
    TROUPE_TRY(s.download_groups(seq, l, L.compressed.data(), block * rows, rows, hd, kv.data()));
    const float* kv_rows = kv.data();
    const float* key_rows = nullptr;
    if (keys) {
      auto& k = held.emplace_back(sz(rows * idh));
      TROUPE_TRY(s.download_groups(seq, l, L.index_keys.data(), block * rows, rows, idh, k.data()));
      key_rows = k.data();
    }
    layers.push_back({static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(host.ratio), rows,
                      hd, keys ? idh : 0, kv_rows, key_rows});
  }
  return serialize_block_rows(block, layers);
}

result<bool> device_model::rollback(sequence_id id, std::int64_t k) {
  using r = result<bool>;
  auto& s = *s_;
  const auto it = s.sequences.find(id);
  if (it == s.sequences.end()) return r::failure("device_model: no sequence " + std::to_string(id));
  auto& seq = it->second;
  // kernels::rollback's rules and messages.
  if (k < 0 || k > swa_rollback_tokens)
    return r::failure("rollback: " + std::to_string(k) + " tokens, expected 0 to " +
                      std::to_string(swa_rollback_tokens));
  if (seq.length - k < seq.rollback_floor)
    return r::failure("rollback: " + std::to_string(k) + " tokens, only " +
                      std::to_string(seq.length - seq.rollback_floor) +
                      " since the start or the previous rollback");
  // The rings, the compressed stores and the recent rows are addressed by position: the rows
  // past the new length are dead, and the unfinished group's are in the recent store.
  const i64 length = seq.length - k;
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    const auto& host = s.W->layers[l];
    if (!host.kv_source) continue;
    const i64 ratio = host.ratio;
    seq.groups[l] = ratio > 1 ? length / ratio : length;
    if (ratio > 1) seq.pending[l] = length - seq.groups[l] * ratio;
  }
  seq.engram_recent.resize(seq.engram_recent.size() -
                           std::min<std::size_t>(seq.engram_recent.size(), sz(k)));
  seq.length = length;
  seq.rollback_floor = length;
  return true;
}

bool device_model::has_draft() const { return s_->draft.has_value(); }

// model.cpp's draft_attention: every block token attends to the same keys, the last `window`
// context rows before the block (its sequence's draft ring) and all B block rows. The kernel's
// prefill form gives that when each query's position is the block's last and its window
// window + B; the inverse RoPE of its output is at its own position.
result<bool> device_model::state::draft_attention(const device_layer& L, const buffer& a,
                                                  const draft_call& call, buffer& out) {
  const i64 T = call.T;
  auto buffers = attention_buffers::make(c, T);
  TROUPE_TRY(buffers);
  auto& [q_res, q, kv, attn, grouped] = *buffers;
  TROUPE_TRY(queries(L, a.data(), T, rope_main, call.d_positions.data(), q_res.data(), q.data()));
  TROUPE_TRY(kv_rows(L, a.data(), T, rope_main, call.d_positions.data(), kv.data()));
  auto args = window_args(L, rope_main, q.data(), attn.data(), T);
  args.positions = call.d_last.data();
  args.rope_positions = call.d_positions.data();
  args.ring_begin = call.d_ring_begin.data();
  args.window = c.sliding_window + c.dspark_block_size;
  args.chunk = kv.data();
  args.sequence = call.d_slots.data();
  args.chunk_start = call.d_start.data();
  args.chunk_row = call.d_row.data();
  TROUPE_TRY(swa_decode_attention(args));
  return output(L, attn.data(), T, grouped.data(), out.data());
}

result<draft_output> device_model::draft(std::span<const draft_request> batch) {
  using r = result<draft_output>;
  auto& s = *s_;
  if (!s.draft) return r::failure("draft: the checkpoint has no DSpark draft layers (mtp.*)");
  auto& dr = *s.draft;
  const auto& c = s.c;
  const i64 D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size, B = c.dspark_block_size;
  const i64 hd = c.head_dim, cap = s.capacity;
  const i64 width = static_cast<i64>(c.dspark_target_layer_ids.size()) * D;
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // Checked before any context changes.
  std::vector<sequence_state*> seqs;
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const auto& in = batch[b];
    const auto it = s.sequences.find(in.sequence);
    if (it == s.sequences.end())
      return r::failure("device_model: no sequence " + std::to_string(in.sequence));
    for (std::size_t o = 0; o < b; ++o)
      if (batch[o].sequence == in.sequence)
        return r::failure("device_model: sequence " + std::to_string(in.sequence) +
                          " twice in one batch");
    const std::string who = "draft: sequence " + std::to_string(b);
    if (static_cast<i64>(in.features.size()) % width != 0)
      return r::failure(who + ": expected features of width " + std::to_string(width) +
                        " (targets x hidden_size), found " + std::to_string(in.features.size()) +
                        " values");
    if (in.anchor >= V)
      return r::failure(who + ": anchor token " + std::to_string(in.anchor) +
                        ", expected 0 <= id < " + std::to_string(V));
    if (in.position < 0)
      return r::failure(who + ": position " + std::to_string(in.position) + " is negative");
    seqs.push_back(&it->second);
  }

  auto up = [](const auto& v, auto& into) -> result<bool> {
    auto d = std::remove_reference_t<decltype(into)>::of(v);
    TROUPE_TRY(d);
    into = std::move(*d);
    return true;
  };
  // The contexts: the features' rows main_norm(main_proj(f)), then every stage's K=V rows of
  // them into its ring (a sequence's last `capacity` rows only: the others would be
  // overwritten in the same slots).
  std::vector<float> features;
  std::vector<i64> positions, ring_src, ring_dst;
  for (std::size_t b = 0; b < batch.size(); ++b) {
    auto& seq = *seqs[b];
    if (!seq.drafting || seq.draft_end != batch[b].position) {
      seq.drafting = true;
      seq.draft_first = seq.draft_end = batch[b].position;
    }
    const i64 n = static_cast<i64>(batch[b].features.size()) / width;
    const i64 first_row = static_cast<i64>(positions.size());
    features.insert(features.end(), batch[b].features.begin(), batch[b].features.end());
    for (i64 i = 0; i < n; ++i) {
      const i64 p = seq.draft_end + i;
      positions.push_back(p);
      if (i >= n - cap) {
        ring_src.push_back(first_row + i);
        ring_dst.push_back(seq.slot * cap + p % cap);
      }
    }
  }
  if (const i64 N = static_cast<i64>(positions.size()); N > 0) {
    buffer d_features;
    index_buffer d_positions, d_src, d_dst;
    TROUPE_TRY(up(std::span<const float>(features), d_features));
    TROUPE_TRY(up(std::span<const i64>(positions), d_positions));
    TROUPE_TRY(up(std::span<const i64>(ring_src), d_src));
    TROUPE_TRY(up(std::span<const i64>(ring_dst), d_dst));
    auto ctx = buffer::zeros(sz(N * D));
    auto kv = buffer::zeros(sz(N * hd));
    TROUPE_TRY(ctx);
    TROUPE_TRY(kv);
    TROUPE_TRY(s.project(d_features.data(), N, width, dr.main_proj.data(), D, ctx->data()));
    TROUPE_TRY(rms_norm(ctx->data(), N, D, dr.main_norm.data(), eps));
    for (auto& L : dr.stages) {
      TROUPE_TRY(s.kv_rows(L, ctx->data(), N, s.rope_main, d_positions.data(), kv->data()));
      TROUPE_TRY(copy_rows(kv->data(), d_src.data(), L.rings.data(), d_dst.data(),
                           static_cast<i64>(ring_src.size()), hd));
    }
  }
  for (std::size_t b = 0; b < batch.size(); ++b)
    seqs[b]->draft_end += static_cast<i64>(batch[b].features.size()) / width;

  // The blocks [anchor, noise × (B − 1)] at positions draft_end .. draft_end + B − 1 through
  // the stages (the mHC sites as the backbone's), then the final collapse h_k, its norm and
  // the LM head.
  std::vector<i64> anchors, tokens, block_positions, last, slots, start, row;
  std::vector<i64> ring_begin(sz(s.max_sequences), 0);
  for (std::size_t b = 0; b < batch.size(); ++b) {
    if (batch[b].anchor < 0) continue;
    const auto& seq = *seqs[b];
    const i64 first_row = static_cast<i64>(tokens.size());
    ring_begin[sz(seq.slot)] = std::max(seq.draft_first, seq.draft_end - cap);
    anchors.push_back(batch[b].anchor);
    for (i64 i = 0; i < B; ++i) {
      tokens.push_back(i == 0 ? batch[b].anchor : c.dspark_noise_token_id);
      block_positions.push_back(seq.draft_end + i);
      last.push_back(seq.draft_end + B - 1);
      slots.push_back(seq.slot);
      start.push_back(seq.draft_end);
      row.push_back(first_row);
    }
  }
  const i64 T = static_cast<i64>(tokens.size());
  if (T == 0) return draft_output{};
  draft_call call;
  call.T = T;
  index_buffer d_tokens;
  TROUPE_TRY(up(std::span<const i64>(tokens), d_tokens));
  TROUPE_TRY(up(std::span<const i64>(block_positions), call.d_positions));
  TROUPE_TRY(up(std::span<const i64>(last), call.d_last));
  TROUPE_TRY(up(std::span<const i64>(slots), call.d_slots));
  TROUPE_TRY(up(std::span<const i64>(start), call.d_start));
  TROUPE_TRY(up(std::span<const i64>(row), call.d_row));
  TROUPE_TRY(up(std::span<const i64>(ring_begin), call.d_ring_begin));
  auto sites = mhc_streams::make(c, T);
  auto logits = buffer::zeros(sz(T * V));
  TROUPE_TRY(sites);
  TROUPE_TRY(logits);
  auto& m = *sites;
  TROUPE_TRY(embed_rows(s.embed.data(), d_tokens.data(), T, hc, D, m.streams.data()));
  for (auto& L : dr.stages) {
    TROUPE_TRY(s.site(m, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, L.attn_norm,
                      [&] { return s.draft_attention(L, m.x, call, m.out); }));
    TROUPE_TRY(s.site(m, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, L.ffn_norm, [&] {
      return s.moe(dr.cfg, L, dr.placement, nullptr, m.x, T, m.out);
    }));
  }
  TROUPE_TRY(hc_collapse(m.streams.data(), m.pre.data(), T, hc, D, m.x.data()));
  auto hidden = m.x.download();
  TROUPE_TRY(hidden);
  TROUPE_TRY(rms_norm(m.x.data(), T, D, dr.norm.data(), eps));
  TROUPE_TRY(s.project(m.x.data(), T, D, s.lm_head.data(), V, logits->data()));
  auto host_logits = logits->download();
  TROUPE_TRY(host_logits);
  return s.model_->finish_draft(anchors, *hidden, std::move(*host_logits));
}

result<std::optional<draft_state>> device_model::export_draft(sequence_id id) const {
  using r = result<std::optional<draft_state>>;
  const auto& s = *s_;
  const auto it = s.sequences.find(id);
  if (it == s.sequences.end()) return r::failure("device_model: no sequence " + std::to_string(id));
  const auto& seq = it->second;
  if (!s.draft || !seq.drafting) return std::optional<draft_state>{};
  const i64 hd = s.c.head_dim, cap = s.capacity;
  const i64 first = std::max(seq.draft_first, seq.draft_end - cap);
  draft_state out = s.model_->new_draft_state();
  std::vector<float> rows(sz(cap * hd));
  for (std::size_t st = 0; st < s.draft->stages.size(); ++st) {
    TROUPE_TRY(copy_to_host(rows.data(), s.draft->stages[st].rings.data() + seq.slot * cap * hd,
                            rows.size() * sizeof(float)));
    auto& ring = out.rings[st];
    ring.reset(first);
    for (i64 p = first; p < seq.draft_end; ++p) ring.push(rows.data() + (p % cap) * hd);
  }
  return std::optional<draft_state>(std::move(out));
}

result<bool> device_model::import_draft(sequence_id id, const draft_state& context) {
  using r = result<bool>;
  auto& s = *s_;
  const auto it = s.sequences.find(id);
  if (it == s.sequences.end()) return r::failure("device_model: no sequence " + std::to_string(id));
  if (!s.draft) return r::failure("draft: the checkpoint has no DSpark draft layers (mtp.*)");
  if (context.owner != s.W || context.rings.size() != s.draft->stages.size())
    return r::failure("device_model: a draft context made by another model");
  const auto& ring0 = context.rings.front();
  for (const auto& ring : context.rings)
    if (ring.begin() != ring0.begin() || ring.end() != ring0.end() ||
        ring.width() != s.c.head_dim)
      return r::failure("device_model: a draft context whose stages hold different positions");
  auto& seq = it->second;
  const i64 hd = s.c.head_dim, cap = s.capacity;
  for (std::size_t st = 0; st < context.rings.size(); ++st)
    for (i64 p = ring0.begin(); p < ring0.end(); ++p)
      TROUPE_TRY(copy_to_device(s.draft->stages[st].rings.data() + (seq.slot * cap + p % cap) * hd,
                                context.rings[st].at(p), sz(hd) * sizeof(float)));
  seq.drafting = true;
  seq.draft_first = ring0.begin();
  seq.draft_end = ring0.end();
  return true;
}

result<sequence_cache> device_model::export_sequence(sequence_id id) const {
  using r = result<sequence_cache>;
  const auto& s = *s_;
  const auto it = s.sequences.find(id);
  if (it == s.sequences.end()) return r::failure("device_model: no sequence " + std::to_string(id));
  const auto& seq = it->second;
  const i64 hd = s.c.head_dim, idh = s.c.index_head_dim;
  sequence_cache out = s.model_->new_sequence();
  out.length = seq.length;
  out.rollback_floor = seq.length;
  out.engram_recent = seq.engram_recent;
  // Rows [first, first + n) of a store whose slot rows start at `at`, `width` floats each.
  auto rows = [&](const buffer& store, i64 at, i64 n, i64 width) -> result<std::vector<float>> {
    std::vector<float> v(sz(n * width));
    if (n > 0)
      TROUPE_TRY(copy_to_host(v.data(), store.data() + at * width, v.size() * sizeof(float)));
    return v;
  };
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    const auto& L = s.layers[l];
    auto& lc = out.layers[l];
    const i64 first = std::max(seq.ring_first[l], seq.length - s.capacity);
    auto ring = rows(L.rings, seq.slot * s.capacity, s.capacity, hd);
    TROUPE_TRY(ring);
    lc.window.reset(first);
    for (i64 p = first; p < seq.length; ++p) lc.window.push(ring->data() + (p % s.capacity) * hd);
    if (!lc.is_kv_source) continue;
    auto& cc = lc.compressed;
    const i64 groups = seq.groups[l], held = seq.pending[l];
    cc.groups = groups;
    cc.pending_tokens = held;
    if (cc.ratio > 1) {
      // The unfinished group: positions [length - held, length) of the recent store.
      const i64 R = recent_rows(cc.ratio);
      auto kv = rows(L.recent_kv, seq.slot * R, R, hd);
      auto gate = rows(L.recent_gate, seq.slot * R, R, hd);
      TROUPE_TRY(kv);
      TROUPE_TRY(gate);
      for (i64 p = seq.length - held; p < seq.length; ++p) {
        const auto at = kv->begin() + (p % R) * hd;
        cc.pending_kv.insert(cc.pending_kv.end(), at, at + hd);
        const auto g = gate->begin() + (p % R) * hd;
        cc.pending_gate.insert(cc.pending_gate.end(), g, g + hd);
      }
    }
    std::vector<float> kv(sz(groups * hd));
    TROUPE_TRY(s.download_groups(seq, l, L.compressed.data(), 0, groups, hd, kv.data()));
    for (i64 g = 0; g < groups; ++g) cc.kv.append(kv.data() + g * hd);
    if (L.index_keys.size() > 0) {
      std::vector<float> keys(sz(groups * idh));
      TROUPE_TRY(s.download_groups(seq, l, L.index_keys.data(), 0, groups, idh, keys.data()));
      for (i64 g = 0; g < groups; ++g) cc.index_keys.append(keys.data() + g * idh);
    }
  }
  return out;
}

result<sequence_id> device_model::import_sequence(const sequence_cache& cache) {
  using r = result<sequence_id>;
  auto& s = *s_;
  if (cache.owner != s.W || cache.layers.size() != s.layers.size())
    return r::failure("device_model: the cache was made by another model");
  if (cache.length > s.max_context)
    return r::failure("device_model: the cache holds " + std::to_string(cache.length) +
                      " tokens, more than max_context " + std::to_string(s.max_context));
  if (const i64 need = s.pages_for(cache.length); need > static_cast<i64>(s.free_pages.size()))
    return r::failure(s.pages_short(need));
  auto id = open_sequence();
  if (!id) return id;
  auto& seq = s.sequences[*id];
  s.grow(seq, cache.length);
  const i64 hd = s.c.head_dim, idh = s.c.index_head_dim;
  auto put = [&](buffer& store, i64 at, const float* v, i64 n, i64 width) -> result<bool> {
    if (n > 0) TROUPE_TRY(copy_to_device(store.data() + at * width, v, sz(n * width) * sizeof(float)));
    return true;
  };
  auto fill = [&]() -> result<bool> {
    seq.length = cache.length;
    seq.rollback_floor = cache.length;  // the recent rows before the unfinished group stay behind
    seq.engram_recent = cache.engram_recent;
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      auto& L = s.layers[l];
      const auto& lc = cache.layers[l];
      seq.ring_first[l] = lc.window.begin();
      for (i64 p = lc.window.begin(); p < lc.window.end(); ++p)
        TROUPE_TRY(put(L.rings, seq.slot * s.capacity + p % s.capacity, lc.window.at(p), 1, hd));
      if (!lc.is_kv_source) continue;
      const auto& cc = lc.compressed;
      seq.groups[l] = cc.groups;
      seq.pending[l] = cc.pending_tokens;
      if (cc.ratio > 1) {
        const i64 R = recent_rows(cc.ratio);
        for (i64 j = 0; j < cc.pending_tokens; ++j) {
          const i64 slot_row = seq.slot * R + (cache.length - cc.pending_tokens + j) % R;
          TROUPE_TRY(put(L.recent_kv, slot_row, cc.pending_kv.data() + j * hd, 1, hd));
          TROUPE_TRY(put(L.recent_gate, slot_row, cc.pending_gate.data() + j * hd, 1, hd));
        }
      }
      for (i64 g = 0; g < cc.kv.size(); ++g)
        TROUPE_TRY(put(L.compressed, s.row_of(seq, l, g), cc.kv.row(g), 1, hd));
      for (i64 g = 0; g < cc.index_keys.size(); ++g)
        TROUPE_TRY(put(L.index_keys, s.row_of(seq, l, g), cc.index_keys.row(g), 1, idh));
    }
    return true;
  };
  if (auto ok = fill(); !ok) {
    (void)close_sequence(*id);
    return r::failure(ok.error());
  }
  return id;
}

// model.cpp's hc_mixes: the normalised flattened streams projected, then each token's mixes.
result<bool> device_model::state::mixes(const buffer& streams, i64 T, const buffer& fn,
                                        const buffer& scale, const buffer& base, buffer& flat,
                                        buffer& mix, buffer& pre, buffer& post, buffer& comb) {
  const i64 hc = c.hc_mult, width = hc * c.hidden_size, n_mix = (2 + hc) * hc;
  TROUPE_TRY(copy_on_device(flat.data(), streams.data(), sz(T * width) * sizeof(float)));
  TROUPE_TRY(rms_norm(flat.data(), T, width, nullptr, static_cast<float>(c.rms_norm_eps)));
  TROUPE_TRY(project(flat.data(), T, width, fn.data(), n_mix, mix.data()));
  TROUPE_TRY(hc_mixes(mix.data(), scale.data(), base.data(), T, hc, c.hc_sinkhorn_iters,
                      static_cast<float>(c.hc_eps), pre.data(), post.data(), comb.data()));
  return true;
}

// model.cpp's attention_site: queries, the shared K=V row, in a compressed layer the CSA2
// compressor and indexer, attention over the ring, the call's own rows and the selected
// compressed entries, the rows pushed into the ring, the grouped output projection.
result<bool> device_model::state::attention(std::size_t l, const buffer& a, call_state& call,
                                            buffer& out) {
  device_layer& L = layers[l];
  const auto& host = W->layers[l];
  const i64 T = call.T;
  const i64 hd = c.head_dim;
  const rope& rp = host.ratio != 0 ? rope_compress : rope_main;
  auto buffers = attention_buffers::make(c, T);
  TROUPE_TRY(buffers);
  auto& [q_res, q, kv, attn, grouped] = *buffers;
  TROUPE_TRY(queries(L, a.data(), T, rp, call.d_positions.data(), q_res.data(), q.data()));
  TROUPE_TRY(kv_rows(L, a.data(), T, rp, call.d_positions.data(), kv.data()));

  if (host.ratio != 0) {
    if (host.kv_source) TROUPE_TRY(compress(l, a, call));
    if (host.owns_index_keys) call.index_src = static_cast<i64>(l);
    if (host.index_source) TROUPE_TRY(select(l, q_res, a, call));
    if (host.kv_source) call.compress_src = static_cast<i64>(l);
  }

  // Every call in the kernel's prefill form: a query reads its ring before its sequence's
  // first position in this call and the call's rows from there on (a decode step is a chunk
  // of one); in a compressed layer, then the entries the last index source selected from the
  // last KV source's compressed KV.
  auto args = window_args(L, rp, q.data(), attn.data(), T);
  args.positions = call.d_positions.data();
  args.ring_begin = call.d_ring_begin.data() + l * sz(max_sequences);
  args.window = c.sliding_window;
  args.chunk = kv.data();
  args.sequence = call.d_slots.data();
  args.chunk_start = call.d_start.data();
  args.chunk_row = call.d_row.data();
  // The selection as rows of the store (selected_rows), with its counts (selected_n: a copy
  // with sequences whose source is still empty at 0, when there are any).
  index_buffer selected_rows, selected_n;
  if (host.ratio != 0 && call.compress_src >= 0) {
    const auto src = sz(call.compress_src);
    args.compressed = layers[src].compressed.data();
    args.max_selected = c.index_topk;
    args.n_selected = call.topk_n.data();
    bool empty = false;
    for (const auto* seq : call.seqs) empty = empty || seq->groups[src] == 0;
    if (empty) {
      auto n = index_buffer::zeros(sz(T));
      TROUPE_TRY(n);
      TROUPE_TRY(copy_on_device(n->data(), call.topk_n.data(), sz(T) * sizeof(i64)));
      for (std::size_t b = 0; b < call.seqs.size(); ++b)
        if (call.seqs[b]->groups[src] == 0)
          TROUPE_TRY(zero_device(n->data() + call.begin[b],
                                 sz(call.begin[b + 1] - call.begin[b]) * sizeof(i64)));
      selected_n = std::move(*n);
      args.n_selected = selected_n.data();
    }
    // The indexer selected groups; the kernel reads rows of the sequence's pages.
    auto rows = index_buffer::zeros(sz(std::max<i64>(T * c.index_topk, 1)));
    TROUPE_TRY(rows);
    TROUPE_TRY(paged_rows(call.topk.data(), args.n_selected, T, c.index_topk, call.d_pages.data(),
                          call.d_pages_at.data(), page_rows(src), rows->data()));
    selected_rows = std::move(*rows);
    args.selected = selected_rows.data();
  }
  TROUPE_TRY(swa_decode_attention(args));
  // Then the rows join the rings (only each sequence's last `capacity` rows: the others
  // would be overwritten in the same slots).
  TROUPE_TRY(copy_rows(kv.data(), call.d_ring_src.data(), L.rings.data(),
                       call.d_ring_dst.data(), call.ring_rows, hd));
  return output(L, attn.data(), T, grouped.data(), out.data());
}

result<bool> device_model::state::queries(const device_layer& L, const float* a, i64 T,
                                          const rope& rp, const i64* positions, float* q_res,
                                          float* q) {
  const i64 D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim, qr = c.q_lora_rank;
  TROUPE_TRY(project(a, T, D, L.wq_a.data(), qr, q_res));
  TROUPE_TRY(rms_norm(q_res, T, qr, L.q_norm.data(), static_cast<float>(c.rms_norm_eps)));
  TROUPE_TRY(project(q_res, T, qr, L.wq_b.data(), H * hd, q));
  return rope_rows(q, T * H, hd, rp.inv_freq.data(), rp.dim, rp.scaling, positions, H, false);
}

result<bool> device_model::state::kv_rows(const device_layer& L, const float* a, i64 T,
                                          const rope& rp, const i64* positions, float* kv) {
  const i64 D = c.hidden_size, hd = c.head_dim;
  TROUPE_TRY(project(a, T, D, L.wkv.data(), hd, kv));
  TROUPE_TRY(rms_norm(kv, T, hd, L.kv_norm.data(), static_cast<float>(c.rms_norm_eps)));
  TROUPE_TRY(rope_rows(kv, T, hd, rp.inv_freq.data(), rp.dim, rp.scaling, positions, 1, false));
  // fake_quant_fp8_block32 leaves a row whose width is not a multiple of 32 as it is.
  if (hd % 32 == 0) TROUPE_TRY(quant_fp8_blocks(kv, T * hd, 32));
  return true;
}

result<bool> device_model::state::output(const device_layer& L, const float* attn, i64 T,
                                         float* grouped, float* out) {
  const i64 D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim;
  const i64 G = c.o_groups, R = c.o_lora_rank, per_group = H * hd / G;
  for (i64 g = 0; g < G; ++g)
    TROUPE_TRY(project(attn + g * per_group, T, per_group, L.wo_a.data() + g * R * per_group, R,
                       grouped + g * R, H * hd, G * R));
  return project(grouped, T, G * R, L.wo_b.data(), D, out);
}

// The CSA2 compressor of KV-source layer l: each sequence's groups completed in this call
// (ratio 1: every token; ratio r: the unfinished group's rows, then the call's, pooled r at a
// time; the call's last rows join the recent store for the next call and a rollback), normed;
// the key owner's indexer keys from them (projected, normed, rotated, FP4-rounded); then the
// groups rotated and FP4-rounded into the compressed KV, at their rows in the sequence's pages.
result<bool> device_model::state::compress(std::size_t l, const buffer& a, call_state& call) {
  device_layer& L = layers[l];
  const auto& host = W->layers[l];
  const i64 T = call.T, D = c.hidden_size, hd = c.head_dim, idh = c.index_head_dim;
  const i64 r = host.ratio;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  auto c_kv = buffer::zeros(sz(T * hd));
  TROUPE_TRY(c_kv);
  TROUPE_TRY(project(a.data(), T, D, L.c_wkv.data(), hd, c_kv->data()));

  // Per sequence: its new groups' rows in `latents` and their positions.
  std::vector<i64> latent_pos, latent_dst, group_count(call.seqs.size(), 0);
  buffer latents;
  if (r == 1) {
    latents = std::move(*c_kv);
    for (std::size_t b = 0; b < call.seqs.size(); ++b) {
      const auto& seq = *call.seqs[b];
      for (i64 t = call.begin[b]; t < call.begin[b + 1]; ++t) {
        latent_pos.push_back(seq.groups[l] + (t - call.begin[b]));
        latent_dst.push_back(row_of(seq, l, latent_pos.back()));
      }
      group_count[b] = call.begin[b + 1] - call.begin[b];
    }
  } else {
    auto c_gate = buffer::zeros(sz(T * hd));
    TROUPE_TRY(c_gate);
    TROUPE_TRY(project(a.data(), T, D, L.c_wgate.data(), hd, c_gate->data()));
    // Each sequence's unfinished rows, then its call rows, one after another in `joined`; the
    // call's last R rows go to the recent store (by position).
    const i64 R = recent_rows(r);
    std::vector<i64> held_src, held_dst, call_src, call_dst, rest_src, rest_dst, joined_at;
    i64 joined = 0, n_lat = 0;
    for (std::size_t b = 0; b < call.seqs.size(); ++b) {
      const auto& seq = *call.seqs[b];
      const i64 held = seq.pending[l], n = call.begin[b + 1] - call.begin[b];
      joined_at.push_back(joined);
      for (i64 j = 0; j < held; ++j) {
        held_src.push_back(seq.slot * R + (seq.length - held + j) % R);
        held_dst.push_back(joined + j);
      }
      for (i64 i = 0; i < n; ++i) {
        call_src.push_back(call.begin[b] + i);
        call_dst.push_back(joined + held + i);
        if (i >= n - R) {
          rest_src.push_back(joined + held + i);
          rest_dst.push_back(seq.slot * R + (seq.length + i) % R);
        }
      }
      const i64 complete = (held + n) / r;
      for (i64 g = 0; g < complete; ++g) {
        latent_pos.push_back((seq.groups[l] + g) * r);
        latent_dst.push_back(row_of(seq, l, seq.groups[l] + g));
      }
      group_count[b] = complete;
      n_lat += complete;
      joined += held + n;
    }
    auto joined_kv = buffer::zeros(sz(joined * hd));
    auto joined_gate = buffer::zeros(sz(joined * hd));
    auto lat = buffer::zeros(sz(n_lat * hd));
    for (const auto* b : {&joined_kv, &joined_gate, &lat}) TROUPE_TRY(*b);
    auto up = [](const std::vector<i64>& v) { return index_buffer::of(v); };
    auto d_held_src = up(held_src), d_held_dst = up(held_dst), d_call_src = up(call_src);
    auto d_call_dst = up(call_dst), d_rest_src = up(rest_src), d_rest_dst = up(rest_dst);
    for (const auto* b : {&d_held_src, &d_held_dst, &d_call_src, &d_call_dst, &d_rest_src,
                          &d_rest_dst})
      TROUPE_TRY(*b);
    const auto held_n = static_cast<i64>(held_src.size());
    const auto rest_n = static_cast<i64>(rest_src.size());
    for (auto [from_store, from_call, into] :
         {std::tuple{&L.recent_kv, &*c_kv, &*joined_kv},
          std::tuple{&L.recent_gate, &*c_gate, &*joined_gate}}) {
      TROUPE_TRY(copy_rows(from_store->data(), d_held_src->data(), into->data(),
                           d_held_dst->data(), held_n, hd));
      TROUPE_TRY(copy_rows(from_call->data(), d_call_src->data(), into->data(),
                           d_call_dst->data(), T, hd));
      TROUPE_TRY(copy_rows(into->data(), d_rest_src->data(), from_store->data(),
                           d_rest_dst->data(), rest_n, hd));
    }
    i64 at = 0;
    for (std::size_t b = 0; b < call.seqs.size(); ++b) {
      if (group_count[b] == 0) continue;
      TROUPE_TRY(compress_pool(joined_kv->data() + joined_at[b] * hd,
                               joined_gate->data() + joined_at[b] * hd, group_count[b], r, hd,
                               lat->data() + at * hd));
      at += group_count[b];
    }
    latents = std::move(*lat);
  }
  const auto n_lat = static_cast<i64>(latent_pos.size());
  for (std::size_t b = 0; b < call.seqs.size(); ++b) {
    auto& seq = *call.seqs[b];
    if (r > 1) seq.pending[l] = (seq.pending[l] + call.begin[b + 1] - call.begin[b]) % r;
  }
  if (n_lat == 0) return true;
  auto d_pos = index_buffer::of(latent_pos);
  auto d_dst = index_buffer::of(latent_dst);
  TROUPE_TRY(d_pos);
  TROUPE_TRY(d_dst);
  TROUPE_TRY(rms_norm(latents.data(), n_lat, hd, L.c_norm.data(), eps));
  if (host.owns_index_keys) {
    auto keys = buffer::zeros(sz(n_lat * idh));
    TROUPE_TRY(keys);
    TROUPE_TRY(project(latents.data(), n_lat, hd, L.i_wk.data(), idh, keys->data()));
    TROUPE_TRY(rms_norm(keys->data(), n_lat, idh, L.i_k_norm.data(), eps));
    TROUPE_TRY(rope_rows(keys->data(), n_lat, idh, rope_compress.inv_freq.data(),
                         rope_compress.dim, rope_compress.scaling, d_pos->data(), 1, false));
    if (idh % 32 == 0) TROUPE_TRY(quant_fp4_blocks(keys->data(), n_lat * idh, 32, false));
    TROUPE_TRY(copy_rows(keys->data(), nullptr, L.index_keys.data(), d_dst->data(), n_lat, idh));
  }
  TROUPE_TRY(rope_rows(latents.data(), n_lat, hd, rope_compress.inv_freq.data(),
                       rope_compress.dim, rope_compress.scaling, d_pos->data(), 1, false));
  if (hd % 16 == 0) TROUPE_TRY(quant_fp4_blocks(latents.data(), n_lat * hd, 16, true));
  TROUPE_TRY(copy_rows(latents.data(), nullptr, L.compressed.data(), d_dst->data(), n_lat, hd));
  for (std::size_t b = 0; b < call.seqs.size(); ++b) call.seqs[b]->groups[l] += group_count[b];
  return true;
}

// The CSA2 indexer of index-source layer l: per query its index heads (rotated, FP4-rounded)
// against the key owner's keys of its sequence, scored, masked past what its position sees (and,
// after the candidate source, outside its kept blocks), and the top index_topk selected; a
// candidate source keeps each query's top blocks for the index sources after it.
result<bool> device_model::state::select(std::size_t l, const buffer& q_res, const buffer& a,
                                         call_state& call) {
  device_layer& L = layers[l];
  const auto& host = W->layers[l];
  const i64 T = call.T, D = c.hidden_size, qr = c.q_lora_rank;
  const i64 nh = c.index_n_heads, idh = c.index_head_dim, K = c.index_topk;
  const i64 bs = c.candidate_block_size, kb = c.candidate_topk_blocks;
  if (call.index_src < 0) return true;  // no key owner has run: nothing to select from
  auto i_q = buffer::zeros(sz(T * nh * idh));
  auto i_w = buffer::zeros(sz(T * nh));
  TROUPE_TRY(i_q);
  TROUPE_TRY(i_w);
  TROUPE_TRY(project(q_res.data(), T, qr, L.i_wq_b.data(), nh * idh, i_q->data()));
  TROUPE_TRY(project(a.data(), T, D, L.i_weights.data(), nh, i_w->data()));
  TROUPE_TRY(rope_rows(i_q->data(), T * nh, idh, rope_compress.inv_freq.data(), rope_compress.dim,
                       rope_compress.scaling, call.d_positions.data(), nh, false));
  if (idh % 32 == 0) TROUPE_TRY(quant_fp4_blocks(i_q->data(), T * nh * idh, 32, false));
  const auto src = sz(call.index_src);
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(idh));
  const float heads_scale = 1.0f / std::sqrt(static_cast<float>(nh));
  for (std::size_t b = 0; b < call.seqs.size(); ++b) {
    const auto& seq = *call.seqs[b];
    const i64 n_idx = seq.groups[src], t0 = call.begin[b], n = call.begin[b + 1] - t0;
    if (n_idx == 0 || n == 0) continue;
    // What each query sees: its visible groups, and its last visible candidate block.
    std::vector<i64> reach(sz(n)), last(sz(n), -1);
    for (i64 i = 0; i < n; ++i) {
      const i64 visible = (call.positions[sz(t0 + i)] + 1) / host.ratio;
      reach[sz(i)] = std::min(visible, n_idx);
      if (visible >= 1 && (visible - 1) / bs < (n_idx + bs - 1) / bs) last[sz(i)] = (visible - 1) / bs;
    }
    // The key owner's keys of the sequence, gathered from its pages.
    std::vector<i64> key_rows(sz(n_idx));
    for (i64 g = 0; g < n_idx; ++g) key_rows[sz(g)] = row_of(seq, src, g);
    auto d_key_rows = index_buffer::of(key_rows);
    auto keys = buffer::zeros(sz(n_idx * idh));
    auto d_reach = index_buffer::of(reach);
    auto head_dot = buffer::zeros(sz(n * nh * n_idx));
    auto scores = buffer::zeros(sz(n * n_idx));
    TROUPE_TRY(d_key_rows);
    TROUPE_TRY(keys);
    TROUPE_TRY(d_reach);
    TROUPE_TRY(head_dot);
    TROUPE_TRY(scores);
    TROUPE_TRY(copy_rows(layers[src].index_keys.data(), d_key_rows->data(), keys->data(), nullptr,
                         n_idx, idh));
    TROUPE_TRY(project(i_q->data() + t0 * nh * idh, n * nh, idh, keys->data(), n_idx,
                       head_dot->data()));
    TROUPE_TRY(index_scores(head_dot->data(), i_w->data() + t0 * nh, n, nh, n_idx, sm_scale,
                            heads_scale, scores->data()));
    const bool masked = !host.candidate_source && host.uses_candidates && call.has_candidates[b];
    TROUPE_TRY(mask_scores(scores->data(), n, n_idx, d_reach->data(),
                           masked ? call.kept.data() + t0 * kb : nullptr,
                           masked ? call.kept_n.data() + t0 : nullptr, kb, bs));
    if (host.candidate_source) {
      const i64 blocks = (n_idx + bs - 1) / bs;
      auto d_last = index_buffer::of(last);
      auto block_scores = buffer::zeros(sz(n * blocks));
      TROUPE_TRY(d_last);
      TROUPE_TRY(block_scores);
      TROUPE_TRY(block_max(scores->data(), n, n_idx, bs, d_last->data(), block_scores->data()));
      TROUPE_TRY(top_k_rows(block_scores->data(), n, blocks, kb, nullptr,
                            call.kept.data() + t0 * kb, call.kept_n.data() + t0));
      call.has_candidates[b] = true;
    }
    TROUPE_TRY(top_k_rows(scores->data(), n, n_idx, K, nullptr, call.topk.data() + t0 * K,
                          call.topk_n.data() + t0));
  }
  return true;
}

// model.cpp's moe_site: the router on the device, the dispatch plan on the host, one GEMM pair
// per expert on its rows, the copies combined per token, then the shared expert added. The
// CPU adds a token's experts in expert order; the combine adds them in top-k slot order
// (the same terms, another rounding order).
result<bool> device_model::state::moe(const text_config& cfg, device_layer& L,
                                      const expert_placement& by,
                                      std::vector<std::uint64_t>* counts, const buffer& a, i64 T,
                                      buffer& y) {
  const i64 D = cfg.hidden_size, E = cfg.n_routed_experts, I = cfg.moe_intermediate_size;
  const i64 k = std::min(cfg.num_experts_per_tok, E);
  const auto limit = static_cast<float>(cfg.swiglu_limit);
  auto scores = buffer::zeros(sz(T * E));
  auto chosen = index_buffer::zeros(sz(T * k));
  auto chosen_w = buffer::zeros(sz(T * k));
  TROUPE_TRY(scores);
  TROUPE_TRY(chosen);
  TROUPE_TRY(chosen_w);
  TROUPE_TRY(project(a.data(), T, D, L.gate.data(), E, scores->data()));
  TROUPE_TRY(route_tokens(scores->data(), L.gate_bias.data(), T, E, k, router_scoring_of(cfg),
                          static_cast<float>(cfg.gate_temp), cfg.norm_topk_prob,
                          static_cast<float>(cfg.routed_scaling_factor), chosen->data(),
                          chosen_w->data()));
  auto ids64 = chosen->download();
  auto weights = chosen_w->download();
  TROUPE_TRY(ids64);
  TROUPE_TRY(weights);
  const std::vector<std::int32_t> ids(ids64->begin(), ids64->end());
  if (counts != nullptr)
    for (const auto e : ids) ++(*counts)[sz(e)];
  auto plan = plan_dispatch(by, ids, static_cast<std::int32_t>(k));
  TROUPE_TRY(plan);
  const i64 rows = static_cast<i64>(plan->send_copy.size());
  std::vector<float> row_w(sz(rows)), ones(sz(T * k), 1.0f);
  for (i64 i = 0; i < rows; ++i) row_w[sz(i)] = (*weights)[sz(plan->send_copy[sz(i)])];
  auto send_copy = device_array<std::int32_t>::of(plan->send_copy);
  auto copy_row = device_array<std::int32_t>::of(plan->copy_row);
  auto row_scale = buffer::of(row_w);
  auto unit = buffer::of(ones);
  auto sent = buffer::zeros(sz(rows * D));
  auto returned = buffer::zeros(sz(rows * D));
  auto g = buffer::zeros(sz(std::max(rows, T) * I));
  auto u = buffer::zeros(sz(std::max(rows, T) * I));
  auto shared_y = buffer::zeros(sz(T * D));
  for (const auto* b : {&row_scale, &unit, &sent, &returned, &g, &u, &shared_y}) TROUPE_TRY(*b);
  TROUPE_TRY(send_copy);
  TROUPE_TRY(copy_row);
  TROUPE_TRY(moe_gather_rows(a.data(), send_copy->data(), rows, static_cast<std::int32_t>(k), D,
                             sent->data()));
  // The gate weight scales each row inside the SwiGLU, as the CPU's expert_forward does.
  auto expert = [&](const device_expert& e, const float* x, i64 m, const float* scale,
                    float* out) -> result<bool> {
    TROUPE_TRY(project(x, m, D, e.w1.data(), I, g->data()));
    TROUPE_TRY(project(x, m, D, e.w3.data(), I, u->data()));
    TROUPE_TRY(swiglu(g->data(), u->data(), m, I, limit, scale));
    TROUPE_TRY(project(g->data(), m, I, e.w2.data(), D, out));
    return true;
  };
  // The plan's rows: rank segments in rank order, local slots ascending inside each.
  i64 row = 0;
  for (std::size_t rank = 0; rank < plan->expert_counts.size(); ++rank)
    for (std::size_t slot = 0; slot < plan->expert_counts[rank].size(); ++slot) {
      const i64 m = plan->expert_counts[rank][slot];
      if (m == 0) continue;
      const auto e = by.local[rank][slot];
      TROUPE_TRY(expert(L.experts[sz(e)], sent->data() + row * D, m, row_scale->data() + row,
                        returned->data() + row * D));
      row += m;
    }
  TROUPE_TRY(moe_combine_rows(returned->data(), copy_row->data(), unit->data(), T,
                              static_cast<std::int32_t>(k), D, y.data()));
  TROUPE_TRY(expert(L.shared, a.data(), T, nullptr, shared_y->data()));
  TROUPE_TRY(add_into(y.data(), shared_y->data(), T * D));
  return true;
}

// model.cpp's engram_site: the table rows its hash ids name, read on the host from the mapped
// checkpoint (where the tables live: they do not fit in device memory at full scale) and
// copied over, projected to hc keys and a value per token, gated into every stream.
result<bool> device_model::state::engram(const loaded::layer_weights& host, const device_layer& L,
                                         const std::vector<i64>& hash_ids, i64 T,
                                         buffer& streams) {
  const i64 D = c.hidden_size, hc = c.hc_mult, width = W->engram.columns * c.engram_head_dim;
  std::vector<float> rows(sz(T * width));
  engram_table_rows(*W, host, hash_ids, T, rows.data());
  auto d_rows = buffer::of(rows);
  auto kv = buffer::zeros(sz(T * (hc + 1) * D));
  TROUPE_TRY(d_rows);
  TROUPE_TRY(kv);
  TROUPE_TRY(project(d_rows->data(), T, width, L.engram_wkv.data(), (hc + 1) * D, kv->data()));
  TROUPE_TRY(engram_gate_add(streams.data(), kv->data(), L.engram_weight.data(), T, hc, D,
                             static_cast<float>(c.rms_norm_eps)));
  return true;
}

result<std::vector<float>> device_model::forward(std::span<const step_input> batch,
                                                 std::vector<float>* dspark_features) {
  using r = result<std::vector<float>>;
  auto& s = *s_;
  const auto& c = s.c;
  const i64 D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // The call's tokens, positions and ring bookkeeping, checked before anything runs.
  call_state call;
  std::vector<i64> tokens, slots, chunk_start, chunk_row, ring_src, ring_dst;
  i64 new_pages = 0;
  // Per layer and slot: the oldest position each ring holds.
  std::vector<i64> ring_begin(s.layers.size() * sz(s.max_sequences), 0);
  call.begin.push_back(0);
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const auto it = s.sequences.find(batch[b].sequence);
    if (it == s.sequences.end())
      return r::failure("device_model: no sequence " + std::to_string(batch[b].sequence));
    for (std::size_t o = 0; o < b; ++o)
      if (batch[o].sequence == batch[b].sequence)
        return r::failure("device_model: sequence " + std::to_string(batch[b].sequence) +
                          " twice in one batch");
    auto& seq = it->second;
    const i64 first_row = static_cast<i64>(tokens.size());
    const i64 n = static_cast<i64>(batch[b].tokens.size());
    if (seq.length + n > s.max_context)
      return r::failure("device_model: sequence " + std::to_string(batch[b].sequence) +
                        " would hold " + std::to_string(seq.length + n) +
                        " tokens, more than max_context " + std::to_string(s.max_context));
    for (std::size_t l = 0; l < s.layers.size(); ++l)
      ring_begin[l * sz(s.max_sequences) + sz(seq.slot)] =
          std::max<i64>(seq.ring_first[l], seq.length - s.capacity);
    for (i64 i = 0; i < n; ++i) {
      const i64 t = batch[b].tokens[sz(i)];
      if (t < 0 || t >= V)
        return r::failure("device_model: sequence " + std::to_string(batch[b].sequence) +
                          " token " + std::to_string(i) + " is " + std::to_string(t) +
                          ", expected 0 <= id < " + std::to_string(V));
      tokens.push_back(t);
      call.positions.push_back(seq.length + i);
      slots.push_back(seq.slot);
      chunk_start.push_back(seq.length);
      chunk_row.push_back(first_row);
      if (i >= n - s.capacity) {
        ring_src.push_back(first_row + i);
        ring_dst.push_back(seq.slot * s.capacity + (seq.length + i) % s.capacity);
      }
    }
    new_pages += s.pages_to_grow(seq, seq.length + n);
    call.seqs.push_back(&seq);
    call.begin.push_back(static_cast<i64>(tokens.size()));
  }
  if (new_pages > static_cast<i64>(s.free_pages.size())) return r::failure(s.pages_short(new_pages));
  const i64 T = static_cast<i64>(tokens.size());
  if (T == 0) return std::vector<float>{};
  call.T = T;
  call.ring_rows = static_cast<i64>(ring_src.size());
  call.has_candidates.assign(batch.size(), false);
  const bool has_engram = !c.engram_layer_ids.empty();
  if (has_engram && s.W->token_map.empty())
    return r::failure(
        "device_model: the Engram layers need the compressed token map "
        "(model::set_engram_token_map)");
  std::vector<i64> hash_ids;
  if (has_engram) {
    std::vector<const std::vector<i64>*> recent;
    for (const auto* seq : call.seqs) recent.push_back(&seq->engram_recent);
    hash_ids = engram_hash_ids(*s.W, recent, call.begin, tokens, call.positions);
  }
  // The pages the call's tokens take, and every sequence's page table for the kernels.
  std::vector<i64> pages, pages_at;
  for (std::size_t b = 0; b < call.seqs.size(); ++b) {
    auto& seq = *call.seqs[b];
    s.grow(seq, seq.length + call.begin[b + 1] - call.begin[b]);
    pages_at.insert(pages_at.end(), sz(call.begin[b + 1] - call.begin[b]),
                    static_cast<i64>(pages.size()));
    pages.insert(pages.end(), seq.pages.begin(), seq.pages.end());
  }

  auto up = [](const std::vector<i64>& v, index_buffer& into) -> result<bool> {
    auto d = index_buffer::of(v);
    TROUPE_TRY(d);
    into = std::move(*d);
    return true;
  };
  index_buffer d_tokens;
  TROUPE_TRY(up(tokens, d_tokens));
  TROUPE_TRY(up(call.positions, call.d_positions));
  TROUPE_TRY(up(slots, call.d_slots));
  TROUPE_TRY(up(chunk_start, call.d_start));
  TROUPE_TRY(up(chunk_row, call.d_row));
  TROUPE_TRY(up(ring_begin, call.d_ring_begin));
  TROUPE_TRY(up(ring_src, call.d_ring_src));
  TROUPE_TRY(up(ring_dst, call.d_ring_dst));
  TROUPE_TRY(up(pages, call.d_pages));
  TROUPE_TRY(up(pages_at, call.d_pages_at));
  auto topk = index_buffer::zeros(sz(T * std::max<i64>(c.index_topk, 1)));
  auto topk_n = index_buffer::zeros(sz(T));
  auto kept = index_buffer::zeros(sz(T * std::max<i64>(c.candidate_topk_blocks, 1)));
  auto kept_n = index_buffer::zeros(sz(T));
  for (auto* b : {&topk, &topk_n, &kept, &kept_n}) TROUPE_TRY(*b);
  call.topk = std::move(*topk);
  call.topk_n = std::move(*topk_n);
  call.kept = std::move(*kept);
  call.kept_n = std::move(*kept_n);
  auto sites = mhc_streams::make(c, T);
  auto logits = buffer::zeros(sz(T * V));
  TROUPE_TRY(sites);
  TROUPE_TRY(logits);
  auto& m = *sites;

  // The DSpark features [T, targets, D]: at each target layer, the streams its attention site
  // takes, averaged (the collapse with weights 1 / hc, the CPU model's sum in its order).
  const auto& targets = c.dspark_target_layer_ids;
  const auto n_targets = static_cast<i64>(targets.size());
  buffer features, averaged, equal_mix;
  std::vector<index_buffer> feature_rows;  // per target: token t's row t * targets + k
  if (dspark_features != nullptr) {
    auto f = buffer::zeros(sz(T * n_targets * D));
    auto avg = buffer::zeros(sz(T * D));
    auto mix_all = buffer::of(std::vector<float>(sz(T * hc), 1.0f / static_cast<float>(hc)));
    for (auto* b : {&f, &avg, &mix_all}) TROUPE_TRY(*b);
    features = std::move(*f);
    averaged = std::move(*avg);
    equal_mix = std::move(*mix_all);
    for (i64 k = 0; k < n_targets; ++k) {
      std::vector<i64> rows(sz(T));
      for (i64 t = 0; t < T; ++t) rows[sz(t)] = t * n_targets + k;
      auto d = index_buffer::of(rows);
      TROUPE_TRY(d);
      feature_rows.push_back(std::move(*d));
    }
  }

  // Embeddings, copied into every stream; the first site collapses stream 0 only.
  TROUPE_TRY(embed_rows(s.embed.data(), d_tokens.data(), T, hc, D, m.streams.data()));
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    auto& L = s.layers[l];
    const auto& host = s.W->layers[l];
    if (host.engram_index >= 0) TROUPE_TRY(s.engram(host, L, hash_ids, T, m.streams));
    if (dspark_features != nullptr)
      for (i64 k = 0; k < n_targets; ++k) {
        if (targets[sz(k)] != static_cast<i64>(l)) continue;
        TROUPE_TRY(hc_collapse(m.streams.data(), equal_mix.data(), T, hc, D, averaged.data()));
        TROUPE_TRY(copy_rows(averaged.data(), nullptr, features.data(), feature_rows[sz(k)].data(),
                             T, D));
      }
    TROUPE_TRY(s.site(m, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, L.attn_norm,
                      [&] { return s.attention(l, m.x, call, m.out); }));
    TROUPE_TRY(s.site(m, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, L.ffn_norm,
                      [&] { return s.moe(c, L, s.placement, &s.routed, m.x, T, m.out); }));
  }
  // Final collapse, norm and LM head.
  TROUPE_TRY(hc_collapse(m.streams.data(), m.pre.data(), T, hc, D, m.x.data()));
  TROUPE_TRY(rms_norm(m.x.data(), T, D, s.norm.data(), eps));
  TROUPE_TRY(s.project(m.x.data(), T, D, s.lm_head.data(), V, logits->data()));
  auto host = logits->download();
  TROUPE_TRY(host);
  if (dspark_features != nullptr) {
    auto f = features.download();
    TROUPE_TRY(f);
    *dspark_features = std::move(*f);
  }
  for (std::size_t b = 0; b < batch.size(); ++b) {
    auto& seq = *call.seqs[b];
    seq.length += static_cast<i64>(batch[b].tokens.size());
    if (has_engram) engram_remember(*s.W, seq.engram_recent, batch[b].tokens);
  }
  return std::move(*host);
}

}  // namespace troupe::kernels::cuda
