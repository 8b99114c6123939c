// JSON Schema to grammar (json_schema.hpp).
#include "recipe/grammar/json_schema.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "recipe/grammar/regex.hpp"

namespace troupe::recipe::grammar {

using json = nlohmann::ordered_json;

std::string schema_error::to_string() const {
  std::string s = message;
  if (!keyword.empty()) s += " (keyword '" + keyword + "' at '#" + pointer + "')";
  else s += " (at '#" + pointer + "')";
  return s;
}

namespace {

void escape_string_into(std::string& out, std::string_view s) {
  static const char digits[] = "0123456789abcdef";
  out.push_back('"');
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(digits[c >> 4]);
          out.push_back(digits[c & 15]);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

void canonical_into(std::string& out, const nlohmann::json& v, json_style style) {
  switch (v.type()) {
    case nlohmann::json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += style.item();
        first = false;
        escape_string_into(out, it.key());
        out += style.key();
        canonical_into(out, it.value(), style);
      }
      out.push_back('}');
      return;
    }
    case nlohmann::json::value_t::array: {
      out.push_back('[');
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) out += style.item();
        canonical_into(out, v[i], style);
      }
      out.push_back(']');
      return;
    }
    case nlohmann::json::value_t::string: escape_string_into(out, v.get_ref<const std::string&>()); return;
    case nlohmann::json::value_t::number_float: {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e18) {
        out += std::to_string(static_cast<std::int64_t>(d));
        return;
      }
      out += v.dump();
      return;
    }
    default: out += v.dump(); return;
  }
}

std::string escape_pointer_token(const std::string& k) {
  std::string out;
  for (const char c : k) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out.push_back(c);
  }
  return out;
}

struct failure {
  schema_error e;
};

[[noreturn]] void fail(std::string keyword, std::string pointer, std::string message) {
  throw failure{{std::move(keyword), std::move(pointer), std::move(message)}};
}

const std::set<std::string>& annotations() {
  static const std::set<std::string> s{"title", "description", "$comment", "default", "examples",
                                       "deprecated", "readOnly", "writeOnly", "$schema",
                                       "contentEncoding", "contentMediaType", "contentSchema"};
  return s;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> s{
      "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
      "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
      "pattern", "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
      "exclusiveMaximum", "$id"};
  return s;
}

// Formats enforced, as full-match patterns over the string's characters.
const std::map<std::string, std::string>& formats() {
  static const std::string date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  static const std::string time =
      "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  static const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  static const std::string label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
  static const std::map<std::string, std::string> m{
      {"date", date},
      {"time", time},
      {"date-time", date + "[Tt]" + time},
      {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
      {"ipv4", octet + "(\\." + octet + "){3}"},
      {"hostname", label + "(\\." + label + ")*"},
      {"email", "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@" + label + "(\\." + label + ")*"},
  };
  return m;
}

// Decimal strings of the integers in [lo, hi] (hi may be unbounded), no leading zeros.
class integer_range {
 public:
  integer_range(nfa_builder& b) : b_(b) {}

  void emit(std::uint32_t from, std::uint32_t to, std::optional<std::int64_t> lo, std::optional<std::int64_t> hi) {
    // Negative part: "-" then magnitudes in [max(1, -hi), -lo].
    if (!lo || *lo < 0) {
      const std::uint64_t mag_lo = hi && *hi < 0 ? static_cast<std::uint64_t>(-(*hi + 1)) + 1 : 1;
      std::optional<std::uint64_t> mag_hi;
      if (lo) mag_hi = static_cast<std::uint64_t>(-(*lo + 1)) + 1;
      const auto mid = b_.add_state();
      b_.byte(from, mid, '-');
      magnitudes(mid, to, mag_lo, mag_hi);
    }
    if (!hi || *hi >= 0) {
      const std::uint64_t a = lo && *lo > 0 ? static_cast<std::uint64_t>(*lo) : 0;
      std::optional<std::uint64_t> z;
      if (hi) z = static_cast<std::uint64_t>(*hi);
      magnitudes(from, to, a, z);
    }
  }

 private:
  void any_digits(std::uint32_t from, std::uint32_t to, std::size_t n) {
    std::uint32_t cur = from;
    for (std::size_t i = 0; i < n; ++i) {
      const auto nxt = i + 1 == n ? to : b_.add_state();
      digit_range(cur, nxt, '0', '9');
      cur = nxt;
    }
    if (n == 0) b_.epsilon(from, to);
  }
  void digit_range(std::uint32_t from, std::uint32_t to, char a, char z) {
    if (a > z) return;
    byte_set s;
    s.set_range(static_cast<unsigned char>(a), static_cast<unsigned char>(z));
    b_.bytes(from, to, s);
  }
  // Strings of s.size() digits >= s (ge) or <= s (le).
  void bound(std::uint32_t from, std::uint32_t to, const std::string& s, bool ge) {
    if (s.empty()) {
      b_.epsilon(from, to);
      return;
    }
    const char d = s[0];
    const auto rest = s.substr(1);
    const auto mid = b_.add_state();
    b_.byte(from, mid, static_cast<unsigned char>(d));
    bound(mid, to, rest, ge);
    const char a = ge ? static_cast<char>(d + 1) : '0';
    const char z = ge ? '9' : static_cast<char>(d - 1);
    if (a <= z) {
      const auto mid2 = rest.empty() ? to : b_.add_state();
      digit_range(from, mid2, a, z);
      if (!rest.empty()) any_digits(mid2, to, rest.size());
    }
  }
  // Same-length digit strings in [a, z].
  void same_length(std::uint32_t from, std::uint32_t to, const std::string& a, const std::string& z) {
    std::size_t p = 0;
    while (p < a.size() && a[p] == z[p]) ++p;
    std::uint32_t cur = from;
    if (p > 0) {
      cur = p == a.size() ? to : b_.add_state();
      b_.literal(from, cur, a.substr(0, p));
    }
    if (p == a.size()) return;
    const std::size_t n = a.size() - p - 1;
    const auto ga = b_.add_state();
    b_.byte(cur, ga, static_cast<unsigned char>(a[p]));
    bound(ga, to, a.substr(p + 1), true);
    const auto lz = b_.add_state();
    b_.byte(cur, lz, static_cast<unsigned char>(z[p]));
    bound(lz, to, z.substr(p + 1), false);
    if (a[p] + 1 <= z[p] - 1) {
      const auto mid = n == 0 ? to : b_.add_state();
      digit_range(cur, mid, static_cast<char>(a[p] + 1), static_cast<char>(z[p] - 1));
      if (n) any_digits(mid, to, n);
    }
  }
  void magnitudes(std::uint32_t from, std::uint32_t to, std::uint64_t lo, std::optional<std::uint64_t> hi) {
    if (hi && *hi < lo) return;
    const std::string a = std::to_string(lo);
    const std::size_t top_len = hi ? std::to_string(*hi).size() : a.size();
    for (std::size_t len = a.size(); len <= top_len; ++len) {
      const std::string first = len == a.size() ? a : "1" + std::string(len - 1, '0');
      const std::string last = hi && len == top_len ? std::to_string(*hi) : std::string(len, '9');
      same_length(from, to, first, last);
    }
    if (!hi) {  // longer than lo: [1-9][0-9]{len(lo)}[0-9]*
      const auto mid = b_.add_state(), loop = b_.add_state();
      digit_range(from, mid, '1', '9');
      any_digits(mid, loop, a.size());
      digit_range(loop, loop, '0', '9');
      b_.epsilon(loop, to);
    }
  }
  nfa_builder& b_;
};

}  // namespace

