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

void make_strict(ojson& schema, const std::string& param) {
  // Inserting into an ordered_json moves its members: no reference into `schema` is kept across
  // an insertion.
  if (!schema.is_object()) return;
  const ojson* type = find(schema, "type");
  if (type && type->is_string() && type->get<std::string>() == "object") {
    if (!schema.contains("properties")) schema["properties"] = ojson::object();
    if (!schema["properties"].is_object()) fail("Invalid schema: 'properties' must be an object.", param + ".properties");
    ojson all = ojson::array();
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) all.push_back(it.key());
    if (const ojson* ap = find(schema, "additionalProperties"); ap && *ap != ojson(false))
      fail("additionalProperties must be false in a strict schema", param + ".additionalProperties");
    if (const ojson* req = find(schema, "required")) {
      bool same = req->is_array() && req->size() == all.size();
      for (std::size_t i = 0; same && i < req->size(); ++i)
        same = std::find(all.begin(), all.end(), (*req)[i]) != all.end();
      if (!same) fail("Required properties must match all properties in the object", param + ".required");
    }
    schema["additionalProperties"] = false;
    schema["required"] = std::move(all);
    ojson& properties = schema["properties"];
    for (auto it = properties.begin(); it != properties.end(); ++it)
      make_strict(it.value(), param + ".properties." + it.key());
  }
  if (auto it = schema.find("items"); it != schema.end()) make_strict(*it, param + ".items");
  for (const char* k : {"anyOf", "oneOf", "allOf"})
    if (auto it = schema.find(k); it != schema.end() && it->is_array())
      for (std::size_t i = 0; i < it->size(); ++i) make_strict((*it)[i], param + "." + k + "[" + std::to_string(i) + "]");
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
