// bench_rebuild: bounded replay against an exact rebuild of a cached prefix's window state, on
// the CPU engine over the Mooncake conversation trace (issue 15 §4).
//
// A prompt whose prefix is in the KV store gets that prefix's Block KV from the store, but not
// its sliding-window KV (never persisted). Rebuilding it:
//   - bounded replay recomputes the prefix's last window (model::replay, one window): what
//     troupe serve does on a hit whose window state was not kept;
//   - an exact rebuild recomputes num_hidden_layers windows (each layer's window looks one
//     window further back: tests/kernels/test_kv_blocks.cpp checks that this gives the exact
//     logits), through every layer, as this engine runs it;
//   - the layer-by-layer exact rebuild (layer l recomputes only the last (L − l + 1) windows)
//     is not run: its cost is the full-depth one × (L + 1) / 2L token-layers, printed beside.
// The tail after the prefix is computed the same way in every case (forward_last).
//
// Requests: --requests records spread evenly over the trace, each with the prefix the whole
// trace before it had cached (an unbounded store), lengths divided by --scale (4: each 512-token
// hash block of the trace becomes one 128-token KV block; its tokens are drawn from the hash id,
// so equal hash ids give equal tokens). The cached prefix never includes the block holding the
// prompt's last token. The prefix's blocks are computed untimed, then each rebuild is timed
// --rounds times (fastest kept), both kinds alternating; the tail once. Prints per-request
// lines and the totals: prefill seconds with bounded replay, with the exact rebuild (run and
// layer-by-layer), and their ratios, with the load average.
//
//   build/bench/bench_rebuild [--model DIR] [--trace FILE] [--requests 12] [--scale 4]
//                             [--rounds 2] [--threads 2]
#include "kernels/generate.hpp"
#include "kernels/kv_blocks.hpp"
#include "kernels/model.hpp"
#include "kernels/model_init.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

using namespace troupe::kernels;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct record {
  std::size_t index = 0;
  std::int64_t input = 0;
  std::vector<std::int64_t> hashes;
  /// Hash blocks cached by the requests before it.
  std::size_t cached_hashes = 0;
};

