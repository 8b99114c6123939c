// Random model directories (`troupe model init`): the FP8 / FP4 / E8M0 encoders against the
// decoders, write -> read through the config parser and the checkpoint reader gives back every
// tensor of the layout with its shape and exact values, sharding, determinism per seed, and the
// size of the `small` preset.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/model.hpp"
#include "kernels/model_config.hpp"
#include "kernels/model_init.hpp"
#include "kernels/model_layout.hpp"
#include "kernels/portable_math.hpp"
#include "kernels/safetensors.hpp"
#include "scratch.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path dir = testing::scratch_root() / "model-init" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every layout tensor is in the checkpoint with its shape and the exact generated values, and
// the checkpoint holds nothing else but the quantized weights' scale companions.
void check_round_trip(const fs::path& dir, std::uint64_t seed) {
  auto cfg = load_model_config(dir);
  REQUIRE_MESSAGE(cfg.ok(), cfg.error());
  auto ck = checkpoint::open(dir);
  REQUIRE_MESSAGE(ck.ok(), ck.error());
  std::set<std::string> expected;
  for (const auto& spec : released_layout(*cfg)) {
    CAPTURE(spec.name);
    const auto g = generate_weight(spec, seed);
    for (const auto& t : g.stored) expected.insert(t.name);
    std::vector<float> got;
    std::vector<std::int64_t> shape;
    if (spec.format == weight_format::fp8_table || spec.format == weight_format::e8m0) {
      auto t = ck->get(spec.name);
      REQUIRE(t.ok());
      got = *to_float32(*t);
      shape = t->shape();
    } else {
      auto f = ck->load_float(spec.name, &shape, cfg->fp8_block_rows(), cfg->fp8_block_cols());
      REQUIRE_MESSAGE(f.ok(), f.error());
      got = *f;
    }
    CHECK(shape == spec.shape);
    REQUIRE(got.size() == g.values.size());
    CHECK(std::memcmp(got.data(), g.values.data(), 4 * got.size()) == 0);
  }
  const auto names = ck->names();
  CHECK(std::set<std::string>(names.begin(), names.end()) == expected);
}

}  // namespace

TEST_CASE("model init: the e4m3, e2m1 and power-of-two encoders invert the decoders") {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    CAPTURE(c);
    const float v = fp8_e4m3_to_float(std::uint8_t(c));
    if (v == 0.0f && c == 0x80) {
      CHECK(portable::fp8_e4m3_code(-0.0f) == 0x80);
      continue;
    }
    CHECK(portable::fp8_e4m3_code(v) == c);
  }
  CHECK(portable::fp8_e4m3_code(1000.0f) == 0x7e);  // saturates at 448
  CHECK(fp8_e4m3_to_float(portable::fp8_e4m3_code(1.0625f)) == 1.0f);  // halfway 1 and 1.125: even code
  CHECK(fp8_e4m3_to_float(portable::fp8_e4m3_code(1.1875f)) == 1.25f);  // halfway 1.125 and 1.25: even code
  for (int c = 0; c < 16; ++c) {
    const float v = fp4_e2m1_to_float(std::uint8_t(c));
    if (c == 8) continue;  // -0
    CHECK(portable::fp4_e2m1_code(v) == c);
  }
  CHECK(fp4_e2m1_to_float(portable::fp4_e2m1_code(2.5f)) == 2.0f);   // tie: even code (4 -> 2.0)
  CHECK(fp4_e2m1_to_float(portable::fp4_e2m1_code(1.25f)) == 1.0f);  // tie: even code (2 -> 1.0)
  CHECK(fp4_e2m1_to_float(portable::fp4_e2m1_code(1.75f)) == 2.0f);  // tie: even code (4 -> 2.0)
  CHECK(fp4_e2m1_to_float(portable::fp4_e2m1_code(-7.0f)) == -6.0f);
  CHECK(portable::pow2_ceil_exponent(1.0f) == 0);
  CHECK(portable::pow2_ceil_exponent(1.5f) == 1);
  CHECK(portable::pow2_ceil_exponent(0.75f) == 0);
  CHECK(portable::pow2_ceil_exponent(0.5f) == -1);
  CHECK(portable::pow2_ceil_exponent(3.0f / 448.0f) == -7);
}

