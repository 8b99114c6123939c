// `cuda_backend`: the model_backend (kernels/backend.hpp) of a CUDA GPU rank, over the device
// forward pass (device_model.hpp).
//
// A sequence lives on the device while it runs, or on the host while it is assembled from
// imported KV or while it waits for room (beyond max_sequences, the sequence that ran least
// recently is downloaded to the host until its next step). import_block / import_state /
// import_swa restore into the CPU engine's cache (kernels/kv_blocks.hpp), replay runs the CPU
// engine's bounded replay there, and the next step uploads it (device_model::import_sequence).
// export_state / export_swa and a hand-off's export_block of a sequence on the device download
// its cache first (export_sequence); a block a decode filled is read alone
// (device_model::export_block), and full_blocks counts on the device. The bytes are the CPU
// backend's, so KV moves between GPU and CPU instances. Speculative decoding: a rejected draft rolls back on the device
// (device_model::rollback), step_tail's DSpark features come from the device, and the DSpark
// draft layers run there too (device_model::draft), each sequence's draft context beside its
// cache, moving to the host and back with it. The weights are the CPU engine's fp32 copies (device_model.hpp), so it serves
// models that fit the GPU at 4 bytes per parameter; the CPU model it loads stays in host memory
// beside it (the Engram tables, replay). The device port runs it as it runs the CPU backend
// (ports/cpu_device.hpp, cpu_device_params::backend). Never run on a GPU yet: tests/cuda_host
// runs it on the emulated device, bench/gpu_check.sh on a GPU.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "kernels/backend.hpp"
#include "kernels/cuda/device_model.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels::cuda {

struct cuda_backend_options {
  int device = 0;
  /// The device model's sequences, their longest context and its pool of compressed-KV pages
  /// (device_model_options: kv_tokens 0 sizes the pool from the device's memory, within
  /// memory_fraction of it less work_bytes). More sequences may be open: beyond max_sequences,
  /// or when a step needs more pages than are free, the one that ran least recently waits in
  /// host memory (its cache downloaded) until its next step uploads it again.
  std::int64_t max_sequences = 64;
  std::int64_t max_context = 4096;
  std::int64_t page_tokens = 256;
  std::int64_t kv_tokens = 0;
  double memory_fraction = 0.9;
  std::int64_t work_bytes = std::int64_t{1} << 30;
  /// The CPU engine's threads (imports, bounded replay).
  int threads = 2;
  /// Engram's token map (model::set_engram_token_map) for a model with Engram layers; empty:
  /// none (such a model then refuses to step).
  std::vector<std::int64_t> engram_token_map;
  /// Batch-invariant projections (device_model_options::batch_invariant).
  bool batch_invariant = false;
  /// Kept as long as the backend lives: e.g. the lease of its GPU (cluster/device_leases.hpp).
  std::shared_ptr<const void> hold;
};

class cuda_backend final : public model_backend {
 public:
  /// Selects the device, loads the model on the CPU and copies its weights to the device.
  /// Errors: "no CUDA device: ..." without a usable GPU, the model's load error, a failed
  /// allocation (the fp32 weights do not fit).
  static result<std::unique_ptr<cuda_backend>> open(const std::filesystem::path& model_dir,
                                                     const cuda_backend_options& options = {});
  /// As above, on a model already loaded (its Engram token map set, when it has Engram
  /// layers; options.threads and options.engram_token_map are then unused).
  static result<std::unique_ptr<cuda_backend>> open(model m,
                                                     const cuda_backend_options& options = {});

  /// open(model, options) as a device port's backend_opener (ports/cpu_device.hpp).
  static backend_opener opener(cuda_backend_options options);

  /// The device's page pool: context tokens it holds (all sequences together), and device
  /// bytes per page.
  std::int64_t kv_tokens() const { return device_->kv_tokens(); }
  std::int64_t page_bytes() const { return device_->page_bytes(); }
  /// Sequences moved to host memory to make room on the device, so far.
  std::uint64_t evictions() const override { return evictions_; }

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
  std::vector<std::uint64_t> expert_counts() const override { return device_->expert_counts(); }
  result<bool> set_expert_placement(std::optional<expert_placement> placement) override {
    return device_->set_expert_placement(std::move(placement));
  }

 private:
  cuda_backend(model m, std::int64_t max_resident)
      : model_(std::move(m)), max_resident_(max_resident) {}
  // The sequence on the device (uploading it and its draft context from the host first, after
  // making room); its device id.
  result<sequence_id> resident(sequence_id id, const std::vector<sequence_id>& in_use);
  // Moves the sequences that ran least recently, outside `in_use` (the batch), to the host
  // until the device has room for one more sequence (when `sequence`) and `pages` free pages.
  // Errors: the batch does not fit with every other sequence on the host.
  result<bool> make_room(bool sequence, std::int64_t pages, const std::vector<sequence_id>& in_use);
  // The sequence's cache on the host (downloading it and its draft context from the device,
  // which lets it go).
  result<sequence_cache*> on_host(sequence_id id);
  // The sequence's cache, wherever it lives: a sequence on the device is downloaded once for
  // the exports that follow one another (its blocks, State and SWA KV) until it changes.
  result<const sequence_cache*> snapshot(sequence_id id) const;
  // Forgets the download of a sequence that is about to change or move.
  void changed(sequence_id id);
  // Whether the sequence is open (on the device or the host).
  bool holds(sequence_id id) const;
  // step / step_tail: the whole batch's logits, and its DSpark features when asked.
  result<std::vector<float>> run(std::span<const step_input> batch,
                                 std::vector<float>* dspark_features);

  model model_;
  std::unique_ptr<device_model> device_;
  std::shared_ptr<const void> hold_;
  std::int64_t max_resident_;
  sequence_id next_ = 1;
  std::uint64_t tick_ = 0;  // steps run: a resident sequence's `used` is its last one's
  std::uint64_t evictions_ = 0;
  struct resident_sequence {
    sequence_id id;  // the device_model's
    std::uint64_t used;
  };
  std::map<sequence_id, resident_sequence> on_device_;  // backend id → device_model's
  std::map<sequence_id, sequence_cache> on_host_;   // sequences assembled on the host
  std::map<sequence_id, draft_state> host_drafts_;  // draft contexts of sequences on the host
  mutable std::optional<std::pair<sequence_id, sequence_cache>> downloaded_;  // snapshot()'s
};

}  // namespace troupe::kernels::cuda
