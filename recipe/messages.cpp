// Anthropic Messages request -> conversation (see messages.hpp, docs/recipe.md).
#include "recipe/messages.hpp"

#include "recipe/request_json.hpp"

#include <algorithm>
#include <set>

namespace troupe::recipe {
namespace {

using detail::find;
using detail::ojson;
using detail::make_message;
using detail::type_of;

// Anthropic's style: the message names the field first ("messages.0.role: ...").
[[noreturn]] void fail(const std::string& param, const std::string& what) { detail::fail(param + ": " + what, param); }

std::string at(const std::string& p, std::size_t i) { return p + "." + std::to_string(i); }

const ojson& need(const ojson& obj, const char* key, const std::string& p) {
  const ojson* v = find(obj, key);
  if (!v) fail(p + "." + key, "Field required");
  return *v;
}

std::string str(const ojson& j, const std::string& p) {
  if (!j.is_string()) fail(p, std::string("Input should be a valid string, got ") + type_of(j));
  return j.get<std::string>();
}

const std::string& block_type(const ojson& b, const std::string& p) {
  if (!b.is_object()) fail(p, std::string("Input should be an object, got ") + type_of(b));
  const ojson& t = need(b, "type", p);
  if (!t.is_string()) fail(p + ".type", "Input should be a valid string");
  return t.get_ref<const std::string&>();
}

// Text of a system prompt or tool result: a string or text blocks joined with "\n\n" (tool
// results may hold images, which become the image placeholder).
std::string text_blocks(const ojson& c, const std::string& p, bool images, const chat_completions_config& cfg,
                        int& image_parts) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) fail(p, std::string("Input should be a valid string or a list of blocks, got ") + type_of(c));
  std::string out;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const std::string q = at(p, i);
    const std::string& t = block_type(c[i], q);
    if (i > 0) out += "\n\n";
    if (t == "text") {
      out += str(need(c[i], "text", q), q + ".text");
    } else if (t == "image" && images) {
      if (cfg.images == image_policy::reject) fail(q + ".type", "image blocks are not supported by this model");
      need(c[i], "source", q);
      ++image_parts;
      out += "[Unsupported Image]";
    } else {
      fail(q + ".type", "'" + t + "' blocks are not supported here");
    }
  }
  return out;
}

