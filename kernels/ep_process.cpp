#include "kernels/ep_process.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <optional>

#include "kernels/byte_io.hpp"
#include "kernels/ep_wire.hpp"
#include "kernels/model_weights.hpp"
#include "kernels/worker_pool.hpp"

namespace troupe::kernels {
namespace wire {
namespace {

struct header {
  std::uint32_t kind;
  std::uint32_t reserved;
  std::uint64_t length;
};
static_assert(sizeof(header) == 16);

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const auto w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const auto r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

class writer : public byte_writer {
 public:
  template <class T>
  void put_span(std::span<const T> v) {
    put<std::uint64_t>(v.size());
    put_bytes(v.data(), v.size_bytes());
  }
};

class reader : public byte_reader {
 public:
  using byte_reader::byte_reader;
  template <class T>
  bool get_vector(std::vector<T>& v) {
    std::uint64_t n = 0;
    if (!get(n) || n > left() / sizeof(T)) return false;
    v.resize(n);
    return get_bytes(v.data(), n * sizeof(T));
  }
  bool get_string(std::string& s) {
    std::uint64_t n = 0;
    if (!get(n) || n > left()) return false;
    s.resize(n);
    return get_bytes(s.data(), n);
  }
};

}  // namespace

link::~link() {
  if (fd >= 0) ::close(fd);
}

std::string link::name() const {
  std::string s = "the process of rank" + std::string(ranks.size() == 1 ? " " : "s ");
  for (std::size_t i = 0; i < ranks.size(); ++i)
    s += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return s;
}

const std::string& link::lose(const std::string& why) {
  std::lock_guard lock(writing);
  if (!dead) {
    gone = why;
    dead = true;
  }
  return gone;
}

result<bool> send(link& l, frame kind, std::string_view payload) {
  const header h{static_cast<std::uint32_t>(kind), 0, payload.size()};
  {
    std::lock_guard lock(l.writing);
    if (l.dead) return result<bool>::failure(l.gone);
    if (write_all(l.fd, reinterpret_cast<const char*>(&h), sizeof h)
        && write_all(l.fd, payload.data(), payload.size()))
      return true;
  }
  return result<bool>::failure(l.lose(l.name() + " is gone (its socket closed)"));
}

result<std::pair<frame, std::string>> receive(link& l, bool within_call) {
  using r = result<std::pair<frame, std::string>>;
  if (l.dead) return r::failure(l.gone);
  if (within_call && l.answer_within.count() >= 0) {
    pollfd p{l.fd, POLLIN, 0};
    int ready = 0;
    do {
      ready = ::poll(&p, 1, static_cast<int>(l.answer_within.count()));
    } while (ready < 0 && errno == EINTR);
    if (ready == 0)
      return r::failure(l.lose(l.name() + " did not answer within "
                               + std::to_string(l.answer_within.count()) + " ms"));
  }
  header h{};
  if (read_all(l.fd, reinterpret_cast<char*>(&h), sizeof h)) {
    std::string payload(h.length, '\0');
    if (read_all(l.fd, payload.data(), payload.size()))
      return std::pair{static_cast<frame>(h.kind), std::move(payload)};
  }
  return r::failure(l.lose(l.name() + " is gone (its socket closed)"));
}

call call::of_batch(op what, std::span<const step_input> in, std::span<const std::int64_t> rows) {
  call c;
  c.what = what;
  for (const auto& s : in) c.batch.emplace_back(s.sequence, std::vector(s.tokens.begin(), s.tokens.end()));
  c.rows.assign(rows.begin(), rows.end());
  return c;
}

std::string encode(const call& c) {
  writer w;
  w.put(c.what);
  w.put(c.id);
  w.put(c.k);
  w.put<std::uint64_t>(c.batch.size());
  for (const auto& [seq, tokens] : c.batch) {
    w.put(seq);
    w.put_span(std::span<const std::int64_t>(tokens));
  }
  w.put_span(std::span<const std::int64_t>(c.rows));
  w.put_span(std::span<const char>(c.bytes));
  return w.take();
}

result<call> decode(std::string_view bytes) {
  reader rd(bytes);
  call c;
  std::uint64_t n = 0;
  bool ok = rd.get(c.what) && rd.get(c.id) && rd.get(c.k) && rd.get(n) && n <= bytes.size();
  for (std::uint64_t i = 0; ok && i < n; ++i) {
    auto& [seq, tokens] = c.batch.emplace_back();
    ok = rd.get(seq) && rd.get_vector(tokens);
  }
  ok = ok && rd.get_vector(c.rows) && rd.get_string(c.bytes) && rd.done();
  if (!ok) return result<call>::failure("EP group: a malformed call");
  return c;
}

std::string apply(const call& c, cpu_backend& b) {
  std::vector<step_input> batch;
  for (const auto& [seq, tokens] : c.batch) batch.push_back({seq, tokens});
  auto error = [](const auto& res) { return res.ok() ? std::string() : res.error(); };
  switch (c.what) {
    case call::op::open: (void) b.open_sequence(); return {};
    case call::op::close: return error(b.close_sequence(c.id));
    case call::op::step: return error(b.step(batch));
    case call::op::step_tail: return error(b.step_tail(batch, c.rows, nullptr));
    case call::op::rollback: return error(b.rollback(c.id, c.k));
    case call::op::import_block: return error(b.import_block(c.id, c.k, c.bytes));
    case call::op::import_state: return error(b.import_state(c.id, c.bytes));
    case call::op::import_swa: return error(b.import_swa(c.id, c.bytes));
    case call::op::replay: return error(b.replay(c.id, c.rows));
  }
  return "EP group: an unknown call";
}

std::string encode_outcome(const std::vector<std::string>& errors) {
  writer w;
  w.put<std::uint64_t>(errors.size());
  for (const auto& e : errors) w.put_span(std::span<const char>(e));
  return w.take();
}

result<std::vector<std::string>> await_outcome(link& l) {
  using r = result<std::vector<std::string>>;
  std::string payload;
  if (l.outcome) {
    payload = std::move(*l.outcome);
    l.outcome.reset();
  } else {
    for (;;) {
      auto f = receive(l, true);
      if (!f) return r::failure(f.error());
      if (f->first == frame::outcome) {
        payload = std::move(f->second);
        break;
      }
      if (f->first != frame::segments)
        return r::failure(l.lose(l.name() + " sent an unexpected frame"));
    }
  }
  reader rd(payload);
  std::uint64_t n = 0;
  std::vector<std::string> errors;
  bool ok = rd.get(n) && n == l.ranks.size();
  for (std::uint64_t i = 0; ok && i < n; ++i) ok = rd.get_string(errors.emplace_back());
  if (!ok || !rd.done()) return r::failure(l.lose(l.name() + " sent a malformed outcome"));
  return errors;
}

result<std::vector<std::unique_ptr<cpu_backend>>> load_ranks(
  const std::filesystem::path& dir, model_options options, const expert_placement& placement,
  const std::vector<std::int32_t>& ranks, const std::shared_ptr<ep_exchange>& exchange,
  const std::function<result<bool>(model&)>& prepare) {
  using r = result<std::vector<std::unique_ptr<cpu_backend>>>;
  // One copy of each tensor for the process's ranks: the dense weights, and each expert once.
  if (!options.tensors) options.tensors = std::make_shared<tensor_cache>();
  std::vector<std::unique_ptr<cpu_backend>> models;
  for (auto rank : ranks) {
    options.ep = ep_member{rank, placement, exchange};
    auto m = model::load(dir, options);
    if (!m) return r::failure("EP group rank " + std::to_string(rank) + ": " + m.error());
    if (prepare)
      if (auto ok = prepare(*m); !ok)
        return r::failure("EP group rank " + std::to_string(rank) + ": " + ok.error());
    models.push_back(std::make_unique<cpu_backend>(std::move(*m)));
  }
  return models;
}

result<bool> await_ready(link& l) {
  auto f = receive(l);
  if (!f) return result<bool>::failure(f.error() + " before its ranks loaded");
  if (f->first == frame::ready) return true;
  if (f->first == frame::outcome) {
    l.outcome = std::move(f->second);
    auto errors = await_outcome(l);
    if (!errors) return result<bool>::failure(errors.error());
    for (const auto& e : *errors)
      if (!e.empty()) return result<bool>::failure(e);
  }
  return result<bool>::failure(
    l.lose(l.name() + " sent an unexpected frame before its ranks loaded"));
}

namespace {

// Two phases per call among this process's ranks: every rank posts its buffer, and the last of
// them fills its own with every segment (the other local ranks' from their buffers; with other
// processes, the leader reads each peer's segments and sends every peer the whole buffer, a peer
// sends its segments and reads the whole buffer), which the others then copy; every rank then
// reports its copy done, and the buffers may change again. A generation number tells one call's
// waits from the next one's.
class process_group final : public ep_exchange {
 public:
  process_group(std::int32_t ranks, std::vector<std::int32_t> local,
                std::vector<std::shared_ptr<link>> links, bool hub)
      : ranks_(ranks),
        local_(std::move(local)),
        links_(std::move(links)),
        hub_(hub),
        buffers_(static_cast<std::size_t>(ranks), nullptr) {}

