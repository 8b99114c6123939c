// Model profiles from HF config.json: the three DeepSeek families and their storage formats.
#include "cluster/sim/model_profile.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

namespace troupe::cluster::sim {

namespace {

using json = nlohmann::json;

// Reads fields of one JSON object, remembering the first problem.
class reader {
public:
  reader(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  std::uint32_t u32(const char* key) {
    auto v = find(key, true);
    return v ? to_u32(key, *v) : 0;
  }

  std::uint32_t u32_or(const char* key, std::uint32_t fallback) {
    auto v = find(key, false);
    return v ? to_u32(key, *v) : fallback;
  }

  std::string str(const char* key) {
    auto v = find(key, true);
    if (!v)
      return {};
    if (!v->is_string()) {
      fail(key, "must be a string");
      return {};
    }
    return v->get<std::string>();
  }

  std::optional<std::vector<std::int64_t>> ints(const char* key, bool required) {
    auto v = find(key, required);
    if (!v)
      return std::nullopt;
    if (!v->is_array()) {
      fail(key, "must be a list of integers");
      return std::nullopt;
    }
    std::vector<std::int64_t> out;
    for (const auto& e : *v) {
      if (!e.is_number_integer()) {
        fail(key, "must be a list of integers");
        return std::nullopt;
      }
      out.push_back(e.get<std::int64_t>());
    }
    return out;
  }

  bool has(const char* key) const { return obj_.contains(key) && !obj_[key].is_null(); }

  void fail(const std::string& key, const std::string& what) {
    if (error_.empty())
      error_ = where_ + key + ": " + what;
  }

  const std::string& error() const { return error_; }

private:
  const json* find(const char* key, bool required) {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) {
      if (required)
        fail(key, "missing");
      return nullptr;
    }
    return &*it;
  }

  std::uint32_t to_u32(const char* key, const json& v) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0
        || v.get<std::int64_t>() > 0xffffffffLL) {
      fail(key, "must be a non-negative integer, got " + v.dump());
      return 0;
    }
    return static_cast<std::uint32_t>(v.get<std::int64_t>());
  }

  const json& obj_;
  std::string where_;
  std::string error_;
};

// FP4 (E2M1) with one 1-byte scale per 16 elements.
double fp4_bytes(double elements) {
  return elements * 0.5 + elements / 16.0;
}

// The derived totals: parameters, KV bytes per token.
void derive(model_profile& m) {
  double moe_layer = m.attention_params
                     + (m.experts_per_token + m.shared_experts) * m.expert_params
                     + double(m.hidden) * m.routed_experts;
  double moe_layer_total = m.attention_params
                           + (m.routed_experts + m.shared_experts) * m.expert_params
                           + double(m.hidden) * m.routed_experts;
  double dense_layer = m.attention_params + 3.0 * m.hidden * m.dense_intermediate;
  double head = double(m.hidden) * m.vocab;
  m.active_params_decode = head;
  m.active_params_prefill = 0;
  m.total_params = 2 * head;
  m.kv_bytes_per_token = 0;
  for (const auto& l : m.layers) {
    double p = l.moe ? moe_layer : dense_layer;
    double extra = (l.kv_source ? m.compressor_params : 0) + (l.index_source ? m.indexer_params : 0)
                   + (l.engram ? m.engram_projection_params : 0);
    m.active_params_decode += p + extra;
    if (l.prefill_tail_only)
      m.active_params_prefill += l.kv_source ? m.compressor_params : 0;
    else
      m.active_params_prefill += p + extra;
    m.total_params += (l.moe ? moe_layer_total : dense_layer) + extra;
    if (m.family == model_family::deepseek_v3) {
      m.kv_bytes_per_token += m.kv_entry_bytes;
    } else if (l.kv_source && l.compress_ratio > 0) {
      bool indexed = l.attention != attention_kind::hca;
      m.kv_bytes_per_token +=
        (m.kv_entry_bytes + (indexed ? m.index_entry_bytes : 0)) / l.compress_ratio;
    }
  }
  m.total_params += m.engram_table_rows * m.engram_head_dim;
}

