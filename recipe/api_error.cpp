// api_error in OpenAI's and Anthropic's error shapes; the shared request checks (request_json.hpp).
#include "recipe/api_error.hpp"

#include "recipe/request_json.hpp"

#include <algorithm>
#include <cctype>

namespace troupe::recipe {

std::string api_error::to_json() const {
  detail::ojson e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param ? detail::ojson(*param) : detail::ojson(nullptr);
  e["code"] = code ? detail::ojson(*code) : detail::ojson(nullptr);
  detail::ojson out;
  out["error"] = std::move(e);
  return out.dump();
}

std::string api_error::to_anthropic_json() const {
  detail::ojson e;
  e["type"] = type;
  e["message"] = message;
  detail::ojson out;
  out["type"] = "error";
  out["error"] = std::move(e);
  return out.dump();
}

namespace detail {

namespace {

void strict_description(const ojson& s, ojson& out, const std::string& param) {
  if (const ojson* d = find(s, "description")) out["description"] = need_string(*d, param + ".description");
}

// One schema node in deepseek_recipe's typed form (docs/recipe.md, "Strict tool schemas").
ojson strict_node(const ojson& s, const std::string& param, bool top) {
  const auto not_object_top = [&] {
    fail("The top level of the function parameters schema must be an object.", param);
  };
  if (!s.is_object()) fail("Invalid strict schema: expected an object with 'type', 'anyOf' or '$ref'.", param);
  ojson out = ojson::object();
  const ojson* type = find(s, "type");
  if (!type) {
    if (top) not_object_top();
    if (const ojson* any = find(s, "anyOf")) {
      if (!any->is_array()) fail("Invalid strict schema: 'anyOf' must be an array.", param + ".anyOf");
      ojson alternatives = ojson::array();
      for (std::size_t i = 0; i < any->size(); ++i)
        alternatives.push_back(strict_node((*any)[i], param + ".anyOf[" + std::to_string(i) + "]", false));
      out["anyOf"] = std::move(alternatives);
      strict_description(s, out, param);
      return out;
    }
    if (const ojson* ref = find(s, "$ref")) {
      out["$ref"] = need_string(*ref, param + ".$ref");
      return out;
    }
    fail("Invalid strict schema: one of 'type', 'anyOf' or '$ref' is required.", param);
  }
  if (type->is_array()) {
    if (top) not_object_top();
    for (std::size_t i = 0; i < type->size(); ++i) {
      const std::string t = need_string((*type)[i], param + ".type[" + std::to_string(i) + "]");
      if (t != "string" && t != "number" && t != "integer" && t != "boolean" && t != "null")
        fail("Invalid strict schema: a list of types may hold 'string', 'number', 'integer', 'boolean' and 'null' only, not '" +
                 t + "'.",
             param + ".type");
    }
    out["type"] = *type;
    strict_description(s, out, param);
    return out;
  }
  const std::string t = need_string(*type, param + ".type");
  if (top && t != "object") not_object_top();
  out["type"] = t;
  if (t == "object") {
    const ojson* props = find(s, "properties");
    if (props && !props->is_object()) fail("Invalid schema: 'properties' must be an object.", param + ".properties");
    if (!top && (!props || props->empty()))
      fail("An object with no properties is not allowed in a strict schema.", param + ".properties");
    if (const ojson* ap = find(s, "additionalProperties")) {
      if (!ap->is_boolean())
        fail("Invalid strict schema: 'additionalProperties' must be false.", param + ".additionalProperties");
      if (ap->get<bool>()) fail("additionalProperties must be false in a strict schema", param + ".additionalProperties");
    }
    ojson properties = ojson::object(), names = ojson::array();
    if (props)
      for (auto it = props->begin(); it != props->end(); ++it) {
        names.push_back(it.key());
        properties[it.key()] = strict_node(it.value(), param + ".properties." + it.key(), false);
      }
    if (const ojson* req = find(s, "required")) {
      if (!req->is_array()) fail("Invalid type for '" + param + ".required': expected an array.", param + ".required");
      for (std::size_t i = 0; i < req->size(); ++i) {
        const std::string name = need_string((*req)[i], param + ".required[" + std::to_string(i) + "]");
        if (!properties.contains(name)) fail("Required property '" + name + "' not found in object", param + ".required");
        for (std::size_t k = 0; k < i; ++k)
          if ((*req)[k] == (*req)[i]) fail("Duplicate required property '" + name + "'", param + ".required");
      }
      if (req->size() != names.size())
        fail("Required properties must match all properties in the object", param + ".required");
    }
    out["properties"] = std::move(properties);
    out["additionalProperties"] = false;
    out["required"] = std::move(names);
    strict_description(s, out, param);
  } else if (t == "string") {
    strict_description(s, out, param);
    if (const ojson* pattern = find(s, "pattern")) out["pattern"] = need_string(*pattern, param + ".pattern");
    if (const ojson* format = find(s, "format")) {
      const std::string f = need_string(*format, param + ".format");
      if (f != "email" && f != "hostname" && f != "ipv4" && f != "ipv6" && f != "uuid")
        fail("Invalid strict schema: format '" + f + "' is not one of 'email', 'hostname', 'ipv4', 'ipv6', 'uuid'.",
             param + ".format");
      out["format"] = f;
    }
    if (const ojson* e = find(s, "enum")) {
      if (!e->is_array()) fail("Invalid type for '" + param + ".enum': expected an array.", param + ".enum");
      for (std::size_t i = 0; i < e->size(); ++i) need_string((*e)[i], param + ".enum[" + std::to_string(i) + "]");
      out["enum"] = *e;
    }
  } else if (t == "number" || t == "integer") {
    strict_description(s, out, param);
    const auto value = [&](const char* key) -> const ojson* {
      const ojson* v = find(s, key);
      if (v && !(t == "integer" ? v->is_number_integer() : v->is_number()))
        fail("Invalid type for '" + param + "." + key + "': expected " + (t == "integer" ? "an integer" : "a number") + ".",
             param + "." + key);
      return v;
    };
    for (const char* key : {"const", "default", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
      if (const ojson* v = value(key)) out[key] = *v;
  } else if (t == "boolean" || t == "null") {
    strict_description(s, out, param);
  } else if (t == "array") {
    const ojson* items = find(s, "items");
    if (!items) fail("Missing required parameter: '" + param + ".items'.", param + ".items");
    out["items"] = strict_node(*items, param + ".items", false);
    strict_description(s, out, param);
  } else {
    fail("Invalid strict schema: unknown type '" + t +
             "' (one of 'object', 'string', 'number', 'integer', 'boolean', 'array', 'null').",
         param + ".type");
  }
  return out;
}

}  // namespace

void make_strict(ojson& schema, const std::string& param) { schema = strict_node(schema, param, true); }

void order_tool_results(conversation& conv) {
  auto& ms = conv.messages;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (ms[i].role != role::assistant || ms[i].tool_calls.empty()) continue;
    const auto& calls = ms[i].tool_calls;
    const auto rank = [&](const message& m) {
      return std::find_if(calls.begin(), calls.end(), [&](const tool_call& c) { return c.id == m.tool_call_id; }) - calls.begin();
    };
    std::size_t end = i + 1;
    while (end < ms.size() && ms[end].role == role::tool) ++end;
    std::stable_sort(ms.begin() + static_cast<std::ptrdiff_t>(i + 1), ms.begin() + static_cast<std::ptrdiff_t>(end),
                     [&](const message& a, const message& b) { return rank(a) < rank(b); });
  }
}

effort_choice parse_effort(const ojson& j, const std::string& param) {
  effort_choice e;
  if (j.is_number_integer()) {
    const std::int64_t n = j.get<std::int64_t>();
    if (n < 1 || n > 100) fail("Invalid " + param + " value, the valid range of " + param + " is [1, 100].", param);
    e.number = static_cast<int>(n);
    e.level = n <= 50 ? reasoning_effort::low : n < 100 ? reasoning_effort::high : reasoning_effort::max;
    return e;
  }
  const std::string v = need_string(j, param);
  if (v == "none") e.none = true;
  else if (v == "minimal" || v == "low") e.level = reasoning_effort::low;
  else if (v == "medium" || v == "high") e.level = reasoning_effort::high;
  else if (v == "xhigh") e.level = reasoning_effort::xhigh;
  else if (v == "ultra" || v == "max") e.level = reasoning_effort::max;
  else
    fail("Invalid value: '" + v +
             "'. Supported values are: 'none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'ultra' and 'max'.",
         param);
  return e;
}

bool parse_thinking(const ojson& t, const std::string& param) {
  if (!t.is_object() || !find(t, "type"))
    fail("Invalid value for '" + param + "': expected {\"type\": ...}.", param);
  const std::string type = need_string(t["type"], param + ".type");
  if (type == "enabled" || type == "adaptive") return true;
  if (type != "disabled")
    fail("Invalid value: '" + type + "'. Supported values are: 'enabled', 'disabled' and 'adaptive'.", param + ".type");
  return false;
}

std::string check_model(const ojson& body, const std::vector<std::string>& models) {
  const ojson* model = find(body, "model");
  if (!model) fail("Missing required parameter: 'model'.", "model");
  std::string name = need_string(*model, "model");
  if (!models.empty() && std::find(models.begin(), models.end(), name) == models.end()) {
    std::string names;
    for (const auto& m : models) names += (names.empty() ? "" : ", ") + m;
    throw request_failure{api_error{400, "The model '" + name + "' does not exist; supported models: " + names + ".",
                                    "invalid_request_error", "model", "model_not_found"}};
  }
  return name;
}

std::size_t nesting_depth(std::string_view text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

bool mentions_json(const conversation& c) {
  for (const auto& m : c.messages) {
    const std::string& s = m.content;
    for (std::size_t i = 0; i + 4 <= s.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(s[i])) == 'j' && std::tolower(static_cast<unsigned char>(s[i + 1])) == 's' &&
          std::tolower(static_cast<unsigned char>(s[i + 2])) == 'o' && std::tolower(static_cast<unsigned char>(s[i + 3])) == 'n')
        return true;
  }
  return false;
}

}  // namespace detail
}  // namespace troupe::recipe
