// The KV cache layers (kernels/kv_cache.hpp, kernels/kv_blocks.hpp): Block KV paged through a
// shared pool, its serialised form (bit-exact restore, corrupt / truncated bytes refused), State
// and SWA KV restored with it giving identical logits, paged vs contiguous storage, expert
// sharding, prefill vs prefill-then-decode, bounded replay and its divergence, and the CPU
// backend of the backend interface. On the tiny random checkpoint (window 8, ratio-2 and ratio-1
// KV sources) and the reference goldens' checkpoints.
#include <doctest/doctest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/kv_blocks.hpp"
#include "kernels/model.hpp"
#include "model_fixture.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

using testing::run;
using testing::prompt;

const fs::path source_dir = TROUPE_SOURCE_DIR;

model load_dir(const fs::path& dir, model_options options = {}) {
  auto m = model::load(dir, options);
  REQUIRE_MESSAGE(m.ok(), m.error());
  if (!m->text().engram_layer_ids.empty()) {
    std::vector<std::int64_t> map(static_cast<std::size_t>(m->text().vocab_size));
    if (fs::exists(dir / "engram_meta.json")) {
      std::ifstream f(dir / "engram_meta.json");
      map = nlohmann::json::parse(f).at("token_map").get<std::vector<std::int64_t>>();
    } else {
      for (std::size_t i = 0; i < map.size(); ++i)
        map[i] = std::int64_t(i) % m->text().engram_compressed_vocab_size;
    }
    REQUIRE(m->set_engram_token_map(map).ok());
  }
  return std::move(*m);
}

model load_tiny(model_options options = {}) {
  static const fs::path dir = testing::write_random_model(
      source_dir / "tests/kernels/fixtures/tiny-v41-config.json", "kv-tiny", 11);
  return load_dir(dir, options);
}


std::vector<float> last_row(const std::vector<float>& logits, std::int64_t vocab) {
  return {logits.end() - vocab, logits.end()};
}

// Every piece of the two caches, bit for bit: window rows held, compressed KV, indexer keys,
// compressor state, the Engram look-back and the length.
void check_identical(const sequence_cache& a, const sequence_cache& b) {
  REQUIRE(a.length == b.length);
  CHECK(a.rollback_floor == b.rollback_floor);
  CHECK(a.engram_recent == b.engram_recent);
  REQUIRE(a.layers.size() == b.layers.size());
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    CAPTURE(l);
    const auto& x = a.layers[l];
    const auto& y = b.layers[l];
    REQUIRE(x.window.begin() == y.window.begin());
    REQUIRE(x.window.end() == y.window.end());
    for (std::int64_t p = x.window.begin(); p < x.window.end(); ++p)
      CHECK(std::memcmp(x.window.at(p), y.window.at(p), sizeof(float) * x.window.width()) == 0);
    REQUIRE(x.is_kv_source == y.is_kv_source);
    if (!x.is_kv_source) continue;
    const auto& cx = x.compressed;
    const auto& cy = y.compressed;
    CHECK(cx.groups == cy.groups);
    for (auto [p, q] : {std::pair{&cx.kv, &cy.kv}, std::pair{&cx.index_keys, &cy.index_keys}}) {
      REQUIRE(p->size() == q->size());
      for (std::int64_t e = 0; e < p->size(); ++e)
        CHECK(std::memcmp(p->row(e), q->row(e), sizeof(float) * p->width()) == 0);
    }
    CHECK(cx.pending_tokens == cy.pending_tokens);
    CHECK(cx.pending_kv == cy.pending_kv);
    CHECK(cx.pending_gate == cy.pending_gate);
    CHECK(cx.recent_tokens == cy.recent_tokens);
    CHECK(cx.recent_kv == cy.recent_kv);
    CHECK(cx.recent_gate == cy.recent_gate);
  }
}

}  // namespace

TEST_CASE("Block KV pages come from the model's pool through block tables and go back to it") {
  auto m = load_tiny();
  auto pool = m.kv_pool();
  REQUIRE(pool->pages_in_use() == 0);
  const auto toks = prompt(300, 1, m.text().vocab_size);
  {
    auto a = m.new_sequence();
    run(m, a, toks);
    // Layers 1 (ratio 2: 150 groups, 64 per block) and 3 (ratio 1: 300 rows, 128 per block),
    // both owning indexer keys: 3 + 3 pages each.
    CHECK(a.layers[1].compressed.kv.block_table().size() == 3);
    CHECK(a.layers[3].compressed.kv.block_table().size() == 3);
    CHECK(pool->pages_in_use() == 12);
    auto b = a;  // a copy owns pages of its own
    CHECK(pool->pages_in_use() == 24);
    std::set<block_id> ids;
    for (const auto* c : {&a, &b})
      for (const auto& l : c->layers)
        for (const auto* p : {&l.compressed.kv, &l.compressed.index_keys})
          for (auto id : p->block_table()) CHECK(ids.insert(id).second);
    check_identical(a, b);
    REQUIRE(rollback(b, 6).ok());  // 294 tokens: layer 3 keeps 3 blocks, layer 1 still 3
    CHECK(pool->pages_in_use() == 24);
  }
  CHECK(pool->pages_in_use() == 0);
  const auto allocated = pool->pages_allocated();
  auto c = m.new_sequence();
  run(m, c, toks);
  CHECK(pool->pages_allocated() == allocated);  // freed pages reused
}

