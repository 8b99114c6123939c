#include "runtime/check.hpp"

#include <cstdio>
#include <cstdlib>

namespace troupe::runtime::detail {

void check_failed(const char* cond, std::string_view msg, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: invariant violated: %s: %.*s\n", file, line, cond,
               static_cast<int>(msg.size()), msg.data());
  std::fflush(stderr);
  std::abort();
}

} // namespace troupe::runtime::detail
