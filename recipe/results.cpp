// Non-streaming response objects (see results.hpp, docs/recipe.md).
#include "recipe/results.hpp"

#include <nlohmann/json.hpp>

namespace troupe::recipe {
namespace {

using ojson = nlohmann::ordered_json;

ojson parse_or(const std::optional<std::string>& text, ojson fallback) {
  return text ? ojson::parse(*text) : std::move(fallback);
}

ojson opt(const std::optional<std::string>& s) { return s ? ojson(*s) : ojson(nullptr); }

}  // namespace

std::string render_chat_completion(std::span<const generation> choices, const response_meta& meta) {
  ojson out;
  out["id"] = meta.id;
  out["object"] = "chat.completion";
  out["created"] = meta.created;
  out["model"] = meta.model;
  ojson list = ojson::array();
  std::int64_t completion = 0, reasoning = 0;
  bool any_reasoning = false;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const generation& g = choices[i];
    ojson msg;
    msg["role"] = "assistant";
    msg["content"] = g.content;
    if (g.reasoning) msg["reasoning_content"] = *g.reasoning;
    if (!g.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (std::size_t k = 0; k < g.tool_calls.size(); ++k)
        calls.push_back({{"index", k},
                         {"id", g.tool_calls[k].id},
                         {"type", "function"},
                         {"function", {{"name", g.tool_calls[k].name}, {"arguments", g.tool_calls[k].arguments}}}});
      msg["tool_calls"] = std::move(calls);
    }
    msg["refusal"] = nullptr;  // required by the spec (the reference omits it)
    const char* reason = g.finish == backend_finish::length           ? "length"
                         : g.finish == backend_finish::content_filter ? "content_filter"
                         : g.tool_calls.empty()                      ? "stop"
                                                                     : "tool_calls";
    list.push_back({{"index", i}, {"message", std::move(msg)}, {"logprobs", nullptr}, {"finish_reason", reason}});
    completion += g.completion_tokens;
    reasoning += g.reasoning_tokens;
    any_reasoning = any_reasoning || g.reasoning.has_value();
  }
  out["choices"] = std::move(list);
  ojson usage;
  usage["prompt_tokens"] = meta.prompt_tokens;
  usage["completion_tokens"] = completion;
  usage["total_tokens"] = meta.prompt_tokens + completion;
  usage["prompt_tokens_details"] = {{"cached_tokens", meta.cached_tokens}};
  if (any_reasoning) usage["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  usage["prompt_cache_hit_tokens"] = meta.cached_tokens;  // DeepSeek's own names
  usage["prompt_cache_miss_tokens"] = meta.prompt_tokens - meta.cached_tokens;
  out["usage"] = std::move(usage);
  return out.dump();
}

std::string render_response(const generation& g, const response_meta& meta, const responses_request& request) {
  const sampling_params& sp = request.params;
  const responses_fields& f = request.fields;
  const bool complete = g.finish == backend_finish::stop;

  // Output items: reasoning (when non-empty), the message (when there is content), the calls.
  // Only the last item is incomplete when the output was cut.
  ojson output = ojson::array();
  auto item_id = [&](const char* prefix) { return std::string(prefix) + "_" + meta.id + "_" + std::to_string(output.size()); };
  if (g.reasoning && !g.reasoning->empty()) {
    output.push_back({{"type", "reasoning"},
                      {"id", item_id("rs")},
                      {"status", "completed"},
                      {"content", ojson::array({{{"type", "reasoning_text"}, {"text", *g.reasoning}}})},
                      {"summary", ojson::array()},
                      {"encrypted_content", meta.id + "-" + std::to_string(output.size())}});
  }
  if (!g.content.empty()) {
    output.push_back(
        {{"type", "message"},
         {"id", item_id("msg")},
         {"status", "completed"},
         {"role", "assistant"},
         {"phase", g.tool_calls.empty() ? "final_answer" : "commentary"},
         {"content", ojson::array({{{"type", "output_text"},
                                    {"annotations", ojson::array()},
                                    {"logprobs", ojson::array()},
                                    {"text", g.content}}})}});
  }
  for (const auto& call : g.tool_calls) {
    output.push_back({{"type", "function_call"},
                      {"id", item_id("fc")},
                      {"status", "completed"},
                      {"call_id", call.id},
                      {"name", call.name},
                      {"arguments", call.arguments}});
  }
  if (!complete && !output.empty()) output.back()["status"] = "incomplete";

  ojson out;
  out["id"] = meta.id;
  out["object"] = "response";
  out["created_at"] = meta.created;
  out["status"] = complete ? "completed" : "incomplete";
  out["background"] = false;
  out["completed_at"] = meta.created;
  out["content_filters"] = nullptr;
  out["error"] = nullptr;
  out["frequency_penalty"] = 0.0;
  out["incomplete_details"] =
      complete ? ojson(nullptr)
               : ojson({{"reason", g.finish == backend_finish::length ? "max_output_tokens" : "content_filter"}});
  out["instructions"] = opt(f.instructions);
  out["max_output_tokens"] = sp.max_tokens ? ojson(*sp.max_tokens) : ojson(nullptr);
  out["max_tool_calls"] = nullptr;
  out["model"] = meta.model;
  out["moderation"] = nullptr;
  out["output"] = std::move(output);
  out["parallel_tool_calls"] = f.parallel_tool_calls.value_or(true);  // enforced (structured output)
  out["presence_penalty"] = 0.0;
  out["previous_response_id"] = nullptr;  // no state is kept (the reference's report too)
  out["prompt_cache_key"] = nullptr;
  out["prompt_cache_retention"] = nullptr;
  out["reasoning"] = {{"effort", opt(sp.reasoning_effort)}, {"summary", opt(f.reasoning_summary)}};
  out["safety_identifier"] = nullptr;
  out["service_tier"] = "default";
  out["store"] = false;  // nothing is stored
  out["temperature"] = sp.temperature.value_or(1.0);
  ojson format = parse_or(f.text_format_json, ojson({{"type", "text"}}));
  if (format["type"] == "json_schema") {
    if (!format.contains("description")) format["description"] = nullptr;
    if (!format.contains("strict")) format["strict"] = nullptr;
  }
  out["text"] = {{"format", std::move(format)}, {"verbosity", nullptr}};
  out["tool_choice"] = parse_or(f.tool_choice_json, ojson("auto"));
  out["tools"] = ojson::parse(f.tools_json);
  out["top_logprobs"] = sp.top_logprobs.value_or(0);
  out["top_p"] = sp.top_p.value_or(1.0);
  out["truncation"] = "disabled";
  out["usage"] = {{"input_tokens", meta.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", meta.cached_tokens}, {"cache_write_tokens", 0}}},
                  {"output_tokens", g.completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", g.reasoning_tokens}}},
                  {"total_tokens", meta.prompt_tokens + g.completion_tokens}};
  if (f.user) out["user"] = *f.user;  // the spec allows no null here (the reference writes null)
  out["metadata"] = ojson::object();   // as the reference reports it
  return out.dump();
}

std::string render_message(const generation& g, const response_meta& meta) {
  ojson content = ojson::array();
  if (g.reasoning) content.push_back({{"type", "thinking"}, {"thinking", *g.reasoning}, {"signature", meta.id}});
  if (!g.content.empty()) content.push_back({{"type", "text"}, {"text", g.content}});
  for (const auto& call : g.tool_calls) {
    ojson input = ojson::parse(call.arguments, nullptr, false);
    if (input.is_discarded()) input = ojson::object();
    content.push_back({{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", std::move(input)}});
  }
  const char* stop = g.finish == backend_finish::length           ? "max_tokens"
                     : g.finish == backend_finish::content_filter ? "refusal"
                     : g.stop_sequence                           ? "stop_sequence"
                     : g.tool_calls.empty()                      ? "end_turn"
                                                                 : "tool_use";
  ojson out;
  out["id"] = meta.id;
  out["type"] = "message";
  out["role"] = "assistant";
  out["model"] = meta.model;
  out["content"] = std::move(content);
  out["stop_reason"] = stop;
  out["stop_sequence"] = g.stop_sequence && g.finish == backend_finish::stop ? ojson(*g.stop_sequence) : ojson(nullptr);
  out["usage"] = {{"input_tokens", meta.prompt_tokens - meta.cached_tokens},
                  {"cache_creation_input_tokens", 0},
                  {"cache_read_input_tokens", meta.cached_tokens},
                  {"output_tokens", g.completion_tokens},
                  {"service_tier", "standard"}};
  return out.dump();
}

}  // namespace troupe::recipe
