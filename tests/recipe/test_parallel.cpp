// Parallel tokenization: the safe cut rule holds on the parity corpus (tokenizing the two sides
// apart gives the same ids), and the pooled encoders equal the sequential ones for long texts and
// for every Chat Completions golden prompt, cut into many small pieces.
#include "recipe/chat_completions.hpp"
#include "recipe/parallel.hpp"
#include "recipe/prompt.hpp"
#include "recipe/tokenizer.hpp"
#include "recipe_fixture.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace troupe::recipe;

namespace {
using testing::v4;

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> records = [] {
    std::vector<std::string> out;
    std::istringstream in(testing::gunzip(testing::golden_path("corpus.jsonl.gz")));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
    return out;
  }();
  return records;
}

std::vector<token_id> concat(std::vector<token_id> a, const std::vector<token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
}  // namespace

TEST_CASE("thread pool: every index runs exactly once") {
  for (unsigned threads : {1u, 2u, 3u, 5u}) {
    thread_pool pool(threads);
    CHECK(pool.size() == threads);
    for (std::size_t n : {0u, 1u, 2u, 7u, 1000u}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](std::size_t i) { hits[i].fetch_add(1); });
      for (std::size_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
    }
  }
}

TEST_CASE("parallel: safe cuts do not change the ids (parity corpus, random cuts)") {
  std::mt19937_64 rng(5);
  std::size_t checked = 0, unsafe_differ = 0;
  for (const auto& r : corpus()) {
    std::vector<std::size_t> safe;
    for (std::size_t i = 1; i < r.size(); ++i)
      if (is_safe_cut(r, i)) safe.push_back(i);
    if (r.size() < 2) continue;
    const auto whole = v4().encode(r, encode_mode::raw);
    for (int k = 0; k < 2 && !safe.empty(); ++k) {
      const std::size_t i = safe[rng() % safe.size()];
      const auto split = concat(v4().encode(std::string_view(r).substr(0, i), encode_mode::raw),
                                v4().encode(std::string_view(r).substr(i), encode_mode::raw));
      REQUIRE_MESSAGE(split == whole, "cut at ", i, " of ", r.substr(i > 20 ? i - 20 : 0, 40));
      ++checked;
    }
    // A cut anywhere else is often not safe: the test can tell.
    const std::size_t j = 1 + rng() % (r.size() - 1);
    if (!is_safe_cut(r, j)
        && concat(v4().encode(std::string_view(r).substr(0, j), encode_mode::raw),
                  v4().encode(std::string_view(r).substr(j), encode_mode::raw)) != whole)
      ++unsafe_differ;
  }
  MESSAGE("safe cuts checked: ", checked, "; random other cuts that change the ids: ", unsafe_differ);
  CHECK(checked > 5000);
  CHECK(unsafe_differ > 1000);
}

TEST_CASE("parallel: encode_parallel equals encode on long texts") {
  thread_pool pool(3);
  parallel_options small;
  small.min_piece_bytes = 512;  // many pieces
  std::mt19937_64 rng(7);
  const auto& c = corpus();
  for (std::size_t start = 0; start < c.size(); start += 400) {
    std::string text;
    for (std::size_t i = start; i < std::min(c.size(), start + 400); ++i) text += c[i] + "\n";
    CAPTURE(start);
    REQUIRE(encode_parallel(v4(), text, encode_mode::raw, pool, small) == v4().encode(text, encode_mode::raw));
    // Plain and trusted are encoded in one piece; they still equal the sequential ids.
    if (rng() % 8 == 0) {
      CHECK(encode_parallel(v4(), text, encode_mode::trusted, pool, small)
            == v4().encode(text, encode_mode::trusted));
    }
  }
  CHECK(safe_cuts(c.front() + "\nabc", 1).size() >= 1);
}

TEST_CASE("parallel: encode_prompt on a pool equals the sequential prompt encoder") {
  thread_pool pool(2);
  parallel_options tiny;
  tiny.min_piece_bytes = 8;
  std::size_t n = 0;
  for (const auto& rec : testing::json_records(testing::golden_path("chat_completions.v4.jsonl.gz"))) {
    if (rec.contains("error")) continue;
    chat_completions_config cfg;
    cfg.max_n = 1 << 20;
    auto r = parse_chat_completions(rec.at("request").dump(), cfg);
    if (!std::holds_alternative<chat_completions_request>(r)) continue;
    const auto& conv = std::get<chat_completions_request>(r).conversation;
    const auto seq = encode_prompt(conv, v4());
    const auto par = encode_prompt(conv, v4(), pool, tiny);
    CAPTURE(rec.at("name").get<std::string>());
    CHECK(par.text == seq.text);
    CHECK(par.ids == seq.ids);
    CHECK(par.control == seq.control);
    ++n;
  }
  CHECK(n >= 39);
}
