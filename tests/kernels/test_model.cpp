// The CPU model on a random tiny checkpoint (tests/kernels/fixtures/tiny-v41-config.json:
// sliding, ratio-2 and ratio-1 layers, two KV sources, three index sources, the candidate
// source, an Engram layer, hc_mult 4, window 8): loading, refusals, and the invariances of the
// cache: chunked prefill at several chunk sizes equals one prefill, prefill then decode equals
// one prefill, and a batch of sequences equals each sequence alone.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "kernels/model.hpp"
#include "model_fixture.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

using testing::run;

const fs::path tiny_config =
    fs::path(TROUPE_SOURCE_DIR) / "tests/kernels/fixtures/tiny-v41-config.json";

model load_tiny(model_options options = {}) {
  static const fs::path dir = testing::write_random_model(tiny_config, "tiny", 7);
  auto m = model::load(dir, options);
  REQUIRE_MESSAGE(m.ok(), m.error());
  std::vector<std::int64_t> map(static_cast<std::size_t>(m->text().vocab_size));
  for (std::size_t i = 0; i < map.size(); ++i)
    map[i] = std::int64_t(i) % m->text().engram_compressed_vocab_size;
  REQUIRE(m->set_engram_token_map(map).ok());
  return std::move(*m);
}

std::vector<std::int64_t> prompt(std::size_t n, std::uint32_t seed) {
  std::vector<std::int64_t> t(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = std::int64_t(3 + (x >> 8) % 240);
  }
  return t;
}

}  // namespace

TEST_CASE("the tiny model loads and produces finite logits") {
  auto m = load_tiny();
  auto cache = m.new_sequence();
  auto toks = prompt(40, 1);
  auto logits = run(m, cache, toks);
  REQUIRE(logits.size() == 40u * 256u);
  for (float v : logits) REQUIRE(std::isfinite(v));
  CHECK(cache.length == 40);
  // Ratio-2 KV source (layer 1): 20 groups; ratio-1 KV source (layer 3): 40 entries, paged in
  // blocks of 128 / ratio rows.
  CHECK(cache.layers[1].compressed.kv.size() == 20);
  CHECK(cache.layers[1].compressed.index_keys.size() == 20);
  CHECK(cache.layers[1].compressed.kv.rows_per_block() == 64);
  CHECK(cache.layers[3].compressed.kv.size() == 40);
  CHECK(cache.layers[3].compressed.pending_tokens == 0);
}

// The invariance tests below compare the model with itself at 1e-5: the chunkings, batches and
// modes sum in different orders (GEMM shapes differ), ~1e-7 relative per projection, which
// grows to ~1e-6 through the layers. The tiny config's FP8 window quantiser (head_dim 32),
// routers and indexer top-k are decisions that such a difference could flip on some BLAS
// kernel, so each test first checks its inputs are away from every boundary
// (model_fixture.hpp).
std::pair<std::vector<float>, std::vector<std::int64_t>> prefill_of(
    const std::vector<std::int64_t>& toks, const model_options& o) {
  auto m = load_tiny(o);
  auto cache = m.new_sequence();
  return {run(m, cache, toks), {}};
}

TEST_CASE("chunked prefill at every chunk size equals one prefill") {
  auto m = load_tiny();
  auto toks = prompt(37, 2);
  testing::require_stable_inputs({}, [&](const model_options& o) { return prefill_of(toks, o); },
                                 1e-5);
  auto whole_cache = m.new_sequence();
  auto whole = run(m, whole_cache, toks);
  for (std::size_t chunk : {1u, 2u, 3u, 5u, 8u, 13u, 36u}) {
    CAPTURE(chunk);
    auto cache = m.new_sequence();
    std::vector<float> got;
    for (std::size_t at = 0; at < toks.size(); at += chunk) {
      const auto n = std::min(chunk, toks.size() - at);
      auto part = run(m, cache, std::span(toks).subspan(at, n));
      got.insert(got.end(), part.begin(), part.end());
    }
    REQUIRE(got.size() == whole.size());
    CHECK(testing::relative_error(got, whole) <= 1e-5);
  }
}

