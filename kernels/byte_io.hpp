// byte_io: native-endian values appended to and read back from byte strings, for formats that
// stay on one machine (the KV block strings, kv_blocks.cpp; an EP group's frames between the
// processes of one machine, ep_process.cpp). The ports' wire formats between machines are
// little-endian (ports/le_bytes.hpp).
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

namespace troupe::kernels {

class byte_writer {
 public:
  template <class T>
  void put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void put_bytes(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string take() { return std::move(out_); }

 protected:
  std::string out_;
};

class byte_reader {
 public:
  explicit byte_reader(std::string_view in) : in_(in) {}
  template <class T>
  bool get(T& v) {
    return get_bytes(&v, sizeof v);
  }
  /// Copies the next n bytes to p; false (nothing read) when fewer are left.
  bool get_bytes(void* p, std::size_t n) {
    if (in_.size() < n) return false;
    std::memcpy(p, in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  std::size_t left() const { return in_.size(); }
  bool done() const { return in_.empty(); }

 protected:
  std::string_view in_;
};

}  // namespace troupe::kernels
