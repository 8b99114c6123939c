// config.json parsing: the released DeepSeek-V4.1-Flash config, the tiny test config, the
// reference's defaults and derived values, and refusals that name field, expected and found.
#include <doctest/doctest.h>

#include <string>

#include "kernels/model_config.hpp"

using namespace troupe::kernels;

namespace {
const std::string source_dir = TROUPE_SOURCE_DIR;

// A composite config whose text_config is `text` (a JSON object body without braces).
result<model_config> composite(const std::string& text) {
  return parse_model_config(R"({"model_type": "deepseek_v41", "text_config": {)" + text + "}}", "test.json");
}
}  // namespace

TEST_CASE("the released DeepSeek-V4.1-Flash config parses with its 40 layers and 3 draft layers") {
  auto m = load_model_config(source_dir + "/examples/models/DeepSeek-V4.1-Flash");
  REQUIRE_MESSAGE(m.ok(), m.error());
  const text_config& t = m->text;
  CHECK(m->model_type == "deepseek_v41");
  CHECK(m->image_token_id == 129264);
  CHECK(t.num_hidden_layers == 40);
  CHECK(t.num_nextn_predict_layers == 3);
  CHECK(t.compress_ratios.size() == 43);
  CHECK(t.kind(0) == layer_kind::sliding);
  CHECK(t.kind(2) == layer_kind::compressed);
  CHECK(t.kind(20) == layer_kind::full_resolution);
  CHECK(t.kind(41) == layer_kind::sliding);
  CHECK(t.kv_source_layer_ids == std::vector<std::int64_t>{2, 8, 14, 20});
  CHECK(t.candidate_source_layer_id == 20);
  CHECK(t.rms_norm_eps == 1e-20);
  CHECK(t.scoring_func == "sqrtsoftplus");
  CHECK(t.engram_num_embeddings == std::vector<std::int64_t>{384006168, 384016682});
  REQUIRE(m->vision.has_value());
  CHECK(m->vision->patch_size == 14);
  // The storage formats as V4.1 declares them: quantization_config holds expert_dtype, and the
  // FP8 scales are per 32 x 32 block (V4-Flash: top-level expert_dtype, 128 x 128).
  REQUIRE(m->quantization.has_value());
  CHECK(m->quantization->quant_method == "fp8");
  CHECK(m->expert_dtype == "fp4");
  CHECK(m->fp8_block_rows() == 32);
  CHECK(m->fp8_block_cols() == 32);
}

TEST_CASE("quantization_config: expert_dtype in either place, block size, and the errors") {
  auto parse = [](const std::string& extra) {
    return parse_model_config(R"({"model_type": "deepseek_v41", "text_config": {})" + extra + "}", "q.json");
  };
  auto v4flash = parse(R"(, "expert_dtype": "fp4", "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]})");
  REQUIRE_MESSAGE(v4flash.ok(), v4flash.error());
  CHECK(v4flash->expert_dtype == "fp4");
  CHECK(v4flash->fp8_block_rows() == 128);
  auto v41 = parse(R"(, "quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 64], "expert_dtype": "fp4"})");
  REQUIRE_MESSAGE(v41.ok(), v41.error());
  CHECK(v41->expert_dtype == "fp4");
  CHECK(v41->fp8_block_rows() == 32);
  CHECK(v41->fp8_block_cols() == 64);
  auto none = parse("");
  REQUIRE(none.ok());
  CHECK(none->expert_dtype.empty());
  CHECK(none->fp8_block_rows() == 128);

  auto clash = parse(R"(, "expert_dtype": "fp8", "quantization_config": {"quant_method": "fp8", "expert_dtype": "fp4"})");
  REQUIRE_FALSE(clash.ok());
  CHECK(clash.error() == "q.json: expert_dtype \"fp8\" disagrees with quantization_config.expert_dtype \"fp4\"");
  auto three = parse(R"(, "quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32, 32]})");
  REQUIRE_FALSE(three.ok());
  CHECK(three.error() == "q.json: quantization_config.weight_block_size: expected [rows, cols], found [32, 32, 32]");
  auto zero = parse(R"(, "quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 32]})");
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.error().find("quantization_config.weight_block_size") != std::string::npos);
  auto bad = parse(R"(, "quantization_config": {"expert_dtype": "int4"})");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("expert_dtype") != std::string::npos);
}