  std::int32_t ranks() const override { return ranks_; }

  result<bool> all_gather(std::int32_t rank, std::span<float> buffer,
                          std::span<const std::int64_t> offsets) override {
    using r = result<bool>;
    if (std::find(local_.begin(), local_.end(), rank) == local_.end()
        || offsets.size() != static_cast<std::size_t>(ranks_) + 1
        || offsets.back() > static_cast<std::int64_t>(buffer.size()))
      return r::failure("EP exchange: rank " + std::to_string(rank) + " of " + std::to_string(ranks_)
                        + " called with " + std::to_string(offsets.size())
                        + " offsets for a buffer of " + std::to_string(buffer.size()) + " floats");
    std::unique_lock lock(mutex_);
    if (!failure_.empty()) return r::failure(failure_);
    const auto generation = generation_;
    buffers_[static_cast<std::size_t>(rank)] = buffer.data();
    if (++posted_ == static_cast<std::int32_t>(local_.size())) {
      lock.unlock();
      auto why = talk(rank, buffer, offsets);
      lock.lock();
      if (!why.empty()) {
        fail_locked(why);
        return r::failure(failure_);
      }
      posted_ = 0;
      whole_ = buffer.data();
      ready_ = generation + 1;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return ready_ > generation || !failure_.empty(); });
      if (!failure_.empty()) return r::failure(failure_);
      lock.unlock();
      std::copy(whole_, whole_ + offsets.back(), buffer.data());
      lock.lock();
    }
    if (++copied_ == static_cast<std::int32_t>(local_.size())) {
      copied_ = 0;
      ++generation_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return generation_ > generation || !failure_.empty(); });
      if (!failure_.empty()) return r::failure(failure_);
    }
    return true;
  }

  void abort(const std::string& why) override {
    std::lock_guard lock(mutex_);
    fail_locked(why);
  }

  void reset() override {
    std::lock_guard lock(mutex_);
    failure_.clear();
    posted_ = copied_ = 0;
    ready_ = generation_;
  }

 private:
  void fail_locked(const std::string& why) {
    if (!failure_.empty()) return;
    failure_ = "EP group aborted: " + why;
    changed_.notify_all();
    // The leader's peers may be waiting for this exchange's buffer: they fail it too.
    if (hub_)
      for (auto& l : links_) (void) send(*l, frame::abort, why);
  }

  // Fills `buffer` with every rank's segment; returns why it could not (empty: it did).
  std::string talk(std::int32_t rank, std::span<float> buffer,
                   std::span<const std::int64_t> offsets) {
    auto segment = [&](std::int32_t r) {
      const auto b = offsets[static_cast<std::size_t>(r)];
      return std::pair{b, offsets[static_cast<std::size_t>(r) + 1] - b};
    };
    for (auto r : local_)
      if (r != rank) {
        const auto [b, n] = segment(r);
        const float* src = buffers_[static_cast<std::size_t>(r)];
        std::copy(src + b, src + b + n, buffer.data() + b);
      }
    const auto bytes = [](const float* p, std::int64_t n) {
      return std::string_view(reinterpret_cast<const char*>(p),
                              static_cast<std::size_t>(n) * sizeof(float));
    };
    if (!hub_) {
      auto& leader = *links_.front();
      std::string mine;
      for (auto r : local_) {
        const auto [b, n] = segment(r);
        mine += bytes(buffer.data() + b, n);
      }
      if (auto ok = send(leader, frame::segments, mine); !ok) return ok.error();
      auto f = receive(leader);
      if (!f) return f.error();
      if (f->first == frame::abort) return f->second;
      if (f->first != frame::gathered
          || f->second.size() != static_cast<std::size_t>(offsets.back()) * sizeof(float))
        return "the leader sent an unexpected frame in an exchange";
      std::memcpy(buffer.data(), f->second.data(), f->second.size());
      return {};
    }
    for (auto& l : links_) {
      auto f = receive(*l, true);
      if (!f) return f.error();
      if (f->first == frame::outcome) {
        // The peer failed its call before this exchange: its outcome says why.
        l->outcome = std::move(f->second);
        return l->name() + " failed its call";
      }
      std::int64_t expected = 0;
      for (auto r : l->ranks) expected += segment(r).second;
      if (f->first != frame::segments
          || f->second.size() != static_cast<std::size_t>(expected) * sizeof(float))
        return l->lose(l->name() + " sent an unexpected frame in an exchange");
      const char* p = f->second.data();
      for (auto r : l->ranks) {
        const auto [b, n] = segment(r);
        std::memcpy(buffer.data() + b, p, static_cast<std::size_t>(n) * sizeof(float));
        p += n * static_cast<std::int64_t>(sizeof(float));
      }
    }
    const auto whole = bytes(buffer.data(), offsets.back());
    for (auto& l : links_)
      if (auto ok = send(*l, frame::gathered, whole); !ok) return ok.error();
    return {};
  }

  const std::int32_t ranks_;
  const std::vector<std::int32_t> local_;
  const std::vector<std::shared_ptr<link>> links_;
  const bool hub_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<const float*> buffers_;
  const float* whole_ = nullptr;
  std::int32_t posted_ = 0, copied_ = 0;
  std::uint64_t generation_ = 0, ready_ = 0;
  std::string failure_;
};

}  // namespace