result<model_profile> read_v3(const json& c, std::string name) {
  reader r(c, "");
  model_profile m;
  m.name = std::move(name);
  m.family = model_family::deepseek_v3;
  m.hidden = r.u32("hidden_size");
  m.vocab = r.u32("vocab_size");
  auto n_layers = r.u32("num_hidden_layers");
  m.heads = r.u32("num_attention_heads");
  auto q_lora = r.u32("q_lora_rank");
  auto kv_lora = r.u32("kv_lora_rank");
  auto nope = r.u32("qk_nope_head_dim");
  m.rope_dim = r.u32("qk_rope_head_dim");
  m.v_head_dim = r.u32("v_head_dim");
  m.moe_intermediate = r.u32("moe_intermediate_size");
  m.dense_intermediate = r.u32("intermediate_size");
  m.routed_experts = r.u32("n_routed_experts");
  m.shared_experts = r.u32("n_shared_experts");
  m.experts_per_token = r.u32("num_experts_per_tok");
  auto first_dense = r.u32("first_k_dense_replace");
  m.expert_groups = r.u32_or("n_group", 1);
  m.groups_per_token = r.u32_or("topk_group", m.expert_groups);
  m.draft_layers = r.u32_or("num_nextn_predict_layers", 0);
  if (!r.error().empty())
    return result<model_profile>::failure(r.error());
  if (first_dense > n_layers)
    return result<model_profile>::failure("first_k_dense_replace: " + std::to_string(first_dense)
                                          + " exceeds num_hidden_layers "
                                          + std::to_string(n_layers));
  m.qk_head_dim = nope + m.rope_dim;
  m.kv_latent_dim = kv_lora + m.rope_dim;
  double h = m.hidden;
  m.attention_params = h * q_lora + double(q_lora) * m.heads * m.qk_head_dim
                       + h * (kv_lora + m.rope_dim)
                       + double(kv_lora) * m.heads * (nope + m.v_head_dim)
                       + double(m.heads) * m.v_head_dim * h;
  m.expert_params = 3.0 * h * m.moe_intermediate;
  for (std::uint32_t i = 0; i < n_layers; ++i) {
    layer_profile l;
    l.attention = attention_kind::mla;
    l.kv_source = true;
    l.moe = i >= first_dense;
    m.layers.push_back(l);
  }
  // FP8 weights (block scales are < 0.1%), BF16 MLA cache as FlashMLA's dense decoding reads it.
  m.expert_bytes_per_param = 1;
  m.kv_entry_bytes = 2.0 * m.kv_latent_dim;
  m.swa_entry_bytes = m.kv_entry_bytes;
  return m;
}

// Fields V4 and V4.1 share: shared-KV attention with grouped low-rank output.
void read_v4_common(reader& r, model_profile& m) {
  m.hidden = r.u32("hidden_size");
  m.vocab = r.u32("vocab_size");
  m.heads = r.u32("num_attention_heads");
  m.qk_head_dim = r.u32("head_dim");
  m.v_head_dim = m.qk_head_dim;
  m.kv_latent_dim = m.qk_head_dim;
  m.rope_dim = r.u32_or("qk_rope_head_dim", 64);
  auto q_lora = r.u32("q_lora_rank");
  auto o_groups = r.u32("o_groups");
  auto o_lora = r.u32("o_lora_rank");
  m.sliding_window = r.u32("sliding_window");
  m.index_heads = r.u32("index_n_heads");
  m.index_head_dim = r.u32("index_head_dim");
  m.index_topk = r.u32("index_topk");
  m.moe_intermediate = r.u32("moe_intermediate_size");
  m.routed_experts = r.u32("n_routed_experts");
  m.shared_experts = r.u32("n_shared_experts");
  m.experts_per_token = r.u32("num_experts_per_tok");
  m.draft_layers = r.u32_or("num_nextn_predict_layers", 0);
  double h = m.hidden;
  double hd = double(m.heads) * m.qk_head_dim;
  m.attention_params = h * q_lora + double(q_lora) * hd + h * m.qk_head_dim + hd * o_lora
                       + double(o_groups) * o_lora * h;
  // Compressor: KV and gate projections; indexer: its query heads, key and head weights.
  m.compressor_params = 2.0 * h * m.qk_head_dim + h * m.index_head_dim;
  m.indexer_params = double(q_lora) * m.index_heads * m.index_head_dim + h * m.index_heads;
  m.expert_params = 3.0 * h * m.moe_intermediate;
  m.replay_tokens = m.sliding_window;
  // Experts in FP4 (E2M1 + E8M0 scale per 32), the rest FP8. Main KV entry: V4 keeps the
  // no-rope part in FP8 with fp32 scales per 128 and the rope part in BF16; indexer keys FP4.
  m.expert_bytes_per_param = 0.5 + 1.0 / 32;
  double nope = m.kv_latent_dim - m.rope_dim;
  m.swa_entry_bytes = nope + 2.0 * m.rope_dim + 4.0 * ((nope + 127) / 128);
  m.kv_entry_bytes = m.swa_entry_bytes;
  m.index_entry_bytes = fp4_bytes(m.index_head_dim);
}

