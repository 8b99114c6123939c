#include "runtime/ports/store.hpp"

#include <cstdio>

namespace troupe::runtime {

std::string to_string(const store_key& k) {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(k.hi),
                static_cast<unsigned long long>(k.lo));
  return std::string(text, 32);
}

} // namespace troupe::runtime
