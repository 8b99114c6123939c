// The DeepSeek-V4.1 forward pass on the device: the CPU engine's layer loop (kernels/model.cpp)
// run as kernels of ops.hpp and FP32 GEMMs (lt_gemm::run_f32), with each sequence's SWA rings
// in device memory. The first piece of the CUDA backend that computes logits.
//
// What it runs today, and what it refuses with a message: every layer must attend over the
// sliding window only (compress ratio 0: no CSA2 compressor, indexer or compressed KV yet);
// Engram layers read their table rows on the host (the tables stay in the mapped checkpoint,
// as they must at full scale) and gate them in on the device; the DSpark draft layers are not
// run. Weights are the CPU engine's fp32 copies (`model::tensors()`), not the checkpoint's
// BF16 / FP8 / FP4 bytes, so memory is 4 bytes per parameter: a check of the layer loop on
// small models, not a way to fit V4.1-Flash on a GPU. The routed experts run one GEMM per
// expert on the rows the host's dispatch plan groups for it (kernels/ep_dispatch.hpp, one
// rank), which needs the router's choices on the host once per layer.
//
// This file is plain C++ over device pointers. troupe_cuda builds it with the CUDA runtime and
// cuBLASLt; tests/cuda_host builds it with host memory and the kernels under the SIMT emulator
// (tests/cuda_host/emulated_device.cpp), so the whole forward pass is checked against the CPU
// engine in every test run, and on a GPU by bench/gpu_check.sh.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/model.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels::cuda {

struct device_model_options {
  /// Sequences open at once (their SWA rings are allocated up front).
  std::int64_t max_sequences = 16;
};

class device_model {
 public:
  /// The weights of a loaded CPU model copied to the device, and empty rings. The model must
  /// outlive the device model (its Engram tables and token map are read at each call). Errors:
  /// a layer the device cannot run yet (named), max_sequences < 1, a window longer than the
  /// attention kernel takes, a failed allocation or copy.
  static result<device_model> upload(const model& m, const device_model_options& options = {});

  device_model(device_model&&) noexcept;
  device_model& operator=(device_model&&) noexcept;
  ~device_model();

  /// A new, empty sequence. Errors: max_sequences already open.
  result<sequence_id> open_sequence();
  /// Frees a sequence's rings. Errors: an unknown id.
  result<bool> close_sequence(sequence_id id);
  /// Tokens processed so far by a sequence.
  result<std::int64_t> length(sequence_id id) const;

  /// As model::forward: each sequence's tokens continue from its rings (prefill, chunked
  /// prefill and decode in one batch), logits [total tokens, vocab], sequences in batch order.
  /// Errors (an unknown or repeated id, a token out of range) leave every sequence as it was; a
  /// device failure halfway leaves the batch's sequences unusable (close them).
  result<std::vector<float>> forward(std::span<const step_input> batch);

  struct state;

 private:
  explicit device_model(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

}  // namespace troupe::kernels::cuda
