// The safetensors reader: round trips through troupe's writer, goldens written by Python
// `safetensors` with values decoded by ml_dtypes (tools/safetensors_golden.py), the released
// FP8 / FP4 formats, sharded checkpoints, and malformed files that must give errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "kernels/portable_math.hpp"
#include "kernels/safetensors.hpp"
#include "scratch.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

const fs::path golden = fs::path(TROUPE_SOURCE_DIR) / "tests/kernels/fixtures/golden";

fs::path scratch(const std::string& name) {
  fs::path dir = testing::scratch_root() / "safetensors";
  fs::create_directories(dir);
  return dir / name;
}

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A file made of a length prefix, `header` and `data_bytes` zero bytes.
std::vector<std::byte> raw_file(const std::string& header, std::size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string header_error(const std::string& header, std::size_t data_bytes) {
  auto file = raw_file(header, data_bytes);
  auto h = parse_safetensors_header(file, "bad.safetensors");
  return h.ok() ? std::string("(no error)") : h.error();
}

std::vector<float> floats(const checkpoint& c, const std::string& name) {
  auto v = c.load_float(name);
  REQUIRE_MESSAGE(v.ok(), v.error());
  return *v;
}

bool same_bits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  std::uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

}  // namespace

TEST_CASE("single element conversions decode the standard encodings") {
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(bf16_to_float(0xc040) == -3.0f);
  CHECK(fp16_to_float(0x3c00) == 1.0f);
  CHECK(fp16_to_float(0x7bff) == 65504.0f);
  CHECK(fp16_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isinf(fp16_to_float(0xfc00)));
  CHECK(fp8_e4m3_to_float(0x7e) == 448.0f);
  CHECK(fp8_e4m3_to_float(0x01) == std::ldexp(1.0f, -9));
  CHECK(std::isnan(fp8_e4m3_to_float(0xff)));
  CHECK(fp8_e8m0_to_float(127) == 1.0f);
  CHECK(fp8_e8m0_to_float(0) == std::ldexp(1.0f, -127));
  CHECK(fp4_e2m1_to_float(0x7) == 6.0f);
  CHECK(fp4_e2m1_to_float(0xb) == -1.5f);
}

TEST_CASE("a file written by the C++ writer reads back byte for byte in every dtype") {
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  std::vector<std::uint16_t> bf16 = {0x3f80, 0xc040, 0x0000, 0x4120};
  std::vector<std::uint16_t> f16 = {0x3c00, 0xc000, 0x3800};
  std::vector<std::int8_t> i8 = {1, -2, 3};
  std::vector<std::uint8_t> e4m3 = {0x38, 0xb8, 0x7e};
  std::vector<std::int64_t> i64 = {1LL << 40, -5};
  fs::path p = scratch("roundtrip.safetensors");
  auto written = write_safetensors(p, {
      {"f32", dtype::F32, {2, 3}, bytes_of(f32)},
      {"bf16", dtype::BF16, {4}, bytes_of(bf16)},
      {"f16", dtype::F16, {3}, bytes_of(f16)},
      {"i8", dtype::I8, {3}, bytes_of(i8)},
      {"e4m3", dtype::F8_E4M3, {1, 3}, bytes_of(e4m3)},
      {"i64", dtype::I64, {2}, bytes_of(i64)},
      {"empty", dtype::F32, {0, 4}, {}},
  }, {{"format", "pt"}});
  REQUIRE_MESSAGE(written.ok(), written.error());
  CHECK(*written == fs::file_size(p));
  auto c = checkpoint::open(p);
  REQUIRE_MESSAGE(c.ok(), c.error());
  CHECK(c->names().size() == 7);
  auto t = c->get("f32", dtype::F32, {2, 3});
  REQUIRE_MESSAGE(t.ok(), t.error());
  CHECK(std::memcmp(t->bytes.data(), f32.data(), 24) == 0);
  CHECK(floats(*c, "f32") == f32);
  CHECK(floats(*c, "bf16") == std::vector<float>{1.0f, -3.0f, 0.0f, 10.0f});
  CHECK(floats(*c, "f16") == std::vector<float>{1.0f, -2.0f, 0.5f});
  CHECK(floats(*c, "i8") == std::vector<float>{1.0f, -2.0f, 3.0f});
  CHECK(floats(*c, "e4m3") == std::vector<float>{1.0f, -1.0f, 448.0f});
  CHECK(floats(*c, "i64")[1] == -5.0f);
  CHECK(floats(*c, "empty").empty());
}

