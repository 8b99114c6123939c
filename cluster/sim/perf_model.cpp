// The performance model: per-layer roofline, EP all-to-all, two-micro-batch overlap.
#include "cluster/sim/perf_model.hpp"

#include "actors/lb/expert_placement.hpp"
#include "cluster/sim/expert_placement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <unordered_map>
#include <cmath>
#include <limits>
#include <vector>

namespace troupe::cluster::sim {

namespace {

// Time of an operation bound by arithmetic or by memory traffic, whichever is slower.
double roofline(double flops, double peak_flops, double bytes, double bandwidth) {
  return std::max(flops / peak_flops, bytes / bandwidth);
}

// Expected distinct bins hit when `k` items fall uniformly into `n` bins.
double distinct(double n, double k) {
  if (n <= 1)
    return n;
  return n * (1.0 - std::pow(1.0 - 1.0 / n, k));
}

struct rates {
  double gemm;      // FP8 GEMM FLOP/s reached
  double attention; // BF16 attention FLOP/s reached
  double memory;    // HBM bytes/s reached
};

// The costs of one micro-batch in one layer.
struct layer_cost {
  double attention = 0;
  double attention_core = 0;
  double moe = 0;
  double dense = 0;
  double engram_read = 0;
  double comm = 0;
  double compute() const { return attention + moe + dense; }
};

struct shape {
  double tokens;    // tokens per GPU in this micro-batch
  double sequences; // sequences per GPU in this micro-batch
  double new_per_seq;
  double context;   // KV length per sequence after the step
};

// The step-independent factors of the all-to-all for one (model, hardware, phase, ep): they cost
// two `pow`s, so a step computes them once rather than per layer and dispatch.
struct a2a_factors {
  bool none = true;       // ep <= 1: no all-to-all
  bool one_node = false;  // the EP group fits one scale-up domain
  double gpus = 0;        // destination GPUs per token
  double remote_copies = 0;
  double up_bw = 0;
  double out_bw = 0;
};

a2a_factors make_a2a(const model_profile& m, const hardware_profile& hw, phase p,
                     std::uint32_t ep) {
  a2a_factors f;
  if (ep <= 1)
    return f;
  f.none = false;
  const double k = m.experts_per_token;
  f.gpus = distinct(ep, k);
  const double domain = std::min<double>(hw.scale_up_domain, ep);
  const double nodes = std::ceil(ep / domain);
  f.up_bw = hw.scale_up_bytes_per_s * hw.scale_up_efficiency;
  f.out_bw = hw.scale_out_bytes_per_s * hw.scale_out_efficiency;
  if (nodes <= 1) {
    f.one_node = true;
    return f;
  }
  if (p == phase::prefill) {
    // Throughput kernels send a token once per remote node and forward it inside the node over
    // the scale-up fabric; node-limited routing caps the nodes a token reaches.
    double reached = distinct(nodes, k);
    if (m.expert_groups > 1 && m.groups_per_token < m.expert_groups)
      reached = std::min(reached, double(m.groups_per_token));
    f.remote_copies = reached * (nodes - 1.0) / nodes;
  } else {
    // Low-latency kernels send each copy straight to its GPU.
    f.remote_copies = f.gpus * (1.0 - domain / ep);
  }
  return f;
}

// All-to-all time of one dispatch (bytes_per_copy = one token's activation) for `tokens`.
double all_to_all(const hardware_profile& hw, const a2a_factors& f, std::uint32_t ep,
                  double tokens, double bytes_per_copy) {
  if (f.none || tokens <= 0)
    return 0;
  if (f.one_node) {
    double bytes = tokens * f.gpus * (ep - 1.0) / ep * bytes_per_copy;
    return hw.scale_up_latency_s + bytes / f.up_bw;
  }
  double out = tokens * f.remote_copies * bytes_per_copy / f.out_bw;
  double up = tokens * f.gpus * bytes_per_copy / f.up_bw;
  return hw.scale_out_latency_s + std::max(out, up);
}

// Tokens a layer runs on per sequence: bounded replay runs tail-only layers on the last tokens.
double layer_tokens_per_sequence(const model_profile& m, const layer_profile& l, phase p,
                                 const shape& s) {
  double n = s.new_per_seq;
  if (p == phase::prefill && l.prefill_tail_only && m.replay_tokens > 0)
    n = std::min<double>(n, m.replay_tokens);
  return n;
}

// The part of a layer's cost the context does not change: the attention projections, the
// experts or dense FFN, the all-to-all and Engram. A step's phase, micro-batches, tokens and
// sequences decide it, so a step cost function remembers it per such shape (shape_memo).
struct layer_fixed {
  double proj = 0;
  double moe = 0;
  double dense = 0;
  double engram_read = 0;
  double comm = 0;
};

layer_fixed cost_layer_fixed(const model_profile& m, const hardware_profile& hw,
                             const layer_profile& l, phase p, std::uint32_t ep, const shape& s,
                             const rates& r, const perf_options& opt, const a2a_factors& a2a) {
  layer_fixed c;
  const double n = layer_tokens_per_sequence(m, l, p, s);
  const double t = s.sequences * n;

  // Attention projections (FP8 GEMMs); a tail-only KV source still compresses every token.
  double proj_params = m.attention_params + (l.index_source ? m.indexer_params : 0);
  double proj_flops = 2.0 * t * proj_params;
  double proj_bytes = proj_params * m.dense_bytes_per_param;
  if (l.kv_source && m.compressor_params > 0) {
    proj_flops += 2.0 * s.tokens * m.compressor_params;
    proj_bytes += m.compressor_params * m.dense_bytes_per_param;
  }
  c.proj = roofline(proj_flops, r.gemm, proj_bytes, r.memory);

  // Experts or dense FFN.
  if (l.moe) {
    const double k = m.experts_per_token;
    const double local_experts = max_experts_per_rank(m.routed_experts, ep); // balanced placement
    // The busiest rank's token-expert pairs (balanced: each GPU receives what it sends).
    const double balance = std::clamp(opt.moe_balance, 1e-3, 1.0);
    const double pairs_local = t * k / balance;
    const double active = std::min(local_experts, pairs_local);
    double routed = roofline(2.0 * pairs_local * m.expert_params, r.gemm,
                             active * m.expert_params * m.expert_bytes_per_param, r.memory);
    double shared = m.shared_experts == 0
                      ? 0
                      : roofline(2.0 * t * m.shared_experts * m.expert_params, r.gemm,
                                 m.shared_experts * m.expert_params * m.dense_bytes_per_param,
                                 r.memory);
    double router_params = double(m.hidden) * m.routed_experts;
    double router = roofline(2.0 * t * router_params, r.gemm, router_params * 4.0, r.memory);
    c.moe = routed + shared + router;
    // Dispatch in FP8 (with a 4-byte scale per 128 channels), combine in BF16.
    double fp8_copy = m.hidden + m.hidden / 128.0 * 4.0;
    double bf16_copy = 2.0 * m.hidden;
    c.comm = all_to_all(hw, a2a, ep, t / balance, fp8_copy)
             + all_to_all(hw, a2a, ep, t / balance, bf16_copy);
  } else {
    double params = 3.0 * m.hidden * m.dense_intermediate;
    c.dense += roofline(2.0 * t * params, r.gemm, params * m.dense_bytes_per_param, r.memory);
  }

  // Engram: the projection is a dense GEMM; the lookups read table rows from host memory (the
  // cached share) or SSD (one random read per row).
  if (l.engram && m.engram_rows_per_token > 0) {
    double params = m.engram_projection_params;
    c.dense += roofline(2.0 * t * params, r.gemm, params * m.dense_bytes_per_param, r.memory);
    double rows = t * m.engram_rows_per_token;
    double hit = std::clamp(opt.engram_host_hit_ratio, 0.0, 1.0);
    c.engram_read = hit * rows * m.engram_row_bytes / hw.host_to_device_bytes_per_s
                    + (1.0 - hit) * rows / hw.ssd_read_iops;
  }
  return c;
}

// A layer's cost: its context-free part `fixed` (cost_layer_fixed of the same step) and the
// core attention over the context.
layer_cost cost_layer(const model_profile& m, const layer_profile& l, phase p, const shape& s,
                      const rates& r, const layer_fixed& fixed) {
  layer_cost c;
  const double n = layer_tokens_per_sequence(m, l, p, s);
  const double t = s.sequences * n;
  // Positions a token sees on average: its prefix plus, causally, half its own chunk.
  const double visible = std::max(1.0, s.context - (n - 1.0) / 2.0);

  // Core attention: positions attended per token, bytes of KV read per layer.
  double per_pair = 2.0 * m.heads * (m.qk_head_dim + m.v_head_dim);
  double pairs = 0, kv_bytes = 0, index_flops = 0, index_bytes = 0;
  const double window = std::min<double>(m.sliding_window, visible);
  const double ratio = std::max<std::uint32_t>(l.compress_ratio, 1);
  switch (l.attention) {
    case attention_kind::mla:
      pairs = t * visible;
      if (p == phase::decode) // absorbed (MQA) form over the latent cache
        per_pair = 2.0 * m.heads * (m.kv_latent_dim + (m.kv_latent_dim - m.rope_dim));
      kv_bytes = s.sequences * s.context * m.kv_entry_bytes;
      break;
    case attention_kind::sliding:
      pairs = t * window;
      kv_bytes = s.sequences * std::min<double>(m.sliding_window, s.context) * m.swa_entry_bytes;
      break;
    case attention_kind::hca: {
      double latents = visible / ratio;
      pairs = t * (window + latents);
      kv_bytes = s.sequences * (std::min<double>(m.sliding_window, s.context) * m.swa_entry_bytes
                                + s.context / ratio * m.kv_entry_bytes);
      break;
    }
    case attention_kind::csa:
    case attention_kind::ced_encoder:
    case attention_kind::ced_decoder: {
      double latents = visible / ratio;
      double chosen = std::min<double>(m.index_topk, latents);
      pairs = t * (window + chosen);
      // Sparse reads: each token gathers its own top-k (decode); prefill tiles share them.
      double gathered = p == phase::decode ? t * chosen : s.sequences * s.context / ratio;
      kv_bytes = s.sequences * std::min<double>(m.sliding_window, s.context) * m.swa_entry_bytes
                 + gathered * m.kv_entry_bytes;
      if (l.index_source) {
        double scored = l.candidate_limited && m.candidate_positions > 0
                          ? std::min<double>(latents, m.candidate_positions)
                          : latents;
        index_flops = 2.0 * t * m.index_heads * m.index_head_dim * scored;
        index_bytes = s.sequences * s.context / ratio * m.index_entry_bytes;
      }
      break;
    }
  }
  double core = roofline(pairs * per_pair, r.attention, kv_bytes, r.memory);
  double indexer = index_flops > 0 ? roofline(index_flops, r.gemm, index_bytes, r.memory) : 0;
  c.attention_core = core;
  c.attention = fixed.proj + core + indexer;
  c.moe = fixed.moe;
  c.dense = fixed.dense;
  c.engram_read = fixed.engram_read;
  c.comm = fixed.comm;
  return c;
}

// What a step cost function remembers: each layer class's context-free cost (layer_fixed) per
// decode step shape without its context. Decode steps repeat their shapes (a batch of so many
// sequences) while their contexts grow, so most find theirs here; prefill chunks seldom repeat
// a shape and are not remembered.
struct shape_key {
  std::uint64_t tokens = 0;
  std::uint64_t sequences = 0;
  phase p = phase::prefill;
  bool split = false;
  bool operator==(const shape_key&) const = default;
};

struct shape_key_hash {
  std::size_t operator()(const shape_key& k) const {
    auto h = k.tokens * 0x9e3779b97f4a7c15ULL ^ (k.sequences + 0x7f4a7c15ULL) * 0xc2b2ae3d27d4eb4fULL;
    return static_cast<std::size_t>(h ^ (h >> 29) ^ (std::uint64_t{k.p == phase::decode} << 1)
                                    ^ std::uint64_t{k.split});
  }
};

using shape_memo = std::unordered_map<shape_key, std::vector<layer_fixed>, shape_key_hash>;

/// Shapes a memo keeps before it starts again (at most ~0.5 MiB): every batch size up to 512
/// sequences, with and without two micro-batches (without speculation a shape's tokens are its
/// sequences).
constexpr std::size_t shape_memo_limit = 1024;

// Each layer's index among the model's distinct layer profiles (first-seen order).
struct layer_class_map {
  std::vector<std::size_t> of;
  std::size_t distinct = 0;
};

layer_class_map make_layer_classes(const std::vector<layer_profile>& layers) {
  layer_class_map out;
  std::vector<const layer_profile*> seen;
  for (const auto& l : layers) {
    auto i = std::find_if(seen.begin(), seen.end(), [&l](auto* x) { return *x == l; });
    out.of.push_back(static_cast<std::size_t>(i - seen.begin()));
    if (i == seen.end())
      seen.push_back(&l);
  }
  out.distinct = seen.size();
  return out;
}

// The classes of `m`'s layers, remembered for the last model seen (the simulation costs every
// step of a run against the same few models; one thread per simulated world).
const layer_class_map& layer_classes(const model_profile& m) {
  thread_local std::vector<layer_profile> key;
  thread_local layer_class_map value;
  if (key != m.layers) {
    key = m.layers;
    value = make_layer_classes(m.layers);
  }
  return value;
}

// One step with (split) or without two micro-batches; `eff` is the end-to-end efficiency.
step_breakdown run_step(const model_profile& m, const hardware_profile& hw, phase p,
                        std::uint32_t ep, const batch& b, const perf_options& opt, double eff,
                        bool split, const a2a_factors& a2a, const layer_class_map& classes,
                        shape_memo* memo) {
  const double parts = split ? 2.0 : 1.0;
  // Prefill's all-to-all kernels occupy SMs while they overlap compute; decode's do not.
  const double sm_share = split && p == phase::prefill ? 1.0 - hw.comm_sm_fraction : 1.0;
  rates r;
  r.gemm = hw.fp8_flops * hw.gemm_efficiency * sm_share;
  r.attention = hw.bf16_flops * hw.attention_efficiency * sm_share;
  r.memory = hw.hbm_bytes_per_s * hw.memory_efficiency * sm_share;

  shape s;
  s.tokens = double(b.tokens) / parts;
  s.sequences = std::max(1.0, double(b.sequences) / parts);
  s.new_per_seq = s.tokens / s.sequences;
  s.context = std::max(double(b.context_tokens) / double(b.sequences),
                       double(b.tokens) / double(b.sequences));

  // Layers with equal profiles cost the same (cost_layer is a pure function of the profile and
  // the step): each distinct profile is costed once per step, with its shares of the step's
  // figures, which are then accumulated in layer order. (A model has a handful of distinct
  // profiles: they live on the stack unless there are many.)
  struct class_share {
    bool costed = false;
    double comm_one = 0;  // one micro-batch's all-to-all
    double compute = 0, comm = 0, layer = 0, engram = 0;
    double attention = 0, attention_core = 0, moe = 0, dense = 0;
  };
  constexpr std::size_t on_stack = 16;
  std::array<class_share, on_stack> stack_shares{};
  std::vector<class_share> heap_shares;
  class_share* shares = stack_shares.data();
  if (classes.distinct > on_stack) {
    heap_shares.resize(classes.distinct);
    shares = heap_shares.data();
  }

  // The classes' context-free costs for this shape: remembered (memo), or computed below.
  std::vector<layer_fixed>* known = nullptr;
  bool remembered = false;
  if (memo != nullptr && p == phase::decode) {
    if (memo->size() >= shape_memo_limit)
      memo->clear();
    auto [at, added] = memo->try_emplace(shape_key{b.tokens, b.sequences, p, split});
    if (added)
      at->second.resize(classes.distinct);
    known = &at->second;
    remembered = !added;
  }

  step_breakdown out;
  double elapsed = 0;        // compute timeline, for Engram prefetch
  double engram_ready = 0;   // when the reads issued so far have landed
  double first_comm = -1;
  for (std::size_t li = 0; li < m.layers.size(); ++li) {
    const auto& l = m.layers[li];
    auto& c = shares[classes.of[li]];
    if (!c.costed) {
      layer_fixed fixed;
      if (remembered) {
        fixed = (*known)[classes.of[li]];
      } else {
        fixed = cost_layer_fixed(m, hw, l, p, ep, s, r, opt, a2a);
        if (known != nullptr)
          (*known)[classes.of[li]] = fixed;
      }
      const auto cost = cost_layer(m, l, p, s, r, fixed);
      c.costed = true;
      c.comm_one = cost.comm;
      c.compute = parts * cost.compute() / eff;
      c.comm = parts * cost.comm;
      c.layer = split ? std::max(c.compute, c.comm) : c.compute + c.comm;
      c.engram = parts * cost.engram_read;
      c.attention = parts * cost.attention / eff;
      c.attention_core = parts * cost.attention_core / eff;
      c.moe = parts * cost.moe / eff;
      c.dense = parts * cost.dense / eff;
    }
    if (split && first_comm < 0 && c.comm > 0)
      first_comm = c.comm_one; // the first micro-batch's all-to-all has nothing to hide behind
    if (c.engram > 0) {
      engram_ready += c.engram;
      out.engram_read_s += c.engram;
      if (engram_ready > elapsed) {
        out.engram_wait_s += engram_ready - elapsed;
        elapsed = engram_ready;
      }
    }
    elapsed += c.layer;
    out.attention_s += c.attention;
    out.attention_by_kind_s[static_cast<std::size_t>(l.attention)] += c.attention_core;
    out.moe_s += c.moe;
    out.dense_s += c.dense;
    out.communication_s += c.comm;
    out.overlap_s += c.compute + c.comm - c.layer;
  }
  if (first_comm > 0) {
    elapsed += first_comm;
    out.overlap_s -= first_comm;
  }
  // The lm head: once per sequence in prefill, once per token in decode (BF16 weights).
  double head_tokens = p == phase::prefill ? double(b.sequences) : double(b.tokens);
  double head_params = double(m.hidden) * m.vocab;
  double head = roofline(2.0 * head_tokens * head_params, r.gemm,
                         head_params * m.head_bytes_per_param, r.memory)
                / eff;
  out.dense_s += head;
  elapsed += head;
  out.total_s = elapsed;
  return out;
}

// step_time with the layer classes and the all-to-all factors of (model, hardware, phase, ep)
// given: make_step_cost computes them once for all the steps it costs.
result<step_breakdown> planned_step_time(const model_profile& m, const hardware_profile& hw,
                                         phase p, std::uint32_t ep, const batch& b,
                                         const perf_options& opt,
                                         const layer_class_map& classes,
                                         const a2a_factors& a2a, shape_memo* memo) {
  using r_t = result<step_breakdown>;
  if (ep == 0)
    return r_t::failure("ep must be at least 1");
  if (b.tokens == 0)
    return r_t::failure("a step needs at least one token");
  if (b.sequences == 0)
    return r_t::failure("a step needs at least one sequence");
  if (b.sequences > b.tokens)
    return r_t::failure("a step cannot have more sequences (" + std::to_string(b.sequences)
                        + ") than tokens (" + std::to_string(b.tokens) + ")");
  if (m.layers.empty())
    return r_t::failure("the model has no layers");
  double eff = p == phase::prefill ? opt.prefill_efficiency : opt.decode_efficiency;
  if (!(eff > 0 && eff <= 1))
    return r_t::failure("end-to-end efficiency must be in (0, 1]");

  // The engine splits the batch into two micro-batches when that is faster (it usually is once
  // the all-to-all is worth hiding); a one-token batch cannot be split.
  auto best = run_step(m, hw, p, ep, b, opt, eff, false, a2a, classes, memo);
  if (opt.two_micro_batches && ep > 1 && b.tokens >= 2) {
    auto split = run_step(m, hw, p, ep, b, opt, eff, true, a2a, classes, memo);
    if (split.total_s < best.total_s)
      best = split;
  }
  auto& out = best;
  out.tokens_per_s_per_node = double(b.tokens) * hw.gpus_per_node / out.total_s;
  return out;
}

} // namespace

std::string to_string(phase p) {
  return p == phase::prefill ? "prefill" : "decode";
}

batch prefill_batch(std::uint64_t tokens_per_gpu, std::uint64_t prompt_tokens) {
  batch b;
  b.tokens = tokens_per_gpu;
  if (prompt_tokens == 0 || tokens_per_gpu == 0)
    return b;
  std::uint64_t whole = tokens_per_gpu / prompt_tokens;
  std::uint64_t rest = tokens_per_gpu % prompt_tokens;
  b.sequences = whole + (rest > 0 ? 1 : 0);
  b.context_tokens = b.sequences * prompt_tokens;
  return b;
}

batch decode_batch(std::uint64_t requests_per_gpu, std::uint64_t context_tokens) {
  batch b;
  b.tokens = requests_per_gpu;
  b.sequences = requests_per_gpu;
  b.context_tokens = requests_per_gpu * std::max<std::uint64_t>(context_tokens, 1);
  return b;
}

result<step_breakdown> step_time(const model_profile& m, const hardware_profile& hw, phase p,
                                 std::uint32_t ep, const batch& b, const perf_options& opt) {
  return planned_step_time(m, hw, p, ep, b, opt, layer_classes(m), make_a2a(m, hw, p, ep),
                           nullptr);
}

double schedule_seconds(const runtime::device_step& step, const perf_options& opt) {
  if (step.sequences == 0)
    return 0.0;
  return opt.schedule_fixed_s + opt.schedule_per_sequence_s * static_cast<double>(step.sequences);
}

double draft_seconds(const model_profile& model, const hardware_profile& hw, std::uint32_t ep,
                     const runtime::device_step& step, const perf_options& opt) {
  const std::uint64_t proposing = step.proposing;
  if (model.draft_layers == 0 || model.layers.empty() || step.sequences == 0 || proposing == 0)
    return 0.0;
  const std::uint64_t context = step.context_tokens / step.sequences;
  batch d;
  d.tokens = proposing * dspark_block_tokens;
  d.sequences = proposing;
  d.context_tokens =
    proposing * (dspark_block_tokens + std::min<std::uint64_t>(context, model.sliding_window));
  auto r = step_time(model, hw, phase::decode, std::max<std::uint32_t>(ep, 1), d, opt);
  if (!r)
    return 0.0;
  return r->total_s * model.draft_layers / static_cast<double>(model.layers.size());
}

std::vector<double> expert_loads(const model_profile& model, double skew, std::uint64_t shift) {
  const auto E = model.routed_experts;
  std::vector<double> load(E);
  if (E == 0)
    return load;
  // Zipf over a fixed permutation (stride coprime with E when possible), so hot experts do
  // not sit side by side in one contiguous range; a shift moves each rank one place on.
  std::uint32_t stride = 37;
  while (std::gcd(stride, E) != 1)
    ++stride;
  for (std::uint32_t i = 0; i < E; ++i)
    load[((std::uint64_t{i} + shift % E) * stride + 11) % E] = 1.0 / std::pow(i + 1.0, skew);
  return load;
}

std::uint32_t eplb_slots_per_rank(const model_profile& model, std::uint32_t ep) {
  const auto E = model.routed_experts;
  return ep == 0 ? 0 : (E + ep - 1) / ep + 1;
}

double expert_balance(const model_profile& model, std::uint32_t ep, double skew, bool eplb) {
  const auto E = model.routed_experts;
  if (E == 0 || ep <= 1)
    return 1.0;
  const auto load = expert_loads(model, skew, 0);
  if (!eplb)
    return actors::contiguous_placement(load, ep).balancedness();
  auto placed = actors::place_experts({load, ep, eplb_slots_per_rank(model, ep)});
  return std::get<actors::expert_placement>(placed).balancedness();
}

runtime::step_cost_fn make_step_cost(model_profile model, hardware_profile hw, std::uint32_t ep,
                                     perf_options opt) {
  // What every step of this (model, hardware, ep) shares, computed once: the layers' classes
  // and each phase's all-to-all factors (step_time computes them per call); and, per step
  // shape, the layers' context-free costs (shape_memo).
  const auto at = std::max<std::uint32_t>(ep, 1);
  auto classes = make_layer_classes(model.layers);
  std::array<a2a_factors, 2> a2a{make_a2a(model, hw, phase::prefill, at),
                                 make_a2a(model, hw, phase::decode, at)};
  return [model = std::move(model), hw = std::move(hw), ep, at, opt, classes = std::move(classes),
          a2a, memo = shape_memo{}](const runtime::device_step& step) mutable -> runtime::duration {
    if (step.tokens == 0)
      return runtime::duration{0};
    batch b;
    b.tokens = step.tokens;
    b.sequences = std::clamp<std::uint64_t>(step.sequences, 1, step.tokens);
    b.context_tokens = step.context_tokens;
    phase p = step.phase == runtime::step_phase::decode ? phase::decode : phase::prefill;
    auto r = planned_step_time(model, hw, p, at, b, opt, classes,
                               a2a[p == phase::decode ? 1 : 0], &memo);
    if (!r)
      return runtime::duration{0};
    const double forward = r->total_s + draft_seconds(model, hw, ep, step, opt);
    double host = step.masks * opt.mask_s;
    if (step.first_constraint_age >= runtime::duration{0})
      host = std::max(host, opt.compile_s - runtime::to_seconds(step.first_constraint_age));
    return runtime::from_seconds(std::max(forward, host));
  };
}

} // namespace troupe::cluster::sim

