// Shared by the recipe tests: the shipped DeepSeek-V4 tokenizer (loaded once) and the reading
// of the gzip-compressed golden files under tests/recipe/golden/.
#pragma once

#include "recipe/tokenizer.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <array>
#include <sstream>
#include <string>
#include <vector>

namespace troupe::recipe::testing {

/// The shipped DeepSeek-V4 tokenizer.
inline const tokenizer& v4() {
  static const tokenizer t = tokenizer::from_file(std::string(TROUPE_SOURCE_DIR)
                                                  + "/recipe/data/deepseek-v4/tokenizer.json.gz");
  return t;
}

/// The path of a golden file, e.g. golden_path("prompts.v4.jsonl.gz").
inline std::string golden_path(const std::string& name) {
  return std::string(TROUPE_SOURCE_DIR) + "/tests/recipe/golden/" + name;
}

/// The decompressed contents of a gzip file (fails the test if it cannot be opened).
inline std::string gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  REQUIRE_MESSAGE(f != nullptr, "cannot open ", path);
  std::string out;
  std::array<char, 1 << 16> buf{};
  int n = 0;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0)
    out.append(buf.data(), static_cast<std::size_t>(n));
  gzclose(f);
  return out;
}

/// Every non-empty line of a gzip-compressed JSON-lines file, parsed (key order kept).
inline std::vector<nlohmann::ordered_json> json_records(const std::string& path) {
  std::vector<nlohmann::ordered_json> out;
  std::istringstream in(gunzip(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty())
      out.push_back(nlohmann::ordered_json::parse(line));
  return out;
}

} // namespace troupe::recipe::testing