// Compiles (sub)schemas of one root schema into rules appended to a grammar.
class schema_rules::compiler {
 public:
  compiler(const json& root, grammar& g, const limits& lim, json_style style)
      : root_(root), lim_(lim), style_(style), g_(g) {}

  std::uint32_t rule_for(const std::string& ptr, const json& node) {
    return rule_of(memo_, ptr, node, &compiler::emit, "");
  }
  // The raw text of `node`'s string instances: no quotes, no escapes.
  std::uint32_t raw_rule_for(const std::string& ptr, const json& node) {
    return rule_of(raw_memo_, ptr, node, &compiler::emit_raw, " (raw string)");
  }
  // ... followed by `then` (schema_rules::emit_raw_string).
  void raw_into(nfa_builder& b, std::uint32_t from, std::uint32_t to, const std::string& ptr, const json& node,
                const std::string& then) {
    if (auto bounds = length_bounds_only(node, ptr)) {
      b.call(from, to, bounded_string(bounds->first, bounds->second, true, "", then, ptr));
      return;
    }
    const auto mid = b.add_state();
    emit_raw(b, from, mid, node, ptr);
    b.literal(mid, to, then);
  }

 private:
  using emitter = void (compiler::*)(nfa_builder&, std::uint32_t, std::uint32_t, const json&, const std::string&);
  std::uint32_t rule_of(std::map<std::string, std::uint32_t>& memo, const std::string& ptr, const json& node,
                        emitter emit_fn, const char* suffix) {
    if (auto it = memo.find(ptr); it != memo.end()) return it->second;
    if (depth_ >= 64) fail("", ptr, "schema nested more than 64 levels deep");
    const auto id = static_cast<std::uint32_t>(g_.rules.size());
    g_.rules.emplace_back();
    memo[ptr] = id;
    ++depth_;
    nfa_builder b;
    const auto s = b.add_state(), a = b.add_state();
    (this->*emit_fn)(b, s, a, node, ptr);
    finish(id, b, s, a, (ptr.empty() ? "#" : "#" + ptr) + suffix);
    --depth_;
    return id;
  }

  void finish(std::uint32_t id, nfa_builder& b, std::uint32_t s, std::uint32_t a, const std::string& name) {
    try {
      g_.rules[id] = b.determinize(s, a, name, lim_);
    } catch (const build_error& e) {
      fail("", name[0] == '#' ? name.substr(1) : name, e.message);
    }
    add_states(g_.rules[id].size());
  }
  void add_states(std::size_t n) {
    total_ += n;
    if (total_ > lim_.max_total_states)
      fail("", "", "the schema needs more than " + std::to_string(lim_.max_total_states) + " automaton states");
  }

  // A JSON string of any characters.
  std::uint32_t string_rule() {
    if (string_rule_) return *string_rule_;
    const auto id = static_cast<std::uint32_t>(g_.rules.size());
    g_.rules.emplace_back();
    string_rule_ = id;
    nfa_builder b;
    const auto s = b.add_state(), a = b.add_state();
    any_string(b, s, a);
    finish(id, b, s, a, "string");
    return id;
  }
  void any_string(nfa_builder& b, std::uint32_t from, std::uint32_t to) {
    const auto body = b.add_state(), end = b.add_state();
    b.byte(from, body, '"');
    emit_code_points(b, body, body, any_code_point(), true);
    b.byte(body, end, '"');
    b.epsilon(end, to);
  }

