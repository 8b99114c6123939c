// The CUDA backend's preflight and its not-yet-implemented interface (kernels/cuda/cuda_backend.hpp).
#include "kernels/cuda/cuda_backend.hpp"

#include <cstdio>

#include "kernels/cuda/device.hpp"
#include "kernels/device_layout.hpp"
#include "kernels/model_config.hpp"

namespace troupe::kernels::cuda {

namespace {

const char* const missing =
    "the CUDA backend does not serve the DeepSeek-V4.1 model yet (built: the kernels of "
    "kernels/cuda/ops.hpp, the cuBLASLt BF16 and FP32 GEMMs, the NCCL EP all-to-all, and the "
    "backbone's forward pass on fp32 weights (device_model.hpp); missing: serving it through "
    "this interface, the routed experts' grouped GEMM on FP8/FP4 "
    "weights, the DSpark draft layers and rollback on the device); use device = \"cpu\"";

template <class T>
result<T> not_implemented() {
  return result<T>::failure(missing);
}

std::string gib(std::int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / double(1 << 30));
  return buf;
}

}  // namespace

result<std::unique_ptr<cuda_backend>> cuda_backend::open(const std::filesystem::path& model_dir,
                                                         const cuda_backend_options& options) {
  using r = result<std::unique_ptr<cuda_backend>>;
  auto dev = query_device(options.device);
  if (!dev) return r::failure(dev.error());
  auto cfg = load_model_config(model_dir / "config.json");
  if (!cfg) return r::failure(cfg.error());
  device_layout_options lo;
  lo.free_bytes = dev->free_bytes;
  lo.reserve_bytes = options.reserve_bytes;
  auto layout = plan_device_layout(*cfg, lo);
  if (!layout) return r::failure(dev->name + ": " + layout.error());
  return r::failure(std::string(missing) + " [preflight on " + dev->name + ": weights " +
                    gib(layout->weight_bytes) + ", Block KV pool " +
                    std::to_string(layout->kv_blocks) + " blocks]");
}

sequence_id cuda_backend::open_sequence() { return 0; }
result<bool> cuda_backend::close_sequence(sequence_id) { return not_implemented<bool>(); }
result<std::int64_t> cuda_backend::length(sequence_id) const {
  return not_implemented<std::int64_t>();
}
result<std::vector<float>> cuda_backend::step(std::span<const step_input>) {
  return not_implemented<std::vector<float>>();
}
result<std::vector<float>> cuda_backend::step_tail(std::span<const step_input>,
                                                   std::span<const std::int64_t>,
                                                   std::vector<float>*) {
  return not_implemented<std::vector<float>>();
}
result<bool> cuda_backend::rollback(sequence_id, std::int64_t) { return not_implemented<bool>(); }
bool cuda_backend::has_draft() const { return false; }
result<draft_output> cuda_backend::draft(std::span<const draft_request>) {
  return not_implemented<draft_output>();
}
result<std::string> cuda_backend::export_draft(sequence_id) const {
  return not_implemented<std::string>();
}
result<bool> cuda_backend::import_draft(sequence_id, std::string_view) {
  return not_implemented<bool>();
}
result<std::string> cuda_backend::export_block(sequence_id, std::int64_t) const {
  return not_implemented<std::string>();
}
result<bool> cuda_backend::import_block(sequence_id, std::int64_t, std::string_view) {
  return not_implemented<bool>();
}
result<std::int64_t> cuda_backend::full_blocks(sequence_id) const {
  return not_implemented<std::int64_t>();
}
result<std::string> cuda_backend::export_state(sequence_id) const {
  return not_implemented<std::string>();
}
result<std::string> cuda_backend::export_swa(sequence_id) const {
  return not_implemented<std::string>();
}
result<bool> cuda_backend::import_state(sequence_id, std::string_view) {
  return not_implemented<bool>();
}
result<bool> cuda_backend::import_swa(sequence_id, std::string_view) {
  return not_implemented<bool>();
}
result<std::vector<float>> cuda_backend::replay(sequence_id, std::span<const std::int64_t>) {
  return not_implemented<std::vector<float>>();
}

}  // namespace troupe::kernels::cuda