TEST_CASE("the writer aligns every tensor to its element size") {
  fs::path p = scratch("aligned.safetensors");
  std::vector<std::uint8_t> one = {1};
  std::vector<double> d = {1.0, 2.0};
  REQUIRE(write_safetensors(p, {{"a", dtype::U8, {1}, bytes_of(one)}, {"b", dtype::F64, {2}, bytes_of(d)}}).ok());
  auto f = safetensors_file::open(p);
  REQUIRE_MESSAGE(f.ok(), f.error());
  auto b = f->find("b");
  REQUIRE(b);
  CHECK(reinterpret_cast<std::uintptr_t>(b->bytes.data()) % 8 == 0);
}

TEST_CASE("plain dtypes written by Python safetensors decode exactly as ml_dtypes decodes them") {
  auto in = checkpoint::open(golden / "dtypes.safetensors");
  auto want = checkpoint::open(golden / "dtypes.expected.safetensors");
  REQUIRE_MESSAGE(in.ok(), in.error());
  REQUIRE_MESSAGE(want.ok(), want.error());
  for (const char* name : {"bf16", "f16", "f32", "e4m3_all", "e8m0_all"}) {
    CAPTURE(name);
    auto got = floats(*in, name);
    auto exp = floats(*want, name);
    REQUIRE(got.size() == exp.size());
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < got.size(); ++i) mismatches += !same_bits(got[i], exp[i]);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("a released-style FP8 weight is scaled by its 128x128 E8M0 block scales") {
  auto in = checkpoint::open(golden / "fp8_block.safetensors");
  auto want = checkpoint::open(golden / "fp8_block.expected.safetensors");
  REQUIRE_MESSAGE(in.ok(), in.error());
  REQUIRE_MESSAGE(want.ok(), want.error());
  std::vector<std::int64_t> shape;
  auto w = in->load_float("layers.0.attn.wq_a.weight", &shape);
  REQUIRE_MESSAGE(w.ok(), w.error());
  REQUIRE(shape == std::vector<std::int64_t>{136, 136});
  auto rows = floats(*want, "wq_a.row_sums"), cols = floats(*want, "wq_a.col_sums");
  for (int i = 0; i < 136; ++i) {
    double r = 0, c = 0;
    for (int j = 0; j < 136; ++j) r += (*w)[i * 136 + j], c += (*w)[j * 136 + i];
    CHECK(r == doctest::Approx(rows[i]).epsilon(1e-6));
    CHECK(c == doctest::Approx(cols[i]).epsilon(1e-6));
  }
  auto corner = floats(*want, "wq_a.corner");
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) CHECK(same_bits((*w)[(120 + i) * 136 + 120 + j], corner[i * 16 + j]));
}

TEST_CASE("a DeepSeek-V3-style FP8 weight is scaled by its F32 weight_scale_inv") {
  auto in = checkpoint::open(golden / "fp8_block.safetensors");
  auto want = checkpoint::open(golden / "fp8_block.expected.safetensors");
  REQUIRE(in.ok());
  REQUIRE(want.ok());
  CHECK(floats(*in, "model.layers.0.self_attn.q_a_proj.weight") == floats(*want, "q_a_proj"));
}

TEST_CASE("a packed FP4 expert weight unpacks low nibble first and applies its per-32 scales") {
  auto in = checkpoint::open(golden / "fp4_expert.safetensors");
  auto want = checkpoint::open(golden / "fp4_expert.expected.safetensors");
  REQUIRE_MESSAGE(in.ok(), in.error());
  REQUIRE(want.ok());
  std::vector<std::int64_t> shape;
  auto w = in->load_float("layers.0.ffn.experts.0.w1.weight", &shape);
  REQUIRE_MESSAGE(w.ok(), w.error());
  CHECK(shape == std::vector<std::int64_t>{8, 64});
  CHECK(*w == floats(*want, "w1"));
}

