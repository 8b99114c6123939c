// Tests of cluster/sim/trace and cluster/sim/workload: trace readers, block keys, hit rates
// and the synthetic generators.
#include "cluster/sim/trace.hpp"
#include "cluster/sim/workload.hpp"
#include "actors/kv/block_key.hpp"
#include "actors/kv/block_writer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

using namespace std::chrono_literals;
using namespace troupe::cluster::sim;
using troupe::runtime::rng;

namespace {

const std::filesystem::path source_dir{TROUPE_SOURCE_DIR};
const auto mooncake_file = source_dir / "examples" / "traces"
                           / "mooncake_fast25_conversation_trace.jsonl";
const auto azure_file = source_dir / "examples" / "traces" / "azure_llm_2023_conv.csv";
const auto bad_dir = source_dir / "tests" / "cluster" / "traces" / "bad";

// The shipped Mooncake trace, read once.
const trace_load& mooncake() {
  static const trace_load t = load_mooncake(mooncake_file);
  return t;
}

std::string all(const trace_load& t) {
  std::string out;
  for (const auto& d : t.diagnostics)
    out += d.to_string() + "\n";
  return out;
}

bool has_diagnostic(const trace_load& t, std::uint32_t line, std::string_view text) {
  return std::any_of(t.diagnostics.begin(), t.diagnostics.end(), [&](const auto& d) {
    return d.line == line && d.message.find(text) != std::string::npos;
  });
}

trace_load mooncake_text(const std::string& text, const load_options& options = {}) {
  std::istringstream in{text};
  return parse_mooncake(in, "inline.jsonl", options);
}

chat_params short_chat(double rate, std::chrono::seconds duration) {
  chat_params p;
  p.rate = rate;
  p.duration = duration;
  return p;
}

agent_params short_agent(double rate, std::chrono::seconds duration) {
  agent_params p;
  p.rate = rate;
  p.duration = duration;
  return p;
}

} // namespace

TEST_SUITE("trace: Mooncake") {

TEST_CASE("the shipped Mooncake trace loads all 12,031 requests without a diagnostic") {
  const auto& t = mooncake();
  INFO(all(t));
  REQUIRE(t.ok);
  CHECK(t.diagnostics.empty());
  CHECK(t.records.size() == 12031);
  CHECK(t.records.front().arrival == 0ns);
  CHECK(t.records.back().arrival == 3'536'999ms);
}

TEST_CASE("every Mooncake record has one 128-token block key per 128 prompt tokens") {
  for (const auto& r : mooncake().records)
    REQUIRE(r.blocks.size() == blocks_for(r.input_tokens, 128));
}

TEST_CASE("the Mooncake trace gives an unlimited cache a 36.6% block hit rate at 512 tokens") {
  auto h = prefix_hit_rate(mooncake().records, 512);
  MESSAGE("512-token blocks: ", h.hit_blocks, " / ", h.blocks, " = ", h.block_rate(),
          "; tokens ", h.token_rate());
  CHECK(h.blocks == 288'500);
  CHECK(std::abs(h.block_rate() - 0.366) <= 0.001);
}

TEST_CASE("at 128-token granularity the Mooncake hit rate is reported and close to 512's") {
  auto h512 = prefix_hit_rate(mooncake().records, 512);
  auto h128 = prefix_hit_rate(mooncake().records, 128);
  MESSAGE("128-token blocks: ", h128.hit_blocks, " / ", h128.blocks, " = ",
          h128.block_rate(), "; tokens ", h128.token_rate());
  CHECK(h128.blocks == 1'137'341);
  // Same tokens in total; hits are whole hash ids, so the token hit rate is the same.
  CHECK(h128.tokens == h512.tokens);
  CHECK(h128.hit_tokens == h512.hit_tokens);
  // Partial last blocks count less at 128 tokens, and they tend to miss: a little higher.
  CHECK(h128.block_rate() > h512.block_rate());
  CHECK(h128.block_rate() < h512.block_rate() + 0.02);
}

TEST_CASE("the same hash id expands to the same four keys in every request") {
  auto t = mooncake_text(
    R"({"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [7, 8]})"
    "\n"
    R"({"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [7, 9]})"
    "\n");
  REQUIRE(t.ok);
  REQUIRE(t.records.size() == 2);
  const auto& a = t.records[0].blocks;
  const auto& b = t.records[1].blocks;
  REQUIRE(a.size() == 8);
  REQUIRE(b.size() == 5);
  CHECK(std::equal(a.begin(), a.begin() + 4, b.begin()));
  CHECK(a[4] != b[4]);
}

