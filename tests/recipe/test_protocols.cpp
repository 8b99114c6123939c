// Responses and Anthropic Messages requests -> conversation -> V4 prompt: exact text and ids
// against deepseek_recipe 0.2.0 (tools/protocol_golden.py), the safety rule on every protocol
// golden, the official OpenAI Responses schema, and validation errors in each protocol's shape.
#include "recipe/chat_completions.hpp"
#include "recipe/messages.hpp"
#include "recipe/prompt.hpp"
#include "recipe/responses.hpp"
#include "recipe_fixture.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <variant>
#include <vector>

using namespace troupe::recipe;
using json = nlohmann::ordered_json;

namespace {
using testing::v4;

chat_completions_config reference_config() {
  chat_completions_config c;
  c.models = {"DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"};
  return c;
}

// A protocol parser reduced to: the conversation, or the error.
using parse_fn = std::function<std::variant<conversation, api_error>(const std::string&)>;

template <class Result>
std::variant<conversation, api_error> conversation_of(Result r) {
  if (auto* e = std::get_if<api_error>(&r)) return *e;
  return std::move(std::get<0>(r).conversation);
}

const parse_fn responses = [](const std::string& b) { return conversation_of(parse_responses(b, reference_config())); };
const parse_fn messages = [](const std::string& b) { return conversation_of(parse_messages(b, reference_config())); };
const parse_fn chat = [](const std::string& b) { return conversation_of(parse_chat_completions(b, reference_config())); };

bool is_control(token_id id) { return id < 3 || id >= 128000; }

struct tally {
  int prompts = 0, rejected = 0, v41 = 0;
};

// The spellings of a rendered prompt's control tokens, in order.
std::vector<std::string> control_strings(const rendered_prompt& r) {
  std::vector<std::string> out;
  for (const auto& [b, e] : r.control) out.push_back(r.text.substr(b, e - b));
  return out;
}

// Every golden: the oracle's prompt text and ids, or a rejection; the safety rule on each prompt.
tally check_goldens(const std::string& file, const parse_fn& parse, const std::set<std::string>& accepted_more = {}) {
  tally t;
  for (const json& g : testing::json_records(testing::golden_path(file))) {
    const std::string name = g["name"];
    CAPTURE(name);
    auto r = parse(g["request"].dump());
    if (g.contains("error")) {
      CAPTURE(g["error"].get<std::string>());
      if (accepted_more.count(name)) {
        CHECK(std::holds_alternative<conversation>(r));
        continue;
      }
      CHECK(std::holds_alternative<api_error>(r));
      if (auto* e = std::get_if<api_error>(&r)) {
        CHECK(e->status == 400);
        CHECK(!e->message.empty());
        ++t.rejected;
      }
      continue;
    }
    if (auto* e = std::get_if<api_error>(&r)) {
      FAIL_CHECK(name << ": " << e->to_json());
      continue;
    }
    const encoded_prompt p = encode_prompt(std::get<conversation>(r), v4());
    CHECK(p.text == g["prompt"].get<std::string>());
    CHECK(p.ids == g["ids"].get<std::vector<token_id>>());
    const std::set<std::size_t> own(p.control.begin(), p.control.end());
    for (std::size_t i = 0; i < p.ids.size(); ++i) CHECK(is_control(p.ids[i]) == own.contains(i));
    ++t.prompts;
    // DeepSeek-V4.1 (text and control-token positions; no V4.1 tokenizer to check ids with).
    const rendered_prompt r41 = render_prompt(std::get<conversation>(r), prompt_format::v41);
    CHECK(r41.text == g["prompt_v41"].get<std::string>());
    CHECK(control_strings(r41) == g["control_v41"].get<std::vector<std::string>>());
    ++t.v41;
    // The same request for the V4.1 model (its conversion keeps images as images, ...).
    json body41 = g["request"];
    body41["model"] = "DeepSeek-V4.1-Flash";
    auto r41m = parse(body41.dump());
    REQUIRE(std::holds_alternative<conversation>(r41m));
    const rendered_prompt m41 = render_prompt(std::get<conversation>(r41m), prompt_format::v41);
    CHECK(m41.text == g["prompt_v41_model"].get<std::string>());
    CHECK(control_strings(m41) == g["control_v41_model"].get<std::vector<std::string>>());
  }
  return t;
}

api_error error_of(const parse_fn& parse, const std::string& body) {
  auto r = parse(body);
  REQUIRE_MESSAGE(std::holds_alternative<api_error>(r), body);
  return std::get<api_error>(r);
}
}  // namespace

