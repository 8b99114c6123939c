#include "kernels/ep_group_backend.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ep_exchange.hpp"
#include "kernels/model_weights.hpp"
#include "kernels/worker_pool.hpp"

namespace troupe::kernels {
namespace {

class ep_group_backend final : public model_backend {
 public:
  ep_group_backend(std::vector<std::unique_ptr<cpu_backend>> ranks,
                   std::shared_ptr<ep_exchange> exchange)
      : ranks_(std::move(ranks)),
        exchange_(std::move(exchange)),
        threads_(static_cast<int>(ranks_.size())) {}

  sequence_id open_sequence() override {
    // Every rank counts its ids from 1 and opens the same sequences: the same id.
    sequence_id id = 0;
    for (auto& r : ranks_) id = r->open_sequence();
    return id;
  }
  result<bool> close_sequence(sequence_id id) override {
    return on_all([&](cpu_backend& b) { return b.close_sequence(id); });
  }
  result<std::int64_t> length(sequence_id id) const override { return ranks_[0]->length(id); }
  result<std::vector<float>> step(std::span<const step_input> batch) override {
    return on_all([&](cpu_backend& b) { return b.step(batch); });
  }
  result<std::vector<float>> step_tail(std::span<const step_input> batch,
                                       std::span<const std::int64_t> rows,
                                       std::vector<float>* dspark_features) override {
    return on_all([&](cpu_backend& b) {
      return b.step_tail(batch, rows, &b == ranks_[0].get() ? dspark_features : nullptr);
    });
  }
  result<bool> rollback(sequence_id id, std::int64_t k) override {
    return on_all([&](cpu_backend& b) { return b.rollback(id, k); });
  }
  bool has_draft() const override { return ranks_[0]->has_draft(); }
  result<draft_output> draft(std::span<const draft_request> batch) override {
    if (!failed_.empty()) return result<draft_output>::failure(failed_);
    return ranks_[0]->draft(batch);
  }
  result<std::string> export_draft(sequence_id id) const override {
    return ranks_[0]->export_draft(id);
  }
  result<bool> import_draft(sequence_id id, std::string_view bytes) override {
    if (!failed_.empty()) return result<bool>::failure(failed_);
    return ranks_[0]->import_draft(id, bytes);
  }
  result<std::string> export_block(sequence_id id, std::int64_t block) const override {
    return ranks_[0]->export_block(id, block);
  }
  result<bool> import_block(sequence_id id, std::int64_t block, std::string_view bytes) override {
    return on_all([&](cpu_backend& b) { return b.import_block(id, block, bytes); });
  }
  result<std::int64_t> full_blocks(sequence_id id) const override {
    return ranks_[0]->full_blocks(id);
  }
  result<std::string> export_state(sequence_id id) const override {
    return ranks_[0]->export_state(id);
  }
  result<std::string> export_swa(sequence_id id) const override {
    return ranks_[0]->export_swa(id);
  }
  result<bool> import_state(sequence_id id, std::string_view bytes) override {
    return on_all([&](cpu_backend& b) { return b.import_state(id, bytes); });
  }
  result<bool> import_swa(sequence_id id, std::string_view bytes) override {
    return on_all([&](cpu_backend& b) { return b.import_swa(id, bytes); });
  }
  result<std::vector<float>> replay(sequence_id id, std::span<const std::int64_t> tokens) override {
    return on_all([&](cpu_backend& b) { return b.replay(id, tokens); });
  }
  std::string broken() const override { return failed_; }
  std::vector<std::uint64_t> expert_counts() const override {
    return ranks_[0]->expert_counts();  // every rank routes every token
  }
  result<bool> set_expert_placement(std::optional<expert_placement>) override {
    return result<bool>::failure(
      "expert placement: an EP group of " + std::to_string(ranks_.size())
      + " ranks keeps the placement it was formed with (re-form it to place experts anew)");
  }

 private:
  // Runs fn on every rank at once, a thread each. A rank that fails aborts the exchange, so
  // the ranks waiting in it return. When every rank failed with the same error outside the
  // exchange (an input every rank refused before changing anything) the call fails and the
  // group goes on; any other failure fails the group for good.
  template <class F>
  auto on_all(F&& fn) -> decltype(fn(std::declval<cpu_backend&>())) {
    using R = decltype(fn(std::declval<cpu_backend&>()));
    if (!failed_.empty()) return R::failure(failed_);
    const auto n = ranks_.size();
    std::vector<std::optional<R>> out(n);
    threads_.run(static_cast<int>(n), [&](int r) {
      const auto i = static_cast<std::size_t>(r);
      out[i].emplace(fn(*ranks_[i]));
      if (!*out[i]) exchange_->abort("rank " + std::to_string(r) + ": " + out[i]->error());
    });
    std::size_t failures = 0;
    for (const auto& o : out) failures += o->ok() ? 0 : 1;
    if (failures == 0) return std::move(*out[0]);
    const auto& first = *out[0];
    bool same = failures == n;
    for (const auto& o : out)
      same = same && o->error() == first.error() && !is_abort(o->error());
    if (same) {
      exchange_->reset();
      return R::failure(first.error());
    }
    for (std::size_t i = 0; i < n; ++i)
      if (!*out[i] && !is_abort(out[i]->error())) {
        failed_ = "the EP group failed: rank " + std::to_string(i) + ": " + out[i]->error();
        break;
      }
    if (failed_.empty()) failed_ = "the EP group failed: " + first.error();
    return R::failure(failed_);
  }

  static bool is_abort(const std::string& e) {
    return e.find("EP group aborted") != std::string::npos;
  }

  std::vector<std::unique_ptr<cpu_backend>> ranks_;
  std::shared_ptr<ep_exchange> exchange_;
  worker_pool threads_;
  std::string failed_;
};

}  // namespace

result<std::unique_ptr<model_backend>> open_ep_group(
  const std::filesystem::path& dir, model_options options, const expert_placement& placement,
  const std::function<result<bool>(model&)>& prepare, std::shared_ptr<ep_exchange> exchange) {
  using r = result<std::unique_ptr<model_backend>>;
  if (placement.ranks < 1) return r::failure("EP group: a placement of no ranks");
  if (!exchange) exchange = local_exchange(placement.ranks);
  // One copy of each tensor for the whole group: the dense weights, and each expert once.
  if (!options.tensors) options.tensors = std::make_shared<tensor_cache>();
  std::vector<std::unique_ptr<cpu_backend>> ranks;
  for (std::int32_t rank = 0; rank < placement.ranks; ++rank) {
    options.ep = ep_member{rank, placement, exchange};
    auto m = model::load(dir, options);
    if (!m) return r::failure("EP group rank " + std::to_string(rank) + ": " + m.error());
    if (prepare)
      if (auto ok = prepare(*m); !ok)
        return r::failure("EP group rank " + std::to_string(rank) + ": " + ok.error());
    ranks.push_back(std::make_unique<cpu_backend>(std::move(*m)));
  }
  return std::unique_ptr<model_backend>(
    std::make_unique<ep_group_backend>(std::move(ranks), std::move(exchange)));
}

}  // namespace troupe::kernels