TEST_CASE("paged and contiguous KV give identical logits") {
  auto m = load_tiny();
  const auto toks = prompt(290, 2, m.text().vocab_size);
  auto paged = m.new_sequence();
  auto flat = m.new_sequence(kv_layout::contiguous);
  CHECK(flat.layers[1].compressed.kv.block_table().empty());
  CHECK(run(m, paged, std::span(toks).first(270)) == run(m, flat, std::span(toks).first(270)));
  for (std::size_t i = 270; i < toks.size(); ++i)  // decode across the next block boundary
    CHECK(run(m, paged, std::span(toks).subspan(i, 1)) ==
          run(m, flat, std::span(toks).subspan(i, 1)));
  CHECK(flat.layers[1].compressed.kv.block_table().empty());
  CHECK(paged.layers[3].compressed.kv.block_table().size() == 3);
}

TEST_CASE("one prefill equals prefill then decode, across block boundaries") {
  // Bitwise in batch-invariant mode. (In the default mode the GEMM blocking differs between 250
  // rows and one, and over 262 tokens of a random model that rounding can flip an indexer top-k
  // pick: the default mode's chunking test bounds 37 tokens at 1e-5 in test_model.cpp.)
  auto m = load_tiny({.batch_invariant = true});
  const auto toks = prompt(262, 3, m.text().vocab_size);
  auto whole_cache = m.new_sequence();
  const auto whole = run(m, whole_cache, toks);
  auto cache = m.new_sequence();
  auto got = run(m, cache, std::span(toks).first(250));
  for (std::size_t i = 250; i < toks.size(); ++i) {
    auto step = run(m, cache, std::span(toks).subspan(i, 1));
    got.insert(got.end(), step.begin(), step.end());
  }
  CHECK(got == whole);
  check_identical(cache, whole_cache);
}

TEST_CASE("experts sharded over 1, 2 and 4 shards give the same logits") {
  // Sharding changes only the order the experts' partial outputs are summed in (~1e-7
  // relative); 1e-5 holds once the prompt is away from every decision boundary
  // (model_fixture.hpp). This random model is touchy: of prompt seeds 4..40, about half put a
  // decision within the probe's reach under some BLAS kernel (seed 4, used before, under
  // Haswell); seed 23 is clear under all four this suite runs.
  const auto toks = prompt(40, 23, 256);
  testing::require_stable_inputs(
      {},
      [&](const model_options& o) {
        auto m = load_tiny(o);
        auto c = m.new_sequence();
        return std::pair{run(m, c, toks), std::vector<std::int64_t>{}};
      },
      1e-5);
  auto one = load_tiny();
  auto c1 = one.new_sequence();
  const auto ref = run(one, c1, toks);
  for (int shards : {2, 4}) {
    CAPTURE(shards);
    auto m = load_tiny({.expert_shards = shards});
    auto c = m.new_sequence();
    CHECK(testing::relative_error(run(m, c, toks), ref) <= 1e-5);
    // Decode too.
    auto d = m.new_sequence();
    run(m, d, std::span(toks).first(39));
    CHECK(testing::relative_error(run(m, d, std::span(toks).subspan(39, 1)),
                                  last_row(ref, 256)) <= 1e-5);
  }
  // 8 experts do not split into 3 shards.
  static const fs::path dir = testing::write_random_model(
      source_dir / "tests/kernels/fixtures/tiny-v41-config.json", "kv-shards", 11);
  auto bad = model::load(dir, {.expert_shards = 3});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("expert_shards 3") != std::string::npos);
}

