// OpenAI Responses request -> conversation (see responses.hpp, docs/recipe.md).
#include "recipe/responses.hpp"

#include "recipe/request_json.hpp"

#include <algorithm>
#include <set>

namespace troupe::recipe {
namespace {

using namespace detail;

std::string idx(const std::string& p, std::size_t i) { return p + "[" + std::to_string(i) + "]"; }

// Message content: a string or parts (input_text / output_text, input_image -> the image
// placeholder, input_file -> the document placeholder), joined with "\n\n" as deepseek_recipe.
std::string content_text(const ojson& c, const std::string& param, bool user, const chat_completions_config& cfg,
                         int& image_parts, std::vector<std::size_t>* images = nullptr) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array())
    fail("Invalid type for '" + param + "': expected a string or an array of content parts, got " + type_of(c) + ".",
         param);
  std::string out;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const std::string p = idx(param, i);
    const ojson& part = c[i];
    if (!part.is_object()) fail("Invalid type for '" + p + "': expected an object, got " + type_of(part) + ".", p);
    const ojson* type = find(part, "type");
    if (!type) fail("Missing required parameter: '" + p + ".type'.", p + ".type");
    const std::string t = need_string(*type, p + ".type");
    std::string piece;
    if (t == "input_text" || t == "output_text") {
      const ojson* text = find(part, "text");
      if (!text) fail("Missing required parameter: '" + p + ".text'.", p + ".text");
      piece = need_string(*text, p + ".text");
    } else if (t == "input_image") {
      if (!user || cfg.images == image_policy::reject)
        fail("Image content parts are not supported " + std::string(user ? "by this model." : "in this message role."),
             p + ".type");
      const ojson* url = find(part, "image_url");
      const ojson* file = find(part, "file_id");
      if (!url && !file) fail("Missing required parameter: '" + p + ".image_url'.", p + ".image_url");
      need_string(url ? *url : *file, p + (url ? ".image_url" : ".file_id"));
      if (const ojson* detail = find(part, "detail")) check_image_detail(*detail, p + ".detail");
      ++image_parts;
      if (i > 0) out += "\n\n";
      add_image(out, images);
      continue;
    } else if (t == "input_file") {
      if (!user) fail("File content parts are not supported in this message role.", p + ".type");
      piece = "[Unsupported Document]";
    } else {
      fail("Invalid value: '" + t + "'. Supported values are: 'input_text', 'output_text', 'input_image' and "
           "'input_file'.",
           p + ".type");
    }
    if (i > 0) out += "\n\n";
    out += piece;
  }
  return out;
}

