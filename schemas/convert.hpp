// Plain C++ mirrors of the wire schemas, and their encoding to and from Cap'n Proto bytes.
//
// Anything that crosses a process or a disk is a Cap'n Proto message, but the rest of troupe
// should not handle Cap'n Proto builders and readers (whose accessors throw kj exceptions on
// malformed input, lazily, at any field access). This header gives each schema a plain struct
// and a pair of functions: `encode` writes a flat-array message; `decode` reads the whole
// message eagerly, turns every kj exception into a value, checks the schema's invariants, and
// so either returns a struct that is safe to use or says why the bytes were refused. Nothing
// here throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace troupe::schemas {

/// Which public API a request arrived on (mirrors `ApiProtocol` in request.capnp).
enum class api_protocol : std::uint16_t { chat_completions = 0, responses = 1, messages = 2 };

/// The kind of traffic a request belongs to (mirrors `TrafficClass` in request.capnp).
enum class traffic_class : std::uint16_t { chatbot = 0, agent = 1, batch = 2 };

/// The most tokens one KV block holds.
inline constexpr std::uint32_t max_block_tokens = 128;

/// An image a prompt refers to (mirrors `ImageRef`).
struct image_ref {
  std::string id;
  std::uint64_t byte_size = 0;
  std::uint64_t content_hash = 0;
  friend bool operator==(const image_ref&, const image_ref&) = default;
};

/// How to sample a completion (mirrors `SamplingParams`).
struct sampling_params {
  std::uint32_t max_tokens = 0;            ///< 0: the model's limit
  float temperature = 1.0f;                ///< >= 0; 0 is greedy
  float top_p = 1.0f;                      ///< in (0, 1]
  std::optional<std::uint64_t> seed;       ///< empty: the engine draws one
  std::uint32_t n = 1;                     ///< >= 1
  std::vector<std::uint32_t> stop_token_ids;
  friend bool operator==(const sampling_params&, const sampling_params&) = default;
};

/// One request as it crosses a process boundary (mirrors `RequestEnvelope`).
struct request_envelope {
  std::uint64_t request_id = 0;
  api_protocol api = api_protocol::chat_completions;
  traffic_class traffic = traffic_class::chatbot;
  std::string model;                       ///< not empty
  std::vector<std::uint32_t> prompt_tokens;
  std::vector<image_ref> images;
  sampling_params sampling;
  std::uint64_t deadline_ns = 0;           ///< ns since the epoch; 0: none; else >= arrival_ns
  std::uint64_t arrival_ns = 0;            ///< ns since the epoch
  std::int32_t priority = 0;               ///< higher runs first
  bool stream = false;
  friend bool operator==(const request_envelope&, const request_envelope&) = default;
};

/// The descriptor of one persisted KV block (mirrors `KvBlock`).
struct kv_block_descriptor {
  std::uint64_t hash = 0;                  ///< never 0
  std::uint64_t parent_hash = 0;           ///< 0 for the first block of a chain; != hash
  std::uint16_t token_count = 0;           ///< 1..max_block_tokens
  std::uint64_t byte_size = 0;
  std::uint64_t checksum = 0;              ///< payload_checksum() of the payload
  traffic_class traffic = traffic_class::chatbot;
  std::uint64_t expiry_ns = 0;             ///< ns since the epoch; 0: never
  std::uint64_t model_tag = 0;             ///< blocks with different tags never match
  friend bool operator==(const kv_block_descriptor&, const kv_block_descriptor&) = default;
};

/// A run of blocks of one sequence, first block first (mirrors `KvBlockChain`).
struct kv_block_chain {
  std::vector<kv_block_descriptor> blocks;
  friend bool operator==(const kv_block_chain&, const kv_block_chain&) = default;
};

/// Why bytes were refused by `decode` or a value by `validate`.
enum class schema_errc : std::uint8_t {
  truncated = 1,  ///< empty, not a whole number of 8-byte words, or shorter than its header says
  malformed,      ///< Cap'n Proto refused the message (bad segment table, pointer, limits, ...)
  invalid,        ///< a well-formed message whose values break the schema's invariants
};

/// The reason for a refusal: a code and a sentence for logs.
struct schema_error {
  schema_errc code;
  std::string message;
};

/// Either a decoded value or the reason there is none.
template <class T>
class decoded {
public:
  decoded(T value) : state_(std::move(value)) {}
  decoded(schema_error error) : state_(std::move(error)) {}

  /// True when a value was decoded.
  bool has_value() const noexcept { return std::holds_alternative<T>(state_); }
  explicit operator bool() const noexcept { return has_value(); }

  /// The value. Precondition: has_value().
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }

  /// The reason for the refusal. Precondition: !has_value().
  const schema_error& error() const { return std::get<schema_error>(state_); }

private:
  std::variant<T, schema_error> state_;
};

/// Checks the invariants of `RequestEnvelope`: model not empty, temperature finite and >= 0,
/// top_p in (0, 1], n >= 1, deadline 0 or not before arrival. Returns the first broken one
/// (code `invalid`), or nothing when all hold.
std::optional<schema_error> validate(const request_envelope& x);

/// Checks the invariants of `KvBlock`: hash != 0, parent_hash != hash, token_count in
/// 1..max_block_tokens. Returns the first broken one (code `invalid`), or nothing.
std::optional<schema_error> validate(const kv_block_descriptor& x);

/// Checks every block, and that the chain is linked: each block's parent_hash is the previous
/// block's hash, all blocks share one model_tag, and only the last block holds fewer than
/// max_block_tokens tokens. An empty chain is valid. Returns the first broken rule, or nothing.
std::optional<schema_error> validate(const kv_block_chain& x);

/// Encodes `x` as one flat-array Cap'n Proto message (segment table, then segments); the size
/// is a multiple of 8. Encodes whatever it is given: validity is checked by the reader.
std::vector<std::byte> encode(const request_envelope& x);
std::vector<std::byte> encode(const kv_block_descriptor& x);
std::vector<std::byte> encode(const kv_block_chain& x);

/// Decodes one flat-array message that must fill `bytes` exactly (no trailing bytes); `bytes`
/// need not be aligned. T is request_envelope, kv_block_descriptor or kv_block_chain. Returns
/// the value; or `truncated` / `malformed` for bytes Cap'n Proto cannot read; or `invalid` for
/// an enumerant this build does not know or a value that `validate` refuses. Never throws.
template <class T>
decoded<T> decode(std::span<const std::byte> bytes);

template <>
decoded<request_envelope> decode<request_envelope>(std::span<const std::byte> bytes);
template <>
decoded<kv_block_descriptor> decode<kv_block_descriptor>(std::span<const std::byte> bytes);
template <>
decoded<kv_block_chain> decode<kv_block_chain>(std::span<const std::byte> bytes);

/// The checksum a `KvBlock` carries for its payload: xxhash64 with seed 0.
std::uint64_t payload_checksum(std::span<const std::byte> payload) noexcept;

} // namespace troupe::schemas
