// The device-memory plan of one GPU rank (kernels/device_layout.hpp).
#include <doctest/doctest.h>

#include <string>

#include "kernels/device_layout.hpp"

using namespace troupe::kernels;

namespace {

model_config config(const std::string& rel) {
  auto c = load_model_config(std::string(TROUPE_SOURCE_DIR) + "/" + rel);
  REQUIRE_MESSAGE(c.ok(), c.error());
  return *c;
}

const char* const flash = "examples/models/DeepSeek-V4.1-Flash/config.json";

// The Flash config declares the released checkpoint's storage formats: FP8 (e4m3, ue8m0 scales
// per 32x32 block) dense projections and packed FP4 routed experts.
model_config released_flash() {
  auto c = config(flash);
  REQUIRE(c.quantization.has_value());
  REQUIRE(c.expert_dtype == "fp4");
  return c;
}
constexpr std::int64_t gib = std::int64_t{1} << 30;

// One routed expert's bytes over every backbone layer (expert 0's tensors).
std::int64_t per_expert_bytes(const model_config& c) {
  std::int64_t b = 0;
  for (const auto& w : released_layout(c))
    if (w.name.rfind("layers.", 0) == 0 && w.name.find(".ffn.experts.0.") != std::string::npos)
      b += stored_bytes(w);
  return b;
}

}  // namespace

TEST_CASE("stored bytes count each format's elements and scales") {
  CHECK(stored_bytes({"a", {3, 5}, weight_format::bf16}) == 30);
  CHECK(stored_bytes({"a", {3, 5}, weight_format::f32}) == 60);
  // 256 x 300: 76800 FP8 bytes and 2 x 3 block scales.
  CHECK(stored_bytes({"a", {256, 300}, weight_format::fp8_block}) == 76800 + 6);
  // 64 x 128 FP4: half a byte each, one scale per 32.
  CHECK(stored_bytes({"a", {64, 128}, weight_format::fp4_expert}) == 4096 + 256);
  CHECK(stored_bytes({"a", {10, 64}, weight_format::fp8_table}) == 640 + 20);
  CHECK(stored_bytes({"a", {10, 2}, weight_format::e8m0}) == 20);
}

TEST_CASE("the layers' bytes add up to the checkpoint, Engram tables kept on the host") {
  for (const char* dir : {"tests/kernels/golden/model/sliding/config.json",
                          "tests/kernels/golden/model/mixed/config.json",
                          "tests/kernels/golden/model/qat/config.json",
                          "tests/kernels/golden/model/ratio4/config.json", flash}) {
    CAPTURE(dir);
    const auto c = config(dir);
    device_layout_options o;
    o.free_bytes = std::int64_t{1} << 50;
    o.reserve_bytes = 0;
    auto d = plan_device_layout(c, o);
    REQUIRE_MESSAGE(d.ok(), d.error());
    std::int64_t layers = 0, checkpoint = 0, by_format = 0;
    for (const auto& l : d->layers) layers += l.total();
    for (const auto& w : released_layout(c)) checkpoint += stored_bytes(w);
    for (auto b : d->weight_bytes_by_format) by_format += b;
    CHECK(layers == d->weight_bytes);
    CHECK(by_format == d->weight_bytes);
    CHECK(d->weight_bytes + d->host_bytes == checkpoint);
    CHECK((d->host_bytes > 0) == !c.text.engram_layer_ids.empty());
    CHECK(d->layers.size() ==
          static_cast<std::size_t>(1 + c.text.num_hidden_layers + c.text.num_nextn_predict_layers));
  }
}

TEST_CASE("under EP a rank holds only its experts: ranks differ by whole experts") {
  const auto c = released_flash();
  const std::int64_t one = per_expert_bytes(c);
  REQUIRE(one > 0);
  auto p7 = place_experts(384, 7), p8 = place_experts(384, 8);
  REQUIRE(p7.ok());
  REQUIRE(p8.ok());
  device_layout_options o;
  o.free_bytes = std::int64_t{1} << 50;
  auto all = plan_device_layout(c, o);
  o.placement = &*p8;
  auto r8 = plan_device_layout(c, o);
  o.placement = &*p7;
  o.ep_rank = 0;
  auto r7_0 = plan_device_layout(c, o);
  o.ep_rank = 6;
  auto r7_6 = plan_device_layout(c, o);
  REQUIRE(all.ok());
  REQUIRE(r8.ok());
  REQUIRE(r7_0.ok());
  REQUIRE(r7_6.ok());
  CHECK(all->weight_bytes - r8->weight_bytes == (384 - 48) * one);
  CHECK(r7_0->weight_bytes - r7_6->weight_bytes == one);  // 55 vs 54 experts
  o.ep_rank = 7;
  CHECK_FALSE(plan_device_layout(c, o).ok());
  auto small = place_experts(16, 2);
  REQUIRE(small.ok());
  o.placement = &*small;
  o.ep_rank = 0;
  CHECK_FALSE(plan_device_layout(c, o).ok());
}

TEST_CASE("DeepSeek-V4.1-Flash does not fit one H200 alone; at EP 8 the rest is a KV block pool") {
  const auto c = released_flash();
  device_layout_options o;
  o.free_bytes = 139 * gib;  // what an H200 reports free before loading, about
  auto alone = plan_device_layout(c, o);
  REQUIRE_FALSE(alone.ok());
  CHECK(alone.error().find("exceed the free 139.00 GiB") != std::string::npos);
  MESSAGE(alone.error());
  auto p8 = place_experts(384, 8);
  REQUIRE(p8.ok());
  o.placement = &*p8;
  auto d = plan_device_layout(c, o);
  REQUIRE_MESSAGE(d.ok(), d.error());
  // KV sources 2, 8, 14 pool 2 tokens (64 rows a block), 20 is full resolution (128 rows); all
  // four are index sources: 512 + 128 fp32 values a row.
  CHECK(d->kv_block_bytes == (3 * 64 + 128) * (512 + 128) * 4);
  CHECK(d->swa_bytes_per_sequence == 40 * (128 + 6) * 512 * 4);
  const std::int64_t left = o.free_bytes - d->weight_bytes - o.reserve_bytes - d->swa_bytes;
  CHECK(d->kv_blocks == left / d->kv_block_bytes);
  CHECK(d->kv_blocks > 10000);
  CHECK(d->kv_pool_bytes <= left);
  CHECK(left - d->kv_pool_bytes < d->kv_block_bytes);
  MESSAGE("V4.1-Flash at EP 8 on 139 GiB: weights " << d->weight_bytes / double(gib) << " GiB, "
          << d->kv_blocks << " Block KV blocks");
}
