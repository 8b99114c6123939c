// The device-memory plan of one GPU rank (kernels/device_layout.hpp).
#include "kernels/device_layout.hpp"

#include <cstdio>
#include "kernels/kv_cache.hpp"
#include <string>

namespace troupe::kernels {

namespace {

std::int64_t numel(const weight_spec& w) {
  std::int64_t n = 1;
  for (auto d : w.shape) n *= d;
  return n;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The layer a tensor belongs to (see layer_weights::layer) and, for a backbone routed expert,
// its expert id (else -1).
void classify(const std::string& name, std::int64_t layers, std::int64_t& layer,
              std::int64_t& expert) {
  layer = -1;
  expert = -1;
  auto number_after = [&](std::size_t at) { return std::stoll(name.substr(at)); };
  if (name.rfind("layers.", 0) == 0) {
    layer = number_after(7);
    const auto x = name.find(".ffn.experts.");
    if (x != std::string::npos) expert = number_after(x + 13);
  } else if (name.rfind("mtp.", 0) == 0) {
    layer = layers + number_after(4);
  }
}

std::string gib(std::int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / double(1 << 30));
  return buf;
}

}  // namespace

std::int64_t stored_bytes(const weight_spec& w) {
  const std::int64_t n = numel(w);
  switch (w.format) {
    case weight_format::bf16: return 2 * n;
    case weight_format::f32: return 4 * n;
    case weight_format::fp8_block: {
      const std::int64_t rows = w.shape.empty() ? 1 : w.shape.front();
      const std::int64_t cols = rows == 0 ? 0 : n / rows;
      return n + ceil_div(rows, w.block_rows) * ceil_div(cols, w.block_cols);
    }
    case weight_format::fp4_expert: return n / 2 + n / 32;
    case weight_format::fp8_table: return n + n / 32;
    case weight_format::e8m0: return n;
  }
  return 0;
}

std::int64_t layer_weights::total() const {
  std::int64_t t = 0;
  for (auto b : bytes) t += b;
  return t;
}

result<device_layout> plan_device_layout(const model_config& cfg, const device_layout_options& o) {
  using r = result<device_layout>;
  const text_config& t = cfg.text;
  if (o.placement != nullptr) {
    if (o.placement->experts != t.n_routed_experts)
      return r::failure("device layout: the placement has " +
                        std::to_string(o.placement->experts) + " experts, the model " +
                        std::to_string(t.n_routed_experts));
    if (o.ep_rank < 0 || o.ep_rank >= o.placement->ranks)
      return r::failure("device layout: rank " + std::to_string(o.ep_rank) +
                        " is not in an EP group of " + std::to_string(o.placement->ranks));
  }
  std::vector<bool> mine(static_cast<std::size_t>(t.n_routed_experts), o.placement == nullptr);
  if (o.placement != nullptr)
    for (auto e : o.placement->local[static_cast<std::size_t>(o.ep_rank)])
      mine[static_cast<std::size_t>(e)] = true;

  device_layout d;
  const std::int64_t L = t.num_hidden_layers;
  d.layers.resize(static_cast<std::size_t>(1 + L + t.num_nextn_predict_layers));
  for (std::size_t i = 0; i < d.layers.size(); ++i)
    d.layers[i].layer = static_cast<std::int64_t>(i) - 1;
  for (const auto& w : released_layout(cfg)) {
    std::int64_t layer = 0, expert = 0;
    classify(w.name, L, layer, expert);
    const std::int64_t bytes = stored_bytes(w);
    if (w.format == weight_format::fp8_table || w.name.find(".engram.embed.scale") != std::string::npos) {
      d.host_bytes += bytes;
      continue;
    }
    if (expert >= 0 && layer < L && !mine[static_cast<std::size_t>(expert)]) continue;
    const auto f = static_cast<std::size_t>(w.format);
    d.layers[static_cast<std::size_t>(layer + 1)].bytes[f] += bytes;
    d.weight_bytes_by_format[f] += bytes;
    d.weight_bytes += bytes;
  }

  // SWA rings: every backbone layer keeps (window + 6) rows of head_dim values per sequence.
  d.swa_bytes_per_sequence =
      L * (t.sliding_window + swa_rollback_tokens) * t.head_dim * o.swa_value_bytes;
  d.swa_bytes = d.swa_bytes_per_sequence * o.max_sequences;
  // One Block KV block: per KV-source layer, 128 / ratio compressed rows of head_dim values,
  // and as many indexer-key rows of index_head_dim when the layer is also an index source.
  for (std::int64_t l = 0; l < L; ++l) {
    if (!t.is_kv_source(l)) continue;
    const std::int64_t ratio = t.compress_ratios[static_cast<std::size_t>(l)];
    const std::int64_t rows = kv_block_tokens / (ratio > 0 ? ratio : 1);
    std::int64_t width = t.head_dim;
    if (t.is_index_source(l)) width += t.index_head_dim;
    d.kv_block_bytes += rows * width * o.kv_value_bytes;
  }
  const std::int64_t fixed = d.weight_bytes + o.reserve_bytes + d.swa_bytes;
  if (fixed > o.free_bytes)
    return r::failure("device layout: weights " + gib(d.weight_bytes) + " + reserve " +
                      gib(o.reserve_bytes) + " + SWA rings " + gib(d.swa_bytes) + " (" +
                      std::to_string(o.max_sequences) + " sequences) exceed the free " +
                      gib(o.free_bytes));
  d.kv_blocks = d.kv_block_bytes > 0 ? (o.free_bytes - fixed) / d.kv_block_bytes : 0;
  d.kv_pool_bytes = d.kv_blocks * d.kv_block_bytes;
  return d;
}

}  // namespace troupe::kernels