TEST_CASE("responses: prompts and ids equal deepseek_recipe's for every golden request") {
  const tally t = check_goldens("responses.v4.jsonl.gz", responses);
  CHECK(t.prompts >= 40);
  CHECK(t.rejected >= 15);
}

TEST_CASE("messages: prompts and ids equal deepseek_recipe's for every golden request") {
  const tally t = check_goldens("messages.v4.jsonl.gz", messages);
  CHECK(t.prompts >= 35);
  CHECK(t.rejected >= 15);
}

TEST_CASE("protocols: at least 100 goldens across the three protocols, each checked") {
  const std::set<std::string> chat_accepted_more = {"err.developer_role", "err.n_2"};
  const tally c = check_goldens("chat_completions.v4.jsonl.gz", chat, chat_accepted_more);
  const tally r = check_goldens("responses.v4.jsonl.gz", responses);
  const tally m = check_goldens("messages.v4.jsonl.gz", messages);
  CHECK(c.prompts + r.prompts + m.prompts >= 100);
  CHECK(c.v41 + r.v41 + m.v41 >= 100);
  CHECK(c.rejected + r.rejected + m.rejected >= 40);
}

TEST_CASE("responses: golden requests against the official CreateResponse schema") {
  // Validated at golden time with Python jsonschema against
  // tests/recipe/fixtures/openai/create_response_request.schema.json (see the chat test for why
  // not in C++). Accepted requests are valid by the spec except: user content given as an array of
  // parts matches both EasyInputMessage and InputMessage, which the spec's oneOf forbids (a quirk
  // of the spec, OpenAI's API accepts these); a function tool without `strict` / `parameters`,
  // which the spec requires and the reference (and we) accept.
  const std::set<std::string> exceptions = {"resp.message_items", "resp.image", "resp.image_data_url", "resp.input_file",
                                            "resp.tools_no_parameters", "resp.image_detail"};
  int checked = 0;
  for (const json& g : testing::json_records(testing::golden_path("responses.v4.jsonl.gz"))) {
    if (g.contains("error")) continue;
    const std::string name = g["name"];
    CAPTURE(name);
    REQUIRE(g.contains("schema_valid"));
    CHECK(g["schema_valid"].get<bool>() == !exceptions.count(name));
    ++checked;
  }
  CHECK(checked >= 40);
}