  // The style's spacing (json_style). An opening bracket and the whitespace after it; the
  // whitespace before a closing one and it (an empty container closes with the bracket alone, the
  // opening's whitespace being the one between them); `,` or `:` with whitespace on both sides.
  void open(nfa_builder& b, std::uint32_t from, std::uint32_t to, unsigned char bracket) {
    if (!style_.whitespace) return b.byte(from, to, bracket);
    const auto x = b.add_state();
    b.byte(from, x, bracket);
    b.paste(x, to, *style_.whitespace);
  }
  void close(nfa_builder& b, std::uint32_t from, std::uint32_t to, unsigned char bracket) {
    if (!style_.whitespace) return b.byte(from, to, bracket);
    const auto x = b.add_state();
    b.paste(from, x, *style_.whitespace);
    b.byte(x, to, bracket);
  }
  void separator(nfa_builder& b, std::uint32_t from, std::uint32_t to, char c) {
    if (!style_.whitespace) return b.literal(from, to, c == ',' ? style_.item() : style_.key());
    const auto x = b.add_state(), y = b.add_state();
    b.paste(from, x, *style_.whitespace);
    b.byte(x, y, static_cast<unsigned char>(c));
    b.paste(y, to, *style_.whitespace);
  }
  // `v`'s text as `enum` / `const` give it: canonical_json's, token by token with a whitespace
  // pattern.
  void value_text(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& v) {
    if (!style_.whitespace || !v.is_structured())
      return b.literal(from, to, canonical_json(nlohmann::json(v), style_));
    const nlohmann::json sorted(v);  // canonical_json's member order
    value_text_sorted(b, from, to, sorted);
  }
  void value_text_sorted(nfa_builder& b, std::uint32_t from, std::uint32_t to, const nlohmann::json& v) {
    if (!v.is_structured()) return b.literal(from, to, canonical_json(v, style_));
    const bool object = v.is_object();
    auto x = b.add_state();
    open(b, from, x, object ? '{' : '[');
    if (v.empty()) return b.byte(x, to, object ? '}' : ']');
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) {
        const auto y = b.add_state();
        separator(b, x, y, ',');
        x = y;
      }
      first = false;
      if (object) {
        std::string key;
        escape_string_into(key, it.key());
        const auto y = b.add_state(), z = b.add_state();
        b.literal(x, y, key);
        separator(b, y, z, ':');
        x = z;
      }
      const auto y = b.add_state();
      value_text_sorted(b, x, y, *it);
      x = y;
    }
    close(b, x, to, object ? '}' : ']');
  }

  // Any JSON value.
  std::uint32_t any_rule() {
    if (any_rule_) return *any_rule_;
    const auto id = static_cast<std::uint32_t>(g_.rules.size());
    g_.rules.emplace_back();
    any_rule_ = id;
    const auto key = string_rule();
    nfa_builder b;
    const auto s = b.add_state(), a = b.add_state();
    for (const char* lit : {"null", "true", "false"}) b.literal(s, a, lit);
    number(b, s, a, false);
    b.call(s, a, key);
    // [ ] and [v, v, ...]
    const auto arr = b.add_state(), arr_more = b.add_state(), arr_item = b.add_state();
    open(b, s, arr, '[');
    b.byte(arr, a, ']');
    b.call(arr, arr_item, id);
    separator(b, arr_item, arr_more, ',');
    b.call(arr_more, arr_item, id);
    close(b, arr_item, a, ']');
    // { } and {"k": v, ...}
    const auto obj = b.add_state(), obj_more = b.add_state(), colon = b.add_state(), value = b.add_state(),
               member = b.add_state();
    open(b, s, obj, '{');
    b.byte(obj, a, '}');
    b.call(obj, colon, key);
    separator(b, member, obj_more, ',');
    b.call(obj_more, colon, key);
    separator(b, colon, value, ':');
    b.call(value, member, id);
    close(b, member, a, '}');
    finish(id, b, s, a, "any");
    return id;
  }

  void number(nfa_builder& b, std::uint32_t from, std::uint32_t to, bool integer) {
    const auto sign = b.add_state(), intpart = b.add_state(), digits = b.add_state();
    b.epsilon(from, sign);
    b.byte(from, sign, '-');
    b.byte(sign, intpart, '0');
    byte_set nz, d;
    nz.set_range('1', '9');
    d.set_range('0', '9');
    b.bytes(sign, digits, nz);
    b.bytes(digits, digits, d);
    b.epsilon(digits, intpart);
    if (integer) {
      b.epsilon(intpart, to);
      return;
    }
    const auto dot = b.add_state(), frac = b.add_state(), e = b.add_state(), esign = b.add_state(),
               edigits = b.add_state();
    b.epsilon(intpart, to);
    b.byte(intpart, dot, '.');
    b.bytes(dot, frac, d);
    b.bytes(frac, frac, d);
    b.epsilon(frac, to);
    b.byte(intpart, e, 'e');
    b.byte(intpart, e, 'E');
    b.byte(frac, e, 'e');
    b.byte(frac, e, 'E');
    b.epsilon(e, esign);
    b.byte(e, esign, '+');
    b.byte(e, esign, '-');
    b.bytes(esign, edigits, d);
    b.bytes(edigits, edigits, d);
    b.epsilon(edigits, to);
  }

  static std::string child(const std::string& ptr, const std::string& key) { return json_pointer_child(ptr, key); }

  // Only annotations and the listed keywords beside `keyword`.
  void only_with(const json& node, const std::string& ptr, const std::string& keyword, std::set<std::string> allowed) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      const auto& k = it.key();
      if (k == keyword || annotations().count(k) || allowed.count(k)) continue;
      fail(k, ptr, "'" + k + "' beside '" + keyword + "' is not supported");
    }
  }

  const json& resolve(const std::string& ref, const std::string& ptr, std::string& target_ptr) {
    if (ref.empty() || ref[0] != '#')
      fail("$ref", ptr, "only references within the schema ('#...') are supported: " + ref);
    std::string p = ref.substr(1);
    // Percent-decoding of the URI fragment.
    std::string dec;
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (p[i] == '%' && i + 2 < p.size() + 0 && std::isxdigit(static_cast<unsigned char>(p[i + 1])) &&
          std::isxdigit(static_cast<unsigned char>(p[i + 2]))) {
        dec.push_back(static_cast<char>(std::stoi(p.substr(i + 1, 2), nullptr, 16)));
        i += 2;
      } else {
        dec.push_back(p[i]);
      }
    }
    if (!dec.empty() && dec[0] != '/') fail("$ref", ptr, "anchors are not supported: " + ref);
    const json* cur = &root_;
    std::string canon;
    std::size_t i = 0;
    while (i < dec.size()) {
      std::size_t j = dec.find('/', i + 1);
      if (j == std::string::npos) j = dec.size();
      std::string tok = dec.substr(i + 1, j - i - 1);
      std::string key;
      for (std::size_t k = 0; k < tok.size(); ++k) {
        if (tok[k] == '~' && k + 1 < tok.size() && (tok[k + 1] == '0' || tok[k + 1] == '1')) {
          key.push_back(tok[k + 1] == '0' ? '~' : '/');
          ++k;
        } else {
          key.push_back(tok[k]);
        }
      }
      if (cur->is_object() && cur->contains(key)) {
        cur = &(*cur)[key];
      } else if (cur->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
                 key.size() < 9 && std::stoul(key) < cur->size()) {
        cur = &(*cur)[std::stoul(key)];
      } else {
        fail("$ref", ptr, "unresolvable reference " + ref);
      }
      canon = child(canon, key);
      i = j;
    }
    target_ptr = canon;
    return *cur;
  }

  // The keywords of an object schema are all known; `$ref` and the combinators are followed as
  // calls of `callee` (rule_for or raw_rule_for). True when `node` was handled so.
  bool follow(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr,
              std::uint32_t (compiler::*callee)(const std::string&, const json&)) {
    if (!node.is_object()) fail("", ptr, "a schema must be an object or a boolean");
    for (auto it = node.begin(); it != node.end(); ++it) {
      const auto& k = it.key();
      if (annotations().count(k)) continue;
      if (!supported().count(k)) fail(k, ptr, "unsupported keyword '" + k + "'");
    }
    if (node.contains("$id") && !ptr.empty()) fail("$id", ptr, "'$id' is supported only at the root");
    if (node.contains("$ref")) {
      only_with(node, ptr, "$ref", {"$defs", "definitions", "$id"});
      if (!node["$ref"].is_string()) fail("$ref", ptr, "'$ref' must be a string");
      std::string target;
      const json& t = resolve(node["$ref"].get<std::string>(), ptr, target);
      b.call(from, to, (this->*callee)(target, t));
      return true;
    }
    for (const char* kw : {"anyOf", "oneOf", "allOf"}) {
      if (!node.contains(kw)) continue;
      only_with(node, ptr, kw, {"$defs", "definitions", "$id"});
      const json& alts = node[kw];
      if (!alts.is_array() || alts.empty()) fail(kw, ptr, std::string("'") + kw + "' must be a non-empty array");
      if (std::string(kw) == "allOf") {
        if (alts.size() != 1) fail(kw, ptr, "'allOf' with more than one schema is not supported");
        b.call(from, to, (this->*callee)(child(ptr, kw) + "/0", alts[0]));
        return true;
      }
      for (std::size_t i = 0; i < alts.size(); ++i)
        b.call(from, to, (this->*callee)(child(ptr, kw) + "/" + std::to_string(i), alts[i]));
      return true;
    }
    return false;
  }

  std::set<std::string> types_of(const json& node, const std::string& ptr) {
    std::set<std::string> types;
    if (node.contains("type")) {
      const json& t = node["type"];
      auto add = [&](const json& v) {
        static const std::set<std::string> known{"null", "boolean", "object", "array", "number", "string", "integer"};
        if (!v.is_string() || !known.count(v.get<std::string>())) fail("type", ptr, "unknown type " + v.dump());
        types.insert(v.get<std::string>());
      };
      if (t.is_array()) {
        for (const auto& v : t) add(v);
      } else {
        add(t);
      }
    } else {
      types = {"null", "boolean", "object", "array", "number", "string"};
    }
    if (types.count("number")) types.erase("integer");
    return types;
  }

  // The values of `enum` / `const` (checked to stand alone); nullopt without either.
  std::optional<std::vector<json>> enumerated(const json& node, const std::string& ptr) {
    if (!node.contains("enum") && !node.contains("const")) return std::nullopt;
    only_with(node, ptr, node.contains("enum") ? "enum" : "const", {"enum", "const", "type", "$defs", "definitions", "$id"});
    if (node.contains("enum") && node.contains("const")) fail("const", ptr, "'const' beside 'enum' is not supported");
    std::vector<json> values;
    if (node.contains("const")) {
      values.push_back(node["const"]);
    } else {
      if (!node["enum"].is_array()) fail("enum", ptr, "'enum' must be an array");
      values.assign(node["enum"].begin(), node["enum"].end());
    }
    return values;
  }

  void emit(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr) {
    if (node.is_boolean()) {
      if (node.get<bool>()) b.call(from, to, any_rule());
      return;
    }
    if (follow(b, from, to, node, ptr, &compiler::rule_for)) return;
    const std::set<std::string> types = types_of(node, ptr);
    if (auto values = enumerated(node, ptr)) {
      for (const auto& v : *values) {
        const bool ok = (v.is_null() && types.count("null")) || (v.is_boolean() && types.count("boolean")) ||
                        (v.is_object() && types.count("object")) || (v.is_array() && types.count("array")) ||
                        (v.is_string() && types.count("string")) || (v.is_number() && types.count("number")) ||
                        (v.is_number() && types.count("integer") && (v.is_number_integer() || std::floor(v.get<double>()) == v.get<double>()));
        if (ok) value_text(b, from, to, v);
      }
      return;
    }
    for (const auto& t : types) {
      if (t == "null") b.literal(from, to, "null");
      else if (t == "boolean") {
        b.literal(from, to, "true");
        b.literal(from, to, "false");
      } else if (t == "integer") integer(b, from, to, node, ptr);
      else if (t == "number") {
        for (const char* kw : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
          if (node.contains(kw)) fail(kw, ptr, std::string("'") + kw + "' on numbers is not supported (bounds: only on integers)");
        number(b, from, to, false);
      } else if (t == "string") string(b, from, to, node, ptr);
      else if (t == "array") array(b, from, to, node, ptr);
      else object(b, from, to, node, ptr);
    }
  }

  // The string instances of `node` as raw text (a tool-call parameter written with
  // string="true"); nothing where it admits no string.
  void emit_raw(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr) {
    if (node.is_boolean()) {
      if (node.get<bool>()) {
        const auto body = b.add_state();
        b.epsilon(from, body);
        emit_code_points(b, body, body, any_code_point(), false);
        b.epsilon(body, to);
      }
      return;
    }
    if (follow(b, from, to, node, ptr, &compiler::raw_rule_for)) return;
    const std::set<std::string> types = types_of(node, ptr);
    if (auto values = enumerated(node, ptr)) {
      for (const auto& v : *values)
        if (v.is_string() && types.count("string")) b.literal(from, to, v.get<std::string>());
      return;
    }
    if (types.count("string")) string(b, from, to, node, ptr, true);
  }

  std::optional<double> num(const json& node, const std::string& ptr, const char* kw) {
    if (!node.contains(kw)) return std::nullopt;
    if (!node[kw].is_number()) fail(kw, ptr, std::string("'") + kw + "' must be a number");
    return node[kw].get<double>();
  }

  std::optional<std::uint32_t> count(const json& node, const std::string& ptr, const char* kw) {
    if (!node.contains(kw)) return std::nullopt;
    const json& v = node[kw];
    if (!v.is_number() || v.get<double>() < 0 || std::floor(v.get<double>()) != v.get<double>())
      fail(kw, ptr, std::string("'") + kw + "' must be a non-negative integer");
    if (v.get<double>() > lim_.max_repeat)
      fail(kw, ptr, std::string("'") + kw + "' above " + std::to_string(lim_.max_repeat) + " is not supported");
    return static_cast<std::uint32_t>(v.get<double>());
  }

  void integer(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr) {
    constexpr double big = 9.0e15;
    std::optional<std::int64_t> lo, hi;
    auto clamp = [&](const char* kw, double v) {
      if (std::fabs(v) > big) fail(kw, ptr, std::string("'") + kw + "' beyond +-9e15 is not supported");
      return static_cast<std::int64_t>(v);
    };
    if (auto v = num(node, ptr, "minimum")) lo = clamp("minimum", std::ceil(*v));
    if (auto v = num(node, ptr, "exclusiveMinimum")) {
      const auto x = clamp("exclusiveMinimum", std::floor(*v) + 1);
      lo = lo ? std::max(*lo, x) : x;
    }
    if (auto v = num(node, ptr, "maximum")) hi = clamp("maximum", std::floor(*v));
    if (auto v = num(node, ptr, "exclusiveMaximum")) {
      const auto x = clamp("exclusiveMaximum", std::ceil(*v) - 1);
      hi = hi ? std::min(*hi, x) : x;
    }
    if (!lo && !hi) {
      number(b, from, to, true);
      return;
    }
    if (lo && hi && *lo > *hi) return;  // no integer: this alternative accepts nothing
    integer_range(b).emit(from, to, lo, hi);
  }

  // A JSON string of `node`; with `raw`, its characters alone (no quotes, no escapes).
  void string(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr,
              bool raw = false) {
    const auto min_len = count(node, ptr, "minLength");
    const auto max_len = count(node, ptr, "maxLength");
    const bool lengths = min_len || max_len;
    std::optional<regex> re;
    if (node.contains("format")) {
      if (!node["format"].is_string()) fail("format", ptr, "'format' must be a string");
      const auto f = node["format"].get<std::string>();
      const auto it = formats().find(f);
      if (it == formats().end()) fail("format", ptr, "format '" + f + "' is not supported");
      if (node.contains("pattern") || lengths)
        fail("format", ptr, "'format' beside 'pattern', 'minLength' or 'maxLength' is not supported");
      re = std::get<regex>(regex::parse(it->second, false, lim_));
    }
    if (node.contains("pattern")) {
      if (!node["pattern"].is_string()) fail("pattern", ptr, "'pattern' must be a string");
      if (lengths) fail("pattern", ptr, "'pattern' beside 'minLength' or 'maxLength' is not supported");
      auto parsed = regex::parse(node["pattern"].get<std::string>(), true, lim_);
      if (auto* e = std::get_if<regex_error>(&parsed))
        fail("pattern", ptr, "pattern: " + e->message + " at offset " + std::to_string(e->offset));
      re = std::move(std::get<regex>(parsed));
    }
    if (!re && !raw && max_len) {
      b.call(from, to, bounded_string(min_len.value_or(0), *max_len, false, "\"", "\"", ptr));
      return;
    }
    const auto body = b.add_state(), end = b.add_state();
    if (raw) {
      b.epsilon(from, body);
      b.epsilon(end, to);
    } else {
      b.byte(from, body, '"');
      b.byte(end, to, '"');
    }
    if (re) {
      try {
        re->emit(b, body, end, !raw);
      } catch (const build_error& e) {
        fail(node.contains("pattern") ? "pattern" : "format", ptr, e.message);
      }
      return;
    }
    // Each counted character is a copy of one character's small DFA (code_point()).
    const rule& one = code_point(raw);
    std::uint32_t cur = body;
    const std::uint32_t lo = min_len.value_or(0);
    for (std::uint32_t i = 0; i < lo; ++i) {
      const auto nxt = b.add_state();
      b.paste(cur, nxt, one);
      cur = nxt;
    }
    if (!max_len) {
      b.paste(cur, cur, one);
      b.epsilon(cur, end);
      return;
    }
    for (std::uint32_t i = lo; i < *max_len; ++i) {
      b.epsilon(cur, end);
      const auto nxt = b.add_state();
      b.paste(cur, nxt, one);
      cur = nxt;
    }
    if (lo <= *max_len) b.epsilon(cur, end);
  }

  // {minLength (or 0), maxLength} when `node` is `"type": "string"` with a maxLength and no other
  // assertion.
  std::optional<std::pair<std::uint32_t, std::uint32_t>> length_bounds_only(const json& node, const std::string& ptr) {
    if (!node.is_object() || node.value("type", json()) != "string" || !node.contains("maxLength")) return std::nullopt;
    for (auto it = node.begin(); it != node.end(); ++it)
      if (!annotations().count(it.key()) && it.key() != "type" && it.key() != "minLength" && it.key() != "maxLength")
        return std::nullopt;
    return std::make_pair(count(node, ptr, "minLength").value_or(0), *count(node, ptr, "maxLength"));
  }

  // Strings of lo..hi characters between `open` and `close` (a JSON string's quotes, or nothing
  // and a tool call's closing tag after raw text), as a rule built directly rather than through
  // the subset construction (which builds the same automaton, a thousand states for a maxLength
  // of 40, and was most of the compile time of a schema with one). Shared by the strings of the
  // same bounds and ends.
  std::uint32_t bounded_string(std::uint32_t lo, std::uint32_t hi, bool raw, const std::string& open,
                               const std::string& close, const std::string& ptr) {
    const auto key = std::make_tuple(lo, hi, raw, open, close);
    if (auto it = bounded_.find(key); it != bounded_.end()) return it->second;
    rule r;
    try {
      r = enclosed(open, characters(lo, hi, raw), close,
                   (raw ? "text of " : "string of ") + std::to_string(lo) + ".." + std::to_string(hi) + " characters",
                   lim_.max_rule_states);
    } catch (const build_error&) {
      fail("maxLength", ptr, "'maxLength' " + std::to_string(hi) + " needs more than " +
                                 std::to_string(lim_.max_rule_states) + " automaton states");
    }
    const auto id = static_cast<std::uint32_t>(g_.rules.size());
    add_states(r.size());
    g_.rules.push_back(std::move(r));
    bounded_[key] = id;
    return id;
  }
  // lo..hi characters (code_point(raw) each) as a call-free rule: state (k, s) has read k
  // characters and is in state s of code_point(raw) within the next; it accepts at (k >= lo, 0).
  rule characters(std::uint32_t lo, std::uint32_t hi, bool raw) const {
    const rule& one = code_point(raw);
    // one's states but its accepting ones (which end a character and have no byte edge).
    std::vector<std::int32_t> inner(one.size(), -1);
    std::uint32_t m = 0;
    for (std::uint32_t q = 0; q < one.size(); ++q)
      if (!one.accepting[q]) inner[q] = static_cast<std::int32_t>(m++);
    // (k, s) is k * m + inner[s]; for k = hi only s = 0 (the start of one).
    const std::uint64_t states = std::uint64_t{hi} * m + 1;
    if (states > lim_.max_rule_states) throw build_error{"too many states"};
    const auto n = static_cast<std::uint32_t>(states);
    rule r;
    r.byte_class = one.byte_class;
    r.classes = one.classes;
    r.next.assign(std::size_t{n} * r.classes, no_state);
    r.calls.resize(n);
    r.accepting.assign(n, 0);
    r.has_bytes.assign(n, 0);
    auto id = [&](std::uint32_t k, std::uint32_t q) { return static_cast<std::int32_t>(k * m + static_cast<std::uint32_t>(inner[q])); };
    for (std::uint32_t k = 0; k <= hi; ++k)
      for (std::uint32_t q = 0; q < one.size(); ++q) {
        if (inner[q] < 0 || (k == hi && q != 0)) continue;
        const auto at = static_cast<std::uint32_t>(id(k, q));
        if (q == 0 && k >= lo) r.accepting[at] = 1;
        if (k == hi) continue;
        std::int32_t* row = r.next.data() + std::size_t{at} * r.classes;
        for (std::uint32_t c = 0; c < one.classes; ++c) {
          const auto t = one.next[q * one.classes + c];
          if (t == no_state) continue;
          row[c] = one.accepting[static_cast<std::uint32_t>(t)] ? id(k + 1, 0) : id(k, static_cast<std::uint32_t>(t));
          r.has_bytes[at] = 1;
        }
      }
    return r;
  }

  // One character of a JSON string's inside (canonical escapes), or of raw text, as a DFA.
  // The same for every schema: built once per process.
  static const rule& code_point(bool raw) {
    static const rule dfa[2] = {character(false), character(true)};
    return dfa[raw ? 1 : 0];
  }
  static rule character(bool raw) {
    nfa_builder one;
    const auto s = one.add_state(), a = one.add_state();
    emit_code_points(one, s, a, any_code_point(), !raw);
    return one.determinize(s, a, raw ? "character" : "string character", limits{});
  }

  void array(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr) {
    if (node.contains("uniqueItems") && node["uniqueItems"] == true)
      fail("uniqueItems", ptr, "'uniqueItems: true' is not supported");
    const std::uint32_t lo = count(node, ptr, "minItems").value_or(0);
    const auto hi = count(node, ptr, "maxItems");
    std::vector<std::uint32_t> prefix;
    if (node.contains("prefixItems")) {
      const json& p = node["prefixItems"];
      if (!p.is_array()) fail("prefixItems", ptr, "'prefixItems' must be an array");
      for (std::size_t i = 0; i < p.size(); ++i)
        prefix.push_back(rule_for(child(ptr, "prefixItems") + "/" + std::to_string(i), p[i]));
    }
    std::optional<std::uint32_t> items;  // none: no items past the prefix
    if (!node.contains("items")) items = any_rule();
    else if (node["items"].is_boolean()) {
      if (node["items"].get<bool>()) items = any_rule();
    } else {
      items = rule_for(child(ptr, "items"), node["items"]);
    }
    // c[i]: after i elements. Bounded: states up to the bound; unbounded: up to
    // U = max(minItems, prefix, 1), then ", " item repeated.
    const bool unbounded = !hi && items;
    std::uint32_t max_n = hi ? *hi : static_cast<std::uint32_t>(prefix.size());
    if (!items) max_n = std::min<std::uint32_t>(max_n, static_cast<std::uint32_t>(prefix.size()));
    if (!unbounded && max_n < lo) return;
    const std::uint32_t u =
        unbounded ? std::max<std::uint32_t>({lo, static_cast<std::uint32_t>(prefix.size()), 1}) : max_n;
    std::vector<std::uint32_t> c{b.add_state()};
    open(b, from, c[0], '[');
    for (std::uint32_t i = 0; i < u; ++i) {
      std::uint32_t elem_from = c[i];
      if (i > 0) {
        elem_from = b.add_state();
        separator(b, c[i], elem_from, ',');
      }
      c.push_back(b.add_state());
      b.call(elem_from, c[i + 1], i < prefix.size() ? prefix[i] : *items);
    }
    for (std::uint32_t i = lo; i <= u; ++i) {
      if (i == 0) b.byte(c[i], to, ']');
      else close(b, c[i], to, ']');
    }
    if (unbounded) {
      const auto sep = b.add_state();
      separator(b, c[u], sep, ',');
      b.call(sep, c[u], *items);
    }
  }

  void object(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr) {
    struct member {
      std::string name;
      std::uint32_t rule;
      bool required;
      bool forbidden;
    };
    std::vector<member> members;
    std::set<std::string> required;
    if (node.contains("required")) {
      if (!node["required"].is_array()) fail("required", ptr, "'required' must be an array");
      for (const auto& r : node["required"]) {
        if (!r.is_string()) fail("required", ptr, "'required' must hold strings");
        required.insert(r.get<std::string>());
      }
    }
    std::set<std::string> declared;
    if (node.contains("properties")) {
      const json& props = node["properties"];
      if (!props.is_object()) fail("properties", ptr, "'properties' must be an object");
      for (auto it = props.begin(); it != props.end(); ++it) {
        declared.insert(it.key());
        const bool forbidden = it.value().is_boolean() && !it.value().get<bool>();
        members.push_back({it.key(), forbidden ? 0 : rule_for(child(child(ptr, "properties"), it.key()), it.value()),
                           required.count(it.key()) > 0, forbidden});
      }
    }
    // additionalProperties: absent or true = any value; false = none; a schema.
    std::optional<std::uint32_t> extra;
    if (!node.contains("additionalProperties")) extra = any_rule();
    else if (node["additionalProperties"].is_boolean()) {
      if (node["additionalProperties"].get<bool>()) extra = any_rule();
    } else {
      extra = rule_for(child(ptr, "additionalProperties"), node["additionalProperties"]);
    }
    for (const auto& r : node.value("required", json::array())) {
      const auto name = r.get<std::string>();
      if (declared.count(name)) continue;
      if (!extra) return;  // required but not allowed: no instance
      declared.insert(name);
      members.push_back({name, *extra, true, false});
    }
    for (const auto& m : members)
      if (m.forbidden && m.required) return;  // a required property that must not exist
    if (style_.any_order) return any_order_object(b, from, to, members, extra, declared, ptr);
    // States j[i][f]: before member i, f = no member written yet.
    const std::size_t n = members.size();
    std::vector<std::array<std::uint32_t, 2>> j(n + 1);
    for (auto& s : j) s = {b.add_state(), b.add_state()};
    open(b, from, j[0][1], '{');
    for (std::size_t i = 0; i < n; ++i) {
      const auto& m = members[i];
      for (int f = 0; f < 2; ++f) {
        if (!m.required) b.epsilon(j[i][f], j[i + 1][f]);
        if (m.forbidden) continue;
        const auto k = f ? j[i][f] : b.add_state(), name = b.add_state(), v = b.add_state();
        if (!f) separator(b, j[i][f], k, ',');
        std::string key;
        escape_string_into(key, m.name);
        b.literal(k, name, key);
        separator(b, name, v, ':');
        b.call(v, j[i + 1][0], m.rule);
      }
    }
    if (extra) {
      // Additional members: keys other than the declared names, after them.
      const auto key_rule = extra_key_rule(declared, ptr);
      for (int f = 0; f < 2; ++f) {
        auto k = b.add_state(), colon = b.add_state(), v = b.add_state();
        if (f) b.epsilon(j[n][f], k);
        else separator(b, j[n][f], k, ',');
        b.call(k, colon, key_rule);
        separator(b, colon, v, ':');
        b.call(v, j[n][0], *extra);
      }
    }
    close(b, j[n][0], to, '}');
    b.byte(j[n][1], to, '}');
  }

  // any_order: entries of any permitted member in any order, at least as many as the required
  // members. c[k]: k entries written (the last one: at least max(required, 1)).
  template <class Member>
  void any_order_object(nfa_builder& b, std::uint32_t from, std::uint32_t to, const std::vector<Member>& members,
                        const std::optional<std::uint32_t>& extra, const std::set<std::string>& declared,
                        const std::string& ptr) {
    std::size_t required = 0;
    for (const auto& m : members) required += m.required;
    const std::size_t top = std::max<std::size_t>(required, 1);
    if (top > lim_.max_repeat) fail("required", ptr, "more than " + std::to_string(lim_.max_repeat) + " required properties");
    std::vector<std::uint32_t> c(top + 1);
    for (auto& s : c) s = b.add_state();
    open(b, from, c[0], '{');
    const std::optional<std::uint32_t> key_rule =
        extra ? std::optional<std::uint32_t>(extra_key_rule(declared, ptr)) : std::nullopt;
    for (std::size_t k = 0; k <= top; ++k) {
      const auto next = c[std::min(k + 1, top)];
      const auto entry = k ? b.add_state() : c[0];
      if (k) separator(b, c[k], entry, ',');
      for (const auto& m : members) {
        if (m.forbidden) continue;
        std::string key;
        escape_string_into(key, m.name);
        const auto name = b.add_state(), v = b.add_state();
        b.literal(entry, name, key);
        separator(b, name, v, ':');
        b.call(v, next, m.rule);
      }
      if (key_rule) {
        const auto colon = b.add_state(), v = b.add_state();
        b.call(entry, colon, *key_rule);
        separator(b, colon, v, ':');
        b.call(v, next, *extra);
      }
    }
    if (required == 0) b.byte(c[0], to, '}');
    close(b, c[top], to, '}');
  }

  std::uint32_t extra_key_rule(const std::set<std::string>& declared, const std::string& ptr) {
    if (declared.empty()) return string_rule();
    const auto id = static_cast<std::uint32_t>(g_.rules.size());
    g_.rules.emplace_back();
    nfa_builder b;
    const auto s = b.add_state(), a = b.add_state();
    any_string(b, s, a);
    try {
      const rule any = b.determinize(s, a, "#" + ptr + "/additional-key", lim_);
      std::vector<std::string> words;
      for (const auto& d : declared) {
        std::string w;
        escape_string_into(w, d);
        words.push_back(w);
      }
      g_.rules[id] = without_words(any, words, lim_.max_rule_states);
    } catch (const build_error& e) {
      fail("properties", ptr, e.message);
    }
    add_states(g_.rules[id].size());
    return id;
  }

  const json& root_;
  limits lim_;
  json_style style_;
  grammar& g_;
  std::map<std::string, std::uint32_t> memo_, raw_memo_;
  std::optional<std::uint32_t> any_rule_, string_rule_;
  std::map<std::tuple<std::uint32_t, std::uint32_t, bool, std::string, std::string>, std::uint32_t> bounded_;
  int depth_ = 0;
  std::size_t total_ = 0;
};

