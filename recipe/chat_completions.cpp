// OpenAI Chat Completions request -> conversation (see chat_completions.hpp, docs/recipe.md).
#include "recipe/chat_completions.hpp"

#include "recipe/request_json.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string_view>

namespace troupe::recipe {

namespace {

using namespace detail;

std::string type_name(const ojson& j) { return j.type_name(); }

// Content: a string or an array of parts; text parts are joined with "\n\n" (deepseek_recipe),
// an image part becomes "[Unsupported Image]" (V4 has no vision), an image of the message in a
// V4.1 conversion (`images`), or is rejected.
std::string content_text(const ojson& c, const std::string& param, bool images_allowed, const chat_completions_config& cfg,
                         int& image_parts, std::vector<std::size_t>* images = nullptr) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array())
    fail("Invalid type for '" + param + "': expected a string or an array of content parts, got " + type_name(c) + ".",
         param);
  std::string out;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const ojson& part = c[i];
    if (!part.is_object()) fail("Invalid type for '" + p + "': expected an object, got " + type_name(part) + ".", p);
    const ojson* type = find(part, "type");
    if (!type) fail("Missing required parameter: '" + p + ".type'.", p + ".type");
    std::string t = need_string(*type, p + ".type");
    std::string piece;
    if (t == "text") {
      const ojson* text = find(part, "text");
      if (!text) fail("Missing required parameter: '" + p + ".text'.", p + ".text");
      piece = need_string(*text, p + ".text");
    } else if (t == "image_url") {
      if (!images_allowed || cfg.images == image_policy::reject)
        fail("Image content parts are not supported " +
                 std::string(images_allowed ? "by this model." : "in this message role."),
             p + ".type");
      const ojson* url = find(part, "image_url");
      if (!url || !url->is_object() || !find(*url, "url"))
        fail("Missing required parameter: '" + p + ".image_url.url'.", p + ".image_url.url");
      need_string((*url)["url"], p + ".image_url.url");
      if (const ojson* detail = find(*url, "detail")) check_image_detail(*detail, p + ".image_url.detail");
      ++image_parts;
      if (i > 0) out += "\n\n";
      add_image(out, images);
      continue;
    } else if (t == "input_audio" || t == "file" || t == "refusal") {
      fail("Content parts of type '" + t + "' are not supported.", p + ".type");
    } else {
      fail("Invalid value: '" + t + "'. Supported values are: 'text' and 'image_url'.", p + ".type");
    }
    if (i > 0) out += "\n\n";
    out += piece;
  }
  return out;
}

std::string compact(const ojson& j) { return j.dump(); }