TEST_CASE("responses: validation errors carry status, message and param in OpenAI's shape") {
  struct expect {
    std::string body;
    const char* param;  // "" = null
    const char* message_part;
  };
  const std::string M = R"({"model": "DeepSeek-V4-Pro", )";
  const std::vector<expect> cases = {
      {"{", "", "could not parse the JSON"},
      {R"({"input": "x"})", "model", "Missing required parameter: 'model'"},
      {M + R"("x": 1})", "input", "Either input or instructions"},
      {M + R"("input": 5})", "input", "expected a string or an array"},
      {M + R"("input": []})", "input", "empty array"},
      {M + R"("input": [3]})", "input[0]", "expected an object"},
      {M + R"("input": [{"role": "bogus", "content": "x"}]})", "input[0].role", "Invalid value: 'bogus'"},
      {M + R"("input": [{"role": "user"}]})", "input[0].content", "Missing required parameter"},
      {M + R"("input": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]})", "input[0].content[0].type",
       "Invalid value: 'refusal'"},
      {M + R"("input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}]})",
       "input[0].content[0].type", "not supported in this message role"},
      {M + R"("input": [{"type": "item_reference", "id": "x"}]})", "input[0].type", "Invalid value: 'item_reference'"},
      {M + R"("input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]})", "input[0].name", "Missing"},
      {M + R"("input": [{"type": "function_call_output", "call_id": "zz", "output": "o"}]})", "input[0].call_id",
       "No tool call found for tool output with call_id zz"},
      {M + R"("input": "x", "reasoning": {"effort": "bogus"}})", "reasoning.effort", "Invalid value: 'bogus'"},
      {M + R"("input": "x", "tools": [{"type": "file_search"}]})", "tools[0].type", "'file_search' are not supported"},
      {M + R"("input": "x", "tools": [{"type": "function"}]})", "tools[0].name", "Missing"},
      {M + R"("input": "x", "tools": [{"type": "function", "name": "f", "strict": true, "parameters": {"type": "object",
          "properties": {"a": {"type": "string"}}, "required": []}}]})",
       "tools[0].parameters.required", "Required properties must match"},
      {M + R"("input": "x", "tools": [{"type": "function", "name": "get weather"}]})", "tools[0].name",
       "does not match pattern"},
      {M + R"("input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u", "detail": "bogus"}]}]})",
       "input[0].content[0].detail", "Invalid value: 'bogus'"},
      {M + R"("input": [{"role": "user", "content": "x"}, {"type": "function_call", "call_id": "c0", "name": "f",
          "arguments": "{}"}, {"role": "user", "content": "y"}]})",
       "input", "No tool output found for tool call c0"},
      {M + R"("input": [{"role": "user", "content": "x"}, {"type": "function_call", "call_id": "c0", "name": "f",
          "arguments": "{}"}, {"type": "function_call_output", "call_id": "c0", "output": "o"},
          {"type": "function_call_output", "call_id": "c0", "output": "o"}]})",
       "input[3].call_id", "Duplicate tool output for call_id: c0"},
      {M + R"("input": "x", "tool_choice": "bogus"})", "tool_choice", "Invalid value: 'bogus'"},
      {M + R"("input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"})", "tool_choice",
       "Thinking mode does not support"},
      {M + R"("input": "x", "reasoning": {"effort": "none"}, "tools": [{"type": "function", "name": "f"}],
          "tool_choice": {"type": "function", "name": "g"}})",
       "tool_choice.name", "no function named 'g'"},
      {M + R"("input": "x", "text": {"format": {"type": "json_object"}}})", "text.format.type", "must contain the word 'json'"},
      {M + R"("input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}})", "text.format.schema", "Missing"},
      {M + R"("input": "x", "text": {"format": {"type": "regex"}}})", "text.format.regex", "Missing required parameter"},
      {M + R"("input": "x", "text": {"format": {"type": "grammar", "grammar": 1}}})", "text.format.grammar", "expected a string"},
      {M + R"("input": "x", "text": {"format": {"type": "ebnf"}}})", "text.format.type", "Invalid value: 'ebnf'"},
      {M + R"("input": "x", "max_output_tokens": 0})", "max_output_tokens", "[1, 393216]"},
      {M + R"("input": "x", "temperature": 2.5})", "temperature", "[0.0, 2.0]"},
      {M + R"("input": "x", "top_p": 0})", "top_p", "(0.0, 1.0]"},
      {M + R"("input": "x", "top_logprobs": 21})", "top_logprobs", "[0, 20]"},
      {M + R"("input": "x", "stream": "yes"})", "stream", "expected a boolean"},
      {M + R"("input": "x", "metadata": []})", "metadata", "expected an object"},
      {M + R"("input": "x", "include": "message.output_text.logprobs"})", "include", "expected an array"},
      {M + R"("input": "x", "include": [3]})", "include[0]", "expected a string"},
      {M + R"("input": "x", "include": ["reasoning.encrypted_content", "bogus"]})", "include[1]",
       "Invalid value: 'bogus'"},
  };
  for (const auto& e : cases) {
    CAPTURE(e.body);
    const api_error err = error_of(responses, e.body);
    CHECK(err.status == 400);
    CHECK(err.type == "invalid_request_error");
    CHECK(err.message.find(e.message_part) != std::string::npos);
    if (*e.param == '\0') CHECK(!err.param.has_value());
    else CHECK(err.param == std::string(e.param));
    const json j = json::parse(err.to_json());
    CHECK(j.size() == 1);
    CHECK(j["error"]["message"] == err.message);
    CHECK(j["error"]["param"] == (err.param ? json(*err.param) : json(nullptr)));
  }
  CHECK(error_of(responses, R"({"model": "gpt-4o", "input": "x"})").code == "model_not_found");
}

