// A value or the reason there is none: how kernels/ reports expected failures.
//
// Loading a model config or a checkpoint fails for reasons a person must be shown (a missing
// field, a tensor with the wrong shape, a truncated file). kernels/ depends on nothing of ours,
// so it carries its own small result type instead of runtime's or the simulator's: a
// `result<T>` holds either the value or one message that names what is wrong (file, field or
// tensor, expected vs found). Nothing in kernels/'s loading API throws.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace troupe::kernels {

/// Either a value or an error message (never both, never neither).
template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : value_(std::move(value)) {}

  /// A failed result carrying `message`.
  static result failure(std::string message) {
    result r;
    r.error_ = std::move(message);
    return r;
  }

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }

  /// The value; only valid when ok().
  const T& operator*() const& { return *value_; }
  T& operator*() & { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  const T* operator->() const { return &*value_; }
  T* operator->() { return &*value_; }

  /// The error message; empty when ok().
  const std::string& error() const { return error_; }

 private:
  result() = default;
  std::optional<T> value_;
  std::string error_;
};

}  // namespace troupe::kernels