chat_completions_request convert(const ojson& body, const chat_completions_config& cfg) {
  chat_completions_request r;
  sampling_params& sp = r.params;
  conversation& conv = r.conversation;
  if (!body.is_object()) fail("The request body must be a JSON object.", "");

  sp.model = check_model(body, cfg.models);
  sp.format = format_of(sp.model, cfg.v41_models);

  // thinking mode and effort
  bool thinking = cfg.default_thinking;
  bool thinking_given = false;
  if (const ojson* t = find(body, "thinking")) {
    thinking = parse_thinking(*t, "thinking");
    thinking_given = true;
  }
  thinking = set_thinking(conv, sp, thinking, thinking_given, find(body, "reasoning_effort"), "reasoning_effort");

  // messages
  const ojson* msgs = find(body, "messages");
  if (!msgs) fail("Missing required parameter: 'messages'.", "messages");
  if (!msgs->is_array()) fail("Invalid type for 'messages': expected an array, got " + type_name(*msgs) + ".", "messages");
  if (msgs->empty()) fail("Invalid 'messages': empty array. Expected an array with minimum length 1.", "messages");
  // The reference's (and OpenAI's) pairing: an assistant message's tool calls are answered right
  // after it by tool messages, one for each call id, in any order; a tool message answers one.
  std::vector<std::string> unanswered;  // ids of the last assistant message's calls not answered yet
  std::string calls_param;              // that message's tool_calls
  for (std::size_t i = 0; i < msgs->size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const ojson& m = (*msgs)[i];
    if (!m.is_object()) fail("Invalid type for '" + p + "': expected an object, got " + type_name(m) + ".", p);
    const ojson* role_j = find(m, "role");
    if (!role_j) fail("Missing required parameter: '" + p + ".role'.", p + ".role");
    std::string role_s = need_string(*role_j, p + ".role");
    const ojson* content = find(m, "content");
    message msg;
    if (role_s == "system" || role_s == "developer" || role_s == "user") {
      msg.role = role_s == "user" ? role::user : role::system;
      if (!content) fail("Missing required parameter: '" + p + ".content'.", p + ".content");
      msg.content = content_text(*content, p + ".content", role_s == "user", cfg, sp.image_parts,
                                 role_s == "user" && sp.format == prompt_format::v41 ? &msg.images : nullptr);
    } else if (role_s == "tool") {
      msg.role = role::tool;
      if (!content) fail("Missing required parameter: '" + p + ".content'.", p + ".content");
      const ojson* id = find(m, "tool_call_id");
      if (!id) fail("Missing required parameter: '" + p + ".tool_call_id'.", p + ".tool_call_id");
      msg.tool_call_id = need_string(*id, p + ".tool_call_id");
      msg.content = content_text(*content, p + ".content", false, cfg, sp.image_parts);
    } else if (role_s == "assistant") {
      msg.role = role::assistant;
      if (content) msg.content = content_text(*content, p + ".content", false, cfg, sp.image_parts);
      if (const ojson* rc = find(m, "reasoning_content")) msg.reasoning = need_string(*rc, p + ".reasoning_content");
      if (const ojson* pre = find(m, "prefix")) msg.prefix = need_bool(*pre, p + ".prefix");
      if (const ojson* calls = find(m, "tool_calls")) {
        if (!calls->is_array()) fail("Invalid type for '" + p + ".tool_calls': expected an array.", p + ".tool_calls");
        for (std::size_t k = 0; k < calls->size(); ++k) {
          const std::string q = p + ".tool_calls[" + std::to_string(k) + "]";
          const ojson& c = (*calls)[k];
          if (!c.is_object()) fail("Invalid type for '" + q + "': expected an object.", q);
          const ojson* id = find(c, "id");
          if (!id) fail("Missing required parameter: '" + q + ".id'.", q + ".id");
          if (const ojson* ty = find(c, "type"); ty && need_string(*ty, q + ".type") != "function")
            fail("Invalid value for '" + q + ".type': only 'function' tool calls are supported.", q + ".type");
          const ojson* fn = find(c, "function");
          if (!fn || !fn->is_object()) fail("Missing required parameter: '" + q + ".function'.", q + ".function");
          const ojson* name = find(*fn, "name");
          if (!name) fail("Missing required parameter: '" + q + ".function.name'.", q + ".function.name");
          const ojson* args = find(*fn, "arguments");
          if (!args) fail("Missing required parameter: '" + q + ".function.arguments'.", q + ".function.arguments");
          msg.tool_calls.push_back({need_string(*id, q + ".id"), need_string(*name, q + ".function.name"),
                                    need_string(*args, q + ".function.arguments")});
        }
      }
      if (!content && msg.tool_calls.empty())
        fail("Invalid assistant message: content or tool_calls must be set.", p + ".content");
      // deepseek_recipe: outside thinking mode earlier reasoning is dropped; in thinking mode a
      // missing reasoning_content is filled with "" (ReasoningContentBehavior.FillEmpty).
      if (!thinking) msg.reasoning.reset();
      else if (!msg.reasoning) msg.reasoning = std::string();
    } else {
      fail("Invalid value: '" + role_s +
               "'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'.",
           p + ".role");
    }
    if (msg.role == role::tool) {
      const auto it = std::find(unanswered.begin(), unanswered.end(), msg.tool_call_id);
      if (it == unanswered.end())
        fail(calls_param.empty() ? "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'."
                                 : "Invalid 'tool_call_id': '" + msg.tool_call_id +
                                       "' is not an unanswered tool call of the preceding assistant message.",
             p + ".tool_call_id");
      unanswered.erase(it);
      if (unanswered.empty()) calls_param.clear();
    } else {
      if (!unanswered.empty())
        fail("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
             "'tool_call_id'. Missing: " + joined(unanswered) + ".",
             calls_param);
      calls_param.clear();
      for (std::size_t k = 0; k < msg.tool_calls.size(); ++k) {
        const std::string& id = msg.tool_calls[k].id;
        if (std::find(unanswered.begin(), unanswered.end(), id) != unanswered.end())
          fail("Duplicate value for 'tool_call_id' of " + id + " in " + p + ".", p + ".tool_calls[" + std::to_string(k) + "].id");
        unanswered.push_back(id);
        calls_param = p + ".tool_calls";
      }
    }
    // deepseek_recipe leaves empty system messages out (visible in V4.1 prompts).
    if (msg.role == role::system && msg.content.empty()) continue;
    conv.messages.push_back(std::move(msg));
  }
  if (!unanswered.empty())
    fail("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. "
         "Missing: " + joined(unanswered) + ".",
         calls_param);
  order_tool_results(conv);

  // tools
  if (const ojson* tools = find(body, "tools")) {
    if (!tools->is_array()) fail("Invalid type for 'tools': expected an array, got " + type_name(*tools) + ".", "tools");
    for (std::size_t i = 0; i < tools->size(); ++i) {
      const std::string p = "tools[" + std::to_string(i) + "]";
      const ojson& t = (*tools)[i];
      if (!t.is_object()) fail("Invalid type for '" + p + "': expected an object.", p);
      const ojson* ty = find(t, "type");
      if (!ty) fail("Missing required parameter: '" + p + ".type'.", p + ".type");
      if (need_string(*ty, p + ".type") != "function")
        fail("Invalid value for '" + p + ".type': only 'function' tools are supported.", p + ".type");
      const ojson* fn = find(t, "function");
      if (!fn || !fn->is_object()) fail("Missing required parameter: '" + p + ".function'.", p + ".function");
      const ojson* name = find(*fn, "name");
      if (!name) fail("Missing required parameter: '" + p + ".function.name'.", p + ".function.name");
      tool_definition d;
      d.name = need_string(*name, p + ".function.name");
      check_tool_name(d.name, p + ".function.name");
      if (const ojson* desc = find(*fn, "description")) d.description = need_string(*desc, p + ".function.description");
      const ojson* params = find(*fn, "parameters");
      if (params && !params->is_object())
        fail("Invalid type for '" + p + ".function.parameters': expected an object.", p + ".function.parameters");
      ojson schema = params ? *params : ojson::object();  // deepseek_recipe: absent -> {}
      if (const ojson* strict = find(*fn, "strict"); strict && need_bool(*strict, p + ".function.strict")) {
        d.strict_schema = compact(schema);
        d.schema_param = p + ".function.parameters";
        make_strict(schema, d.schema_param);
      }
      d.parameters_json = compact(schema);
      conv.tools.push_back(std::move(d));
    }
  }

  // tool_choice
  if (const ojson* tc = find(body, "tool_choice")) {
    if (tc->is_string()) {
      std::string v = tc->get<std::string>();
      if (v == "auto") conv.tool_choice = tool_choice::automatic;
      else if (v == "none") conv.tool_choice = tool_choice::none;
      else if (v == "required") {
        // deepseek_recipe: thinking mode cannot force a tool call (without tools it is moot).
        if (thinking && !conv.tools.empty()) fail("Thinking mode does not support tool_choice 'required'.", "tool_choice");
        conv.tool_choice = tool_choice::required;
      }
      else fail("Invalid value: '" + v + "'. Supported values are: 'none', 'auto' and 'required'.", "tool_choice");
    } else if (tc->is_object()) {
      const ojson* ty = find(*tc, "type");
      const ojson* fn = find(*tc, "function");
      if (!ty || !ty->is_string() || ty->get<std::string>() != "function" || !fn || !fn->is_object() ||
          !find(*fn, "name"))
        fail("Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
             "{\"type\": \"function\", \"function\": {\"name\": ...}}.",
             "tool_choice");
      std::string name = need_string((*fn)["name"], "tool_choice.function.name");
      if (!require_tool(conv, sp, name))
        fail("Invalid value for 'tool_choice': no function named '" + name + "' was specified in the 'tools' parameter.",
             "tool_choice");
      if (thinking) fail("Thinking mode does not support a tool_choice that names a function.", "tool_choice");
    } else {
      fail("Invalid type for 'tool_choice': expected a string or an object, got " + type_name(*tc) + ".", "tool_choice");
    }
  }

  if (const ojson* pc = find(body, "parallel_tool_calls")) conv.one_call = !need_bool(*pc, "parallel_tool_calls");

  // sampling and serving fields
  if (const ojson* n = find(body, "n")) {
    std::int64_t v = need_int(*n, "n");
    if (v < 1 || v > cfg.max_n)
      fail("Invalid n value, the valid range of n is [1, " + std::to_string(cfg.max_n) + "].", "n");
    sp.n = static_cast<int>(v);
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (const ojson* mt = find(body, key)) {
      std::int64_t v = need_int(*mt, key);
      if (v < 1 || v > cfg.max_tokens_limit)
        fail(std::string("Invalid ") + key + " value, the valid range of " + key + " is [1, " +
                 std::to_string(cfg.max_tokens_limit) + "].",
             key);
      sp.max_tokens = v;  // max_completion_tokens (read last) wins
    }
  }
  if (const ojson* t = find(body, "temperature")) sp.temperature = need_number(*t, "temperature", 0, 2);
  if (const ojson* t = find(body, "top_p")) sp.top_p = need_number(*t, "top_p", 0, 1);
  if (const ojson* t = find(body, "presence_penalty")) sp.presence_penalty = need_number(*t, "presence_penalty", -2, 2);
  if (const ojson* t = find(body, "frequency_penalty")) sp.frequency_penalty = need_number(*t, "frequency_penalty", -2, 2);
  if (const ojson* s = find(body, "seed")) sp.seed = need_int(*s, "seed");
  if (const ojson* s = find(body, "stop")) {
    if (s->is_string()) sp.stop.push_back(s->get<std::string>());
    else if (s->is_array()) {
      if (s->size() > 4) fail("Invalid 'stop': array too long. Expected an array with maximum length 4.", "stop");
      for (std::size_t i = 0; i < s->size(); ++i) sp.stop.push_back(need_string((*s)[i], "stop[" + std::to_string(i) + "]"));
    } else fail("Invalid type for 'stop': expected a string or an array of strings, got " + type_name(*s) + ".", "stop");
  }
  if (const ojson* s = find(body, "stream")) sp.stream = need_bool(*s, "stream");
  if (const ojson* so = find(body, "stream_options")) {
    if (!sp.stream) fail("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options");
    if (!so->is_object()) fail("Invalid type for 'stream_options': expected an object.", "stream_options");
    if (const ojson* iu = find(*so, "include_usage")) sp.include_usage = need_bool(*iu, "stream_options.include_usage");
  }
  if (const ojson* l = find(body, "logprobs")) sp.logprobs = need_bool(*l, "logprobs");
  if (const ojson* tl = find(body, "top_logprobs")) {
    std::int64_t v = need_int(*tl, "top_logprobs");
    if (v < 0 || v > 20) fail("Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].", "top_logprobs");
    if (!sp.logprobs)
      fail("Invalid top_logprobs and logprobs value, logprobs must be set to true if top_logprobs is used.",
           "top_logprobs");
    sp.top_logprobs = static_cast<int>(v);
  }
  if (const ojson* rf = find(body, "response_format")) {
    if (!rf->is_object() || !find(*rf, "type"))
      fail("Invalid value for 'response_format': expected an object with a 'type'.", "response_format");
    std::string t = need_string((*rf)["type"], "response_format.type");
    if (t == "json_schema") {
      const ojson* js = find(*rf, "json_schema");
      if (!js || !js->is_object() || !find(*js, "name"))
        fail("Missing required parameter: 'response_format.json_schema.name'.", "response_format.json_schema.name");
      need_string((*js)["name"], "response_format.json_schema.name");
      const ojson* schema = find(*js, "schema");
      if (!schema)
        fail("Missing required parameter: 'response_format.json_schema.schema'.", "response_format.json_schema.schema");
      conv.format.type = response_format::kind::json_schema;
      conv.format.schema_json = compact(*schema);
    } else if (t == "json_object") {
      conv.format.type = response_format::kind::json_object;
      if (!mentions_json(conv))
        fail("Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'.",
             "response_format.type");
    } else if (t == "regex") {  // DeepSeek's extension: {"type": "regex", "regex": PATTERN}
      const ojson* re = find(*rf, "regex");
      if (!re) fail("Missing required parameter: 'response_format.regex'.", "response_format.regex");
      conv.format.type = response_format::kind::regex;
      conv.format.regex = need_string(*re, "response_format.regex");
    } else if (t == "grammar") {  // our extension: {"type": "grammar", "grammar": text, "syntax": "lark" | "gbnf"}
      const ojson* gm = find(*rf, "grammar");
      if (!gm) fail("Missing required parameter: 'response_format.grammar'.", "response_format.grammar");
      conv.format = grammar_format(need_string(*gm, "response_format.grammar"), find(*rf, "syntax"),
                                   "response_format.syntax");
    } else if (t == "structural_tag") {  // vLLM's and SGLang's: the object is the tag
      conv.format = structural_tag_format(*rf, "response_format");
    } else if (t != "text") {
      fail("Invalid value: '" + t + "'. Supported values are: 'text', 'json_object', 'json_schema', 'regex', "
           "'grammar' and 'structural_tag'.",
           "response_format.type");
    }
    sp.response_format_type = t;
    sp.response_format_json = compact(*rf);
  }
  parse_extra_constraint(body, conv, "response_format", sp);
  return r;
}

}  // namespace

chat_completions_result parse_chat_completions(std::string_view body, const chat_completions_config& config) {
  return detail::parse_body<chat_completions_result>(body, "We could not parse the JSON body of your request.", [&](const ojson& j) { return convert(j, config); });
}

}  // namespace troupe::recipe