TEST_CASE("the per-element FP8 and FP4 weight decoders the CUDA kernels run equal the loader's") {
  // kernels/portable_math.hpp's fp8_block_weight / fp4_packed_weight on the raw bytes of the
  // released-style goldens, bit for bit what load_float dequantizes; and every ue8m0 scale byte.
  for (int b = 0; b < 255; ++b)
    CHECK(same_bits(portable::e8m0_value(std::uint8_t(b)), std::ldexp(1.0f, b - 127)));
  auto fp8 = checkpoint::open(golden / "fp8_block.safetensors");
  REQUIRE_MESSAGE(fp8.ok(), fp8.error());
  auto w = fp8->get("layers.0.attn.wq_a.weight");
  auto sc = fp8->get("layers.0.attn.wq_a.scale");
  REQUIRE(w.ok());
  REQUIRE(sc.ok());
  auto want = fp8->load_float("layers.0.attn.wq_a.weight");
  REQUIRE(want.ok());
  const auto* wb = reinterpret_cast<const std::uint8_t*>(w->bytes.data());
  const auto* sb = reinterpret_cast<const std::uint8_t*>(sc->bytes.data());
  int differ = 0;
  for (int i = 0; i < 136; ++i)
    for (int j = 0; j < 136; ++j)
      differ += !same_bits(portable::fp8_block_weight(wb, sb, 136, 128, 128, i, j), (*want)[i * 136 + j]);
  CHECK(differ == 0);
  auto fp4 = checkpoint::open(golden / "fp4_expert.safetensors");
  REQUIRE(fp4.ok());
  auto p4 = fp4->get("layers.0.ffn.experts.0.w1.weight");
  auto s4 = fp4->get("layers.0.ffn.experts.0.w1.scale");
  auto want4 = fp4->load_float("layers.0.ffn.experts.0.w1.weight");
  REQUIRE(p4.ok());
  REQUIRE(s4.ok());
  REQUIRE(want4.ok());
  const auto* pb = reinterpret_cast<const std::uint8_t*>(p4->bytes.data());
  const auto* qb = reinterpret_cast<const std::uint8_t*>(s4->bytes.data());
  differ = 0;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 64; ++j)
      differ += !same_bits(portable::fp4_packed_weight(pb, qb, 64, 32, i, j), (*want4)[i * 64 + j]);
  CHECK(differ == 0);
}

TEST_CASE("FP4 scales of the wrong shape are refused naming both tensors") {
  std::vector<std::uint8_t> packed(8 * 16, 0x21), scales(16, 127);
  fs::path p = scratch("fp4-bad.safetensors");
  REQUIRE(write_safetensors(p, {{"e.w1.weight", dtype::U8, {8, 16}, bytes_of(packed)},
                                {"e.w1.scale", dtype::F8_E8M0, {8, 2}, bytes_of(scales)}}).ok());
  auto c = checkpoint::open(p);
  REQUIRE(c.ok());
  auto w = c->load_float("e.w1.weight");
  REQUIRE_FALSE(w.ok());
  CHECK(w.error() == p.string() + ": tensor 'e.w1.scale': expected the FP4 scales of 'e.w1.weight' as F8_E8M0, F32 or BF16 [8, 1], found F8_E8M0 [8, 2]");
}

TEST_CASE("a sharded checkpoint finds every tensor through its index") {
  auto c = checkpoint::open(golden / "sharded");
  REQUIRE_MESSAGE(c.ok(), c.error());
  CHECK(c->file_count() == 2);
  CHECK(c->names() == std::vector<std::string>{"embed.weight", "head.weight", "layers.0.attn_norm.weight", "norm.weight"});
  auto want = checkpoint::open(golden / "sharded.expected.safetensors");
  REQUIRE(want.ok());
  CHECK(floats(*c, "embed.weight") == floats(*want, "embed.weight"));
  CHECK(floats(*c, "head.weight") == floats(*want, "head.weight"));
  CHECK(floats(*c, "norm.weight") == std::vector<float>(4, 2.0f));
}

TEST_CASE("an index naming a tensor its shard lacks is refused naming both") {
  fs::path dir = scratch("bad-index");
  fs::create_directories(dir);
  fs::copy_file(golden / "sharded/model-00001-of-00002.safetensors", dir / "a.safetensors", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"embed.weight": "a.safetensors", "layers.0.attn_norm.weight": "a.safetensors", "ghost.weight": "a.safetensors"}})";
  auto c = checkpoint::open(dir);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().find("tensor 'ghost.weight' is in a.safetensors") != std::string::npos);
}

