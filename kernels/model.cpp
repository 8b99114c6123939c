#include "kernels/model.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <string>

#include "kernels/cpu_ops.hpp"
#include "kernels/model_weights.hpp"
#include "kernels/portable_math.hpp"
#include "kernels/worker_pool.hpp"

namespace troupe::kernels {

namespace {

using i64 = std::int64_t;
constexpr float neg_inf = -std::numeric_limits<float>::infinity();

std::size_t sz(i64 v) { return static_cast<std::size_t>(v); }

std::string shape_text(const std::vector<i64>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

using loaded::expert_weights;
using loaded::layer_weights;
using loaded::matrix;

}  // namespace

result<loaded::matrix> tensor_cache::get(const std::string& name,
                                        const std::function<result<loaded::matrix>()>& load) {
  std::lock_guard lock(mutex_);
  if (auto i = tensors_.find(name); i != tensors_.end()) return i->second;
  auto r = load();
  if (r) tensors_.emplace(name, *r);
  return r;
}

result<loaded::matrix> model::weights::load(const std::string& hf,
                                            const std::vector<std::int64_t>& shape) const {
  const auto n = name(hf);
  std::vector<i64> found;
  auto v = ckpt->load_float(n, &found, cfg.fp8_block_rows(), cfg.fp8_block_cols());
  if (!v) return result<matrix>::failure(v.error());
  if (found != shape)
    return result<matrix>::failure("tensor " + n + ": expected shape " + shape_text(shape) +
                                   ", found " + shape_text(found));
  return matrix{std::move(*v)};
}

namespace {

// Within one forward a compressed layer attends over the compressed KV of the last KV source
// before it, masked by the top-k of the last index source before it, which scored the keys of
// the last index source before *that* one that owns its keys (is also a KV source); the
// candidate mask of the candidate source constrains later index sources the same way. The
// lengths agree in every call exactly when each pair of sources pools at the same ratio
// (sources see the same tokens); the reference fails on a mismatch. Checked once here so that
// a forward call never fails half way. Returns the problem, or "" when there is none.
std::string check_csa2_schedule(const text_config& c) {
  auto owner_of = [&](i64 index_source) {
    i64 owner = -1;
    for (i64 l = 0; l <= index_source; ++l)
      if (c.is_kv_source(l) && c.is_index_source(l)) owner = l;
    return owner;
  };
  auto ratio = [&](i64 l) { return c.compress_ratios[sz(l)]; };
  for (i64 l = 0; l < c.num_hidden_layers; ++l) {
    if (ratio(l) == 0) continue;
    const i64 kv = c.kv_source_of(l), idx = c.index_source_of(l);
    const i64 keys = idx >= 0 ? owner_of(idx) : -1;
    if (kv >= 0 && keys >= 0 && ratio(kv) != ratio(keys))
      return "layer " + std::to_string(l) + " attends over the compressed KV of layer " +
             std::to_string(kv) + " (ratio " + std::to_string(ratio(kv)) +
             ") with a top-k over the keys of layer " + std::to_string(keys) + " (ratio " +
             std::to_string(ratio(keys)) + "): expected equal ratios";
    const i64 cand = c.candidate_source_layer_id;
    if (c.is_index_source(l) && cand >= 0 && cand < l && keys >= 0) {
      const i64 cand_keys = owner_of(cand);
      if (cand_keys >= 0 && ratio(cand_keys) != ratio(keys))
        return "index source " + std::to_string(l) + " scores the keys of layer " +
               std::to_string(keys) + " (ratio " + std::to_string(ratio(keys)) +
               ") inside candidates selected over the keys of layer " + std::to_string(cand_keys) +
               " (ratio " + std::to_string(ratio(cand_keys)) + "): expected equal ratios";
    }
  }
  return "";
}

}  // namespace

model::model(model&&) noexcept = default;
model& model::operator=(model&&) noexcept = default;
model::~model() = default;

const model_config& model::config() const { return w_->cfg; }
const text_config& model::text() const { return w_->cfg.text; }

result<model> model::load(const std::filesystem::path& dir, model_options options) {
  auto cfg = load_model_config(dir);
  if (!cfg) return result<model>::failure(cfg.error());
  auto ck = checkpoint::open(dir);
  if (!ck) return result<model>::failure(ck.error());
  set_blas_threads(options.threads);

  model m;
  m.w_ = std::make_unique<weights>();
  auto& w = *m.w_;
  w.cfg = std::move(*cfg);
  w.workers = std::make_unique<worker_pool>(std::max(1, options.threads));
  w.batch_invariant = options.batch_invariant;
  w.jitter = static_cast<float>(options.jitter);
  w.jitter_seed = options.jitter_seed;
  if (options.expert_shards < 1 || w.cfg.text.n_routed_experts % options.expert_shards != 0)
    return result<model>::failure("model: expert_shards " + std::to_string(options.expert_shards) +
                                  " does not divide n_routed_experts " +
                                  std::to_string(w.cfg.text.n_routed_experts));
  w.expert_shards = options.expert_shards;
  if (options.ep) {
    const auto& ep = *options.ep;
    if (options.expert_shards > 1)
      return result<model>::failure("model: expert_shards and an EP group exclude each other");
    if (auto ok = check_placement(ep.placement,
                                  static_cast<std::int32_t>(w.cfg.text.n_routed_experts));
        !ok)
      return result<model>::failure("model: EP group: " + ok.error());
    if (!ep.exchange || ep.exchange->ranks() != ep.placement.ranks || ep.rank < 0
        || ep.rank >= ep.placement.ranks)
      return result<model>::failure("model: EP rank " + std::to_string(ep.rank) + " of a "
                                    + std::to_string(ep.placement.ranks)
                                    + "-rank placement needs an exchange of that many ranks");
    w.ep = ep;
  }
  w.routed_counts = std::make_unique<std::atomic<std::uint64_t>[]>(
      sz(std::max<i64>(0, w.cfg.text.n_routed_experts)));
  w.ckpt.emplace(std::move(*ck));
  w.released_names = !w.ckpt->contains("model.embed.weight") && w.ckpt->contains("embed.weight");
  const auto& c = w.cfg.text;
  const i64 D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim, qr = c.q_lora_rank;
  const i64 hc = c.hc_mult, mix = (2 + hc) * hc, I = c.moe_intermediate_size;
  const i64 G = c.o_groups, R = c.o_lora_rank;
  std::string failure;
  auto get = [&](matrix& out, const std::string& name, std::vector<i64> shape) {
    if (!failure.empty()) return;
    auto r = options.tensors
               ? options.tensors->get(w.name(name), [&] { return w.load(name, shape); })
               : w.load(name, shape);
    if (!r)
      failure = r.error();
    else
      out = std::move(*r);
  };
  // What every layer has, backbone or draft stage: the attention's projections, norms and sinks,
  // the two mHC mixes, the norms, the router and its experts, the shared expert.
  // `held` (null: every one): the routed experts this model loads.
  auto layer_core = [&](layer_weights& L, const std::string& p, i64 n_experts,
                        const std::vector<std::int32_t>* held) {
    get(L.wq_a, p + "attn.wq_a.weight", {qr, D});
    get(L.q_norm, p + "attn.q_norm.weight", {qr});
    get(L.wq_b, p + "attn.wq_b.weight", {H * hd, qr});
    get(L.wkv, p + "attn.wkv.weight", {hd, D});
    get(L.kv_norm, p + "attn.kv_norm.weight", {hd});
    get(L.wo_a, p + "attn.wo_a.weight", {G * R, H * hd / G});
    get(L.wo_b, p + "attn.wo_b.weight", {D, G * R});
    get(L.attn_sink, p + "attn.attn_sink", {H});
    get(L.hc_attn_fn, p + "hc_attn_fn", {mix, hc * D});
    get(L.hc_attn_base, p + "hc_attn_base", {mix});
    get(L.hc_attn_scale, p + "hc_attn_scale", {3});
    get(L.hc_ffn_fn, p + "hc_ffn_fn", {mix, hc * D});
    get(L.hc_ffn_base, p + "hc_ffn_base", {mix});
    get(L.hc_ffn_scale, p + "hc_ffn_scale", {3});
    get(L.attn_norm, p + "attn_norm.weight", {D});
    get(L.ffn_norm, p + "ffn_norm.weight", {D});
    get(L.gate, p + "ffn.gate.weight", {n_experts, D});
    get(L.gate_bias, p + "ffn.gate.bias", {n_experts});
    L.experts.resize(sz(n_experts));
    for (i64 e = 0; e < n_experts; ++e) {
      if (held != nullptr && std::find(held->begin(), held->end(), e) == held->end()) continue;
      const std::string q = p + "ffn.experts." + std::to_string(e) + ".";
      get(L.experts[sz(e)].w1, q + "w1.weight", {I, D});
      get(L.experts[sz(e)].w2, q + "w2.weight", {D, I});
      get(L.experts[sz(e)].w3, q + "w3.weight", {I, D});
    }
    get(L.shared.w1, p + "ffn.shared_experts.w1.weight", {I, D});
    get(L.shared.w2, p + "ffn.shared_experts.w2.weight", {D, I});
    get(L.shared.w3, p + "ffn.shared_experts.w3.weight", {I, D});
  };
  get(w.embed, "model.embed.weight", {c.vocab_size, D});
  get(w.norm, "model.norm.weight", {D});
  if (w.ckpt->contains(w.name("lm_head.weight")) ||
      !(c.tie_word_embeddings || w.cfg.tie_word_embeddings))
    get(w.lm_head, "lm_head.weight", {c.vocab_size, D});
  else
    w.lm_head = w.embed;
  w.layers.resize(sz(c.num_hidden_layers));
  for (i64 l = 0; l < c.num_hidden_layers && failure.empty(); ++l) {
    auto& L = w.layers[sz(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    L.ratio = c.compress_ratios[sz(l)];
    L.kv_source = c.is_kv_source(l);
    L.index_source = c.is_index_source(l);
    L.owns_index_keys = L.index_source && L.kv_source;
    L.candidate_source = l == c.candidate_source_layer_id;
    L.uses_candidates = c.candidate_source_layer_id >= 0 && c.candidate_source_layer_id < l;
    layer_core(L, p, c.n_routed_experts,
               w.ep ? &w.ep->placement.local[sz(w.ep->rank)] : nullptr);
    if (L.kv_source) {
      get(L.c_wkv, p + "attn.compressor.wkv.weight", {hd, D});
      if (L.ratio > 1) get(L.c_wgate, p + "attn.compressor.wgate.weight", {hd, D});
      get(L.c_norm, p + "attn.compressor.norm.weight", {hd});
    }
    if (L.index_source) {
      const i64 nh = c.index_n_heads, idh = c.index_head_dim;
      get(L.i_wq_b, p + "attn.indexer.wq_b.weight", {nh * idh, qr});
      get(L.i_weights, p + "attn.indexer.weights_proj.weight", {nh, D});
      if (L.owns_index_keys) {
        get(L.i_wk, p + "attn.indexer.wk.weight", {idh, hd});
        get(L.i_k_norm, p + "attn.indexer.k_norm.weight", {idh});
      }
    }
    L.engram_index = c.engram_index(l);
    if (L.engram_index >= 0 && failure.empty()) {
      const i64 rows = c.engram_num_embeddings[sz(L.engram_index)];
      const i64 cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
      auto table = w.ckpt->get(w.name(p + "engram.embed.weight"));
      if (!table) {
        failure = table.error();
        break;
      }
      if (table->shape() != std::vector<i64>{rows, c.engram_head_dim}) {
        failure = "tensor " + table->name() + ": expected shape " +
                  shape_text({rows, c.engram_head_dim}) + ", found " + shape_text(table->shape());
        break;
      }
      const auto tt = table->type();
      if (tt != dtype::F32 && tt != dtype::BF16 && tt != dtype::F16 && tt != dtype::F8_E4M3) {
        failure = "tensor " + table->name() + ": expected dtype F32, BF16, F16 or F8_E4M3, found " +
                  std::string(dtype_name(tt));
        break;
      }
      L.engram_table = *table;
      if (table->type() == dtype::F8_E4M3) {
        auto scale = w.ckpt->get(w.name(p + "engram.embed.scale"));
        if (!scale) {
          failure = scale.error();
          break;
        }
        L.engram_scale = *scale;
      }
      get(L.engram_wkv, p + "engram.wkv.weight", {D * (hc + 1), cols * c.engram_head_dim});
      get(L.engram_q, p + "engram.q_weight", {hc, D});
      get(L.engram_k, p + "engram.k_weight", {hc, D});
    }
  }
  // The DSpark draft stages, when the checkpoint has them (released names `mtp.<stage>.*`).
  const i64 stages = c.num_nextn_predict_layers;
  if (failure.empty() && stages > 0 && w.ckpt->contains("mtp.0.main_proj.weight")) {
    w.draft_cfg = c;
    w.draft_cfg.n_routed_experts = c.dspark_n_routed_experts;
    w.draft_cfg.num_experts_per_tok = c.dspark_num_experts_per_tok;
    const i64 E = c.dspark_n_routed_experts, rank = c.dspark_markov_rank;
    const auto n_targets = static_cast<i64>(c.dspark_target_layer_ids.size());
    get(w.main_proj, "mtp.0.main_proj.weight", {D, n_targets * D});
    get(w.main_norm, "mtp.0.main_norm.weight", {D});
    w.draft_layers.resize(sz(stages));
    for (i64 i = 0; i < stages && failure.empty(); ++i) {
      auto& L = w.draft_layers[sz(i)];
      const std::string p = "mtp." + std::to_string(i) + ".";
      layer_core(L, p, E, nullptr);
    }
    const std::string last = "mtp." + std::to_string(stages - 1) + ".";
    get(w.draft_norm, last + "norm.weight", {D});
    get(w.markov_embed, last + "markov_head.embed.weight", {c.vocab_size, rank});
    get(w.markov_head, last + "markov_head.head.weight", {c.vocab_size, rank});
    get(w.confidence, last + "confidence_head.proj.weight", {1, D + rank});
    if (!failure.empty()) w.draft_layers.clear();
  }
  if (!failure.empty()) return result<model>::failure(failure);
  if (auto schedule = check_csa2_schedule(c); !schedule.empty())
    return result<model>::failure((dir / "config.json").string() + ": " + schedule);
  w.rope_main = make_rope_table(c.rope_main, hd);
  w.rope_compress = make_rope_table(c.rope_compress, hd);
  if (!c.engram_layer_ids.empty()) {
    w.engram = engram_hash_layout::from_config(c);
    for (std::size_t i = 0; i < w.engram.primes.size(); ++i) {
      const auto& pr = w.engram.primes[i];
      const i64 need = w.engram.offsets[i].back() + pr.back();
      if (need > c.engram_num_embeddings[i])
        return result<model>::failure("engram layer " + std::to_string(c.engram_layer_ids[i]) +
                                      ": the hash buckets need " + std::to_string(need) +
                                      " rows, engram_num_embeddings has " +
                                      std::to_string(c.engram_num_embeddings[i]));
    }
  }
  return m;
}

result<bool> model::set_expert_placement(std::optional<expert_placement> placement) {
  using r = result<bool>;
  auto& W = *w_;
  if (W.ep)
    return r::failure("expert placement: this model is rank " + std::to_string(W.ep->rank)
                      + " of an EP group, which places the experts");
  if (!placement) {
    W.placement.reset();
    return true;
  }
  if (W.expert_shards > 1)
    return r::failure("expert placement: the model evaluates " + std::to_string(W.expert_shards) +
                      " expert shards already (model_options::expert_shards)");
  if (auto ok = check_placement(*placement,
                                static_cast<std::int32_t>(W.cfg.text.n_routed_experts));
      !ok)
    return ok;
  W.placement = std::move(placement);
  return true;
}

std::vector<std::uint64_t> model::expert_counts() const {
  const auto& W = *w_;
  std::vector<std::uint64_t> out(sz(W.cfg.text.n_routed_experts));
  for (std::size_t e = 0; e < out.size(); ++e)
    out[e] = W.routed_counts[e].load(std::memory_order_relaxed);
  return out;
}

result<bool> model::set_engram_token_map(std::vector<std::int64_t> map) {
  const auto& c = w_->cfg.text;
  if (static_cast<i64>(map.size()) < c.vocab_size)
    return result<bool>::failure("engram token map: expected " + std::to_string(c.vocab_size) +
                                 " entries, found " + std::to_string(map.size()));
  for (std::size_t i = 0; i < map.size(); ++i)
    if (map[i] < 0 || map[i] >= c.engram_compressed_vocab_size)
      return result<bool>::failure("engram token map: entry " + std::to_string(i) + " is " +
                                   std::to_string(map[i]) + ", expected 0 <= id < " +
                                   std::to_string(c.engram_compressed_vocab_size));
  w_->token_map = std::move(map);
  return true;
}

std::shared_ptr<block_pool> model::kv_pool() const { return w_->pool; }

sequence_cache model::new_sequence(kv_layout layout) const {
  const auto& c = w_->cfg.text;
  sequence_cache s;
  s.owner = w_.get();
  s.layers.resize(sz(c.num_hidden_layers));
  for (i64 l = 0; l < c.num_hidden_layers; ++l) {
    auto& L = s.layers[sz(l)];
    L.window = swa_ring(c.head_dim, c.sliding_window + swa_rollback_tokens);
    const auto& lw = w_->layers[sz(l)];
    if (lw.kv_source) {
      L.is_kv_source = true;
      auto& cc = L.compressed;
      cc.ratio = lw.ratio;
      const i64 rows_per_block = std::max<i64>(1, kv_block_tokens / lw.ratio);
      auto pool = layout == kv_layout::paged ? w_->pool : nullptr;
      cc.kv = paged_rows(c.head_dim, rows_per_block, pool);
      cc.index_keys = paged_rows(c.index_head_dim, rows_per_block, pool);
    }
  }
  return s;
}

namespace {

// y[M, N] = x[M, K] (row stride ldx) · w[N, K]ᵀ (row stride ldw), y row stride ldy.
void gemm_nt(i64 M, i64 N, i64 K, const float* x, i64 ldx, const float* w, i64 ldw, float* y,
             i64 ldy) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), 1.0f, x, static_cast<blasint>(ldx),
              w, static_cast<blasint>(ldw), 0.0f, y, static_cast<blasint>(ldy));
}

// One query token's attention over nk keys (K = V: the rows of kbuf, [nk, hd]): scores
// [H, nk] = q · Kᵀ × scaling, a softmax with each head's sink in the denominator, out [H, hd] =
// P · K, then the inverse RoPE at position p. probs is [H, nk] scratch.
void sink_attention(const float* q, const float* kbuf, i64 H, i64 nk, i64 hd, float scaling,
                    const float* sinks, float* probs, float* out, const rope_table& rope, i64 p) {
  gemm_nt(H, nk, hd, q, hd, kbuf, hd, probs, nk);
  for (i64 h = 0; h < H; ++h) {
    float* lg = probs + h * nk;
    const float sink = sinks[h];
    float mx = sink;
    for (i64 k = 0; k < nk; ++k) mx = std::max(mx, lg[k] = lg[k] * scaling);
    float sum = std::exp(sink - mx);
    for (i64 k = 0; k < nk; ++k) sum += lg[k] = std::exp(lg[k] - mx);
    for (i64 k = 0; k < nk; ++k) lg[k] /= sum;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(H),
              static_cast<blasint>(hd), static_cast<blasint>(nk), 1.0f, probs,
              static_cast<blasint>(nk), kbuf, static_cast<blasint>(hd), 0.0f, out,
              static_cast<blasint>(hd));
  for (i64 h = 0; h < H; ++h) apply_rope(out + h * hd, hd, rope, p, /*inverse=*/true);
}

// fn(i) for every i in [0, n), shared out over the pool's threads: each takes the next i until
// none is left, so a thread the OS preempts (other work on the same cores) delays the section
// by one i, not by its share. Each i is computed the same way whichever thread runs it.
template <class F>
void parallel_for(i64 n, worker_pool& pool, F&& fn) {
  const i64 parts = std::min<i64>(pool.size(), n);
  if (parts <= 1) {
    for (i64 i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<i64> next{0};
  pool.run(static_cast<int>(parts), [&](int) {
    for (i64 i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  });
}

// How projections over many rows run: one BLAS GEMM (fast; its reduction order may depend on
// how many rows there are), or batch-invariant (gemm_nt_invariant, its columns split over the
// pool: a row's result depends on that row alone, so a sequence's logits are bitwise the same
// whatever shares its batch and however its prefill is chunked).
struct gemm_mode {
  bool per_row = false;
  worker_pool* pool = nullptr;  // per_row: the threads that share the columns (null: the caller)
  float jitter = 0.0f;  // model_options::jitter
  std::uint64_t jitter_seed = 0;
};

// model_options::jitter on y[rows, out] (row stride ldy).
void apply_jitter(const gemm_mode& mode, float* y, i64 rows, i64 out, i64 ldy) {
  for (i64 r = 0; r < rows; ++r) {
    float* row = y + r * ldy;
    double sq = 0.0;
    for (i64 j = 0; j < out; ++j) sq += double(row[j]) * double(row[j]);
    const double amplitude = double(mode.jitter) * std::sqrt(sq / double(std::max<i64>(out, 1)));
    for (i64 j = 0; j < out; ++j) {
      std::uint64_t z = mode.jitter_seed ^ (std::bit_cast<std::uint32_t>(row[j]) * 0x9E3779B97F4A7C15ull) ^
                        (static_cast<std::uint64_t>(j) << 32);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64 finaliser
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const double u = double(z >> 11) * 0x1p-52 - 1.0;  // [-1, 1)
      row[j] = static_cast<float>(double(row[j]) + amplitude * u);
    }
  }
}

// y[rows, out] = x[rows, in] (row stride ldx) · w[out, in]ᵀ, y row stride ldy.
void project(gemm_mode mode, const float* x, i64 rows, i64 in, const float* w, i64 out, float* y,
             i64 ldx = 0, i64 ldy = 0) {
  if (ldx == 0) ldx = in;
  if (ldy == 0) ldy = out;
  if (!mode.per_row) {
    gemm_nt(rows, out, in, x, ldx, w, in, y, ldy);
  } else {
    // The columns in chunks of whole 4-column tiles (the kernel's), eight per thread, taken
    // in turn by the pool's threads; one thread when the work is small.
    const i64 tiles = (out + 3) / 4;
    const i64 threads = mode.pool == nullptr || rows * out * in < (i64{1} << 16)
                            ? 1
                            : std::min<i64>(mode.pool->size(), tiles);
    const i64 chunks = threads == 1 ? 1 : std::min<i64>(tiles, threads * 8);
    auto chunk = [&](i64 ch) {
      gemm_nt_invariant(x, rows, in, ldx, w, tiles * ch / chunks * 4,
                        std::min(out, tiles * (ch + 1) / chunks * 4), y, ldy);
    };
    if (chunks == 1) {
      chunk(0);
    } else {
      parallel_for(chunks, *mode.pool, chunk);
    }
  }
  if (mode.jitter != 0.0f) apply_jitter(mode, y, rows, out, ldy);
}

using portable::sigmoid;

// What the reference's per-forward `shared` dict carries, for one sequence.
struct shared_state {
  const compressed_cache* compress_src = nullptr;  // the group's compressed KV
  const compressed_cache* index_src = nullptr;     // the group's indexer keys
  bool has_topk = false;
  std::vector<std::vector<i64>> topk;  // per token of the call: selected entries
  bool has_candidates = false;
  std::vector<std::vector<char>> candidates;  // per token: entry allowed by the candidate source
};

// The top `k` of `scores` (ties: lower index first), dropping -inf picks.
std::vector<i64> top_finite(const std::vector<float>& scores, i64 k) {
  std::vector<i64> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min<i64>(k, static_cast<i64>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](i64 a, i64 b) {
    if (scores[sz(a)] != scores[sz(b)]) return scores[sz(a)] > scores[sz(b)];
    return a < b;
  });
  idx.resize(sz(k));
  std::erase_if(idx, [&](i64 i) { return scores[sz(i)] == neg_inf; });
  return idx;
}

// One projection of the normalised flattened streams → pre [hc], post [hc], comb [hc, hc]
// (Sinkhorn-normalised), per token.
void hc_mixes(const text_config& c, gemm_mode mode, const std::vector<float>& streams, i64 T,
              const matrix& fn, const matrix& base, const matrix& scale, std::vector<float>& pre,
              std::vector<float>& post, std::vector<float>& comb) {
  const i64 hc = c.hc_mult, D = c.hidden_size, width = hc * D, mix = (2 + hc) * hc;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const auto hc_eps = static_cast<float>(c.hc_eps);
  std::vector<float> flat(streams.begin(), streams.begin() + T * width);
  for (i64 t = 0; t < T; ++t) rms_norm(flat.data() + t * width, width, nullptr, eps);
  std::vector<float> mixes(sz(T * mix));
  project(mode, flat.data(), T, width, fn.data(), mix, mixes.data());
  pre.assign(sz(T * hc), 0.0f);
  post.assign(sz(T * hc), 0.0f);
  comb.assign(sz(T * hc * hc), 0.0f);
  for (i64 t = 0; t < T; ++t)
    portable::hc_token_mixes(mixes.data() + t * mix, scale.data(), base.data(), hc,
                             c.hc_sinkhorn_iters, hc_eps, pre.data() + t * hc,
                             post.data() + t * hc, comb.data() + t * hc * hc);
}

// Σ_j pre_j · stream_j per token → [T, D].
void hc_collapse(const text_config& c, const std::vector<float>& streams,
                 const std::vector<float>& pre, i64 T, std::vector<float>& out) {
  const i64 hc = c.hc_mult, D = c.hidden_size;
  out.resize(sz(T * D));
  for (i64 t = 0; t < T; ++t)
    for (i64 d = 0; d < D; ++d)
      out[sz(t * D + d)] = portable::hc_collapse_at(streams.data(), pre.data(), hc, D, t, d);
}

// streams_k ← post_k · x + Σ_j comb[j][k] · streams_j.
void hc_expand(const text_config& c, const std::vector<float>& x, const std::vector<float>& post,
               const std::vector<float>& comb, i64 T, std::vector<float>& streams) {
  const i64 hc = c.hc_mult, D = c.hidden_size;
  std::vector<float> out(sz(hc * D));
  for (i64 t = 0; t < T; ++t) {
    for (i64 k = 0; k < hc; ++k)
      for (i64 d = 0; d < D; ++d)
        out[sz(k * D + d)] = portable::hc_expand_at(streams.data(), x.data(), post.data(),
                                                    comb.data(), hc, D, t, k, d);
    std::copy(out.begin(), out.end(), streams.begin() + t * hc * D);
  }
}

// The clamped SwiGLU expert on rows x [n, D], scaled per row by `scale` (null: 1), added to y.
void expert_forward(const text_config& c, gemm_mode mode, const expert_weights& e, const float* x,
                    i64 n, const float* scale, float* y_out) {
  const i64 D = c.hidden_size, I = c.moe_intermediate_size;
  const auto limit = static_cast<float>(c.swiglu_limit);
  std::vector<float> g(sz(n * I)), u(sz(n * I));
  project(mode, x, n, D, e.w1.data(), I, g.data());
  project(mode, x, n, D, e.w3.data(), I, u.data());
  for (i64 r = 0; r < n; ++r)
    for (i64 i = 0; i < I; ++i)
      g[sz(r * I + i)] = portable::swiglu(g[sz(r * I + i)], u[sz(r * I + i)], limit,
                                          scale != nullptr, scale != nullptr ? scale[r] : 1.0f);
  project(mode, g.data(), n, I, e.w2.data(), D, y_out);
}

// One row element of an Engram table (F32 / BF16 / F16, or FP8 e4m3 times its block scale;
// the loader admits no other type).
float table_value(const layer_weights& L, i64 row, i64 d, i64 width) {
  const auto& table = *L.engram_table;
  const i64 at = row * width + d;
  const auto* base = table.bytes.data();
  switch (table.type()) {
    case dtype::F32: {
      float v;
      std::memcpy(&v, base + at * 4, 4);
      return v;
    }
    case dtype::BF16:
    case dtype::F16: {
      std::uint16_t b;
      std::memcpy(&b, base + at * 2, 2);
      return table.type() == dtype::BF16 ? bf16_to_float(b) : fp16_to_float(b);
    }
    default: {  // F8_E4M3
      float v = fp8_e4m3_to_float(static_cast<std::uint8_t>(base[at]));
      if (L.engram_scale) {
        const auto& sc = *L.engram_scale;
        const i64 per_row = sc.shape().size() == 2 ? sc.shape()[1] : 1;
        const i64 block = per_row > 0 ? width / per_row : width;
        const i64 si = row * per_row + d / block;
        float scale = 1.0f;
        if (sc.type() == dtype::F8_E8M0)
          scale = fp8_e8m0_to_float(static_cast<std::uint8_t>(sc.bytes[sz(si)]));
        else if (sc.type() == dtype::F32)
          std::memcpy(&scale, sc.bytes.data() + si * 4, 4);
        v *= scale;
      }
      return v;
    }
  }
}

}  // namespace

std::vector<std::int64_t> engram_hash_ids(const model::weights& W,
                                          std::span<const std::vector<std::int64_t>* const> recent,
                                          std::span<const std::int64_t> seq_begin,
                                          std::span<const std::int64_t> tokens,
                                          std::span<const std::int64_t> positions) {
  const auto& c = W.cfg.text;
  const i64 n_engram = static_cast<i64>(c.engram_layer_ids.size()), cols = W.engram.columns;
  const i64 N = c.engram_max_ngram_size;
  const i64 pad = W.token_map[sz(c.engram_pad_id)];
  std::vector<i64> ids(tokens.size() * sz(n_engram * cols));
  std::vector<i64> look(sz(N));
  for (std::size_t s = 0; s < recent.size(); ++s) {
    std::vector<i64> history = *recent[s];  // oldest first
    for (i64 t = seq_begin[s]; t < seq_begin[s + 1]; ++t) {
      history.push_back(W.token_map[sz(tokens[sz(t)])]);
      const i64 p = positions[sz(t)];
      for (i64 k = 0; k < N; ++k) look[sz(k)] = p < k ? pad : history[history.size() - 1 - sz(k)];
      for (i64 e = 0; e < n_engram; ++e)
        W.engram.hash(e, look, ids.data() + (t * n_engram + e) * cols);
    }
  }
  return ids;
}

void engram_remember(const model::weights& W, std::vector<std::int64_t>& recent,
                     std::span<const std::int64_t> tokens) {
  const auto keep = sz(W.cfg.text.engram_max_ngram_size - 1 + swa_rollback_tokens);
  for (const i64 t : tokens) recent.push_back(W.token_map[sz(t)]);
  if (recent.size() > keep)
    recent.erase(recent.begin(), recent.end() - static_cast<std::ptrdiff_t>(keep));
}

void engram_table_rows(const model::weights& W, const loaded::layer_weights& L,
                       std::span<const std::int64_t> hash_ids, std::int64_t T, float* rows) {
  const auto& c = W.cfg.text;
  const i64 n_engram = static_cast<i64>(c.engram_layer_ids.size()), cols = W.engram.columns;
  const i64 ehd = c.engram_head_dim;
  for (i64 t = 0; t < T; ++t)
    for (i64 k = 0; k < cols; ++k) {
      const i64 id = hash_ids[sz((t * n_engram + L.engram_index) * cols + k)];
      float* dst = rows + (t * cols + k) * ehd;
      for (i64 d = 0; d < ehd; ++d) dst[d] = table_value(L, id, d, ehd);
    }
}

namespace {

// What one forward call runs over: the batch, each sequence's token slice, every token's
// position, the projection mode, and the per-sequence state the reference keeps in `shared`.
struct call_context {
  std::span<const sequence_input> batch;
  std::vector<i64> seq_begin;  // sequence s owns tokens [seq_begin[s], seq_begin[s + 1])
  std::vector<i64> positions;
  i64 T = 0, S = 0;
  gemm_mode mode;
  std::vector<shared_state> shared;
};

// Engram at layer L: the hashed table rows, projected to one key per stream and a shared value,
// gated into every stream.
void engram_site(const model::weights& W, const layer_weights& L, const call_context& cx,
                 const std::vector<i64>& hash_ids, std::vector<float>& streams) {
  const auto& c = W.cfg.text;
  const i64 D = c.hidden_size, hc = c.hc_mult, T = cx.T;
  const i64 cols = W.engram.columns;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const gemm_mode mode = cx.mode;
  const i64 ehd = c.engram_head_dim;
  std::vector<float> rows(sz(T * cols * ehd));
  engram_table_rows(W, L, hash_ids, T, rows.data());
  const i64 out_w = D * (hc + 1);
  std::vector<float> kv(sz(T * out_w));
  project(mode, rows.data(), T, cols * ehd, L.engram_wkv.data(), out_w, kv.data());
  std::vector<float> weight(sz(hc * D));
  for (i64 i = 0; i < hc * D; ++i) weight[sz(i)] = L.engram_q[sz(i)] * L.engram_k[sz(i)];
  for (i64 t = 0; t < T; ++t) {
    const float* value = kv.data() + t * out_w + hc * D;
    for (i64 k = 0; k < hc; ++k) {
      float* h = streams.data() + (t * hc + k) * D;
      const float gate =
          portable::engram_gate(h, kv.data() + t * out_w + k * D, weight.data() + k * D, D, eps);
      for (i64 d = 0; d < D; ++d) h[d] = h[d] + gate * value[d];
    }
  }
}

// The attention of layer l on its normed input a [T, D]: queries, the shared K=V window, the
// CSA2 compressor / indexer / compressed KV, attention with sinks, the grouped output
// projection → out [T, D]. Advances the layer's caches. `publish_only` (a KV source's tokens the
// encoder–decoder prefill does not run the decoder on): only the compressor runs — the layer's
// compressed KV and indexer keys are published for later tokens — no attention, no window rows.
void attention_site(const model::weights& W, const layer_weights& L, i64 l, call_context& cx,
                    const std::vector<float>& a, std::vector<float>& out,
                    bool publish_only = false) {
  const auto& c = W.cfg.text;
  const i64 D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim, qr = c.q_lora_rank;
  const i64 win = c.sliding_window, G = c.o_groups, R = c.o_lora_rank;
  const i64 nh = c.index_n_heads, idh = c.index_head_dim, T = cx.T, S = cx.S;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const gemm_mode mode = cx.mode;
  const auto& batch = cx.batch;
  const auto& seq_begin = cx.seq_begin;
  const auto& positions = cx.positions;
  auto& shared = cx.shared;
  const rope_table& rope = L.ratio != 0 ? W.rope_compress : W.rope_main;
  std::vector<float> q_res(sz(T * qr)), q(sz(T * H * hd)), kv(sz(T * hd));
  if (!publish_only) {
    project(mode, a.data(), T, D, L.wq_a.data(), qr, q_res.data());
    for (i64 t = 0; t < T; ++t) rms_norm(q_res.data() + t * qr, qr, L.q_norm.data(), eps);
    project(mode, q_res.data(), T, qr, L.wq_b.data(), H * hd, q.data());
    project(mode, a.data(), T, D, L.wkv.data(), hd, kv.data());
    for (i64 t = 0; t < T; ++t) {
      for (i64 h = 0; h < H; ++h)
        apply_rope(q.data() + (t * H + h) * hd, hd, rope, positions[sz(t)]);
      float* k = kv.data() + t * hd;
      rms_norm(k, hd, L.kv_norm.data(), eps);
      apply_rope(k, hd, rope, positions[sz(t)]);
      fake_quant_fp8_block32(k, hd);
    }
  }

  // Compressor projections (KV sources) and indexer projections (index sources), batched.
  std::vector<float> c_kv, c_gate, i_q, i_w;
  if (L.kv_source) {
    c_kv.resize(sz(T * hd));
    project(mode, a.data(), T, D, L.c_wkv.data(), hd, c_kv.data());
    if (L.ratio > 1) {
      c_gate.resize(sz(T * hd));
      project(mode, a.data(), T, D, L.c_wgate.data(), hd, c_gate.data());
    }
  }
  if (L.index_source && !publish_only) {
    i_q.resize(sz(T * nh * idh));
    i_w.resize(sz(T * nh));
    project(mode, q_res.data(), T, qr, L.i_wq_b.data(), nh * idh, i_q.data());
    project(mode, a.data(), T, D, L.i_weights.data(), nh, i_w.data());
    for (i64 t = 0; t < T; ++t) {
      for (i64 h = 0; h < nh; ++h) {
        float* v = i_q.data() + (t * nh + h) * idh;
        apply_rope(v, idh, W.rope_compress, positions[sz(t)]);
        fake_quant_fp4_block(v, idh, 32, false);
      }
    }
  }

  std::vector<float> attn_out(sz(T * H * hd));
  for (i64 s = 0; s < S; ++s) {
    auto& cache = *batch[sz(s)].cache;
    auto& lc = cache.layers[sz(l)];
    auto& sh = shared[sz(s)];
    const i64 t0 = seq_begin[sz(s)], t1 = seq_begin[sz(s + 1)], n = t1 - t0;
    // The position of the sequence's first token in this call (cache.length, except in the
    // decoder part of an encoder–decoder prefill, which starts at the prompt's tail).
    const i64 start = n > 0 ? positions[sz(t0)] : cache.length;

    if (L.ratio != 0) {
      // Compressor: the groups completing in this call (pre-RoPE latents).
      std::vector<float> latents;
      std::vector<i64> latent_pos;
      if (L.kv_source) {
        auto& cc = lc.compressed;
        if (L.ratio == 1) {
          for (i64 t = t0; t < t1; ++t) {
            latents.insert(latents.end(), c_kv.begin() + t * hd, c_kv.begin() + (t + 1) * hd);
            latent_pos.push_back(cc.groups + (t - t0));
          }
        } else {
          for (i64 t = t0; t < t1; ++t) {
            cc.pending_kv.insert(cc.pending_kv.end(), c_kv.begin() + t * hd,
                                 c_kv.begin() + (t + 1) * hd);
            cc.pending_gate.insert(cc.pending_gate.end(), c_gate.begin() + t * hd,
                                   c_gate.begin() + (t + 1) * hd);
            ++cc.pending_tokens;
            cc.recent_kv.insert(cc.recent_kv.end(), c_kv.begin() + t * hd,
                                c_kv.begin() + (t + 1) * hd);
            cc.recent_gate.insert(cc.recent_gate.end(), c_gate.begin() + t * hd,
                                  c_gate.begin() + (t + 1) * hd);
            ++cc.recent_tokens;
          }
          const i64 r = L.ratio;
          const i64 complete = cc.pending_tokens / r;
          std::vector<float> latent(sz(hd));
          for (i64 g = 0; g < complete; ++g) {
            for (i64 d = 0; d < hd; ++d)
              latent[sz(d)] = portable::compress_pool_at(cc.pending_kv.data(),
                                                         cc.pending_gate.data(), r, hd, g, d);
            latents.insert(latents.end(), latent.begin(), latent.end());
            latent_pos.push_back((cc.groups + g) * r);
          }
          const i64 used = complete * r * hd;
          cc.pending_kv.erase(cc.pending_kv.begin(), cc.pending_kv.begin() + used);
          cc.pending_gate.erase(cc.pending_gate.begin(), cc.pending_gate.begin() + used);
          cc.pending_tokens -= complete * r;
          const i64 keep = r - 1 + swa_rollback_tokens;
          if (cc.recent_tokens > keep) {
            const auto drop = static_cast<std::ptrdiff_t>((cc.recent_tokens - keep) * hd);
            cc.recent_kv.erase(cc.recent_kv.begin(), cc.recent_kv.begin() + drop);
            cc.recent_gate.erase(cc.recent_gate.begin(), cc.recent_gate.begin() + drop);
            cc.recent_tokens = keep;
          }
        }
        const i64 n_lat = static_cast<i64>(latent_pos.size());
        for (i64 g = 0; g < n_lat; ++g) rms_norm(latents.data() + g * hd, hd, L.c_norm.data(), eps);

        // The index keys of the new groups (from the pre-RoPE latents).
        if (L.owns_index_keys && n_lat > 0) {
          std::vector<float> keys(sz(n_lat * idh));
          project(mode, latents.data(), n_lat, hd, L.i_wk.data(), idh, keys.data());
          for (i64 g = 0; g < n_lat; ++g) {
            float* k = keys.data() + g * idh;
            rms_norm(k, idh, L.i_k_norm.data(), eps);
            apply_rope(k, idh, W.rope_compress, latent_pos[sz(g)]);
            fake_quant_fp4_block(k, idh, 32, false);
            // A bounded replay recomputes groups the restored Block KV holds: those stay.
            if (cc.groups + g >= cc.index_keys.size()) cc.index_keys.append(k);
          }
        }
      }
      if (L.owns_index_keys) sh.index_src = &lc.compressed;

      // Indexer: per-query top-k over the group's compressed entries.
      if (L.index_source && !publish_only) {
        const i64 n_idx = sh.index_src != nullptr ? sh.index_src->index_keys.size() : 0;
        if (n_idx > 0) {
          const float sm_scale = 1.0f / std::sqrt(static_cast<float>(idh));
          const float heads_scale = 1.0f / std::sqrt(static_cast<float>(nh));
          std::vector<std::vector<i64>> picks(sz(n));
          std::vector<std::vector<char>> cands;
          if (L.candidate_source) cands.resize(sz(n));
          // Same length as the candidate mask: check_csa2_schedule.
          const bool apply_candidates =
              !L.candidate_source && L.uses_candidates && sh.has_candidates;
          parallel_for(n, *W.workers, [&](i64 i) {
            const i64 t = t0 + i;
            std::vector<float> scores(sz(n_idx));
            const i64 visible = (positions[sz(t)] + 1) / L.ratio;
            // Scores of every index head against each block of keys: [nh, rows] GEMMs.
            const auto& keys = sh.index_src->index_keys;
            const float* qt = i_q.data() + t * nh * idh;
            const i64 rows_per_block = keys.rows_per_block();
            const i64 reach = std::min(visible, n_idx);
            std::vector<float> head_scores(sz(nh * rows_per_block));
            std::fill(scores.begin(), scores.end(), neg_inf);
            for (i64 b0 = 0; b0 < reach; b0 += rows_per_block) {
              const i64 rows = std::min(rows_per_block, reach - b0);
              gemm_nt(nh, rows, idh, qt, idh, keys.row(b0), idh, head_scores.data(), rows);
              for (i64 r = 0; r < rows; ++r)
                scores[sz(b0 + r)] = portable::index_score(head_scores.data() + r, rows,
                                                           i_w.data() + t * nh, nh, sm_scale,
                                                           heads_scale);
            }
            if (L.candidate_source) {
              const i64 bs = c.candidate_block_size;
              const i64 blocks = (n_idx + bs - 1) / bs;
              std::vector<float> block_score(sz(blocks), neg_inf);
              for (i64 e = 0; e < n_idx; ++e)
                block_score[sz(e / bs)] = std::max(block_score[sz(e / bs)], scores[sz(e)]);
              if (visible >= 1) {
                const i64 last = (visible - 1) / bs;
                if (last < blocks) block_score[sz(last)] = std::numeric_limits<float>::infinity();
              }
              auto keep = top_finite(block_score, c.candidate_topk_blocks);
              auto& mask = cands[sz(t - t0)];
              mask.assign(sz(n_idx), 0);
              for (i64 b : keep)
                for (i64 e = b * bs; e < std::min(n_idx, (b + 1) * bs); ++e) mask[sz(e)] = 1;
            } else if (apply_candidates) {
              const auto& mask = sh.candidates[sz(t - t0)];
              for (i64 e = 0; e < n_idx; ++e)
                if (!mask[sz(e)]) scores[sz(e)] = neg_inf;
            }
            picks[sz(t - t0)] = top_finite(scores, std::min(c.index_topk, n_idx));
          });
          sh.has_topk = true;
          sh.topk = std::move(picks);
          if (L.candidate_source) {
            sh.has_candidates = true;
            sh.candidates = std::move(cands);
          }
        }
      }

      // The new groups join the compressed KV, rotated and FP4-rounded.
      if (L.kv_source) {
        auto& cc = lc.compressed;
        const i64 n_lat = static_cast<i64>(latent_pos.size());
        for (i64 g = 0; g < n_lat; ++g) {
          float* v = latents.data() + g * hd;
          apply_rope(v, hd, W.rope_compress, latent_pos[sz(g)]);
          fake_quant_fp4_block(v, hd, 16, true);
          if (cc.groups + g >= cc.kv.size()) cc.kv.append(v);
        }
        cc.groups += n_lat;
        sh.compress_src = &lc.compressed;
      }
    }

    if (publish_only) continue;
    // Attention over the window and the selected compressed entries.
    const compressed_cache* comp = L.ratio != 0 ? sh.compress_src : nullptr;
    const i64 n_comp = comp != nullptr ? comp->kv.size() : 0;
    // The top-k was selected over exactly these n_comp entries: check_csa2_schedule.
    const float scaling = 1.0f / std::sqrt(static_cast<float>(hd));
    parallel_for(n, *W.workers, [&](i64 i) {
      const i64 t = t0 + i;
      const i64 p = positions[sz(t)];
      // The query's keys gathered into one [nk, hd] matrix: the window, then the selected
      // compressed entries.
      // (After a bounded replay's reset the ring holds nothing before the replay's start.)
      const i64 first = std::max<i64>({0, p - win + 1, std::min(lc.window.begin(), start)});
      const i64 n_sel =
          n_comp > 0 && sh.has_topk ? static_cast<i64>(sh.topk[sz(t - t0)].size()) : 0;
      const i64 nk = p - first + 1 + n_sel;
      std::vector<float> kbuf(sz(nk * hd)), probs(sz(H * nk));
      i64 row = 0;
      for (i64 kp = first; kp <= p; ++kp, ++row)
        std::copy_n(kp < start ? lc.window.at(kp) : kv.data() + (t0 + kp - start) * hd, hd,
                    kbuf.data() + row * hd);
      for (i64 k = 0; k < n_sel; ++k, ++row)
        std::copy_n(comp->kv.row(sh.topk[sz(t - t0)][sz(k)]), hd, kbuf.data() + row * hd);
      sink_attention(q.data() + t * H * hd, kbuf.data(), H, nk, hd, scaling, L.attn_sink.data(),
                     probs.data(), attn_out.data() + t * H * hd, rope, p);
    });
    for (i64 t = t0; t < t1; ++t) lc.window.push(kv.data() + t * hd);
  }

  // Grouped low-rank output projection.
  out.assign(sz(T * D), 0.0f);
  if (publish_only) return;
  std::vector<float> grouped(sz(T * G * R));
  const i64 per_group = H * hd / G;
  for (i64 g = 0; g < G; ++g)
    project(mode, attn_out.data() + g * per_group, T, per_group, L.wo_a.data() + g * R * per_group,
            R, grouped.data() + g * R, H * hd, G * R);
  project(mode, grouped.data(), T, G * R, L.wo_b.data(), D, out.data());
}

// The routed experts of a placement's ranks on the token copies dispatched to them: `ids` and
// `weights` [T, k] are each token's experts and gate weights. Each rank runs its local experts
// on the rows plan_dispatch sends it; each token's outputs are then added into y in ascending
// expert id (the order moe_site sums in without a placement). As a rank of an EP group (`ep`
// non-null, its placement `placement`) this model runs only its own rank's experts and gathers
// the other ranks' rows through the group's exchange (throws ep_group_failed when it fails).
void moe_placed(const text_config& c, const layer_weights& L, gemm_mode mode,
                const expert_placement& placement, const ep_member* ep,
                const std::vector<std::int32_t>& ids, const std::vector<float>& weights, i64 k,
                const std::vector<float>& a, i64 T, std::vector<float>& y) {
  const i64 D = c.hidden_size;
  auto plan = plan_dispatch(placement, ids, static_cast<std::int32_t>(k));
  const auto& p = *plan;  // the ids are the router's, in range
  const i64 rows = static_cast<i64>(p.send_copy.size());
  std::vector<float> sent(sz(rows * D)), returned(sz(rows * D)), row_w(sz(rows));
  gather_rows(p, a.data(), D, sent.data());
  for (i64 i = 0; i < rows; ++i) row_w[sz(i)] = weights[sz(p.send_copy[sz(i)])];
  for (std::int32_t rank = 0; rank < p.ranks; ++rank) {
    if (ep != nullptr && rank != ep->rank) continue;
    i64 row = p.send_offsets[sz(rank)];
    for (std::size_t slot = 0; slot < p.expert_counts[sz(rank)].size(); ++slot) {
      const i64 m = p.expert_counts[sz(rank)][slot];
      if (m == 0) continue;
      const auto e = placement.local[sz(rank)][slot];
      expert_forward(c, mode, L.experts[sz(e)], sent.data() + row * D, m, row_w.data() + row,
                     returned.data() + row * D);
      row += m;
    }
  }
  if (ep != nullptr) {
    std::vector<i64> offsets(sz(p.ranks) + 1, rows * D);
    for (std::int32_t rank = 0; rank < p.ranks; ++rank)
      offsets[sz(rank)] = i64{p.send_offsets[sz(rank)]} * D;
    if (auto ok = ep->exchange->all_gather(ep->rank, returned, offsets); !ok)
      throw ep_group_failed(ok.error());
  }
  std::vector<i64> order(sz(k));
  for (i64 t = 0; t < T; ++t) {
    std::iota(order.begin(), order.end(), i64{0});
    std::sort(order.begin(), order.end(),
              [&](i64 x, i64 z) { return ids[sz(t * k + x)] < ids[sz(t * k + z)]; });
    float* dst = y.data() + t * D;
    for (i64 j : order) {
      const float* src = returned.data() + i64{p.copy_row[sz(t * k + j)]} * D;
      for (i64 d = 0; d < D; ++d) dst[d] += src[d];
    }
  }
}

// The MoE of a layer on its normed input a [T, D] → y [T, D]. The routed experts are split into
// `shards` contiguous ranges (as expert-parallel ranks hold them); each shard sums its experts in
// expert order into a partial output, the partials are summed in shard order, then the shared
// expert is added. With one shard this is every routed expert in expert order. With a
// `placement` they run as its ranks would (moe_placed). `counts` (null: none) gets each routed
// expert's tokens added.
void moe_site(const text_config& c, const layer_weights& L, gemm_mode mode, int shards,
              const expert_placement* placement, const ep_member* ep,
              std::atomic<std::uint64_t>* counts, const std::vector<float>& a, i64 T,
              std::vector<float>& y) {
  const i64 D = c.hidden_size;
  const i64 E = c.n_routed_experts;
  std::vector<float> gl(sz(T * E));
  project(mode, a.data(), T, D, L.gate.data(), E, gl.data());
  std::vector<std::vector<std::pair<i64, float>>> routed(sz(E));  // (token, weight)
  std::vector<i64> chosen;
  std::vector<float> chosen_w;
  std::vector<std::int32_t> ids;  // [T, k], with a placement only: its dispatch plan's input
  std::vector<float> ids_w;
  i64 k = 0;
  for (i64 t = 0; t < T; ++t) {
    route_token(c, gl.data() + t * E, L.gate_bias.data(), chosen, chosen_w);
    k = static_cast<i64>(chosen.size());
    for (std::size_t i = 0; i < chosen.size(); ++i)
      routed[sz(chosen[i])].emplace_back(t, chosen_w[i]);
    if (placement != nullptr) {
      ids.insert(ids.end(), chosen.begin(), chosen.end());
      ids_w.insert(ids_w.end(), chosen_w.begin(), chosen_w.end());
    }
  }
  if (counts != nullptr)
    for (i64 e = 0; e < E; ++e)
      if (!routed[sz(e)].empty())
        counts[e].fetch_add(routed[sz(e)].size(), std::memory_order_relaxed);
  y.assign(sz(T * D), 0.0f);
  std::vector<float> partial, xe, ye, we;
  if (placement != nullptr && T > 0)
    moe_placed(c, L, mode, *placement, ep, ids, ids_w, k, a, T, y);
  const i64 per_shard = E / shards;
  for (i64 shard = 0; placement == nullptr && shard < shards; ++shard) {
    std::vector<float>& acc = shards == 1 ? y : partial;
    if (shards > 1) partial.assign(sz(T * D), 0.0f);
    for (i64 e = shard * per_shard; e < (shard + 1) * per_shard; ++e) {
      const auto& list = routed[sz(e)];
      if (list.empty()) continue;
      const i64 m = static_cast<i64>(list.size());
      xe.resize(sz(m * D));
      ye.resize(sz(m * D));
      we.resize(sz(m));
      for (i64 r = 0; r < m; ++r) {
        std::copy_n(a.data() + list[sz(r)].first * D, D, xe.data() + r * D);
        we[sz(r)] = list[sz(r)].second;
      }
      expert_forward(c, mode, L.experts[sz(e)], xe.data(), m, we.data(), ye.data());
      for (i64 r = 0; r < m; ++r) {
        float* dst = acc.data() + list[sz(r)].first * D;
        for (i64 d = 0; d < D; ++d) dst[d] += ye[sz(r * D + d)];
      }
    }
    if (shards > 1)
      for (i64 i = 0; i < T * D; ++i) y[sz(i)] += partial[sz(i)];
  }
  ye.resize(sz(T * D));
  expert_forward(c, mode, L.shared, a.data(), T, nullptr, ye.data());
  for (i64 i = 0; i < T * D; ++i) y[sz(i)] += ye[sz(i)];
}

}  // namespace

result<std::vector<float>> model::forward(std::span<const sequence_input> batch,
                                          std::vector<std::vector<float>>* layer_streams,
                                          std::vector<float>* dspark_features) const {
  return run(batch, layer_streams, 0, 0, dspark_features);
}

result<std::vector<float>> model::forward_last(std::span<const sequence_input> batch) const {
  const std::vector<std::int64_t> ones(batch.size(), 1);
  return run(batch, nullptr, 0, 0, nullptr, ones);
}

result<std::vector<float>> model::forward_tail(std::span<const sequence_input> batch,
                                               std::span<const std::int64_t> rows,
                                               std::vector<float>* dspark_features) const {
  if (rows.size() != batch.size())
    return result<std::vector<float>>::failure(
        "forward_tail: " + std::to_string(rows.size()) + " row counts for " +
        std::to_string(batch.size()) + " sequences");
  for (std::size_t s = 0; s < batch.size(); ++s)
    if (rows[s] < 1 || rows[s] > static_cast<std::int64_t>(batch[s].tokens.size()))
      return result<std::vector<float>>::failure(
          "forward_tail: sequence " + std::to_string(s) + " asks for " +
          std::to_string(rows[s]) + " rows of its " + std::to_string(batch[s].tokens.size()) +
          " tokens");
  return run(batch, nullptr, 0, 0, dspark_features, rows);
}

result<std::vector<float>> model::run(std::span<const sequence_input> batch,
                                      std::vector<std::vector<float>>* layer_streams,
                                      std::int64_t decoder_begin, std::int64_t head,
                                      std::vector<float>* dspark_features,
                                      std::span<const std::int64_t> tail) const {
  try {
    return run_layers(batch, layer_streams, decoder_begin, head, dspark_features, tail);
  } catch (const ep_group_failed& e) {
    return result<std::vector<float>>::failure(e.what());
  }
}

result<std::vector<float>> model::run_layers(std::span<const sequence_input> batch,
                                             std::vector<std::vector<float>>* layer_streams,
                                             std::int64_t decoder_begin, std::int64_t head,
                                             std::vector<float>* dspark_features,
                                             std::span<const std::int64_t> tail) const {
  const auto& W = *w_;
  const auto& c = W.cfg.text;
  const i64 D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const gemm_mode mode{W.batch_invariant, W.workers.get(), W.jitter, W.jitter_seed};
  using fail = result<std::vector<float>>;

  // Tokens in batch order, their positions, and each sequence's slice.
  std::vector<i64> tokens, positions;
  std::vector<i64> seq_begin;
  for (std::size_t s = 0; s < batch.size(); ++s) {
    const auto& in = batch[s];
    if (in.cache == nullptr || in.cache->owner != w_.get())
      return fail::failure("forward: sequence " + std::to_string(s) +
                           " has no cache made by this model");
    for (std::size_t o = 0; o < s; ++o)
      if (batch[o].cache == in.cache)
        return fail::failure("forward: sequences " + std::to_string(o) + " and " +
                             std::to_string(s) + " share one cache");
    seq_begin.push_back(static_cast<i64>(tokens.size()));
    for (std::size_t i = 0; i < in.tokens.size(); ++i) {
      const i64 t = in.tokens[i];
      if (t < 0 || t >= V)
        return fail::failure("forward: sequence " + std::to_string(s) + " token " +
                             std::to_string(i) + " is " + std::to_string(t) +
                             ", expected 0 <= id < " + std::to_string(V));
      tokens.push_back(t);
      positions.push_back(in.cache->length + static_cast<i64>(i));
    }
  }
  seq_begin.push_back(static_cast<i64>(tokens.size()));
  i64 T = static_cast<i64>(tokens.size());
  const i64 S = static_cast<i64>(batch.size());
  if (T == 0) return std::vector<float>{};
  if (layer_streams != nullptr) layer_streams->clear();
  const bool has_engram = !c.engram_layer_ids.empty();
  if (has_engram && W.token_map.empty())
    return fail::failure(
        "forward: the Engram layers need the compressed token map "
        "(set_engram_token_map)");

  // Engram hash ids: [T, engram layers, columns].
  const i64 n_engram = static_cast<i64>(c.engram_layer_ids.size());
  const i64 cols = has_engram ? W.engram.columns : 0;
  std::vector<i64> hash_ids;
  if (has_engram) {
    std::vector<const std::vector<i64>*> recent;
    for (const auto& in : batch) recent.push_back(&in.cache->engram_recent);
    hash_ids = engram_hash_ids(W, recent, seq_begin, tokens, positions);
  }

  // Embeddings, copied into every stream; the first site collapses stream 0 only.
  std::vector<float> streams(sz(T * hc * D));
  for (i64 t = 0; t < T; ++t)
    for (i64 j = 0; j < hc; ++j)
      std::copy_n(W.embed.data() + tokens[sz(t)] * D, D, streams.data() + (t * hc + j) * D);
  std::vector<float> pre_mix(sz(T * hc), 0.0f);
  for (i64 t = 0; t < T; ++t) pre_mix[sz(t * hc)] = 1.0f;

  call_context cx{batch, seq_begin, positions, T, S, mode, std::vector<shared_state>(sz(S))};
  std::vector<float> post, comb, next_pre, collapsed, a, out;
  const auto n_targets = static_cast<i64>(c.dspark_target_layer_ids.size());
  if (dspark_features != nullptr) dspark_features->assign(sz(T * n_targets * D), 0.0f);
  for (i64 l = 0; l < c.num_hidden_layers; ++l) {
    const auto& L = W.layers[sz(l)];

    if (L.engram_index >= 0) engram_site(W, L, cx, hash_ids, streams);

    if (head > 0 && l == decoder_begin) {
      // Encoder–decoder prefill (one sequence): the decoder's first layer, its KV source,
      // publishes the full-resolution KV and indexer keys of the first `head` tokens from the
      // encoder's output; from here on only the tail runs.
      hc_collapse(c, streams, pre_mix, T, collapsed);
      a.assign(collapsed.begin(), collapsed.begin() + head * D);
      for (i64 t = 0; t < head; ++t) rms_norm(a.data() + t * D, D, L.attn_norm.data(), eps);
      call_context head_cx{batch, {0, head},
                           std::vector<i64>(positions.begin(), positions.begin() + head),
                           head, 1, mode, std::move(cx.shared)};
      attention_site(W, L, l, head_cx, a, out, /*publish_only=*/true);
      cx.shared = std::move(head_cx.shared);
      streams.erase(streams.begin(), streams.begin() + head * hc * D);
      pre_mix.erase(pre_mix.begin(), pre_mix.begin() + head * hc);
      hash_ids.erase(hash_ids.begin(), hash_ids.begin() + head * n_engram * cols);
      cx.positions.erase(cx.positions.begin(), cx.positions.begin() + head);
      T -= head;
      cx.T = T;
      cx.seq_begin = {0, T};
      auto& sh = cx.shared[0];
      if (sh.has_topk) sh.topk.erase(sh.topk.begin(), sh.topk.begin() + head);
      if (sh.has_candidates)
        sh.candidates.erase(sh.candidates.begin(), sh.candidates.begin() + head);
      auto& cache = *batch[0].cache;
      for (i64 d = decoder_begin; d < c.num_hidden_layers; ++d)
        cache.layers[sz(d)].window.reset(cx.positions[0]);
    }

    // The DSpark features: the streams this layer's attention site takes, averaged.
    if (dspark_features != nullptr)
      for (i64 k = 0; k < n_targets; ++k) {
        if (c.dspark_target_layer_ids[sz(k)] != l) continue;
        const float inv = 1.0f / static_cast<float>(hc);
        for (i64 t = 0; t < T; ++t) {
          float* f = dspark_features->data() + (t * n_targets + k) * D;
          for (i64 j = 0; j < hc; ++j) {
            const float* st = streams.data() + (t * hc + j) * D;
            for (i64 d = 0; d < D; ++d) f[d] += inv * st[d];
          }
        }
      }

    // Attention site.
    hc_mixes(c, mode, streams, T, L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, next_pre, post,
             comb);
    hc_collapse(c, streams, pre_mix, T, collapsed);
    a = collapsed;
    for (i64 t = 0; t < T; ++t) rms_norm(a.data() + t * D, D, L.attn_norm.data(), eps);
    attention_site(W, L, l, cx, a, out);
    hc_expand(c, out, post, comb, T, streams);
    std::vector<float> attn_pre = next_pre;

    // FFN site.
    hc_mixes(c, mode, streams, T, L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, next_pre, post, comb);
    hc_collapse(c, streams, attn_pre, T, collapsed);
    a = collapsed;
    for (i64 t = 0; t < T; ++t) rms_norm(a.data() + t * D, D, L.ffn_norm.data(), eps);
    const ep_member* ep = W.ep ? &*W.ep : nullptr;
    const expert_placement* placement = ep ? &ep->placement
                                           : W.placement ? &*W.placement : nullptr;
    moe_site(c, L, mode, W.expert_shards, placement, ep, W.routed_counts.get(), a, T, out);
    hc_expand(c, out, post, comb, T, streams);
    pre_mix = next_pre;
    if (layer_streams != nullptr) layer_streams->push_back(streams);
  }

  // Final collapse, norm and LM head (on every token, or each sequence's last).
  hc_collapse(c, streams, pre_mix, T, collapsed);
  i64 rows = T;
  if (!tail.empty()) {
    rows = 0;
    for (i64 s = 0; s < S; ++s) rows += tail[sz(s)];
    std::vector<float> last(sz(rows * D));
    i64 at = 0;
    for (i64 s = 0; s < S; ++s) {
      const i64 n = tail[sz(s)];
      std::copy_n(collapsed.data() + (seq_begin[sz(s + 1)] - n) * D, n * D,
                  last.data() + at * D);
      at += n;
    }
    collapsed = std::move(last);
  }
  // An EP group's answer is rank 0's: the other ranks skip the head (a vocab-wide GEMM).
  std::vector<float> logits;
  if (W.ep == std::nullopt || W.ep->rank == 0) {
    for (i64 t = 0; t < rows; ++t) rms_norm(collapsed.data() + t * D, D, W.norm.data(), eps);
    logits.resize(sz(rows * V));
    project(mode, collapsed.data(), rows, D, W.lm_head.data(), V, logits.data());
  }

  // Advance the caches.
  for (i64 s = 0; s < S; ++s) {
    auto& cache = *batch[sz(s)].cache;
    cache.length += seq_begin[sz(s + 1)] - seq_begin[sz(s)];
    if (has_engram)
      engram_remember(W, cache.engram_recent,
                      std::span(tokens).subspan(sz(seq_begin[sz(s)]),
                                                sz(seq_begin[sz(s + 1)] - seq_begin[sz(s)])));
  }
  return logits;
}

}  // namespace troupe::kernels

namespace troupe::kernels {

result<std::vector<float>> model::replay(sequence_cache& s, std::span<const std::int64_t> tokens,
                                         std::int64_t recompute) const {
  const auto& W = *w_;
  const auto& c = W.cfg.text;
  using fail = result<std::vector<float>>;
  if (s.owner != w_.get()) return fail::failure("replay: the cache was not made by this model");
  if (recompute < 0) return fail::failure("replay: recompute < 0");
  if (recompute == 0) recompute = c.sliding_window;
  if (s.length != 0)
    return fail::failure("replay: the cache must hold restored Block KV only (length " +
                         std::to_string(s.length) + ")");
  // The restored blocks, and the alignment every compress ratio divides.
  i64 blocks = -1, align = 1;
  for (const auto& l : s.layers) {
    if (!l.is_kv_source) continue;
    const auto& cc = l.compressed;
    const i64 rows = cc.kv.rows_per_block();
    if (cc.kv.size() % rows != 0 || cc.pending_tokens != 0 || cc.groups != 0 ||
        (blocks >= 0 && cc.kv.size() / rows != blocks))
      return fail::failure("replay: the KV-source layers must hold the same full blocks only");
    blocks = cc.kv.size() / rows;
    align = std::lcm(align, std::max<i64>(1, cc.ratio));
  }
  blocks = std::max<i64>(0, blocks);
  const i64 P = static_cast<i64>(tokens.size());
  if (P < blocks * kv_block_tokens)
    return fail::failure("replay: " + std::to_string(P) + " tokens, fewer than the " +
                         std::to_string(blocks * kv_block_tokens) + " the restored blocks cover");
  if (!c.engram_layer_ids.empty() && W.token_map.empty())
    return fail::failure("replay: the Engram layers need the compressed token map");
  for (const i64 t : tokens)
    if (t < 0 || t >= c.vocab_size)
      return fail::failure("replay: token id " + std::to_string(t) + " out of range");
  const i64 start =
      std::min(blocks * kv_block_tokens, std::max<i64>(0, P - recompute) / align * align);

  s.length = start;
  s.rollback_floor = start;
  for (auto& l : s.layers) {
    l.window.reset(start);
    if (!l.is_kv_source) continue;
    auto& cc = l.compressed;
    cc.groups = cc.ratio > 1 ? start / cc.ratio : start;
    cc.pending_kv.clear();
    cc.pending_gate.clear();
    cc.recent_kv.clear();
    cc.recent_gate.clear();
    cc.recent_tokens = 0;
  }
  s.engram_recent.clear();
  if (!c.engram_layer_ids.empty()) engram_remember(W, s.engram_recent, tokens.first(sz(start)));
  const sequence_input in{&s, tokens.subspan(sz(start))};
  return forward_last(std::span<const sequence_input>(&in, 1));
}

}  // namespace troupe::kernels

namespace troupe::kernels {

result<std::vector<float>> model::prefill_encoder_decoder(sequence_cache& s,
                                                          std::span<const std::int64_t> tokens,
                                                          std::int64_t tail) const {
  const auto& c = w_->cfg.text;
  using fail = result<std::vector<float>>;
  if (tail < 0) return fail::failure("prefill_encoder_decoder: tail < 0");
  if (tail == 0) tail = c.sliding_window;
  if (s.owner == w_.get() && s.length != 0)
    return fail::failure("prefill_encoder_decoder: the cache must be fresh (length " +
                         std::to_string(s.length) + ")");
  i64 decoder_begin = -1;
  for (i64 l = 0; l < c.num_hidden_layers && decoder_begin < 0; ++l)
    if (c.compress_ratios[sz(l)] == 1) decoder_begin = l;
  if (decoder_begin < 0 || !c.is_kv_source(decoder_begin) || !c.is_index_source(decoder_begin))
    return fail::failure(
        "prefill_encoder_decoder: the first ratio-1 (decoder) layer must exist and be a KV and "
        "index source");
  for (i64 l = decoder_begin + 1; l < c.num_hidden_layers; ++l)
    if (c.is_kv_source(l))
      return fail::failure("prefill_encoder_decoder: layer " + std::to_string(l) +
                           " is a KV source after the decoder's first layer");
  const i64 head = std::max<i64>(0, static_cast<i64>(tokens.size()) - tail);
  const sequence_input in{&s, tokens};
  return run(std::span<const sequence_input>(&in, 1), nullptr, decoder_begin, head);
}

}  // namespace troupe::kernels

namespace troupe::kernels {

void draft_state::rollback(std::int64_t k) {
  for (auto& r : rings) r.truncate(std::max<std::int64_t>(r.begin(), r.end() - k));
}

void draft_state::reset(std::int64_t position) {
  for (auto& r : rings) r.reset(position);
}

bool model::has_draft() const { return !w_->draft_layers.empty(); }

draft_state model::new_draft_state() const {
  const auto& c = w_->cfg.text;
  draft_state s;
  s.owner = w_.get();
  s.rings.assign(w_->draft_layers.size(),
                 swa_ring(c.head_dim, c.sliding_window + swa_rollback_tokens));
  return s;
}

namespace {

// A draft stage's shared K=V row of normed input x at `position`: kv_norm(wkv · x), rotated,
// FP8-rounded, as the backbone's window rows.
void draft_kv_rows(const model::weights& W, const layer_weights& L, gemm_mode mode,
                   const float* x, i64 rows, i64 first_position, std::vector<float>& kv) {
  const auto& c = W.cfg.text;
  const i64 D = c.hidden_size, hd = c.head_dim;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  kv.resize(sz(rows * hd));
  project(mode, x, rows, D, L.wkv.data(), hd, kv.data());
  for (i64 t = 0; t < rows; ++t) {
    float* k = kv.data() + t * hd;
    rms_norm(k, hd, L.kv_norm.data(), eps);
    apply_rope(k, hd, W.rope_main, first_position + t);
    fake_quant_fp8_block32(k, hd);
  }
}

// The attention of draft stage `stage` on the block's normed input a [S·B, D]: every block token
// attends to the same keys — the last `window` context rows before the block and all B block
// rows (no causal mask inside the block) — with the per-head sinks; grouped output projection
// → out [S·B, D].
void draft_attention(const model::weights& W, std::size_t stage, gemm_mode mode,
                     std::span<const draft_input> batch, i64 B, const std::vector<float>& a,
                     std::vector<float>& out) {
  const auto& c = W.cfg.text;
  const auto& L = W.draft_layers[stage];
  const i64 D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim, qr = c.q_lora_rank;
  const i64 win = c.sliding_window, G = c.o_groups, R = c.o_lora_rank;
  const i64 S = static_cast<i64>(batch.size()), T = S * B;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> q_res(sz(T * qr)), q(sz(T * H * hd)), attn_out(sz(T * H * hd));
  project(mode, a.data(), T, D, L.wq_a.data(), qr, q_res.data());
  for (i64 t = 0; t < T; ++t) rms_norm(q_res.data() + t * qr, qr, L.q_norm.data(), eps);
  project(mode, q_res.data(), T, qr, L.wq_b.data(), H * hd, q.data());
  const float scaling = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> kv;
  for (i64 s = 0; s < S; ++s) {
    const swa_ring& ring = batch[sz(s)].state->rings[stage];
    const i64 start = ring.end();  // the block's first position
    draft_kv_rows(W, L, mode, a.data() + s * B * D, B, start, kv);
    parallel_for(B, *W.workers, [&](i64 i) {
      const i64 t = s * B + i, p = start + i;
      for (i64 h = 0; h < H; ++h) apply_rope(q.data() + (t * H + h) * hd, hd, W.rope_main, p);
      const i64 first = std::max<i64>(ring.begin(), start - win);
      const i64 n_ctx = std::max<i64>(0, start - first), nk = n_ctx + B;
      std::vector<float> kbuf(sz(nk * hd)), probs(sz(H * nk));
      for (i64 r = 0; r < n_ctx; ++r) std::copy_n(ring.at(first + r), hd, kbuf.data() + r * hd);
      std::copy_n(kv.data(), B * hd, kbuf.data() + n_ctx * hd);
      sink_attention(q.data() + t * H * hd, kbuf.data(), H, nk, hd, scaling, L.attn_sink.data(),
                     probs.data(), attn_out.data() + t * H * hd, W.rope_main, p);
    });
  }
  out.assign(sz(T * D), 0.0f);
  std::vector<float> grouped(sz(T * G * R));
  const i64 per_group = H * hd / G;
  for (i64 g = 0; g < G; ++g)
    project(mode, attn_out.data() + g * per_group, T, per_group, L.wo_a.data() + g * R * per_group,
            R, grouped.data() + g * R, H * hd, G * R);
  project(mode, grouped.data(), T, G * R, L.wo_b.data(), D, out.data());
}

}  // namespace

namespace {

// Appends context rows to a draft state: main_norm(main_proj(features)), then every stage's
// K=V (features already checked: a multiple of the targets' width).
void append_draft_context(const model::weights& W, const gemm_mode& mode, draft_state& state,
                          std::span<const float> features) {
  const auto& c = W.cfg.text;
  const i64 D = c.hidden_size;
  const i64 width = static_cast<i64>(c.dspark_target_layer_ids.size()) * D;
  const i64 n = static_cast<i64>(features.size()) / width;
  if (n == 0) return;
  std::vector<float> ctx(sz(n * D)), kv;
  project(mode, features.data(), n, width, W.main_proj.data(), D, ctx.data());
  for (i64 t = 0; t < n; ++t)
    rms_norm(ctx.data() + t * D, D, W.main_norm.data(), static_cast<float>(c.rms_norm_eps));
  for (std::size_t st = 0; st < W.draft_layers.size(); ++st) {
    auto& ring = state.rings[st];
    draft_kv_rows(W, W.draft_layers[st], mode, ctx.data(), n, ring.end(), kv);
    for (i64 t = 0; t < n; ++t) ring.push(kv.data() + t * c.head_dim);
  }
}

}  // namespace

result<bool> model::extend_draft(draft_state& state, std::span<const float> features) const {
  const auto& W = *w_;
  const auto& c = W.cfg.text;
  if (W.draft_layers.empty())
    return result<bool>::failure("extend_draft: the checkpoint has no DSpark draft layers (mtp.*)");
  if (state.owner != w_.get() || state.rings.size() != W.draft_layers.size())
    return result<bool>::failure("extend_draft: a draft state not made by this model");
  const auto width = c.dspark_target_layer_ids.size() * static_cast<std::size_t>(c.hidden_size);
  if (features.size() % width != 0)
    return result<bool>::failure("extend_draft: expected features of width " +
                                 std::to_string(width) + " (targets x hidden_size), found " +
                                 std::to_string(features.size()) + " values");
  append_draft_context(W, {W.batch_invariant, W.workers.get(), W.jitter, W.jitter_seed}, state,
                       features);
  return true;
}

result<draft_output> model::draft(std::span<const draft_input> batch) const {
  using fail = result<draft_output>;
  const auto& W = *w_;
  const auto& c = W.cfg.text;
  if (W.draft_layers.empty())
    return fail::failure("draft: the checkpoint has no DSpark draft layers (mtp.*)");
  const i64 D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size, B = c.dspark_block_size;
  const i64 S = static_cast<i64>(batch.size()), T = S * B;
  const i64 width = static_cast<i64>(c.dspark_target_layer_ids.size()) * D;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const gemm_mode mode{W.batch_invariant, W.workers.get(), W.jitter, W.jitter_seed};
  for (i64 s = 0; s < S; ++s) {
    const auto& in = batch[sz(s)];
    const std::string who = "draft: sequence " + std::to_string(s);
    if (in.state == nullptr || in.state->owner != w_.get() ||
        in.state->rings.size() != W.draft_layers.size())
      return fail::failure(who + " has no draft state made by this model");
    for (i64 o = 0; o < s; ++o)
      if (batch[sz(o)].state == in.state)
        return fail::failure(who + " shares its draft state with sequence " + std::to_string(o));
    if (static_cast<i64>(in.features.size()) % width != 0)
      return fail::failure(who + ": expected features of width " + std::to_string(width) +
                           " (targets x hidden_size), found " +
                           std::to_string(in.features.size()) + " values");
    if (in.anchor < 0 || in.anchor >= V)
      return fail::failure(who + ": anchor token " + std::to_string(in.anchor) +
                           ", expected 0 <= id < " + std::to_string(V));
  }
  if (S == 0) return draft_output{};

  for (i64 s = 0; s < S; ++s) append_draft_context(W, mode, *batch[sz(s)].state, batch[sz(s)].features);

  // The blocks [anchor, noise × (B - 1)] through the stages (delayed mHC as the backbone).
  std::vector<float> streams(sz(T * hc * D));
  for (i64 s = 0; s < S; ++s)
    for (i64 i = 0; i < B; ++i) {
      const i64 tok = i == 0 ? batch[sz(s)].anchor : c.dspark_noise_token_id;
      for (i64 j = 0; j < hc; ++j)
        std::copy_n(W.embed.data() + tok * D, D, streams.data() + ((s * B + i) * hc + j) * D);
    }
  std::vector<float> pre_mix(sz(T * hc), 0.0f);
  for (i64 t = 0; t < T; ++t) pre_mix[sz(t * hc)] = 1.0f;
  std::vector<float> post, comb, next_pre, a, out;
  for (std::size_t st = 0; st < W.draft_layers.size(); ++st) {
    const auto& L = W.draft_layers[st];
    hc_mixes(c, mode, streams, T, L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, next_pre, post,
             comb);
    hc_collapse(c, streams, pre_mix, T, a);
    for (i64 t = 0; t < T; ++t) rms_norm(a.data() + t * D, D, L.attn_norm.data(), eps);
    draft_attention(W, st, mode, batch, B, a, out);
    hc_expand(c, out, post, comb, T, streams);
    std::vector<float> attn_pre = next_pre;
    hc_mixes(c, mode, streams, T, L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, next_pre, post, comb);
    hc_collapse(c, streams, attn_pre, T, a);
    for (i64 t = 0; t < T; ++t) rms_norm(a.data() + t * D, D, L.ffn_norm.data(), eps);
    moe_site(W.draft_cfg, L, mode, 1, nullptr, nullptr, nullptr, a, T, out);
    hc_expand(c, out, post, comb, T, streams);
    pre_mix = next_pre;
  }
  std::vector<float> hidden, normed;
  hc_collapse(c, streams, pre_mix, T, hidden);  // h_k, before the final norm
  normed = hidden;
  for (i64 t = 0; t < T; ++t) rms_norm(normed.data() + t * D, D, W.draft_norm.data(), eps);
  std::vector<float> logits(sz(T * V));
  project(mode, normed.data(), T, D, W.lm_head.data(), V, logits.data());
  std::vector<std::int64_t> anchors;
  for (const auto& in : batch) anchors.push_back(in.anchor);
  return finish_draft(anchors, hidden, std::move(logits));
}

draft_output model::finish_draft(std::span<const std::int64_t> anchors,
                                 std::span<const float> hidden, std::vector<float> logits) const {
  const auto& W = *w_;
  const auto& c = W.cfg.text;
  const i64 D = c.hidden_size, V = c.vocab_size, B = c.dspark_block_size;
  const i64 rank = c.dspark_markov_rank, S = static_cast<i64>(anchors.size()), T = S * B;
  draft_output res;
  res.logits = std::move(logits);
  // Semi-autoregressive drafting: the Markov bias of the previous token on each position.
  res.tokens.resize(sz(T));
  res.confidences.resize(sz(T));
  std::vector<float> bias(sz(V));
  const float* conf_w = W.confidence.data();
  for (i64 s = 0; s < S; ++s) {
    i64 prev = anchors[sz(s)];
    for (i64 i = 0; i < B; ++i) {
      const i64 t = s * B + i;
      const float* e = W.markov_embed.data() + prev * rank;
      project(gemm_mode{true, W.workers.get()}, e, 1, rank, W.markov_head.data(), V, bias.data());
      float* lg = res.logits.data() + t * V;
      i64 best = 0;
      for (i64 v = 0; v < V; ++v) {
        lg[v] += bias[sz(v)];
        if (lg[v] > lg[best]) best = v;
      }
      float score = 0.0f;
      for (i64 d = 0; d < D; ++d) score += conf_w[d] * hidden[sz(t * D + d)];
      for (i64 r = 0; r < rank; ++r) score += conf_w[D + r] * e[r];
      res.tokens[sz(t)] = best;
      res.confidences[sz(t)] = sigmoid(score);
      prev = best;
    }
  }
  return res;
}

}  // namespace troupe::kernels
