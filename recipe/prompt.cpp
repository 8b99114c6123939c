// DeepSeek-V4 prompt rendering (format learned from deepseek_recipe 0.2.0's DeepseekV4Encoding
// output; see docs/recipe.md and tests/recipe/golden/prompts.v4.jsonl.gz).
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
constexpr std::array<std::string_view, 7> k_markers{k_bos, k_eos, k_user, k_assistant, k_think, k_end_think, k_dsml};

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

class builder {
 public:
  explicit builder(const tokenizer& tok) {
    for (std::size_t i = 0; i < k_markers.size(); ++i) {
      const auto id = tok.token_to_id(k_markers[i]);
      if (!id) throw std::runtime_error("prompt: the tokenizer has no token " + std::string(k_markers[i]));
      marker_ids_[i] = *id;
    }
  }
  // Conversation text: tokenized in raw mode (never an added token).
  void text(std::string_view s) { pending_ += s; }
  // An encoder marker: flushes the pending text, appends the marker's id.
  void marker(std::string_view m) {
    flush();
    for (std::size_t i = 0; i < k_markers.size(); ++i)
      if (k_markers[i] == m) {
        out_.push_back({std::string(m), marker_ids_[i]});
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
  std::vector<prompt_piece> finish() {
    flush();
    return std::move(out_);
  }

 private:
  void flush() {
    if (pending_.empty()) return;
    out_.push_back({std::move(pending_), std::nullopt});
    pending_.clear();
  }
  std::array<token_id, k_markers.size()> marker_ids_{};
  std::string pending_;
  std::vector<prompt_piece> out_;
};

void render_tool_calls(builder& b, const std::vector<tool_call>& calls) {
  b.markup("\n\n<｜DSML｜tool_calls>\n");
  for (const auto& call : calls) {
    b.markup("<｜DSML｜invoke name=\"");
    b.text(call.name);
    b.text("\">\n");
    auto write_param = [&](std::string_view name, bool is_string, std::string_view value) {
      b.markup("<｜DSML｜parameter name=\"");
      b.text(name);
      b.text(is_string ? "\" string=\"true\">" : "\" string=\"false\">");
      b.text(value);
      b.markup("</｜DSML｜parameter>\n");
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
    b.markup("</｜DSML｜invoke>\n");
  }
  b.markup("</｜DSML｜tool_calls>");
}

}  // namespace

std::vector<prompt_piece> render_prompt(const conversation& c, const tokenizer& tok) {
  builder b(tok);
  const bool tools_on = !c.tools.empty() && c.tool_choice != tool_choice::none;
  const auto& msgs = c.messages;
  const bool ends_in_prefix =
      !msgs.empty() && msgs.back().role == role::assistant && msgs.back().prefix;

  b.marker(k_bos);
  if (c.thinking) {
    const auto effort = c.effort.value_or(reasoning_effort::high);
    if (effort == reasoning_effort::max)
      b.text(k_effort_max);
    else if (effort != reasoning_effort::low)
      b.text(k_effort_high);
  }
  bool first_system = true;
  for (const auto& m : msgs) {
    if (m.role != role::system) continue;
    if (!first_system) b.text("\n\n");
    first_system = false;
    b.text(m.content);
  }
  if (tools_on) {
    b.markup(k_tools_head);
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

  std::optional<role> prev;  // the previous non-system message's role
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    const auto& m = msgs[i];
    switch (m.role) {
      case role::system:
        continue;
      case role::user:
        if (prev == role::user || prev == role::tool)
          b.text("\n\n");
        else
          b.marker(k_user);
        b.text(m.content);
        break;
      case role::tool:
        if (prev == role::tool)
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
        if (is_prefix) {
          if (m.reasoning) {
            b.marker(k_think);
            b.text(*m.reasoning);
            if (!m.content.empty()) b.marker(k_end_think);
          } else {
            b.marker(k_end_think);
          }
          b.text(m.content);
        } else {
          if (tools_on && m.reasoning) {
            b.marker(k_think);
            b.text(*m.reasoning);
          }
          b.marker(k_end_think);
          b.text(m.content);
          if (!m.tool_calls.empty()) render_tool_calls(b, m.tool_calls);
          b.marker(k_eos);
        }
        break;
      }
    }
    prev = m.role;
  }
  if (!ends_in_prefix) {
    b.marker(k_assistant);
    b.marker(c.thinking ? k_think : k_end_think);
    if (tools_on && c.tool_choice == tool_choice::required) b.markup("\n\n<｜DSML｜tool_calls>\n");
  }
  return b.finish();
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

encoded_prompt encode_prompt(const conversation& c, const tokenizer& tok) {
  const auto pieces = render_prompt(c, tok);
  std::vector<std::vector<token_id>> text_ids;
  for (const auto& piece : pieces)
    if (!piece.control) text_ids.push_back(tok.encode(piece.text, encode_mode::raw));
  return assemble_prompt(pieces, text_ids);
}

}  // namespace troupe::recipe