TEST_CASE("an index naming a missing shard is refused naming the file") {
  fs::path dir = scratch("missing-shard");
  fs::create_directories(dir);
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"x": "nope.safetensors"}})";
  auto c = checkpoint::open(dir);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().find("nope.safetensors: cannot open") != std::string::npos);
}

TEST_CASE("a tensor of another shape or dtype than expected is refused naming file, tensor, expected and found") {
  auto c = checkpoint::open(golden / "sharded");
  REQUIRE(c.ok());
  auto t = c->get("embed.weight", dtype::BF16, {6, 8});
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().find("model-00001-of-00002.safetensors: tensor 'embed.weight': expected BF16 [6, 8], found F32 [6, 4]") != std::string::npos);
}

TEST_CASE("a missing tensor is an error naming the checkpoint") {
  auto c = checkpoint::open(golden / "dtypes.safetensors");
  REQUIRE(c.ok());
  auto t = c->get("nope");
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().find("dtypes.safetensors: no tensor named 'nope'") != std::string::npos);
}

TEST_CASE("malformed headers are refused with the reason") {
  CHECK(header_error("", 0) == "bad.safetensors: the header is not valid JSON");
  CHECK(header_error("{\"a\":", 0) == "bad.safetensors: the header is not valid JSON");
  CHECK(header_error("[1]", 0) == "bad.safetensors: the header is not a JSON object");
  CHECK(header_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4)
            .find("data_offsets end at 8, past the data section of 4 bytes") != std::string::npos);
  CHECK(header_error(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8)
            .find("dtype F32 and shape [3] need 12 bytes, data_offsets give 8") != std::string::npos);
  CHECK(header_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12)
            .find("overlaps tensor") != std::string::npos);
  CHECK(header_error(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                         "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})", 6)
            .find("bytes [2, 4) of the data section belong to no tensor") != std::string::npos);
  CHECK(header_error(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", 5)
            .find("bytes [2, 5) at the end") != std::string::npos);
  CHECK(header_error(R"({"a": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})", 8)
            .find("unknown dtype 'F33'") != std::string::npos);
  CHECK(header_error(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8)
            .find("non-negative") != std::string::npos);
  CHECK(header_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8)
            .find("end before they begin") != std::string::npos);
  CHECK(header_error(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 8]}})", 8)
            .find("too large") != std::string::npos);
  CHECK(header_error(R"({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", 2)
            .find("not a whole number of bytes") != std::string::npos);
  // Header of 7 bytes: data starts at offset 15, not aligned for F32.
  CHECK(header_error(R"({"a":1})", 0).find("expected an object with dtype") != std::string::npos);
  CHECK(header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}  )", 4).find("not aligned") == std::string::npos);
  CHECK(header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} )", 4).find("not aligned to its 4-byte elements") != std::string::npos);
  CHECK(header_error(R"({"__metadata__": {"k": 1}})", 0).find("__metadata__") != std::string::npos);
}

TEST_CASE("a header length larger than the file is a truncation error") {
  std::vector<std::byte> f = raw_file("{}", 0);
  std::uint64_t n = 1000;
  std::memcpy(f.data(), &n, 8);
  auto h = parse_safetensors_header(f, "t.safetensors");
  REQUIRE_FALSE(h.ok());
  CHECK(h.error() == "t.safetensors: truncated: the header needs 1000 bytes after the length, the file has 2");
}

TEST_CASE("every truncation of a real checkpoint file is an error, never a crash") {
  std::ifstream in(golden / "fp4_expert.safetensors", std::ios::binary);
  std::vector<char> text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> whole(text.size());
  std::memcpy(whole.data(), text.data(), text.size());
  REQUIRE(parse_safetensors_header(whole, "f").ok());
  std::size_t errors = 0;
  for (std::size_t n = 0; n < whole.size(); ++n)
    errors += !parse_safetensors_header(std::span(whole).first(n), "f").ok();
  CHECK(errors == whole.size());
}

TEST_CASE("an empty file is refused as truncated") {
  fs::path p = scratch("empty.safetensors");
  std::ofstream(p).close();
  auto f = safetensors_file::open(p);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().find("empty.safetensors: truncated") != std::string::npos);
}
