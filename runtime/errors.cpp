#include "runtime/errors.hpp"

namespace troupe::runtime {

std::string to_string(errc code) {
  switch (code) {
    case errc::restart_intensity_exceeded:
      return "restart_intensity_exceeded";
    case errc::child_start_failed:
      return "child_start_failed";
    case errc::duplicate_child:
      return "duplicate_child";
    case errc::unknown_child:
      return "unknown_child";
    case errc::store_full:
      return "store_full";
    case errc::not_found:
      return "not_found";
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::unavailable:
      return "unavailable";
    case errc::store_corrupt:
      return "store_corrupt";
  }
  return "unknown_error_" + std::to_string(static_cast<int>(code));
}

caf::error make_error(errc code) {
  return caf::error{static_cast<std::uint8_t>(code), error_category};
}

caf::error make_error(errc code, std::string context) {
  return caf::error{static_cast<std::uint8_t>(code), error_category,
                    caf::make_message(std::move(context))};
}

bool is(const caf::error& err, errc code) {
  return err.category() == error_category && err.code() == static_cast<std::uint8_t>(code);
}

} // namespace troupe::runtime
