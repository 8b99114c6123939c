// The DSpark draft call on random `troupe model init` checkpoints (the tiny preset: two draft
// stages, block size 5). No reference implements the draft layers at the pinned transformers
// commit: besides a partial oracle (tools/dspark_golden.py, the last test but one), these tests
// check the structure: shapes, that drafts are the argmax of the returned draft logits and
// confidences are probabilities, determinism and batch independence, that the context and the
// Markov chain matter, rollback, and several block sizes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/kv_blocks.hpp"
#include "kernels/model.hpp"
#include "kernels/model_init.hpp"
#include "kernels/model_layout.hpp"
#include "model_fixture.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

// A tiny model directory; block_size > 0 rewrites dspark_block_size in its config.json.
fs::path tiny_dir(int block_size = 0) {
  const fs::path dir = testing::scratch_root() / ("dspark-" + std::to_string(block_size));
  if (!fs::exists(dir / "config.json")) {
    auto w = write_random_model(dir, "tiny", 11);
    REQUIRE_MESSAGE(w.ok(), w.error());
    if (block_size > 0) {
      std::ifstream in(dir / "config.json");
      auto j = nlohmann::json::parse(in);
      j["text_config"]["dspark_block_size"] = block_size;
      std::ofstream(dir / "config.json", std::ios::trunc) << j.dump(2);
    }
  }
  return dir;
}

model load(const fs::path& dir, model_options o = {}) {
  auto m = model::load(dir, o);
  REQUIRE_MESSAGE(m.ok(), m.error());
  std::vector<std::int64_t> map(256);
  std::iota(map.begin(), map.end(), 0);
  REQUIRE(m->set_engram_token_map(map).ok());
  return std::move(*m);
}

std::vector<std::int64_t> prompt(std::int64_t n, std::int64_t salt) {
  std::vector<std::int64_t> t(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) t[std::size_t(i)] = (i * 37 + salt * 11 + 5) % 250;
  return t;
}

// Runs the target on `tokens` (a fresh sequence) and returns the DSpark features.
std::vector<float> features_of(const model& m, const std::vector<std::int64_t>& tokens) {
  auto cache = m.new_sequence();
  sequence_input in{&cache, tokens};
  std::vector<float> f;
  auto logits = m.forward(std::span(&in, 1), nullptr, &f);
  REQUIRE_MESSAGE(logits.ok(), logits.error());
  return f;
}

draft_output draft_one(const model& m, std::span<const float> f, std::int64_t anchor) {
  auto st = m.new_draft_state();
  draft_input in{&st, f, anchor};
  auto d = m.draft(std::span(&in, 1));
  REQUIRE_MESSAGE(d.ok(), d.error());
  return std::move(*d);
}

}  // namespace

TEST_CASE("dspark: the released layout lists the draft stages and init writes them") {
  auto text = preset_config_json("tiny");
  REQUIRE(text.ok());
  auto cfg = parse_model_config(*text);
  REQUIRE_MESSAGE(cfg.ok(), cfg.error());
  const auto& t = cfg->text;
  REQUIRE(t.num_nextn_predict_layers == 2);
  std::map<std::string, std::vector<std::int64_t>> mtp;
  for (const auto& w : released_layout(*cfg))
    if (w.name.rfind("mtp.", 0) == 0) mtp[w.name] = w.shape;
  const std::int64_t D = t.hidden_size, rank = t.dspark_markov_rank;
  CHECK(mtp.at("mtp.0.main_proj.weight") == std::vector<std::int64_t>{D, 3 * D});
  CHECK(mtp.at("mtp.1.markov_head.embed.weight") == std::vector<std::int64_t>{t.vocab_size, rank});
  CHECK(mtp.at("mtp.1.markov_head.head.weight") == std::vector<std::int64_t>{t.vocab_size, rank});
  CHECK(mtp.at("mtp.1.confidence_head.proj.weight") == std::vector<std::int64_t>{1, D + rank});
  CHECK(mtp.at("mtp.0.ffn.gate.weight") == std::vector<std::int64_t>{t.dspark_n_routed_experts, D});
  const auto past_last = std::to_string(t.dspark_n_routed_experts);
  CHECK(mtp.count("mtp.0.ffn.experts." + past_last + ".w1.weight") == 0);
  CHECK(mtp.count("mtp.0.norm.weight") == 0);  // only the last stage
  CHECK(mtp.count("mtp.1.main_proj.weight") == 0);
  CHECK(mtp.count("mtp.0.attn.compressor.wkv.weight") == 0);  // sliding window only
  const auto m = load(tiny_dir());
  CHECK(m.has_draft());
  CHECK(m.new_draft_state().rings.size() == 2);
}

