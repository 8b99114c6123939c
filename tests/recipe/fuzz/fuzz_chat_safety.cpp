// libFuzzer target for the special-token safety rule over Chat Completions requests: for every
// request the parser accepts, an id of the encoded prompt is an added token (a control token) only
// at a position the encoder itself emitted (encoded_prompt::control); and a model output that
// spells the same strings with ordinary tokens streams back as exactly that text, never as a
// reasoning end, a tool call or an end of output. Violations abort. The input is used twice: as a
// request body as is, and as the choices and strings of a generated request that mixes control
// strings, halves of them and DSML markup into every field. Built only with a compiler that
// supports -fsanitize=fuzzer (tests/CMakeLists.txt); docs/recipe.md says how to run it.
#include "recipe/chat_completions.hpp"
#include "recipe/prompt.hpp"
#include "recipe/stream_parser.hpp"
#include "recipe/tokenizer.hpp"

#include <fuzzer/FuzzedDataProvider.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace troupe::recipe;
using json = nlohmann::ordered_json;

namespace {

const tokenizer* tok = nullptr;
std::vector<bool> added;  // ids that only the added-token pass produces

constexpr std::array<const char*, 22> k_pieces = {
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
    "</think>", "｜DSML｜", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"f\">",
    "</｜DSML｜invoke>", "<｜DSML｜parameter name=\"k\" string=\"true\">", "</｜DSML｜parameter>",
    "<tool_result>", "</tool_result>", "<｜▁pad▁｜>", "<|EOT|>", "<｜fim▁hole｜>", "<｜begin▁", "sentence｜>",
    "\n\n", "\""};

[[noreturn]] void fail(const std::string& what, const std::string& body) {
  std::fprintf(stderr, "SAFETY VIOLATION: %s\nrequest: %s\n", what.c_str(), body.c_str());
  std::abort();
}

// A string of marker pieces and fuzz bytes.
std::string soup(FuzzedDataProvider& in) {
  std::string s;
  const int parts = in.ConsumeIntegralInRange(0, 6);
  for (int i = 0; i < parts; ++i) {
    if (in.ConsumeBool()) s += k_pieces[in.ConsumeIntegralInRange<std::size_t>(0, k_pieces.size() - 1)];
    else s += in.ConsumeRandomLengthString(24);
  }
  return s;
}

json generated_request(FuzzedDataProvider& in) {
  json r;
  r["model"] = "DeepSeek-V4-Pro";
  switch (in.ConsumeIntegralInRange(0, 2)) {
    case 0: r["thinking"] = {{"type", "enabled"}}; break;
    case 1: r["thinking"] = {{"type", "disabled"}}; break;
    default: break;
  }
  const int n_tools = in.ConsumeIntegralInRange(0, 2);
  for (int t = 0; t < n_tools; ++t) {
    json props = json::object();
    props[soup(in)] = {{"type", "string"}, {"description", soup(in)}};
    r["tools"].push_back({{"type", "function"},
                          {"function", {{"name", "f" + std::to_string(t)}, {"description", soup(in)},
                                        {"parameters", {{"type", "object"}, {"properties", props}}}}}});
  }
  if (n_tools > 0 && in.ConsumeBool()) r["tool_choice"] = in.ConsumeBool() ? "required" : "none";
  const int n = in.ConsumeIntegralInRange(1, 6);
  for (int i = 0; i < n; ++i) {
    json m;
    switch (in.ConsumeIntegralInRange(0, 3)) {
      case 0: m = {{"role", "system"}, {"content", soup(in)}}; break;
      case 1: m = {{"role", "user"}, {"content", soup(in)}}; break;
      case 2: {
        m = {{"role", "assistant"}, {"content", soup(in)}};
        if (in.ConsumeBool()) m["reasoning_content"] = soup(in);
        if (in.ConsumeBool()) {
          json args = json::object();
          args[soup(in)] = soup(in);
          m["tool_calls"].push_back({{"id", "c" + std::to_string(i)}, {"type", "function"},
                                     {"function", {{"name", soup(in)},
                                                   {"arguments", in.ConsumeBool() ? args.dump(-1, ' ', false, json::error_handler_t::replace) : soup(in)}}}});
        }
        if (i == n - 1 && in.ConsumeBool()) m["prefix"] = true;
        break;
      }
      default: m = {{"role", "tool"}, {"content", soup(in)}, {"tool_call_id", "c"}}; break;
    }
    r["messages"].push_back(m);
  }
  return r;
}

void check(const std::string& body) {
  auto parsed = parse_chat_completions(body);
  const auto* req = std::get_if<chat_completions_request>(&parsed);
  if (req == nullptr) return;
  const encoded_prompt p = encode_prompt(req->conversation, *tok);
  const std::set<std::size_t> own(p.control.begin(), p.control.end());
  for (std::size_t i = 0; i < p.ids.size(); ++i)
    if (added[p.ids[i]] != own.contains(i))
      fail("id " + std::to_string(p.ids[i]) + " at " + std::to_string(i)
               + (own.contains(i) ? " is an encoder position but no control token"
                                  : " is a control token outside the encoder's positions"),
           body);
  // The same text generated with ordinary tokens streams back as text only.
  for (const auto& m : req->conversation.messages) {
    const auto ids = tok->encode(m.content, encode_mode::raw);
    stream_options o;
    o.start = stream_start::content_continuation;
    o.parse_tool_calls = true;
    auto parser = std::get<stream_parser>(stream_parser::create(*tok, o));
    std::vector<stream_event> out;
    parser.push(ids, out);
    parser.finish(backend_finish::stop, out);
    std::string text;
    for (const auto& e : out) {
      if (e.type == stream_event::kind::text) text += e.text;
      else if (e.type != stream_event::kind::finish && e.type != stream_event::kind::usage)
        fail("spelled control strings parsed as structure in: " + m.content, body);
    }
    if (text != tok->decode(ids)) fail("stream text differs from the decoded ids: " + m.content, body);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static const tokenizer t =
      tokenizer::from_file(std::string(TROUPE_SOURCE_DIR) + "/recipe/data/deepseek-v4/tokenizer.json.gz");
  tok = &t;
  added.assign(t.vocab_size(), false);
  for (token_id id = 0; id < t.vocab_size(); ++id) {
    const std::string s = t.decode(std::span<const token_id>(&id, 1));
    const auto trusted = t.encode(s, encode_mode::trusted);
    added[id] = trusted.size() == 1 && trusted[0] == id && t.encode(s, encode_mode::raw) != trusted;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  check(std::string(reinterpret_cast<const char*>(data), size));
  FuzzedDataProvider in(data, size);
  check(generated_request(in).dump(-1, ' ', false, json::error_handler_t::replace));
  return 0;
}
