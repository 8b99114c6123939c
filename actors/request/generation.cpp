// The generation interface's names (see generation.hpp).
#include "actors/request/generation.hpp"

namespace troupe::actors {

std::string to_string(finish_reason r) {
  switch (r) {
    case finish_reason::stop:
      return "stop";
    case finish_reason::length:
      return "length";
    case finish_reason::cancelled:
      return "cancelled";
    case finish_reason::error:
      return "error";
  }
  return "unknown";
}

} // namespace troupe::actors
