// The CPU model's building blocks on hand-computed cases: the e4m3 / e2m1 quantisers, the
// interleaved partial RoPE, the mHC Sinkhorn mixing, MoE routing and NumPy's generator that
// the Engram hash multipliers come from.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "kernels/cpu_ops.hpp"
#include "kernels/engram_hash.hpp"

using namespace troupe::kernels;

// tests/kernels/blas_kernel.sh runs this suite under each OpenBLAS kernel the CPU can execute;
// that means something only if OpenBLAS really switched.
TEST_CASE("the BLAS kernel is the one OPENBLAS_CORETYPE asks for") {
  const std::string name = blas_kernel_name();
  MESSAGE("OpenBLAS kernel: " << name);
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  if (asked == nullptr || *asked == '\0') return;
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
  };
  CHECK(lower(name) == lower(asked));
}

TEST_CASE("round_to_e4m3 rounds to the nearest e4m3 value, ties to even") {
  CHECK(round_to_e4m3(0.3f) == 0.3125f);   // step 2^-5 at [0.25, 0.5): 9.6 steps -> 10
  CHECK(round_to_e4m3(1.0625f) == 1.0f);   // halfway between 1 and 1.125: even mantissa
  CHECK(round_to_e4m3(1.1875f) == 1.25f);  // halfway between 1.125 and 1.25: even
  CHECK(round_to_e4m3(-448.0f) == -448.0f);
  CHECK(round_to_e4m3(0x1p-9f) == 0x1p-9f);          // smallest subnormal
  CHECK(round_to_e4m3(0x1p-11f) == 0.0f);            // a quarter step rounds to zero
  CHECK(round_to_e4m3(3.0f * 0x1p-10f) == 0x1p-8f);  // 1.5 subnormal steps -> 2 (even)
  CHECK(round_to_e4m3(15.5f) == 16.0f);              // mantissa carry into the next binade
}

TEST_CASE("FP4 block quantiser: power-of-two scale and the e2m1 tie rules") {
  // amax 6 → scale 1: the values sit on the grid's tie points.
  std::vector<float> v(32, 0.0f);
  const float in[] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.75f, 0.3f};
  const float want[] = {6.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -1.0f, 0.5f};
  std::copy(std::begin(in), std::end(in), v.begin());
  fake_quant_fp4_block(v.data(), 32, 32, false);
  for (std::size_t i = 0; i < std::size(want); ++i) CHECK(v[i] == want[i]);

  // amax 3 → ue8m0 scale 2^ceil(log2(0.5)) = 0.5: 3 / 0.5 = 6 stays 6, 1.1 / 0.5 = 2.2 → 2.
  std::vector<float> w(32, 0.0f);
  w[0] = 3.0f;
  w[1] = 1.1f;
  fake_quant_fp4_block(w.data(), 32, 32, false);
  CHECK(w[0] == 3.0f);
  CHECK(w[1] == 1.0f);

  // e4m3 scales: amax 1 → scale e4m3(1/6) = 0.171875; 1 / 0.171875 = 5.82 → 6 → 1.03125.
  std::vector<float> e(16, 0.0f);
  e[0] = 1.0f;
  fake_quant_fp4_block(e.data(), 16, 16, true);
  CHECK(e[0] == doctest::Approx(6.0f * 0.171875f));

  // A length the block does not divide is left as is (tiny configs).
  std::vector<float> odd = {0.3f, 0.7f, 1.9f};
  fake_quant_fp4_block(odd.data(), 3, 32, false);
  CHECK(odd[0] == 0.3f);
}

TEST_CASE("FP8 block quantiser keeps every value on its block's e4m3 grid") {
  std::vector<float> v(64);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i)) * (i < 32 ? 3.0f : 0.01f);
  auto orig = v;
  fake_quant_fp8_block32(v.data(), 64);
  for (std::size_t b = 0; b < 2; ++b) {
    float amax = 0;
    for (std::size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(orig[b * 32 + i]));
    const float scale = std::exp2(std::ceil(std::log2(amax / 448.0f)));
    for (std::size_t i = 0; i < 32; ++i) {
      const float q = v[b * 32 + i] / scale;
      CHECK(round_to_e4m3(q) == q);
      CHECK(std::fabs(v[b * 32 + i] - orig[b * 32 + i]) <=
            std::fabs(orig[b * 32 + i]) / 16 + 1e-12f);
    }
  }
}

TEST_CASE("RoPE rotates adjacent pairs of the trailing slice; the inverse undoes it") {
  rope_parameters p;
  p.rope_theta = 10000.0;
  p.partial_rotary_factor = 0.5;  // 4 of 8 channels rotated
  auto t = make_rope_table(p, 8);
  REQUIRE(t.rope_dim == 4);
  REQUIRE(t.inv_freq.size() == 2);
  CHECK(t.inv_freq[0] == 1.0f);
  CHECK(t.inv_freq[1] == doctest::Approx(0.01f));  // 10000^(-2/4)
  std::vector<float> v = {1, 2, 3, 4, 1, 0, 0, 1};
  auto orig = v;
  apply_rope(v.data(), 8, t, 3);
  for (int i = 0; i < 4; ++i) CHECK(v[i] == orig[i]);  // the nope channels pass through
  const float a0 = 3.0f, a1 = 0.03f;
  CHECK(v[4] == doctest::Approx(std::cos(a0)));  // (1, 0) rotated by 3 rad
  CHECK(v[5] == doctest::Approx(std::sin(a0)));
  CHECK(v[6] == doctest::Approx(-std::sin(a1)));  // (0, 1) rotated by 0.03 rad
  CHECK(v[7] == doctest::Approx(std::cos(a1)));
  apply_rope(v.data(), 8, t, 3, /*inverse=*/true);
  for (int i = 0; i < 8; ++i) CHECK(v[i] == doctest::Approx(orig[i]).epsilon(1e-6));
}

