// The forward pass on the device (kernels/cuda/device_model.hpp). Each step mirrors a line of
// kernels/model.cpp's `run`, `attention_site` (window layers) and `moe_site`; the comments name
// what differs.
#include "kernels/cuda/device_model.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "kernels/cpu_ops.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/ep_dispatch.hpp"
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
};

// A sequence's place in the rings and how far it has run.
struct sequence_state {
  i64 slot = 0;
  i64 length = 0;  // tokens run = the ring's end
  std::vector<i64> engram_recent;  // its last compressed ids (engram_remember)
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

}  // namespace

struct device_model::state {
  const model::weights* W = nullptr;  // the CPU model's: its Engram tables and token map
  text_config c;
  std::int64_t max_sequences = 0, capacity = 0;
  lt_gemm gemm;
  buffer embed, norm, lm_head, rope_inv_freq;
  float rope_scaling = 1.0f;
  std::int64_t rope_dim = 0;
  std::vector<device_layer> layers;
  expert_placement one_rank;  // every routed expert on this device
  std::map<sequence_id, sequence_state> sequences;
  std::vector<bool> slot_used;
  sequence_id next_id = 1;

  explicit state(lt_gemm g) : gemm(std::move(g)) {}

  // y[m, n] (stride ldy) = x[m, k] (stride ldx) · w[n, k]ᵀ.
  result<bool> project(const float* x, i64 m, i64 k, const float* w, i64 n, float* y,
                       i64 ldx = 0, i64 ldy = 0) {
    return gemm.run_f32(x, ldx == 0 ? k : ldx, w, k, y, ldy == 0 ? n : ldy, m, n, k);
  }

  result<bool> mixes(const buffer& streams, i64 T, const buffer& fn, const buffer& scale,
                     const buffer& base, buffer& flat, buffer& mix, buffer& pre, buffer& post,
                     buffer& comb);
  result<bool> attention(device_layer& L, const buffer& a, i64 T, const index_buffer& positions,
                         const index_buffer& slots, const index_buffer& chunk_start,
                         const index_buffer& chunk_row, const index_buffer& ring_begin,
                         const index_buffer& ring_src, const index_buffer& ring_dst,
                         i64 ring_rows, buffer& out);
  result<bool> moe(device_layer& L, const buffer& a, i64 T, buffer& y);
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
  for (i64 l = 0; l < c.num_hidden_layers; ++l) {
    const auto& L = W.layers[sz(l)];
    if (L.ratio != 0)
      return r::failure("device_model: layer " + std::to_string(l) + " has compress ratio " +
                        std::to_string(L.ratio) +
                        "; the device runs sliding-window layers only (ratio 0) so far: the "
                        "CSA2 compressor, indexer top-k and compressed attention are not built");
  }
  if (options.max_sequences < 1)
    return r::failure("device_model: max_sequences must be at least 1, not " +
                      std::to_string(options.max_sequences));
  const i64 capacity = c.sliding_window + swa_rollback_tokens;
  if (capacity > swa_max_keys || c.sliding_window < 1)
    return r::failure("device_model: a window of " + std::to_string(c.sliding_window) +
                      " tokens (ring " + std::to_string(capacity) + ") is more than the " +
                      std::to_string(swa_max_keys) + " keys the attention kernel takes");
  auto gemm = lt_gemm::create();
  if (!gemm) return r::failure(gemm.error());
  auto s = std::make_unique<state>(std::move(*gemm));
  s->W = &W;
  s->c = c;
  s->max_sequences = options.max_sequences;
  s->capacity = capacity;
  s->slot_used.assign(sz(options.max_sequences), false);
  auto placement = place_experts(static_cast<std::int32_t>(c.n_routed_experts), 1);
  if (!placement) return r::failure(placement.error());
  s->one_rank = std::move(*placement);

