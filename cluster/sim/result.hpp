// A value or the reason there is none: how the simulated world's loaders report expected failures.
//
// Loading a hardware profile, a model config or costing a step can fail for reasons the caller
// must show a person (a missing config field, an unknown GPU name, an EP size that does not
// divide the experts). Those failures are values, never exceptions: a `result<T>` holds either
// the value or one human-readable message that names what is wrong and, where it can, how to fix
// it.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace troupe::cluster::sim {

/// Either a value or an error message (never both, never neither).
template <class T>
class result {
public:
  result(T value) : value_(std::move(value)) {}

  /// A failed result with `message` (which should say what is wrong and how to fix it).
  static result failure(std::string message) {
    result r;
    r.error_ = std::move(message);
    return r;
  }

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }

  /// The value; only valid when ok().
  const T& operator*() const { return *value_; }
  T& operator*() { return *value_; }
  const T* operator->() const { return &*value_; }
  T* operator->() { return &*value_; }

  /// The error message; empty when ok().
  const std::string& error() const { return error_; }

private:
  result() = default;
  std::optional<T> value_;
  std::string error_;
};

} // namespace troupe::cluster::sim