TEST_CASE("YaRN keeps high frequencies, divides low ones by the factor") {
  rope_parameters p;
  p.rope_type = "yarn";
  p.rope_theta = 160000.0;
  p.partial_rotary_factor = 1.0;
  p.factor = 4;
  p.original_max_position_embeddings = 256;
  auto t = make_rope_table(p, 64);
  rope_parameters plain = p;
  plain.rope_type = "default";
  auto d = make_rope_table(plain, 64);
  CHECK(t.inv_freq.front() == d.inv_freq.front());
  CHECK(t.inv_freq.back() == doctest::Approx(d.inv_freq.back() / 4));
}

TEST_CASE("Sinkhorn mixing is close to doubly stochastic") {
  std::vector<float> m = {3.0f,  -1.0f, 0.5f, 2.0f, 0.0f, 0.0f, 1.0f, -2.0f,
                          -3.0f, 4.0f,  0.1f, 0.2f, 1.0f, 1.0f, 1.0f, 1.0f};
  sinkhorn(m.data(), 4, 20, 1e-6f);
  for (int j = 0; j < 4; ++j) {
    float row = 0, col = 0;
    for (int k = 0; k < 4; ++k) {
      CHECK(m[j * 4 + k] > 0.0f);
      row += m[j * 4 + k];
      col += m[k * 4 + j];
    }
    CHECK(row == doctest::Approx(1.0f).epsilon(1e-3));
    CHECK(col == doctest::Approx(1.0f).epsilon(1e-5));  // the last pass normalises columns
  }
}

TEST_CASE("MoE routing: the bias picks the experts, the unbiased scores weigh them") {
  text_config c;
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.scoring_func = "sqrtsoftplus";
  c.gate_temp = 2.0;
  c.routed_scaling_factor = 1.5;
  std::vector<float> logits = {4.0f, 2.0f, 0.0f, -2.0f};
  std::vector<float> bias = {0.0f, 0.0f, 5.0f, 0.0f};  // steers expert 2 in
  std::vector<std::int64_t> experts;
  std::vector<float> weights;
  route_token(c, logits.data(), bias.data(), experts, weights);
  REQUIRE(experts == std::vector<std::int64_t>{2, 0});
  const double s0 = std::sqrt(std::log1p(std::exp(2.0))), s2 = std::sqrt(std::log(2.0));
  CHECK(weights[0] == doctest::Approx(1.5 * s2 / (s0 + s2)));
  CHECK(weights[1] == doctest::Approx(1.5 * s0 / (s0 + s2)));
}

TEST_CASE("numpy_rng reproduces NumPy's default_rng integers") {
  // Values printed by NumPy 2.4.6: default_rng(10007).integers(0, 23058430092136939, 3) and
  // default_rng(0).integers(0, 2**40, 2).
  numpy_rng a(10007);
  CHECK(a.integers(23058430092136939) == 18984069153536582);
  CHECK(a.integers(23058430092136939) == 1198982504596558);
  CHECK(a.integers(23058430092136939) == 8908289623672409);
  numpy_rng b(0);
  CHECK(b.integers(std::int64_t(1) << 40) == 700346781657);
  CHECK(b.integers(std::int64_t(1) << 40) == 296633628802);
}

TEST_CASE("the released model's Engram hash multipliers equal the reference's") {
  // tests/kernels/golden/model/engram-v41-flash.json: the multipliers the reference derives for
  // the released config (layers 1 and 14, 4-grams, compressed vocabulary 99,092).
  const auto root = std::filesystem::path(TROUPE_SOURCE_DIR);
  auto cfg = load_model_config(root / "examples/models/DeepSeek-V4.1-Flash/config.json");
  REQUIRE_MESSAGE(cfg.ok(), cfg.error());
  std::ifstream f(root / "tests/kernels/golden/model/engram-v41-flash.json");
  const auto j = nlohmann::json::parse(f);
  REQUIRE(cfg->text.engram_compressed_vocab_size ==
          j.at("compressed_vocab_size").get<std::int64_t>());
  const auto layout = engram_hash_layout::from_config(cfg->text);
  REQUIRE(layout.multipliers.size() == 2);
  for (std::size_t l = 0; l < 2; ++l) {
    std::vector<std::int64_t> want;
    for (const auto& s : j.at("multipliers").at(l))
      want.push_back(std::stoll(s.get<std::string>()));
    CHECK(layout.multipliers[l] == want);
  }
}
