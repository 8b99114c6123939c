// The performance model: how long one device step of a DeepSeek MoE model takes on a hardware.
//
// The simulated world replaces every GPU with a device port that answers each step after a
// modelled duration, so the cluster's control code (batching, routing, autoscaling) sees
// realistic timing without GPUs. That duration comes from here: a roofline per layer (attention
// by layer kind, MoE grouped GEMMs, dense parts, Engram table reads) with efficiency factors
// from published kernel measurements, plus the expert-parallel dispatch/combine all-to-all over
// the fabric it crosses, overlapped with compute by two micro-batches as DeepSeek's engine does.
// Two end-to-end factors are fitted so that DeepSeek-V3 on H800 reproduces DeepSeek's published
// profile; docs/perf-model.md lists every factor, its source and the calibration results.
//
// Everything is a pure function of its arguments: same inputs, same duration, so the simulated
// world stays deterministic.
#pragma once

#include "cluster/sim/hardware.hpp"
#include "cluster/sim/model_profile.hpp"
#include "cluster/sim/result.hpp"
#include "runtime/ports/device.hpp"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cluster::sim {

enum class phase : std::uint8_t { prefill, decode };

std::string to_string(phase p);

/// What one GPU computes in one step.
struct batch {
  /// Tokens computed (summed over sequences); at least 1.
  std::uint64_t tokens = 0;
  /// Sequences in the batch; at least 1 and at most `tokens`.
  std::uint64_t sequences = 0;
  /// KV length each sequence has after the step, summed over sequences (prefix + new tokens).
  /// Values below `tokens` are read as `tokens` (no cached prefix).
  std::uint64_t context_tokens = 0;
};

/// Prefill of prompts of `prompt_tokens` each, `tokens_per_gpu` tokens per GPU: whole prompts,
/// and where the tokens do not divide evenly, one more sequence that is the tail of a prompt
/// whose head ran earlier (a prompt split across micro-batches or steps), so every sequence
/// attends over a whole prompt. Fewer tokens than one prompt is one chunk of a chunked prefill.
batch prefill_batch(std::uint64_t tokens_per_gpu, std::uint64_t prompt_tokens);

/// Decode: one new token for each of `requests_per_gpu` sequences with `context_tokens` of KV.
batch decode_batch(std::uint64_t requests_per_gpu, std::uint64_t context_tokens);

/// Knobs of the model that are not hardware: the fitted end-to-end factors and the serving
/// choices. Defaults are the calibrated values (docs/perf-model.md).
struct perf_options {
  /// Fraction of the kernel-level roofline that the whole engine reaches (launch gaps, norms,
  /// rope, quantization, routing and permutation kernels, micro-batch bookkeeping). Fitted to
  /// DeepSeek's V3 H800 profile.
  double prefill_efficiency = 0.615;
  double decode_efficiency = 0.527;
  /// Split the batch into two micro-batches so one's all-to-all overlaps the other's compute.
  bool two_micro_batches = true;
  /// Fraction of Engram rows found in the host-memory cache (the rest are SSD random reads).
  double engram_host_hit_ratio = 0.95;
  /// The balancedness of the routed experts' load over the EP ranks: mean / max rank load (1:
  /// perfect, the calibration's assumption). A step waits for the busiest rank, so its routed
  /// expert GEMMs and its all-to-all traffic are those of 1 / moe_balance times the mean rank's
  /// tokens. `expert_balance` computes it for a skewed load.
  double moe_balance = 1.0;
  /// The scheduler's CPU time per decode step on one GPU's host thread (a scheduler per
  /// data-parallel attention rank, as DeepSeek's decode runs): a fixed part (admission, the
  /// step's launch) and a part per sequence (batch composition, block tables, sampling
  /// parameters, the previous step's tokens). The device waits for it unless the step was built
  /// while the previous one ran (overlapped scheduling). Assumed, not calibrated
  /// (docs/perf-model.md).
  double schedule_fixed_s = 300e-6;
  double schedule_per_sequence_s = 2e-6;
  /// Structured output: the host CPU time to build one token mask of a decode step
  /// (device_step::masks). A GPU's host builds its sequences' masks while the forward runs
  /// (they depend only on tokens already sampled, and on the drafts a step verifies), so a
  /// step takes the longer of the two. 10 µs: troupe's warm masks on the JSON workloads of
  /// bench_grammar are 3.5–11 µs at the median on this machine's CPU (docs/benchmarks.md); a
  /// state's first mask later in the output, up to milliseconds, is not modelled.
  double mask_s = 10e-6;
  /// Structured output: the compile of a request's constraint, with its first mask, on the
  /// entrypoint's compile pool from the request's admission. A step that samples a constrained
  /// sequence for the first time lasts at least what is left of it
  /// (device_step::first_constraint_age). 1.5 ms: bench_grammar's compile of a strict record or
  /// a strict tool was 0.9–1.5 ms at the median on this machine, 0.6–1.0 ms since 2026-12-04
  /// (docs/benchmarks.md), so the figure is on the safe side of a loaded host; every
  /// constrained request is taken to bring a format not compiled before.
  double compile_s = 1.5e-3;
};

/// The scheduler's time to build a step of one GPU (perf_options::schedule_*): 0 for a step
/// without sequences.
double schedule_seconds(const runtime::device_step& step, const perf_options& opt = {});