TEST_CASE("messages: validation errors carry status, message and param in Anthropic's shape") {
  struct expect {
    std::string body;
    const char* param;  // "" = none
    const char* message_part;
  };
  const std::string M = R"({"model": "DeepSeek-V4-Pro", "max_tokens": 16, )";
  const std::string U = R"("messages": [{"role": "user", "content": "x"}])";
  const std::vector<expect> cases = {
      {"{", "", "not valid JSON"},
      {M + R"("x": 1})", "body.messages", "Field required"},
      {M + R"("messages": []})", "messages", "at least one message is required"},
      {M + R"("messages": [{"role": "bogus", "content": "x"}]})", "messages.0.role", "'user', 'assistant' or 'system'"},
      {M + R"("messages": [{"role": "user"}]})", "messages.0.content", "Field required"},
      {M + R"("messages": [{"role": "user", "content": [{"type": "video"}]}]})", "messages.0.content.0.type",
       "'video' blocks are not supported"},
      {M + R"("messages": [{"role": "user", "content": [{"text": "x"}]}]})", "messages.0.content.0.type", "Field required"},
      {M + R"("messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "redacted_thinking",
          "data": "a"}]}]})",
       "messages.1.content.0.type", "'redacted_thinking' blocks are not supported"},
      {M + R"("messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t",
          "name": "f", "input": "s"}]}]})",
       "messages.1.content.0.input", "Input should be an object"},
      {M + R"("messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz"}]}]})",
       "messages.0.content.0.tool_use_id", "must have a corresponding `tool_use` block"},
      {M + R"("messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t",
          "name": "f", "input": {}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
          {"role": "assistant", "content": "y"}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]})",
       "messages.4.content.0.tool_use_id", "in the previous message"},
      {M + R"("messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t",
          "name": "f", "input": {}}, {"type": "tool_use", "id": "u", "name": "f", "input": {}}]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}, {"type": "text", "text": "y"}]}]})",
       "messages.1", "without `tool_result` blocks immediately after: u"},
      {M + R"("messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t",
          "name": "f", "input": {}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"},
          {"type": "tool_result", "tool_use_id": "t"}]}]})",
       "messages.2.content.1.tool_use_id", "single result"},
      {M + U + R"(, "tools": [{"name": "x<think>y", "input_schema": {}}]})", "tools.0.name", "does not match pattern"},
      {M + R"("messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/bmp",
          "data": "AAAA"}}]}]})",
       "messages.0.content.0.source.media_type", "Input should be 'image/jpeg'"},
      {M + U + R"(, "system": 5})", "system", "valid string or a list of blocks"},
      {M + U + R"(, "thinking": {"type": "bogus"}})", "thinking.type", "Invalid value: 'bogus'"},
      {M + U + R"(, "output_config": {"effort": "bogus"}})", "output_config.effort", "Invalid value: 'bogus'"},
      {M + U + R"(, "output_config": {"format": "json"}})", "output_config.format", "Input should be an object"},
      {M + U + R"(, "output_config": {"format": {"schema": {}}}})", "output_config.format.type", "Field required"},
      {M + U + R"(, "output_config": {"format": {"type": "json_object"}}})", "output_config.format.type",
       "Input should be 'json_schema'"},
      {M + U + R"(, "output_config": {"format": {"type": "json_schema"}}})", "output_config.format.schema",
       "Field required"},
      {M + U + R"(, "output_config": {"format": {"type": "json_schema", "schema": []}}})", "output_config.format.schema",
       "valid dictionary"},
      {M + U + R"(, "tools": [{"name": "f"}]})", "tools.0.input_schema", "Field required"},
      {M + U + R"(, "tools": [{"type": "web_search_20250305", "name": "web_search"}]})", "tools.0.type",
       "server tools are not supported"},
      {M + U + R"(, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "f"}})", "tool_choice",
       "thinking mode does not support"},
      {M + U + R"(, "thinking": {"type": "disabled"}, "tools": [{"name": "f", "input_schema": {}}],
          "tool_choice": {"type": "tool", "name": "g"}})",
       "tool_choice.name", "no tool named 'g'"},
      {M + U + R"(, "tool_choice": {"type": "sometimes"}})", "tool_choice.type", "'auto', 'any', 'tool' or 'none'"},
      {R"({"model": "DeepSeek-V4-Pro", "max_tokens": 0, )" + U + "}", "max_tokens", "greater than or equal to 1"},
      {M + U + R"(, "temperature": -1})", "temperature", "[0.0, 2.0]"},
      {M + U + R"(, "top_p": 1.5})", "top_p", "(0.0, 1.0]"},
      {M + U + R"(, "top_k": -1})", "top_k", "greater than or equal to 0"},
      {M + U + R"(, "stop_sequences": "END"})", "stop_sequences", "valid list"},
      {M + U + R"(, "stop_sequences": ["a", 1]})", "stop_sequences.1", "valid string"},
  };
  for (const auto& e : cases) {
    CAPTURE(e.body);
    const api_error err = error_of(messages, e.body);
    CHECK(err.status == 400);
    CHECK(err.message.find(e.message_part) != std::string::npos);
    if (*e.param == '\0') {
      CHECK(!err.param.has_value());
    } else {
      CHECK(err.param == std::string(e.param));
      CHECK(err.message.rfind(std::string(e.param) + ": ", 0) == 0);  // Anthropic style: the field first
    }
    const json j = json::parse(err.to_anthropic_json());
    CHECK(j.size() == 2);
    CHECK(j["type"] == "error");
    CHECK(j["error"]["type"] == "invalid_request_error");
    CHECK(j["error"]["message"] == err.message);
  }
}

