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
// whole trie. The vocabulary therefore sorts its tokens once: *text* tokens are a valid UTF-8
// prefix of characters that a JSON string holds unescaped (no control character, `"` or `\`),
// the rest are not. When every text of up to k characters steps a frame through plain states (a
// small product of its rule with a UTF-8 automaton decides it), the text tokens of up to k
// characters are accepted all at once from a precomputed mask, and the walk skips every subtree
// holding only such tokens: a free string's first mask walks the ~4,000 nodes above the other
// tokens instead of 274,000. Control tokens
// are never allowed, except `｜DSML｜` where a tool-call grammar asks for it; the end-of-sequence
// ids are allowed exactly when the output is complete.

#include <array>
#include <cstdint>
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
  // (control tokens), nor is an id with no bytes; eos ids are allowed when the output is complete.
  vocabulary(std::vector<std::string> bytes, const std::vector<bool>& usable, std::vector<std::uint32_t> eos);
  // From a tokenizer: every added token is a control token except `｜DSML｜`, which stands for
  // `dsml_byte` (grammar.hpp; text tokens holding that byte are never allowed); end-of-sequence
  // is `<｜end▁of▁sentence｜>` when the vocabulary has it.
  static vocabulary from_tokenizer(const tokenizer& tok);

  std::size_t size() const { return bytes_.size(); }
  std::size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& bytes(std::uint32_t id) const { return bytes_[id]; }
  const std::vector<std::uint32_t>& eos() const { return eos_; }

  // The trie, nodes in preorder: node 0 is the root; a node's children follow it, its subtree
  // ends at `end`; the ids whose bytes end at a node are ids_[first, first + count); `depth` is
  // the length of its bytes; `cover` is the most characters of a text token in its subtree (at
  // most `any_text`), `not_text` when it holds another token.
  struct node {
    std::uint32_t end = 0;
    std::uint32_t first = 0;
    std::uint16_t count = 0;
    std::uint16_t depth = 0;
    std::uint8_t byte = 0;
    std::uint8_t cover = 0;
  };
  static constexpr std::uint8_t not_text = 255, any_text = 254;
  // Text masks are kept for up to this many characters, and for all text tokens.
  static constexpr unsigned text_mask_chars = 32;
  // The most characters of a text token.
  unsigned max_text_chars() const { return max_text_chars_; }
  // The text tokens of at most `chars` characters (`chars` <= text_mask_chars), or all of them
  // (`any_text`), as a bitmask.
  const std::uint32_t* text_mask(std::uint8_t chars) const {
    return text_masks_.data() + (chars == any_text ? text_mask_chars + 1 : chars) * mask_words();
  }
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
  std::size_t max_depth_ = 0;
  unsigned max_text_chars_ = 0;
  std::vector<std::uint32_t> text_masks_;  // text_mask_chars + 2 masks
};

// One per (grammar, vocabulary); thread-safe (the cache is shared under a lock).
class mask_computer {
 public:
  mask_computer(std::shared_ptr<const grammar> g, std::shared_ptr<const vocabulary> v);

  // Writes the allowed tokens of `m`'s state into `mask` (vocabulary::mask_words() words, bit
  // id % 32 of word id / 32), clearing the rest.
  void fill(const matcher& m, std::span<std::uint32_t> mask) const;
  // The allowed ids, ascending (tests and tools).
  std::vector<std::uint32_t> allowed(const matcher& m) const;

  const vocabulary& vocab() const { return *v_; }
  std::size_t cached_states() const;

 private:
  struct entry {
    std::vector<std::uint32_t> accepted;  // bitmask
    bool has_returns = false;             // some token's bytes return from the frame
    std::vector<std::uint32_t> returned;  // ids whose last byte returns from the frame
    // The children of the trie nodes after whose byte the frame returns, by byte: those of byte
    // b are after_return[after_return_at[b], after_return_at[b + 1]).
    std::vector<std::uint32_t> after_return;
    std::array<std::uint32_t, 257> after_return_at{};
  };
  const entry& entry_for(frame f) const;
  // What a frame does with text tokens (vocabulary::node::cover counts): those of at most
  // `accepted` characters step it through plain states (`any_text`: all of them), so their mask
  // is taken whole; subtrees of text tokens of at most `skipped` characters need no walk — they
  // are accepted, or (when `skipped` is above `accepted`) refused because no state takes the
  // next character.
  struct text_budget {
    std::uint8_t accepted = 0, skipped = 0;
  };
  text_budget text_budget_of(frame f) const;
  std::shared_ptr<const grammar> g_;
  std::shared_ptr<const vocabulary> v_;
  // [rule][state]: what a step to the state leaves to do: nothing (no call edge, not accepting),
  // a return (accepting, no call edge) or calls.
  std::vector<std::vector<std::uint8_t>> kind_;
  std::vector<std::vector<byte_set>> first_bytes_;  // [rule][state]: the bytes it steps on
  // [rule]: a byte per (class, UTF-8 role), of those that start a character and of the others.
  struct text_bytes {
    std::vector<unsigned char> first, inner;
  };
  std::vector<text_bytes> text_bytes_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::uint64_t, std::unique_ptr<entry>> cache_;
};

}  // namespace troupe::recipe::grammar