messages_request convert(const ojson& body, const chat_completions_config& cfg) {
  messages_request r;
  sampling_params& sp = r.params;
  conversation& conv = r.conversation;
  if (!body.is_object()) detail::fail("The request body must be a JSON object.", "");
  sp.model = detail::check_model(body, cfg.models);
  sp.format = detail::format_of(sp.model, cfg.v41_models);
  const bool v41 = sp.format == prompt_format::v41;

  bool thinking = cfg.default_thinking;
  bool thinking_given = false;
  if (const ojson* t = find(body, "thinking")) {
    thinking = detail::parse_thinking(*t, "thinking");
    thinking_given = true;
  }
  const ojson* effort = nullptr;
  if (const ojson* oc = find(body, "output_config")) {
    if (!oc->is_object()) fail("output_config", "Input should be an object");
    effort = find(*oc, "effort");
    // Structured outputs: {"type": "json_schema", "schema": {...}}, what the SDK's
    // messages.parse(output_format=Model) sends. The schema goes into the prompt and constrains
    // the answer, as Chat Completions' response_format json_schema does.
    if (const ojson* f = find(*oc, "format"); f && !f->is_null()) {
      if (!f->is_object()) fail("output_config.format", "Input should be an object");
      const ojson* type = find(*f, "type");
      if (!type) fail("output_config.format.type", "Field required");
      if (str(*type, "output_config.format.type") != "json_schema")
        fail("output_config.format.type", "Input should be 'json_schema'");
      const ojson* schema = find(*f, "schema");
      if (!schema) fail("output_config.format.schema", "Field required");
      if (!schema->is_object()) fail("output_config.format.schema", "Input should be a valid dictionary");
      conv.format.type = response_format::kind::json_schema;
      conv.format.schema_json = schema->dump();
    }
  }
  thinking = detail::set_thinking(conv, sp, thinking, thinking_given, effort, "output_config.effort");

  if (const ojson* s = find(body, "system"))
    conv.messages.push_back(make_message(role::system, text_blocks(*s, "system", false, cfg, sp.image_parts)));

  const ojson& msgs = need(body, "messages", "body");
  if (!msgs.is_array()) fail("messages", "Input should be a valid list");
  if (msgs.empty()) fail("messages", "at least one message is required");
  // The reference's (and Anthropic's) pairing: the tool_use blocks of an assistant message are
  // answered by tool_result blocks at the start of the next message, one for each id.
  std::vector<std::string> previous_tool_uses;  // tool_use ids of the previous message
  std::vector<std::string> unanswered;          // of those, the ones no tool_result answered yet
  std::string uses_param;                       // the message that holds them
  const auto check_answered = [&] {
    if (!unanswered.empty())
      fail(uses_param, "`tool_use` ids were found without `tool_result` blocks immediately after: " + detail::joined(unanswered) +
                           ". Each `tool_use` block must have a corresponding `tool_result` block in the next message.");
  };
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    const std::string p = at("messages", i);
    const ojson& m = msgs[i];
    if (!m.is_object()) fail(p, std::string("Input should be an object, got ") + type_of(m));
    const std::string role_s = str(need(m, "role", p), p + ".role");
    const ojson& content = need(m, "content", p);
    const std::string cp = p + ".content";
    std::vector<std::string> tool_uses;
    if (role_s != "user" || !content.is_array()) check_answered();
    if (role_s == "user" || role_s == "system") {
      if (role_s == "system" && v41) {  // the reference: a system message for V4.1,
        conv.messages.push_back(make_message(role::system, text_blocks(content, cp, false, cfg, sp.image_parts)));
      } else if (role_s == "system") {  // a reminder inside the user turn for V4
        conv.messages.push_back(make_message(
            role::user, "<system-reminder>\n" + text_blocks(content, cp, false, cfg, sp.image_parts) + "\n</system-reminder>"));
      } else if (content.is_string()) {
        conv.messages.push_back(make_message(role::user, content.get<std::string>()));
      } else if (content.is_array()) {
        // Text-like blocks are joined into one user turn; each tool_result is a tool message.
        std::optional<std::string> text;
        std::vector<std::size_t> images;  // V4.1: the images of `text`
        auto flush = [&] {
          if (text) {
            conv.messages.push_back(make_message(role::user, std::move(*text)));
            conv.messages.back().images = std::move(images);
          }
          text.reset();
          images.clear();
        };
        for (std::size_t k = 0; k < content.size(); ++k) {
          const std::string q = at(cp, k);
          const ojson& b = content[k];
          const std::string& t = block_type(b, q);
          std::string piece;
          if (t == "tool_result") {
            flush();
            const std::string id = str(need(b, "tool_use_id", q), q + ".tool_use_id");
            if (std::find(previous_tool_uses.begin(), previous_tool_uses.end(), id) == previous_tool_uses.end())
              fail(q + ".tool_use_id", "unexpected `tool_use_id` found in `tool_result` blocks: " + id +
                                           ". Each `tool_result` block must have a corresponding `tool_use` block in "
                                           "the previous message.");
            const auto it = std::find(unanswered.begin(), unanswered.end(), id);
            if (it == unanswered.end())
              fail(q + ".tool_use_id", "each tool_use must have a single result. Found multiple `tool_result` blocks with id: " + id);
            unanswered.erase(it);
            if (const ojson* is_error = find(b, "is_error")) detail::need_bool(*is_error, q + ".is_error");
            const ojson* rc = find(b, "content");
            message tm = make_message(role::tool, rc ? text_blocks(*rc, q + ".content", true, cfg, sp.image_parts) : std::string());
            tm.tool_call_id = id;
            conv.messages.push_back(std::move(tm));
            continue;
          }
          check_answered();  // the results come first
          if (t == "text") {
            piece = str(need(b, "text", q), q + ".text");
          } else if (t == "image") {
            if (cfg.images == image_policy::reject) fail(q + ".type", "image blocks are not supported by this model");
            const ojson& src = need(b, "source", q);
            if (!src.is_object()) fail(q + ".source", "Input should be an object");
            const std::string st = str(need(src, "type", q + ".source"), q + ".source.type");
            if (st != "base64" && st != "url" && st != "file")
              fail(q + ".source.type", "Input should be 'base64', 'url' or 'file'");
            if (st == "base64") {
              const std::string mt = str(need(src, "media_type", q + ".source"), q + ".source.media_type");
              if (mt != "image/jpeg" && mt != "image/jpg" && mt != "image/png" && mt != "image/gif" && mt != "image/webp")
                fail(q + ".source.media_type", "Input should be 'image/jpeg', 'image/jpg', 'image/png', 'image/gif' or 'image/webp'");
            }
            ++sp.image_parts;
            if (v41) {  // an image at the end of the text so far
              if (text) *text += "\n\n";
              else text.emplace();
              images.push_back(text->size());
              continue;
            }
            piece = "[Unsupported Image]";
          } else if (t == "document") {
            const ojson& src = need(b, "source", q);
            if (!src.is_object()) fail(q + ".source", "Input should be an object");
            const ojson* mt = find(src, "media_type");
            piece = "[Unsupported document type: " + (mt ? str(*mt, q + ".source.media_type") : std::string("unknown")) + "]";
          } else {
            fail(q + ".type", "'" + t + "' blocks are not supported in user messages");
          }
          if (text) *text += "\n\n" + piece;
          else text = std::move(piece);
        }
        flush();
      } else {
        fail(cp, std::string("Input should be a valid string or a list of blocks, got ") + type_of(content));
      }
    } else if (role_s == "assistant") {
      message am = make_message(role::assistant, "");
      if (content.is_string()) {
        am.content = content.get<std::string>();
      } else if (content.is_array()) {
        bool first_text = true;
        for (std::size_t k = 0; k < content.size(); ++k) {
          const std::string q = at(cp, k);
          const ojson& b = content[k];
          const std::string& t = block_type(b, q);
          if (t == "text") {
            if (!first_text) am.content += "\n\n";
            first_text = false;
            am.content += str(need(b, "text", q), q + ".text");
          } else if (t == "thinking") {
            am.reasoning = am.reasoning.value_or("") + str(need(b, "thinking", q), q + ".thinking");
          } else if (t == "tool_use") {
            const std::string id = str(need(b, "id", q), q + ".id");
            const std::string name = str(need(b, "name", q), q + ".name");
            const ojson& input = need(b, "input", q);
            if (!input.is_object()) fail(q + ".input", "Input should be an object");
            if (std::find(tool_uses.begin(), tool_uses.end(), id) != tool_uses.end())
              fail(q, "`tool_use` ids must be unique");
            am.tool_calls.push_back({id, name, input.dump()});
            tool_uses.push_back(id);
          } else {
            fail(q + ".type", "'" + t + "' blocks are not supported in assistant messages");
          }
        }
      } else {
        fail(cp, std::string("Input should be a valid string or a list of blocks, got ") + type_of(content));
      }
      // deepseek_recipe (FillEmpty): reasoning dropped outside thinking mode, "" when missing in it.
      if (!thinking) am.reasoning.reset();
      else if (!am.reasoning) am.reasoning = std::string();
      conv.messages.push_back(std::move(am));
    } else {
      fail(p + ".role", "Input should be 'user', 'assistant' or 'system'");
    }
    check_answered();
    previous_tool_uses = std::move(tool_uses);
    unanswered = previous_tool_uses;
    uses_param = p;
  }
  check_answered();
  detail::order_tool_results(conv);

  // tools: custom tools only (server tools are rejected, as the reference does by default)
  if (const ojson* tools = find(body, "tools")) {
    if (!tools->is_array()) fail("tools", "Input should be a valid list");
    for (std::size_t i = 0; i < tools->size(); ++i) {
      const std::string p = at("tools", i);
      const ojson& t = (*tools)[i];
      if (!t.is_object()) fail(p, "Input should be an object");
      if (const ojson* ty = find(t, "type"); ty && str(*ty, p + ".type") != "custom")
        fail(p + ".type", "server tools are not supported");
      tool_definition d;
      d.name = str(need(t, "name", p), p + ".name");
      if (auto problem = detail::tool_name_problem(d.name)) fail(p + ".name", *problem);
      if (const ojson* desc = find(t, "description")) d.description = str(*desc, p + ".description");
      const ojson& schema = need(t, "input_schema", p);
      if (!schema.is_object()) fail(p + ".input_schema", "Input should be an object");
      d.parameters_json = schema.dump();
      if (const ojson* strict = find(t, "strict"); strict && detail::need_bool(*strict, p + ".strict")) {
        d.strict_schema = d.parameters_json;
        d.schema_param = p + ".input_schema";
      }
      conv.tools.push_back(std::move(d));
    }
  }
  if (const ojson* tc = find(body, "tool_choice")) {
    if (!tc->is_object()) fail("tool_choice", "Input should be an object");
    const std::string t = str(need(*tc, "type", "tool_choice"), "tool_choice.type");
    if (const ojson* dp = find(*tc, "disable_parallel_tool_use"))
      conv.one_call = detail::need_bool(*dp, "tool_choice.disable_parallel_tool_use");
    if (t == "auto" || t == "any") {  // the reference renders `any` like `auto`; the grammar forces a call
      conv.tool_choice = tool_choice::automatic;
      conv.must_call = t == "any";
    } else if (t == "none") {
      conv.tool_choice = tool_choice::none;
    } else if (t == "tool") {
      const std::string name = str(need(*tc, "name", "tool_choice"), "tool_choice.name");
      if (!detail::require_tool(conv, sp, name)) fail("tool_choice.name", "no tool named '" + name + "' was specified in 'tools'");
      if (thinking) fail("tool_choice", "thinking mode does not support a tool_choice that names a tool");
    } else {
      fail("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'");
    }
  }

  if (const ojson* mt = find(body, "max_tokens")) {
    const std::int64_t v = detail::need_int(*mt, "max_tokens");
    if (v < 1) fail("max_tokens", "Input should be greater than or equal to 1");
    sp.max_tokens = std::min<std::int64_t>(v, cfg.max_tokens_limit);  // lowered, as the reference
  }
  if (const ojson* t = find(body, "temperature")) sp.temperature = detail::need_number(*t, "temperature", 0, 2);
  if (const ojson* t = find(body, "top_p")) sp.top_p = detail::need_number(*t, "top_p", 0, 1, true);
  if (const ojson* t = find(body, "top_k")) {
    const std::int64_t v = detail::need_int(*t, "top_k");
    if (v < 0) fail("top_k", "Input should be greater than or equal to 0");
    sp.top_k = static_cast<int>(std::min<std::int64_t>(v, 1 << 30));
  }
  if (const ojson* s = find(body, "stop_sequences")) {
    if (!s->is_array()) fail("stop_sequences", "Input should be a valid list");
    for (std::size_t i = 0; i < s->size(); ++i) sp.stop.push_back(str((*s)[i], at("stop_sequences", i)));
  }
  if (const ojson* s = find(body, "stream")) sp.stream = detail::need_bool(*s, "stream");
  if (const ojson* md = find(body, "metadata")) {
    if (!md->is_object()) fail("metadata", "Input should be an object");
    if (const ojson* u = find(*md, "user_id")) r.metadata_user_id = str(*u, "metadata.user_id");
  }
  return r;
}

}  // namespace

messages_result parse_messages(std::string_view body, const chat_completions_config& config) {
  auto r = detail::parse_body<messages_result>(body, "The request body is not valid JSON.",
                                               [&](const ojson& j) { return convert(j, config); });
  // The shared checks (model, thinking, effort, ranges) word their messages OpenAI's way; here
  // every message starts with the field, as Anthropic's do.
  if (auto* e = std::get_if<api_error>(&r); e && e->param && e->message.rfind(*e->param + ": ", 0) != 0)
    e->message = *e->param + ": " + e->message;
  return r;
}

}  // namespace troupe::recipe
