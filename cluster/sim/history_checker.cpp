// history_checker: recomputes a run's invariants from its facts (history_checker.hpp).
#include "cluster/sim/history_checker.hpp"

#include "runtime/ports/device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <unordered_map>

namespace troupe::cluster::sim {

namespace {

using actors::block_key;
using schemas::traffic_class;

const char* class_name(traffic_class c) {
  switch (c) {
    case traffic_class::chatbot:
      return "chatbot";
    case traffic_class::agent:
      return "agent";
    case traffic_class::batch:
      return "batch";
  }
  return "?";
}

struct key_hash {
  std::size_t operator()(const block_key& k) const noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull));
  }
};

/// Collects one check's violations: the first `shown_per_check`, then a count of the rest.
class sink {
public:
  sink(std::vector<violation>& out, std::string about) : out_(out), about_(std::move(about)) {}
  sink(const sink&) = delete;
  sink& operator=(const sink&) = delete;

  void add(std::uint64_t request, std::string what) {
    if (++count_ <= shown_per_check)
      out_.push_back({request, "history: " + what, request == 0 ? about_ : std::string{}});
  }

  ~sink() {
    if (count_ > shown_per_check)
      out_.push_back({0, fmt::format("history: {} more {} violations", count_ - shown_per_check,
                                     about_),
                      about_});
  }

private:
  std::vector<violation>& out_;
  std::string about_;
  std::size_t count_ = 0;
};

class checker {
public:
  checker(const history_expectations& e, std::vector<violation>& out) : e_(e), out_(out) {}

  double secs(runtime::time_point t) const { return runtime::to_seconds(t - e_.origin); }

  void kv(const std::vector<actors::kv_fact>& facts) {
    sink bad{out_, "kv"};
    struct life {
      bool visible = false;
      runtime::time_point expiry{};
      runtime::time_point written{};
      traffic_class cls = traffic_class::chatbot;
    };
    std::unordered_map<block_key, life, key_hash> blocks;
    blocks.reserve(facts.size() / 2 + 1);
    for (const auto& f : facts) {
      auto ttl = e_.ttl.find(f.cls);
      auto i = blocks.find(f.key);
      const bool live = i != blocks.end() && f.at < i->second.expiry;
      switch (f.act) {
        case actors::kv_act::write:
        case actors::kv_act::reserve: {
          if (ttl == e_.ttl.end()) {
            bad.add(0, fmt::format("block {} written at {:.6f} s with class {}, which has no "
                                   "TTL in the topology",
                                   to_string(f.key), secs(f.at), class_name(f.cls)));
            break;
          }
          auto until = f.at + ttl->second;
          if (live) {
            auto& b = i->second;
            b.expiry = std::max(b.expiry, until);
            b.visible = b.visible || f.act == actors::kv_act::write;
            b.cls = f.cls;
            b.written = f.at;
          } else {
            blocks[f.key] = life{f.act == actors::kv_act::write, until, f.at, f.cls};
          }
          break;
        }
        case actors::kv_act::commit:
          if (live && !i->second.visible) {
            auto& b = i->second;
            b.visible = true;
            if (auto t = e_.ttl.find(b.cls); t != e_.ttl.end())
              b.expiry = std::max(b.expiry, f.at + t->second);
          }
          break;
        case actors::kv_act::refresh:
          if (live && i->second.visible && ttl != e_.ttl.end())
            i->second.expiry = std::max(i->second.expiry, f.at + ttl->second);
          break;
        case actors::kv_act::hit:
          if (i == blocks.end())
            bad.add(0, fmt::format("block {} served as a hit at {:.6f} s, never written",
                                   to_string(f.key), secs(f.at)));
          else if (!live)
            bad.add(0, fmt::format("block {} served as a hit at {:.6f} s, {:.6f} s after its "
                                   "TTL expired at {:.6f} s (last written at {:.6f} s, class "
                                   "{})",
                                   to_string(f.key), secs(f.at),
                                   runtime::to_seconds(f.at - i->second.expiry),
                                   secs(i->second.expiry), secs(i->second.written),
                                   class_name(i->second.cls)));
          else if (!i->second.visible)
            bad.add(0, fmt::format("block {} served as a hit at {:.6f} s, reserved but never "
                                   "committed",
                                   to_string(f.key), secs(f.at)));
          break;
      }
    }
  }