std::shared_ptr<ep_exchange> process_exchange(std::int32_t ranks, std::vector<std::int32_t> local,
                                              std::vector<std::shared_ptr<link>> links, bool hub) {
  return std::make_shared<process_group>(ranks, std::move(local), std::move(links), hub);
}

}  // namespace wire

std::shared_ptr<ep_exchange> local_exchange(std::int32_t ranks) {
  // Every rank is this process's: the group of one process.
  const auto n = std::max(1, ranks);
  std::vector<std::int32_t> all(static_cast<std::size_t>(n));
  for (std::int32_t r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
  return wire::process_exchange(n, std::move(all), {}, true);
}

void refuse_ep_peer(int fd, std::size_t ranks, const std::string& why) {
  wire::link leader(fd, {0});
  (void) wire::send(leader, wire::frame::outcome,
                    wire::encode_outcome(std::vector<std::string>(ranks, why)));
}

result<bool> serve_ep_peer(int fd, const std::filesystem::path& dir, model_options options,
                           const expert_placement& placement, std::vector<std::int32_t> ranks,
                           const std::function<result<bool>(model&)>& prepare) {
  using r = result<bool>;
  auto leader = std::make_shared<wire::link>(fd, std::vector<std::int32_t>{0});
  auto refuse = [&](const std::string& why) {
    leader->fd = -1;  // closed by refuse_ep_peer
    refuse_ep_peer(fd, ranks.size(), why);
    return r::failure(why);
  };
  if (ranks.empty() || ranks.front() < 1 || !std::is_sorted(ranks.begin(), ranks.end())
      || ranks.back() >= placement.ranks)
    return refuse("EP peer: ranks must be ascending, above 0 and below " + std::to_string(placement.ranks));
  auto exchange = wire::process_exchange(placement.ranks, ranks, {leader}, false);
  auto loaded = wire::load_ranks(dir, std::move(options), placement, ranks, exchange, prepare);
  if (!loaded) return refuse(loaded.error());
  auto& models = *loaded;
  if (auto ok = wire::send(*leader, wire::frame::ready, {}); !ok) return true;
  worker_pool threads(static_cast<int>(models.size()));
  for (;;) {
    auto f = wire::receive(*leader);
    if (!f) return true;  // the leader closed the group
    if (f->first == wire::frame::abort) continue;  // of an exchange this process had left
    auto c = wire::decode(f->second);
    if (!c) return r::failure(c.error());
    exchange->reset();  // no rank is inside a call
    std::vector<std::string> errors(models.size());
    threads.run(static_cast<int>(models.size()), [&](int i) {
      const auto at = static_cast<std::size_t>(i);
      errors[at] = wire::apply(*c, *models[at]);
      if (!errors[at].empty())  // the ranks waiting in an exchange return
        exchange->abort("rank " + std::to_string(ranks[at]) + ": " + errors[at]);
    });
    if (auto ok = wire::send(*leader, wire::frame::outcome, wire::encode_outcome(errors)); !ok)
      return true;
  }
}

}  // namespace troupe::kernels