result<model_profile> read_v4(const json& c, std::string name) {
  reader r(c, "");
  model_profile m;
  m.name = std::move(name);
  m.family = model_family::deepseek_v4;
  read_v4_common(r, m);
  auto n_layers = r.u32("num_hidden_layers");
  auto ratios = r.ints("compress_ratios", true);
  if (!r.error().empty())
    return result<model_profile>::failure(r.error());
  if (ratios->size() < n_layers)
    return result<model_profile>::failure("compress_ratios: has " + std::to_string(ratios->size())
                                          + " entries, needs num_hidden_layers = "
                                          + std::to_string(n_layers));
  for (std::uint32_t i = 0; i < n_layers; ++i) {
    auto ratio = (*ratios)[i];
    layer_profile l;
    if (ratio == 0) {
      l.attention = attention_kind::sliding;
    } else if (ratio == 4) {
      l.attention = attention_kind::csa;
      l.index_source = true;
    } else if (ratio == 128) {
      l.attention = attention_kind::hca;
    } else {
      return result<model_profile>::failure("compress_ratios[" + std::to_string(i)
                                            + "]: DeepSeek-V4 layers use 0, 4 or 128, got "
                                            + std::to_string(ratio));
    }
    l.compress_ratio = static_cast<std::uint32_t>(ratio);
    l.kv_source = ratio > 0;
    m.layers.push_back(l);
  }
  return m;
}