TEST_CASE("the e4m3 and e2m1 encoders pick the nearest code, ties to even, on both sides of every midpoint") {
  // An independent reference: the code whose decoded value is nearest to |x| (saturating), the
  // even one of two equally near, by scanning every code.
  auto nearest = [](float x, int codes, float (*value)(std::uint8_t)) {
    const float a = std::fabs(x);
    int best = 0;
    for (int c = 1; c < codes; ++c) {
      const float d = std::fabs(a - value(std::uint8_t(c))), db = std::fabs(a - value(std::uint8_t(best)));
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    return best;
  };
  auto check = [&](float x) {
    CAPTURE(x);
    const int e4 = nearest(std::fmin(std::fabs(x), 448.0f), 127, fp8_e4m3_to_float);
    CHECK(portable::fp8_e4m3_code(x) == (std::signbit(x) ? e4 | 0x80 : e4));
    const int e2 = nearest(std::fmin(std::fabs(x), 6.0f), 8, fp4_e2m1_to_float);
    CHECK(portable::fp4_e2m1_code(x) == (std::signbit(x) ? e2 | 0x8 : e2));
  };
  std::vector<float> points{0.0f, -0.0f, 1e-30f, 1000.0f, -1000.0f, 448.0f, 464.0f, 6.0f, 7.0f};
  for (int c = 0; c + 1 < 127; ++c)
    points.push_back((fp8_e4m3_to_float(std::uint8_t(c)) + fp8_e4m3_to_float(std::uint8_t(c + 1))) / 2);
  for (int c = 0; c + 1 < 8; ++c)
    points.push_back((fp4_e2m1_to_float(std::uint8_t(c)) + fp4_e2m1_to_float(std::uint8_t(c + 1))) / 2);
  for (float p : points)
    for (float x : {p, std::nextafter(p, 0.0f), std::nextafter(p, 1e9f)}) {
      check(x);
      check(-x);
    }
  // And every 4099th bit pattern of the positive floats (a mismatch is reported by check).
  for (std::uint32_t bits = 0; bits < 0x7f800000u; bits += 4099) {
    float x;
    std::memcpy(&x, &bits, 4);
    if (portable::fp8_e4m3_code(x) != (nearest(std::fmin(x, 448.0f), 127, fp8_e4m3_to_float)) ||
        portable::fp4_e2m1_code(x) != (nearest(std::fmin(x, 6.0f), 8, fp4_e2m1_to_float))) {
      check(x);
      break;
    }
  }
}

TEST_CASE("model init: tiny writes config.json and one file that read back tensor for tensor") {
  const auto dir = scratch("tiny");
  auto s = write_random_model(dir, "tiny", 7);
  REQUIRE_MESSAGE(s.ok(), s.error());
  CHECK(s->files.size() == 2);
  CHECK(fs::exists(dir / "model.safetensors"));
  CHECK(!fs::exists(dir / "model.safetensors.index.json"));
  CHECK(s->bytes == fs::file_size(dir / "model.safetensors"));
  auto cfg = load_model_config(dir);
  REQUIRE(cfg.ok());
  CHECK(cfg->text.num_hidden_layers == 6);
  CHECK(cfg->expert_dtype == "fp4");
  CHECK(cfg->quantization.has_value());
  CHECK(cfg->fp8_block_rows() == 32);  // V4.1's FP8 scale block
  CHECK(cfg->fp8_block_cols() == 32);
  check_round_trip(dir, 7);
}

TEST_CASE("model init: a config whose FP8 block size is not the checkpoint's is refused at load") {
  const auto dir = scratch("block");
  REQUIRE(write_random_model(dir, "tiny", 7).ok());
  std::ifstream in(dir / "config.json");
  auto j = nlohmann::json::parse(in);
  in.close();
  j["quantization_config"]["weight_block_size"] = {128, 128};
  std::ofstream(dir / "config.json", std::ios::trunc) << j.dump(2);
  auto m = model::load(dir);
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().find("expected the block scales of") != std::string::npos);
  MESSAGE(m.error());
}

TEST_CASE("model init: sharded output has an index and reads back the same") {
  const auto dir = scratch("sharded");
  auto s = write_random_model(dir, "tiny", 7, 40000);
  REQUIRE_MESSAGE(s.ok(), s.error());
  CHECK(fs::exists(dir / "model.safetensors.index.json"));
  CHECK(!fs::exists(dir / "model.safetensors"));
  auto ck = checkpoint::open(dir);
  REQUIRE_MESSAGE(ck.ok(), ck.error());
  CHECK(ck->file_count() > 2);
  for (const auto& f : s->files)
    if (f.extension() == ".safetensors") CHECK(fs::file_size(f) <= 40000 + 64 * 1024);  // one weight may overflow a little
  check_round_trip(dir, 7);
}

TEST_CASE("model init: the same seed gives the same bytes, another seed other values") {
  const auto a = scratch("a"), b = scratch("b"), c = scratch("c");
  REQUIRE(write_random_model(a, "tiny", 1).ok());
  REQUIRE(write_random_model(b, "tiny", 1).ok());
  REQUIRE(write_random_model(c, "tiny", 2).ok());
  CHECK(slurp(a / "model.safetensors") == slurp(b / "model.safetensors"));
  CHECK(slurp(a / "config.json") == slurp(c / "config.json"));
  CHECK(slurp(a / "model.safetensors") != slurp(c / "model.safetensors"));
}

TEST_CASE("model init: the small preset is V4.1-shaped with about 100M parameters") {
  auto text = preset_config_json("small");
  REQUIRE(text.ok());
  auto cfg = parse_model_config(*text);
  REQUIRE_MESSAGE(cfg.ok(), cfg.error());
  const auto& t = cfg->text;
  CHECK(t.vocab_size == 129280);
  CHECK(t.hc_mult == 4);
  CHECK(t.kind(0) == layer_kind::sliding);
  CHECK(t.kind(1) == layer_kind::compressed);
  CHECK(t.kind(7) == layer_kind::full_resolution);
  CHECK(t.engram_layer_ids == std::vector<std::int64_t>{1});
  std::uint64_t params = 0;
  for (const auto& w : released_layout(*cfg)) {
    std::uint64_t n = 1;
    for (auto d : w.shape) n *= std::uint64_t(d);
    params += n;
  }
  CHECK(params > 90'000'000);
  CHECK(params < 110'000'000);
}

TEST_CASE("model init: an unknown preset and an unwritable directory are errors") {
  CHECK(write_random_model(scratch("x"), "huge", 1).error().find("unknown preset 'huge'") != std::string::npos);
  CHECK(!write_random_model("/proc/troupe-cannot-write-here", "tiny", 1).ok());
}
