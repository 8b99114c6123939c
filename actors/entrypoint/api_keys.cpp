// API keys file and key comparison (see api_keys.hpp).
#include "actors/entrypoint/api_keys.hpp"

#include <fstream>
#include <system_error>

namespace troupe::actors {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

bool valid_key_char(unsigned char c) {
  return c > 0x20 && c != 0x7f;
}

} // namespace

std::variant<std::set<std::string>, api_keys_error>
load_api_keys(const std::filesystem::path& file) {
  const std::string name = file.string();
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (ec || !std::filesystem::exists(status))
    return api_keys_error{"cannot read API keys file " + name + ": no such file"};
  if (!std::filesystem::is_regular_file(status))
    return api_keys_error{"cannot read API keys file " + name + ": not a regular file"};
  std::ifstream in(file, std::ios::binary);
  if (!in)
    return api_keys_error{"cannot read API keys file " + name + ": cannot open it (permissions?)"};
  std::set<std::string> keys;
  std::string line;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string_view key = trim(line);
    if (key.empty() || key.front() == '#')
      continue;
    for (const char c : key)
      if (!valid_key_char(static_cast<unsigned char>(c)))
        return api_keys_error{name + ":" + std::to_string(number)
                              + ": a key may not contain whitespace or control characters"};
    keys.emplace(key);
  }
  if (in.bad())
    return api_keys_error{"cannot read API keys file " + name + ": read error"};
  return keys;
}

bool api_key_matches(const std::set<std::string>& keys, std::string_view presented) noexcept {
  bool found = false;
  for (const auto& key : keys) {
    unsigned diff = key.size() == presented.size() ? 0u : 1u;
    const std::size_t n = key.size() < presented.size() ? key.size() : presented.size();
    for (std::size_t i = 0; i < n; ++i)
      diff |= static_cast<unsigned char>(key[i]) ^ static_cast<unsigned char>(presented[i]);
    found = found || diff == 0;
  }
  return found;
}

} // namespace troupe::actors