/// The balancedness (perf_options::moe_balance) of `model`'s routed experts over `ep` ranks
/// when their load follows a Zipf law of exponent `skew` (0: every expert alike) over a fixed
/// permutation of the experts: placed in contiguous ranges, or by EPLB
/// (actors/lb/expert_placement.hpp) with one spare slot per rank for copies of hot experts.
/// 1 for a model without routed experts or ep <= 1.
double expert_balance(const model_profile& model, std::uint32_t ep, double skew, bool eplb);

/// The load of each of `model`'s routed experts as expert_balance assumes it, with the hot
/// ranking moved `shift` places along the permutation (a drifting load: the experts that were
/// hottest cool, others heat up; shift 0 is expert_balance's).
std::vector<double> expert_loads(const model_profile& model, double skew, std::uint64_t shift);

/// Expert slots per rank of an EP group of `ep` ranks under EPLB: its share of the experts
/// and one spare slot for a copy of a hot expert.
std::uint32_t eplb_slots_per_rank(const model_profile& model, std::uint32_t ep);

/// Where a step's time goes, in seconds. `total_s` is the step time; the parts are the modelled
/// busy times (already divided by the end-to-end efficiency) and do not add up to it:
/// attention + moe + dense + communication - overlap + engram_wait = total.
struct step_breakdown {
  double attention_s = 0;      // attention blocks: projections, indexer, core attention
  double moe_s = 0;            // routed and shared experts, router
  double dense_s = 0;          // dense FFN layers, Engram projections, lm head
  double engram_read_s = 0;    // Engram table reads (prefetched in parallel with compute)
  double engram_wait_s = 0;    // the part of the reads compute had to wait for
  double communication_s = 0;  // EP dispatch + combine
  double overlap_s = 0;        // communication hidden behind compute by micro-batching
  double total_s = 0;
  /// Core-attention time by layer kind (indexed by attention_kind).
  std::array<double, 6> attention_by_kind_s{};
  /// Tokens this step produces per second per node (prefill: input tokens; decode: tokens).
  double tokens_per_s_per_node = 0;

  runtime::duration step() const { return runtime::from_seconds(total_s); }
};

/// The time of one step of `model` on `hw` in `p` with expert parallelism `ep`, for the batch
/// one GPU holds (every GPU of the EP group is assumed to hold a like batch and a balanced share
/// of the routed experts). Fails, with a message, when ep is 0, the batch has no tokens or
/// sequences, or sequences exceed tokens.
result<step_breakdown> step_time(const model_profile& model, const hardware_profile& hw, phase p,
                                 std::uint32_t ep, const batch& b, const perf_options& opt = {});

/// Device memory of one instance: `gpus` GPUs of `hw` serving `model` with expert parallelism
/// `ep`. Every GPU holds the weights that are not routed experts (attention, shared experts,
/// dense layers, router, compressor / indexer, Engram projections; the embedding and lm head
/// in BF16) and 1/ep of the routed experts; the Engram tables stay in host memory and on SSD.
/// A share of HBM (`workspace_share`) is kept for activations, communication buffers and the
/// allocator's slack; what is left holds KV.
struct instance_memory {
  double hbm_bytes = 0;       // gpus × the part's HBM
  double weight_bytes = 0;    // weights on all the instance's GPUs
  double workspace_bytes = 0; // hbm_bytes × workspace_share
  double kv_bytes = 0;        // hbm − weights − workspace (> 0)
  /// Block-KV tokens that fit in kv_bytes (model.kv_bytes_per_token each).
  std::uint64_t kv_tokens = 0;
};

/// The weight bytes one GPU of an EP group of size `ep` holds (see instance_memory).
double weight_bytes_per_gpu(const model_profile& model, std::uint32_t ep);

/// The share of HBM kept out of the KV budget (activations, buffers, slack).
inline constexpr double workspace_share = 0.10;

/// `instance_memory` of an instance; fails with a message naming the sizes when its weights
/// and workspace leave no HBM for KV (too few GPUs for the model: a larger EP is needed), or
/// when gpus or ep is 0.
result<instance_memory> memory_of_instance(const model_profile& model, const hardware_profile& hw,
                                           std::uint32_t gpus, std::uint32_t ep);

/// Tokens of a DSpark draft block per sequence (the anchor and four noise tokens, drafting
/// five tokens).
inline constexpr std::uint64_t dspark_block_tokens = 5;

/// The draft layers' time in a step whose sequences ask for drafts (`proposing`): the model's
/// draft_layers run a block of dspark_block_tokens per proposing sequence, attending over the
/// sliding window (at most) and the block; charged as draft_layers / layers of a decode step of
/// those tokens (an average backbone layer: the draft layers' own attention is windowed and
/// their MoE smaller, so this errs high). 0 for a model without draft layers or a step that
/// proposes nothing.
double draft_seconds(const model_profile& model, const hardware_profile& hw, std::uint32_t ep,
                     const runtime::device_step& step, const perf_options& opt = {});

/// A device-port cost function for one GPU rank of an EP group: each `device_step` is costed by
/// `step_time` from its phase (encode is costed as prefill), tokens, sequences and
/// context_tokens, plus draft_seconds when rows ask for drafts. A step with no tokens costs
/// nothing; zero sequences count as one.
runtime::step_cost_fn make_step_cost(model_profile model, hardware_profile hw, std::uint32_t ep,
                                     perf_options opt = {});

} // namespace troupe::cluster::sim
