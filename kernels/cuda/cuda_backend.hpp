// `cuda_backend`: the model_backend (kernels/backend.hpp) of a CUDA GPU rank — not able to run
// the model yet.
//
// The CUDA engine is being built from the bottom up: the kernels (kernels/cuda/ops.hpp), the
// cuBLASLt GEMMs (gemm.hpp), the EP communicator (nccl_comm.hpp), the host-side plans they
// follow (kernels/ep_dispatch.hpp, ep_group.hpp, device_layout.hpp) and the backbone's
// forward pass on fp32 weights (device_model.hpp) exist; what serving V4.1 needs beyond them
// does not (this interface over device_model, the routed experts' FP8/FP4 grouped GEMM, the
// DSpark draft layers and rollback on the device). Rather than return wrong
// logits, `open` does the preflight a real open would do (finds the device, reads the config,
// plans the device memory) and then fails with a message that says what is missing, so
// `device = "cuda"` cannot be mistaken for a working engine. No instance is ever made; the
// class exists so the interface it must fill is fixed and compiled against.
#pragma once

#include <filesystem>
#include <memory>

#include "kernels/backend.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels::cuda {

struct cuda_backend_options {
  int device = 0;
  /// Reserved device memory (activations, workspace, NCCL), as device_layout_options.
  std::int64_t reserve_bytes = std::int64_t{4} << 30;
};

class cuda_backend final : public model_backend {
 public:
  /// Always a failure today: "no CUDA device: ..." without a usable GPU, the config's or the
  /// layout's error when the model is unreadable or does not fit, and otherwise "the CUDA
  /// backend does not serve the DeepSeek-V4.1 model yet" with what is and is not built,
  /// and the device memory plan it made.
  static result<std::unique_ptr<cuda_backend>> open(const std::filesystem::path& model_dir,
                                                     const cuda_backend_options& options = {});

  // model_backend: unreachable (no instance exists); each returns the "not implemented"
  // failure.
  sequence_id open_sequence() override;
  result<bool> close_sequence(sequence_id id) override;
  result<std::int64_t> length(sequence_id id) const override;
  result<std::vector<float>> step(std::span<const step_input> batch) override;
  result<std::vector<float>> step_tail(std::span<const step_input> batch,
                                       std::span<const std::int64_t> rows,
                                       std::vector<float>* dspark_features) override;
  result<bool> rollback(sequence_id id, std::int64_t k) override;
  bool has_draft() const override;
  result<draft_output> draft(std::span<const draft_request> batch) override;
  result<std::string> export_draft(sequence_id id) const override;
  result<bool> import_draft(sequence_id id, std::string_view bytes) override;
  result<std::string> export_block(sequence_id id, std::int64_t block) const override;
  result<bool> import_block(sequence_id id, std::int64_t block, std::string_view bytes) override;
  result<std::int64_t> full_blocks(sequence_id id) const override;
  result<std::string> export_state(sequence_id id) const override;
  result<std::string> export_swa(sequence_id id) const override;
  result<bool> import_state(sequence_id id, std::string_view bytes) override;
  result<bool> import_swa(sequence_id id, std::string_view bytes) override;
  result<std::vector<float>> replay(sequence_id id, std::span<const std::int64_t> tokens) override;

 private:
  cuda_backend() = default;
};

}  // namespace troupe::kernels::cuda