TEST_CASE("expanded keys differ across hash ids, sub-blocks and lengths") {
  std::unordered_set<std::uint64_t> keys;
  std::size_t n = 0;
  for (std::uint64_t h : {0ULL, 1ULL, 2ULL, 1000ULL, (1ULL << 55) - 1})
    for (std::uint32_t sub = 0; sub < 4; ++sub)
      for (std::uint32_t len = 1; len <= 128; ++len, ++n)
        keys.insert(mooncake_block_key(h, sub, len));
  CHECK(keys.size() == n);
  // No key stands for two different block lengths anywhere in the trace.
  std::unordered_map<std::uint64_t, std::uint64_t> length_of;
  std::size_t conflicts = 0;
  for (const auto& r : mooncake().records)
    for (std::size_t i = 0; i < r.blocks.size(); ++i) {
      auto [it, fresh] = length_of.try_emplace(r.blocks[i], r.block_length(i));
      conflicts += it->second != r.block_length(i);
    }
  CHECK(conflicts == 0);
}

TEST_CASE("a partial final 512-token block expands to fewer keys, the last one partial") {
  std::vector<std::uint64_t> keys;
  expand_mooncake_blocks({5, 6}, 512 + 300, keys);
  REQUIRE(keys.size() == 4 + 3);
  CHECK(keys[4] == mooncake_block_key(6, 0, 128));
  CHECK(keys[5] == mooncake_block_key(6, 1, 128));
  CHECK(keys[6] == mooncake_block_key(6, 2, 44));
  std::vector<std::uint64_t> shorter;
  expand_mooncake_blocks({5, 6}, 512 + 299, shorter);
  REQUIRE(shorter.size() == 7);
  CHECK(shorter[6] != keys[6]);
  CHECK(std::equal(keys.begin(), keys.begin() + 6, shorter.begin()));
}

TEST_CASE("a record's last block holds the remainder of the prompt") {
  auto t = mooncake_text(
    R"({"timestamp": 0, "input_length": 6758, "output_length": 500, )"
    R"("hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]})");
  REQUIRE(t.records.size() == 1);
  const auto& r = t.records[0];
  CHECK(r.blocks.size() == 53);
  CHECK(r.block_length(0) == 128);
  CHECK(r.block_length(52) == 6758 - 52 * 128);
}

TEST_CASE("speedup divides arrival times and limits cut the trace") {
  load_options o;
  o.speedup = 4;
  o.max_duration = 60s;
  auto t = load_mooncake(mooncake_file, o);
  REQUIRE(t.ok);
  REQUIRE_FALSE(t.records.empty());
  CHECK(t.records.back().arrival < 60s);
  auto full = std::count_if(mooncake().records.begin(), mooncake().records.end(),
                            [](const auto& r) { return r.arrival < 240s; });
  CHECK(t.records.size() == static_cast<std::size_t>(full));
  o.max_records = 10;
  CHECK(load_mooncake(mooncake_file, o).records.size() == 10);
}

TEST_CASE("a non-positive speedup fails the load") {
  load_options o;
  o.speedup = 0;
  auto t = load_mooncake(mooncake_file, o);
  CHECK_FALSE(t.ok);
  CHECK(t.records.empty());
  CHECK(t.diagnostics.size() == 1);
}

