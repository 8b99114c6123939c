// libFuzzer target for the three protocol parsers and the prompt encoder: any byte string, read as
// a Chat Completions, Responses or Messages body (chosen by its first byte), must give a
// conversation or an error value, never a crash or a sanitizer report; and every accepted
// conversation must encode with control-token ids exactly at the encoder's own positions (V4, and
// V4.1 where the V4 vocabulary has its markers). Built only with a compiler that supports
// -fsanitize=fuzzer (see tests/CMakeLists.txt); docs/recipe.md says how to run it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>

#include "recipe/chat_completions.hpp"
#include "recipe/messages.hpp"
#include "recipe/prompt.hpp"
#include "recipe/responses.hpp"
#include "recipe/tokenizer.hpp"

namespace {
using namespace troupe::recipe;

const tokenizer& v4() {
  static const tokenizer t =
      tokenizer::from_file(std::string(TROUPE_SOURCE_DIR) + "/recipe/data/deepseek-v4/tokenizer.json.gz");
  return t;
}

// Added tokens of the V4 file: ids 0-2 and 128000 and up.
bool is_control(token_id id) { return id < 3 || id >= 128000; }

void check(const conversation& c) {
  for (const prompt_format f : {prompt_format::v4, prompt_format::v41}) {
    encoded_prompt p;
    try {
      p = encode_prompt(c, v4(), f);
    } catch (const std::runtime_error&) {
      if (f == prompt_format::v4) std::abort();  // the V4 vocabulary has every V4 marker
      continue;                                  // V4.1's <｜System｜> is not in it
    }
    const std::set<std::size_t> own(p.control.begin(), p.control.end());
    for (std::size_t i = 0; i < p.ids.size(); ++i)
      if (is_control(p.ids[i]) != own.contains(i)) std::abort();  // a control id the encoder did not emit
  }
}

template <class Result>
void run(const Result& r) {
  if (std::holds_alternative<api_error>(r)) {
    (void)std::get<api_error>(r).to_json();
    (void)std::get<api_error>(r).to_anthropic_json();
    return;
  }
  check(std::get<0>(r).conversation);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  chat_completions_config cfg;  // any model; DeepSeek-V4.1-Flash converts for V4.1
  switch (data[0] % 3) {
    case 0: run(parse_chat_completions(body, cfg)); break;
    case 1: run(parse_responses(body, cfg)); break;
    default: run(parse_messages(body, cfg)); break;
  }
  return 0;
}
