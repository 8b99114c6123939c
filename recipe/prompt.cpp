// DeepSeek-V4 and V4.1 prompt rendering (formats learned from deepseek_recipe 0.2.0's
// DeepseekV4Encoding / DeepseekV41Encoding output; see docs/recipe.md and the goldens under
// tests/recipe/golden/).
#include "recipe/prompt.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <stdexcept>
#include <string_view>

namespace troupe::recipe {
namespace {

constexpr std::string_view k_bos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view k_eos = "<｜end▁of▁sentence｜>";
constexpr std::string_view k_user = "<｜User｜>";
constexpr std::string_view k_assistant = "<｜Assistant｜>";
constexpr std::string_view k_think = "<think>";
constexpr std::string_view k_end_think = "</think>";
constexpr std::string_view k_dsml = "｜DSML｜";
constexpr std::string_view k_system = "<｜System｜>";  // V4.1 only
constexpr std::string_view k_image = "<｜image｜>";    // V4.1 only
constexpr std::array<std::string_view, 9> k_markers{k_bos,       k_eos,  k_user,   k_assistant, k_think,
                                                    k_end_think, k_dsml, k_system, k_image};

constexpr std::string_view k_effort_high =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your "
    "thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing "
    "your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out "
    "your entire deliberation process, documenting every intermediate step, considered alternative, and "
    "rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";
constexpr std::string_view k_effort_max =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\nYou MUST reason with the "
    "utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into "
    "its most fundamental components, trace every causal chain to its root, and resolve the underlying "
    "cause rather than any surface symptom.\nDo not stop reasoning until you have independently verified "
    "the solution from multiple angles and are certain that no assumption remains unchecked and no error "
    "remains undiscovered.\n\n";
constexpr std::string_view k_tools_head =
    "\n\n## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke "
    "tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" "
    "string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString "
    "parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf "
    "thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after "
    "</think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";
constexpr std::string_view k_tools_tail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

constexpr std::string_view k_format_json_object =
    "\n\nYou are a helpful assistant designed to output JSON.\n## Response Format:\n\nReply with JSON object ONLY.";
constexpr std::string_view k_format_json_schema =
    "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

using ojson = nlohmann::ordered_json;

// JSON with Python json.dumps separators (", " / ": "), keys in their order, non-ASCII kept.
void dump(const ojson& j, std::string& out) {
  if (j.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += ojson(it.key()).dump(-1, ' ', false);
      out += ": ";
      dump(it.value(), out);
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    bool first = true;
    for (const auto& v : j) {
      if (!first) out += ", ";
      first = false;
      dump(v, out);
    }
    out += ']';
  } else {
    out += j.dump(-1, ' ', false);
  }
}

// Collects the prompt as pieces: runs of conversation and encoder text (tokenized in raw mode:
// never an added token) and the encoder's markers (which become control tokens).
struct piece {
  std::string text;
  bool marker = false;
};

class builder {
 public:
  void text(std::string_view s) { pending_ += s; }
  // An encoder marker: flushes the pending text, appends the marker.
  void marker(std::string_view m) {
    flush();
    for (const auto k : k_markers)
      if (k == m) {
        out_.push_back({std::string(m), true});
        return;
      }
    throw std::logic_error("prompt: not a marker");
  }
  // The encoder's own constant text: markers spelled in it become control tokens.
  void markup(std::string_view s) {
    while (!s.empty()) {
      std::size_t best = std::string_view::npos, which = 0;
      for (std::size_t i = 0; i < k_markers.size(); ++i) {
        const auto p = s.find(k_markers[i]);
        if (p < best) best = p, which = i;
      }
      if (best == std::string_view::npos) {
        text(s);
        return;
      }
      text(s.substr(0, best));
      marker(k_markers[which]);
      s.remove_prefix(best + k_markers[which].size());
    }
  }
  std::vector<piece> finish() {
    flush();
    return std::move(out_);
  }