TEST_CASE("bad Mooncake lines are reported with their line numbers and skipped") {
  auto t = load_mooncake(bad_dir / "mooncake-bad-lines.jsonl");
  INFO(all(t));
  REQUIRE(t.ok);
  CHECK(t.records.size() == 3);
  CHECK(t.diagnostics.size() == 6);
  CHECK(has_diagnostic(t, 2, "invalid JSON"));
  CHECK(has_diagnostic(t, 3, "missing \"input_length\""));
  CHECK(has_diagnostic(t, 4, "needs 3"));
  CHECK(has_diagnostic(t, 7, "\"timestamp\""));
  CHECK(has_diagnostic(t, 8, "\"output_length\" must be at least 1"));
  CHECK(has_diagnostic(t, 9, "\"hash_ids\"[0]"));
  auto first = t.diagnostics[0].to_string();
  CHECK(first.find("mooncake-bad-lines.jsonl:2: invalid JSON") != std::string::npos);
}

TEST_CASE("in strict mode a bad Mooncake line fails the load") {
  load_options o;
  o.strict = true;
  auto t = load_mooncake(bad_dir / "mooncake-bad-lines.jsonl", o);
  CHECK_FALSE(t.ok);
  CHECK(t.records.empty());
  CHECK(has_diagnostic(t, 2, "invalid JSON"));
}

TEST_CASE("a missing trace file fails the load with a diagnostic") {
  auto t = load_mooncake(bad_dir / "no-such-file.jsonl");
  CHECK_FALSE(t.ok);
  REQUIRE(t.diagnostics.size() == 1);
  CHECK(t.diagnostics[0].to_string().find("cannot open") != std::string::npos);
}

} // TEST_SUITE

