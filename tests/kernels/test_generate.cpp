// generate(): a prompt end to end on the CPU model, on the reference's golden checkpoints.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/generate.hpp"
#include "model_fixture.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

const fs::path golden_root = fs::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model";

std::vector<float> golden_floats(const fs::path& dir, const std::string& name) {
  auto g = checkpoint::open(dir / "golden.safetensors");
  REQUIRE(g.ok());
  auto v = g->load_float(name);
  REQUIRE(v.ok());
  return *v;
}

}  // namespace

TEST_CASE(
    "greedy generation: the reference's prefill logits, then each token the argmax of the last "
    "row") {
  const auto dir = golden_root / "sliding";
  auto m = model::load(dir);
  REQUIRE(m.ok());
  const auto ids = golden_floats(dir, "prompt0.input_ids");
  const std::vector<std::int64_t> prompt(ids.begin(), ids.end());
  generate_options o;
  o.max_new = 5;
  o.sampling.greedy = true;
  o.stop_at_eos = false;
  o.keep_logits = true;
  auto out = generate(*m, prompt, o);
  REQUIRE_MESSAGE(out.ok(), out.error());
  const auto V = static_cast<std::size_t>(m->text().vocab_size);
  REQUIRE(out->tokens.size() == 5);
  REQUIRE(out->logits.size() == (prompt.size() + 5) * V);
  const auto prefill = golden_floats(dir, "prompt0.prefill_logits");
  // fp32 against the reference, as test_model_parity.cpp (whose probe checks this prompt is
  // stable on every kernel); the argmax below is of our own logits, exact by construction.
  CHECK(testing::relative_error(std::span(out->logits).first(prefill.size()), prefill) <= 1e-4);
  for (std::size_t i = 0; i < 5; ++i) {
    const float* row = out->logits.data() + (prompt.size() - 1 + i) * V;
    CHECK(out->tokens[i] == std::max_element(row, row + V) - row);
  }
  // Without keep_logits the same tokens, and no logits.
  o.keep_logits = false;
  auto again = generate(*m, prompt, o);
  REQUIRE(again.ok());
  CHECK(again->tokens == out->tokens);
  CHECK(again->logits.empty());
}

TEST_CASE("sampled generation is reproducible from its seed") {
  const auto dir = golden_root / "mixed";
  auto m = model::load(dir);
  REQUIRE(m.ok());
  auto map = load_engram_token_map(*m, (dir / "engram_meta.json").string());
  REQUIRE_MESSAGE(map.ok(), map.error());
  REQUIRE(m->set_engram_token_map(*map).ok());
  const std::vector<std::int64_t> prompt = {5, 6, 7, 8};
  generate_options o;
  o.max_new = 24;
  o.sampling.temperature = 1.5;
  o.sampling.seed = 11;
  o.stop_at_eos = false;
  auto a = generate(*m, prompt, o);
  auto b = generate(*m, prompt, o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->tokens == b->tokens);
  REQUIRE(a->tokens.size() == 24);
}

TEST_CASE("generation stops after an end-of-sequence id") {
  // The sliding golden with its eos id set to the token greedy decoding produces third.
  const auto src = golden_root / "sliding";
  auto m = model::load(src);
  REQUIRE(m.ok());
  const auto ids = golden_floats(src, "prompt0.input_ids");
  const std::vector<std::int64_t> prompt(ids.begin(), ids.end());
  generate_options o;
  o.max_new = 8;
  o.sampling.greedy = true;
  o.stop_at_eos = false;
  auto free_run = generate(*m, prompt, o);
  REQUIRE(free_run.ok());
  const std::int64_t third = free_run->tokens[2];
  const auto first_at =
      std::find(free_run->tokens.begin(), free_run->tokens.end(), third) - free_run->tokens.begin();

  const auto dir = testing::scratch_root() / "eos";
  fs::create_directories(dir);
  for (const auto& f : fs::directory_iterator(src))
    fs::copy_file(f.path(), dir / f.path().filename(), fs::copy_options::overwrite_existing);
  std::ifstream in(src / "config.json");
  auto cfg = nlohmann::json::parse(in);
  cfg["text_config"]["eos_token_id"] = third;
  std::ofstream(dir / "config.json") << cfg.dump();
  auto with_eos = model::load(dir);
  REQUIRE_MESSAGE(with_eos.ok(), with_eos.error());
  o.stop_at_eos = true;
  auto stopped = generate(*with_eos, prompt, o);
  REQUIRE(stopped.ok());
  CHECK(stopped->tokens == std::vector<std::int64_t>(free_run->tokens.begin(),
                                                     free_run->tokens.begin() + first_at + 1));
}

TEST_CASE("generate and the Engram map loader refuse bad input as values") {
  auto m = model::load(golden_root / "sliding");
  REQUIRE(m.ok());
  generate_options o;
  CHECK(generate(*m, {}, o).error() == "generate: the prompt is empty");
  o.sampling.temperature = -1;
  const std::vector<std::int64_t> p = {3};
  CHECK_FALSE(generate(*m, p, o).ok());
  auto identity = load_engram_token_map(*m, "identity");
  REQUIRE(identity.ok());
  CHECK(identity->size() == std::size_t(m->text().vocab_size));
  CHECK(load_engram_token_map(*m, "/nonexistent/map.json").error() ==
        "/nonexistent/map.json: cannot be read");
  const auto bad =
      testing::scratch_root() / "map.json";
  std::ofstream(bad) << "{\"token_map\": [1, \"x\"]}";
  CHECK(load_engram_token_map(*m, bad.string()).error() ==
        bad.string() + ": token_map holds a non-integer");
}
