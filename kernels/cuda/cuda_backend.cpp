// The CUDA backend over the device forward pass (kernels/cuda/cuda_backend.hpp).
#include "kernels/cuda/cuda_backend.hpp"

#include <algorithm>

#include "kernels/cuda/device.hpp"
#include "kernels/kv_blocks.hpp"

namespace troupe::kernels::cuda {

namespace {

std::string unknown(sequence_id id) { return "backend: no sequence " + std::to_string(id); }

}  // namespace

result<std::unique_ptr<cuda_backend>> cuda_backend::open(const std::filesystem::path& model_dir,
                                                         const cuda_backend_options& options) {
  using r = result<std::unique_ptr<cuda_backend>>;
  if (auto dev = query_device(options.device); !dev) return r::failure(dev.error());
  model_options mo;
  mo.threads = options.threads;
  auto m = model::load(model_dir, mo);
  if (!m) return r::failure(m.error());
  if (!options.engram_token_map.empty())
    if (auto ok = m->set_engram_token_map(options.engram_token_map); !ok)
      return r::failure(ok.error());
  return open(std::move(*m), options);
}

result<std::unique_ptr<cuda_backend>> cuda_backend::open(model m,
                                                         const cuda_backend_options& options) {
  using r = result<std::unique_ptr<cuda_backend>>;
  auto dev = query_device(options.device);
  if (!dev) return r::failure(dev.error());
  std::unique_ptr<cuda_backend> b(new cuda_backend(std::move(m), options.max_sequences));
  auto device = device_model::upload(
      b->model_, {.max_sequences = options.max_sequences,
                  .max_context = options.max_context,
                  .page_tokens = options.page_tokens,
                  .kv_tokens = options.kv_tokens,
                  .memory_fraction = options.memory_fraction,
                  .work_bytes = options.work_bytes,
                  .batch_invariant = options.batch_invariant});
  if (!device) return r::failure(dev->name + ": " + device.error());
  b->device_ = std::make_unique<device_model>(std::move(*device));
  b->hold_ = options.hold;
  return b;
}

backend_opener cuda_backend::opener(cuda_backend_options options) {
  return [options](model m) -> result<std::unique_ptr<model_backend>> {
    auto b = open(std::move(m), options);
    if (!b) return result<std::unique_ptr<model_backend>>::failure(b.error());
    return std::unique_ptr<model_backend>(std::move(*b));
  };
}

result<sequence_id> cuda_backend::resident(sequence_id id,
                                           const std::vector<sequence_id>& in_use) {
  changed(id);  // it is about to run
  if (const auto it = on_device_.find(id); it != on_device_.end()) {
    it->second.used = tick_;
    return it->second.id;
  }
  const auto host = on_host_.find(id);
  if (host == on_host_.end()) return result<sequence_id>::failure(unknown(id));
  if (auto room = make_room(true, device_->pages_for(host->second.length), in_use); !room)
    return result<sequence_id>::failure(room.error());
  auto dev = device_->import_sequence(host->second);
  if (!dev) return dev;
  if (const auto d = host_drafts_.find(id); d != host_drafts_.end()) {
    if (auto ok = device_->import_draft(*dev, d->second); !ok) {
      (void)device_->close_sequence(*dev);
      return result<sequence_id>::failure(ok.error());
    }
    host_drafts_.erase(d);
  }
  on_host_.erase(host);
  on_device_[id] = {*dev, tick_};
  return *dev;
}

result<bool> cuda_backend::make_room(bool sequence, std::int64_t pages,
                                     const std::vector<sequence_id>& in_use) {
  auto full = [&] {
    return (sequence && static_cast<std::int64_t>(on_device_.size()) >= max_resident_) ||
           device_->free_pages() < pages;
  };
  while (full()) {
    auto oldest = on_device_.end();
    for (auto it = on_device_.begin(); it != on_device_.end(); ++it)
      if (std::find(in_use.begin(), in_use.end(), it->first) == in_use.end() &&
          (oldest == on_device_.end() || it->second.used < oldest->second.used))
        oldest = it;
    if (oldest == on_device_.end()) {
      if (sequence && static_cast<std::int64_t>(on_device_.size()) >= max_resident_)
        return result<bool>::failure(
            "cuda backend: a batch of " + std::to_string(in_use.size()) +
            " sequences, but the device holds " + std::to_string(max_resident_) +
            " at once (max_sequences)");
      return result<bool>::failure(
          "cuda backend: a batch of " + std::to_string(in_use.size()) + " sequences needs " +
          std::to_string(pages) + " more KV pages, and " + std::to_string(device_->free_pages()) +
          " are free with every other sequence on the host (kv_tokens)");
    }
    if (auto moved = on_host(oldest->first); !moved) return result<bool>::failure(moved.error());
    ++evictions_;
  }
  return true;
}

result<sequence_cache*> cuda_backend::on_host(sequence_id id) {
  changed(id);
  if (const auto it = on_device_.find(id); it != on_device_.end()) {
    auto cache = device_->export_sequence(it->second.id);
    if (!cache) return result<sequence_cache*>::failure(cache.error());
    auto draft = device_->export_draft(it->second.id);
    if (!draft) return result<sequence_cache*>::failure(draft.error());
    if (*draft) host_drafts_.insert_or_assign(id, std::move(**draft));
    (void)device_->close_sequence(it->second.id);
    on_device_.erase(it);
    on_host_[id] = std::move(*cache);
  }
  const auto it = on_host_.find(id);
  if (it == on_host_.end()) return result<sequence_cache*>::failure(unknown(id));
  return &it->second;
}

result<const sequence_cache*> cuda_backend::snapshot(sequence_id id) const {
  using r = result<const sequence_cache*>;
  if (const auto it = on_device_.find(id); it != on_device_.end()) {
    if (!downloaded_ || downloaded_->first != id) {
      auto cache = device_->export_sequence(it->second.id);
      if (!cache) return r::failure(cache.error());
      downloaded_.emplace(id, std::move(*cache));
    }
    return &downloaded_->second;
  }
  const auto it = on_host_.find(id);
  if (it == on_host_.end()) return r::failure(unknown(id));
  return &it->second;
}

void cuda_backend::changed(sequence_id id) {
  if (downloaded_ && downloaded_->first == id) downloaded_.reset();
}

// A new sequence starts on the host: it reaches the device with its first step, so a sequence
// that only imports KV and replays never holds device memory until it runs.
sequence_id cuda_backend::open_sequence() {
  const sequence_id id = next_++;
  on_host_.emplace(id, model_.new_sequence());
  return id;
}

result<bool> cuda_backend::close_sequence(sequence_id id) {
  host_drafts_.erase(id);
  changed(id);
  if (const auto it = on_device_.find(id); it != on_device_.end()) {
    auto ok = device_->close_sequence(it->second.id);
    on_device_.erase(it);
    return ok;
  }
  if (on_host_.erase(id) == 0) return result<bool>::failure(unknown(id));
  return true;
}

result<std::int64_t> cuda_backend::length(sequence_id id) const {
  if (const auto it = on_device_.find(id); it != on_device_.end())
    return device_->length(it->second.id);
  const auto it = on_host_.find(id);
  if (it == on_host_.end()) return result<std::int64_t>::failure(unknown(id));
  return it->second.length;
}

result<std::vector<float>> cuda_backend::step(std::span<const step_input> batch) {
  return run(batch, nullptr);
}

result<std::vector<float>> cuda_backend::run(std::span<const step_input> batch,
                                             std::vector<float>* dspark_features) {
  std::vector<step_input> inputs;
  std::vector<sequence_id> in_use;
  for (const auto& in : batch) in_use.push_back(in.sequence);
  ++tick_;
  for (const auto& in : batch) {
    auto dev = resident(in.sequence, in_use);
    if (!dev) return result<std::vector<float>>::failure(dev.error());
    inputs.push_back({*dev, in.tokens});
  }
  // The pages the batch's tokens take.
  std::int64_t pages = 0;
  for (const auto& in : inputs) {
    auto length = device_->length(in.sequence);
    if (!length) return result<std::vector<float>>::failure(length.error());
    auto more = device_->pages_to_grow(in.sequence,
                                       *length + static_cast<std::int64_t>(in.tokens.size()));
    if (!more) return result<std::vector<float>>::failure(more.error());
    pages += *more;
  }
  if (auto room = make_room(false, pages, in_use); !room)
    return result<std::vector<float>>::failure(room.error());
  return device_->forward(inputs, dspark_features);
}

result<std::vector<float>> cuda_backend::step_tail(std::span<const step_input> batch,
                                                   std::span<const std::int64_t> rows,
                                                   std::vector<float>* dspark_features) {
  using r = result<std::vector<float>>;
  if (rows.size() != batch.size())
    return r::failure("backend: " + std::to_string(rows.size()) + " row counts for " +
                      std::to_string(batch.size()) + " sequences");
  for (std::size_t b = 0; b < batch.size(); ++b)
    if (rows[b] < 1 || rows[b] > static_cast<std::int64_t>(batch[b].tokens.size()))
      return r::failure("backend: " + std::to_string(rows[b]) + " rows of a sequence's " +
                        std::to_string(batch[b].tokens.size()) + " tokens");
  auto all = run(batch, dspark_features);
  if (!all) return all;
  const auto V = static_cast<std::size_t>(model_.text().vocab_size);
  std::vector<float> out;
  std::size_t end = 0;
  for (std::size_t b = 0; b < batch.size(); ++b) {
    end += batch[b].tokens.size();
    out.insert(out.end(), all->begin() + static_cast<std::ptrdiff_t>((end - rows[b]) * V),
               all->begin() + static_cast<std::ptrdiff_t>(end * V));
  }
  return out;
}

result<bool> cuda_backend::rollback(sequence_id id, std::int64_t k) {
  changed(id);
  if (const auto it = on_device_.find(id); it != on_device_.end())
    return device_->rollback(it->second.id, k);
  const auto it = on_host_.find(id);
  if (it == on_host_.end()) return result<bool>::failure(unknown(id));
  return kernels::rollback(it->second, k);
}

bool cuda_backend::has_draft() const { return model_.has_draft(); }

bool cuda_backend::holds(sequence_id id) const {
  return on_device_.count(id) != 0 || on_host_.count(id) != 0;
}

// The draft layers run on the device, so the batch's sequences are brought there first.
result<draft_output> cuda_backend::draft(std::span<const draft_request> batch) {
  std::vector<sequence_id> in_use;
  for (const auto& in : batch) {
    if (!holds(in.sequence)) return result<draft_output>::failure(unknown(in.sequence));
    in_use.push_back(in.sequence);
  }
  std::vector<draft_request> inputs;
  for (const auto& in : batch) {
    auto dev = resident(in.sequence, in_use);
    if (!dev) return result<draft_output>::failure(dev.error());
    inputs.push_back({*dev, in.position, in.features, in.anchor});
  }
  return device_->draft(inputs);
}

result<std::string> cuda_backend::export_draft(sequence_id id) const {
  if (const auto it = on_device_.find(id); it != on_device_.end()) {
    auto draft = device_->export_draft(it->second.id);
    if (!draft) return result<std::string>::failure(draft.error());
    return *draft ? serialize_draft(**draft) : std::string{};
  }
  if (!holds(id)) return result<std::string>::failure(unknown(id));
  const auto it = host_drafts_.find(id);
  return it == host_drafts_.end() ? std::string{} : serialize_draft(it->second);
}

result<bool> cuda_backend::import_draft(sequence_id id, std::string_view bytes) {
  if (!holds(id)) return result<bool>::failure(unknown(id));
  if (!model_.has_draft())
    return result<bool>::failure("backend: a draft context for a model without draft layers");
  auto state = model_.new_draft_state();
  if (auto ok = restore_draft(state, bytes); !ok) return ok;
  if (const auto it = on_device_.find(id); it != on_device_.end())
    return device_->import_draft(it->second.id, state);
  host_drafts_.insert_or_assign(id, std::move(state));
  return true;
}

// A block the decode filled reads its rows alone from the device. An export from block 0 of a
// sequence with more blocks is a hand-off (its State and SWA KV follow): the whole cache is
// downloaded once for all of them, as it is kept for the exports after.
result<std::string> cuda_backend::export_block(sequence_id id, std::int64_t block) const {
  if (const auto it = on_device_.find(id); it != on_device_.end()) {
    const bool kept = downloaded_ && downloaded_->first == id;
    auto full = device_->full_blocks(it->second.id);
    if (!full) return result<std::string>::failure(full.error());
    if (!kept && (block != 0 || *full <= 1)) return device_->export_block(it->second.id, block);
  }
  auto cache = snapshot(id);
  if (!cache) return result<std::string>::failure(cache.error());
  return serialize_block(**cache, block);
}

result<bool> cuda_backend::import_block(sequence_id id, std::int64_t block,
                                        std::string_view bytes) {
  auto cache = on_host(id);
  if (!cache) return result<bool>::failure(cache.error());
  if ((*cache)->length != 0)
    return result<bool>::failure("backend: sequence " + std::to_string(id) +
                                 " already ran tokens; blocks are imported into a fresh one");
  return restore_block(**cache, block, bytes);
}

result<std::int64_t> cuda_backend::full_blocks(sequence_id id) const {
  if (const auto it = on_device_.find(id); it != on_device_.end())
    return device_->full_blocks(it->second.id);
  auto cache = snapshot(id);
  if (!cache) return result<std::int64_t>::failure(cache.error());
  return kernels::full_blocks(**cache);
}

result<std::string> cuda_backend::export_state(sequence_id id) const {
  auto cache = snapshot(id);
  if (!cache) return result<std::string>::failure(cache.error());
  return serialize_state(**cache);
}

result<std::string> cuda_backend::export_swa(sequence_id id) const {
  auto cache = snapshot(id);
  if (!cache) return result<std::string>::failure(cache.error());
  return serialize_swa(**cache);
}

result<bool> cuda_backend::import_state(sequence_id id, std::string_view bytes) {
  auto cache = on_host(id);
  if (!cache) return result<bool>::failure(cache.error());
  if ((*cache)->length != 0)
    return result<bool>::failure("backend: sequence " + std::to_string(id) +
                                 " already holds a state; it is imported into a fresh one");
  return restore_state(**cache, bytes);
}

result<bool> cuda_backend::import_swa(sequence_id id, std::string_view bytes) {
  auto cache = on_host(id);
  if (!cache) return result<bool>::failure(cache.error());
  return restore_swa(**cache, bytes);
}

result<std::vector<float>> cuda_backend::replay(sequence_id id,
                                                std::span<const std::int64_t> tokens) {
  auto cache = on_host(id);
  if (!cache) return result<std::vector<float>>::failure(cache.error());
  return model_.replay(**cache, tokens);
}

}  // namespace troupe::kernels::cuda
