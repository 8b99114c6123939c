// api_keys: the API keys an HTTP entrypoint accepts, read from a file, and the check of a key.
//
// A server that is reachable by more than its operator needs a shared secret per client. The
// entrypoint takes a set of keys (empty = open to everyone); operators keep them in a file, one
// key per line, so that rotating a key is editing a line. This header reads that file and
// compares a presented key with the set without leaking, through timing, how much of a key
// matched.
#pragma once

#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <variant>

namespace troupe::actors {

/// Why a keys file could not be used: the message names the file and the reason.
struct api_keys_error {
  std::string message;
};

/// Reads an API keys file: one key per line; surrounding spaces and tabs are trimmed; empty
/// lines and lines whose first non-blank character is `#` are skipped (comments). Returns the
/// keys, or an api_keys_error when the file cannot be opened or read, is not a regular file, or
/// a line holds a key with inner whitespace or control characters (the message names the line).
/// A file with no key gives an empty set: callers decide whether that means "open".
std::variant<std::set<std::string>, api_keys_error>
load_api_keys(const std::filesystem::path& file);

/// True when `presented` equals one of `keys`; compares against every key in time that depends
/// only on the lengths, not on where the first difference is. An empty `keys` accepts nothing
/// (the caller checks "open" first).
bool api_key_matches(const std::set<std::string>& keys, std::string_view presented) noexcept;

} // namespace troupe::actors
