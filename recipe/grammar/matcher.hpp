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

#include <algorithm>
#include <compare>
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

// A stack of frames, the top one last. Frames kept inline up to a nesting of 6, so that copying
// a stack (the closure and the mask walks copy them for every byte) allocates nothing for most
// outputs. Only a rule without calls has budgets (grammar.hpp), so only the top frame may be
// budgeted, and the stack holds what is left of its budgets: `tokens` (its top bit
// `charged_bit` set once the token being read took a byte in the frame, so that a token counts
// once) and `chars`; 0 when the top frame has none.
struct stack : boost::container::small_vector<frame, 6> {
  using small_vector::small_vector;
  static constexpr std::uint32_t charged_bit = 0x80000000u;
  std::uint32_t tokens = 0, chars = 0;
  std::uint32_t tokens_left() const { return tokens & ~charged_bit; }
  bool charged() const { return (tokens & charged_bit) != 0; }
  friend bool operator==(const stack& a, const stack& b) {
    return a.tokens == b.tokens && a.chars == b.chars &&
           static_cast<const small_vector&>(a) == static_cast<const small_vector&>(b);
  }
  friend bool operator<(const stack& a, const stack& b) {
    const auto c = std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
    if (c != 0) return c < 0;
    return (std::uint64_t{a.tokens} << 32 | a.chars) < (std::uint64_t{b.tokens} << 32 | b.chars);
  }
};

// Pushes a frame entering `rule` at its start (or, `replace`, puts it in place of the top frame:
// a tail call), with the rule's whole budgets.
inline void enter(const grammar& g, stack& s, std::uint32_t rule, bool replace = false) {
  if (replace) s.back() = {rule, 0};
  else s.push_back({rule, 0});
  const auto& r = g.rules[rule];
  s.tokens = r.max_tokens == no_budget ? 0 : r.max_tokens;
  s.chars = r.max_chars == no_budget ? 0 : r.max_chars;
}
// Counts byte b against the budgets of the top frame of `s` (of budgeted rule `r`): a token's
// first byte in it spends a token, a byte that begins a character a character. False, nothing
// changed, when one is spent.
bool charge(const rule& r, stack& s, unsigned char b);
// Steps the top frame of `s` on byte b: its rule's edge, within its budgets. False, nothing
// changed, when the rule or a spent budget refuses b.
inline bool step_top(const grammar& g, stack& s, unsigned char b) {
  frame& f = s.back();
  const rule& r = g.rules[f.rule];
  const auto t = r.step(f.state, b);
  if (t == no_state || (r.budgeted() && !charge(r, s, b))) return false;
  f.state = static_cast<std::uint32_t>(t);
  return true;
}
// Whether the top frame of `s` may take some byte: its rule's state has an edge its budgets allow.
bool can_step(const grammar& g, const stack& s);

// A matcher state: the stacks waiting for a byte, and whether the root rule may end here.
struct match_state {
  std::vector<stack> stacks;  // sorted, distinct
  bool complete = false;      // the output so far is a whole sentence of the grammar
  bool operator==(const match_state&) const = default;
};

// Closes `raw` (stacks whose top frames may call, return or wait for a byte) into the stacks
// waiting for a byte (can_step), sorted and distinct. A return from the last frame sets `popped`
// (in the matcher: the output is complete). A call whose return state could only return again
// replaces its caller's frame (a tail call). Stacks deeper than `max_depth` are dropped.
std::vector<stack> close_stacks(const grammar& g, std::vector<stack> raw, std::size_t max_depth, bool& popped);
// The end of a token: clears the top frames' `charged` marks and drops the stacks that then may
// take no byte (a spent token budget); `stacks` stays sorted and distinct. Nothing to do (false)
// for a grammar without budgets.
bool end_token(const grammar& g, std::vector<stack>& stacks);

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