TEST_CASE("yarn applies to the compressed rope only, with attention factor 1") {
  auto m = load_model_config(source_dir + "/examples/models/DeepSeek-V4.1-Flash/config.json");
  REQUIRE_MESSAGE(m.ok(), m.error());
  const text_config& t = m->text;
  CHECK(t.rope_main.rope_type == "default");
  CHECK(t.rope_main.rope_theta == 10000.0);
  CHECK(t.rope_main.factor == 1.0);
  CHECK(t.rope_compress.rope_type == "yarn");
  CHECK(t.rope_compress.rope_theta == 160000.0);
  CHECK(t.rope_compress.factor == 16.0);
  CHECK(t.rope_compress.original_max_position_embeddings == 65536);
  CHECK(t.rope_compress.attention_factor == 1.0);
  CHECK(t.rope_main.partial_rotary_factor == doctest::Approx(64.0 / 512.0));
}

TEST_CASE("the tiny test config parses and derives its layer schedule") {
  auto m = load_model_config(source_dir + "/tests/kernels/fixtures/tiny-v41-config.json");
  REQUIRE_MESSAGE(m.ok(), m.error());
  const text_config& t = m->text;
  CHECK(t.num_hidden_layers == 6);
  CHECK(t.layer_types == std::vector<std::string>{"sliding_attention", "shared_compressed_attention",
                                                  "sliding_attention", "shared_compressed_attention",
                                                  "sliding_attention", "sliding_attention"});
  CHECK(t.kv_source_of(0) == -1);
  CHECK(t.kv_source_of(2) == 1);
  CHECK(t.kv_source_of(5) == 3);
  CHECK(t.index_source_of(4) == 3);
  CHECK(t.index_source_of(5) == 5);
  CHECK(t.engram_index(1) == 0);
  CHECK(t.engram_index(2) == -1);
}

TEST_CASE("an empty text config takes every reference default") {
  auto m = composite("");
  REQUIRE_MESSAGE(m.ok(), m.error());
  const text_config& t = m->text;
  CHECK(t.hidden_size == 5120);
  CHECK(t.compress_ratios.size() == 43);
  CHECK(t.index_source_layer_ids == std::vector<std::int64_t>{2, 8, 14, 20, 24, 28, 32, 36});
  CHECK(t.dspark_target_layer_ids == std::vector<std::int64_t>{37, 38, 39});
  CHECK(t.gate_temp == 1.0);
  CHECK(t.routed_scaling_factor == 1.5);
  CHECK(t.engram_layer_ids.empty());
  CHECK(t.rope_compress.rope_type == "default");
  CHECK(t.eos_token_ids == std::vector<std::int64_t>{1});
}

TEST_CASE("a custom layer count without a schedule scales the released pattern") {
  auto m = composite(R"("num_hidden_layers": 7, "num_nextn_predict_layers": 0)");
  REQUIRE_MESSAGE(m.ok(), m.error());
  CHECK(m->text.compress_ratios == std::vector<std::int64_t>{0, 0, 2, 2, 2, 1, 1});
  CHECK(m->text.kv_source_layer_ids == std::vector<std::int64_t>{2, 5});
  CHECK(m->text.index_source_layer_ids == std::vector<std::int64_t>{2, 5});
  CHECK(m->text.candidate_source_layer_id == 5);
  CHECK(m->text.dspark_target_layer_ids == std::vector<std::int64_t>{3, 4, 6});
}