TEST_CASE("a batch of sequences equals each sequence alone, in prefill and in decode") {
  auto m = load_tiny();
  std::vector<std::vector<std::int64_t>> prompts = {prompt(19, 3), prompt(4, 4), prompt(30, 5)};
  for (const auto& p : prompts)
    testing::require_stable_inputs({}, [&](const model_options& o) { return prefill_of(p, o); },
                                   1e-5);
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) {
    auto cache = m.new_sequence();
    alone.push_back(run(m, cache, p));
  }
  // Prefill the first 15 / 1 / 22 tokens batched, then the rest as batched decode steps of up
  // to three tokens.
  std::vector<sequence_cache> caches;
  for (std::size_t i = 0; i < prompts.size(); ++i) caches.push_back(m.new_sequence());
  std::vector<std::size_t> done = {0, 0, 0};
  std::vector<std::vector<float>> got(prompts.size());
  std::vector<std::size_t> first = {15, 1, 22};
  bool progress = true;
  for (int step = 0; progress; ++step) {
    std::vector<sequence_input> batch;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const std::size_t n =
          step == 0 ? first[i] : std::min<std::size_t>(1 + i, prompts[i].size() - done[i]);
      if (n == 0) continue;
      batch.push_back({&caches[i], std::span(prompts[i]).subspan(done[i], n)});
      who.push_back(i);
    }
    progress = !batch.empty();
    if (!progress) break;
    auto r = m.forward(batch);
    REQUIRE_MESSAGE(r.ok(), r.error());
    std::size_t at = 0;
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const auto n = batch[b].tokens.size() * 256;
      got[who[b]].insert(got[who[b]].end(), r->begin() + long(at), r->begin() + long(at + n));
      at += n;
      done[who[b]] += batch[b].tokens.size();
    }
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i].size() == alone[i].size());
    CHECK(testing::relative_error(got[i], alone[i]) <= 1e-5);
  }
}

TEST_CASE("forward refuses what it cannot run, as values") {
  auto m = load_tiny();
  auto cache = m.new_sequence();
  std::vector<std::int64_t> bad = {5, 256};
  sequence_input in{&cache, bad};
  auto r = m.forward(std::span(&in, 1));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("token 1 is 256") != std::string::npos);
  sequence_cache foreign;
  std::vector<std::int64_t> ok = {5};
  sequence_input in2{&foreign, ok};
  CHECK_FALSE(m.forward(std::span(&in2, 1)).ok());
  auto other = load_tiny();  // the same weights, another model object
  auto other_cache = other.new_sequence();
  sequence_input in4{&other_cache, ok};
  CHECK(m.forward(std::span(&in4, 1)).error() ==
        "forward: sequence 0 has no cache made by this model");
  CHECK(cache.length == 0);
  std::vector<sequence_input> twice = {{&cache, ok}, {&cache, ok}};
  auto r2 = m.forward(twice);
  REQUIRE_FALSE(r2.ok());
  CHECK(r2.error() == "forward: sequences 0 and 1 share one cache");

  auto dir = testing::write_random_model(tiny_config, "no-map", 9);
  auto fresh = model::load(dir);
  REQUIRE(fresh.ok());
  auto c2 = fresh->new_sequence();
  sequence_input in3{&c2, ok};
  auto r3 = fresh->forward(std::span(&in3, 1));
  REQUIRE_FALSE(r3.ok());
  CHECK(r3.error().find("compressed token map") != std::string::npos);
}