 private:
  void flush() {
    if (pending_.empty()) return;
    out_.push_back({std::move(pending_), false});
    pending_.clear();
  }
  std::string pending_;
  std::vector<piece> out_;
};

// V4.1 spells the DSML names with a space: `<｜DSML｜ calls>`, `<｜DSML｜ invoke`, `<｜DSML｜ parameter`.
std::string dsml(std::string_view v4_text, prompt_format f) {
  std::string out(v4_text);
  if (f == prompt_format::v4) return out;
  for (auto [from, to] : {std::pair<std::string_view, std::string_view>{"｜DSML｜tool_calls", "｜DSML｜ calls"},
                          {"｜DSML｜invoke", "｜DSML｜ invoke"},
                          {"｜DSML｜parameter", "｜DSML｜ parameter"}})
    for (std::size_t p = 0; (p = out.find(from, p)) != std::string::npos; p += to.size()) out.replace(p, from.size(), to);
  return out;
}

void render_tool_calls(builder& b, const std::vector<tool_call>& calls, prompt_format f) {
  b.markup(dsml("\n\n<｜DSML｜tool_calls>\n", f));
  for (const auto& call : calls) {
    b.markup(dsml("<｜DSML｜invoke name=\"", f));
    b.text(call.name);
    b.text("\">\n");
    auto write_param = [&](std::string_view name, bool is_string, std::string_view value) {
      b.markup(dsml("<｜DSML｜parameter name=\"", f));
      b.text(name);
      b.text(is_string ? "\" string=\"true\">" : "\" string=\"false\">");
      b.text(value);
      b.markup(dsml("</｜DSML｜parameter>\n", f));
    };
    const auto args = ojson::parse(call.arguments, nullptr, false);
    if (args.is_object()) {
      for (auto it = args.begin(); it != args.end(); ++it) {
        if (it.value().is_string()) {
          write_param(it.key(), true, it.value().get_ref<const std::string&>());
        } else {
          std::string v;
          dump(it.value(), v);
          write_param(it.key(), false, v);
        }
      }
    } else {
      write_param("arguments", true, call.arguments);
    }
    if (f == prompt_format::v41 && args.is_object() && args.empty()) b.text("\n");  // V4.1: an empty line
    b.markup(dsml("</｜DSML｜invoke>\n", f));
  }
  b.markup(dsml("</｜DSML｜tool_calls>", f));
}

// The system part of the prompt after the effort text: the tools block, then the response-format
// instruction.
void render_tools_and_format(builder& b, const conversation& c, prompt_format f) {
  if (!c.tools.empty() && c.tool_choice != tool_choice::none) {
    b.markup(dsml(k_tools_head, f));
    bool first = true;
    for (const auto& t : c.tools) {
      if (!first) b.text("\n");
      first = false;
      std::string line = "{\"name\": ";
      line += ojson(t.name).dump(-1, ' ', false);
      line += ", \"description\": ";
      line += ojson(t.description.value_or("")).dump(-1, ' ', false);
      line += ", \"parameters\": ";
      dump(ojson::parse(t.parameters_json), line);
      line += '}';
      b.text(line);
    }
    b.markup(k_tools_tail);
  }
  if (c.format.type == response_format::kind::json_object && f == prompt_format::v4) {
    b.text(k_format_json_object);
  } else if (c.format.type == response_format::kind::json_object) {  // V4.1: as a schema
    b.text(k_format_json_schema);
    b.text("{\"type\": \"json_object\"}");
  } else if (c.format.type == response_format::kind::json_schema) {
    b.text(k_format_json_schema);
    std::string schema;
    dump(ojson::parse(c.format.schema_json), schema);
    b.text(schema);
  }
}

// V4.1's effort: the continuous level when set, else the named one (low 50, high / xhigh / unset
// 75, max 100).
int effort_level(const conversation& c) {
  if (c.effort_level) return *c.effort_level;
  switch (c.effort.value_or(reasoning_effort::high)) {
    case reasoning_effort::low: return 50;
    case reasoning_effort::max: return 100;
    default: return 75;
  }
}

std::vector<piece> render(const conversation& c, prompt_format f, builder& b) {
  const bool v41 = f == prompt_format::v41;
  const bool tools_on = !c.tools.empty() && c.tool_choice != tool_choice::none;
  std::vector<const message*> msgs;
  for (const auto& m : c.messages) msgs.push_back(&m);
  const bool ends_in_prefix = !msgs.empty() && msgs.back()->role == role::assistant && msgs.back()->prefix;
  std::size_t first = 0;  // the first message rendered in the conversation part

  b.marker(k_bos);
  if (!v41) {
    if (c.thinking) {
      const auto effort = c.effort.value_or(reasoning_effort::high);
      if (effort == reasoning_effort::max)
        b.text(k_effort_max);
      else if (effort != reasoning_effort::low)
        b.text(k_effort_high);
    }
    bool first_system = true;
    for (const message* m : msgs) {
      if (m->role != role::system || m->content.empty()) continue;  // empty ones are left out
      if (!first_system) b.text("\n\n");
      first_system = false;
      b.text(m->content);
    }
    render_tools_and_format(b, c, f);
  } else {
    // `<｜System｜>` + effort line + a leading system message (even empty) + tools + format, when
    // there is any of them.
    const bool leading_system = !msgs.empty() && msgs.front()->role == role::system;
    const bool format_text = c.format.type == response_format::kind::json_object ||
                             c.format.type == response_format::kind::json_schema;
    if (c.thinking || leading_system || tools_on || format_text) {
      b.marker(k_system);
      if (c.thinking)
        b.text("Reasoning Effort: " + std::to_string(effort_level(c)) +
               " (range 1-100, the higher the value, the more thorough the reasoning)\n\n");
      if (leading_system) {
        b.text(msgs.front()->content);
        first = 1;
      }
      render_tools_and_format(b, c, f);
    }
  }

  std::optional<role> prev;  // the previous rendered message's role
  for (std::size_t i = first; i < msgs.size(); ++i) {
    const message& m = *msgs[i];
    switch (m.role) {
      case role::system:
        if (!v41) continue;  // V4: all in the header
        b.marker(k_system);
        b.text(m.content);
        break;
      case role::user: {
        if (prev == role::user || prev == role::tool)
          b.text("\n\n");
        else
          b.marker(k_user);
        std::size_t at = 0;
        for (const std::size_t image : m.images) {
          b.text(std::string_view(m.content).substr(at, image - at));
          if (v41)
            b.marker(k_image);
          else
            b.text("[Unsupported Image]");
          at = image;
        }
        b.text(std::string_view(m.content).substr(at));
        break;
      }
      case role::tool:  // V4.1 also joins a tool result to the user turn before it
        if (prev == role::tool || (v41 && prev == role::user))
          b.text("\n\n");
        else
          b.marker(k_user);
        b.text("<tool_result>");
        b.text(m.content);
        b.text("</tool_result>");
        break;
      case role::assistant: {
        b.marker(k_assistant);
        const bool is_prefix = m.prefix && i + 1 == msgs.size();
        if (is_prefix && v41) {  // V4.1: the reasoning part follows the thinking mode
          if (c.thinking) {
            b.marker(k_think);
            b.text(m.reasoning.value_or(""));
            if (!m.content.empty()) b.marker(k_end_think);
          } else {
            b.marker(k_end_think);
          }
          b.text(m.content);
        } else if (is_prefix) {
          if (m.reasoning) {
            b.marker(k_think);
            b.text(*m.reasoning);
            if (!m.content.empty()) b.marker(k_end_think);
          } else {
            b.marker(k_end_think);
          }
          b.text(m.content);
        } else {
          // Earlier reasoning is kept only in tool-using conversations: V4 when the message has
          // reasoning, V4.1 in thinking mode (empty when the message has none).
          if (v41 ? (tools_on && c.thinking) : (tools_on && m.reasoning.has_value())) {
            b.marker(k_think);
            b.text(m.reasoning.value_or(""));
          }
          b.marker(k_end_think);
          b.text(m.content);
          if (!m.tool_calls.empty()) render_tool_calls(b, m.tool_calls, f);
          if (!(v41 && m.prefix)) b.marker(k_eos);  // V4.1: a prefix message that is not last has no EOS
        }
        break;
      }
    }
    prev = m.role;
  }
  if (!ends_in_prefix) {
    b.marker(k_assistant);
    b.marker(c.thinking ? k_think : k_end_think);
    if (tools_on && c.tool_choice == tool_choice::required) b.markup(dsml("\n\n<｜DSML｜tool_calls>\n", f));
  }
  return b.finish();
}

}  // namespace

std::optional<std::string> missing_control_token(const tokenizer& tok, prompt_format f) {
  // V4 prompts use the first seven markers; V4.1 adds <｜System｜> and <｜image｜>.
  const std::size_t used = f == prompt_format::v4 ? 7 : k_markers.size();
  for (std::size_t i = 0; i < used; ++i)
    if (!tok.token_to_id(k_markers[i])) return std::string(k_markers[i]);
  return std::nullopt;
}

rendered_prompt render_prompt(const conversation& c, prompt_format f) {
  builder b;
  rendered_prompt out;
  for (auto& p : render(c, f, b)) {
    if (p.marker) out.control.emplace_back(out.text.size(), out.text.size() + p.text.size());
    out.text += p.text;
  }
  return out;
}

std::vector<prompt_piece> prompt_pieces(const conversation& c, const tokenizer& tok, prompt_format f) {
  builder b;
  std::vector<prompt_piece> out;
  for (auto& p : render(c, f, b)) {
    std::optional<token_id> control;
    if (p.marker) {
      control = tok.token_to_id(p.text);
      if (!control) throw std::runtime_error("prompt: the tokenizer has no token " + p.text);
    }
    out.push_back({std::move(p.text), control});
  }
  return out;
}

encoded_prompt assemble_prompt(std::span<const prompt_piece> pieces,
                               std::span<const std::vector<token_id>> text_ids) {
  encoded_prompt out;
  std::size_t next_text = 0;
  for (const auto& piece : pieces) {
    out.text += piece.text;
    if (piece.control) {
      out.control.push_back(out.ids.size());
      out.ids.push_back(*piece.control);
    } else {
      const auto& ids = text_ids[next_text++];
      out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    }
  }
  return out;
}

encoded_prompt encode_prompt(const conversation& c, const tokenizer& tok, prompt_format f) {
  const auto pieces = prompt_pieces(c, tok, f);
  std::vector<std::vector<token_id>> text_ids;
  for (const auto& piece : pieces)
    if (!piece.control) text_ids.push_back(tok.encode(piece.text, encode_mode::raw));
  return assemble_prompt(pieces, text_ids);
}

}  // namespace troupe::recipe