result<model_profile> read_v41(const json& top, std::string name) {
  auto tc = top.find("text_config");
  if (tc == top.end() || !tc->is_object())
    return result<model_profile>::failure("text_config: missing (a deepseek_v41 config keeps the "
                                          "text model's fields under text_config)");
  const json& c = *tc;
  reader r(c, "text_config.");
  model_profile m;
  m.name = std::move(name);
  m.family = model_family::deepseek_v41;
  read_v4_common(r, m);
  auto n_layers = r.u32("num_hidden_layers");
  auto ratios = r.ints("compress_ratios", true);
  auto kv_sources = r.ints("kv_source_layer_ids", true);
  auto index_sources = r.ints("index_source_layer_ids", true);
  auto engram_layers = r.ints("engram_layer_ids", false);
  auto engram_rows = r.ints("engram_num_embeddings", false);
  std::int64_t candidate_source = -1;
  if (r.has("candidate_source_layer_id")) {
    if (!c["candidate_source_layer_id"].is_number_integer())
      r.fail("candidate_source_layer_id", "must be an integer");
    else
      candidate_source = c["candidate_source_layer_id"].get<std::int64_t>();
  }
  auto cand_blocks = r.u32_or("candidate_topk_blocks", 0);
  auto cand_size = r.u32_or("candidate_block_size", 1);
  auto max_ngram = r.u32_or("engram_max_ngram_size", 4);
  auto engram_heads = r.u32_or("engram_n_heads", 8);
  auto engram_dim = r.u32_or("engram_head_dim", 256);
  auto hc_mult = r.u32_or("hc_mult", 4);
  if (!r.error().empty())
    return result<model_profile>::failure(r.error());
  auto bad = [](const std::string& what) { return result<model_profile>::failure(what); };
  if (ratios->size() < n_layers)
    return bad("text_config.compress_ratios: has " + std::to_string(ratios->size())
               + " entries, needs num_hidden_layers = " + std::to_string(n_layers));
  std::set<std::int64_t> kv(kv_sources->begin(), kv_sources->end());
  std::set<std::int64_t> ix(index_sources->begin(), index_sources->end());
  for (auto id : kv)
    if (id < 0 || id >= n_layers || (*ratios)[id] <= 0)
      return bad("text_config.kv_source_layer_ids: layer " + std::to_string(id)
                 + " is not a compressed layer of the " + std::to_string(n_layers));
  for (auto id : ix)
    if (id < 0 || id >= n_layers || (*ratios)[id] <= 0)
      return bad("text_config.index_source_layer_ids: layer " + std::to_string(id)
                 + " is not a compressed layer of the " + std::to_string(n_layers));
  std::set<std::int64_t> engram;
  if (engram_layers)
    engram.insert(engram_layers->begin(), engram_layers->end());
  for (auto id : engram)
    if (id < 0 || id >= n_layers)
      return bad("text_config.engram_layer_ids: layer " + std::to_string(id) + " out of range");
  if (engram_rows && engram_layers && engram_rows->size() != engram_layers->size())
    return bad("text_config.engram_num_embeddings: needs one entry per engram layer");
  for (std::uint32_t i = 0; i < n_layers; ++i) {
    auto ratio = (*ratios)[i];
    if (ratio < 0)
      return bad("text_config.compress_ratios[" + std::to_string(i) + "]: must be >= 0");
    layer_profile l;
    l.compress_ratio = static_cast<std::uint32_t>(ratio);
    l.attention = ratio == 0   ? attention_kind::sliding
                  : ratio == 1 ? attention_kind::ced_decoder
                               : attention_kind::ced_encoder;
    l.kv_source = kv.count(i) > 0;
    l.index_source = ix.count(i) > 0;
    l.candidate_limited = candidate_source >= 0 && i > candidate_source && l.index_source;
    l.engram = engram.count(i) > 0;
    l.prefill_tail_only = ratio == 1;
    m.layers.push_back(l);
  }
  m.candidate_positions = candidate_source >= 0 ? cand_blocks * cand_size : 0;
  m.engram_rows_per_token = (max_ngram > 1 ? max_ngram - 1 : 0) * engram_heads;
  m.engram_head_dim = engram_dim;
  m.engram_row_bytes = engram_dim + engram_dim / 32; // FP8 rows with an E8M0 scale per 32
  if (engram_rows)
    for (auto rows : *engram_rows)
      m.engram_table_rows += double(rows);
  m.engram_projection_params =
    double(m.engram_rows_per_token) * engram_dim * (hc_mult + 1.0) * m.hidden;
  // V4.1: main KV in FP4 as the indexer keys (the model card's ~890 bytes per token).
  m.kv_entry_bytes = fp4_bytes(m.kv_latent_dim);
  return m;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return out;
}

} // namespace

std::string to_string(model_family f) {
  switch (f) {
    case model_family::deepseek_v3: return "deepseek_v3";
    case model_family::deepseek_v4: return "deepseek_v4";
    case model_family::deepseek_v41: return "deepseek_v41";
  }
  return "?";
}

std::string to_string(attention_kind k) {
  switch (k) {
    case attention_kind::mla: return "mla";
    case attention_kind::sliding: return "sliding";
    case attention_kind::csa: return "csa";
    case attention_kind::hca: return "hca";
    case attention_kind::ced_encoder: return "ced_encoder";
    case attention_kind::ced_decoder: return "ced_decoder";
  }
  return "?";
}

double model_profile::swa_ring_bytes() const {
  double layers_with_window = 0;
  for (auto& l : layers)
    if (l.attention != attention_kind::mla)
      layers_with_window += 1;
  return sliding_window == 0 ? 0
                             : layers_with_window * (sliding_window + 6.0) * swa_entry_bytes;
}

std::size_t model_profile::moe_layer_count() const {
  return static_cast<std::size_t>(
    std::count_if(layers.begin(), layers.end(), [](const layer_profile& l) { return l.moe; }));
}

