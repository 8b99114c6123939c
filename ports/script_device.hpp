// script_device: a device port that computes nothing and answers tokens from a script.
//
// Tests of the serving actors (engine, request, API layer) need a device whose tokens are
// known in advance without loading a model, and overhead benchmarks need one that costs
// nothing, so that what they measure is the actors' own work. This device keeps the same
// per-sequence bookkeeping as the CPU device (positions are validated the same way, sequences
// are opened by their first step and freed by device_release, KV exports and imports hand a
// sequence to another script device) but the k-th token it samples for a sequence is simply
// the k-th token of a script. It is an ordinary event-based actor (no thread of its own) and
// uses only the actor clock, so it runs in both worlds, in virtual time in the simulator.
#pragma once

#include "runtime/ports/device.hpp"
#include "runtime/time.hpp"

#include <caf/fwd.hpp>

#include <cstdint>
#include <map>
#include <vector>

namespace troupe::ports {

/// What a sequence samples once its script is used up.
enum class script_end : std::uint8_t {
  /// The last token of the script, again and again.
  repeat_last,
  /// The script from its start again: token k is script[k % size].
  cycle,
};

struct script_device_params {
  /// The tokens every sequence samples, in order: its k-th sampled token is script[k].
  std::vector<std::int32_t> script{};
  /// Scripts of particular sequences, used instead of `script` for them.
  std::map<std::uint64_t, std::vector<std::int32_t>> scripts{};
  script_end at_end = script_end::repeat_last;
  /// How long each step occupies the device (actor clock); steps queue one after another.
  /// 0: every step is answered at once.
  runtime::duration step_delay{0};
};

/// Spawns a script device. It answers:
///   - device_step: validates the whole batch first as the CPU device does (each sequence
///     once, count > 0, tokens either empty or `count` ids, position equal to the tokens the
///     sequence holds, 0 for a sequence it has not seen; a sequence that samples must have a
///     non-empty script); a violation is device_errc::invalid_step and changes nothing. Then
///     each sequence advances by count and each that asks for a token gets its next script
///     token (logprob 0; top_logprobs pairs of (that token, 0) when asked, at most one). The
///     result starts when the steps queued before it finish and takes `step_delay`.
///   - device_release: forgets the sequence (an unknown one is ignored).
///   - kv_export: a snapshot named "script" holding the sequence's length and, as its State
///     KV, how many tokens it sampled (so an import continues the script where it stood);
///     device_errc::unknown_sequence for a sequence it does not hold.
///   - kv_import: restores a sequence from a script device's snapshot; another model's
///     snapshot, a checksum mismatch or a sequence it already holds is
///     device_errc::snapshot_rejected and leaves no sequence behind.
///   - kv_keep: ignored; kv_restore: opens the sequence at its blocks' length (it holds no KV:
///     its script starts from the beginning), answered as replayed; no blocks, a token count
///     other than their length or a sequence it holds is device_errc::snapshot_rejected.
/// Releases, exports, imports and errors take no device time but are answered after the
/// steps queued before them.
runtime::device_port spawn_script_device(caf::actor_system& sys, script_device_params params);

} // namespace troupe::ports