namespace {


}  // namespace

std::string canonical_json(const nlohmann::json& value, json_style style) {
  std::string out;
  canonical_into(out, value, style);
  return out;
}

std::size_t json_nesting(std::string_view s) {
  std::size_t depth = 0, max = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max = std::max(max, ++depth);
    } else if ((c == '}' || c == ']') && depth) {
      --depth;
    }
  }
  return max;
}

std::string json_pointer_child(std::string_view pointer, std::string_view key) {
  return std::string(pointer) + "/" + escape_pointer_token(std::string(key));
}

schema_rules::schema_rules(const json& root, grammar& g, const limits& lim, json_style style)
    : c_(std::make_unique<compiler>(root, g, lim, style)) {}
schema_rules::~schema_rules() = default;

std::variant<std::uint32_t, schema_error> schema_rules::value(const json& node, const std::string& pointer) {
  try {
    return c_->rule_for(pointer, node);
  } catch (const failure& f) {
    return f.e;
  }
}

std::optional<schema_error> schema_rules::emit_raw_string(nfa_builder& b, std::uint32_t from, std::uint32_t to,
                                                          const json& node, const std::string& pointer,
                                                          const std::string& then) {
  try {
    c_->raw_into(b, from, to, pointer, node, then);
    return std::nullopt;
  } catch (const failure& f) {
    return f.e;
  }
}