result<model_profile> model_from_config(const nlohmann::json& config, std::string name) {
  if (!config.is_object())
    return result<model_profile>::failure("config: expected a JSON object");
  auto mt = config.find("model_type");
  if (mt == config.end() || !mt->is_string())
    return result<model_profile>::failure(
      "model_type: missing (expected deepseek_v3, deepseek_v4 or deepseek_v41)");
  auto type = mt->get<std::string>();
  result<model_profile> m = type == "deepseek_v3"    ? read_v3(config, std::move(name))
                            : type == "deepseek_v4"  ? read_v4(config, std::move(name))
                            : type == "deepseek_v41" ? read_v41(config, std::move(name))
                                                     : result<model_profile>::failure(
                                                       "model_type: '" + type
                                                       + "' is not supported (expected "
                                                         "deepseek_v3, deepseek_v4 or "
                                                         "deepseek_v41)");
  if (!m)
    return m;
  if (m->layers.empty())
    return result<model_profile>::failure("num_hidden_layers: must be at least 1");
  if (m->heads == 0 || m->hidden == 0 || m->experts_per_token == 0 || m->routed_experts == 0
      || m->experts_per_token > m->routed_experts)
    return result<model_profile>::failure(
      "hidden_size, num_attention_heads, n_routed_experts and num_experts_per_tok must be "
      "positive, with num_experts_per_tok <= n_routed_experts");
  derive(*m);
  return m;
}

result<model_profile> load_model_config(const std::filesystem::path& file) {
  auto path = std::filesystem::is_directory(file) ? file / "config.json" : file;
  std::ifstream in(path);
  if (!in)
    return result<model_profile>::failure(path.string() + ": cannot open model config");
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded())
    return result<model_profile>::failure(path.string() + ": not valid JSON");
  auto name = path.parent_path().filename().string();
  auto m = model_from_config(j, name.empty() ? path.stem().string() : name);
  if (!m)
    return result<model_profile>::failure(path.string() + ": " + m.error());
  return m;
}

const std::vector<std::pair<std::string_view, std::string_view>>& known_model_configs() {
  static const std::vector<std::pair<std::string_view, std::string_view>> models{
    {"deepseek-v4.1-flash", "DeepSeek-V4.1-Flash"},
    {"deepseek-v4-flash", "DeepSeek-V4-Flash"},
    {"deepseek-v3", "DeepSeek-V3"},
  };
  return models;
}

result<model_profile> resolve_model(std::string_view name_or_path,
                                    const std::filesystem::path& models_dir) {
  auto key = lower(name_or_path);
  for (const auto& [name, folder] : known_model_configs()) {
    if (key == name) {
      auto m = load_model_config(models_dir / std::string(folder) / "config.json");
      if (m)
        m->name = std::string(name);
      return m;
    }
  }
  std::filesystem::path p{std::string(name_or_path)};
  std::error_code ec;
  if (std::filesystem::exists(p, ec))
    return load_model_config(p);
  std::string known;
  for (const auto& [name, folder] : known_model_configs())
    known += (known.empty() ? "" : ", ") + std::string(name);
  return result<model_profile>::failure("unknown model '" + std::string(name_or_path)
                                        + "' (known: " + known
                                        + ", or a path to an HF config.json)");
}

std::filesystem::path default_models_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (const char* env = std::getenv("TROUPE_MODELS_DIR"); env != nullptr && *env != '\0')
    return fs::path(env);
  // An installed program: <prefix>/<bindir>/program -> <prefix>/<datadir>/troupe/models.
  if (auto exe = fs::read_symlink("/proc/self/exe", ec); !ec) {
    auto prefix = exe.parent_path();
    for (const auto& part : fs::path(TROUPE_INSTALL_BINDIR)) {
      (void)part;
      prefix = prefix.parent_path();
    }
    auto installed = prefix / TROUPE_INSTALL_MODELS_RELDIR;
    if (fs::is_directory(installed, ec))
      return installed;
  }
  return fs::path(TROUPE_MODELS_DIR);
}

} // namespace troupe::cluster::sim