namespace {

// The tiny model's 8 experts over EP groups as the expert balancer might place them: one
// rank; 4 ranks with copies of experts 3 and 5; 3 ranks with three copies; two ranks holding
// shuffled experts, one of them twice (expert 2 lives on both).
std::vector<expert_placement> test_placements() {
  std::vector<expert_placement> out;
  out.push_back(*place_experts(8, 1));
  const std::int32_t hot4[] = {3, 5};
  out.push_back(*place_experts(8, 4, hot4));
  const std::int32_t hot3[] = {0, 1, 2};
  out.push_back(*place_experts(8, 3, hot3));
  expert_placement p;
  p.experts = 8;
  p.ranks = 2;
  p.local = {{7, 2, 5, 0}, {1, 3, 2, 4, 6}};
  p.homes = {{0}, {1}, {1, 0}, {1}, {1}, {0}, {1}, {0}};
  out.push_back(p);
  return out;
}

std::uint64_t total(const std::vector<std::uint64_t>& v) {
  std::uint64_t n = 0;
  for (auto x : v) n += x;
  return n;
}

std::vector<std::uint64_t> minus(std::vector<std::uint64_t> a, const std::vector<std::uint64_t>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
  return a;
}

std::int64_t argmax(std::span<const float> row) {
  return std::max_element(row.begin(), row.end()) - row.begin();
}

}  // namespace

TEST_CASE("an expert placement moves experts between ranks and leaves every logit unchanged") {
  auto m = load_tiny({.batch_invariant = true});
  const auto V = m.text().vocab_size;
  const auto toks = prompt(40, 23, V);
  auto c0 = m.new_sequence();
  const auto before = m.expert_counts();
  const auto ref = run(m, c0, toks);
  // The router's top-k counts: every token of every main layer picks 2 experts.
  const auto routed = minus(m.expert_counts(), before);
  CHECK(total(routed) == 40u * 2u * 6u);

  for (const auto& p : test_placements()) {
    CAPTURE(p.ranks);
    REQUIRE(m.set_expert_placement(p).ok());
    auto c = m.new_sequence();
    const auto at = m.expert_counts();
    const auto got = run(m, c, toks);
    REQUIRE(got.size() == ref.size());
    CHECK(std::memcmp(got.data(), ref.data(), sizeof(float) * ref.size()) == 0);
    CHECK(minus(m.expert_counts(), at) == routed);  // same routing, counted the same
  }

  // Greedy decoding that switches placement at every step boundary, against one that never
  // has a placement: the same tokens and the same bits.
  auto greedy = [&](bool switching) {
    REQUIRE(m.set_expert_placement(std::nullopt).ok());
    const auto placements = test_placements();
    auto c = m.new_sequence();
    std::vector<float> logits = run(m, c, std::span(toks).first(17));
    std::vector<std::int64_t> out;
    std::vector<float> all;
    for (int step = 0; step < 12; ++step) {
      const auto row = last_row(logits, V);
      all.insert(all.end(), row.begin(), row.end());
      out.push_back(argmax(row));
      if (switching)
        REQUIRE(m.set_expert_placement(placements[std::size_t(step) % placements.size()]).ok());
      logits = run(m, c, std::span(out).last(1));
    }
    return std::pair{out, all};
  };
  const auto plain = greedy(false);
  const auto switched = greedy(true);
  CHECK(switched.first == plain.first);
  REQUIRE(switched.second.size() == plain.second.size());
  CHECK(std::memcmp(switched.second.data(), plain.second.data(),
                    sizeof(float) * plain.second.size()) == 0);
  REQUIRE(m.set_expert_placement(std::nullopt).ok());

  // Without batch invariance an expert's rows may round differently with other rows beside
  // them: close, not bitwise (these inputs sit clear of every top-k boundary at 1e-5: above).
  auto fast = load_tiny();
  auto cf = fast.new_sequence();
  const auto fast_ref = run(fast, cf, toks);
  REQUIRE(fast.set_expert_placement(test_placements()[1]).ok());
  auto cp = fast.new_sequence();
  CHECK(testing::relative_error(run(fast, cp, toks), fast_ref) <= 1e-5);
}

TEST_CASE("a wrong expert placement is refused and changes nothing") {
  auto m = load_tiny({.batch_invariant = true});
  auto seven = *place_experts(7, 2);
  auto r = m.set_expert_placement(seven);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("places 7 experts, the model has 8") != std::string::npos);

  auto homeless = *place_experts(8, 2);
  homeless.homes[4].clear();
  r = m.set_expert_placement(homeless);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("expert 4 has no home") != std::string::npos);

  auto lying = *place_experts(8, 2);
  lying.homes[0] = {1};  // rank 1 holds experts 4..7
  r = m.set_expert_placement(lying);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("expert 0 lists rank 1, which does not hold it") != std::string::npos);

  auto sharded = load_tiny({.expert_shards = 2});
  r = sharded.set_expert_placement(*place_experts(8, 2));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("expert shards") != std::string::npos);
}

