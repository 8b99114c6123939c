// Tool calls as a grammar (tool_calls.hpp).
#include "recipe/grammar/tool_calls.hpp"

#include <algorithm>

#include <array>
#include <set>

#include "recipe/grammar/regex.hpp"

namespace troupe::recipe::grammar {
namespace {

using json = nlohmann::ordered_json;

struct failure {
  tool_calls_error e;
};

// The DSML words of a format: the block, a call, a parameter.
struct words {
  std::string block, invoke, parameter;
};

std::string open_tag(const std::string& word) { return "<" + std::string(1, static_cast<char>(dsml_byte)) + word; }
std::string close_tag(const std::string& word) {
  return "</" + std::string(1, static_cast<char>(dsml_byte)) + word + ">";
}

class builder {
 public:
  builder(const tool_calls_spec& spec, const limits& lim, std::string what = "a strict tool")
      : spec_(spec), lim_(lim),
        w_(spec.v41 ? words{" calls", " invoke", " parameter"} : words{"tool_calls", "invoke", "parameter"}),
        what_(std::move(what)) {}

  // Only the parameters of tool 0, as the root rule (dsml_parameters).
  grammar parameters() {
    g_.rules.emplace_back();
    nfa_builder b;
    const auto s = b.add_state(), a = b.add_state();
    const std::array<std::uint32_t, 2> end{b.add_state(), b.add_state()};
    strict_parameters(b, s, end, 0);
    b.epsilon(end[0], a);
    b.epsilon(end[1], a);
    g_.rules[0] = determinize(b, s, a, "parameters", 0);
    if (g_.state_count() > lim_.max_total_states)
      throw failure{{0, {"", "", "the parameters need more than " + std::to_string(lim_.max_total_states) +
                                     " automaton states"}}};
    return std::move(g_);
  }

  grammar run() {
    g_.rules.emplace_back();  // the root, built last
    std::vector<std::uint32_t> calls;
    for (std::size_t i = 0; i < spec_.tools.size(); ++i) calls.push_back(invoke_rule(i));
    nfa_builder b;
    const auto s = b.add_state(), a = b.add_state();
    // The calls: one or more (exactly one with one_call), then the block's end.
    const auto first = b.add_state(), more = b.add_state();
    for (const auto c : calls) {
      b.call(first, more, c);
      if (!spec_.one_call)
        b.call(more, more, c);
    }
    b.literal(more, a, close_tag(w_.block));
    if (spec_.mode == tool_calls_mode::opened) {
      b.epsilon(s, first);
    } else {
      const auto head = b.add_state();
      b.literal(head, first, "\n\n" + open_tag(w_.block) + ">\n");
      if (spec_.mode == tool_calls_mode::forced) {
        b.epsilon(s, head);
      } else if (spec_.content) {
        b.call(s, a, append_rules(g_, *spec_.content));
        b.epsilon(s, head);
      } else {  // any text, then perhaps the block
        const auto text = b.add_state();
        b.epsilon(s, text);
        emit_code_points(b, text, text, any_code_point(), false);
        b.epsilon(text, a);
        b.epsilon(text, head);
      }
    }
    g_.rules[0] = determinize(b, s, a, "tool calls", std::nullopt);
    if (g_.state_count() > lim_.max_total_states)
      throw failure{{std::nullopt, {"", "", "the tools need more than " + std::to_string(lim_.max_total_states) +
                                                " automaton states"}}};
    return std::move(g_);
  }

 private:
  rule determinize(const nfa_builder& b, std::uint32_t s, std::uint32_t a, std::string name,
                   std::optional<std::size_t> tool) const {
    try {
      return b.determinize(s, a, std::move(name), lim_);
    } catch (const build_error& e) {
      throw failure{{tool, {"", "", e.message}}};
    }
  }

