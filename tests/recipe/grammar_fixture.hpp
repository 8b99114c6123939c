// Shared by the structured-output tests: compiling helpers, every short string over an alphabet,
// the V4 vocabulary and the allowed tokens found by trying each one, a canonical serialiser that
// orders object members as the compiled grammars do, and an independent JSON Schema validator for
// the keywords the compiler supports (written here from the specification, not from the compiler).
#pragma once

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/json_schema.hpp"
#include "recipe/grammar/matcher.hpp"
#include "recipe/grammar/regex.hpp"
#include "recipe/grammar/token_mask.hpp"
#include "recipe_fixture.hpp"

namespace troupe::recipe::testing {

using ojson = nlohmann::ordered_json;
namespace gr = troupe::recipe::grammar;

inline std::shared_ptr<const gr::grammar> schema_grammar(const ojson& schema) {
  auto r = gr::compile_json_schema(schema);
  if (auto* e = std::get_if<gr::schema_error>(&r)) FAIL("schema refused: ", e->to_string());
  return std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
}

inline std::shared_ptr<const gr::grammar> regex_grammar(const std::string& pattern) {
  auto r = gr::compile_regex(pattern);
  if (auto* e = std::get_if<gr::regex_error>(&r)) FAIL("regex refused: ", e->message);
  return std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
}

inline std::shared_ptr<const gr::grammar> ebnf_grammar(const std::string& text) {
  auto r = gr::compile_ebnf(text);
  if (auto* e = std::get_if<gr::ebnf_error>(&r)) FAIL("grammar refused: ", e->to_string());
  return std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
}

// Every string over `alphabet` up to `max_len` characters.
inline std::vector<std::string> all_strings(const std::string& alphabet, std::size_t max_len) {
  std::vector<std::string> out{""};
  for (std::size_t begin = 0, len = 0; len < max_len; ++len) {
    const std::size_t end = out.size();
    for (std::size_t i = begin; i < end; ++i)
      for (const char c : alphabet) out.push_back(out[i] + c);
    begin = end;
  }
  return out;
}

inline const std::shared_ptr<const gr::vocabulary>& v4_vocab() {
  static const auto v = std::make_shared<const gr::vocabulary>(gr::vocabulary::from_tokenizer(v4()));
  return v;
}

// The allowed ids by trying every token on a copy of the matcher. Control tokens are never
// tried but `｜DSML｜` (which stands for gr::dsml_byte); nor is a text token holding that byte.
inline std::vector<std::uint32_t> brute_force_allowed(const gr::matcher& m, const gr::vocabulary& v) {
  const auto dsml = v4().token_to_id("｜DSML｜");
  std::vector<std::uint32_t> ids;
  for (std::uint32_t id = 0; id < v.size(); ++id) {
    if (std::find(v.eos().begin(), v.eos().end(), id) != v.eos().end()) {
      if (m.is_complete()) ids.push_back(id);
      continue;
    }
    const bool is_dsml = dsml && id == *dsml;
    if ((v4().is_added(id) && !is_dsml) || v.bytes(id).empty()) continue;
    if (!is_dsml && v.bytes(id).find(static_cast<char>(gr::dsml_byte)) != std::string::npos) continue;
    if (m.can_accept(v.bytes(id))) ids.push_back(id);
  }
  return ids;
}

// Along `text` (tokenized raw), every third mask and the last equal the brute-force answer,
// and the text is a whole sentence of `g`.
inline void check_masks_along(const std::shared_ptr<const gr::grammar>& g, const std::string& text) {
  const gr::mask_computer masks(g, v4_vocab());
  gr::matcher m(g);
  const auto ids = v4().encode(text, troupe::recipe::encode_mode::raw);
  int compared = 0;
  for (std::size_t i = 0; i <= ids.size(); ++i) {
    if (i % 3 == 0 || i == ids.size()) {
      INFO("after ", i, " tokens of ", text);
      CHECK(masks.allowed(m) == brute_force_allowed(m, *v4_vocab()));
      ++compared;
    }
    if (i < ids.size()) REQUIRE(m.accept_token(v4_vocab()->bytes(ids[i])));
  }
  CHECK(m.is_complete());
  CHECK(compared >= 4);
}

// The whole text is a sentence of the grammar.
inline bool accepts(const std::shared_ptr<const gr::grammar>& g, std::string_view text) {
  gr::matcher m(g);
  return m.accept_token(text) && m.is_complete();
}

// The member names of every object schema, in document order: its "properties", then its
// "required" names (the order the grammars write members in).
inline void property_order(const ojson& s, std::vector<std::string>& out) {
  auto add = [&](const std::string& k) {
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  };
  if (s.is_object()) {
    if (s.contains("properties") && s["properties"].is_object())
      for (auto p = s["properties"].begin(); p != s["properties"].end(); ++p) add(p.key());
    if (s.contains("required") && s["required"].is_array())
      for (const auto& r : s["required"])
        if (r.is_string()) add(r.get<std::string>());
    for (auto it = s.begin(); it != s.end(); ++it) property_order(it.value(), out);
  } else if (s.is_array()) {
    for (const auto& x : s) property_order(x, out);
  }
}

// Canonical text of an instance: members named in `order` first, in that order, then the others
// by name (`sort_others`, as `enum` / `const` objects are written) or in the instance's order.
inline std::string canonical_instance(const ojson& v, const std::vector<std::string>& order, bool sort_others = true) {
  if (v.is_object()) {
    std::vector<std::string> keys;
    for (auto it = v.begin(); it != v.end(); ++it) keys.push_back(it.key());
    auto rank = [&](const std::string& k) {
      const auto it = std::find(order.begin(), order.end(), k);
      return it == order.end() ? order.size() : static_cast<std::size_t>(it - order.begin());
    };
    std::stable_sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
      return rank(a) != rank(b) ? rank(a) < rank(b) : sort_others && a < b;
    });
    std::string out = "{";
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (i) out += ", ";
      out += gr::canonical_json(nlohmann::json(keys[i])) + ": " + canonical_instance(v[keys[i]], order, sort_others);
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + canonical_instance(v[i], order, sort_others);
    return out + "]";
  }
  return gr::canonical_json(nlohmann::json(v));
}