TEST_CASE("a checkpoint with a wrongly shaped tensor is refused naming it") {
  auto dir = testing::write_random_model(tiny_config, "bad-shape", 11);
  // Rewrite the file with one tensor's shape transposed.
  auto ck = checkpoint::open(dir);
  REQUIRE(ck.ok());
  std::vector<tensor_to_write> tensors;
  for (const auto& name : ck->names()) {
    auto v = ck->get(name);
    REQUIRE(v.ok());
    auto shape = v->shape();
    if (name == "layers.2.attn.wkv.weight") std::swap(shape[0], shape[1]);
    tensors.push_back({name, v->type(), shape, {v->bytes.begin(), v->bytes.end()}});
  }
  ck = result<checkpoint>::failure("closed");
  REQUIRE(write_safetensors(dir / "model.safetensors", tensors).ok());
  auto m = model::load(dir);
  REQUIRE_FALSE(m.ok());
  CHECK(m.error() == "tensor layers.2.attn.wkv.weight: expected shape [32, 64], found [64, 32]");
}

TEST_CASE(
    "a CSA2 schedule whose top-k and compressed KV pool at different ratios is refused at load") {
  // Layers 3..5 attend over the ratio-1 KV of layer 3 but would reuse the top-k that layer 1
  // selected over its ratio-2 keys.
  std::ifstream in(tiny_config);
  auto j = nlohmann::json::parse(in);
  j["text_config"]["index_source_layer_ids"] = {1};
  j["text_config"]["candidate_source_layer_id"] = -1;
  const fs::path cfg =
      testing::scratch_root() / "schedule.json";
  std::ofstream(cfg) << j.dump();
  auto dir = testing::write_random_model(cfg, "schedule", 13);
  auto m = model::load(dir);
  REQUIRE_FALSE(m.ok());
  CHECK(m.error() ==
        (dir / "config.json").string() +
            ": layer 3 attends over the compressed KV of layer 3 (ratio 1) with a top-k "
            "over the keys of layer 1 (ratio 2): expected equal ratios");
}

TEST_CASE(
    "batch-invariant mode: a sequence's logits are bitwise the same in any batch and any "
    "chunking") {
  auto m = load_tiny({.threads = 2, .batch_invariant = true});
  const auto a = prompt(29, 21), b = prompt(17, 22), c = prompt(40, 23);
  auto alone_cache = m.new_sequence();
  const auto alone = run(m, alone_cache, a);

  // Chunked prefill: bitwise equal to one prefill.
  for (std::size_t chunk : {1u, 2u, 3u, 7u, 16u}) {
    CAPTURE(chunk);
    auto cache = m.new_sequence();
    std::vector<float> got;
    for (std::size_t at = 0; at < a.size(); at += chunk) {
      auto part = run(m, cache, std::span(a).subspan(at, std::min(chunk, a.size() - at)));
      got.insert(got.end(), part.begin(), part.end());
    }
    CHECK(got == alone);
  }

  // In a batch with other sequences (before and after it), prefilled together, then decoded
  // with different companions each step: bitwise equal to alone.
  auto ca = m.new_sequence(), cb = m.new_sequence(), cc = m.new_sequence();
  std::vector<sequence_input> batch = {{&cb, b}, {&ca, std::span(a).first(20)}, {&cc, c}};
  auto r = m.forward(batch);
  REQUIRE(r.ok());
  const std::size_t V = 256;
  std::vector<float> got(r->begin() + long(b.size() * V), r->begin() + long((b.size() + 20) * V));
  const std::vector<std::int64_t> other = {9};
  for (std::size_t i = 20; i < a.size(); ++i) {
    std::vector<sequence_input> step = {{&ca, std::span(a).subspan(i, 1)}};
    if (i % 2 == 0) step.insert(step.begin(), {&cb, other});
    if (i % 3 == 0) step.push_back({&cc, other});
    auto s = m.forward(step);
    REQUIRE(s.ok());
    const std::size_t at = i % 2 == 0 ? V : 0;
    got.insert(got.end(), s->begin() + long(at), s->begin() + long(at + V));
  }
  CHECK(got == alone);

  // The default mode agrees with the invariant one to rounding (bitwise equality above is exact
  // by construction and needs no probe; this comparison does).
  testing::require_stable_inputs({}, [&](const model_options& o) { return prefill_of(a, o); },
                                 1e-5);
  auto fast = load_tiny();
  auto fc = fast.new_sequence();
  CHECK(testing::relative_error(run(fast, fc, a), alone) <= 1e-5);
}

