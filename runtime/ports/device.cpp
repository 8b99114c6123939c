// The device port's error category (see device.hpp).
#include "runtime/ports/device.hpp"

#include <caf/make_message.hpp>

#include <set>

namespace troupe::runtime {

std::string to_string(device_errc code) {
  switch (code) {
    case device_errc::load_failed:
      return "load_failed";
    case device_errc::invalid_step:
      return "invalid_step";
    case device_errc::unknown_sequence:
      return "unknown_sequence";
    case device_errc::snapshot_rejected:
      return "snapshot_rejected";
    case device_errc::compute_failed:
      return "compute_failed";
  }
  return "unknown_device_error_" + std::to_string(static_cast<int>(code));
}

caf::error make_error(device_errc code, std::string context) {
  return caf::error{static_cast<std::uint8_t>(code), device_error_category,
                    caf::make_message(std::move(context))};
}

caf::error validate_step(const device_step& step, bool ids_required,
                         const std::function<std::uint64_t(std::uint64_t)>& held,
                         const std::function<std::string(const step_sequence&)>& extra) {
  std::set<std::uint64_t> seen;
  for (const auto& s : step.batch) {
    auto fail = [&](const std::string& why) {
      return make_error(device_errc::invalid_step, "step " + std::to_string(step.id)
                                                     + ", sequence " + std::to_string(s.sequence)
                                                     + ": " + why);
    };
    if (!seen.insert(s.sequence).second)
      return fail("twice in the batch");
    if (s.count == 0)
      return fail("no new tokens");
    if (s.verify > 0 && (!s.sample || s.verify >= s.count))
      return fail("verify " + std::to_string(s.verify)
                  + ": drafts are verified after at least one other new token, with sample");
    if ((ids_required || !s.tokens.empty()) && s.tokens.size() != s.count)
      return fail("count " + std::to_string(s.count) + " but " + std::to_string(s.tokens.size())
                  + " token ids");
    if (auto h = held(s.sequence); s.position != h)
      return fail("position " + std::to_string(s.position) + ", but its cache holds "
                  + std::to_string(h) + " tokens");
    if (auto why = extra(s); !why.empty())
      return fail(why);
  }
  return caf::none;
}

bool is(const caf::error& err, device_errc code) {
  return err.category() == device_error_category && err.code() == static_cast<std::uint8_t>(code);
}

} // namespace troupe::runtime