TEST_CASE("Block KV, State KV and SWA KV serialise and restore bit-exactly") {
  auto m = load_tiny();
  const auto V = m.text().vocab_size;
  const auto toks = prompt(300, 5, V);
  auto a = m.new_sequence();
  run(m, a, toks);
  REQUIRE(full_blocks(a) == 2);
  std::vector<std::string> blocks;
  for (std::int64_t b = 0; b < 2; ++b) {
    auto bytes = serialize_block(a, b);
    REQUIRE_MESSAGE(bytes.ok(), bytes.error());
    // Layer 1: 64 KV rows of 32 packed as FP4 (+ an e4m3 scale per 16) and 64 keys of 16 in
    // fp32 (the quantiser skips a width of 16); layer 3 likewise with 128 rows.
    CHECK(std::int64_t(bytes->size()) == block_kv_bytes(m.text()));
    blocks.push_back(std::move(*bytes));
  }
  CHECK_FALSE(serialize_block(a, 2).ok());  // the third block is not full
  auto state = serialize_state(a);
  auto swa = serialize_swa(a);
  REQUIRE(state.ok());
  REQUIRE(swa.ok());

  auto b = m.new_sequence();
  CHECK_FALSE(restore_block(b, 1, blocks[1]).ok());  // blocks restore in order
  CHECK_FALSE(restore_block(b, 0, blocks[1]).ok());  // the bytes name their block
  for (std::int64_t i = 0; i < 2; ++i) REQUIRE(restore_block(b, i, blocks[std::size_t(i)]).ok());
  REQUIRE_MESSAGE(restore_state(b, *state).ok(), restore_state(b, *state).error());
  auto r = restore_swa(b, *swa);
  REQUIRE_MESSAGE(r.ok(), r.error());
  check_identical(a, b);
  // The next tokens' logits, and a rollback, behave identically.
  const auto more = prompt(5, 6, V);
  CHECK(run(m, a, more) == run(m, b, more));
  REQUIRE(rollback(a, 3).ok());
  REQUIRE(rollback(b, 3).ok());
  CHECK(run(m, a, std::span(more).first(2)) == run(m, b, std::span(more).first(2)));

  // Restoring State KV without its blocks is refused.
  auto c = m.new_sequence();
  CHECK_FALSE(restore_state(c, *state).ok());
}

TEST_CASE("corrupt, truncated and foreign KV bytes are refused and leave the cache as it was") {
  auto m = load_tiny();
  auto a = m.new_sequence();
  run(m, a, prompt(140, 7, m.text().vocab_size));
  auto block = serialize_block(a, 0);
  auto state = serialize_state(a);
  auto swa = serialize_swa(a);
  REQUIRE((block.ok() && state.ok() && swa.ok()));
  for (const std::string* s : {&*block, &*state, &*swa}) {
    for (std::size_t at = 0; at < s->size(); at += 1 + s->size() / 97) {
      CAPTURE(at);
      std::string bad = *s;
      bad[at] = char(bad[at] ^ 0x10);
      auto b = m.new_sequence();
      CHECK_FALSE(restore_block(b, 0, bad).ok());
      CHECK_FALSE(restore_state(b, bad).ok());
      CHECK_FALSE(restore_swa(b, bad).ok());
      CHECK(b.layers[1].compressed.kv.size() == 0);
      CHECK(b.layers[0].window.end() == 0);
    }
    for (std::size_t n : {std::size_t(0), std::size_t(7), std::size_t(23), s->size() / 2,
                          s->size() - 1}) {
      auto b = m.new_sequence();
      const auto cut = std::string_view(*s).substr(0, n);
      CHECK_FALSE(restore_block(b, 0, cut).ok());
      CHECK_FALSE(restore_state(b, cut).ok());
      CHECK_FALSE(restore_swa(b, cut).ok());
    }
  }
  // A checksum-valid string of another kind is refused by its magic.
  auto b = m.new_sequence();
  auto wrong = restore_block(b, 0, *state);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().find("magic") != std::string::npos);
  // Bytes of another model's cache are refused by shape.
  auto other = load_dir(source_dir / "tests/kernels/golden/model/qat");
  auto o = other.new_sequence();
  run(other, o, prompt(130, 8, other.text().vocab_size));
  auto foreign = serialize_block(o, 0);
  REQUIRE(foreign.ok());
  CHECK_FALSE(restore_block(b, 0, *foreign).ok());
  CHECK(b.layers[1].compressed.kv.size() == 0);
}

namespace {

// `bytes` with its payload replaced by `payload` and a checksum that matches again: what reaches
// the payload parsers past the frame.
std::string reframe(const std::string& bytes, std::string_view payload) {
  std::string f = bytes.substr(0, 8);
  const std::uint64_t size = payload.size();
  f.append(reinterpret_cast<const char*>(&size), sizeof size);
  f += payload;
  const std::uint64_t h = XXH3_64bits(f.data(), f.size());
  f.append(reinterpret_cast<const char*>(&h), sizeof h);
  return f;
}

}  // namespace

