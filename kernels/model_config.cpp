#include "kernels/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace troupe::kernels {

using nlohmann::json;

namespace {

// What a JSON value is, for "found ..." in messages (short; never throws on bad UTF-8).
std::string describe(const json& j) {
  std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  switch (j.type()) {
    case json::value_t::string: return "the string " + text;
    case json::value_t::boolean: return "the boolean " + text;
    case json::value_t::null: return "null";
    case json::value_t::array: return "the array " + text;
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "the number " + text;
    default: return text;
  }
}

std::string join(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Reads fields of one JSON object; the first failure is kept and later reads do nothing.
class reader {
 public:
  reader(const json& object, std::string source, std::string prefix)
      : obj_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }

  void fail(std::string_view field, std::string_view expected, std::string_view found) {
    if (failed()) return;
    error_ = source_ + ": " + prefix_ + std::string(field) + ": expected " + std::string(expected) +
             ", found " + std::string(found);
  }
  void fail_message(std::string message) {
    if (!failed()) error_ = source_ + ": " + std::move(message);
  }

  // nullptr when absent or null (the reference treats None as "use the default").
  const json* find(std::string_view key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  void integer(std::string_view key, std::int64_t& out, std::int64_t min = std::numeric_limits<std::int64_t>::min()) {
    const json* j = find(key);
    if (!j || failed()) return;
    std::int64_t v = 0;
    if (!to_int(*j, v)) return fail(key, "an integer", describe(*j));
    if (v < min) return fail(key, min == 0 ? "an integer >= 0" : "an integer >= " + std::to_string(min), std::to_string(v));
    out = v;
  }
  void optional_integer(std::string_view key, std::optional<std::int64_t>& out) {
    const json* j = find(key);
    if (!j || failed()) return;
    std::int64_t v = 0;
    if (!to_int(*j, v)) return fail(key, "an integer or null", describe(*j));
    out = v;
  }
  void number(std::string_view key, double& out, bool positive = false) {
    const json* j = find(key);
    if (!j || failed()) return;
    if (!j->is_number()) return fail(key, "a number", describe(*j));
    double v = j->get<double>();
    if (!std::isfinite(v) || (positive && !(v > 0))) return fail(key, "a positive finite number", describe(*j));
    out = v;
  }
  void boolean(std::string_view key, bool& out) {
    const json* j = find(key);
    if (!j || failed()) return;
    if (!j->is_boolean()) return fail(key, "true or false", describe(*j));
    out = j->get<bool>();
  }
  void string(std::string_view key, std::string& out) {
    const json* j = find(key);
    if (!j || failed()) return;
    if (!j->is_string()) return fail(key, "a string", describe(*j));
    out = j->get<std::string>();
  }
  // Returns true when the list was present.
  bool integers(std::string_view key, std::vector<std::int64_t>& out, std::int64_t min = std::numeric_limits<std::int64_t>::min()) {
    const json* j = find(key);
    if (!j || failed()) return false;
    if (!j->is_array()) { fail(key, "a list of integers", describe(*j)); return false; }
    std::vector<std::int64_t> v;
    for (std::size_t i = 0; i < j->size(); ++i) {
      std::int64_t x = 0;
      const json& e = (*j)[i];
      std::string field = std::string(key) + "[" + std::to_string(i) + "]";
      if (!to_int(e, x)) { fail(field, "an integer", describe(e)); return false; }
      if (x < min) { fail(field, "an integer >= " + std::to_string(min), std::to_string(x)); return false; }
      v.push_back(x);
    }
    out = std::move(v);
    return true;
  }
  void strings(std::string_view key, std::vector<std::string>& out) {
    const json* j = find(key);
    if (!j || failed()) return;
    if (!j->is_array()) return fail(key, "a list of strings", describe(*j));
    out.clear();
    for (std::size_t i = 0; i < j->size(); ++i) {
      if (!(*j)[i].is_string()) return fail(std::string(key) + "[" + std::to_string(i) + "]", "a string", describe((*j)[i]));
      out.push_back((*j)[i].get<std::string>());
    }
  }
  const json* object(std::string_view key) {
    const json* j = find(key);
    if (!j || failed()) return nullptr;
    if (!j->is_object()) { fail(key, "an object", describe(*j)); return nullptr; }
    return j;
  }

  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  static bool to_int(const json& j, std::int64_t& out) {
    if (j.is_number_integer()) {  // signed or unsigned
      if (j.is_number_unsigned() && j.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
        return false;
      out = j.get<std::int64_t>();
      return true;
    }
    return false;
  }

  const json& obj_;
  std::string source_;
  std::string prefix_;
  std::string error_;
};

void read_rope(reader& r, const json& j, rope_parameters& p, std::string prefix) {
  reader rr(j, r.source(), prefix);
  rr.string("type", p.rope_type);
  rr.string("rope_type", p.rope_type);
  rr.number("rope_theta", p.rope_theta, true);
  rr.number("partial_rotary_factor", p.partial_rotary_factor, true);
  rr.number("factor", p.factor, true);
  rr.number("beta_fast", p.beta_fast);
  rr.number("beta_slow", p.beta_slow);
  rr.integer("original_max_position_embeddings", p.original_max_position_embeddings, 0);
  rr.number("attention_factor", p.attention_factor, true);
  if (!rr.failed() && p.rope_type != "default" && p.rope_type != "yarn")
    rr.fail("rope_type", "\"default\" or \"yarn\"", "\"" + p.rope_type + "\"");
  if (!rr.failed() && p.rope_type == "yarn" && p.original_max_position_embeddings <= 0)
    rr.fail("original_max_position_embeddings", "a positive integer for yarn", std::to_string(p.original_max_position_embeddings));
  if (rr.failed()) r.fail_message(rr.error().substr(r.source().size() + 2));
}

bool contains(const std::vector<std::int64_t>& v, std::int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Reads and derives the text config from `j`; the field prefix is "text_config." or "".
result<text_config> read_text(const json& j, const std::string& source, const std::string& prefix) {
  text_config t;
  reader r(j, source, prefix);
  r.string("model_type", t.model_type);
  r.integer("vocab_size", t.vocab_size, 1);
  r.integer("hidden_size", t.hidden_size, 1);
  r.integer("num_hidden_layers", t.num_hidden_layers, 1);
  r.integer("num_attention_heads", t.num_attention_heads, 1);
  r.integer("num_key_value_heads", t.num_key_value_heads, 1);
  r.integer("head_dim", t.head_dim, 1);
  r.integer("q_lora_rank", t.q_lora_rank, 1);
  r.integer("qk_rope_head_dim", t.qk_rope_head_dim, 0);
  r.number("rope_theta", t.rope_theta, true);
  r.number("compress_rope_theta", t.compress_rope_theta, true);
  r.integer("max_position_embeddings", t.max_position_embeddings, 1);
  r.boolean("attention_bias", t.attention_bias);
  r.number("attention_dropout", t.attention_dropout);
  r.integer("sliding_window", t.sliding_window, 1);
  std::vector<std::int64_t> ratios;
  bool have_ratios = r.integers("compress_ratios", ratios, 0);
  bool have_kv = r.integers("kv_source_layer_ids", t.kv_source_layer_ids);
  bool have_index = r.integers("index_source_layer_ids", t.index_source_layer_ids);
  std::optional<std::int64_t> candidate;
  r.optional_integer("candidate_source_layer_id", candidate);
  r.integer("candidate_topk_blocks", t.candidate_topk_blocks, 1);
  r.integer("candidate_block_size", t.candidate_block_size, 1);
  r.integer("index_n_heads", t.index_n_heads, 1);
  r.integer("index_head_dim", t.index_head_dim, 1);
  r.integer("index_topk", t.index_topk, 1);
  r.integer("o_groups", t.o_groups, 1);
  r.integer("o_lora_rank", t.o_lora_rank, 1);
  r.integer("moe_intermediate_size", t.moe_intermediate_size, 1);
  r.integer("n_routed_experts", t.n_routed_experts, 1);
  r.integer("n_shared_experts", t.n_shared_experts, 0);
  r.integer("num_experts_per_tok", t.num_experts_per_tok, 1);
  r.string("scoring_func", t.scoring_func);
  r.number("gate_temp", t.gate_temp, true);
  r.boolean("norm_topk_prob", t.norm_topk_prob);
  r.number("routed_scaling_factor", t.routed_scaling_factor, true);
  r.string("topk_method", t.topk_method);
  r.number("swiglu_limit", t.swiglu_limit, true);
  r.integer("hc_mult", t.hc_mult, 1);
  r.integer("hc_sinkhorn_iters", t.hc_sinkhorn_iters, 0);
  r.number("hc_eps", t.hc_eps, true);
  bool have_engram = r.integers("engram_layer_ids", t.engram_layer_ids);
  bool have_engram_rows = r.integers("engram_num_embeddings", t.engram_num_embeddings, 0);
  r.integer("engram_vocab_size", t.engram_vocab_size, 1);
  r.integer("engram_max_ngram_size", t.engram_max_ngram_size, 2);
  r.integer("engram_n_heads", t.engram_n_heads, 1);
  r.integer("engram_head_dim", t.engram_head_dim, 1);
  r.integer("engram_pad_id", t.engram_pad_id, 0);
  r.integer("engram_compressed_vocab_size", t.engram_compressed_vocab_size, 1);
  r.integer("num_nextn_predict_layers", t.num_nextn_predict_layers, 0);
  r.integer("dspark_block_size", t.dspark_block_size, 1);
  r.integer("dspark_noise_token_id", t.dspark_noise_token_id, 0);
  bool have_dspark_targets = r.integers("dspark_target_layer_ids", t.dspark_target_layer_ids);
  r.integer("dspark_markov_rank", t.dspark_markov_rank, 1);
  r.integer("dspark_n_routed_experts", t.dspark_n_routed_experts, 1);
  r.integer("dspark_num_experts_per_tok", t.dspark_num_experts_per_tok, 1);
  r.string("hidden_act", t.hidden_act);
  r.number("initializer_range", t.initializer_range);
  r.number("rms_norm_eps", t.rms_norm_eps, true);
  r.boolean("use_cache", t.use_cache);
  r.boolean("tie_word_embeddings", t.tie_word_embeddings);
  r.optional_integer("pad_token_id", t.pad_token_id);
  r.optional_integer("bos_token_id", t.bos_token_id);
  if (const json* eos = r.find("eos_token_id")) {
    if (eos->is_array()) r.integers("eos_token_id", t.eos_token_ids);
    else { std::optional<std::int64_t> e; r.optional_integer("eos_token_id", e); if (e) t.eos_token_ids = {*e}; }
  }
  if (r.failed()) return result<text_config>::failure(r.error());

  // --- value checks the forward pass relies on ---------------------------------------------
  const std::int64_t n = t.num_hidden_layers, nextn = t.num_nextn_predict_layers;
  if (t.qk_rope_head_dim > t.head_dim || t.qk_rope_head_dim % 2)
    r.fail("qk_rope_head_dim", "an even number <= head_dim (" + std::to_string(t.head_dim) + ")", std::to_string(t.qk_rope_head_dim));
  else if (t.num_attention_heads % t.o_groups)
    r.fail("o_groups", "a divisor of num_attention_heads (" + std::to_string(t.num_attention_heads) + ")", std::to_string(t.o_groups));
  else if (t.num_experts_per_tok > t.n_routed_experts)
    r.fail("num_experts_per_tok", "at most n_routed_experts (" + std::to_string(t.n_routed_experts) + ")", std::to_string(t.num_experts_per_tok));
  else if (t.dspark_num_experts_per_tok > t.dspark_n_routed_experts)
    r.fail("dspark_num_experts_per_tok", "at most dspark_n_routed_experts (" + std::to_string(t.dspark_n_routed_experts) + ")", std::to_string(t.dspark_num_experts_per_tok));
  else if (t.scoring_func != "sqrtsoftplus" && t.scoring_func != "softmax" && t.scoring_func != "sigmoid")
    r.fail("scoring_func", "\"sqrtsoftplus\", \"softmax\" or \"sigmoid\"", "\"" + t.scoring_func + "\"");
  else if (t.topk_method != "noaux_tc" && t.topk_method != "greedy")
    r.fail("topk_method", "\"noaux_tc\" or \"greedy\"", "\"" + t.topk_method + "\"");
  if (r.failed()) return result<text_config>::failure(r.error());

  // --- compress_ratios: backbone + draft layers (always ratio 0) --------------------------
  static const std::vector<std::int64_t> released_ratios = [] {
    std::vector<std::int64_t> v = {0, 0};
    v.insert(v.end(), 18, 2);
    v.insert(v.end(), 20, 1);
    return v;
  }();
  static const std::vector<std::int64_t> released_kv = {2, 8, 14, 20};
  static const std::vector<std::int64_t> released_index = {2, 8, 14, 20, 24, 28, 32, 36};
  if (!have_ratios) {
    if (n == std::int64_t(released_ratios.size())) {
      ratios = released_ratios;
    } else {  // the released pattern scaled to n layers
      std::int64_t slide = std::min<std::int64_t>(2, n);
      std::int64_t enc = std::max<std::int64_t>(0, (n - slide + 1) / 2);
      ratios.assign(slide, 0);
      ratios.insert(ratios.end(), enc, 2);
      ratios.insert(ratios.end(), std::max<std::int64_t>(0, n - slide - enc), 1);
    }
  }
  if (std::int64_t(ratios.size()) < n)
    r.fail("compress_ratios", "at least num_hidden_layers (" + std::to_string(n) + ") entries", std::to_string(ratios.size()));
  else if (std::int64_t(ratios.size()) > n + nextn)
    r.fail("compress_ratios", "at most num_hidden_layers + num_nextn_predict_layers (" + std::to_string(n + nextn) + ") entries", std::to_string(ratios.size()));
  if (r.failed()) return result<text_config>::failure(r.error());
  ratios.resize(n + nextn, 0);
  t.compress_ratios = ratios;
  auto backbone = [&](std::int64_t i) { return t.compress_ratios[i]; };
  bool released_prefix = std::equal(t.compress_ratios.begin(), t.compress_ratios.begin() + std::min<std::int64_t>(n, 40),
                                    released_ratios.begin()) && n <= 40;

  // --- source schedules ------------------------------------------------------------------------
  if (!have_kv) {
    t.kv_source_layer_ids.clear();
    if (released_prefix) t.kv_source_layer_ids = released_kv;
    else
      for (std::int64_t i = 0; i < n; ++i)
        if (backbone(i) > 0 && (i == 0 || backbone(i - 1) != backbone(i))) t.kv_source_layer_ids.push_back(i);
  }
  if (!have_index) t.index_source_layer_ids = t.kv_source_layer_ids == released_kv ? released_index : t.kv_source_layer_ids;
  if (!have_dspark_targets) {
    std::vector<std::int64_t> rest;
    for (std::int64_t i = 0; i < n; ++i)
      if (!contains(t.kv_source_layer_ids, i)) rest.push_back(i);
    t.dspark_target_layer_ids.assign(rest.size() > 3 ? rest.end() - 3 : rest.begin(), rest.end());
  }
  const auto& kv = t.kv_source_layer_ids;
  const auto& idx = t.index_source_layer_ids;
  for (std::int64_t s : kv) {
    if (s < 0 || s >= n)
      return result<text_config>::failure(source + ": " + prefix + "kv_source_layer_ids: expected layer ids in [0, " + std::to_string(n) + "), found " + join(kv));
    if (backbone(s) == 0)
      return result<text_config>::failure(source + ": " + prefix + "kv_source_layer_ids: expected layers with compress_ratios[i] > 0, found layer " + std::to_string(s) + " with ratio 0");
  }
  for (std::int64_t s : idx) {
    if (s < 0 || s >= n)
      return result<text_config>::failure(source + ": " + prefix + "index_source_layer_ids: expected layer ids in [0, " + std::to_string(n) + "), found " + join(idx));
    if (backbone(s) == 0)
      return result<text_config>::failure(source + ": " + prefix + "index_source_layer_ids: expected layers with compress_ratios[i] > 0, found layer " + std::to_string(s) + " with ratio 0");
    if (!std::any_of(kv.begin(), kv.end(), [&](std::int64_t k) { return k <= s; }))
      return result<text_config>::failure(source + ": " + prefix + "index_source_layer_ids: expected a kv_source_layer_ids entry at or before layer " + std::to_string(s) + ", found kv sources " + join(kv));
  }
  t.candidate_source_layer_id = candidate ? *candidate : (kv.empty() ? -1 : kv.back());
  if (t.candidate_source_layer_id >= 0 && !contains(idx, t.candidate_source_layer_id))
    return result<text_config>::failure(source + ": " + prefix + "candidate_source_layer_id: expected one of index_source_layer_ids " + join(idx) + " or a negative id, found " + std::to_string(t.candidate_source_layer_id));
  for (std::int64_t i = 0; i < n; ++i)
    if (backbone(i) > 0 && !std::any_of(kv.begin(), kv.end(), [&](std::int64_t k) { return k <= i; }))
      return result<text_config>::failure(source + ": " + prefix + "kv_source_layer_ids: expected an entry at or before layer " + std::to_string(i) + " (compress ratio " + std::to_string(backbone(i)) + "), found " + join(kv));
  t.layer_types.clear();
  for (std::int64_t i = 0; i < n; ++i)
    t.layer_types.push_back(contains(kv, i) ? "shared_compressed_attention" : "sliding_attention");
  for (std::int64_t s : t.dspark_target_layer_ids)
    if (s < 0 || s >= n)
      return result<text_config>::failure(source + ": " + prefix + "dspark_target_layer_ids: expected layer ids in [0, " + std::to_string(n) + "), found " + join(t.dspark_target_layer_ids));
  // The reference gathers the features in its layer loop, so in ascending layer order; a list in
  // another order would concatenate them differently from the released main_proj's columns.
  for (std::size_t i = 1; i < t.dspark_target_layer_ids.size(); ++i)
    if (t.dspark_target_layer_ids[i] <= t.dspark_target_layer_ids[i - 1])
      return result<text_config>::failure(source + ": " + prefix + "dspark_target_layer_ids: expected strictly increasing layer ids, found " + join(t.dspark_target_layer_ids));

  // --- engram ---------------------------------------------------------------------------------
  if (!have_engram) t.engram_layer_ids.clear();
  if (!have_engram_rows) t.engram_num_embeddings.assign(t.engram_layer_ids.size(), 0);
  if (t.engram_num_embeddings.size() != t.engram_layer_ids.size())
    return result<text_config>::failure(source + ": " + prefix + "engram_num_embeddings: expected " + std::to_string(t.engram_layer_ids.size()) + " entries (one per engram_layer_ids entry), found " + std::to_string(t.engram_num_embeddings.size()));
  for (std::int64_t s : t.engram_layer_ids)
    if (s < 0 || s >= n)
      return result<text_config>::failure(source + ": " + prefix + "engram_layer_ids: expected layer ids in [0, " + std::to_string(n) + "), found " + join(t.engram_layer_ids));

  // --- rope: main (sliding only, no scaling) and compress (yarn when rope_scaling says so) ----
  const json* rp = r.object("rope_parameters");
  if (r.failed()) return result<text_config>::failure(r.error());
  const json* rp_main = rp && rp->contains("main") && (*rp)["main"].is_object() ? &(*rp)["main"] : nullptr;
  const json* rp_comp = rp && rp->contains("compress") && (*rp)["compress"].is_object() ? &(*rp)["compress"] : nullptr;
  const double partial = double(t.qk_rope_head_dim) / double(t.head_dim);
  if (rp_main && rp_comp) {
    t.rope_main = {};
    t.rope_compress = {};
    read_rope(r, *rp_main, t.rope_main, prefix + "rope_parameters.main.");
    read_rope(r, *rp_comp, t.rope_compress, prefix + "rope_parameters.compress.");
  } else {
    t.rope_main = {};
    t.rope_main.rope_theta = t.rope_theta;
    t.rope_main.partial_rotary_factor = partial;
    t.rope_compress = {};
    if (const json* scaling = r.object("rope_scaling")) read_rope(r, *scaling, t.rope_compress, prefix + "rope_scaling.");
    t.rope_compress.rope_theta = t.compress_rope_theta;
    t.rope_compress.partial_rotary_factor = partial;
    if (t.rope_compress.rope_type == "yarn" && !(r.find("rope_scaling") && r.find("rope_scaling")->contains("attention_factor")))
      t.rope_compress.attention_factor = 1.0;
  }
  if (r.failed()) return result<text_config>::failure(r.error());
  return t;
}

result<vision_config> read_vision(const json& j, const std::string& source) {
  vision_config v;
  reader r(j, source, "vision_config.");
  r.string("model_type", v.model_type);
  r.integer("hidden_size", v.hidden_size, 1);
  r.integer("intermediate_size", v.intermediate_size, 1);
  r.integer("num_hidden_layers", v.num_hidden_layers, 1);
  r.integer("num_attention_heads", v.num_attention_heads, 1);
  r.integer("patch_size", v.patch_size, 1);
  r.integer("downsample_ratio", v.downsample_ratio, 1);
  r.number("rope_theta", v.rope_theta, true);
  r.integer("max_image_tokens", v.max_image_tokens, 1);
  r.integer("min_pixels", v.min_pixels, 1);
  r.optional_integer("max_wh_ratio", v.max_wh_ratio);
  if (r.failed()) return result<vision_config>::failure(r.error());
  return v;
}

}  // namespace

layer_kind text_config::kind(std::int64_t layer) const {
  std::int64_t r = layer >= 0 && layer < std::int64_t(compress_ratios.size()) ? compress_ratios[layer] : 0;
  return r == 0 ? layer_kind::sliding : r == 1 ? layer_kind::full_resolution : layer_kind::compressed;
}
bool text_config::is_kv_source(std::int64_t layer) const { return contains(kv_source_layer_ids, layer); }
bool text_config::is_index_source(std::int64_t layer) const { return contains(index_source_layer_ids, layer); }
std::int64_t text_config::kv_source_of(std::int64_t layer) const {
  if (kind(layer) == layer_kind::sliding) return -1;
  std::int64_t best = -1;
  for (std::int64_t s : kv_source_layer_ids)
    if (s <= layer) best = std::max(best, s);
  return best;
}
std::int64_t text_config::index_source_of(std::int64_t layer) const {
  if (kind(layer) == layer_kind::sliding) return -1;
  std::int64_t best = -1;
  for (std::int64_t s : index_source_layer_ids)
    if (s <= layer) best = std::max(best, s);
  return best;
}
std::int64_t text_config::engram_index(std::int64_t layer) const {
  auto it = std::find(engram_layer_ids.begin(), engram_layer_ids.end(), layer);
  return it == engram_layer_ids.end() ? -1 : std::int64_t(it - engram_layer_ids.begin());
}

result<model_config> parse_model_config(std::string_view json_text, std::string_view source_view) {
  const std::string source(source_view);
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (j.is_discarded()) return result<model_config>::failure(source + ": not valid JSON");
  if (!j.is_object()) return result<model_config>::failure(source + ": expected a JSON object at the top level, found " + describe(j));
  try {
    model_config m;
    reader r(j, source, "");
    m.model_type.clear();
    r.string("model_type", m.model_type);
    r.strings("architectures", m.architectures);
    r.integer("image_token_id", m.image_token_id, 0);
    r.boolean("tie_word_embeddings", m.tie_word_embeddings);
    r.string("expert_dtype", m.expert_dtype);
    if (const json* q = r.object("quantization_config")) {
      quantization_config qc;
      reader qr(*q, source, "quantization_config.");
      qr.string("quant_method", qc.quant_method);
      qr.string("fmt", qc.fmt);
      qr.string("scale_fmt", qc.scale_fmt);
      qr.integers("weight_block_size", qc.weight_block_size, 1);
      qr.string("expert_dtype", qc.expert_dtype);
      if (qr.failed()) return result<model_config>::failure(qr.error());
      if (!qc.weight_block_size.empty() && qc.weight_block_size.size() != 2)
        return result<model_config>::failure(source + ": quantization_config.weight_block_size: expected [rows, cols], found " +
                                             join(qc.weight_block_size));
      if (!qc.expert_dtype.empty()) {
        if (!m.expert_dtype.empty() && m.expert_dtype != qc.expert_dtype)
          return result<model_config>::failure(source + ": expert_dtype \"" + m.expert_dtype +
                                               "\" disagrees with quantization_config.expert_dtype \"" +
                                               qc.expert_dtype + "\"");
        m.expert_dtype = qc.expert_dtype;
      }
      m.quantization = qc;
    }
    if (r.failed()) return result<model_config>::failure(r.error());
    if (!m.expert_dtype.empty() && m.expert_dtype != "fp4" && m.expert_dtype != "fp8" && m.expert_dtype != "bf16")
      return result<model_config>::failure(source + ": expert_dtype: expected \"fp4\", \"fp8\" or \"bf16\", found \"" + m.expert_dtype + "\"");

    const bool composite = m.model_type == "deepseek_v41" || (m.model_type.empty() && j.contains("text_config"));
    if (composite) {
      m.model_type = "deepseek_v41";
      const json* text = r.object("text_config");
      const json empty = json::object();
      if (r.failed()) return result<model_config>::failure(r.error());
      auto t = read_text(text ? *text : empty, source, "text_config.");
      if (!t) return result<model_config>::failure(t.error());
      m.text = std::move(*t);
      if (m.text.model_type != "deepseek_v41_text")
        return result<model_config>::failure(source + ": text_config.model_type: expected \"deepseek_v41_text\", found \"" + m.text.model_type + "\"");
      const json* vision = r.object("vision_config");
      if (r.failed()) return result<model_config>::failure(r.error());
      if (vision) {
        auto v = read_vision(*vision, source);
        if (!v) return result<model_config>::failure(v.error());
        m.vision = *v;
      }
    } else if (m.model_type == "deepseek_v41_text" || m.model_type.empty()) {
      m.model_type = "deepseek_v41_text";
      auto t = read_text(j, source, "");
      if (!t) return result<model_config>::failure(t.error());
      m.text = std::move(*t);
      m.text.model_type = "deepseek_v41_text";
    } else {
      return result<model_config>::failure(source + ": model_type: expected \"deepseek_v41\" or \"deepseek_v41_text\", found \"" + m.model_type + "\"");
    }
    if (!j.contains("tie_word_embeddings")) m.tie_word_embeddings = m.text.tie_word_embeddings;
    return m;
  } catch (const std::exception& e) {  // a bug here must not escape the API
    return result<model_config>::failure(source + ": internal error while reading the config: " + e.what());
  }
}

std::int64_t model_config::fp8_block_rows() const {
  return quantization && quantization->weight_block_size.size() == 2 ? quantization->weight_block_size[0] : 128;
}

std::int64_t model_config::fp8_block_cols() const {
  return quantization && quantization->weight_block_size.size() == 2 ? quantization->weight_block_size[1] : 128;
}

result<model_config> load_model_config(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path file = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  std::ifstream in(file, std::ios::binary);
  if (!in) return result<model_config>::failure(file.string() + ": cannot open the file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return parse_model_config(buffer.str(), file.string());
}

}  // namespace troupe::kernels