/// The token ids of a prompt: each hash block's from its hash id (equal ids, equal tokens).
std::vector<std::int64_t> tokens_of(const record& r, std::int64_t block, std::int64_t vocab) {
  std::vector<std::int64_t> t;
  for (std::size_t b = 0; b < r.hashes.size() && std::int64_t(t.size()) < r.input; ++b) {
    std::uint64_t x = std::uint64_t(r.hashes[b]) * 0x9e3779b97f4a7c15ull + 1;
    for (std::int64_t i = 0; i < block && std::int64_t(t.size()) < r.input; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t.push_back(std::int64_t(3 + (x >> 33) % std::uint64_t(vocab - 3)));
    }
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, trace = TROUPE_SOURCE_DIR "/examples/traces/mooncake_fast25_conversation_trace.jsonl";
  std::size_t requests = 12;
  std::int64_t scale = 4;
  int rounds = 2, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") model_dir = argv[i + 1];
    else if (a == "--trace") trace = argv[i + 1];
    else if (a == "--requests") requests = std::stoul(argv[i + 1]);
    else if (a == "--scale") scale = std::stoll(argv[i + 1]);
    else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else return std::fprintf(stderr, "unknown option %s\n", a.c_str()), 2;
  }
  if (requests == 0 || scale <= 0 || 512 % scale != 0 || rounds < 1)
    return std::fprintf(stderr, "--requests > 0, --scale dividing 512, --rounds >= 1\n"), 2;

  // The trace, and what each record found cached (hash blocks all seen before, from its start).
  std::vector<record> all;
  {
    std::ifstream in(trace);
    if (!in) return std::fprintf(stderr, "%s: cannot be read\n", trace.c_str()), 1;
    std::set<std::int64_t> seen;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line);
      record r;
      r.index = all.size();
      r.input = j.at("input_length").get<std::int64_t>() / scale;
      r.hashes = j.at("hash_ids").get<std::vector<std::int64_t>>();
      while (r.cached_hashes < r.hashes.size() && seen.count(r.hashes[r.cached_hashes]))
        ++r.cached_hashes;
      seen.insert(r.hashes.begin(), r.hashes.end());
      if (r.input > 0) all.push_back(std::move(r));
    }
  }
  if (all.empty()) return std::fprintf(stderr, "%s: no records\n", trace.c_str()), 1;

  const bool generated = model_dir.empty();
  const auto dir = generated ? std::filesystem::temp_directory_path() /
                                   ("troupe-bench-rebuild-" + std::to_string(::getpid()))
                             : std::filesystem::path(model_dir);
  if (generated) {
    if (auto w = write_random_model(dir, "small", 1); !w)
      return std::fprintf(stderr, "%s\n", w.error().c_str()), 1;
  }
  auto m = model::load(dir, {.threads = threads, .batch_invariant = true});
  if (!m) return std::fprintf(stderr, "%s\n", m.error().c_str()), 1;
  if (auto map = load_engram_token_map(*m, "identity"); !map || !m->set_engram_token_map(*map))
    return std::fprintf(stderr, "the Engram token map could not be set\n"), 1;
  const auto& c = m->text();
  const std::int64_t W = c.sliding_window, L = c.num_hidden_layers, B = kv_block_tokens;
  const std::int64_t hash_block = 512 / scale;

  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::printf("bench_rebuild: %s (%lld layers, window %lld), %d threads; %zu of %zu records of %s, "
              "lengths / %lld; load average %.2f\n",
              generated ? "small preset (seed 1)" : model_dir.c_str(), (long long)L, (long long)W,
              threads, requests, all.size(), std::filesystem::path(trace).filename().c_str(),
              (long long)scale, load[0]);
  std::printf("%7s %7s %7s %7s  %9s %9s %9s  (s)\n", "record", "prompt", "cached", "tail",
              "tail", "bounded", "exact");

  double t_tail = 0, t_bounded = 0, t_exact = 0;
  std::int64_t n_tail = 0, n_cached = 0, n_bounded = 0, n_exact = 0, hits = 0;
  for (std::size_t k = 0; k < requests; ++k) {
    const auto& r = all[k * all.size() / requests];
    const auto toks = tokens_of(r, hash_block, c.vocab_size);
    const std::int64_t P = std::int64_t(toks.size());
    // Cached: whole KV blocks of the cached hash blocks, never the one holding the last token.
    const std::int64_t cached =
        std::min(std::int64_t(r.cached_hashes) * hash_block, (P - 1) / B * B) / B * B;
    const std::span<const std::int64_t> all_tokens(toks);
    double tail_s = 0, bounded_s = 1e30, exact_s = 1e30;
    auto fail = [](const std::string& e) { std::fprintf(stderr, "%s\n", e.c_str()); return 1; };
    if (cached == 0) {
      auto s = m->new_sequence();
      const sequence_input in{&s, all_tokens};
      const auto t0 = clock_type::now();
      if (auto out = m->forward_last(std::span(&in, 1)); !out) return fail(out.error());
      tail_s = seconds_since(t0);
      bounded_s = exact_s = 0;
    } else {
      ++hits;
      // The prefix's Block KV, as the store would hold it (untimed).
      std::vector<std::string> blocks;
      {
        auto s = m->new_sequence();
        const sequence_input in{&s, all_tokens.first(std::size_t(cached))};
        if (auto out = m->forward_last(std::span(&in, 1)); !out) return fail(out.error());
        for (std::int64_t b = 0; b < cached / B; ++b) blocks.push_back(*serialize_block(s, b));
      }
      const auto prefix = all_tokens.first(std::size_t(cached));
      sequence_cache rebuilt = m->new_sequence();
      for (int round = 0; round < rounds; ++round)
        for (int kind = 0; kind < 2; ++kind) {
          const bool exact = (round + kind) % 2 == 1;
          auto s = m->new_sequence();
          const auto t0 = clock_type::now();
          for (std::size_t b = 0; b < blocks.size(); ++b)
            if (auto ok = restore_block(s, std::int64_t(b), blocks[b]); !ok) return fail(ok.error());
          if (auto out = m->replay(s, prefix, exact ? L * W : W); !out) return fail(out.error());
          const double secs = seconds_since(t0);
          (exact ? exact_s : bounded_s) = std::min(exact ? exact_s : bounded_s, secs);
          if (exact) rebuilt = std::move(s);
        }
      const sequence_input in{&rebuilt, all_tokens.subspan(std::size_t(cached))};
      const auto t0 = clock_type::now();
      if (auto out = m->forward_last(std::span(&in, 1)); !out) return fail(out.error());
      tail_s = seconds_since(t0);
      n_cached += cached;
      n_bounded += std::min(cached, W);
      n_exact += std::min(cached, L * W);
    }
    n_tail += P - cached;
    t_tail += tail_s;
    t_bounded += bounded_s;
    t_exact += exact_s;
    std::printf("%7zu %7lld %7lld %7lld  %9.3f %9.3f %9.3f\n", r.index, (long long)P,
                (long long)cached, (long long)(P - cached), tail_s, bounded_s, exact_s);
  }
  // Layer by layer: layer l recomputes min(cached, (L − l + 1)·W) tokens instead of min(cached,
  // L·W); for prefixes of at least L windows that is (L + 1) / 2L of the full-depth run.
  const double layerwise = double(L + 1) / double(2 * L);
  const double bounded_total = t_tail + t_bounded, exact_total = t_tail + t_exact,
               layerwise_total = t_tail + t_exact * layerwise;
  std::printf("\n%lld of %zu requests hit; tokens: %lld tail, %lld cached; rebuilt %lld (bounded) "
              "and %lld (exact) tokens through every layer\n",
              (long long)hits, requests, (long long)n_tail, (long long)n_cached,
              (long long)n_bounded, (long long)n_exact);
  std::printf("prefill seconds: tail %.2f; with bounded replay %.2f (rebuild %.2f); exact rebuild "
              "%.2f (rebuild %.2f); layer by layer, computed %.2f\n",
              t_tail, bounded_total, t_bounded, exact_total, t_exact, layerwise_total);
  std::printf("bounded / exact: %.3f (run), %.3f (layer by layer, computed)\n",
              bounded_total / exact_total, bounded_total / layerwise_total);
  getloadavg(load, 3);
  std::printf("load average after: %.2f\n", load[0]);
  if (generated) std::filesystem::remove_all(dir);
  return 0;
}