TEST_CASE("payloads cut short or padded behind a valid checksum are refused") {
  auto m = load_tiny();
  auto a = m.new_sequence();
  run(m, a, prompt(140, 18, m.text().vocab_size));
  const auto block = *serialize_block(a, 0);
  const auto state = *serialize_state(a);
  const auto swa = *serialize_swa(a);
  auto payload = [](const std::string& s) { return std::string_view(s).substr(16, s.size() - 24); };
  // Re-framing the whole payload is accepted (the helper is right) ...
  {
    auto b = m.new_sequence();
    REQUIRE(restore_block(b, 0, reframe(block, payload(block))).ok());
    REQUIRE(restore_state(b, reframe(state, payload(state))).ok());
    REQUIRE(restore_swa(b, reframe(swa, payload(swa))).ok());
    check_identical(a, b);
  }
  // ... every strict prefix of it, and it with a byte more, are not.
  for (const std::string* s : {&block, &state, &swa}) {
    const auto p = payload(*s);
    for (std::size_t n = 0; n < p.size(); n += 1 + p.size() / 211) {
      CAPTURE(n);
      auto b = m.new_sequence();
      const auto cut = reframe(*s, p.substr(0, n));
      CHECK_FALSE(restore_block(b, 0, cut).ok());
      CHECK_FALSE(restore_state(b, cut).ok());
      CHECK_FALSE(restore_swa(b, cut).ok());
      CHECK(b.layers[1].compressed.kv.size() == 0);
      CHECK(b.layers[0].window.end() == 0);
    }
    auto b = m.new_sequence();
    const auto padded = reframe(*s, std::string(p) + '\0');
    CHECK_FALSE(restore_block(b, 0, padded).ok());
    CHECK_FALSE(restore_state(b, padded).ok());
    CHECK_FALSE(restore_swa(b, padded).ok());
  }
}

TEST_CASE("Block KV packs the full-scale config at about 890 bytes per token") {
  auto cfg = load_model_config(source_dir / "examples/models/DeepSeek-V4.1-Flash/config.json");
  REQUIRE_MESSAGE(cfg.ok(), cfg.error());
  // Three ratio-2 and one ratio-1 KV sources, each owning its indexer keys: per latent 512
  // channels as 256 bytes of FP4 codes + 32 e4m3 scales, per key 128 channels as 64 + 4 bytes.
  const std::int64_t data = 3 * 64 * (288 + 68) + 128 * (288 + 68);
  const std::int64_t headers = 24 + 12 + 4 * (20 + 2);
  CHECK(block_kv_bytes(cfg->text) == data + headers);
  CHECK(double(block_kv_bytes(cfg->text)) / 128.0 == doctest::Approx(891.0).epsilon(0.001));
}

TEST_CASE("the qat golden's Block KV packs every tensor and restores bit-exactly") {
  // head_dim 32 and index_head_dim 32: both quantisers run, so both tensors pack as FP4.
  auto m = load_dir(source_dir / "tests/kernels/golden/model/qat");
  auto a = m.new_sequence();
  run(m, a, prompt(260, 9, m.text().vocab_size));
  REQUIRE(full_blocks(a) == 2);
  auto bytes = serialize_block(a, 1);
  REQUIRE(bytes.ok());
  CHECK(std::int64_t(bytes->size()) == block_kv_bytes(m.text()));
  // FP4 packing: well under the fp32 size of the 64 + 128 rows of 32 + 32 channels.
  CHECK(bytes->size() < (64 + 128) * 64 * 4 / 6);
  auto b = m.new_sequence();
  REQUIRE(restore_block(b, 0, *serialize_block(a, 0)).ok());
  REQUIRE(restore_block(b, 1, *bytes).ok());
  for (std::size_t l : {0u, 1u})
    for (std::int64_t e = 0; e < 256 / (l == 0 ? 2 : 1); ++e)
      CHECK(std::memcmp(a.layers[l].compressed.kv.row(e), b.layers[l].compressed.kv.row(e),
                        sizeof(float) * 32) == 0);
}