TEST_CASE("responses: serving fields are carried") {
  auto r = parse_responses(R"({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"},
      {"type": "input_image", "image_url": "https://x/y.png"}]}], "instructions": "ins", "max_output_tokens": 20,
      "temperature": 0.5, "top_p": 0.9, "top_logprobs": 2, "stream": true, "store": false, "previous_response_id": "resp_9",
      "parallel_tool_calls": false, "user": "u", "metadata": {"k": "v"}, "reasoning": {"effort": "xhigh"},
      "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}})");
  REQUIRE(std::holds_alternative<responses_request>(r));
  const auto& [conv, sp, f] = std::get<responses_request>(r);
  CHECK(sp.model == "m");
  CHECK(sp.max_tokens == 20);
  CHECK(sp.temperature == 0.5);
  CHECK(sp.top_p == 0.9);
  CHECK(sp.logprobs);
  CHECK(sp.top_logprobs == 2);
  CHECK(sp.stream);
  CHECK(sp.image_parts == 1);
  CHECK(sp.reasoning_effort == "xhigh");
  CHECK(sp.response_format_type == "json_schema");
  CHECK(f.instructions == "ins");
  CHECK(!f.store);
  CHECK(f.previous_response_id == "resp_9");
  CHECK(f.parallel_tool_calls == false);
  CHECK(conv.one_call);
  CHECK(f.user == "u");
  CHECK(f.metadata_json == R"({"k":"v"})");
  CHECK(f.text_format_json == R"({"type":"json_schema","name":"s","schema":{"type":"object"}})");
  CHECK(!f.output_text_logprobs);  // top_logprobs alone does not ask for them
  CHECK(conv.effort == reasoning_effort::xhigh);
  CHECK(conv.format.type == response_format::kind::json_schema);
  REQUIRE(conv.messages.size() == 2);
  CHECK(conv.messages[0].role == role::system);
  CHECK(conv.messages[1].content == "a\n\n[Unsupported Image]");
}

TEST_CASE("responses: include message.output_text.logprobs asks for the output text's logprobs") {
  auto r = parse_responses(R"({"model": "m", "input": "a", "include": ["reasoning.encrypted_content",
      "message.output_text.logprobs"]})");
  REQUIRE(std::holds_alternative<responses_request>(r));
  CHECK(std::get<responses_request>(r).fields.output_text_logprobs);
  r = parse_responses(R"({"model": "m", "input": "a", "include": []})");
  REQUIRE(std::holds_alternative<responses_request>(r));
  CHECK(!std::get<responses_request>(r).fields.output_text_logprobs);
}

