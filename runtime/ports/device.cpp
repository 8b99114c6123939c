// The device port's error category (see device.hpp).
#include "runtime/ports/device.hpp"

#include <caf/make_message.hpp>

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

bool is(const caf::error& err, device_errc code) {
  return err.category() == device_error_category && err.code() == static_cast<std::uint8_t>(code);
}

} // namespace troupe::runtime