  void requests(const actors::run_facts& h) {
    sink bad{out_, "requests"};
    struct req {
      std::uint64_t input = 0, output = 0;
      bool admitted = false;
      std::uint32_t ends = 0;
      bool completed = false, stopped = false;
      runtime::time_point ended{};
      std::uint64_t delivered = 0;
      runtime::time_point last_token{};
      bool stream_broken = false;
    };
    std::map<std::uint64_t, req> reqs;
    for (const auto& f : h.requests) {
      auto& r = reqs[f.request];
      if (f.kind == actors::request_fact::admitted) {
        if (r.admitted)
          bad.add(f.request, "admitted twice");
        r.admitted = true;
        r.input = f.input_tokens;
        r.output = f.output_tokens;
        continue;
      }
      if (!r.admitted)
        bad.add(f.request, fmt::format("{} at {:.6f} s without having been admitted",
                                       f.kind == actors::request_fact::completed ? "completed"
                                                                                 : "failed",
                                       secs(f.at)));
      if (++r.ends == 2)
        bad.add(f.request, "ended twice; a request ends exactly once");
      r.completed = f.kind == actors::request_fact::completed;
      r.stopped = f.stopped;
      r.ended = f.at;
    }
    for (const auto& t : h.tokens) {
      auto i = reqs.find(t.request);
      if (i == reqs.end() || !i->second.admitted) {
        bad.add(t.request, fmt::format("delivered position {} at {:.6f} s without having been "
                                       "admitted",
                                       t.position, secs(t.at)));
        continue;
      }
      auto& r = i->second;
      if (r.ends > 0 && t.at > r.ended)
        bad.add(t.request, fmt::format("delivered position {} at {:.6f} s, after it ended at "
                                       "{:.6f} s",
                                       t.position, secs(t.at), secs(r.ended)));
      if (r.stream_broken)
        continue; // one violation per stream: what follows a broken position is noise
      if (t.position != r.delivered) {
        r.stream_broken = true;
        bad.add(t.request,
                t.position < r.delivered
                  ? fmt::format("delivered position {} again at {:.6f} s (a token delivered "
                                "twice)",
                                t.position, secs(t.at))
                  : fmt::format("delivered position {} at {:.6f} s before position {} (a gap)",
                                t.position, secs(t.at), r.delivered));
        continue;
      }
      if (t.position >= r.output) {
        r.stream_broken = true;
        bad.add(t.request, fmt::format("delivered position {}, beyond its {} output tokens",
                                       t.position, r.output));
        continue;
      }
      auto expected = e_.modelled_tokens ? runtime::modelled_token(t.request, r.input + t.position)
                                         : t.token;
      if (t.token != expected) {
        r.stream_broken = true;
        bad.add(t.request, fmt::format("delivered token {} at position {} where the device "
                                       "generates {} (a token repeated, lost or reordered)",
                                       t.token, t.position, expected));
        continue;
      }
      ++r.delivered;
    }
    for (const auto& [id, r] : reqs) {
      if (!r.admitted)
        continue;
      if (r.ends == 0) {
        if (e_.run_finished)
          bad.add(id, "admitted but never ended");
        continue;
      }
      if (r.completed && !r.stopped && !r.stream_broken && r.delivered != r.output)
        bad.add(id, fmt::format("completed after delivering positions 0..{} of its {} output "
                                "tokens",
                                static_cast<std::int64_t>(r.delivered) - 1, r.output));
    }
  }