TEST_CASE("responses: vLLM's structured_outputs constrains the output; with text.format it is refused") {
  auto r = parse_responses(R"({"model": "m", "input": "a", "structured_outputs": {"choice": ["x", "y"]}})");
  REQUIRE(std::holds_alternative<responses_request>(r));
  const auto& req = std::get<responses_request>(r);
  REQUIRE(req.params.extra_constraint.has_value());
  CHECK(req.params.extra_constraint->regex == "(x|y)");
  CHECK(req.params.extra_constraint_param == "structured_outputs.choice");
  CHECK(req.conversation.format.type == response_format::kind::text);
  r = parse_responses(R"({"model": "m", "input": "json", "text": {"format": {"type": "json_object"}},
      "structured_outputs": {"regex": "a"}})");
  REQUIRE(std::holds_alternative<api_error>(r));
  CHECK(std::get<api_error>(r).param == "structured_outputs.regex");
  CHECK(std::get<api_error>(r).message.find("'text.format'") != std::string::npos);
}

TEST_CASE("responses: a structural_tag text.format is the tag") {
  auto r = parse_responses(R"({"model": "m", "input": "a", "text": {"format": {"type": "structural_tag",
      "format": {"type": "const_string", "value": "ok"}}}})");
  REQUIRE(std::holds_alternative<responses_request>(r));
  const auto& format = std::get<responses_request>(r).conversation.format;
  CHECK(format.type == response_format::kind::structural_tag);
  CHECK(nlohmann::json::parse(format.structural_tag)["format"]["value"] == "ok");
}

TEST_CASE("messages: serving fields are carried, max_tokens lowered to the limit") {
  chat_completions_config cfg;
  cfg.max_tokens_limit = 1000;
  auto r = parse_messages(R"({"model": "m", "max_tokens": 5000, "messages": [{"role": "user", "content": [{"type": "image",
      "source": {"type": "url", "url": "https://x/y.png"}}]}], "stop_sequences": ["a", "b", "c", "d", "e"], "top_k": 7,
      "temperature": 0.1, "top_p": 0.5, "stream": true, "metadata": {"user_id": "who"}, "output_config": {"effort": "max"}})",
                          cfg);
  REQUIRE(std::holds_alternative<messages_request>(r));
  const auto& [conv, sp, user_id] = std::get<messages_request>(r);
  CHECK(sp.max_tokens == 1000);
  CHECK(sp.stop == std::vector<std::string>{"a", "b", "c", "d", "e"});
  CHECK(sp.top_k == 7);
  CHECK(sp.temperature == 0.1);
  CHECK(sp.top_p == 0.5);
  CHECK(sp.stream);
  CHECK(sp.image_parts == 1);
  CHECK(user_id == "who");
  CHECK(conv.effort == reasoning_effort::max);
  CHECK_FALSE(conv.one_call);
  auto one = parse_messages(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"name": "a", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}})",
                            cfg);
  REQUIRE(std::holds_alternative<messages_request>(one));
  CHECK(std::get<messages_request>(one).conversation.one_call);
  cfg.images = image_policy::reject;
  auto rejected = parse_messages(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image",
      "source": {"type": "url", "url": "u"}}]}]})",
                                 cfg);
  REQUIRE(std::holds_alternative<api_error>(rejected));
  CHECK(std::get<api_error>(rejected).param == "messages.0.content.0.type");
}

TEST_CASE("messages: output_config.format (structured outputs) sets the conversation's JSON schema") {
  const chat_completions_config cfg;
  const std::string base = R"({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "x"}], )";
  auto r = parse_messages(base + R"("output_config": {"effort": "high", "format": {"type": "json_schema",
      "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "additionalProperties": false}}}})",
                          cfg);
  REQUIRE(std::holds_alternative<messages_request>(r));
  const auto& format = std::get<messages_request>(r).conversation.format;
  CHECK(format.type == response_format::kind::json_schema);
  CHECK(json::parse(format.schema_json) ==
        json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                       "additionalProperties": false})"));
  // The schema reaches the prompt, as Chat Completions' json_schema does.
  auto marked = parse_messages(base + R"("output_config": {"format": {"type": "json_schema",
      "schema": {"type": "object", "properties": {"zebra_field": {"type": "integer"}}}}}})",
                               cfg);
  REQUIRE(std::holds_alternative<messages_request>(marked));
  const auto& conv = std::get<messages_request>(marked).conversation;
  CHECK(render_prompt(conv, prompt_format::v41).text.find("zebra_field") != std::string::npos);
  CHECK(render_prompt(conv, prompt_format::v4).text.find("zebra_field") != std::string::npos);
  // A null format is none.
  auto none = parse_messages(base + R"("output_config": {"format": null}})", cfg);
  REQUIRE(std::holds_alternative<messages_request>(none));
  CHECK(std::get<messages_request>(none).conversation.format.type == response_format::kind::text);
}

