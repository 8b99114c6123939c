// Synthetic workloads for the simulated cluster: seeded chat, agent and mixed generators.
//
// Public traces are few, short and fixed; testing a cache, an autoscaler or a load balancer
// needs traffic at any rate and length whose prefix reuse has the structure real traffic
// has. Chat traffic shares a few popular system prompts and runs multi-turn sessions where
// each turn's prompt is the previous prompt plus the previous answer plus new user text, with
// a long tail of one-off requests; agent traffic runs long sessions whose prompt grows with
// every tool call and tool result, so almost all of each prompt was seen before. These
// generators produce such `request_record`s with Poisson session arrivals, block keys that
// form a hash chain over the prompt's content (equal prefixes give equal keys), and every
// random choice drawn from the `rng` they are given: the same parameters and seed give the
// same records, bit for bit. Parameters and measured hit rates are in docs/traces.md.
#pragma once

#include "cluster/sim/trace.hpp"
#include "runtime/random.hpp"
#include "runtime/time.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cluster::sim {

/// A log-normal length in tokens: `median · e^(sigma · N(0, 1))`, rounded, clamped to
/// [min, max].
struct length_distribution {
  double median = 100;
  double sigma = 1.0;
  std::uint64_t min = 1;
  std::uint64_t max = 100'000;
};

/// Chat traffic (traffic class chatbot).
struct chat_params {
  /// Mean requests per second over the run (> 0).
  double rate = 1.0;
  /// Requests arrive in [0, duration) (> 0).
  runtime::duration duration = std::chrono::minutes{10};
  /// Distinct shared system prompts (≥ 1), chosen with Zipf popularity: prompt k (from 0)
  /// has weight 1 / (k + 1)^system_prompt_skew.
  std::uint32_t system_prompts = 16;
  double system_prompt_skew = 1.0;
  length_distribution system_prompt_tokens{600, 0.8, 32, 8'000};
  /// Share of sessions that are a single request with a prompt of its own (the long tail).
  double one_off_share = 0.3;
  /// Chance that a one-off request starts with a shared system prompt.
  double one_off_system_prompt = 0.5;
  length_distribution one_off_tokens{1'500, 1.2, 16, 100'000};
  /// Mean requests of a multi-turn session (≥ 1; 1 + a geometric count).
  double mean_turns = 5;
  /// New user text per turn.
  length_distribution user_tokens{120, 1.0, 4, 8'000};
  /// Answer length; the answer is part of the next turn's prompt.
  length_distribution output_tokens{300, 0.9, 1, 8'192};
  /// Mean (exponential) time between the end of an answer and the next turn.
  runtime::duration think_time = std::chrono::seconds{30};
  /// Assumed streaming speed of an answer, which places the next turn after it (> 0).
  double decode_tokens_per_second = 40;
  /// Chance that a turn attaches images, how many (1..max_images, uniform), tokens each.
  double image_chance = 0.0;
  std::uint32_t max_images = 4;
  std::uint64_t image_tokens = 576;
  /// A prompt longer than this drops the session's history (system prompt + new text only).
  std::uint64_t max_context = 131'072;
};

/// Agent traffic (traffic class agent).
struct agent_params {
  /// Mean requests per second over the run (> 0).
  double rate = 1.0;
  /// Requests arrive in [0, duration) (> 0).
  runtime::duration duration = std::chrono::minutes{10};
  /// Distinct agent system prompts (tools and instructions), Zipf-popular as for chat.
  std::uint32_t system_prompts = 4;
  double system_prompt_skew = 1.0;
  length_distribution system_prompt_tokens{6'000, 0.5, 1'000, 32'000};
  /// The task the user gives at the start of a session.
  length_distribution task_tokens{600, 1.0, 16, 16'000};
  /// Mean model calls of a session (≥ 1; 1 + a geometric count).
  double mean_steps = 30;
  /// Each call's output (a tool call), appended to the prompt.
  length_distribution call_tokens{120, 0.8, 8, 4'096};
  /// Each tool's result, appended to the prompt after the call.
  length_distribution result_tokens{500, 1.3, 8, 32'000};
  /// Mean (exponential) time a tool runs between a call's answer and the next call.
  runtime::duration tool_time = std::chrono::seconds{3};
  /// Assumed streaming speed of a call's output (> 0).
  double decode_tokens_per_second = 60;
  /// A prompt longer than this is compacted: system prompt + task + a fresh summary.
  std::uint64_t max_context = 200'000;
  length_distribution summary_tokens{3'000, 0.5, 500, 16'000};
};

/// Chat and agent traffic together.
struct mixed_params {
  /// Total mean requests per second (> 0) and run length (> 0); they replace the rate and
  /// duration of `chat` and `agent`.
  double rate = 1.0;
  runtime::duration duration = std::chrono::minutes{10};
  /// Share of the requests that are agent requests, in [0, 1].
  double agent_share = 0.5;
  chat_params chat;
  agent_params agent;
};

/// A generated workload, or why the parameters are invalid.
struct workload {
  /// Records in arrival order; sessions are numbered 0, 1, … in order of first arrival.
  std::vector<request_record> records;
  /// Empty when the parameters are valid; otherwise what is wrong (and no records).
  std::string error;

  bool ok() const noexcept { return error.empty(); }
};

/// Chat requests arriving in [0, duration). Sessions start as a Poisson process at
/// rate / (mean requests per session) from well before 0 (so the run begins in steady state
/// and the request rate is `rate` throughout); requests before 0 are dropped. Same parameters
/// and same `random` key ⇒ the same records. Invalid parameters give an error, no records.
workload generate_chat(const chat_params& params, const runtime::rng& random);

/// Agent requests arriving in [0, duration), as generate_chat but with agent sessions.
workload generate_agent(const agent_params& params, const runtime::rng& random);

/// Chat and agent requests merged in arrival order: chat at rate · (1 − agent_share) from
/// random.split("chat"), agent at rate · agent_share from random.split("agent").
workload generate_mixed(const mixed_params& params, const runtime::rng& random);

} // namespace troupe::cluster::sim
