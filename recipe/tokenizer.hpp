#pragma once
// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json, with exact id parity with HF
// `tokenizers` (see docs/recipe.md for the parity figures and the supported file features).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::recipe {

using token_id = std::uint32_t;

// How added tokens (the `added_tokens` of tokenizer.json) written in the text are treated.
enum class encode_mode {
  // HF `encode_special_tokens = True` (transformers' split_special_tokens=True): strings of
  // *special* added tokens are split as ordinary text; non-special added tokens are still matched
  // (this is what HF does; in DeepSeek-V4 `<｜User｜>`, `<｜Assistant｜>`, the tool-call markers and
  // `｜DSML｜` are non-special, so they ARE matched in this mode).
  plain,
  // HF default: every added token in the text is matched. Only the prompt encoder uses it.
  trusted,
  // No added token is matched: the whole text goes through pre-tokenizer + BPE (HF: the
  // pre_tokenizer and model applied directly). The safe mode for untrusted user and tool text.
  raw,
};

// The tokenizer. Immutable after loading except for an internal BPE cache (thread-safe).
class tokenizer {
 public:
  // Reads a tokenizer.json, or a gzip-compressed one when the name ends in ".gz". Throws
  // std::runtime_error naming the unsupported feature when the file needs something not
  // implemented (the shipped DeepSeek-V4 file needs none of them).
  static tokenizer from_file(const std::filesystem::path& path);
  static tokenizer from_json(std::string_view json_text);

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  // Text is UTF-8. Invalid UTF-8 is replaced first, each maximal invalid subpart by U+FFFD
  // (Unicode's "substitution of maximal subparts", as Python's bytes.decode(errors="replace")),
  // so encode(bytes) == HF encode(bytes.decode("utf-8", "replace")).
  std::vector<token_id> encode(std::string_view text, encode_mode mode) const;
  void encode(std::string_view text, encode_mode mode, std::vector<token_id>& out) const;

  // The bytes the ids stand for (ByteLevel decoder; an added token's content as UTF-8). Unknown
  // ids are skipped (as HF does); special tokens are skipped when skip_special is true.
  std::string decode_bytes(std::span<const token_id> ids, bool skip_special = false) const;
  // decode_bytes made valid UTF-8 (invalid subparts -> U+FFFD): HF `decode`.
  std::string decode(std::span<const token_id> ids, bool skip_special = false) const;

  std::size_t vocab_size() const;  // the largest id + 1
  bool is_special(token_id id) const;
  // An added token (special or not): a control token, never a piece of generated text.
  bool is_added(token_id id) const;
  // The id of a token (model vocabulary string in byte-level form, or added token content).
  std::optional<token_id> token_to_id(std::string_view token) const;

  struct impl;

 private:
  explicit tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
  friend class incremental_detokenizer;
};

// Streaming decoder: push ids as they are generated, get back the text that is complete. Never
// emits a broken UTF-8 sequence and never drops bytes: an incomplete trailing sequence is held
// until the next push; a sequence that can never become valid is emitted as U+FFFD at once;
// flush() emits what is held (an unfinished sequence as U+FFFD). The concatenation of every
// push and the flush equals tokenizer::decode of all the ids.
class incremental_detokenizer {
 public:
  explicit incremental_detokenizer(const tokenizer& t, bool skip_special = false);
  std::string push(token_id id);
  std::string push(std::span<const token_id> ids);
  std::string flush();
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string take_complete(bool final);
  const tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

// Utilities shared with tests and the grammar compilers.
// Replaces each maximal invalid subpart of s with U+FFFD.
std::string utf8_sanitize(std::string_view s);
// Appends the UTF-8 encoding of code point `cp` (at most U+10FFFF) to `out`.
void append_utf8(std::string& out, std::uint32_t cp);

}  // namespace troupe::recipe