TEST_CASE("protocols: V4.1's continuous reasoning effort (1-100) in all three, beyond the reference") {
  const std::vector<std::pair<parse_fn, std::string>> bodies = {
      {chat, R"({"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": EFF})"},
      {responses, R"({"model": "DeepSeek-V4.1-Flash", "input": "x", "reasoning": {"effort": EFF}})"},
      {messages, R"({"model": "DeepSeek-V4.1-Flash", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
                     "output_config": {"effort": EFF}})"},
  };
  auto with = [](std::string body, const std::string& effort) { return body.replace(body.find("EFF"), 3, effort); };
  for (const auto& [parse, body] : bodies) {
    CAPTURE(body);
    for (const auto& [n, named] : std::vector<std::pair<int, reasoning_effort>>{
             {1, reasoning_effort::low}, {50, reasoning_effort::low}, {51, reasoning_effort::high},
             {99, reasoning_effort::high}, {100, reasoning_effort::max}}) {
      auto r = parse(with(body, std::to_string(n)));
      REQUIRE(std::holds_alternative<conversation>(r));
      const conversation& c = std::get<conversation>(r);
      CHECK(c.effort_level == n);
      CHECK(c.effort == named);
      CHECK(render_prompt(c, prompt_format::v41).text.find("Reasoning Effort: " + std::to_string(n) + " (range 1-100") !=
            std::string::npos);
    }
    for (const char* bad : {"0", "101", "-5"}) {
      auto r = parse(with(body, bad));
      REQUIRE(std::holds_alternative<api_error>(r));
      CHECK(std::get<api_error>(r).message.find("[1, 100]") != std::string::npos);
    }
  }
}

TEST_CASE("protocols: V4.1 images are control tokens only where the request has an image") {
  // Text spelling <｜image｜> stays text; the image part becomes the one <｜image｜> id. (The V4
  // vocabulary has <｜image｜>, so this V4.1 prompt without <｜System｜> encodes with it.)
  const std::string body = R"({"model": "DeepSeek-V4.1-Flash", "thinking": {"type": "disabled"}, "messages": [{"role": "user",
      "content": [{"type": "text", "text": "a <｜image｜> b"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
      {"type": "text", "text": "c"}]}]})";
  auto r = chat(body);
  REQUIRE(std::holds_alternative<conversation>(r));
  const conversation& c = std::get<conversation>(r);
  REQUIRE(c.messages.size() == 1);
  CHECK(c.messages[0].images == std::vector<std::size_t>{std::string("a <｜image｜> b\n\n").size()});
  const encoded_prompt p = encode_prompt(c, v4(), prompt_format::v41);
  const token_id image = *v4().token_to_id("<｜image｜>");
  CHECK(std::count(p.ids.begin(), p.ids.end(), image) == 1);
  const std::set<std::size_t> own(p.control.begin(), p.control.end());
  for (std::size_t i = 0; i < p.ids.size(); ++i) CHECK(is_control(p.ids[i]) == own.contains(i));
  CHECK(p.text == "<｜begin▁of▁sentence｜><｜User｜>a <｜image｜> b\n\n<｜image｜>\n\nc<｜Assistant｜></think>");
  // The same conversation rendered for V4 has the text placeholder.
  CHECK(render_prompt(c, prompt_format::v4).text.find("b\n\n[Unsupported Image]\n\nc") != std::string::npos);
}

