#include "kernels/ep_group_backend.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ep_exchange.hpp"
#include "kernels/ep_wire.hpp"
#include "kernels/model_weights.hpp"
#include "kernels/worker_pool.hpp"

namespace troupe::kernels {
namespace {

class ep_group_backend final : public model_backend {
 public:
  using op = wire::call::op;

  // `ranks`: this process's rank models, rank `ids[i]` each (rank 0 first); `peers`: the
  // processes holding the group's other ranks.
  ep_group_backend(std::vector<std::unique_ptr<cpu_backend>> ranks, std::vector<std::int32_t> ids,
                   std::vector<std::shared_ptr<wire::link>> peers,
                   std::shared_ptr<ep_exchange> exchange)
      : ranks_(std::move(ranks)),
        ids_(std::move(ids)),
        peers_(std::move(peers)),
        exchange_(std::move(exchange)),
        threads_(static_cast<int>(ranks_.size())) {}

  sequence_id open_sequence() override {
    // Every rank counts its ids from 1 and opens the same sequences: the same id.
    auto id = on_all([] { return wire::call::of(op::open); },
                     [](cpu_backend& b) { return result<sequence_id>(b.open_sequence()); });
    return id ? *id : ranks_[0]->open_sequence();  // a failed group fails its later calls
  }
  result<bool> close_sequence(sequence_id id) override {
    return on_all([&] { return wire::call::of(op::close, id); },
                  [&](cpu_backend& b) { return b.close_sequence(id); });
  }
  result<std::int64_t> length(sequence_id id) const override { return ranks_[0]->length(id); }
  result<std::vector<float>> step(std::span<const step_input> batch) override {
    return on_all([&] { return wire::call::of_batch(op::step, batch); },
                  [&](cpu_backend& b) { return b.step(batch); });
  }
  result<std::vector<float>> step_tail(std::span<const step_input> batch,
                                       std::span<const std::int64_t> rows,
                                       std::vector<float>* dspark_features) override {
    return on_all([&] { return wire::call::of_batch(op::step_tail, batch, rows); },
                  [&](cpu_backend& b) {
      return b.step_tail(batch, rows, &b == ranks_[0].get() ? dspark_features : nullptr);
    });
  }
  result<bool> rollback(sequence_id id, std::int64_t k) override {
    return on_all([&] { return wire::call::of(op::rollback, id, k); },
                  [&](cpu_backend& b) { return b.rollback(id, k); });
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
    return on_all([&] { return wire::call::of(op::import_block, id, block, bytes); },
                  [&](cpu_backend& b) { return b.import_block(id, block, bytes); });
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
    return on_all([&] { return wire::call::of(op::import_state, id, bytes); },
                  [&](cpu_backend& b) { return b.import_state(id, bytes); });
  }
  result<bool> import_swa(sequence_id id, std::string_view bytes) override {
    return on_all([&] { return wire::call::of(op::import_swa, id, bytes); },
                  [&](cpu_backend& b) { return b.import_swa(id, bytes); });
  }
  result<std::vector<float>> replay(sequence_id id, std::span<const std::int64_t> tokens) override {
    return on_all([&] { return wire::call::of_tokens(op::replay, id, tokens); },
                  [&](cpu_backend& b) { return b.replay(id, tokens); });
  }
  std::string broken() const override { return failed_; }
  std::vector<std::uint64_t> expert_counts() const override {
    return ranks_[0]->expert_counts();  // every rank routes every token
  }
  result<bool> set_expert_placement(std::optional<expert_placement>) override {
    return result<bool>::failure(
      "expert placement: an EP group of " + std::to_string(exchange_->ranks())
      + " ranks keeps the placement it was formed with (re-form it to place experts anew)");
  }