  // One call of tool i: `<D invoke name="NAME">\n`, its parameters, `</D invoke>\n`.
  std::uint32_t invoke_rule(std::size_t i) {
    const tool_spec& t = spec_.tools[i];
    nfa_builder b;
    const auto s = b.add_state(), a = b.add_state();
    // params[f]: before `</D invoke>`; f = no parameter written (V4.1 then writes an empty line).
    const std::array<std::uint32_t, 2> end{b.add_state(), b.add_state()};
    const auto start = b.add_state();
    b.literal(s, start, open_tag(w_.invoke) + " name=\"" + t.name + "\">\n");
    if (t.schema) strict_parameters(b, start, end, i);
    else any_parameters(b, start, end);
    const auto close = b.add_state();
    b.epsilon(end[0], close);
    b.literal(end[1], close, spec_.v41 ? "\n" : "");
    b.literal(close, a, close_tag(w_.invoke) + "\n");
    const auto id = static_cast<std::uint32_t>(g_.rules.size());
    g_.rules.push_back(determinize(b, s, a, "invoke " + t.name, i));
    return id;
  }

  // `<D parameter name="KEY" string="` from `from`; returns the state after it.
  std::uint32_t parameter_head(nfa_builder& b, std::uint32_t from, const std::string& key) const {
    const auto h = b.add_state();
    b.literal(from, h, open_tag(w_.parameter) + " name=\"" + key + "\" string=\"");
    return h;
  }

  // Any parameters: names without quotes or line breaks, any values.
  void any_parameters(nfa_builder& b, std::uint32_t start, const std::array<std::uint32_t, 2>& end) {
    b.epsilon(start, end[1]);
    const std::array<std::uint32_t, 2> before{b.add_state(), start};  // [0]: after a parameter
    b.epsilon(before[0], end[0]);
    for (const auto from : before) {
      const auto name = b.add_state(), named = b.add_state();
      b.literal(from, name, open_tag(w_.parameter) + " name=\"");
      const auto chars = complement_code_points(normalize_code_points({{'\n', '\n'}, {'\r', '\r'}, {'"', '"'}}));
      emit_code_points(b, name, named, chars, false);
      emit_code_points(b, named, named, chars, false);
      const auto kind = b.add_state(), value = b.add_state();
      b.literal(named, kind, "\" string=\"");
      b.literal(kind, value, "true\">");
      b.literal(kind, value, "false\">");
      b.call(value, before[0], any_value_rule());
    }
  }

  // Any text and the parameter's closing tag, as one rule built directly (enclosed()) and shared
  // by the tools without a schema: the text's loop, determinized inside each call's rule with
  // the progress through the tag, was most of its states.
  std::uint32_t any_value_rule() {
    if (any_value_) return *any_value_;
    nfa_builder b;
    const auto s = b.add_state();
    emit_code_points(b, s, s, any_code_point(), false);
    try {
      const rule text = b.determinize(s, s, "text", lim_);
      g_.rules.push_back(enclosed("", text, close_tag(w_.parameter) + "\n", "any value", lim_.max_rule_states));
    } catch (const build_error& e) {
      throw failure{{std::nullopt, {"", "", e.message}}};
    }
    any_value_ = static_cast<std::uint32_t>(g_.rules.size() - 1);
    return *any_value_;
  }

