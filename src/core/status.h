// Status and Result<T>: expected failures (bad input, missing file, out of memory) travel as values
// with a message that tells the user what to do. Bugs abort through KILN_ASSERT instead.
// Thread safety: plain values, no shared state.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class StatusCode { ok, invalid_argument, not_found, io_error, unsupported, out_of_memory, internal };

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::invalid_argument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::not_found, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::io_error, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::unsupported, std::move(m)}; }
inline Status out_of_memory(std::string m) { return {StatusCode::out_of_memory, std::move(m)}; }

// Result<T> holds either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}
  Result(Status status) : status_(std::move(status)) {
    if (status_.ok()) status_ = Status(StatusCode::internal, "Result constructed from an ok Status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { check(); return *value_; }
  T&& value() && { check(); return std::move(*value_); }
  T* operator->() { check(); return &*value_; }
  T& operator*() { check(); return *value_; }

 private:
  void check() const {
    if (!value_) {
      std::fprintf(stderr, "kiln: Result accessed without a value: %s\n", status_.message().c_str());
      std::abort();
    }
  }
  std::optional<T> value_;
  Status status_;
};

// Memory running out inside an op. Ops return nothing (a step is a plain sequence of launches), so
// the temporary buffers they take (empty_for_op, CudaBackend::scratch) throw this instead of
// aborting; the error boundaries (the engine thread, kiln's main) turn it into a failed request or
// a message and exit 1. what() names the device, the size and what to lower.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

}  // namespace kiln

// Bugs: print the failed condition with its location and abort.
#define KILN_ASSERT(cond, ...)                                                                  \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "kiln: assertion failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

// Propagate a non-ok Status from an expression returning Status.
#define KILN_RETURN_IF_ERROR(expr)        \
  do {                                    \
    ::kiln::Status _kiln_st = (expr);     \
    if (!_kiln_st.ok()) return _kiln_st;  \
  } while (0)

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
// Assign the value of a Result expression to `lhs`, or return its Status.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(_kiln_r, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
