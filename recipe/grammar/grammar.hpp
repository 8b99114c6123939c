#pragma once
// The one grammar representation of structured output: a set of rules, each a DFA over bytes
// whose states may also call other rules (a recursive transition network, i.e. a pushdown
// automaton over bytes).
//
// JSON Schema and regular expressions both compile to this. A regex is a single rule with no
// calls; a JSON Schema becomes one rule per (sub)schema, with calls where a value of another
// schema is nested ($ref recursion is a call cycle). The matcher (matcher.hpp) runs it with an
// explicit stack of (rule, state) frames, so its state is a small value. Rules are built through
// an NFA (`nfa_builder`) and determinized; calls are symbols of the NFA alphabet, so a DFA state
// can hold byte edges and call edges at once, and the matcher follows both.

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::recipe::grammar {

// 256 bits: a set of bytes.
struct byte_set {
  std::array<std::uint64_t, 4> bits{};
  void set(unsigned b) { bits[b >> 6] |= std::uint64_t{1} << (b & 63); }
  void set_range(unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; ++b) set(b);
  }
  bool test(unsigned b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return !(bits[0] | bits[1] | bits[2] | bits[3]); }
  byte_set& operator|=(const byte_set& o) {
    for (int w = 0; w < 4; ++w) bits[w] |= o.bits[w];
    return *this;
  }
};

inline constexpr std::int32_t no_state = -1;

// The byte that stands for DeepSeek's `｜DSML｜` control token in a grammar (tool calls,
// tool_calls.hpp). No UTF-8 text holds it, and the vocabulary (token_mask.hpp) never allows a
// text token that does, so only that control token can match it.
inline constexpr unsigned char dsml_byte = 0xFF;

// Bytes that no UTF-8 text holds (C0, C1, F5-FE), which a grammar may give to whole tokens: a
// structural tag's token-level formats (structural_tag.hpp) stand for "the token <｜tool▁call▁begin｜>"
// or "any text token but these" with one of them. The vocabulary never allows a text token holding
// one (token_mask.hpp), free text never takes one, and a grammar has at most 12 such symbols.
inline constexpr unsigned char symbol_bytes[] = {0xC0, 0xC1, 0xF5, 0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE};
inline constexpr bool is_symbol_byte(unsigned b) { return b == 0xC0 || b == 0xC1 || (b >= 0xF5 && b <= 0xFE); }

// What a symbol byte of a grammar stands for: one token (`any` false: ids[0]), or any one text
// token of the vocabulary but `ids` (`any` true; ids sorted). A token is accepted as its bytes or
// as any symbol standing for it (mask_computer::accept).
struct token_symbol {
  unsigned char byte = 0;
  bool any = false;
  std::vector<std::uint32_t> ids;
  bool operator==(const token_symbol&) const = default;
};

// What a structural tag's token-level formats need (structural_tag.hpp; names_of in
// token_mask.hpp makes one) of the vocabulary: its size, the id of a token's string,
// and the end-of-sequence ids (which end the output, so no format may name them).
struct token_names {
  std::uint32_t vocab_size = 0;
  std::function<std::optional<std::uint32_t>(std::string_view)> id_of;
  std::vector<std::uint32_t> eos;
};

struct call_edge {
  std::uint32_t rule;    // the rule called (starts in its state 0)
  std::uint32_t target;  // this rule's state after the callee accepted
};

// No budget (rule::max_tokens, max_chars).
inline constexpr std::uint32_t no_budget = 0xFFFFFFFFu;

// Whether byte b begins a character (is not a UTF-8 continuation byte): what a character budget
// counts.
inline constexpr bool starts_char(unsigned b) { return (b & 0xC0) != 0x80; }

// UTF-8 (any scalar value): state 0 is between characters, 1..7 inside one; -1 is not UTF-8.
inline constexpr int utf8_step(int u, unsigned b) {
  const bool cont = b >= 0x80 && b <= 0xBF;
  switch (u) {
    case 0:
      if (b < 0x80) return 0;
      if (b < 0xC2) return -1;
      if (b <= 0xDF) return 1;
      if (b == 0xE0) return 4;
      if (b == 0xED) return 5;
      if (b <= 0xEF) return 2;
      if (b == 0xF0) return 6;
      if (b <= 0xF3) return 3;
      if (b == 0xF4) return 7;
      return -1;
    case 1: return cont ? 0 : -1;
    case 2: return cont ? 1 : -1;
    case 3: return cont ? 2 : -1;
    case 4: return b >= 0xA0 && b <= 0xBF ? 1 : -1;  // E0: no overlong form
    case 5: return b >= 0x80 && b <= 0x9F ? 1 : -1;  // ED: no surrogate
    case 6: return b >= 0x90 && b <= 0xBF ? 2 : -1;  // F0: no overlong form
    case 7: return b >= 0x80 && b <= 0x8F ? 2 : -1;  // F4: nothing past U+10FFFF
    default: return -1;
  }
}

