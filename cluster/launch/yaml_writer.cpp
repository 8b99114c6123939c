// A small block-style YAML writer for JSON values (see yaml_writer.hpp).
#include "cluster/launch/yaml_writer.hpp"

#include <array>
#include <cctype>
#include <string_view>

namespace troupe::cluster {
namespace {

using json = nlohmann::ordered_json;

bool is_plain_char(char c) {
  auto u = static_cast<unsigned char>(c);
  return std::isalnum(u) || c == '-' || c == '_' || c == '.' || c == '/';
}

// Words that YAML 1.1 reads as booleans or null (any case).
bool is_reserved_word(std::string_view s) {
  static constexpr std::array<std::string_view, 12> words{
    "y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf", "~"};
  std::string lower;
  for (char c : s)
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (auto w : words)
    if (lower == w)
      return true;
  return false;
}

// True when the string, written plain, reads back as the same string in YAML 1.1 and 1.2:
// letters, digits and -_./ only, starting with a letter, '/' or "--" and a letter (a command
// line option), not a reserved word. Since no digit, sign or dot may lead, no number (nor
// YAML 1.1 sexagesimal or timestamp) can be written plain.
bool plain_safe(std::string_view s) {
  if (s.empty())
    return false;
  if (s.size() > 2 && s.substr(0, 2) == "--")
    s.remove_prefix(2);
  auto first = static_cast<unsigned char>(s.front());
  if (!std::isalpha(first) && s.front() != '/')
    return false;
  for (char c : s)
    if (!is_plain_char(c))
      return false;
  return !is_reserved_word(s);
}

// True when `s` can be a literal block scalar that keeps its bytes: printable ASCII or UTF-8,
// tabs and newlines only, at least one newline, ending with a newline, not starting with a
// space or newline (which would need an indentation indicator).
bool literal_block_safe(std::string_view s) {
  if (s.size() < 2 || s.back() != '\n' || s.front() == ' ' || s.front() == '\n')
    return false;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 && c != '\n' && c != '\t')
      return false;
    if (u == 0x7f)
      return false;
  }
  return true;
}

void write_string(std::string& out, const std::string& s, int indent) {
  if (plain_safe(s)) {
    out += s;
    return;
  }
  if (literal_block_safe(s)) {
    // `|` keeps one final newline, `|+` keeps all of them.
    bool several = s.size() >= 2 && s[s.size() - 2] == '\n';
    out += several ? "|+" : "|";
    out += '\n';
    std::string pad(static_cast<std::size_t>(indent), ' ');
    std::size_t start = 0;
    while (start < s.size()) {
      auto end = s.find('\n', start);
      std::string_view line(s.data() + start, end - start);
      if (!line.empty()) {
        out += pad;
        out += line;
      }
      out += '\n';
      start = end + 1;
    }
    out.pop_back(); // the caller ends the line
    return;
  }
  out += json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

bool is_collection(const json& v) {
  return (v.is_object() || v.is_array()) && !v.empty();
}

void write_scalar(std::string& out, const json& v, int indent) {
  if (v.is_string())
    write_string(out, v.get_ref<const std::string&>(), indent);
  else if (v.is_object())
    out += "{}";
  else if (v.is_array())
    out += "[]";
  else
    out += v.dump();
}

void write_node(std::string& out, const json& v, int indent);

// Writes the entries of a non-empty map, each on its own line at `indent`; the first line's
// indentation is already written by the caller when `first_inline`.
void write_map(std::string& out, const json& v, int indent, bool first_inline) {
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!(first && first_inline))
      out.append(static_cast<std::size_t>(indent), ' ');
    first = false;
    write_string(out, it.key(), indent + 2);
    out += ':';
    if (is_collection(it.value())) {
      out += '\n';
      // Sequences under a key sit at the key's indentation (kubectl's style).
      write_node(out, it.value(), it.value().is_array() ? indent : indent + 2);
    } else {
      out += ' ';
      write_scalar(out, it.value(), indent + 2);
      out += '\n';
    }
  }
}

void write_seq(std::string& out, const json& v, int indent) {
  for (const auto& item : v) {
    out.append(static_cast<std::size_t>(indent), ' ');
    out += "- ";
    if (item.is_object() && !item.empty()) {
      write_map(out, item, indent + 2, true);
    } else if (item.is_array() && !item.empty()) {
      out += '\n';
      write_seq(out, item, indent + 2);
    } else {
      write_scalar(out, item, indent + 2);
      out += '\n';
    }
  }
}

void write_node(std::string& out, const json& v, int indent) {
  if (v.is_object() && !v.empty())
    write_map(out, v, indent, false);
  else if (v.is_array() && !v.empty())
    write_seq(out, v, indent);
  else {
    out.append(static_cast<std::size_t>(indent), ' ');
    write_scalar(out, v, indent + 2);
    out += '\n';
  }
}

} // namespace

std::string to_yaml(const json& value) {
  std::string out;
  write_node(out, value, 0);
  return out;
}

} // namespace troupe::cluster