 private:
  // Runs the call on every rank at once: `call()` sent to the peer processes (made only when
  // there are some), `fn` on this process's
  // ranks, a thread each. A rank that fails aborts the exchange, so the ranks waiting in it
  // return. When every rank failed with the same error outside the exchange (an input every
  // rank refused before changing anything) the call fails and the group goes on; any other
  // failure (a peer process gone included) fails the group for good. Answers are rank 0's.
  template <class C, class F>
  auto on_all(C&& call, F&& fn) -> decltype(fn(std::declval<cpu_backend&>())) {
    using R = decltype(fn(std::declval<cpu_backend&>()));
    if (!failed_.empty()) return R::failure(failed_);
    if (!peers_.empty()) {
      const auto bytes = wire::encode(call());
      for (auto& p : peers_) (void) wire::send(*p, wire::frame::call, bytes);  // a gone peer's
    }                                                                          // outcome says so
    std::vector<std::string> errors(static_cast<std::size_t>(exchange_->ranks()));
    std::optional<R> answer;
    threads_.run(static_cast<int>(ranks_.size()), [&](int i) {
      const auto at = static_cast<std::size_t>(i);
      auto out = fn(*ranks_[at]);
      if (!out) {
        errors[static_cast<std::size_t>(ids_[at])] = out.error();
        exchange_->abort("rank " + std::to_string(ids_[at]) + ": " + out.error());
      }
      if (i == 0) answer.emplace(std::move(out));
    });
    for (auto& p : peers_) {
      auto out = wire::await_outcome(*p);
      for (std::size_t j = 0; j < p->ranks.size(); ++j)
        errors[static_cast<std::size_t>(p->ranks[j])] = out ? (*out)[j] : out.error();
    }
    std::size_t failures = 0;
    for (const auto& e : errors) failures += e.empty() ? 0 : 1;
    if (failures == 0) return std::move(*answer);
    bool same = failures == errors.size();
    for (const auto& e : errors) same = same && e == errors[0] && !is_abort(e);
    if (same) {
      exchange_->reset();
      return R::failure(errors[0]);
    }
    for (std::size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty() && !is_abort(errors[r])) {
        failed_ = "the EP group failed: rank " + std::to_string(r) + ": " + errors[r];
        break;
      }
    if (failed_.empty()) failed_ = "the EP group failed: " + (errors[0].empty() ? errors.back() : errors[0]);
    return R::failure(failed_);
  }

  static bool is_abort(const std::string& e) {
    return e.find("EP group aborted") != std::string::npos;
  }

  std::vector<std::unique_ptr<cpu_backend>> ranks_;
  std::vector<std::int32_t> ids_;
  std::vector<std::shared_ptr<wire::link>> peers_;
  std::shared_ptr<ep_exchange> exchange_;
  worker_pool threads_;
  std::string failed_;
};

}  // namespace

result<std::unique_ptr<model_backend>> open_ep_group(
  const std::filesystem::path& dir, model_options options, const expert_placement& placement,
  const std::function<result<bool>(model&)>& prepare, std::shared_ptr<ep_exchange> exchange,
  std::vector<ep_peer> peers) {
  using r = result<std::unique_ptr<model_backend>>;
  if (placement.ranks < 1) return r::failure("EP group: a placement of no ranks");
  // The peers' sockets are the group's from here on (closed with it, or on an error).
  std::vector<std::shared_ptr<wire::link>> links;
  for (auto& p : peers)
    links.push_back(std::make_shared<wire::link>(p.fd, std::move(p.ranks), p.answer_within));
  std::vector<bool> held(static_cast<std::size_t>(placement.ranks), false);
  for (const auto& l : links)
    for (auto rank : l->ranks) {
      if (rank < 1 || rank >= placement.ranks || held[static_cast<std::size_t>(rank)])
        return r::failure("EP group: a peer process's ranks must be distinct, above 0 and below "
                          + std::to_string(placement.ranks));
      held[static_cast<std::size_t>(rank)] = true;
    }
  std::vector<std::int32_t> local;
  for (std::int32_t rank = 0; rank < placement.ranks; ++rank)
    if (!held[static_cast<std::size_t>(rank)]) local.push_back(rank);
  if (!links.empty()) {
    if (exchange) return r::failure("EP group: peer processes meet in the group's own exchange");
    exchange = wire::process_exchange(placement.ranks, local, links, true);
  }
  if (!exchange) exchange = local_exchange(placement.ranks);
  auto ranks = wire::load_ranks(dir, std::move(options), placement, local, exchange, prepare);
  if (!ranks) return r::failure(ranks.error());
  for (auto& l : links)  // each peer loaded its ranks meanwhile
    if (auto ok = wire::await_ready(*l); !ok) return r::failure(ok.error());
  return std::unique_ptr<model_backend>(std::make_unique<ep_group_backend>(
    std::move(*ranks), std::move(local), std::move(links), std::move(exchange)));
}

}  // namespace troupe::kernels
