// token_constraints: what a device asks, while sampling, about the tokens a sequence may take.
//
// Structured output (docs/structured-output.md) constrains a request's tokens to a grammar. The
// grammar lives with the API layer (it compiled the schema); the device only needs, at the
// moment it draws sequence S's token at position p, the set of allowed ids, and afterwards to
// report the id it drew so that the constraint advances. This interface is that exchange, so
// that ports depend on no grammar code. Implementations are called from device compute threads
// and must be thread-safe.
#pragma once

#include <cstdint>
#include <span>

namespace troupe::runtime {

class token_constraints {
 public:
  virtual ~token_constraints() = default;

  /// Whether sequence `sequence`'s token at absolute position `position` (prompt included) is
  /// constrained; if so, `mask` (one bit per token id, bit id % 32 of word id / 32, sized for
  /// the vocabulary) holds the allowed ids. At least one bit is set when it returns true.
  virtual bool allowed(std::uint64_t sequence, std::uint64_t position, std::span<std::uint32_t> mask) = 0;

  /// The id drawn for `sequence` at `position` (after allowed() said true or false for it).
  virtual void accepted(std::uint64_t sequence, std::uint64_t position, std::int32_t token) = 0;
};

}  // namespace troupe::runtime