TEST_CASE("bounded replay recomputing every token equals the exact path") {
  auto m = load_tiny();
  const auto toks = prompt(300, 10, m.text().vocab_size);
  auto exact = m.new_sequence();
  const auto logits = run(m, exact, toks);
  auto r = m.new_sequence();
  for (std::int64_t b = 0; b < full_blocks(exact); ++b)
    REQUIRE(restore_block(r, b, *serialize_block(exact, b)).ok());
  auto replayed = m.replay(r, toks, 300);
  REQUIRE_MESSAGE(replayed.ok(), replayed.error());
  // Only the next token's row goes through the LM head (forward_last: equal to rounding).
  REQUIRE(std::int64_t(replayed->size()) == m.text().vocab_size);
  CHECK(testing::relative_error(*replayed, last_row(logits, m.text().vocab_size)) <= 1e-6);
  check_identical(exact, r);
}

TEST_CASE("bounded replay from Block KV alone approximates the exact next-token logits") {
  // The tiny model and the goldens' checkpoints (windows of 8) on 260 tokens: two full blocks
  // restored, then replay of the last 8 (one window: what full scale does with 128), 16 or 32
  // tokens. Divergence = max |Δ| / max |exact| of the next-token logits and of the 4 decode
  // steps after. The bounds are the measured values rounded up (docs/model.md).
  struct config {
    std::string name;
    fs::path dir;
  };
  static const fs::path tiny = testing::write_random_model(
      source_dir / "tests/kernels/fixtures/tiny-v41-config.json", "kv-replay", 11);
  const fs::path golden = source_dir / "tests/kernels/golden/model";
  for (const auto& [name, dir] :
       {config{"tiny", tiny}, config{"mixed", golden / "mixed"}, config{"ratio4", golden / "ratio4"},
        config{"qat", golden / "qat"}}) {
    auto m = load_dir(dir);
    const auto V = m.text().vocab_size;
    const auto toks = prompt(260, 12, V);  // two full blocks and 4 tokens
    const auto next = prompt(4, 13, V);
    std::vector<double> errs;
    for (std::int64_t recompute : {8, 16, 32}) {
      CAPTURE(name);
      CAPTURE(recompute);
      auto exact = m.new_sequence();
      const auto ref = last_row(run(m, exact, toks), V);
      auto r = m.new_sequence();
      for (std::int64_t b = 0; b < full_blocks(exact); ++b)
        REQUIRE(restore_block(r, b, *serialize_block(exact, b)).ok());
      auto got = m.replay(r, toks, recompute);
      REQUIRE_MESSAGE(got.ok(), got.error());
      CHECK(std::int64_t(got->size()) == V);
      CHECK(r.length == exact.length);
      const double err = testing::relative_error(*got, ref);
      const auto ref_next = run(m, exact, next);
      const double err_next = testing::relative_error(run(m, r, next), ref_next);
      MESSAGE(name << " recompute " << recompute << ": next-token divergence " << err
                   << ", next 4 tokens " << err_next);
      errs.push_back(std::max(err, err_next));
    }
    CHECK(errs[0] > 0.0);   // one window replayed: the first tokens lack theirs
    CHECK(errs[0] <= 0.7);  // measured up to 0.61 on these random models
    CHECK(errs[2] <= 1e-2);  // four windows: measured up to 5.3e-3
    CHECK(errs[2] < errs[0]);
  }
}

TEST_CASE("replaying the receptive field (layers x window) rebuilds the exact state") {
  // Layer l's window state at the prefix's end depends on the last (L - l + 1) windows of
  // tokens only (each layer looks one window further back; the compressed attention reads the
  // restored Block KV), so a replay of L windows from empty rings is the exact rebuild that
  // bounded replay approximates with one window (docs/model.md, "Bounded replay"). Exact up to
  // summation order, so compared at 1e-5 on a prompt whose decisions are away from their
  // boundaries: the first of a few seeds the stability probe passes (model_fixture.hpp; these
  // random models are touchy, and which seeds pass depends on the BLAS kernel).
  static const fs::path tiny = testing::write_random_model(
      source_dir / "tests/kernels/fixtures/tiny-v41-config.json", "kv-exact-rebuild", 11);
  const fs::path golden = source_dir / "tests/kernels/golden/model";
  for (const auto& dir : {tiny, golden / "mixed", golden / "ratio4", golden / "qat"}) {
    CAPTURE(dir);
    auto m = load_dir(dir);
    const auto& c = m.text();
    const auto V = c.vocab_size;
    const auto next = prompt(4, 13, V);
    // The exact path: a prefix of two full blocks, then 4 more tokens.
    auto exact_of = [&](const std::vector<std::int64_t>& toks, const model_options& o) {
      auto mo = load_dir(dir, o);
      auto s = mo.new_sequence();
      auto out = last_row(run(mo, s, toks), V);
      const auto more = run(mo, s, next);
      out.insert(out.end(), more.begin(), more.end());
      return out;
    };
    std::vector<std::int64_t> toks;
    for (std::uint32_t seed = 12; seed < 24 && toks.empty(); ++seed) {
      auto candidate = prompt(256, seed, V);
      const auto p = testing::probe_stability({}, [&](const model_options& o) {
        return std::pair{exact_of(candidate, o), std::vector<std::int64_t>{}};
      });
      if (p.worst_relative_change <= 5e-6 && !p.changed_decision)
        toks = std::move(candidate);
    }
    REQUIRE_MESSAGE(!toks.empty(), "no prompt seed in 12..23 is away from every boundary");
    auto exact = m.new_sequence();
    const auto ref = last_row(run(m, exact, toks), V);
    const auto ref_next = run(m, exact, next);
    for (std::int64_t windows : {std::int64_t{1}, c.num_hidden_layers}) {
      CAPTURE(windows);
      auto r = m.new_sequence();
      for (std::int64_t b = 0; b < full_blocks(exact); ++b)
        REQUIRE(restore_block(r, b, *serialize_block(exact, b)).ok());
      auto got = m.replay(r, toks, windows * c.sliding_window);
      REQUIRE_MESSAGE(got.ok(), got.error());
      const double err = std::max(testing::relative_error(*got, ref),
                                  testing::relative_error(run(m, r, next), ref_next));
      MESSAGE(dir.filename().string() << ": " << windows << " window(s) replayed, divergence "
                                      << err);
      if (windows == 1)
        CHECK(err > 1e-3);
      else
        CHECK(err <= 1e-5);
    }
  }
}