TEST_SUITE("trace: Azure") {

TEST_CASE("the shipped Azure trace loads 19,366 requests with the known token sums") {
  auto t = load_azure(azure_file);
  INFO(all(t));
  REQUIRE(t.ok);
  CHECK(t.diagnostics.empty());
  REQUIRE(t.records.size() == 19366);
  auto in = std::accumulate(t.records.begin(), t.records.end(), std::uint64_t{0},
                            [](auto s, const auto& r) { return s + r.input_tokens; });
  auto out = std::accumulate(t.records.begin(), t.records.end(), std::uint64_t{0},
                             [](auto s, const auto& r) { return s + r.output_tokens; });
  CHECK(in == 22'361'870);
  CHECK(out == 4'088'665);
  CHECK(t.records.front().arrival == 0ns);
  // 18:15:46.6805900 to 19:14:08.4025270.
  CHECK(t.records.back().arrival == 3'501'721'937'000ns);
}

TEST_CASE("Azure requests carry block keys that never hit") {
  auto t = load_azure(azure_file);
  for (const auto& r : t.records)
    REQUIRE(r.blocks.size() == blocks_for(r.input_tokens, 128));
  auto h = prefix_hit_rate(t.records, 128);
  CHECK(h.blocks > 0);
  CHECK(h.hit_blocks == 0);
}

TEST_CASE("bad Azure lines are reported with their line numbers and skipped") {
  auto t = load_azure(bad_dir / "azure-bad-lines.csv");
  INFO(all(t));
  REQUIRE(t.ok);
  CHECK(t.records.size() == 2);
  CHECK(t.diagnostics.size() == 4);
  CHECK(has_diagnostic(t, 3, "3 comma-separated fields"));
  CHECK(has_diagnostic(t, 4, "TIMESTAMP"));
  CHECK(has_diagnostic(t, 5, "ContextTokens"));
  CHECK(has_diagnostic(t, 6, "GeneratedTokens"));
  CHECK(t.records[1].arrival == 6'819'410'000ns);
}

TEST_CASE("in strict mode a bad Azure line fails the load") {
  load_options o;
  o.strict = true;
  auto t = load_azure(bad_dir / "azure-bad-lines.csv", o);
  CHECK_FALSE(t.ok);
  CHECK(t.records.empty());
}

TEST_CASE("an Azure file without the expected header fails the load") {
  auto t = load_azure(bad_dir / "azure-bad-header.csv");
  CHECK_FALSE(t.ok);
  CHECK(has_diagnostic(t, 1, "header"));
}

TEST_CASE("load_trace picks the reader from the file extension") {
  load_options o;
  o.max_records = 5;
  CHECK(load_trace(mooncake_file, o).records == load_mooncake(mooncake_file, o).records);
  CHECK(load_trace(azure_file, o).records == load_azure(azure_file, o).records);
  auto t = load_trace(bad_dir / "trace.parquet");
  CHECK_FALSE(t.ok);
  CHECK(has_diagnostic(t, 0, "unknown trace format"));
}

} // TEST_SUITE

TEST_SUITE("workload") {

TEST_CASE("the same seed generates the same chat workload") {
  auto p = short_chat(2, 600s);
  auto a = generate_chat(p, rng{42});
  auto b = generate_chat(p, rng{42});
  REQUIRE(a.ok());
  REQUIRE_FALSE(a.records.empty());
  CHECK(a.records == b.records);
}

TEST_CASE("different seeds generate different chat workloads") {
  auto p = short_chat(2, 600s);
  CHECK(generate_chat(p, rng{1}).records != generate_chat(p, rng{2}).records);
}

TEST_CASE("the same seed generates the same agent and mixed workloads, others differ") {
  auto a = short_agent(2, 300s);
  CHECK(generate_agent(a, rng{7}).records == generate_agent(a, rng{7}).records);
  CHECK(generate_agent(a, rng{7}).records != generate_agent(a, rng{8}).records);
  mixed_params m;
  m.rate = 3;
  m.duration = 300s;
  CHECK(generate_mixed(m, rng{7}).records == generate_mixed(m, rng{7}).records);
  CHECK(generate_mixed(m, rng{7}).records != generate_mixed(m, rng{8}).records);
}

TEST_CASE("generated records are in arrival order inside the run with consistent blocks") {
  mixed_params m;
  m.rate = 3;
  m.duration = 300s;
  auto w = generate_mixed(m, rng{3});
  REQUIRE(w.ok());
  REQUIRE_FALSE(w.records.empty());
  CHECK(std::is_sorted(w.records.begin(), w.records.end(),
                       [](const auto& a, const auto& b) { return a.arrival < b.arrival; }));
  CHECK(w.records.front().arrival >= 0ns);
  CHECK(w.records.back().arrival < 300s);
  std::uint64_t next_session = 0;
  for (const auto& r : w.records) {
    REQUIRE(r.blocks.size() == blocks_for(r.input_tokens, 128));
    REQUIRE(r.output_tokens >= 1);
    REQUIRE(r.session <= next_session); // numbered by first arrival
    next_session = std::max(next_session, r.session + 1);
  }
  auto agents = std::count_if(w.records.begin(), w.records.end(),
                              [](const auto& r) { return r.traffic == traffic_class::agent; });
  CHECK(agents > 0);
  CHECK(agents < static_cast<std::ptrdiff_t>(w.records.size()));
}

TEST_CASE("the chat arrival rate matches the requested rate") {
  auto w = generate_chat(short_chat(5, 3600s), rng{11});
  REQUIRE(w.ok());
  double rate = static_cast<double>(w.records.size()) / 3600.0;
  MESSAGE("chat: ", w.records.size(), " requests in 1 h at 5/s requested: ", rate, "/s");
  CHECK(rate == doctest::Approx(5).epsilon(0.10));
}

TEST_CASE("the agent arrival rate matches the requested rate") {
  auto w = generate_agent(short_agent(4, 3600s), rng{11});
  REQUIRE(w.ok());
  double rate = static_cast<double>(w.records.size()) / 3600.0;
  MESSAGE("agent: ", w.records.size(), " requests in 1 h at 4/s requested: ", rate, "/s");
  CHECK(rate == doctest::Approx(4).epsilon(0.20));
}

TEST_CASE("chat sessions reuse their prefixes") {
  auto w = generate_chat(short_chat(2, 1800s), rng{5});
  auto h = prefix_hit_rate(w.records, 128);
  MESSAGE("chat hit rate: blocks ", h.block_rate(), ", tokens ", h.token_rate());
  CHECK(h.block_rate() > 0.3);
  // Only the reuse a session has with itself and the shared system prompts: not everything.
  CHECK(h.block_rate() < 0.95);
}

TEST_CASE("a chat turn's prompt starts with the previous turn's prompt") {
  auto w = generate_chat(short_chat(2, 1800s), rng{5});
  std::map<std::uint64_t, const request_record*> last;
  std::size_t follow_ups = 0;
  for (const auto& r : w.records) {
    auto it = last.find(r.session);
    if (it != last.end() && r.input_tokens > it->second->input_tokens) {
      const auto& prev = it->second->blocks;
      auto full = it->second->input_tokens / 128; // the previous prompt's full blocks
      REQUIRE(std::equal(prev.begin(), prev.begin() + static_cast<std::ptrdiff_t>(full),
                         r.blocks.begin()));
      ++follow_ups;
    }
    last[r.session] = &r;
  }
  CHECK(follow_ups > 100);
}

TEST_CASE("a turn's prompt names the previous answer's blocks as that request's decode keyed "
          "them") {
  // The simulation numbers records 1, 2, ... in order; the previous turn's decode instance
  // persists its output blocks under decode_chain (actors/kv/block_writer.hpp). The next
  // turn's chain must run through exactly those keys for the next turn to hit them.
  for (const bool agent : {false, true}) {
    CAPTURE(agent);
    auto w = agent ? generate_agent(short_agent(2, 1800s), rng{7})
                   : generate_chat(short_chat(2, 1800s), rng{7});
    REQUIRE(w.ok());
    std::map<std::uint64_t, std::size_t> last; // session -> index of its latest request
    std::size_t hits = 0;
    for (std::size_t k = 0; k < w.records.size(); ++k) {
      const auto& r = w.records[k];
      auto it = last.find(r.session);
      if (it == last.end()) {
        last[r.session] = k;
        continue;
      }
      const auto before = std::exchange(it->second, k);
      const auto& prev = w.records[before];
      const auto first = prev.input_tokens / 128;
      const auto end = (prev.input_tokens + prev.output_tokens) / 128;
      if (r.input_tokens < prev.input_tokens + prev.output_tokens || end <= first)
        continue; // a fresh prompt (context full), or an answer within one block
      auto prompt = troupe::actors::make_chain(std::span<const std::uint64_t>{prev.blocks},
                                               prev.input_tokens);
      auto next = troupe::actors::make_chain(std::span<const std::uint64_t>{r.blocks},
                                             r.input_tokens);
      // A continuing turn: the previous prompt's full blocks, then the decoded ones.
      if (!std::equal(prompt.begin(), prompt.end(), next.begin()))
        continue;
      REQUIRE(next.size() >= end);
      auto decoded = troupe::actors::decode_chain(prompt.empty() ? troupe::actors::block_key{}
                                                                 : prompt.back(),
                                                  first, before + 1, first, end - first);
      CHECK(std::equal(decoded.begin(), decoded.end(), next.begin() + first));
      ++hits;
    }
    CHECK(hits > 50);
  }
}

TEST_CASE("agent traffic reuses more of its prompts than chat traffic") {
  auto chat = generate_chat(short_chat(2, 1800s), rng{5});
  auto agent = generate_agent(short_agent(2, 1800s), rng{5});
  auto hc = prefix_hit_rate(chat.records, 128);
  auto ha = prefix_hit_rate(agent.records, 128);
  MESSAGE("agent hit rate: blocks ", ha.block_rate(), ", tokens ", ha.token_rate());
  CHECK(ha.block_rate() > hc.block_rate());
  CHECK(ha.token_rate() > hc.token_rate());
  for (const auto& r : agent.records)
    REQUIRE(r.traffic == traffic_class::agent);
}

TEST_CASE("chat turns with images count them and carry their tokens in the prompt") {
  auto p = short_chat(2, 300s);
  p.image_chance = 1.0;
  p.one_off_share = 0; // one-offs carry no images
  auto w = generate_chat(p, rng{9});
  REQUIRE_FALSE(w.records.empty());
  for (const auto& r : w.records) {
    REQUIRE(r.images >= 1);
    REQUIRE(r.images <= p.max_images);
    REQUIRE(r.input_tokens >= r.images * p.image_tokens);
  }
}

TEST_CASE("invalid generator parameters give an error and no records") {
  auto p = short_chat(0, 60s);
  auto w = generate_chat(p, rng{1});
  CHECK_FALSE(w.ok());
  CHECK(w.records.empty());
  auto a = short_agent(1, 60s);
  a.mean_steps = 0.5;
  CHECK_FALSE(generate_agent(a, rng{1}).ok());
  mixed_params m;
  m.agent_share = 1.5;
  CHECK_FALSE(generate_mixed(m, rng{1}).ok());
}

} // TEST_SUITE

TEST_SUITE("trace: limits") {
TEST_CASE("a timestamp beyond the 7-day span is a bad line, not a run of that length") {
  auto t = mooncake_text(
    "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n"
    "{\"timestamp\": 8e12, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [2]}\n"
    "{\"timestamp\": 100000000000, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [3]}\n"
    "{\"timestamp\": 604800000, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [4]}\n");
  INFO(all(t));
  REQUIRE(t.ok);
  CHECK(t.records.size() == 2);
  CHECK(has_diagnostic(t, 2, "beyond the 7 days a trace may span"));
  CHECK(has_diagnostic(t, 3, "beyond the 7 days a trace may span"));
  CHECK(t.records.back().arrival == max_trace_span);
  // A speedup brings a longer trace inside the span.
  load_options fast;
  fast.speedup = 2e4;
  CHECK(mooncake_text("{\"timestamp\": 100000000000, \"input_length\": 10, \"output_length\": 5, "
                      "\"hash_ids\": [3]}\n",
                      fast)
          .records.size()
        == 1);
}

TEST_CASE("an Azure record more than 7 days after the first is a bad line") {
  std::istringstream in{"TIMESTAMP,ContextTokens,GeneratedTokens\n"
                        "2023-11-16 18:15:46.6805900,374,44\n"
                        "2023-11-30 18:15:46.6805900,374,44\n"
                        "2023-11-17 18:15:46.6805900,374,44\n"};
  auto t = parse_azure(in, "inline.csv", {});
  INFO(all(t));
  REQUIRE(t.ok);
  CHECK(t.records.size() == 2);
  CHECK(has_diagnostic(t, 3, "beyond the 7 days"));
}

TEST_CASE("a binary file fails the load with one message naming the byte") {
  std::string bytes = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, "
                      "\"hash_ids\": [1]}\n";
  for (int line = 0; line < 300; ++line) {
    for (int i = 0; i < 40; ++i)
      bytes += static_cast<char>((line * 37 + i * 11) % 256);
    bytes += '\n';
  }
  auto t = mooncake_text(bytes);
  INFO(all(t));
  CHECK_FALSE(t.ok);
  CHECK(t.records.empty());
  REQUIRE(t.diagnostics.size() == 1);
  CHECK(t.diagnostics[0].line == 2);
  CHECK(t.diagnostics[0].message.find("binary data (byte 0x") != std::string::npos);
  CHECK(t.diagnostics[0].message.find("not a text trace") != std::string::npos);
  std::istringstream csv{std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10)};
  auto a = parse_azure(csv, "inline.csv", {});
  CHECK_FALSE(a.ok);
  REQUIRE(a.diagnostics.size() == 1);
  CHECK(a.diagnostics[0].message.find("binary data (byte 0x7f at column 1)") != std::string::npos);
}
}
