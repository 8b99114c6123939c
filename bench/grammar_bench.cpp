// bench_grammar: the structured-output engine's compile time and per-token mask time on the
// DeepSeek-V4 vocabulary (129,280 ids), on the JSON schemas and EBNF grammars of
// bench/grammar_workloads.json, each along its valid output tokenized by the V4 tokenizer; a "tools" workload is
// a tool-call grammar (tool_calls.hpp), its output's `｜DSML｜` the control token's id. Prints p50 / p99 over several rounds;
// "cold" masks are the first pass of a fresh mask_computer (its per-state cache empty), "warm"
// a second pass over the same output; then, apart, the time to build every state's cache entry up
// front (mask_computer::warm_all). Times are the thread's CPU time. With --peer PYTHON it then runs llguidance (and
// XGrammar when installed) on the same workloads and tokenizer file (bench/grammar_peer.py; docs/benchmarks.md); a tool-call
// workload through the hand-written peer forms it carries.
// With --device-step-us N it measures instead what a device waits for: each workload's output
// through troupe serve's constraint table (actors/entrypoint/structured_output.hpp), the mask asked
// for (wall time) after a forward pass of N µs (a sleep) behind each accepted token, with the
// table's warming of the next state's mask off and on, interleaved, a fresh table per round.
// Usage: bench_grammar [--rounds N] [--workload NAME] [--peer PYTHON] [--device-step-us N]
//        (--workload: that one only, peer too)
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "actors/entrypoint/structured_output.hpp"
#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/lark.hpp"
#include "recipe/grammar/json_schema.hpp"
#include "recipe/grammar/tool_calls.hpp"
#include "recipe/grammar/token_mask.hpp"
#include "recipe/tokenizer.hpp"

#include <nlohmann/json.hpp>

namespace gr = troupe::recipe::grammar;

namespace {

// The machine is shared: time is this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), which other
// processes' load does not inflate; the peer measures the same way (time.thread_time_ns).
struct clock_type {
  using time_point = double;
  static double now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
  }
};

double us_since(double t0) { return clock_type::now() - t0; }

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

struct workload {
  std::string name, schema, ebnf, lark, output;  // a schema, a GBNF or Lark grammar, or tools
  nlohmann::ordered_json tools;            // {v41, mode, tools: [{name, schema}]}, as a constraint key holds them
};

// The output's ids: text runs tokenized raw, `｜DSML｜` as its control token.
std::vector<troupe::recipe::token_id> output_ids(const troupe::recipe::tokenizer& tok, const std::string& text) {
  const std::string dsml = "｜DSML｜";
  std::vector<troupe::recipe::token_id> ids;
  std::size_t from = 0;
  for (std::size_t at; (at = text.find(dsml, from)) != std::string::npos; from = at + dsml.size()) {
    for (const auto id : tok.encode(text.substr(from, at - from), troupe::recipe::encode_mode::raw)) ids.push_back(id);
    ids.push_back(*tok.token_to_id(dsml));
  }
  for (const auto id : tok.encode(text.substr(from), troupe::recipe::encode_mode::raw)) ids.push_back(id);
  return ids;
}

// bench/grammar_workloads.json: the schemas and outputs both this bench and its peer run.
std::vector<workload> load_workloads() {
  std::ifstream f(std::string(TROUPE_SOURCE_DIR) + "/bench/grammar_workloads.json");
  const auto j = nlohmann::ordered_json::parse(f);
  std::vector<workload> out;
  for (const auto& w : j)
    out.push_back({w["name"], w.contains("schema") ? w["schema"].dump() : "", w.value("ebnf", ""),
                   w.value("lark", ""), w["output"], w.value("tools", nlohmann::ordered_json())});
  return out;
}

// The constraint key troupe serve gives the workload (constraint_table::format_key's forms).
std::string constraint_key(const workload& w) {
  if (!w.tools.is_null()) return "tools:" + w.tools.dump();
  if (!w.lark.empty()) return "lark:" + w.lark;
  if (!w.ebnf.empty()) return "grammar:" + w.ebnf;
  return "schema:" + w.schema;
}