// A deterministic automaton over bytes; state 0 is the start. Bytes that no state tells apart
// share a class, and the transition table has one column per class (a bounded JSON string of a
// thousand states needs a few dozen columns, not 256).
struct rule {
  std::string name;                             // for messages and dumps
  std::array<std::uint8_t, 256> byte_class{};   // the class of each byte, < classes
  std::uint32_t classes = 1;
  std::vector<std::int32_t> next;               // next[state * classes + class], or no_state
  std::vector<std::vector<call_edge>> calls;    // per state
  std::vector<std::uint8_t> accepting;          // per state
  std::vector<std::uint8_t> has_bytes;          // per state: some byte edge leaves it
  // Budgets of each time the rule is entered (structural tags' any_text and any_tokens): at most
  // max_tokens tokens take a byte in it (a token that enters or leaves it midway counts) and at
  // most max_chars characters (bytes that begin one) are taken in it; when one is spent, the rule
  // can only return. Only a rule without calls has one, so its frame is a stack's top, and the
  // stack holds what is left (matcher.hpp).
  std::uint32_t max_tokens = no_budget, max_chars = no_budget;
  bool budgeted() const { return max_tokens != no_budget || max_chars != no_budget; }
  std::uint32_t size() const { return static_cast<std::uint32_t>(accepting.size()); }
  std::int32_t step(std::uint32_t state, unsigned char b) const { return next[state * classes + byte_class[b]]; }
};

struct grammar {
  std::vector<rule> rules;
  std::uint32_t root = 0;
  std::vector<token_symbol> symbols;  // the symbol bytes its rules step on, and their tokens
  // A fingerprint of the rules (FNV-1a over their tables): a serialised matcher state names the
  // grammar it belongs to, so that restoring it against another grammar fails.
  std::uint64_t fingerprint() const;
  std::size_t state_count() const;
};

// Limits that keep compilation bounded on any input (docs/structured-output.md).
struct limits {
  std::uint32_t max_rule_states = 4096;    // DFA states of one rule
  std::uint32_t max_total_states = 65536;  // over all rules
  std::uint32_t max_repeat = 1000;         // {m,n}, minLength/maxLength, minItems/maxItems
  std::uint64_t max_subset_work = 30000000; // steps of one rule's subset construction
};

// Thrown by the builders when a limit is exceeded or the input is malformed; the compilers
// (regex.hpp, json_schema.hpp) turn it into their error values.
struct build_error {
  std::string message;
};

// A nondeterministic automaton under construction: byte-set edges, epsilon edges and calls.
class nfa_builder {
 public:
  std::uint32_t add_state();
  void epsilon(std::uint32_t from, std::uint32_t to);
  void bytes(std::uint32_t from, std::uint32_t to, const byte_set& set);
  void byte(std::uint32_t from, std::uint32_t to, unsigned char b);
  void call(std::uint32_t from, std::uint32_t to, std::uint32_t rule);
  // A literal string from `from` to `to` (epsilon when empty).
  void literal(std::uint32_t from, std::uint32_t to, std::string_view s);
  // A copy of the call-free automaton `dfa` from `from` to `to` (its states new, its accepting
  // states joined to `to`). Pasting a small determinized piece many times (e.g. one character of a
  // bounded string) gives the subset construction far fewer NFA states than re-emitting it.
  void paste(std::uint32_t from, std::uint32_t to, const rule& dfa);
  std::uint32_t size() const { return static_cast<std::uint32_t>(eps_.size()); }

  // Subset construction from `start`; `accept` is the one accepting NFA state. Throws
  // build_error past `lim.max_rule_states` DFA states or `lim.max_subset_work` steps (an NFA
  // state of a subset, times its byte edges and the byte classes: what bounds the time).
  rule determinize(std::uint32_t start, std::uint32_t accept, std::string name, const limits& lim) const;

 private:
  struct byte_edge {
    byte_set set;
    std::uint32_t to;
  };
  struct nfa_call {
    std::uint32_t rule, to;
  };
  std::vector<std::vector<std::uint32_t>> eps_;
  std::vector<std::vector<byte_edge>> byte_edges_;
  std::vector<std::vector<nfa_call>> calls_;
};

// Appends `from`'s rules to `into` (their calls renumbered); returns the index `from`'s root has
// there.
std::uint32_t append_rules(grammar& into, const grammar& from);

// Removes what can never lead to acceptance: rules that accept nothing (and the calls to them),
// then states from which no accepting state is reachable (and the edges into them). Afterwards
// every state the matcher can be in has a way to finish. Returns false when the root rule
// accepts nothing.
bool prune(grammar& g);

// Calls a rule can make before consuming a byte (through nullable prefixes) must not lead back
// to itself: such left recursion would never consume input. Returns the name of a rule on such
// a cycle, or an empty string.
std::string left_recursive_rule(const grammar& g);

// A copy of `r` (a rule without calls) that accepts what `r` accepts except the given words.
rule without_words(const rule& r, const std::vector<std::string>& words, std::uint32_t max_states);

// `open`, then a sentence of `a` (a rule without calls), then `close` (at most 63 bytes), as one
// rule built by a product of `a` with the progress through `close` (what the subset
// construction would build, without it). Throws build_error past `max_states` states.
rule enclosed(std::string_view open, const rule& a, std::string_view close, std::string name,
              std::uint32_t max_states);

}  // namespace troupe::recipe::grammar
