// The script device port (see script_device.hpp).
#include "ports/script_device.hpp"

#include "runtime/ports/delayed_reply.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>

namespace troupe::ports {

using runtime::device_errc;
using runtime::make_error;

namespace {

constexpr const char* model_name = "script";

struct script_sequence {
  std::uint64_t length = 0;
  /// Tokens sampled so far: the next one is script token `sampled`.
  std::uint64_t sampled = 0;
};

struct script_device_state {
  script_device_params params;
  std::map<std::uint64_t, script_sequence> sequences;
  /// When the device finishes the steps queued so far.
  runtime::time_point busy_until{};
  static inline const char* name = "script_device";
};

using self_ptr = caf::stateful_actor<script_device_state>*;

const std::vector<std::int32_t>& script_of(const script_device_state& st, std::uint64_t seq) {
  auto i = st.params.scripts.find(seq);
  return i != st.params.scripts.end() ? i->second : st.params.script;
}

std::int32_t script_token(const script_device_state& st, std::uint64_t seq, std::uint64_t k) {
  const auto& s = script_of(st, seq);
  if (k < s.size())
    return s[k];
  return st.params.at_end == script_end::cycle ? s[k % s.size()] : s.back();
}

/// The instant a reply that takes no device time is due: after the queued steps.
runtime::time_point next_free(self_ptr self) {
  return std::max(self->clock().now(), self->state.busy_until);
}

/// Delivers `value` (a result or an error) to the current request's sender at `when`: at once
/// when that is now (no round through the clock's thread).
template <class T>
caf::response_promise answer_at(self_ptr self, runtime::time_point when, T value) {
  if (when <= self->clock().now()) {
    auto rp = self->make_response_promise();
    rp.deliver(std::move(value));
    return rp;
  }
  return runtime::detail::reply_at(self, when, std::move(value));
}

caf::error validate(const script_device_state& st, const runtime::device_step& step) {
  auto held = [&](std::uint64_t sequence) -> std::uint64_t {
    auto i = st.sequences.find(sequence);
    return i == st.sequences.end() ? 0 : i->second.length;
  };
  auto extra = [&](const runtime::step_sequence& s) -> std::string {
    if (s.sample && script_of(st, s.sequence).empty())
      return "no script to sample from";
    if (s.verify > 0)
      return "a script device does not verify drafts";
    return {};
  };
  return runtime::validate_step(step, false, held, extra);
}

caf::response_promise run_step(self_ptr self, const runtime::device_step& step) {
  auto& st = self->state;
  if (auto err = validate(st, step))
    return answer_at(self, next_free(self), std::move(err));
  runtime::device_result out;
  out.id = step.id;
  out.started = next_free(self);
  out.finished = out.started + std::max(runtime::duration{0}, st.params.step_delay);
  st.busy_until = out.finished;
  for (const auto& s : step.batch) {
    auto& seq = st.sequences[s.sequence];
    seq.length += s.count;
    if (!s.sample)
      continue;
    runtime::sampled_token t;
    t.sequence = s.sequence;
    t.token = script_token(st, s.sequence, seq.sampled++);
    if (s.params.top_logprobs > 0)
      t.top.emplace_back(t.token, 0.0f);
    out.sampled.push_back(std::move(t));
  }
  const auto when = out.finished;
  return answer_at(self, when, std::move(out));
}

runtime::kv_bytes encode_sampled(std::uint64_t sampled) {
  runtime::kv_bytes b;
  b.bytes.assign(reinterpret_cast<const char*>(&sampled), sizeof sampled);
  b.checksum = XXH3_64bits(b.bytes.data(), b.bytes.size());
  return b;
}

caf::behavior script_device_fn(self_ptr self, script_device_params params) {
  self->state.params = std::move(params);
  return {
    [self](const runtime::device_step& step) { return run_step(self, step); },
    [self](const runtime::device_release& r) { self->state.sequences.erase(r.sequence); },
    [self](const runtime::kv_export& x) {
      auto& st = self->state;
      auto i = st.sequences.find(x.sequence);
      if (i == st.sequences.end())
        return answer_at(self, next_free(self),
                         make_error(device_errc::unknown_sequence,
                                    "kv_export: no sequence " + std::to_string(x.sequence)));
      auto snap = std::make_shared<runtime::kv_snapshot>();
      snap->model = model_name;
      snap->length = i->second.length;
      snap->state = encode_sampled(i->second.sampled);
      return answer_at(self, next_free(self), runtime::kv_snapshot_ptr{std::move(snap)});
    },
    [self](const runtime::kv_import& x) {
      auto& st = self->state;
      auto reject = [&](const std::string& why) {
        return answer_at(self, next_free(self),
                         make_error(device_errc::snapshot_rejected,
                                    "kv_import of sequence " + std::to_string(x.sequence) + ": "
                                      + why));
      };
      const auto* snap = x.snapshot.get();
      if (snap == nullptr)
        return reject("no snapshot");
      if (snap->model != model_name)
        return reject("a snapshot of model " + snap->model + ", this device runs "
                      + model_name);
      if (st.sequences.count(x.sequence) != 0)
        return reject("the device already holds the sequence");
      const auto& b = snap->state.bytes;
      if (XXH3_64bits(b.data(), b.size()) != snap->state.checksum)
        return reject("checksum mismatch");
      if (b.size() != sizeof(std::uint64_t) || !snap->blocks.empty())
        return reject("not a script device's snapshot");
      script_sequence seq;
      seq.length = snap->length;
      std::memcpy(&seq.sampled, b.data(), sizeof seq.sampled);
      st.sequences.emplace(x.sequence, seq);
      return answer_at(self, next_free(self), caf::ok_atom::value);
    },
    [](const runtime::kv_keep&) {},
    [self](const runtime::kv_kept_export&) {
      return answer_at(self, next_free(self),
                       make_error(device_errc::unknown_sequence,
                                  "the script device keeps no window state"));
    },
    [self](const runtime::kv_restore& x) {
      auto& st = self->state;
      const auto length = x.blocks ? x.blocks->length : 0;
      if (length == 0 || x.tokens.size() != length || st.sequences.count(x.sequence) != 0)
        return answer_at(self, next_free(self),
                         make_error(device_errc::snapshot_rejected,
                                    "kv_restore of sequence " + std::to_string(x.sequence)
                                      + ": no blocks, a token count that does not match them, "
                                        "or a sequence the device holds"));
      st.sequences.emplace(x.sequence, script_sequence{length, 0});
      return answer_at(self, next_free(self), runtime::kv_restored{length, true});
    },
  };
}

} // namespace

runtime::device_port spawn_script_device(caf::actor_system& sys, script_device_params params) {
  return caf::actor_cast<runtime::device_port>(sys.spawn(script_device_fn, std::move(params)));
}

} // namespace troupe::ports
