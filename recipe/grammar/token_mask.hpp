#pragma once
// The allowed-token bitmask of a matcher state over a tokenizer's vocabulary.
//
// Checking 129,280 token strings one by one at every step is far too slow, so the vocabulary's
// byte strings are kept in a trie and the mask is found by walking the trie with the grammar,
// dropping a whole subtree as soon as its prefix is rejected. Most of that walk depends only on
// the top frame of a stack, not on what lies below it: for each (rule, state) the mask_computer
// caches the tokens accepted without returning from that frame, and the trie nodes at which a
// return happens. A mask is then the union of those cached sets for the state's stacks plus a
// short walk, in the real context, below each cached return point — only that part depends on
// the stack, and only the children whose byte the context takes next are walked.
//
// A state inside a string takes nearly every token, so its first walk would visit nearly the
// whole trie. The vocabulary therefore sorts its tokens once into *text classes*: the tokens
// that are a valid UTF-8 prefix of characters a JSON string holds unescaped (no control
// character, `"` or `\`), and those made only of [a-z], of [A-Za-z], of [0-9] or of
// [A-Za-z0-9]. When every text of a class up to k characters steps a frame through plain states
// (a small product of its rule with the class's automaton decides it), the class's tokens of up
// to k characters are accepted all at once from a precomputed mask, and the walk skips every
// subtree holding only such tokens: a free string's first mask walks the ~4,000 nodes above the
// non-text tokens instead of 274,000, a `[a-z]+` pattern's those above tokens with another
// byte. Control tokens
// are never allowed, except `｜DSML｜` where a tool-call grammar asks for it and the tokens a
// grammar's token symbols stand for (grammar.hpp), added after the walk; the end-of-sequence ids
// are allowed exactly when the output is complete.

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "recipe/grammar/matcher.hpp"

namespace troupe::recipe {
class tokenizer;
}

namespace troupe::recipe::grammar {

class vocabulary {
 public:
  // bytes[id] are the bytes token id stands for; ids with usable[id] false are never allowed
  // (control tokens), nor is an id with no bytes or with a symbol byte (grammar.hpp: no text
  // holds one); eos ids are allowed when the output is complete. Control tokens reach an output
  // only as a grammar's token symbols.
  vocabulary(std::vector<std::string> bytes, const std::vector<bool>& usable, std::vector<std::uint32_t> eos);
  // From a tokenizer: every added token is a control token except `｜DSML｜`, which stands for
  // `dsml_byte` (grammar.hpp; text tokens holding that byte are never allowed); end-of-sequence
  // is `<｜end▁of▁sentence｜>` when the vocabulary has it.
  static vocabulary from_tokenizer(const tokenizer& tok);

  std::size_t size() const { return bytes_.size(); }
  std::size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& bytes(std::uint32_t id) const { return bytes_[id]; }
  const std::vector<std::uint32_t>& eos() const { return eos_; }
  // Whether the trie holds the id (a usable token), and the text tokens (usable, not holding
  // `dsml_byte`: what a token symbol's "any text token" means) as a bitmask.
  bool usable(std::uint32_t id) const { return id < size() && ((usable_[id >> 5] >> (id & 31)) & 1); }
  const std::vector<std::uint32_t>& text_tokens() const { return text_tokens_; }
  // The usable ids whose bytes are exactly `text`.
  std::span<const std::uint32_t> find(std::string_view text) const;

  // The trie, nodes in preorder: node 0 is the root; a node's children follow it, its subtree
  // ends at `end`; the ids whose bytes end at a node are ids_[first, first + count); `depth` is
  // the length of its bytes.
  struct node {
    std::uint32_t end = 0;
    std::uint32_t first = 0;
    std::uint16_t count = 0;
    std::uint16_t depth = 0;
    std::uint8_t byte = 0;
  };
  // The text classes: 0 JSON string text (UTF-8), then ASCII-only ones.
  enum text_class : unsigned { json_text, lower, letters, digits, alnum };
  static constexpr unsigned text_classes = 5;
  static constexpr std::uint8_t not_text = 255, any_text = 254;
  // Text masks are kept for up to this many characters, and for all of a class's tokens.
  static constexpr unsigned text_mask_chars = 32;
  // The most characters of a token of the class.
  unsigned max_text_chars(unsigned cls) const { return classes_[cls].max_chars; }
  // The class's tokens of at most `chars` characters (`chars` <= text_mask_chars), or all of them
  // (`any_text`), as a bitmask, and how many they are.
  const std::uint32_t* text_mask(unsigned cls, std::uint8_t chars) const {
    return classes_[cls].masks.data() + index(chars) * mask_words();
  }
  std::uint32_t text_count(unsigned cls, std::uint8_t chars) const { return classes_[cls].counts[index(chars)]; }
  // Per node: the most characters of a token of the class in its subtree (at most `any_text`),
  // `not_text` when it holds another token.
  const std::uint8_t* cover(unsigned cls) const { return classes_[cls].cover.data(); }
  std::size_t max_depth() const { return max_depth_; }
  const std::vector<node>& trie() const { return trie_; }
  std::span<const std::uint32_t> ids_at(std::uint32_t n) const {
    return {ids_.data() + trie_[n].first, trie_[n].count};
  }