// --device-step-us: the masks a device waits for, without and with the next state's warming.
int device_path(const troupe::recipe::tokenizer& tok, int rounds, const std::string& only, int step_us) {
  std::printf("each token: the mask asked for (wall time), then accepted, then a %d us forward pass\n\n", step_us);
  std::printf("%-15s %7s | %-29s | %-29s\n", "workload", "tokens", "not warmed: p50 / p99 / max", "warmed: p50 / p99 / max");
  std::vector<workload> all;
  for (auto& w : load_workloads())
    if (only.empty() || w.name == only) all.push_back(std::move(w));
  // [workload][warmed]: every mask's wait, over the rounds
  std::vector<std::array<std::vector<double>, 2>> waits(all.size());
  std::vector<std::uint32_t> mask((tok.vocab_size() + 31) / 32);
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 2; ++k) {
      const bool warmed = (r + k) % 2 == 1;  // alternate which goes first
      troupe::actors::constraint_table table(tok, 2, warmed);
      for (std::size_t wi = 0; wi < all.size(); ++wi) {
        const auto ids = output_ids(tok, all[wi].output);
        const std::uint64_t seq = wi + 1;
        std::promise<std::optional<troupe::recipe::api_error>> compiled;
        table.add(seq, constraint_key(all[wi]), false, "response_format", {},
                  [&](std::optional<troupe::recipe::api_error> e) { compiled.set_value(std::move(e)); });
        if (auto e = compiled.get_future().get()) {
          std::printf("%s: %s\n", all[wi].name.c_str(), e->message.c_str());
          return 1;
        }
        for (std::size_t i = 0; i <= ids.size(); ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          table.allowed(seq, i, mask);
          waits[wi][warmed].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          if (i == ids.size()) break;
          if (!((mask[ids[i] / 32] >> (ids[i] % 32)) & 1)) {
            std::printf("%s: token %zu not allowed\n", all[wi].name.c_str(), i);
            return 1;
          }
          table.accepted(seq, i, static_cast<std::int32_t>(ids[i]));
          std::this_thread::sleep_for(std::chrono::microseconds(step_us));
        }
        table.remove(seq);
      }
    }
  for (std::size_t wi = 0; wi < all.size(); ++wi) {
    const auto& w = waits[wi];
    std::printf("%-15s %7zu | %6.1f / %6.1f / %7.1f us | %6.1f / %6.1f / %7.1f us\n", all[wi].name.c_str(),
                w[0].size() / static_cast<std::size_t>(rounds), pct(w[0], 0.5), pct(w[0], 0.99),
                *std::max_element(w[0].begin(), w[0].end()), pct(w[1], 0.5), pct(w[1], 0.99),
                *std::max_element(w[1].begin(), w[1].end()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 20, step_us = 0;
  std::string peer, only;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--peer") peer = argv[i + 1];
    if (std::string(argv[i]) == "--workload") only = argv[i + 1];
    if (std::string(argv[i]) == "--device-step-us") step_us = std::stoi(argv[i + 1]);
  }
  std::string load = "?";
  if (std::ifstream f("/proc/loadavg"); f) std::getline(f, load);
  std::printf("bench_grammar: %d rounds, load average %s\n", rounds, load.c_str());

  auto t0 = clock_type::now();
  const auto tok = troupe::recipe::tokenizer::from_file(std::string(TROUPE_SOURCE_DIR) +
                                                        "/recipe/data/deepseek-v4/tokenizer.json.gz");
  if (step_us > 0) return device_path(tok, rounds, only, step_us);
  const auto vocab = std::make_shared<const gr::vocabulary>(gr::vocabulary::from_tokenizer(tok));
  std::printf("vocabulary: %zu ids, trie of %zu nodes, built in %.0f ms (with the tokenizer load)\n\n", vocab->size(),
              vocab->trie().size(), us_since(t0) / 1000);
  std::printf("%-15s %7s | %-17s | %-19s | %-19s | %s\n", "workload", "tokens", "compile p50 / p99", "cold mask p50 / p99",
              "warm mask p50 / p99", "max");
  bool found = only.empty();
  std::vector<std::pair<std::string, std::shared_ptr<const gr::grammar>>> grammars;
  for (const auto& w : load_workloads()) {
    if (!only.empty() && w.name != only) continue;
    found = true;
    std::vector<double> compile, cold, warm;
    const auto ids = output_ids(tok, w.output);
    std::vector<std::uint32_t> mask(vocab->mask_words());
    std::shared_ptr<const gr::grammar> last;
    for (int r = 0; r < rounds; ++r) {
      t0 = clock_type::now();
      std::string error;
      gr::grammar compiled;
      if (!w.tools.is_null()) {
        auto spec = gr::tool_calls_spec_of(w.tools);
        auto r = spec ? gr::compile_tool_calls(*spec) : gr::tool_calls_error{{}, {"", "", "not a tools spec"}};
        if (auto* e = std::get_if<gr::tool_calls_error>(&r)) error = e->error.to_string();
        else compiled = std::move(std::get<gr::grammar>(r));
      } else if (!w.lark.empty()) {
        auto r = gr::compile_lark(w.lark);
        if (auto* e = std::get_if<gr::ebnf_error>(&r)) error = e->to_string();
        else compiled = std::move(std::get<gr::grammar>(r));
      } else if (w.ebnf.empty()) {
        auto r = gr::compile_json_schema(std::string_view(w.schema));
        if (auto* e = std::get_if<gr::schema_error>(&r)) error = e->to_string();
        else compiled = std::move(std::get<gr::grammar>(r));
      } else {
        auto r = gr::compile_ebnf(w.ebnf);
        if (auto* e = std::get_if<gr::ebnf_error>(&r)) error = e->to_string();
        else compiled = std::move(std::get<gr::grammar>(r));
      }
      compile.push_back(us_since(t0));
      if (!error.empty()) {
        std::printf("%s: %s\n", w.name.c_str(), error.c_str());
        return 1;
      }
      const auto g = std::make_shared<const gr::grammar>(std::move(compiled));
      last = g;
      const gr::mask_computer masks(g, vocab);
      for (int pass = 0; pass < 2; ++pass) {
        gr::matcher m(g);
        for (std::size_t i = 0; i <= ids.size(); ++i) {
          t0 = clock_type::now();
          masks.fill(m, mask);
          (pass == 0 ? cold : warm).push_back(us_since(t0));
          if (i < ids.size() && !m.accept_token(vocab->bytes(ids[i]))) {
            std::printf("%s: token %zu refused\n", w.name.c_str(), i);
            return 1;
          }
        }
      }
    }
    std::printf("%-15s %7zu | %7.0f / %7.0f us | %7.1f / %7.0f us | %7.1f / %7.1f us | cold %.0f us\n", w.name.c_str(),
                ids.size() + 1, pct(compile, 0.5), pct(compile, 0.99), pct(cold, 0.5), pct(cold, 0.99), pct(warm, 0.5),
                pct(warm, 0.99), *std::max_element(cold.begin(), cold.end()));
    grammars.emplace_back(w.name, std::move(last));
  }
  // Apart, after the rest (its megabytes of masks freed between rounds would slow the compiles
  // measured after them): what building every state's mask up front costs, as XGrammar's compile
  // does (mask_computer::warm_all).
  std::printf("\n%-15s %7s | %s\n", "workload", "frames", "every state's mask built up front: p50 / p99");
  for (const auto& [name, g] : grammars) {
    std::vector<double> every;
    std::size_t frames = 0;
    for (int r = 0; r < rounds; ++r) {
      const gr::mask_computer all(g, vocab);
      t0 = clock_type::now();
      frames = all.warm_all(std::size_t(-1));
      every.push_back(us_since(t0));
    }
    std::printf("%-15s %7zu | %7.2f / %7.2f ms\n", name.c_str(), frames, pct(every, 0.5) / 1000, pct(every, 0.99) / 1000);
  }
  if (!found) {
    std::printf("no workload named %s in bench/grammar_workloads.json\n", only.c_str());
    return 1;
  }
  if (!peer.empty()) {
    std::fflush(stdout);
    std::string cmd = peer + " " + TROUPE_SOURCE_DIR + "/bench/grammar_peer.py --rounds " + std::to_string(rounds);
    if (!only.empty()) cmd += " --workload " + only;
    return std::system(cmd.c_str()) == 0 ? 0 : 1;
  }
  return 0;
}
