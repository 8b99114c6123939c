#pragma once
// The matcher: runs a grammar (grammar.hpp) over output bytes with an explicit stack.
//
// A configuration is a stack of (rule, state) frames: the top frame is the rule being matched,
// the frames below hold the states to return to. Because rules may be ambiguous (anyOf branches
// that begin alike, a byte edge beside a call), the matcher keeps the set of stacks that are
// still possible, after closing it over calls and returns, so that every stack kept waits for a
// byte. That set is the whole state: a small value that can be copied, compared, serialised and
// restored on another instance of the same grammar, and the matcher keeps the states before each
// accepted token for rollback (speculative decoding).

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "recipe/grammar/grammar.hpp"

namespace troupe::recipe::grammar {

struct frame {
  std::uint32_t rule = 0, state = 0;
  auto operator<=>(const frame&) const = default;
};
// Frames kept inline up to a nesting of 6, so that copying a stack (the closure and the mask
// walks copy them for every byte) allocates nothing for most outputs.
using stack = boost::container::small_vector<frame, 6>;

// A matcher state: the stacks waiting for a byte, and whether the root rule may end here.
struct match_state {
  std::vector<stack> stacks;  // sorted, distinct
  bool complete = false;      // the output so far is a whole sentence of the grammar
  bool operator==(const match_state&) const = default;
};

// Closes `raw` (stacks whose top frames may call, return or wait for a byte) into the stacks
// waiting for a byte, sorted and distinct. A return from the last frame sets `popped` (in the
// matcher: the output is complete). A call whose return state could only return again replaces
// its caller's frame (a tail call). Stacks deeper than `max_depth` are dropped.
std::vector<stack> close_stacks(const grammar& g, std::vector<stack> raw, std::size_t max_depth, bool& popped);

struct matcher_options {
  std::size_t max_depth = 256;   // nesting depth (frames); deeper outputs are refused
  std::size_t max_rollback = 32; // accepted tokens kept for rollback
};

class matcher {
 public:
  // `g` must be pruned (json_schema.hpp and compile_regex return pruned grammars).
  explicit matcher(std::shared_ptr<const grammar> g, matcher_options opt = {});

  // Accepts `bytes` as one token: true and the state advanced, or false and nothing changed.
  // An empty token is accepted and recorded (so rollback counts it).
  bool accept_token(std::string_view bytes);
  // Accepts one token that may be read as any of `texts` (its bytes, or a token symbol standing
  // for it: grammar.hpp): the state becomes every stack that some reading leads to. False, and
  // nothing changed, when no reading is accepted.
  bool accept_any(std::span<const std::string_view> texts);
  // Whether `bytes` would be accepted, without changing anything.
  bool can_accept(std::string_view bytes) const;
  // Undoes the last k accepted tokens; false (and nothing undone) when fewer than k are kept.
  bool rollback(std::size_t k);
  std::size_t rollback_depth() const { return history_.size(); }

  // The output is a whole sentence: end-of-sequence may follow.
  bool is_complete() const { return state_.complete; }
  // Some byte may follow.
  bool can_continue() const { return !state_.stacks.empty(); }
  const match_state& state() const { return state_; }
  // The current state without the rollback history: a cheap copy to build masks with elsewhere.
  matcher without_history() const;
  const grammar& rules() const { return *g_; }
  const matcher_options& options() const { return opt_; }

  // The current state as bytes (not the rollback history) and back. restore fails (nullopt)
  // when the bytes are malformed or were written for another grammar.
  std::string serialize() const;
  static std::optional<matcher> restore(std::shared_ptr<const grammar> g, std::string_view bytes,
                                        matcher_options opt = {});

 private:
  matcher(const matcher& o, int) : g_(o.g_), opt_(o.opt_), state_(o.state_) {}  // without_history()
  std::optional<match_state> advance(const match_state& from, std::string_view bytes) const;
  std::shared_ptr<const grammar> g_;
  matcher_options opt_;
  match_state state_;
  std::vector<match_state> history_;
};

}  // namespace troupe::recipe::grammar