 private:
  std::vector<std::string> bytes_;
  std::vector<std::uint32_t> eos_;
  std::vector<node> trie_;
  std::vector<std::uint32_t> ids_;
  std::vector<std::uint32_t> usable_, text_tokens_;  // bitmasks
  std::size_t max_depth_ = 0;
  static unsigned index(std::uint8_t chars) { return chars == any_text ? text_mask_chars + 1 : chars; }
  struct class_tables {
    unsigned max_chars = 0;
    std::vector<std::uint32_t> masks;    // text_mask_chars + 2 masks
    std::vector<std::uint32_t> counts;   // their tokens
    std::vector<std::uint8_t> cover;     // per node
  };
  std::array<class_tables, text_classes> classes_;
};

// The token names of `v` (token_names, grammar.hpp): a string is an added token's content
// (`added`), else the text of a text token (the lowest id when several have it).
token_names names_of(std::shared_ptr<const vocabulary> v, std::map<std::string, std::uint32_t, std::less<>> added = {});
// With the tokenizer's added tokens.
token_names names_of(std::shared_ptr<const vocabulary> v, const tokenizer& tok);

// One per (grammar, vocabulary); thread-safe (the cache is shared under a lock; an entry is built
// outside it).
class mask_computer {
 public:
  mask_computer(std::shared_ptr<const grammar> g, std::shared_ptr<const vocabulary> v);

  // Writes the allowed tokens of `m`'s state into `mask` (vocabulary::mask_words() words, bit
  // id % 32 of word id / 32), clearing the rest.
  void fill(const matcher& m, std::span<std::uint32_t> mask) const;
  // The allowed ids, ascending (tests and tools).
  std::vector<std::uint32_t> allowed(const matcher& m) const;
  // Feeds token `id` to `m` as the grammar reads it: its bytes (a usable token) or any of the
  // grammar's token symbols standing for it, all of them at once (the matcher keeps every stack
  // they lead to). False, and nothing changed, when none is accepted.
  bool accept(matcher& m, std::uint32_t id) const;
  bool can_accept(const matcher& m, std::uint32_t id) const;

  // Builds the cached entries that `m`'s mask needs (one per top frame of its stacks), so that
  // the mask then costs what a warm one does; false when they were all built already.
  bool warm(const matcher& m) const;
  // Whether they are all built.
  bool is_warm(const matcher& m) const;
  // Builds the entry of every frame a stack can wait in (every rule state with a byte edge) when
  // there are at most `max_frames` of them, as a grammar compiler that builds every mask up
  // front would; returns how many (0: more than `max_frames`, nothing built).
  std::size_t warm_all(std::size_t max_frames) const;

  const vocabulary& vocab() const { return *v_; }
  std::size_t cached_states() const;

 private:
  struct entry {
    std::vector<std::uint32_t> accepted;  // bitmask, or (sparse) its words listed in `nonzero`
    // sparse: under a quarter of the bitmask's words are not zero (a number's or a keyword's
    // state), `nonzero` lists them and `accepted` holds only those; otherwise a mask takes every
    // word.
    bool sparse = false;
    std::vector<std::uint32_t> nonzero;
    bool has_returns = false;             // some token's bytes return from the frame
    std::vector<std::uint32_t> returned;  // ids whose last byte returns from the frame
    // The children of the trie nodes after whose byte the frame returns, by byte: those of byte
    // b are after_return[after_return_at[b], after_return_at[b + 1]).
    std::vector<std::uint32_t> after_return;
    std::array<std::uint32_t, 257> after_return_at{};
  };
  // An entry per (rule, state), and for a budgeted rule per budget left as far as it can change
  // the mask: one token left or more; each count of characters left up to the longest token's
  // bytes, or more.
  struct entry_key {
    std::uint32_t rule = 0, state = 0, tokens = 0, chars = 0;
    bool operator==(const entry_key&) const = default;
  };
  struct key_hash {
    std::size_t operator()(const entry_key& k) const noexcept {
      return std::hash<std::uint64_t>{}((std::uint64_t{k.rule} << 32 | k.state) * 0x9E3779B97F4A7C15ull ^
                                        (std::uint64_t{k.tokens} << 32 | k.chars));
    }
  };
  // Of a stack's top frame (with the stack's budget left).
  entry_key key_of(const stack& s) const;
  const entry& entry_for(const stack& s) const;
  // What a frame does with the tokens of a text class (vocabulary::cover counts): those of at
  // most `accepted` characters step it through plain states (`any_text`: all of them), so their
  // mask is taken whole; subtrees of the class's tokens of at most `skipped` characters need no
  // walk — they are accepted, or (when `skipped` is above `accepted`) refused because no state
  // takes the next character.
  struct text_budget {
    unsigned cls = 0;
    std::uint8_t accepted = 0, skipped = 0;
  };
  // The budget of the class that spares the most of the walk.
  text_budget text_budget_of(frame f) const;
  text_budget class_budget(frame f, unsigned cls) const;
  std::shared_ptr<const grammar> g_;
  std::shared_ptr<const vocabulary> v_;
  // Per token symbol of the grammar: the ids it stands for, as a bitmask.
  std::vector<std::vector<std::uint32_t>> symbol_masks_;
  // The texts token `id` may be read as: its bytes, and the symbols standing for it.
  void readings(std::uint32_t id, std::vector<std::string_view>& out) const;
  // [rule][state]: what a step to the state leaves to do: nothing (no call edge, not accepting),
  // a return (accepting, no call edge) or calls.
  std::vector<std::vector<std::uint8_t>> kind_;
  std::vector<std::vector<byte_set>> first_bytes_;  // [rule][state]: the bytes it steps on
  // [rule][text class]: a byte per (byte class, role in the text class), of those that start a
  // character and of the others.
  struct text_bytes {
    std::vector<unsigned char> first, inner;
  };
  std::vector<std::array<text_bytes, vocabulary::text_classes>> text_bytes_;
  mutable std::mutex mu_;
  mutable std::unordered_map<entry_key, std::unique_ptr<entry>, key_hash> cache_;
};

}  // namespace troupe::recipe::grammar