namespace {

// Everything the next tokens read: the window rows (head_dim wide) of the last `window`
// positions, the compressed KV, indexer keys and unfinished group of every KV source, the
// Engram look-back.
void check_same_state(const sequence_cache& a, const sequence_cache& b, std::int64_t window,
                      std::int64_t head_dim, std::size_t lookback) {
  REQUIRE(a.length == b.length);
  REQUIRE(a.layers.size() == b.layers.size());
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    CAPTURE(l);
    const auto& x = a.layers[l];
    const auto& y = b.layers[l];
    for (std::int64_t p = std::max<std::int64_t>(0, a.length - window); p < a.length; ++p)
      CHECK(std::equal(x.window.at(p), x.window.at(p) + head_dim, y.window.at(p)));
    if (!x.is_kv_source) continue;
    const auto& cx = x.compressed;
    const auto& cy = y.compressed;
    CHECK(cx.groups == cy.groups);
    REQUIRE(cx.kv.size() == cy.kv.size());
    for (std::int64_t e = 0; e < cx.kv.size(); ++e)
      CHECK(std::equal(cx.kv.row(e), cx.kv.row(e) + cx.kv.width(), cy.kv.row(e)));
    REQUIRE(cx.index_keys.size() == cy.index_keys.size());
    for (std::int64_t e = 0; e < cx.index_keys.size(); ++e)
      CHECK(std::equal(cx.index_keys.row(e), cx.index_keys.row(e) + cx.index_keys.width(),
                       cy.index_keys.row(e)));
    CHECK(cx.pending_tokens == cy.pending_tokens);
    CHECK(cx.pending_kv == cy.pending_kv);
    CHECK(cx.pending_gate == cy.pending_gate);
  }
  const auto tail = [&](const std::vector<std::int64_t>& v) {
    return std::vector<std::int64_t>(v.end() - long(std::min(lookback, v.size())), v.end());
  };
  CHECK(tail(a.engram_recent) == tail(b.engram_recent));
}

}  // namespace

TEST_CASE("rolling back a rejected draft equals never having drafted") {
  auto m = load_tiny({.threads = 2, .batch_invariant = true});
  const auto seq = prompt(40, 31);
  const auto draft = prompt(6, 32);
  for (std::size_t p : {19u, 20u, 23u}) {  // ratio-2 groups open and closed at the cut
    for (std::int64_t k = 1; k <= 6; ++k) {
      CAPTURE(p);
      CAPTURE(k);
      // Never drafted: the prefix, then the continuation.
      auto clean = m.new_sequence();
      run(m, clean, std::span(seq).first(p));
      // Drafted k tokens (one per step when k is odd, in one call when even), rolled back.
      auto cache = m.new_sequence();
      run(m, cache, std::span(seq).first(p));
      if (k % 2 == 1) {
        for (std::int64_t i = 0; i < k; ++i)
          run(m, cache, std::span(draft).subspan(std::size_t(i), 1));
      } else {
        run(m, cache, std::span(draft).first(std::size_t(k)));
      }
      auto back = rollback(cache, k);
      REQUIRE_MESSAGE(back.ok(), back.error());
      check_same_state(cache, clean, m.text().sliding_window, m.text().head_dim,
                       std::size_t(m.text().engram_max_ngram_size - 1));
      // The continuation, in two calls, gives the same logits.
      for (auto part : {std::span(seq).subspan(p, 5), std::span(seq).subspan(p + 5, 9)})
        CHECK(run(m, cache, part) == run(m, clean, part));
    }
  }
  auto cache = m.new_sequence();
  run(m, cache, std::span(seq).first(3));
  CHECK(rollback(cache, 7).error() == "rollback: 7 tokens, expected 0 to 6");
  CHECK(rollback(cache, 4).error() ==
        "rollback: 4 tokens, only 3 since the start or the previous rollback");
  CHECK(rollback(cache, 2).ok());
  CHECK(cache.length == 1);
  run(m, cache, std::span(seq).subspan(1, 2));
  CHECK(rollback(cache, 3).error() ==
        "rollback: 3 tokens, only 2 since the start or the previous rollback");
  CHECK(rollback(cache, 2).ok());
  CHECK(cache.length == 1);
}

