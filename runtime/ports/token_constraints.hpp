// token_constraints: what a device asks, while sampling, about the tokens a sequence may take.
//
// Structured output (docs/structured-output.md) constrains a request's tokens to a grammar. The
// grammar lives with the API layer (it compiled the schema); the device only needs, at the
// moment it draws sequence S's token at position p, the set of allowed ids, and afterwards to
// report the id it drew so that the constraint advances. This interface is that exchange, so
// that ports depend on no grammar code. Implementations are called from device compute threads
// and must be thread-safe.
#pragma once

#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <span>
#include <string>

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

/// A request's constraint as it travels with the request's jobs, for a device in another
/// process (`troupe launch`) to rebuild it: the format in the constraint table's own text form
/// (actors/entrypoint/structured_output.hpp; empty: unconstrained), whether the output starts
/// with free reasoning, and the absolute position of the first output token. Inside one
/// process the table is shared and this is not read.
struct constraint_spec {
  std::string format;
  bool thinking = false;
  std::uint64_t output_start = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, constraint_spec& x) {
  return f(caf::meta::type_name("constraint_spec"), x.format, x.thinking, x.output_start);
}

}  // namespace troupe::runtime
