// Request traces for the simulated cluster: the request record, the Mooncake and Azure trace
// readers, and the prefix-cache hit rate of a trace.
//
// The simulated world replays requests: when each arrives, how long its prompt is, how many
// tokens it generates, and which 128-token KV blocks its prompt is made of, so that the
// cluster KV cache can hit or miss on them. Public traces give this in different shapes:
// Mooncake's JSONL names 512-token prefix blocks by remapped hash ids, Azure's CSV has only
// lengths and wall-clock times. This file turns both into one `request_record` whose `blocks`
// are 128-token block keys in prefix order (the store's granularity), reports every bad line
// as `file:line: what is wrong` (skipped, or fatal in strict mode), and measures the block
// and token hit rate a trace gives an unlimited cache, which checks the block keys against a
// figure known for the Mooncake trace. Synthetic workloads live in `workload.hpp`; the
// formats, the key scheme and the measured figures are documented in docs/traces.md.
#pragma once

#include "runtime/time.hpp"

#include <cstdint>
#include <filesystem>
#include <istream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::cluster::sim {

/// Tokens in one KV block of the store; `request_record::blocks` are at this granularity.
inline constexpr std::uint32_t block_tokens = 128;

/// Tokens per hash id in Mooncake traces.
inline constexpr std::uint32_t mooncake_block_tokens = 512;

/// The traffic class of a request (it decides, among others, the TTL of its persisted KV).
enum class traffic_class { chatbot, agent };

/// The lowercase name of a class as written in topology files ("chatbot", "agent").
std::string_view to_string(traffic_class c) noexcept;

/// One request of a workload, as the simulated cluster replays it.
struct request_record {
  /// Arrival time since the start of the trace (after any speedup).
  runtime::duration arrival{};
  /// Prompt length in tokens (≥ 1).
  std::uint64_t input_tokens = 0;
  /// Tokens the request generates (≥ 1).
  std::uint64_t output_tokens = 0;
  /// Keys of the prompt's 128-token blocks in prefix order: exactly
  /// ceil(input_tokens / 128) of them, every block full but the last, which holds the
  /// remainder. Equal keys mean equal content *and* equal prefix before it (the keys form a
  /// hash chain), so a cache can match a prompt block by block on keys alone.
  std::vector<std::uint64_t> blocks;
  traffic_class traffic = traffic_class::chatbot;
  /// The conversation or agent session the request belongs to. Traces without session
  /// information give each request a session of its own.
  std::uint64_t session = 0;
  /// Images attached to the prompt (0 when none or unknown).
  std::uint32_t images = 0;

  /// Tokens of block `i` (< blocks.size()): 128, or the remainder for the last block.
  std::uint64_t block_length(std::size_t i) const noexcept;

  friend bool operator==(const request_record&, const request_record&) = default;
};

/// The block count of a prompt of `tokens` tokens at `granularity` tokens per block.
constexpr std::uint64_t blocks_for(std::uint64_t tokens, std::uint64_t granularity) noexcept {
  return (tokens + granularity - 1) / granularity;
}

/// The 128-token block key of sub-block `sub` (0..3) of Mooncake hash id `hash_id`, when that
/// sub-block holds `length` tokens (1..128). The key is a bijective 64-bit mix of
/// `(hash_id · 4 + sub) · 128 + (length − 1)`, so it is the same for the same triple and
/// differs for any other triple: keys never collide across hash ids, sub-blocks or lengths
/// (for hash ids below 2^55, which the reader enforces). Requires sub < 4, 1 ≤ length ≤ 128.
std::uint64_t mooncake_block_key(std::uint64_t hash_id, std::uint32_t sub,
                                 std::uint32_t length) noexcept;

/// Appends to `out` the 128-token block keys of a prompt of `input_tokens` tokens described by
/// Mooncake hash ids (one per 512 tokens, the last block possibly partial): four keys per full
/// hash id, ceil(rest / 128) for a partial last one, whose own last key encodes its length.
/// Requires hash_ids.size() == ceil(input_tokens / 512).
void expand_mooncake_blocks(const std::vector<std::uint64_t>& hash_ids,
                            std::uint64_t input_tokens, std::vector<std::uint64_t>& out);

/// The longest span a trace may cover (after its speedup): 7 days of virtual time. A record
/// arriving later is a bad line (the simulator keeps per-second tables over the run, so an
/// arrival a million years out would exhaust memory instead of failing).
inline constexpr runtime::duration max_trace_span = std::chrono::hours(24 * 7);