  // A strict tool: its schema's properties in order, each a raw string or canonical JSON.
  void strict_parameters(nfa_builder& b, std::uint32_t start, const std::array<std::uint32_t, 2>& end,
                         std::size_t i) {
    const json& schema = *spec_.tools[i].schema;
    auto refuse = [&](std::string keyword, std::string message) {
      throw failure{{i, {std::move(keyword), "", std::move(message)}}};
    };
    if (!schema.is_object()) refuse("", "the parameters of " + what_ + " must be an object schema");
    static const std::set<std::string> top{"type", "properties", "required", "additionalProperties", "$defs",
                                           "definitions", "title", "description", "$schema", "$comment"};
    for (auto it = schema.begin(); it != schema.end(); ++it)
      if (!top.count(it.key()))
        refuse(it.key(), "'" + it.key() + "' is not supported at the top of the parameters of " + what_);
    if (schema.contains("type") && schema["type"] != "object")
      refuse("type", "the parameters of " + what_ + " must be of type 'object'");
    if (schema.contains("additionalProperties") && schema["additionalProperties"] != false)
      refuse("additionalProperties", what_ + " takes only the parameters its 'properties' name "
                                     "('additionalProperties' must be false)");
    const json props = schema.value("properties", json::object());
    if (!props.is_object()) refuse("properties", "'properties' must be an object");
    std::set<std::string> required;
    for (const auto& r : schema.value("required", json::array())) {
      if (!r.is_string() || !props.contains(r.get<std::string>()))
        refuse("required", "'required' must name properties of 'properties', not " + r.dump());
      required.insert(r.get<std::string>());
    }
    schema_rules rules(schema, g_, lim_);
    auto rule = [&](auto result) {
      if (auto* e = std::get_if<schema_error>(&result)) throw failure{{i, std::move(*e)}};
      return std::get<std::uint32_t>(result);
    };
    // at[f]: before the next property; f = none written yet.
    std::array<std::uint32_t, 2> at{b.add_state(), start};
    for (auto it = props.begin(); it != props.end(); ++it) {
      const std::string pointer = json_pointer_child("/properties", it.key());
      const auto value = rule(rules.value(it.value(), pointer));
      const std::array<std::uint32_t, 2> next{b.add_state(), b.add_state()};
      for (int f = 0; f < 2; ++f) {
        if (!required.count(it.key())) b.epsilon(at[f], next[f]);
        const auto head = parameter_head(b, at[f], it.key());
        const auto as_text = b.add_state(), as_json = b.add_state(), done = b.add_state();
        const std::string close = close_tag(w_.parameter) + "\n";
        b.literal(head, as_text, "true\">");
        if (auto e = rules.emit_raw_string(b, as_text, next[0], it.value(), pointer, close))
          throw failure{{i, std::move(*e)}};
        b.literal(head, as_json, "false\">");
        b.call(as_json, done, value);
        b.literal(done, next[0], close);
      }
      at = next;
    }
    b.epsilon(at[0], end[0]);
    b.epsilon(at[1], end[1]);
  }

  const tool_calls_spec& spec_;
  const limits& lim_;
  words w_;
  std::string what_;  // what the parameters belong to, in errors
  grammar g_;
  std::optional<std::uint32_t> any_value_;
};

}  // namespace

std::optional<tool_calls_spec> tool_calls_spec_of(const json& j) {
  if (!j.is_object() || !j.contains("tools") || !j["tools"].is_array()) return std::nullopt;
  auto flag = [&](const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); };
  tool_calls_spec spec;
  spec.v41 = flag("v41");
  spec.one_call = flag("one_call");
  const std::string mode = j.contains("mode") && j["mode"].is_string() ? j["mode"].get<std::string>() : "optional";
  if (mode == "opened") spec.mode = tool_calls_mode::opened;
  else if (mode == "forced") spec.mode = tool_calls_mode::forced;
  else if (mode != "optional") return std::nullopt;
  for (const auto& t : j["tools"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) return std::nullopt;
    const bool strict = t.contains("schema") && !t["schema"].is_null();
    spec.tools.push_back({t["name"].get<std::string>(), strict ? std::optional<json>(t["schema"]) : std::nullopt});
  }
  return spec;
}

std::variant<grammar, schema_error> compile_dsml_parameters(const json& schema, bool v41, const limits& lim) {
  tool_calls_spec spec;
  spec.v41 = v41;
  spec.tools.push_back({"", schema});
  try {
    grammar g = builder(spec, lim, "a deepseek_xml value").parameters();
    if (auto r = left_recursive_rule(g); !r.empty())
      return schema_error{"$ref", "", "recursion that consumes no output (left recursion) through " + r};
    if (!prune(g)) return schema_error{"", "", "no parameters satisfy the schema"};
    return g;
  } catch (const failure& f) {
    return f.e.error;
  }
}

std::variant<grammar, tool_calls_error> compile_tool_calls(const tool_calls_spec& spec, const limits& lim) {
  try {
    grammar g = builder(spec, lim).run();
    if (auto r = left_recursive_rule(g); !r.empty())
      return tool_calls_error{std::nullopt, {"$ref", "", "recursion that consumes no output (left recursion) through " + r}};
    if (!prune(g)) return tool_calls_error{std::nullopt, {"", "", "no output satisfies the tools' schemas"}};
    return g;
  } catch (const failure& f) {
    return f.e;
  }
}

}  // namespace troupe::recipe::grammar
