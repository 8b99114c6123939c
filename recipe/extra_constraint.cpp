// Other servers' structured-output request fields (request_json.hpp, parse_extra_constraint).
#include "recipe/request_json.hpp"

#include <cctype>

#include "recipe/grammar/json_schema.hpp"
#include "recipe/grammar/lark.hpp"

namespace troupe::recipe::detail {

namespace {

/// `text` as a regex that matches exactly it: every ASCII character other than a letter, a
/// digit, a space or a control is escaped (the regex engine reads `\` + punctuation as the
/// character itself).
std::string literal_pattern(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && u > 0x20 && u != 0x7f && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

/// A JSON schema given as an object or as JSON text (vLLM accepts both), as compact text.
std::string schema_text(const ojson& j, const std::string& param) {
  if (j.is_object()) return j.dump();
  if (!j.is_string()) fail("Invalid type for '" + param + "': expected an object or a string, got " + j.type_name() + ".", param);
  ojson parsed = ojson::parse(j.get<std::string>(), nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object())
    fail("Invalid value for '" + param + "': the string is not a JSON schema (a JSON object).", param);
  return parsed.dump();
}

struct found {
  response_format format;
  std::string param;
};

/// The constraint of one field `key` (at `param`), by the field's kind.
found read_field(const std::string& kind, const ojson& v, const std::string& param) {
  found f;
  f.param = param;
  if (kind == "json") {
    f.format.type = response_format::kind::json_schema;
    f.format.schema_json = schema_text(v, param);
  } else if (kind == "regex") {
    f.format.type = response_format::kind::regex;
    f.format.regex = need_string(v, param);
  } else if (kind == "grammar") {  // vLLM detects Lark the same way
    f.format = grammar_format(need_string(v, param), nullptr, {});
  } else if (kind == "ebnf") {  // SGLang's: GBNF
    f.format.type = response_format::kind::grammar;
    f.format.grammar = need_string(v, param);
  } else if (kind == "structural_tag") {
    f.format = structural_tag_format(v, param);
  } else if (kind == "choice") {
    if (!v.is_array() || v.empty())
      fail("Invalid value for '" + param + "': expected a non-empty array of strings.", param);
    std::string pattern;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i > 0) pattern += '|';
      pattern += literal_pattern(need_string(v[i], param + "[" + std::to_string(i) + "]"));
    }
    f.format.type = response_format::kind::regex;
    f.format.regex = "(" + pattern + ")";
  } else {  // json_object
    f.format.type = response_format::kind::json_object;
  }
  return f;
}

}  // namespace

response_format grammar_format(const std::string& text, const ojson* syntax, const std::string& syntax_param) {
  response_format f;
  f.type = response_format::kind::grammar;
  f.grammar = text;
  bool lark = grammar::looks_like_lark(text);
  if (syntax && !syntax->is_null()) {
    const std::string s = need_string(*syntax, syntax_param);
    if (s != "lark" && s != "gbnf")
      fail("Invalid value for '" + syntax_param + "': '" + s + "'. Supported values are 'lark' and 'gbnf'.",
           syntax_param);
    lark = s == "lark";
  }
  f.syntax = lark ? response_format::grammar_syntax::lark : response_format::grammar_syntax::gbnf;
  return f;
}

response_format structural_tag_format(const ojson& v, const std::string& param) {
  response_format f;
  f.type = response_format::kind::structural_tag;
  if (v.is_object()) {
    f.structural_tag = v.dump();
    return f;
  }
  if (!v.is_string())
    fail("Invalid type for '" + param + "': expected an object or a string, got " + v.type_name() + ".", param);
  const ojson parsed = ojson::parse(v.get<std::string>(), nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object())
    fail("Invalid value for '" + param + "': the string is not a structural tag (a JSON object).", param);
  f.structural_tag = parsed.dump();
  return f;
}

void parse_extra_constraint(const ojson& body, conversation& conv, const std::string& format_param,
                            sampling_params& sp) {
  std::vector<found> all;
  bool compact = false;
  std::optional<std::string> whitespace;
  std::string whitespace_param;
  auto read_whitespace = [&](const ojson& v, const std::string& param) {
    if (whitespace)
      fail("'" + param + "' cannot be combined with '" + whitespace_param + "'; give one of them.", param);
    whitespace = need_string(v, param);
    whitespace_param = param;
    const auto style = grammar::whitespace_style(*whitespace);
    if (auto* e = std::get_if<std::string>(&style))
      fail("Invalid value for '" + param + "': " + *e + ".", param);
  };
  if (const ojson* so = find(body, "structured_outputs")) {
    if (!so->is_object())
      fail(std::string("Invalid type for 'structured_outputs': expected an object, got ") + so->type_name() + ".",
           "structured_outputs");
    for (const auto& [key, v] : so->items()) {
      const std::string param = "structured_outputs." + key;
      if (v.is_null()) continue;
      if (key == "json" || key == "regex" || key == "grammar" || key == "choice" || key == "structural_tag") {
        all.push_back(read_field(key, v, param));
      } else if (key == "json_object") {
        if (need_bool(v, param)) all.push_back(read_field(key, v, param));
      } else if (key == "disable_fallback") {
        need_bool(v, param);  // there is no fallback: a constraint compiles or is refused
      } else if (key == "disable_any_whitespace") {
        compact = need_bool(v, param);  // JSON constraints only, as in vLLM
      } else if (key == "whitespace_pattern") {
        read_whitespace(v, param);  // JSON constraints only, as in vLLM
      } else {
        fail("Unsupported parameter: '" + param + "'. Supported are 'json', 'regex', 'choice', 'grammar', "
             "'json_object', 'structural_tag', 'disable_any_whitespace' and 'whitespace_pattern'.",
             param);
      }
    }
  }
  if (const ojson* v = find(body, "guided_whitespace_pattern"); v && !v->is_null())
    read_whitespace(*v, "guided_whitespace_pattern");
  if (compact && whitespace)
    fail("'" + whitespace_param + "' cannot be combined with 'structured_outputs.disable_any_whitespace'; give one "
         "of them.",
         whitespace_param);
  static const std::pair<const char*, const char*> singles[] = {
      {"guided_json", "json"},   {"guided_regex", "regex"}, {"guided_choice", "choice"},
      {"guided_grammar", "grammar"}, {"regex", "regex"},     {"ebnf", "ebnf"}};
  for (const auto& [key, kind] : singles)
    if (const ojson* v = find(body, key)) all.push_back(read_field(kind, *v, key));
  // `disable_any_whitespace` makes JSON output compact, `whitespace_pattern` spaces it: the
  // constraint's, or the request's response format's when that is JSON.
  conv.format.compact = compact;
  conv.format.whitespace_pattern = whitespace;
  for (auto& f : all) {
    f.format.compact = compact;
    f.format.whitespace_pattern = whitespace;
  }
  if (all.empty()) return;
  if (all.size() > 1)
    fail("Only one structured output constraint may be given; this request has '" + all[0].param + "' and '" +
             all[1].param + "'.",
         all[1].param);
  if (conv.format.type != response_format::kind::text)
    fail("'" + all[0].param + "' cannot be combined with '" + format_param + "'; give one of them.", all[0].param);
  sp.extra_constraint = std::move(all[0].format);
  sp.extra_constraint_param = std::move(all[0].param);
}

}  // namespace troupe::recipe::detail