  std::string error;
  auto up = [&](const loaded::matrix& x) {
    if (!error.empty()) return buffer{};
    auto b = buffer::of(x.v);
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
  s->rope_inv_freq = up(loaded::matrix{W.rope_main.inv_freq});
  s->rope_scaling = W.rope_main.scaling;
  s->rope_dim = W.rope_main.rope_dim;
  for (const auto& L : W.layers) {
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
    if (L.engram_index >= 0) {
      loaded::matrix weight{std::vector<float>(L.engram_q.v.size())};
      for (std::size_t i = 0; i < weight.v.size(); ++i)
        weight.v[i] = L.engram_q.v[i] * L.engram_k.v[i];
      d.engram_wkv = up(L.engram_wkv);
      d.engram_weight = up(weight);
    }
    if (error.empty()) {
      auto rings = buffer::zeros(sz(options.max_sequences * capacity * c.head_dim));
      if (!rings) return r::failure(rings.error());
      d.rings = std::move(*rings);
    }
    s->layers.push_back(std::move(d));
  }
  if (!error.empty()) return r::failure("device_model: uploading the weights: " + error);
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
  s.sequences[id] = sequence_state{free - s.slot_used.begin(), 0, {}};
  return id;
}

result<bool> device_model::close_sequence(sequence_id id) {
  auto it = s_->sequences.find(id);
  if (it == s_->sequences.end())
    return result<bool>::failure("device_model: no sequence " + std::to_string(id));
  s_->slot_used[sz(it->second.slot)] = false;
  s_->sequences.erase(it);
  return true;
}

result<std::int64_t> device_model::length(sequence_id id) const {
  auto it = s_->sequences.find(id);
  if (it == s_->sequences.end())
    return result<std::int64_t>::failure("device_model: no sequence " + std::to_string(id));
  return it->second.length;
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

// model.cpp's attention_site for a window layer: queries, the shared K=V row, attention over
// the ring and the call's own rows, the rows pushed into the ring, the grouped output
// projection.
result<bool> device_model::state::attention(
    device_layer& L, const buffer& a, i64 T, const index_buffer& positions,
    const index_buffer& slots, const index_buffer& chunk_start, const index_buffer& chunk_row,
    const index_buffer& ring_begin, const index_buffer& ring_src, const index_buffer& ring_dst,
    i64 ring_rows, buffer& out) {
  const i64 D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim, qr = c.q_lora_rank;
  const i64 G = c.o_groups, R = c.o_lora_rank;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  auto q_res = buffer::zeros(sz(T * qr));
  auto q = buffer::zeros(sz(T * H * hd));
  auto kv = buffer::zeros(sz(T * hd));
  auto attn = buffer::zeros(sz(T * H * hd));
  auto grouped = buffer::zeros(sz(T * G * R));
  TROUPE_TRY(q_res);
  TROUPE_TRY(q);
  TROUPE_TRY(kv);
  TROUPE_TRY(attn);
  TROUPE_TRY(grouped);
  TROUPE_TRY(project(a.data(), T, D, L.wq_a.data(), qr, q_res->data()));
  TROUPE_TRY(rms_norm(q_res->data(), T, qr, L.q_norm.data(), eps));
  TROUPE_TRY(project(q_res->data(), T, qr, L.wq_b.data(), H * hd, q->data()));
  TROUPE_TRY(project(a.data(), T, D, L.wkv.data(), hd, kv->data()));
  TROUPE_TRY(rope_rows(q->data(), T * H, hd, rope_inv_freq.data(), rope_dim, rope_scaling,
                       positions.data(), H, false));
  TROUPE_TRY(rms_norm(kv->data(), T, hd, L.kv_norm.data(), eps));
  TROUPE_TRY(rope_rows(kv->data(), T, hd, rope_inv_freq.data(), rope_dim, rope_scaling,
                       positions.data(), 1, false));
  // fake_quant_fp8_block32 leaves a row whose width is not a multiple of 32 as it is.
  if (hd % 32 == 0) TROUPE_TRY(quant_fp8_blocks(kv->data(), T * hd, 32));

  // Every call in the kernel's prefill form: a query reads its ring before its sequence's
  // first position in this call and the call's rows from there on (a decode step is a chunk
  // of one).
  swa_decode_args args;
  args.q = q->data();
  args.rings = L.rings.data();
  args.positions = positions.data();
  args.ring_begin = ring_begin.data();
  args.sinks = L.attn_sink.data();
  args.inv_freq = rope_inv_freq.data();
  args.out = attn->data();
  args.batch = T;
  args.heads = H;
  args.head_dim = hd;
  args.capacity = capacity;
  args.window = c.sliding_window;
  args.rope_dim = rope_dim;
  args.scaling = 1.0f / std::sqrt(static_cast<float>(hd));
  args.rope_scaling = rope_scaling;
  args.chunk = kv->data();
  args.sequence = slots.data();
  args.chunk_start = chunk_start.data();
  args.chunk_row = chunk_row.data();
  TROUPE_TRY(swa_decode_attention(args));
  // Then the rows join the rings (only each sequence's last `capacity` rows: the others
  // would be overwritten in the same slots).
  TROUPE_TRY(copy_rows(kv->data(), ring_src.data(), L.rings.data(), ring_dst.data(), ring_rows,
                       hd));

  const i64 per_group = H * hd / G;
  for (i64 g = 0; g < G; ++g)
    TROUPE_TRY(project(attn->data() + g * per_group, T, per_group,
                       L.wo_a.data() + g * R * per_group, R, grouped->data() + g * R, H * hd,
                       G * R));
  TROUPE_TRY(project(grouped->data(), T, G * R, L.wo_b.data(), D, out.data()));
  return true;
}

// model.cpp's moe_site: the router on the device, the dispatch plan on the host, one GEMM pair
// per expert on its rows, the copies combined per token, then the shared expert added. The
// CPU adds a token's experts in expert order; the combine adds them in top-k slot order
// (the same terms, another rounding order).
result<bool> device_model::state::moe(device_layer& L, const buffer& a, i64 T, buffer& y) {
  const i64 D = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  const i64 k = std::min(c.num_experts_per_tok, E);
  const auto limit = static_cast<float>(c.swiglu_limit);
  auto scores = buffer::zeros(sz(T * E));
  auto chosen = index_buffer::zeros(sz(T * k));
  auto chosen_w = buffer::zeros(sz(T * k));
  TROUPE_TRY(scores);
  TROUPE_TRY(chosen);
  TROUPE_TRY(chosen_w);
  TROUPE_TRY(project(a.data(), T, D, L.gate.data(), E, scores->data()));
  TROUPE_TRY(route_tokens(scores->data(), L.gate_bias.data(), T, E, k, router_scoring_of(c),
                          static_cast<float>(c.gate_temp), c.norm_topk_prob,
                          static_cast<float>(c.routed_scaling_factor), chosen->data(),
                          chosen_w->data()));
  auto ids64 = chosen->download();
  auto weights = chosen_w->download();
  TROUPE_TRY(ids64);
  TROUPE_TRY(weights);
  const std::vector<std::int32_t> ids(ids64->begin(), ids64->end());
  auto plan = plan_dispatch(one_rank, ids, static_cast<std::int32_t>(k));
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
  i64 row = 0;
  for (std::size_t slot = 0; slot < plan->expert_counts[0].size(); ++slot) {
    const i64 m = plan->expert_counts[0][slot];
    if (m == 0) continue;
    const auto e = one_rank.local[0][slot];
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

result<std::vector<float>> device_model::forward(std::span<const step_input> batch) {
  using r = result<std::vector<float>>;
  auto& s = *s_;
  const auto& c = s.c;
  const i64 D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  const i64 n_mix = (2 + hc) * hc;
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // The call's tokens, positions and ring bookkeeping, checked before anything runs.
  std::vector<i64> tokens, positions, slots, chunk_start, chunk_row, ring_src, ring_dst;
  std::vector<i64> ring_begin(sz(s.max_sequences), 0);
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const auto it = s.sequences.find(batch[b].sequence);
    if (it == s.sequences.end())
      return r::failure("device_model: no sequence " + std::to_string(batch[b].sequence));
    for (std::size_t o = 0; o < b; ++o)
      if (batch[o].sequence == batch[b].sequence)
        return r::failure("device_model: sequence " + std::to_string(batch[b].sequence) +
                          " twice in one batch");
    const auto& seq = it->second;
    const i64 first_row = static_cast<i64>(tokens.size());
    const i64 n = static_cast<i64>(batch[b].tokens.size());
    // No bounded replay on the device yet: a ring holds everything from position 0 on.
    ring_begin[sz(seq.slot)] = std::max<i64>(0, seq.length - s.capacity);
    for (i64 i = 0; i < n; ++i) {
      const i64 t = batch[b].tokens[sz(i)];
      if (t < 0 || t >= V)
        return r::failure("device_model: sequence " + std::to_string(batch[b].sequence) +
                          " token " + std::to_string(i) + " is " + std::to_string(t) +
                          ", expected 0 <= id < " + std::to_string(V));
      tokens.push_back(t);
      positions.push_back(seq.length + i);
      slots.push_back(seq.slot);
      chunk_start.push_back(seq.length);
      chunk_row.push_back(first_row);
      if (i >= n - s.capacity) {
        ring_src.push_back(first_row + i);
        ring_dst.push_back(seq.slot * s.capacity + (seq.length + i) % s.capacity);
      }
    }
  }
  const i64 T = static_cast<i64>(tokens.size());
  if (T == 0) return std::vector<float>{};
  const bool has_engram = !c.engram_layer_ids.empty();
  if (has_engram && s.W->token_map.empty())
    return r::failure(
        "device_model: the Engram layers need the compressed token map "
        "(model::set_engram_token_map)");
  std::vector<i64> hash_ids;
  if (has_engram) {
    std::vector<const std::vector<i64>*> recent;
    std::vector<i64> seq_begin{0};
    for (const auto& in : batch) {
      recent.push_back(&s.sequences[in.sequence].engram_recent);
      seq_begin.push_back(seq_begin.back() + static_cast<i64>(in.tokens.size()));
    }
    hash_ids = engram_hash_ids(*s.W, recent, seq_begin, tokens, positions);
  }

  auto up = [](const std::vector<i64>& v) { return index_buffer::of(v); };
  auto d_tokens = up(tokens), d_positions = up(positions), d_slots = up(slots);
  auto d_start = up(chunk_start), d_row = up(chunk_row), d_begin = up(ring_begin);
  auto d_src = up(ring_src), d_dst = up(ring_dst);
  for (const auto* b : {&d_tokens, &d_positions, &d_slots, &d_start, &d_row, &d_begin, &d_src,
                        &d_dst})
    TROUPE_TRY(*b);
  std::vector<float> first_stream(sz(T * hc), 0.0f);
  for (i64 t = 0; t < T; ++t) first_stream[sz(t * hc)] = 1.0f;
  auto streams = buffer::zeros(sz(T * hc * D));
  auto expanded = buffer::zeros(sz(T * hc * D));
  auto flat = buffer::zeros(sz(T * hc * D));
  auto mix = buffer::zeros(sz(T * n_mix));
  auto pre = buffer::of(first_stream);  // the mix the next site collapses by
  auto next_pre = buffer::zeros(sz(T * hc));
  auto post = buffer::zeros(sz(T * hc));
  auto comb = buffer::zeros(sz(T * hc * hc));
  auto x = buffer::zeros(sz(T * D));
  auto out = buffer::zeros(sz(T * D));
  auto logits = buffer::zeros(sz(T * V));
  for (const auto* b : {&streams, &expanded, &flat, &mix, &pre, &next_pre, &post, &comb, &x, &out,
                        &logits})
    TROUPE_TRY(*b);

  // Embeddings, copied into every stream; the first site collapses stream 0 only.
  TROUPE_TRY(embed_rows(s.embed.data(), d_tokens->data(), T, hc, D, streams->data()));
  // One site: the mixes of the streams as they are, the collapse by the previous site's mix,
  // the site's norm and its function, the expansion back into the streams.
  auto site = [&](const buffer& fn, const buffer& scale, const buffer& base, const buffer& norm,
                  auto&& run) -> result<bool> {
      TROUPE_TRY(s.mixes(*streams, T, fn, scale, base, *flat, *mix, *next_pre, *post, *comb));
    TROUPE_TRY(hc_collapse(streams->data(), pre->data(), T, hc, D, x->data()));
    TROUPE_TRY(rms_norm(x->data(), T, D, norm.data(), eps));
    TROUPE_TRY(run());
    TROUPE_TRY(hc_expand(streams->data(), out->data(), post->data(), comb->data(), T, hc, D,
                         expanded->data()));
    std::swap(*streams, *expanded);
    std::swap(*pre, *next_pre);
    return true;
  };
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    auto& L = s.layers[l];
    const auto& host = s.W->layers[l];
    if (host.engram_index >= 0) TROUPE_TRY(s.engram(host, L, hash_ids, T, *streams));
    TROUPE_TRY(site(L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, L.attn_norm, [&] {
      return s.attention(L, *x, T, *d_positions, *d_slots, *d_start, *d_row, *d_begin, *d_src,
                         *d_dst, static_cast<i64>(ring_src.size()), *out);
    }));
    TROUPE_TRY(site(L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, L.ffn_norm,
                    [&] { return s.moe(L, *x, T, *out); }));
  }
  // Final collapse, norm and LM head.
  TROUPE_TRY(hc_collapse(streams->data(), pre->data(), T, hc, D, x->data()));
  TROUPE_TRY(rms_norm(x->data(), T, D, s.norm.data(), eps));
  TROUPE_TRY(s.project(x->data(), T, D, s.lm_head.data(), V, logits->data()));
  auto host = logits->download();
  TROUPE_TRY(host);
  for (const auto& in : batch) {
    auto& seq = s.sequences[in.sequence];
    seq.length += static_cast<i64>(in.tokens.size());
    if (has_engram) engram_remember(*s.W, seq.engram_recent, in.tokens);
  }
  return std::move(*host);
}

}  // namespace troupe::kernels::cuda
