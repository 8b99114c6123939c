// libFuzzer target for the structured-output parsers (recipe/grammar/): the first byte picks the
// regex compiler (odd), the JSON Schema compiler (0 mod 16), the structural tag compiler (8 mod
// 16), the tool-call compiler (4 mod 8), the GBNF compiler (2 mod 8) or the Lark compiler (6 mod
// 8), the rest is the pattern, the schema text, the structural tag (its token-level formats naming
// the small vocabulary's tokens), the tools (as a constraint
// key's JSON: {"v41", "mode", "one_call", "tools": [{"name", "schema"}]}) or the grammar. Every input must give a grammar or an error value — no crash, no sanitizer report,
// no hang (libFuzzer's -timeout) — and a grammar must run: a matcher fed the input's own bytes
// either accepts them or refuses them, and a refused byte string leaves its state unchanged.
// Its first masks (before and after those bytes) over a small vocabulary — every single byte,
// pieces of JSON and tags, partial and invalid UTF-8, runs past the text masks kept — equal
// trying every token. Built only with a compiler that supports -fsanitize=fuzzer (see tests/CMakeLists.txt);
// docs/structured-output.md says how to run it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <variant>

#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/json_schema.hpp"
#include "recipe/grammar/lark.hpp"
#include "recipe/grammar/matcher.hpp"
#include "recipe/grammar/regex.hpp"
#include "recipe/grammar/structural_tag.hpp"
#include "recipe/grammar/token_mask.hpp"
#include "recipe/grammar/tool_calls.hpp"

#include <nlohmann/json.hpp>

namespace gr = troupe::recipe::grammar;

namespace {

const std::shared_ptr<const gr::vocabulary>& small_vocabulary() {
  static const auto v = [] {
    std::vector<std::string> bytes;
    for (unsigned b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"\"", "{\"", "\": ", "\", ", "[\"", "\"]", "\\n", "true", "null", "12", "-3.5e", "ab", "abc",
                          " a", "Ab7", "2026", "XYZ", "\xC3\xA9", "\xE4\xB8\xAD\xE6\x96\x87", "\xC3", "\xA9\xC3",
                          "\xED\xA0\x80", "</", "</\xFF", "\xFFparameter", "parameter>\n", "\n\n",
                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "\"}"})
      bytes.emplace_back(t);
    const auto eos = static_cast<std::uint32_t>(bytes.size());
    bytes.emplace_back();
    return std::make_shared<const gr::vocabulary>(bytes, std::vector<bool>(bytes.size(), true),
                                                  std::vector<std::uint32_t>{eos});
  }();
  return v;
}

// Token-level formats name the small vocabulary's tokens by id or by their exact bytes.
const gr::token_names& small_names() {
  static const gr::token_names n = gr::names_of(small_vocabulary());
  return n;
}

// A fresh mask_computer's allowed ids (its first mask of the state) against offering each token
// (its bytes, or the token symbols standing for it).
void check_mask(const std::shared_ptr<const gr::grammar>& g, const gr::matcher& m) {
  const auto& v = *small_vocabulary();
  const gr::mask_computer masks(g, small_vocabulary());
  std::vector<std::uint32_t> want;
  for (std::uint32_t id = 0; id < v.size(); ++id)
    if (v.bytes(id).empty() ? m.is_complete() : masks.can_accept(m, id)) want.push_back(id);
  if (masks.allowed(m) != want) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::shared_ptr<const gr::grammar> g;
  if (data[0] % 8 == 4) {
    const auto j = nlohmann::ordered_json::parse(text, nullptr, false);
    const auto spec = j.is_discarded() ? std::nullopt : gr::tool_calls_spec_of(j);
    if (!spec) return 0;
    auto r = gr::compile_tool_calls(*spec);
    if (auto* e = std::get_if<gr::tool_calls_error>(&r)) {
      if (e->error.message.empty() || (e->tool && *e->tool >= spec->tools.size())) std::abort();
      return 0;
    }
    g = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
  } else if (data[0] % 16 == 8) {
    auto r = gr::compile_structural_tag(text, {}, &small_names());
    if (auto* e = std::get_if<gr::structural_tag_error>(&r)) {
      if (e->message.empty()) std::abort();  // every refusal says why
      return 0;
    }
    g = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
  } else if (data[0] % 4 == 0) {
    auto r = gr::compile_json_schema(text);
    if (auto* e = std::get_if<gr::schema_error>(&r)) {
      if (e->message.empty()) std::abort();  // every refusal says why
      return 0;
    }
    g = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
  } else if (data[0] % 4 == 2) {
    auto r = data[0] % 8 == 2 ? gr::compile_ebnf(text) : gr::compile_lark(text);
    if (auto* e = std::get_if<gr::ebnf_error>(&r)) {
      // Every refusal says why, and a position lies inside the text (or just past its end).
      if (e->message.empty() || (e->line > 0 && (e->column == 0 || e->column > text.size() + 1))) std::abort();
      return 0;
    }
    g = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
  } else {
    auto r = gr::compile_regex(text);
    if (std::holds_alternative<gr::regex_error>(r)) return 0;
    g = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
  }
  gr::matcher m(g);
  // A pruned grammar always has a way to go on or end.
  if (!m.can_continue() && !m.is_complete()) std::abort();
  check_mask(g, m);
  const auto before = m.state();
  if (!m.accept_token(text) && !(m.state() == before)) std::abort();
  if (!gr::matcher::restore(g, m.serialize())) std::abort();
  check_mask(g, m);
  return 0;
}