TEST_CASE("the CPU backend runs steps, exports and imports blocks, and replays") {
  cpu_backend cpu(load_tiny());
  model_backend& be = cpu;
  const auto V = cpu.cpu_model().text().vocab_size;
  const auto toks = prompt(260, 14, V);
  const auto a = be.open_sequence();
  step_input in{a, toks};
  auto logits = be.step(std::span(&in, 1));
  REQUIRE(logits.ok());
  CHECK(*be.length(a) == 260);
  const auto b = be.open_sequence();
  for (std::int64_t k = 0; k < 2; ++k) {
    auto bytes = be.export_block(a, k);
    REQUIRE(bytes.ok());
    REQUIRE(be.import_block(b, k, *bytes).ok());
  }
  auto replayed = be.replay(b, toks);
  REQUIRE(replayed.ok());
  // The same as the model's replay on the same blocks.
  auto direct = cpu.cpu_model().new_sequence();
  for (std::int64_t k = 0; k < 2; ++k)
    REQUIRE(restore_block(direct, k, *be.export_block(a, k)).ok());
  auto want = cpu.cpu_model().replay(direct, toks);
  REQUIRE(want.ok());
  CHECK(*replayed == *want);
  CHECK(*be.length(b) == 260);
  CHECK_FALSE(be.import_block(b, 2, *be.export_block(a, 0)).ok());  // b already ran tokens
  REQUIRE(be.rollback(b, 2).ok());
  CHECK(*be.length(b) == 258);
  REQUIRE(be.close_sequence(a).ok());
  CHECK_FALSE(be.close_sequence(a).ok());
  CHECK_FALSE(be.step(std::span(&in, 1)).ok());
  CHECK_FALSE(be.export_block(a, 0).ok());
}

TEST_CASE("the CPU backend moves a whole sequence to another backend exactly") {
  cpu_backend from(load_tiny({.batch_invariant = true}));
  cpu_backend to(load_tiny({.batch_invariant = true}));
  const auto V = from.cpu_model().text().vocab_size;
  const auto toks = prompt(261, 16, V);  // two full blocks and a partial one
  const auto a = from.open_sequence();
  step_input in{a, toks};
  REQUIRE(from.step(std::span(&in, 1)).ok());
  REQUIRE(*from.full_blocks(a) == 2);
  const auto b = to.open_sequence();
  for (std::int64_t k = 0; k < 2; ++k) REQUIRE(to.import_block(b, k, *from.export_block(a, k)).ok());
  REQUIRE(to.import_state(b, *from.export_state(a)).ok());
  REQUIRE(to.import_swa(b, *from.export_swa(a)).ok());
  CHECK(*to.length(b) == 261);
  // The next tokens give bitwise the same logits on both.
  const auto next = prompt(3, 17, V);
  step_input na{a, next}, nb{b, next};
  auto la = from.step(std::span(&na, 1));
  auto lb = to.step(std::span(&nb, 1));
  REQUIRE(la.ok());
  REQUIRE(lb.ok());
  CHECK(*la == *lb);
  // A state goes only into a fresh sequence (after its blocks); unknown ids are refused.
  CHECK_FALSE(to.import_state(b, *from.export_state(a)).ok());
  CHECK_FALSE(from.export_state(999).ok());
  CHECK_FALSE(from.export_swa(999).ok());
  CHECK_FALSE(from.full_blocks(999).ok());
  CHECK_FALSE(to.import_swa(999, *from.export_swa(a)).ok());
}