namespace troupe::cluster::sim {

double weight_bytes_per_gpu(const model_profile& m, std::uint32_t ep) {
  const double head = 2.0 * double(m.hidden) * m.vocab; // embedding and lm head
  const double routed = double(m.moe_layer_count()) * m.routed_experts * m.expert_params;
  const double engram = m.engram_table_rows * m.engram_head_dim;
  const double rest = m.total_params - head - routed - engram;
  return rest * m.dense_bytes_per_param + head * m.head_bytes_per_param
         + routed * m.expert_bytes_per_param / std::max<std::uint32_t>(ep, 1);
}

result<instance_memory> memory_of_instance(const model_profile& m, const hardware_profile& hw,
                                           std::uint32_t gpus, std::uint32_t ep) {
  using r_t = result<instance_memory>;
  if (gpus == 0 || ep == 0)
    return r_t::failure("an instance needs at least one GPU and an EP size of at least 1");
  const double per_gpu = weight_bytes_per_gpu(m, ep);
  instance_memory out;
  out.hbm_bytes = hw.hbm_bytes * gpus;
  out.weight_bytes = per_gpu * gpus;
  out.workspace_bytes = out.hbm_bytes * workspace_share;
  out.kv_bytes = out.hbm_bytes - out.weight_bytes - out.workspace_bytes;
  if (!(out.kv_bytes > 0))
    return r_t::failure(fmt::format(
      "{} on {} GPU(s) of {} with EP {}: its weights need {:.0f} GB per GPU and the workspace "
      "{:.0f} GB of the {:.0f} GB of HBM, which leaves no room for KV (use more GPUs per "
      "instance, or a larger EP)",
      m.name, gpus, hw.name, ep, per_gpu / 1e9, hw.hbm_bytes * workspace_share / 1e9,
      hw.hbm_bytes / 1e9));
  out.kv_tokens = m.kv_bytes_per_token > 0
                    ? static_cast<std::uint64_t>(out.kv_bytes / m.kv_bytes_per_token)
                    : std::numeric_limits<std::uint64_t>::max();
  return out;
}

} // namespace troupe::cluster::sim