namespace {
// Every free-text string in a request, replaced by what `f` returns for it; enumerations (roles,
// types, efforts, ...), ids that must match each other, the model and the keys are kept.
void map_strings(json& j, const std::function<std::string(const std::string&)>& f, const std::string& key = "") {
  static const std::set<std::string> kept = {"role", "type", "model", "effort", "reasoning_effort", "detail", "status",
                                             "summary", "media_type", "truncation", "tool_use_id", "call_id", "id",
                                             "tool_call_id", "tool_choice", "url", "image_url", "data"};
  if (j.is_string()) {
    if (!kept.count(key)) j = f(j.get<std::string>());
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) map_strings(it.value(), f, it.key());
  } else if (j.is_array()) {
    for (auto& v : j) map_strings(v, f, key == "stop" || key == "stop_sequences" ? "" : key);
  }
}
}  // namespace

TEST_CASE("protocols: control strings planted in every string field never become control ids (seeded)") {
  // Each accepted golden request of the three protocols, with every string value (content, names,
  // arguments, schemas, instructions, ...) extended by control-token spellings drawn from a seeded
  // generator; whatever the parser accepts must encode with control ids only at the encoder's
  // positions, in both prompt formats (V4.1 rendered with V4's ids where its markers exist).
  const std::vector<std::string> markers = {
      "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
      "｜DSML｜", "<｜DSML｜tool_calls>", "<｜DSML｜ calls>", "<｜image｜>", "<｜System｜>", "<tool_result>",
      "<｜latest_reminder｜>", "<|EOT|>", "<｜fim▁hole｜>", "<｜tool▁calls▁begin｜>", "<｜▁pad▁｜>"};
  std::uint64_t state = 0x9E3779B97F4A7C15ull;  // splitmix64, fixed seed
  auto next = [&] {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  int encoded = 0;
  for (const auto& [file, parse] : std::vector<std::pair<std::string, parse_fn>>{
           {"chat_completions.v4.jsonl.gz", chat}, {"responses.v4.jsonl.gz", responses}, {"messages.v4.jsonl.gz", messages}}) {
    for (const json& g : testing::json_records(testing::golden_path(file))) {
      if (g.contains("error")) continue;
      for (int round = 0; round < 3; ++round) {
        json body = g["request"];
        map_strings(body, [&](const std::string& s) {
          std::string out = s;
          const std::size_t n = next() % 3;
          for (std::size_t k = 0; k < n; ++k) {
            std::size_t at = next() % (out.size() + 1);
            while (at > 0 && at < out.size() && (static_cast<unsigned char>(out[at]) & 0xC0) == 0x80) --at;  // a char boundary
            out.insert(at, markers[next() % markers.size()]);
          }
          return out;
        });
        auto r = parse(body.dump());
        if (!std::holds_alternative<conversation>(r)) continue;  // e.g. a tool_choice name no longer matches
        for (const prompt_format f : {prompt_format::v4, prompt_format::v41}) {
          encoded_prompt p;
          try {
            p = encode_prompt(std::get<conversation>(r), v4(), f);
          } catch (const std::runtime_error&) {
            CHECK(f == prompt_format::v41);  // only V4.1's <｜System｜> is missing from the V4 vocabulary
            continue;
          }
          const std::set<std::size_t> own(p.control.begin(), p.control.end());
          for (std::size_t i = 0; i < p.ids.size(); ++i)
            if (is_control(p.ids[i]) != own.contains(i)) FAIL_CHECK(g["name"].get<std::string>() << " id " << p.ids[i]);
          ++encoded;
        }
      }
    }
  }
  CHECK(encoded >= 300);
}

TEST_CASE("protocols: deeply nested bodies are refused, not recursed into") {
  std::string deep = R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "input": "x", "max_tokens": 8, "tools": [{"type": "function", "name": "f", "function": {"name": "f", "strict": true, "parameters": )";
  std::string nest;
  for (int i = 0; i < 100000; ++i) nest += R"({"type": "object", "properties": {"a": )";
  deep += nest + "{}";
  for (int i = 0; i < 100000; ++i) deep += "}}";
  deep += "}}]}";
  for (const auto& parse : {chat, responses, messages}) {
    auto r = parse(deep);
    REQUIRE(std::holds_alternative<api_error>(r));
    CHECK(std::get<api_error>(r).message.find("nested more than 128 levels") != std::string::npos);
  }
  // Brackets inside strings do not count.
  auto ok = chat(R"({"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": ")" + std::string(1000, '[') +
                 R"(\"{"}]})");
  CHECK(std::holds_alternative<conversation>(ok));
}