// The released V4.1-Flash checkpoint's draft tensors and storage, as DeepSeek's inference code
// and vLLM's V4.1 loader read them and as public tools that read its index list them (docs/
// kernels.md): FP8 dense weights (main_proj too) with one E8M0 scale per 32 x 32 block, FP4
// experts with one per 32 values, BF16 Markov and confidence heads, no hc_head, no mtp copy of
// the embedding or the LM head.
TEST_CASE("dspark: the released V4.1-Flash config gives the released draft tensors, dtypes and shapes") {
  auto cfg = load_model_config(fs::path(TROUPE_SOURCE_DIR) / "examples/models/DeepSeek-V4.1-Flash");
  REQUIRE_MESSAGE(cfg.ok(), cfg.error());
  std::map<std::string, stored_tensor> stored;
  for (const auto& w : released_layout(*cfg))
    for (auto& t : stored_tensors(w)) stored[t.name] = t;
  auto check = [&](const std::string& name, dtype type, std::vector<std::int64_t> shape) {
    CAPTURE(name);
    REQUIRE(stored.count(name) == 1);
    CHECK(stored.at(name).type == type);
    CHECK(stored.at(name).shape == shape);
  };
  check("mtp.0.main_proj.weight", dtype::F8_E4M3, {5120, 15360});
  check("mtp.0.main_proj.scale", dtype::F8_E8M0, {160, 480});
  check("mtp.0.main_norm.weight", dtype::BF16, {5120});
  check("layers.0.ffn.shared_experts.w2.weight", dtype::F8_E4M3, {5120, 2304});
  check("layers.0.ffn.shared_experts.w2.scale", dtype::F8_E8M0, {160, 72});
  check("mtp.0.ffn.experts.0.w2.weight", dtype::I8, {5120, 1152});
  check("mtp.0.ffn.experts.0.w2.scale", dtype::F8_E8M0, {5120, 72});
  check("mtp.0.ffn.experts.127.w1.weight", dtype::I8, {2304, 2560});
  check("mtp.1.attn.wq_a.scale", dtype::F8_E8M0, {40, 160});
  check("mtp.2.norm.weight", dtype::BF16, {5120});
  check("mtp.2.markov_head.embed.weight", dtype::BF16, {129280, 256});
  check("mtp.2.markov_head.head.weight", dtype::BF16, {129280, 256});
  check("mtp.2.confidence_head.proj.weight", dtype::BF16, {1, 5376});
  check("mtp.2.hc_ffn_fn", dtype::F32, {24, 20480});
  CHECK(stored.count("mtp.0.ffn.experts.128.w1.weight") == 0);
  CHECK(stored.count("mtp.3.attn_norm.weight") == 0);
  for (const auto& [name, t] : stored) {
    CAPTURE(name);
    CHECK(name.find("hc_head") == std::string::npos);
    CHECK(name.find("markov_w") == std::string::npos);
    CHECK(name.find("mtp.0.embed") == std::string::npos);
    CHECK(name.rfind(".head.weight") == name.find(".head.weight"));  // only markov_head.head
  }
}

// Some published lists of the checkpoint also carry `mtp.0.embed.weight` and
// `mtp.<last>.head.weight`, copies of the backbone's (DeepSeek's reference ties them). Such a
// checkpoint loads and drafts exactly as one without them.
TEST_CASE("dspark: a checkpoint that also ships the draft's embedding and head copies drafts alike") {
  const fs::path plain = tiny_dir();
  const fs::path dir = testing::scratch_root() / "dspark-copies";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(plain / "config.json", dir / "config.json");
  fs::copy_file(plain / "model.safetensors", dir / "model.safetensors");
  auto ck = checkpoint::open(plain);
  REQUIRE_MESSAGE(ck.ok(), ck.error());
  std::vector<tensor_to_write> copies;
  nlohmann::json map = nlohmann::json::object();
  for (const auto& name : ck->names()) map[name] = "model.safetensors";
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"embed.weight", "mtp.0.embed.weight"},
                                 {"head.weight", "mtp.1.head.weight"}}) {
    auto t = ck->get(from);
    REQUIRE(t.ok());
    copies.push_back({to, t->type(), t->shape(), std::vector<std::byte>(t->bytes.begin(), t->bytes.end())});
    map[to] = "draft-copies.safetensors";
  }
  REQUIRE(write_safetensors(dir / "draft-copies.safetensors", copies).ok());
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump(1);
  auto with = checkpoint::open(dir);
  REQUIRE_MESSAGE(with.ok(), with.error());
  CHECK(with->contains("mtp.0.embed.weight"));

  const auto a = load(plain), b = load(dir);
  REQUIRE(b.has_draft());
  const auto p = prompt(30, 4);
  const auto fa = features_of(a, p), fb = features_of(b, p);
  CHECK(fa == fb);
  const auto da = draft_one(a, fa, 17), db = draft_one(b, fb, 17);
  CHECK(da.tokens == db.tokens);
  CHECK(da.logits == db.logits);
  CHECK(da.confidences == db.confidences);
  fs::remove_all(dir);
}