TEST_CASE("a plain text config with the fields at the top level parses") {
  auto m = parse_model_config(R"({"model_type": "deepseek_v41_text", "num_hidden_layers": 3,
                                  "num_nextn_predict_layers": 0, "compress_ratios": [0, 2, 1],
                                  "kv_source_layer_ids": [1]})");
  REQUIRE_MESSAGE(m.ok(), m.error());
  CHECK(m->model_type == "deepseek_v41_text");
  CHECK_FALSE(m->vision.has_value());
  CHECK(m->text.kv_source_of(2) == 1);
}

TEST_CASE("a field of the wrong type is refused naming field, expected and found") {
  auto m = composite(R"("hidden_size": "wide")");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error() == "test.json: text_config.hidden_size: expected an integer, found the string \"wide\"");
}

TEST_CASE("a KV source on a sliding-window-only layer is refused") {
  auto m = composite(R"("num_hidden_layers": 3, "num_nextn_predict_layers": 0,
                        "compress_ratios": [0, 2, 1], "kv_source_layer_ids": [0, 1])");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().find("text_config.kv_source_layer_ids: expected layers with compress_ratios[i] > 0, found layer 0") != std::string::npos);
}

TEST_CASE("a compressed layer with no KV source at or before it is refused") {
  auto m = composite(R"("num_hidden_layers": 3, "num_nextn_predict_layers": 0,
                        "compress_ratios": [2, 2, 1], "kv_source_layer_ids": [1])");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().find("expected an entry at or before layer 0") != std::string::npos);
}

TEST_CASE("too many compress ratios for the layers and draft layers are refused") {
  auto m = composite(R"("num_hidden_layers": 2, "num_nextn_predict_layers": 1, "compress_ratios": [0, 2, 0, 0])");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().find("compress_ratios: expected at most num_hidden_layers + num_nextn_predict_layers (3) entries, found 4") != std::string::npos);
}

TEST_CASE("a candidate source that is not an index source is refused") {
  auto m = composite(R"("num_hidden_layers": 3, "num_nextn_predict_layers": 0, "compress_ratios": [0, 2, 1],
                        "kv_source_layer_ids": [1], "candidate_source_layer_id": 2)");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().find("candidate_source_layer_id: expected one of index_source_layer_ids [1]") != std::string::npos);
}

TEST_CASE("engram table sizes must match the engram layers") {
  auto m = composite(R"("engram_layer_ids": [1, 14], "engram_num_embeddings": [10])");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().find("engram_num_embeddings: expected 2 entries") != std::string::npos);
}

TEST_CASE("an unknown scoring function is refused") {
  auto m = composite(R"("scoring_func": "relu")");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().find("scoring_func: expected \"sqrtsoftplus\", \"softmax\" or \"sigmoid\", found \"relu\"") != std::string::npos);
}

TEST_CASE("another model type is refused by name") {
  auto m = parse_model_config(R"({"model_type": "deepseek_v3"})", "c.json");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error() == "c.json: model_type: expected \"deepseek_v41\" or \"deepseek_v41_text\", found \"deepseek_v3\"");
}

TEST_CASE("text that is not JSON is refused, not thrown") {
  auto m = parse_model_config("{\"model_type\": ", "c.json");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error() == "c.json: not valid JSON");
}

TEST_CASE("a missing config file is an error naming the file") {
  auto m = load_model_config("/nonexistent/dir/config.json");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().find("/nonexistent/dir/config.json: cannot open") == 0);
}

TEST_CASE("dspark_target_layer_ids must be strictly increasing, as the reference gathers them") {
  auto ok = composite(R"("dspark_target_layer_ids": [36, 38, 39])");
  REQUIRE_MESSAGE(ok.ok(), ok.error());
  for (const char* ids : {"[39, 38, 37]", "[37, 37, 39]"}) {
    CAPTURE(ids);
    auto m = composite(std::string(R"("dspark_target_layer_ids": )") + ids);
    REQUIRE_FALSE(m.ok());
    CHECK(m.error().find("text_config.dspark_target_layer_ids: expected strictly increasing layer ids") !=
          std::string::npos);
  }
}