  void bookings(const std::vector<actors::booking_fact>& facts) {
    sink bad{out_, "decode_lb"};
    struct inst {
      bool routed = false;
      std::multiset<std::uint64_t> booked;
      /// Bookings of an incarnation that left the routing: their releases may still come.
      std::multiset<std::uint64_t> stale;
      std::uint64_t reserved = 0;
    };
    std::map<std::uint32_t, inst> insts;
    for (const auto& f : facts) {
      auto& in = insts[f.instance];
      switch (f.kind) {
        case actors::booking_fact::join:
          in.routed = true;
          break;
        case actors::booking_fact::leave:
          in.routed = false;
          in.stale.insert(in.booked.begin(), in.booked.end());
          in.booked.clear();
          in.reserved = 0;
          break;
        case actors::booking_fact::book:
          if (!in.routed)
            bad.add(0, fmt::format("a request booked at {:.6f} s on decode instance {}, which "
                                   "is not in the routing",
                                   secs(f.at), f.instance));
          in.booked.insert(f.reserved);
          in.reserved += f.reserved;
          if (in.reserved > e_.decode_kv_tokens)
            bad.add(0, fmt::format("decode instance {} booked {} KV tokens at {:.6f} s, above "
                                   "its capacity of {}",
                                   f.instance, in.reserved, secs(f.at), e_.decode_kv_tokens));
          if (in.booked.size() > e_.decode_max_requests)
            bad.add(0, fmt::format("decode instance {} held {} requests at {:.6f} s, above its "
                                   "batch capacity of {}",
                                   f.instance, in.booked.size(), secs(f.at),
                                   e_.decode_max_requests));
          break;
        case actors::booking_fact::release:
          if (auto b = in.booked.find(f.reserved); b != in.booked.end()) {
            in.booked.erase(b);
            in.reserved -= f.reserved;
          } else if (auto s = in.stale.find(f.reserved); s != in.stale.end()) {
            in.stale.erase(s);
          } else {
            bad.add(0, fmt::format("a booking of {} KV tokens released at {:.6f} s on decode "
                                   "instance {}, which holds no such booking",
                                   f.reserved, secs(f.at), f.instance));
          }
          break;
      }
    }
    if (!e_.run_finished)
      return;
    for (const auto& [id, in] : insts)
      if (!in.booked.empty())
        bad.add(0, fmt::format("KV leaked: decode instance {} still books {} requests ({} KV "
                               "tokens) after every request ended",
                               id, in.booked.size(), in.reserved));
  }

  void instances(const std::vector<actors::instance_fact>& facts) {
    sink bad{out_, "supervisor"};
    std::map<std::string, runtime::time_point> down_at;
    for (const auto& f : facts) {
      if (!f.up) {
        down_at[f.instance] = f.at;
        continue;
      }
      auto d = down_at.find(f.instance);
      if (d == down_at.end())
        continue;
      if (f.at - d->second < e_.restart_time / 2)
        bad.add(0, fmt::format("instance {} came back at {:.6f} s, {:.6f} s after it went "
                               "down; a restart takes {:.6f} s",
                               f.instance, secs(f.at), runtime::to_seconds(f.at - d->second),
                               runtime::to_seconds(e_.restart_time)));
      down_at.erase(d);
    }
  }

private:
  const history_expectations& e_;
  std::vector<violation>& out_;
};

} // namespace

nlohmann::json history_report::to_json() const {
  return {{"facts",
           {{"kv", kv_facts},
            {"tokens", token_facts},
            {"requests", request_facts},
            {"bookings", booking_facts},
            {"instances", instance_facts}}},
          {"violations", violations.size()}};
}

history_report check_history(const actors::run_facts& h, const history_expectations& e) {
  history_report r;
  r.kv_facts = h.kv.size();
  r.token_facts = h.tokens.size();
  r.request_facts = h.requests.size();
  r.booking_facts = h.bookings.size();
  r.instance_facts = h.instances.size();
  checker c{e, r.violations};
  c.kv(h.kv);
  c.requests(h);
  c.bookings(h.bookings);
  c.instances(h.instances);
  return r;
}

std::map<schemas::traffic_class, runtime::duration>
ttl_of_classes(const std::map<std::string, runtime::duration>& storage_ttl) {
  using namespace std::chrono_literals;
  std::map<schemas::traffic_class, runtime::duration> out{
    {traffic_class::chatbot, 24h * 7}, {traffic_class::agent, 24h * 3}, {traffic_class::batch, 24h}};
  for (const auto& [name, ttl] : storage_ttl) {
    if (name == "chatbot")
      out[traffic_class::chatbot] = ttl;
    else if (name == "agent")
      out[traffic_class::agent] = ttl;
    else if (name == "batch")
      out[traffic_class::batch] = ttl;
  }
  return out;
}

} // namespace troupe::cluster::sim