/// How to read a trace.
struct load_options {
  /// Arrival times are divided by this factor (2 replays the trace twice as fast). > 0.
  double speedup = 1.0;
  /// Keep at most this many records (the earliest ones).
  std::optional<std::size_t> max_records;
  /// Keep only records arriving before this time (measured after the speedup).
  std::optional<runtime::duration> max_duration;
  /// A bad line fails the whole load instead of being skipped.
  bool strict = false;
  /// The traffic class given to every record (neither format carries one).
  traffic_class traffic = traffic_class::chatbot;
};

/// A problem found while reading a trace.
struct trace_diagnostic {
  std::string file;
  std::uint32_t line = 0; // 1-based; 0 when the problem is not on a line (unreadable file)
  std::string message;

  /// `file:line: message`, or `file: message` when line is 0.
  std::string to_string() const;
};

/// What reading a trace gave.
struct trace_load {
  /// The records in arrival order (ties in file order); empty when the load failed.
  std::vector<request_record> records;
  /// Every bad line (skipped unless strict) and any fatal problem.
  std::vector<trace_diagnostic> diagnostics;
  /// False when the file could not be read, the options are invalid, or a line was bad in
  /// strict mode.
  bool ok = true;
};

/// Reads Mooncake JSONL from `in`; `file_name` only labels the diagnostics.
/// Each non-blank line must be a JSON object with `timestamp` (milliseconds since the trace
/// start, ≥ 0), `input_length` (integer ≥ 1), `output_length` (integer ≥ 1) and `hash_ids`
/// (ceil(input_length / 512) integers in [0, 2^55)); other keys are ignored. A line that
/// breaks any of this is reported with its number and skipped (or fails the load if strict).
/// Arrival is the timestamp divided by the speedup; sessions are the record's index in the
/// file. Never throws.
trace_load parse_mooncake(std::istream& in, std::string_view file_name,
                          const load_options& options = {});

/// Reads a Mooncake JSONL file (see parse_mooncake). An unreadable file fails the load with
/// one diagnostic at line 0.
trace_load load_mooncake(const std::filesystem::path& file, const load_options& options = {});

/// Reads an Azure LLM inference trace CSV from `in`; `file_name` only labels diagnostics.
/// The first line must be the header `TIMESTAMP,ContextTokens,GeneratedTokens` (a wrong
/// header fails the load); each further non-blank line is `YYYY-MM-DD HH:MM:SS[.fraction]`,
/// an integer ≥ 1 and an integer ≥ 1. Arrival is the time since the earliest valid row,
/// divided by the speedup. The format has no reuse information, so every record's blocks are
/// keys of its own (derived from its line number) that never hit; sessions are the record's
/// index in the file. Never throws.
trace_load parse_azure(std::istream& in, std::string_view file_name,
                       const load_options& options = {});

/// Reads an Azure CSV file (see parse_azure). An unreadable file fails the load with one
/// diagnostic at line 0.
trace_load load_azure(const std::filesystem::path& file, const load_options& options = {});

/// Reads a trace file in the format its extension names: `.jsonl` is Mooncake, `.csv` is
/// Azure (case-insensitive). Any other extension fails the load with one diagnostic at line 0
/// naming the accepted ones.
trace_load load_trace(const std::filesystem::path& file, const load_options& options = {});

/// Hits and totals of a cache replay.
struct hit_rate {
  std::uint64_t blocks = 0;
  std::uint64_t hit_blocks = 0;
  std::uint64_t tokens = 0;
  std::uint64_t hit_tokens = 0;

  /// hit_blocks / blocks (0 when there are no blocks).
  double block_rate() const noexcept;
  /// hit_tokens / tokens (0 when there are no tokens).
  double token_rate() const noexcept;
};

/// Replays `records` in order against an unlimited prefix cache at `granularity` tokens per
/// block (a positive multiple of 128: a block groups granularity/128 consecutive 128-token
/// keys, the last group possibly shorter, and is identified by the hash of its keys).
/// For each request the hit blocks are the longest run of its blocks, from the first, that
/// are all in the cache; then all its blocks enter the cache. Only prompts are cached
/// (generated tokens come back through later prompts). Token hits count the tokens of the
/// hit blocks. Aborts (TROUPE_CHECK) on a granularity that is not a positive multiple of 128.
hit_rate prefix_hit_rate(const std::vector<request_record>& records,
                         std::uint32_t granularity = block_tokens);

} // namespace troupe::cluster::sim
