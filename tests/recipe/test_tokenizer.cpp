// The byte-level BPE tokenizer on the shipped DeepSeek-V4 tokenizer.json: known ids (from HF
// tokenizers 0.23.3), the three added-token modes, invalid UTF-8, decode and the incremental
// detokenizer; the Unicode 16.0 classes.
#include "recipe/tokenizer.hpp"
#include "recipe/unicode_classes.hpp"
#include "recipe_fixture.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace troupe::recipe;

namespace {
using testing::v4;
using ids = std::vector<token_id>;
}  // namespace

TEST_CASE("tokenizer: added tokens in the three modes (ids from HF tokenizers)") {
  const std::string s = "hi <｜User｜> x <｜begin▁of▁sentence｜>y";
  CHECK(v4().encode(s, encode_mode::trusted) == ids{6366, 223, 128803, 1527, 223, 0, 91});
  CHECK(v4().encode(s, encode_mode::plain) ==
        ids{6366, 223, 128803, 1527, 818, 28217, 8277, 5487, 226, 2154, 5487, 226, 85, 51015, 28217, 32, 91});
  const auto raw = v4().encode(s, encode_mode::raw);
  CHECK(std::find(raw.begin(), raw.end(), token_id{128803}) == raw.end());
  CHECK(v4().decode(raw) == s);
  CHECK(v4().is_special(0));
  CHECK_FALSE(v4().is_special(128803));
  CHECK(v4().token_to_id("<｜User｜>") == token_id{128803});
}

TEST_CASE("tokenizer: decode round-trips and skips special tokens on request") {
  const std::string s = "Hello  world\n\n  x 1234567 中文字 👨‍👩 !abc";
  const auto t = v4().encode(s, encode_mode::trusted);
  CHECK(v4().decode(t) == s);
  ids with_bos{0};
  with_bos.insert(with_bos.end(), t.begin(), t.end());
  CHECK(v4().decode(with_bos, true) == s);
  CHECK(v4().decode(with_bos).starts_with("<｜begin▁of▁sentence｜>"));
}

TEST_CASE("tokenizer: invalid UTF-8 is replaced by U+FFFD per maximal subpart") {
  CHECK(utf8_sanitize("a\xF0\x9F\x98z") == "a\xEF\xBF\xBDz");
  CHECK(utf8_sanitize("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(utf8_sanitize("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(v4().encode("x\xFFy", encode_mode::plain) == v4().encode("x\xEF\xBF\xBDy", encode_mode::plain));
}

TEST_CASE("incremental detokenizer: never a broken sequence, nothing dropped") {
  const std::string s = "naïve café 中文 👨‍👩‍👧 ok\n\t漢字かな😀";
  const auto t = v4().encode(s, encode_mode::plain);
  incremental_detokenizer d(v4());
  std::string all;
  for (const auto id : t) {
    const auto part = d.push(id);
    CHECK(utf8_sanitize(part) == part);
    all += part;
  }
  all += d.flush();
  CHECK(all == s);
  // An emoji split over byte-level tokens: nothing until it is complete, then all of it.
  incremental_detokenizer e(v4());
  const auto b0 = *v4().token_to_id("ð");  // byte 0xF0
  CHECK(e.push(b0).empty());
  CHECK(e.pending_bytes() == 1);
  CHECK(e.flush() == "\xEF\xBF\xBD");
}

TEST_CASE("tokenizer: Unicode 16.0 classes, as HF tokenizers (issue 19)") {
  CHECK(std::string(unicode::version) == "16.0.0");
  // Assigned in Unicode 15.1 / 16.0 (unassigned in ICU 72's Unicode 15.0).
  CHECK(unicode::classes(0x1FAE9) == unicode::symbol);  // face with bags under eyes
  CHECK(unicode::classes(0x1FABE) == unicode::symbol);
  for (std::uint32_t cp : {0x2FFCu, 0x2FFDu, 0x2FFEu, 0x2FFFu}) CHECK(unicode::classes(cp) == unicode::symbol);
  for (std::uint32_t cp : {0x2EBF0u, 0x2EBF1u, 0x2EE5Du, 0x105C0u, 0x105C1u}) CHECK(unicode::classes(cp) == unicode::letter);
  for (std::uint32_t cp : {0x10D4Au, 0x10D4Bu, 0x16D43u, 0x16D44u}) CHECK(unicode::classes(cp) == unicode::letter);
  CHECK(unicode::classes(0x1CC00) == unicode::symbol);
  CHECK(unicode::classes(' ') == unicode::white_space);
  CHECK(unicode::classes(0x3000) == unicode::white_space);
  CHECK(unicode::classes(0x10FFFF) == 0);
  CHECK(unicode::classes(0x110000) == 0);
  // A space before the new emoji joins it, as in HF (ICU 72 gave [43, 2929, 223, 3574, 107, 105]).
  CHECK(v4().encode("I feel \U0001FAE9", encode_mode::plain) == ids{43, 2929, 7351, 107, 105});
}