std::variant<grammar, schema_error> compile_json_schema(const json& schema, const limits& lim, json_style style) {
  try {
    grammar g;
    g.root = schema_rules::compiler(schema, g, lim, style).rule_for("", schema);
    if (auto r = left_recursive_rule(g); !r.empty())
      return schema_error{"$ref", r.substr(1), "recursion that consumes no output (left recursion) through " + r};
    if (!prune(g)) return schema_error{"", "", "the schema accepts no JSON value"};
    return g;
  } catch (const failure& f) {
    return f.e;
  }
}

std::variant<grammar, schema_error> compile_json_schema(std::string_view text, const limits& lim, json_style style) {
  if (json_nesting(text) > 128) return schema_error{"", "", "the schema is nested more than 128 levels deep"};
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return schema_error{"", "", "the schema is not valid JSON"};
  return compile_json_schema(j, lim, style);
}

std::variant<json_style, std::string> whitespace_style(std::string_view pattern) {
  // Whitespace needs a few states; the bound keeps this compile microseconds long on any input
  // (request parsing checks the pattern on the HTTP thread) and the copies pasted around every
  // separator small.
  limits lim;
  lim.max_rule_states = lim.max_total_states = lim.max_repeat = 64;
  lim.max_subset_work = 100000;
  auto r = compile_regex(pattern, lim);
  if (auto* e = std::get_if<regex_error>(&r)) return e->message + " at offset " + std::to_string(e->offset);
  grammar& g = std::get<grammar>(r);
  const rule& dfa = g.rules[g.root];
  for (std::uint32_t s = 0; s < dfa.size(); ++s)
    for (unsigned c = 0; c < 256; ++c)
      if (dfa.step(s, static_cast<unsigned char>(c)) != no_state && c != ' ' && c != '\t' && c != '\n' && c != '\r')
        return "the pattern matches text other than JSON whitespace (space, tab, line feed, carriage return; "
               "'\\s' also matches other spaces: write '[ \\t\\n\\r]')";
  json_style style;
  style.whitespace = std::make_shared<const rule>(dfa);
  return style;
}

grammar any_json_object(json_style style) {
  return std::get<grammar>(compile_json_schema(json{{"type", "object"}}, {}, style));
}

}  // namespace troupe::recipe::grammar