responses_request convert(const ojson& body, const chat_completions_config& cfg) {
  responses_request r;
  sampling_params& sp = r.params;
  conversation& conv = r.conversation;
  responses_fields& f = r.fields;
  if (!body.is_object()) fail("The request body must be a JSON object.", "");
  sp.model = check_model(body, cfg.models);
  sp.format = format_of(sp.model, cfg.v41_models);
  const bool v41 = sp.format == prompt_format::v41;

  // thinking: reasoning.effort "none" turns it off; the Chat Completions `thinking` field is not
  // part of this protocol and is ignored (as the reference does).
  const ojson* effort = nullptr;
  if (const ojson* rs = find(body, "reasoning")) {
    if (!rs->is_object()) fail("Invalid type for 'reasoning': expected an object, got " + type_of(*rs) + ".", "reasoning");
    effort = find(*rs, "effort");
    if (const ojson* s = find(*rs, "summary")) f.reasoning_summary = need_string(*s, "reasoning.summary");
  }
  const bool thinking = set_thinking(conv, sp, cfg.default_thinking, false, effort, "reasoning.effort");

  // instructions, then the input items
  if (const ojson* ins = find(body, "instructions")) {
    f.instructions = need_string(*ins, "instructions");
    conv.messages.push_back(make_message(role::system, *f.instructions));
  }
  const ojson* input = find(body, "input");
  if (!input && !f.instructions) fail("Either input or instructions must be provided.", "input");
  std::set<std::string> call_ids;
  if (input && input->is_string()) {
    conv.messages.push_back(make_message(role::user, input->get<std::string>()));
  } else if (input && input->is_array()) {
    if (input->empty()) fail("Invalid 'input': empty array. Expected an array with minimum length 1.", "input");
    std::optional<std::string> pending_reasoning;  // a reasoning item: the next assistant turn's reasoning
    // The reference's pairing: a run of function_call items is answered right after it by one
    // function_call_output for each call, in any order, before any other item.
    std::vector<std::string> unanswered;
    bool outputs_started = false;
    const auto unanswered_call = [&] {
      fail("No tool output found for tool call " + joined(unanswered) + ".", "input");
    };
    for (std::size_t i = 0; i < input->size(); ++i) {
      const std::string p = idx("input", i);
      const ojson& item = (*input)[i];
      if (!item.is_object()) fail("Invalid type for '" + p + "': expected an object, got " + type_of(item) + ".", p);
      std::string type = "message";
      if (const ojson* t = find(item, "type")) type = need_string(*t, p + ".type");
      if (!unanswered.empty() && type != "function_call_output" && (type != "function_call" || outputs_started))
        unanswered_call();
      if (type == "message") {
        const ojson* role_j = find(item, "role");
        if (!role_j) fail("Missing required parameter: '" + p + ".role'.", p + ".role");
        const std::string role_s = need_string(*role_j, p + ".role");
        const ojson* content = find(item, "content");
        if (!content) fail("Missing required parameter: '" + p + ".content'.", p + ".content");
        message m;
        // The reference: a developer item is a user turn for V4, a system message for V4.1.
        if (role_s == "user" || (role_s == "developer" && !v41)) m.role = role::user;
        else if (role_s == "system" || role_s == "developer") m.role = role::system;
        else if (role_s == "assistant") m.role = role::assistant;
        else
          fail("Invalid value: '" + role_s + "'. Supported values are: 'user', 'assistant', 'system' and 'developer'.",
               p + ".role");
        m.content = content_text(*content, p + ".content", m.role == role::user, cfg, sp.image_parts,
                                 m.role == role::user && v41 ? &m.images : nullptr);
        if (m.role == role::assistant) {
          m.reasoning = std::move(pending_reasoning);
          pending_reasoning.reset();
        }
        conv.messages.push_back(std::move(m));
      } else if (type == "reasoning") {
        std::string text;
        if (const ojson* content = find(item, "content")) {
          if (!content->is_array()) fail("Invalid type for '" + p + ".content': expected an array.", p + ".content");
          for (std::size_t k = 0; k < content->size(); ++k) {
            const std::string q = idx(p + ".content", k);
            const ojson& part = (*content)[k];
            if (!part.is_object() || !find(part, "text"))
              fail("Missing required parameter: '" + q + ".text'.", q + ".text");
            text += need_string(part["text"], q + ".text");
          }
        }
        pending_reasoning = std::move(text);
      } else if (type == "function_call") {
        const ojson* id = find(item, "call_id");
        if (!id) fail("Missing required parameter: '" + p + ".call_id'.", p + ".call_id");
        const ojson* name = find(item, "name");
        if (!name) fail("Missing required parameter: '" + p + ".name'.", p + ".name");
        const ojson* args = find(item, "arguments");
        if (!args) fail("Missing required parameter: '" + p + ".arguments'.", p + ".arguments");
        tool_call call{need_string(*id, p + ".call_id"), need_string(*name, p + ".name"),
                       need_string(*args, p + ".arguments")};
        if (!call_ids.insert(call.id).second) fail("Duplicate 'call_id': " + call.id + ".", p + ".call_id");
        unanswered.push_back(call.id);
        outputs_started = false;
        // A call joins the assistant turn just before it, else opens one with empty content.
        if (conv.messages.empty() || conv.messages.back().role != role::assistant || pending_reasoning) {
          message m = make_message(role::assistant, "");
          m.reasoning = std::move(pending_reasoning);
          pending_reasoning.reset();
          conv.messages.push_back(std::move(m));
        }
        conv.messages.back().tool_calls.push_back(std::move(call));
      } else if (type == "function_call_output") {
        const ojson* id = find(item, "call_id");
        if (!id) fail("Missing required parameter: '" + p + ".call_id'.", p + ".call_id");
        const std::string call_id = need_string(*id, p + ".call_id");
        if (!call_ids.count(call_id)) fail("No tool call found for tool output with call_id " + call_id + ".", p + ".call_id");
        const auto it = std::find(unanswered.begin(), unanswered.end(), call_id);
        if (it == unanswered.end()) fail("Duplicate tool output for call_id: " + call_id + ".", p + ".call_id");
        unanswered.erase(it);
        outputs_started = true;
        const ojson* output = find(item, "output");
        if (!output) fail("Missing required parameter: '" + p + ".output'.", p + ".output");
        message m = make_message(role::tool, content_text(*output, p + ".output", false, cfg, sp.image_parts));
        m.tool_call_id = call_id;
        conv.messages.push_back(std::move(m));
      } else {
        fail("Invalid value: '" + type + "'. Supported input item types are: 'message', 'reasoning', 'function_call' "
             "and 'function_call_output'.",
             p + ".type");
      }
    }
    if (!unanswered.empty()) unanswered_call();
    order_tool_results(conv);
  } else if (input) {
    fail("Invalid type for 'input': expected a string or an array of input items, got " + type_of(*input) + ".",
         "input");
  }
  // deepseek_recipe (ReasoningContentBehavior.FillEmpty): outside thinking mode reasoning is
  // dropped; in thinking mode an assistant turn without reasoning gets "".
  for (auto& m : conv.messages) {
    if (m.role != role::assistant) continue;
    if (!thinking) m.reasoning.reset();
    else if (!m.reasoning) m.reasoning = std::string();
  }

  // tools: function tools; web search tools are dropped (the reference's default).
  ojson echo_tools = ojson::array();
  if (const ojson* tools = find(body, "tools")) {
    if (!tools->is_array()) fail("Invalid type for 'tools': expected an array, got " + type_of(*tools) + ".", "tools");
    for (std::size_t i = 0; i < tools->size(); ++i) {
      const std::string p = idx("tools", i);
      const ojson& t = (*tools)[i];
      if (!t.is_object()) fail("Invalid type for '" + p + "': expected an object.", p);
      const ojson* ty = find(t, "type");
      if (!ty) fail("Missing required parameter: '" + p + ".type'.", p + ".type");
      const std::string type = need_string(*ty, p + ".type");
      if (type == "web_search" || type == "web_search_preview") continue;
      if (type != "function") fail("Tools of type '" + type + "' are not supported.", p + ".type");
      const ojson* name = find(t, "name");
      if (!name) fail("Missing required parameter: '" + p + ".name'.", p + ".name");
      tool_definition d;
      d.name = need_string(*name, p + ".name");
      check_tool_name(d.name, p + ".name");
      if (const ojson* desc = find(t, "description")) d.description = need_string(*desc, p + ".description");
      const ojson* params = find(t, "parameters");
      if (params && !params->is_object())
        fail("Invalid type for '" + p + ".parameters': expected an object.", p + ".parameters");
      ojson schema = params ? *params : ojson::object();
      const ojson* strict = find(t, "strict");
      if (strict && need_bool(*strict, p + ".strict")) {
        d.strict_schema = schema.dump();
        d.schema_param = p + ".parameters";
        make_strict(schema, d.schema_param);
      }
      echo_tools.push_back({{"type", "function"},
                            {"name", d.name},
                            {"description", d.description ? ojson(*d.description) : ojson(nullptr)},
                            {"parameters", params ? *params : ojson(nullptr)},
                            {"strict", strict ? *strict : ojson(nullptr)}});
      d.parameters_json = schema.dump();
      conv.tools.push_back(std::move(d));
    }
  }
  f.tools_json = echo_tools.dump();

  // tool_choice
  if (const ojson* tc = find(body, "tool_choice")) {
    f.tool_choice_json = tc->dump();
    if (tc->is_string()) {
      const std::string v = tc->get<std::string>();
      if (v == "auto") conv.tool_choice = tool_choice::automatic;
      else if (v == "none") conv.tool_choice = tool_choice::none;
      else if (v == "required") {
        if (thinking && !conv.tools.empty()) fail("Thinking mode does not support tool_choice 'required'.", "tool_choice");
        conv.tool_choice = tool_choice::required;
      } else fail("Invalid value: '" + v + "'. Supported values are: 'none', 'auto' and 'required'.", "tool_choice");
    } else if (tc->is_object()) {
      const ojson* ty = find(*tc, "type");
      if (!ty || !ty->is_string() || ty->get<std::string>() != "function" || !find(*tc, "name"))
        fail("Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
             "{\"type\": \"function\", \"name\": ...}.",
             "tool_choice");
      const std::string name = need_string((*tc)["name"], "tool_choice.name");
      if (!require_tool(conv, sp, name))
        fail("Invalid value for 'tool_choice': no function named '" + name + "' was specified in the 'tools' parameter.",
             "tool_choice.name");
      if (thinking) fail("Thinking mode does not support a tool_choice that names a function.", "tool_choice");
    } else {
      fail("Invalid type for 'tool_choice': expected a string or an object, got " + type_of(*tc) + ".", "tool_choice");
    }
  }

  // text.format
  if (const ojson* text = find(body, "text")) {
    if (!text->is_object()) fail("Invalid type for 'text': expected an object, got " + type_of(*text) + ".", "text");
    if (const ojson* fmt = find(*text, "format")) {
      if (!fmt->is_object() || !find(*fmt, "type"))
        fail("Invalid value for 'text.format': expected an object with a 'type'.", "text.format");
      const std::string t = need_string((*fmt)["type"], "text.format.type");
      if (t == "json_schema") {
        const ojson* name = find(*fmt, "name");
        if (!name) fail("Missing required parameter: 'text.format.name'.", "text.format.name");
        need_string(*name, "text.format.name");
        const ojson* schema = find(*fmt, "schema");
        if (!schema) fail("Missing required parameter: 'text.format.schema'.", "text.format.schema");
        if (!schema->is_object()) fail("Invalid type for 'text.format.schema': expected an object.", "text.format.schema");
        conv.format.type = response_format::kind::json_schema;
        conv.format.schema_json = schema->dump();
      } else if (t == "json_object") {
        conv.format.type = response_format::kind::json_object;
        if (!mentions_json(conv))
          fail("Response input messages must contain the word 'json' in some form to use 'text.format' of type "
               "'json_object'.",
               "text.format.type");
      } else if (t == "regex" || t == "grammar") {  // our extensions, as in Chat Completions
        const ojson* v = find(*fmt, t.c_str());
        if (!v) fail("Missing required parameter: 'text.format." + t + "'.", "text.format." + t);
        const std::string text_value = need_string(*v, "text.format." + t);
        if (t == "grammar") {
          conv.format = grammar_format(text_value, find(*fmt, "syntax"), "text.format.syntax");
        } else {
          conv.format.type = response_format::kind::regex;
          conv.format.regex = text_value;
        }
      } else if (t == "structural_tag") {  // as in Chat Completions: the object is the tag
        conv.format = structural_tag_format(*fmt, "text.format");
      } else if (t != "text") {
        fail("Invalid value: '" + t + "'. Supported values are: 'text', 'json_object', 'json_schema', 'regex', "
             "'grammar' and 'structural_tag'.",
             "text.format.type");
      }
      sp.response_format_type = t;
      sp.response_format_json = fmt->dump();
      f.text_format_json = sp.response_format_json;
    }
  }
  parse_extra_constraint(body, conv, "text.format", sp);

  // sampling and serving fields
  if (const ojson* mt = find(body, "max_output_tokens")) {
    const std::int64_t v = need_int(*mt, "max_output_tokens");
    if (v < 1 || v > cfg.max_tokens_limit)
      fail("Invalid max_output_tokens value, the valid range of max_output_tokens is [1, " +
               std::to_string(cfg.max_tokens_limit) + "].",
           "max_output_tokens");
    sp.max_tokens = v;
  }
  if (const ojson* t = find(body, "temperature")) sp.temperature = need_number(*t, "temperature", 0, 2);
  if (const ojson* t = find(body, "top_p")) sp.top_p = need_number(*t, "top_p", 0, 1, true);
  if (const ojson* tl = find(body, "top_logprobs")) {
    const std::int64_t v = need_int(*tl, "top_logprobs");
    if (v < 0 || v > 20) fail("Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].", "top_logprobs");
    sp.top_logprobs = static_cast<int>(v);
    sp.logprobs = true;
  }
  if (const ojson* inc = find(body, "include")) {
    static const std::set<std::string> known{
        "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
        "message.input_image.image_url", "computer_call_output.output.image_url",
        "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs"};
    if (!inc->is_array()) fail("Invalid type for 'include': expected an array, got " + type_of(*inc) + ".", "include");
    for (std::size_t i = 0; i < inc->size(); ++i) {
      const std::string p = "include[" + std::to_string(i) + "]";
      const std::string v = need_string((*inc)[i], p);
      if (!known.count(v)) fail("Invalid value: '" + v + "'. Supported values are the Responses API's include values.", p);
      if (v == "message.output_text.logprobs") f.output_text_logprobs = true;
    }
  }
  if (const ojson* s = find(body, "stream")) sp.stream = need_bool(*s, "stream");
  if (const ojson* s = find(body, "store")) f.store = need_bool(*s, "store");
  if (const ojson* s = find(body, "previous_response_id")) f.previous_response_id = need_string(*s, "previous_response_id");
  if (const ojson* s = find(body, "parallel_tool_calls")) {
    f.parallel_tool_calls = need_bool(*s, "parallel_tool_calls");
    conv.one_call = !*f.parallel_tool_calls;
  }
  if (const ojson* s = find(body, "user")) f.user = need_string(*s, "user");
  if (const ojson* s = find(body, "metadata")) {
    if (!s->is_object()) fail("Invalid type for 'metadata': expected an object, got " + type_of(*s) + ".", "metadata");
    f.metadata_json = s->dump();
  }
  return r;
}

}  // namespace

responses_result parse_responses(std::string_view body, const chat_completions_config& config) {
  return detail::parse_body<responses_result>(body, "We could not parse the JSON body of your request.", [&](const ojson& j) { return convert(j, config); });
}

}  // namespace troupe::recipe