TEST_CASE("dspark: the features are the target layers' input streams, averaged") {
  // The streams a layer takes are the previous layer's output streams (no Engram on the tiny
  // targets 2, 4, 5), which the parity tests compare with the reference layer by layer.
  const auto m = load(tiny_dir());
  const auto& t = m.text();
  REQUIRE(t.dspark_target_layer_ids == std::vector<std::int64_t>{2, 4, 5});
  const auto tokens = prompt(9, 6);
  auto cache = m.new_sequence();
  sequence_input in{&cache, tokens};
  std::vector<std::vector<float>> streams;
  std::vector<float> f;
  REQUIRE(m.forward(std::span(&in, 1), &streams, &f).ok());
  const std::int64_t D = t.hidden_size, hc = t.hc_mult, T = 9, K = 3;
  REQUIRE(f.size() == std::size_t(T * K * D));
  for (std::int64_t k = 0; k < K; ++k) {
    const auto& prev = streams[std::size_t(t.dspark_target_layer_ids[std::size_t(k)] - 1)];
    double worst = 0.0;
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t d = 0; d < D; ++d) {
        double mean = 0.0;
        for (std::int64_t j = 0; j < hc; ++j) mean += prev[std::size_t((i * hc + j) * D + d)];
        mean /= double(hc);
        worst = std::max(worst, std::fabs(mean - f[std::size_t((i * K + k) * D + d)]));
      }
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("dspark: drafts are the argmax of the draft logits, confidences are probabilities") {
  const auto m = load(tiny_dir());
  const auto& t = m.text();
  const std::int64_t B = t.dspark_block_size, V = t.vocab_size;
  const auto f = features_of(m, prompt(20, 1));
  REQUIRE(f.size() == std::size_t(20 * 3 * t.hidden_size));
  const auto d = draft_one(m, f, 42);
  REQUIRE(d.tokens.size() == std::size_t(B));
  REQUIRE(d.confidences.size() == std::size_t(B));
  REQUIRE(d.logits.size() == std::size_t(B * V));
  for (std::int64_t k = 0; k < B; ++k) {
    CAPTURE(k);
    const float* lg = d.logits.data() + k * V;
    CHECK(d.tokens[std::size_t(k)] == std::max_element(lg, lg + V) - lg);
    CHECK(d.confidences[std::size_t(k)] > 0.0f);
    CHECK(d.confidences[std::size_t(k)] < 1.0f);
  }
  // Deterministic.
  const auto again = draft_one(m, f, 42);
  CHECK(again.tokens == d.tokens);
  CHECK(again.logits == d.logits);
  CHECK(again.confidences == d.confidences);
}

TEST_CASE("dspark: the context features and the anchor change the drafts") {
  const auto m = load(tiny_dir());
  const auto f1 = features_of(m, prompt(20, 1));
  const auto f2 = features_of(m, prompt(20, 2));
  const auto a = draft_one(m, f1, 42);
  CHECK(draft_one(m, f2, 42).logits != a.logits);
  CHECK(draft_one(m, f1, 43).logits != a.logits);
  // Without context the block attends to itself only: still a valid draft.
  const auto none = draft_one(m, {}, 42);
  CHECK(none.tokens.size() == a.tokens.size());
  CHECK(none.logits != a.logits);
}

TEST_CASE("dspark: a batch drafts each sequence as it would alone (batch-invariant mode)") {
  model_options o;
  o.batch_invariant = true;
  const auto m = load(tiny_dir(), o);
  const auto f1 = features_of(m, prompt(20, 1));
  const auto f2 = features_of(m, prompt(9, 3));
  const auto a = draft_one(m, f1, 42);
  const auto b = draft_one(m, f2, 7);
  auto s1 = m.new_draft_state(), s2 = m.new_draft_state();
  std::vector<draft_input> batch{{&s1, f1, 42}, {&s2, f2, 7}};
  auto both = m.draft(batch);
  REQUIRE_MESSAGE(both.ok(), both.error());
  std::vector<std::int64_t> tokens = a.tokens;
  tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
  std::vector<float> logits = a.logits;
  logits.insert(logits.end(), b.logits.begin(), b.logits.end());
  CHECK(both->tokens == tokens);
  CHECK(both->logits == logits);  // bitwise
  CHECK(s1.length() == 20);
  CHECK(s2.length() == 9);
}

TEST_CASE("dspark: context fed in pieces, and a rollback, equal the context fed at once") {
  model_options o;
  o.batch_invariant = true;  // row-by-row projections: pieces and whole sum alike
  const auto m = load(tiny_dir(), o);
  const auto& t = m.text();
  const std::size_t row = std::size_t(3 * t.hidden_size);
  const auto f = features_of(m, prompt(24, 5));
  const auto whole = draft_one(m, std::span(f).first(20 * row), 42);
  // 12 rows, then 12 more (a draft call each), then a rollback of 4.
  auto st = m.new_draft_state();
  draft_input first{&st, std::span(f).first(12 * row), 9};
  REQUIRE(m.draft(std::span(&first, 1)).ok());
  draft_input second{&st, std::span(f).subspan(12 * row, 12 * row), 9};
  REQUIRE(m.draft(std::span(&second, 1)).ok());
  CHECK(st.length() == 24);
  st.rollback(4);
  CHECK(st.length() == 20);
  draft_input again{&st, {}, 42};
  auto d = m.draft(std::span(&again, 1));
  REQUIRE_MESSAGE(d.ok(), d.error());
  CHECK(d->tokens == whole.tokens);
  CHECK(d->logits == whole.logits);
  CHECK(d->confidences == whole.confidences);
}

TEST_CASE("dspark: a context extended without drafting, or serialised and restored, drafts alike") {
  model_options o;
  o.batch_invariant = true;
  const auto m = load(tiny_dir(), o);
  const std::size_t row = std::size_t(3 * m.text().hidden_size);
  const auto f = features_of(m, prompt(24, 5));
  const auto whole = draft_one(m, std::span(f).first(20 * row), 42);
  // 12 rows extended (no drafts), 8 more with the draft call.
  auto st = m.new_draft_state();
  REQUIRE(m.extend_draft(st, std::span(f).first(12 * row)).ok());
  CHECK(st.length() == 12);
  auto copy = m.new_draft_state();
  REQUIRE(restore_draft(copy, serialize_draft(st)).ok());
  CHECK(copy.length() == 12);
  for (auto* s : {&st, &copy}) {
    draft_input rest{s, std::span(f).subspan(12 * row, 8 * row), 42};
    auto d = m.draft(std::span(&rest, 1));
    REQUIRE_MESSAGE(d.ok(), d.error());
    CHECK(d->tokens == whole.tokens);
    CHECK(d->confidences == whole.confidences);
  }
  // Bad input is refused and leaves the state as it was.
  CHECK(m.extend_draft(st, std::span(f).first(row - 1)).error().find("expected features of width") !=
        std::string::npos);
  auto bytes = serialize_draft(copy);
  bytes[bytes.size() / 2] ^= 0x01;
  CHECK_FALSE(restore_draft(st, bytes).ok());
  CHECK_FALSE(restore_draft(st, "TKVW").ok());
  CHECK(st.length() == 20);
}

TEST_CASE("dspark: the noise block works for several block sizes") {
  for (int B : {1, 3, 8}) {
    CAPTURE(B);
    const auto m = load(tiny_dir(B));
    REQUIRE(m.text().dspark_block_size == B);
    const auto f = features_of(m, prompt(10, 4));
    const auto d = draft_one(m, f, 100);
    CHECK(d.tokens.size() == std::size_t(B));
    CHECK(d.confidences.size() == std::size_t(B));
    for (auto c : d.confidences) CHECK((c > 0.0f && c < 1.0f));
  }
}

// tests/kernels/golden/model/dspark/golden.json (tools/dspark_golden.py): the draft features
// from the transformers reference, and drafts from the reference's layer modules glued by the
// script's reading of DSpark — see the script and docs/model.md for what that does and does not
// verify. Both golden prompts are drafted in one batch.
TEST_CASE("dspark: parity with tools/dspark_golden.py (features, draft logits, drafts)") {
  std::ifstream in(fs::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model/dspark/golden.json");
  REQUIRE(in.good());
  const auto golden = nlohmann::json::parse(in);
  const auto dir = tiny_dir();  // the same preset and seed as the script's model
  // Both golden cases through the target (features) and one batched draft call: features, then
  // draft logits, then confidences in one vector; the drafts as the exact part.
  auto compute = [&](const model_options& o) {
    const auto m = load(dir, o);
    std::vector<draft_state> states;
    std::vector<std::vector<float>> feats;
    std::vector<draft_input> batch;
    std::vector<float> values;
    for (const auto& c : golden.at("cases")) {
      feats.push_back(features_of(m, c.at("prompt").get<std::vector<std::int64_t>>()));
      values.insert(values.end(), feats.back().begin(), feats.back().end());
      states.push_back(m.new_draft_state());
    }
    for (std::size_t i = 0; i < states.size(); ++i)
      batch.push_back({&states[i], feats[i], golden.at("cases")[i].at("anchor").get<std::int64_t>()});
    auto d = m.draft(batch);
    REQUIRE_MESSAGE(d.ok(), d.error());
    values.insert(values.end(), d->logits.begin(), d->logits.end());
    values.insert(values.end(), d->confidences.begin(), d->confidences.end());
    return std::pair{values, d->tokens};
  };
  // First, that the comparison means something on every BLAS kernel (model_fixture.hpp): the
  // cases' FP8 window roundings, routers and draft argmaxes are away from their boundaries.
  testing::require_stable_inputs({}, compute, 1e-4);

  const auto [values, tokens] = compute({});
  const auto m = load(dir);
  const auto B = std::size_t(m.text().dspark_block_size);
  const auto V = std::size_t(m.text().vocab_size);
  std::size_t at = 0;
  // fp32 against fp32, as test_model_parity.cpp: 1e-4 relative (confidences are probabilities:
  // 1e-4 absolute).
  for (const auto& c : golden.at("cases")) {
    const auto want = c.at("features").get<std::vector<float>>();
    CHECK(testing::relative_error(std::span(values).subspan(at, want.size()), want) <= 1e-4);
    at += want.size();
  }
  double worst = 0.0;
  for (std::size_t i = 0; i < golden.at("cases").size(); ++i) {
    CAPTURE(i);
    const auto& c = golden.at("cases")[i];
    const double err = testing::relative_error(std::span(values).subspan(at + i * B * V, B * V),
                                              c.at("logits").get<std::vector<float>>());
    worst = std::max(worst, err);
    CHECK(err <= 1e-4);
    CHECK(std::vector<std::int64_t>(tokens.begin() + std::ptrdiff_t(i * B),
                                    tokens.begin() + std::ptrdiff_t((i + 1) * B)) ==
          c.at("tokens").get<std::vector<std::int64_t>>());
  }
  at += golden.at("cases").size() * B * V;
  for (std::size_t i = 0; i < golden.at("cases").size(); ++i) {
    const auto conf = golden.at("cases")[i].at("confidences").get<std::vector<float>>();
    for (std::size_t k = 0; k < B; ++k) CHECK(std::fabs(values[at + i * B + k] - conf[k]) <= 1e-4);
  }
  MESSAGE("largest relative error of the draft logits: " << worst);
}

TEST_CASE("dspark: errors are values") {
  const auto m = load(tiny_dir());
  auto st = m.new_draft_state();
  std::vector<float> bad(5);
  draft_input in{&st, bad, 1};
  CHECK(m.draft(std::span(&in, 1)).error().find("expected features of width 96") !=
        std::string::npos);
  draft_input anchor{&st, {}, 256};
  CHECK(m.draft(std::span(&anchor, 1)).error().find("anchor token 256") != std::string::npos);
  draft_state foreign;
  draft_input other{&foreign, {}, 1};
  CHECK(m.draft(std::span(&other, 1)).error().find("no draft state made by this model") !=
        std::string::npos);
  std::vector<draft_input> twice{{&st, {}, 1}, {&st, {}, 2}};
  CHECK(m.draft(twice).error().find("shares its draft state") != std::string::npos);
}