inline std::size_t code_points(const std::string& s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

// An independent validator for: type, enum, const, properties, required, additionalProperties,
// items, prefixItems, minItems, maxItems, anyOf, oneOf, allOf, $ref (local pointers), pattern
// (std::regex ECMAScript, ASCII patterns), minLength, maxLength, minimum, maximum,
// exclusiveMinimum, exclusiveMaximum, format date / uuid / ipv4.
class validator {
 public:
  explicit validator(ojson root) : root_(std::move(root)) {}
  bool valid(const ojson& v) const { return check(v, root_); }
  int matching_branches(const ojson& v, const ojson& branches) const {
    int n = 0;
    for (const auto& b : branches) n += check(v, b);
    return n;
  }

 private:
  static bool is_integer(const ojson& v) {
    return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
  }
  static bool equal(const ojson& a, const ojson& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    return nlohmann::json(a) == nlohmann::json(b);
  }
  bool type_ok(const ojson& v, const std::string& t) const {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    return v.is_number() && is_integer(v);
  }
  const ojson& deref(const std::string& ref) const {
    const ojson* cur = &root_;
    std::size_t i = 1;
    while (i < ref.size()) {
      auto j = ref.find('/', i + 1);
      if (j == std::string::npos) j = ref.size();
      std::string key = ref.substr(i + 1, j - i - 1);
      for (std::size_t k = 0; (k = key.find("~1", k)) != std::string::npos;) key.replace(k, 2, "/");
      for (std::size_t k = 0; (k = key.find("~0", k)) != std::string::npos;) key.replace(k, 2, "~");
      cur = cur->is_array() ? &(*cur)[std::stoul(key)] : &(*cur)[key];
      i = j;
    }
    return *cur;
  }
  bool check(const ojson& v, const ojson& s) const {
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("$ref") && !check(v, deref(s["$ref"].get<std::string>()))) return false;
    if (s.contains("type")) {
      bool ok = false;
      if (s["type"].is_array())
        for (const auto& t : s["type"]) ok = ok || type_ok(v, t.get<std::string>());
      else
        ok = type_ok(v, s["type"].get<std::string>());
      if (!ok) return false;
    }
    if (s.contains("const") && !equal(v, s["const"])) return false;
    if (s.contains("enum")) {
      bool ok = false;
      for (const auto& e : s["enum"]) ok = ok || equal(v, e);
      if (!ok) return false;
    }
    if (s.contains("anyOf") && matching_branches(v, s["anyOf"]) == 0) return false;
    if (s.contains("oneOf") && matching_branches(v, s["oneOf"]) != 1) return false;
    if (s.contains("allOf") && matching_branches(v, s["allOf"]) != static_cast<int>(s["allOf"].size())) return false;
    if (v.is_string()) {
      const auto& str = v.get_ref<const std::string&>();
      if (s.contains("minLength") && code_points(str) < s["minLength"].get<std::size_t>()) return false;
      if (s.contains("maxLength") && code_points(str) > s["maxLength"].get<std::size_t>()) return false;
      if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>())))
        return false;
      if (s.contains("format")) {
        static const std::map<std::string, std::string> f{
            {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"},
            {"uuid", "[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"},
            {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"}};
        const auto it = f.find(s["format"].get<std::string>());
        if (it != f.end() && !std::regex_match(str, std::regex(it->second))) return false;
      }
    }
    if (v.is_number()) {
      const double x = v.get<double>();
      if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
      if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
      if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
      if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return false;
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<std::size_t>()) return false;
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<std::size_t>()) return false;
      std::size_t prefix = 0;
      if (s.contains("prefixItems")) {
        prefix = s["prefixItems"].size();
        for (std::size_t i = 0; i < std::min(prefix, v.size()); ++i)
          if (!check(v[i], s["prefixItems"][i])) return false;
      }
      if (s.contains("items"))
        for (std::size_t i = prefix; i < v.size(); ++i)
          if (!check(v[i], s["items"])) return false;
    }
    if (v.is_object()) {
      if (s.contains("required"))
        for (const auto& r : s["required"])
          if (!v.contains(r.get<std::string>())) return false;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (s.contains("properties") && s["properties"].contains(it.key())) {
          if (!check(it.value(), s["properties"][it.key()])) return false;
        } else if (s.contains("additionalProperties") && !check(it.value(), s["additionalProperties"])) {
          return false;
        }
      }
    }
    return true;
  }
  ojson root_;
};

}  // namespace troupe::recipe::testing
