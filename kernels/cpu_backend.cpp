#include "kernels/backend.hpp"

#include "kernels/kv_blocks.hpp"

namespace troupe::kernels {

namespace {

std::string unknown(sequence_id id) { return "backend: no sequence " + std::to_string(id); }

}  // namespace

sequence_id cpu_backend::open_sequence() {
  const sequence_id id = next_++;
  sequences_.emplace(id, model_.new_sequence());
  return id;
}

result<bool> cpu_backend::close_sequence(sequence_id id) {
  if (sequences_.erase(id) == 0) return result<bool>::failure(unknown(id));
  drafts_.erase(id);
  return true;
}

result<std::int64_t> cpu_backend::length(sequence_id id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<std::int64_t>::failure(unknown(id));
  return it->second.length;
}

result<std::vector<float>> cpu_backend::step(std::span<const step_input> batch) {
  std::vector<sequence_input> inputs;
  for (const auto& in : batch) {
    const auto it = sequences_.find(in.sequence);
    if (it == sequences_.end()) return result<std::vector<float>>::failure(unknown(in.sequence));
    inputs.push_back({&it->second, in.tokens});
  }
  return model_.forward(inputs);
}

result<std::vector<float>> cpu_backend::step_tail(std::span<const step_input> batch,
                                                   std::span<const std::int64_t> rows,
                                                   std::vector<float>* dspark_features) {
  std::vector<sequence_input> inputs;
  for (const auto& in : batch) {
    const auto it = sequences_.find(in.sequence);
    if (it == sequences_.end()) return result<std::vector<float>>::failure(unknown(in.sequence));
    inputs.push_back({&it->second, in.tokens});
  }
  return model_.forward_tail(inputs, rows, dspark_features);
}

result<bool> cpu_backend::rollback(sequence_id id, std::int64_t k) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<bool>::failure(unknown(id));
  return kernels::rollback(it->second, k);
}

bool cpu_backend::has_draft() const { return model_.has_draft(); }

result<draft_output> draft_contexts::draft(const model& m, std::span<const draft_request> batch) {
  std::vector<draft_input> inputs;
  for (const auto& in : batch) {
    auto [it, fresh] = states_.try_emplace(in.sequence);
    if (fresh) it->second = m.new_draft_state();
    if (it->second.length() != in.position) it->second.reset(in.position);
    if (in.anchor >= 0) {
      inputs.push_back({&it->second, in.features, in.anchor});
    } else if (auto ok = m.extend_draft(it->second, in.features); !ok) {
      return result<draft_output>::failure(ok.error());
    }
  }
  return m.draft(inputs);
}

std::string draft_contexts::export_draft(sequence_id id) const {
  const auto it = states_.find(id);
  return it == states_.end() ? std::string{} : serialize_draft(it->second);
}

result<bool> draft_contexts::import_draft(const model& m, sequence_id id, std::string_view bytes) {
  if (!m.has_draft())
    return result<bool>::failure("backend: a draft context for a model without draft layers");
  auto state = m.new_draft_state();
  if (auto ok = restore_draft(state, bytes); !ok) return ok;
  states_.insert_or_assign(id, std::move(state));
  return true;
}

result<draft_output> cpu_backend::draft(std::span<const draft_request> batch) {
  for (const auto& in : batch)
    if (sequences_.count(in.sequence) == 0)
      return result<draft_output>::failure(unknown(in.sequence));
  return drafts_.draft(model_, batch);
}

result<std::string> cpu_backend::export_draft(sequence_id id) const {
  if (sequences_.count(id) == 0) return result<std::string>::failure(unknown(id));
  return drafts_.export_draft(id);
}

result<bool> cpu_backend::import_draft(sequence_id id, std::string_view bytes) {
  if (sequences_.count(id) == 0) return result<bool>::failure(unknown(id));
  return drafts_.import_draft(model_, id, bytes);
}

result<std::string> cpu_backend::export_block(sequence_id id, std::int64_t block) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<std::string>::failure(unknown(id));
  return serialize_block(it->second, block);
}

result<bool> cpu_backend::import_block(sequence_id id, std::int64_t block,
                                       std::string_view bytes) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<bool>::failure(unknown(id));
  if (it->second.length != 0)
    return result<bool>::failure("backend: sequence " + std::to_string(id) +
                                 " already ran tokens; blocks are imported into a fresh one");
  return restore_block(it->second, block, bytes);
}

result<std::int64_t> cpu_backend::full_blocks(sequence_id id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<std::int64_t>::failure(unknown(id));
  return kernels::full_blocks(it->second);
}

result<std::string> cpu_backend::export_state(sequence_id id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<std::string>::failure(unknown(id));
  return serialize_state(it->second);
}

result<std::string> cpu_backend::export_swa(sequence_id id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<std::string>::failure(unknown(id));
  return serialize_swa(it->second);
}

result<bool> cpu_backend::import_state(sequence_id id, std::string_view bytes) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<bool>::failure(unknown(id));
  if (it->second.length != 0)
    return result<bool>::failure("backend: sequence " + std::to_string(id) +
                                 " already holds a state; it is imported into a fresh one");
  return restore_state(it->second, bytes);
}

result<bool> cpu_backend::import_swa(sequence_id id, std::string_view bytes) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<bool>::failure(unknown(id));
  return restore_swa(it->second, bytes);
}

result<std::vector<float>> cpu_backend::replay(sequence_id id,
                                               std::span<const std::int64_t> tokens) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return result<std::vector<float>>::failure(unknown(id));
  return model_.replay(it->second, tokens);
}

}  // namespace troupe::kernels