TEST_CASE("forward_last gives each sequence's last row of forward, bitwise in batch-invariant mode") {
  auto m = load_tiny({.threads = 2, .batch_invariant = true});
  const auto a = prompt(29, 31), b = prompt(3, 32);
  auto ca = m.new_sequence(), cb = m.new_sequence();
  std::vector<sequence_input> batch = {{&ca, a}, {&cb, b}};
  auto all = m.forward(batch);
  REQUIRE(all.ok());
  auto la = m.new_sequence(), lb = m.new_sequence();
  std::vector<sequence_input> again = {{&la, a}, {&lb, b}};
  auto last = m.forward_last(again);
  REQUIRE(last.ok());
  const std::size_t V = 256;
  REQUIRE(last->size() == 2 * V);
  CHECK(std::vector<float>(last->begin(), last->begin() + V) ==
        std::vector<float>(all->begin() + (a.size() - 1) * V, all->begin() + a.size() * V));
  CHECK(std::vector<float>(last->begin() + V, last->end()) ==
        std::vector<float>(all->end() - V, all->end()));
  CHECK(la.length == 29);  // the caches advance as with forward
}

TEST_CASE("forward_tail gives each sequence's last rows of forward and every token's features") {
  auto m = load_tiny({.threads = 2, .batch_invariant = true});
  const auto a = prompt(17, 41), b = prompt(4, 42);
  auto ca = m.new_sequence(), cb = m.new_sequence();
  std::vector<sequence_input> batch = {{&ca, a}, {&cb, b}};
  std::vector<float> features;
  auto all = m.forward(batch, nullptr, &features);
  REQUIRE(all.ok());
  auto ta = m.new_sequence(), tb = m.new_sequence();
  std::vector<sequence_input> again = {{&ta, a}, {&tb, b}};
  const std::vector<std::int64_t> rows = {5, 1};
  std::vector<float> tail_features;
  auto tail = m.forward_tail(again, rows, &tail_features);
  REQUIRE(tail.ok());
  const std::size_t V = 256;
  REQUIRE(tail->size() == 6 * V);
  CHECK(std::vector<float>(tail->begin(), tail->begin() + 5 * V) ==
        std::vector<float>(all->begin() + (a.size() - 5) * V, all->begin() + a.size() * V));
  CHECK(std::vector<float>(tail->begin() + 5 * V, tail->end()) ==
        std::vector<float>(all->end() - V, all->end()));
  CHECK(tail_features == features);
  CHECK(ta.length == 17);
  // A row count per sequence, each between 1 and its tokens.
  auto x = m.new_sequence();
  std::vector<sequence_input> one = {{&x, b}};
  const std::vector<std::int64_t> too_many = {5}, none = {0}, two = {1, 1};
  CHECK(m.forward_tail(one, too_many).error() ==
        "forward_tail: sequence 0 asks for 5 rows of its 4 tokens");
  CHECK_FALSE(m.forward_tail(one, none).ok());
  CHECK(m.forward_tail(one, two).error() == "forward_tail: 2 row counts for 1 sequences");
  CHECK(x.length == 0);  // refused before anything ran
}
