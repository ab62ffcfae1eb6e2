#pragma once
// Errors a user can cause (a bad file, a bad request) travel as Status / Expected<T>,
// never as exceptions through the engine loop. Messages name the file, tensor or field at fault.
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace origami {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // bad request or flag value
  kNotFound,         // missing file, tensor, token
  kInvalidFile,      // malformed config / weights / tokenizer
  kOutOfRange,       // e.g. prompt longer than the context
  kResourceExhausted,
  kUnimplemented,
  kInternal,
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) { return {ErrorCode::kInvalidArgument, std::move(msg)}; }
inline Status not_found(std::string msg) { return {ErrorCode::kNotFound, std::move(msg)}; }
inline Status invalid_file(std::string msg) { return {ErrorCode::kInvalidFile, std::move(msg)}; }
inline Status out_of_range(std::string msg) { return {ErrorCode::kOutOfRange, std::move(msg)}; }
inline Status internal_error(std::string msg) { return {ErrorCode::kInternal, std::move(msg)}; }

// A value or the Status saying why there is none.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}
  Expected(Status status) : status_(std::move(status)) {}

  bool has_value() const { return value_.has_value(); }
  explicit operator bool() const { return has_value(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace origami

// Propagate a failing Status / Expected from the current function.
#define ORIGAMI_CONCAT_INNER(a, b) a##b
#define ORIGAMI_CONCAT(a, b) ORIGAMI_CONCAT_INNER(a, b)
#define ORIGAMI_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::origami::Status _st = (expr);            \
    if (!_st.is_ok()) return _st;              \
  } while (0)
#define ORIGAMI_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.has_value()) return tmp.status();          \
  lhs = std::move(tmp).value()
#define ORIGAMI_ASSIGN_OR_RETURN(lhs, expr) \
  ORIGAMI_ASSIGN_OR_RETURN_IMPL(ORIGAMI_CONCAT(_expected_, __LINE__), lhs, expr)