TEST_CASE("the encoder-decoder prefill keeps the encoder and the decoder's KV exact") {
  // Batch-invariant mode, so that running fewer rows changes no rounding: every encoder layer's
  // cache and the decoder's full-resolution KV (layer 3) equal the exact prefill's bit for bit;
  // only the decoder's window rings start at the tail.
  auto m = load_tiny({.batch_invariant = true});
  const auto V = m.text().vocab_size;
  const auto toks = prompt(200, 15, V);
  auto exact = m.new_sequence();
  const auto ref = run(m, exact, toks);
  auto ed = m.new_sequence();
  auto got = m.prefill_encoder_decoder(ed, toks, 32);
  REQUIRE_MESSAGE(got.ok(), got.error());
  REQUIRE(std::int64_t(got->size()) == 32 * V);
  CHECK(ed.length == 200);
  for (std::size_t l = 0; l < 3; ++l) {  // the encoder: identical rings and compressed KV
    CAPTURE(l);
    for (std::int64_t p = exact.layers[l].window.begin(); p < 200; ++p)
      CHECK(std::memcmp(exact.layers[l].window.at(p), ed.layers[l].window.at(p),
                        sizeof(float) * 32) == 0);
  }
  for (std::size_t l : {1u, 3u}) {
    const auto& x = exact.layers[l].compressed;
    const auto& y = ed.layers[l].compressed;
    REQUIRE(x.kv.size() == y.kv.size());
    REQUIRE(x.index_keys.size() == y.index_keys.size());
    for (std::int64_t e = 0; e < x.kv.size(); ++e)
      CHECK(std::memcmp(x.kv.row(e), y.kv.row(e), sizeof(float) * 32) == 0);
    for (std::int64_t e = 0; e < x.index_keys.size(); ++e)
      CHECK(std::memcmp(x.index_keys.row(e), y.index_keys.row(e), sizeof(float) * 16) == 0);
  }
  // The decoder (layers 3-5, window 8) reaches back 3 × 7 = 21 positions: a tail of 32 covers
  // everything the last token depends on, so its logits and what follows are exact.
  CHECK(last_row(*got, V) == last_row(ref, V));
  const auto next = prompt(4, 16, V);
  auto exact_next = exact;
  const auto ref_next = run(m, exact_next, next);
  CHECK(run(m, ed, next) == ref_next);
  // A tail of one window (what full scale does with 128) approximates them.
  auto short_tail = m.new_sequence();
  auto got8 = m.prefill_encoder_decoder(short_tail, toks, 8);
  REQUIRE(got8.ok());
  REQUIRE(std::int64_t(got8->size()) == 8 * V);
  const double err = testing::relative_error(last_row(*got8, V), last_row(ref, V));
  const double err_next = testing::relative_error(run(m, short_tail, next), ref_next);
  MESSAGE("encoder-decoder prefill, tail 8: next-token divergence " << err << ", next 4 tokens "
                                                                     << err_next);
  CHECK(err > 0.0);
  CHECK(err <= 0.1);  // measured 0.067
  CHECK(err_next <= 0.1);
  // The goldens' checkpoints, tail of one window (8) on 200 tokens: measured up to 0.097.
  const fs::path golden = source_dir / "tests/kernels/golden/model";
  for (const char* name : {"mixed", "ratio4", "qat"}) {
    CAPTURE(name);
    auto g = load_dir(golden / name);
    const auto gt = prompt(200, 17, g.text().vocab_size);
    auto gx = g.new_sequence();
    const auto gref = last_row(run(g, gx, gt), g.text().vocab_size);
    auto ge = g.new_sequence();
    auto gl = g.prefill_encoder_decoder(ge, gt, 8);
    REQUIRE_MESSAGE(gl.ok(), gl.error());
    const double e = testing::relative_error(last_row(*gl, g.text().vocab_size), gref);
    MESSAGE(std::string(name) << " encoder-decoder prefill, tail 8: next-token divergence " << e);
    CHECK(e <= 0.15);
  }
  // A tail covering the prompt is the exact prefill.
  auto whole = m.new_sequence();
  auto all = m.prefill_encoder_decoder(whole, std::span(toks).first(30), 32);
  REQUIRE(all.ok());
  auto exact30 = m.new_sequence();
  CHECK(*all == run(m, exact30, std::span(toks).first(30)));
  // Refusals: a used cache; a config whose first ratio-1 layer is not a KV source.
  CHECK_FALSE(m.prefill_encoder_decoder(ed, toks).ok());
}
