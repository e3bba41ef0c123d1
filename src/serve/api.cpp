#include "serve/api.h"

#include <chrono>
#include <random>

namespace kiln::serve {

std::string openai_error_type(int status) {
  switch (status) {
    case 400: case 404: case 413: case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "server_error";
  }
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 400: case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return "api_error";
  }
}

ApiError api_error_from(const Status& s) {
  ApiError e;
  switch (s.code()) {
    case StatusCode::invalid_argument: case StatusCode::unsupported: e.status = 400; break;
    case StatusCode::not_found: e.status = 404; break;
    case StatusCode::out_of_memory: e.status = 503; break;
    default: e.status = 500; break;
  }
  e.type = openai_error_type(e.status);
  e.message = s.message();
  return e;
}

Json openai_error_body(const ApiError& e) {
  Json err = {{"message", e.message},
              {"type", e.type.empty() ? openai_error_type(e.status) : e.type},
              {"param", e.param.empty() ? Json() : Json(e.param)},
              {"code", e.code.empty() ? Json() : Json(e.code)}};
  return {{"error", err}};
}

Json anthropic_error_body(const ApiError& e) {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(e.status)}, {"message", e.message}}}};
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint64_t random_seed() { return (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}(); }

std::string random_id(int32_t chars) {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(static_cast<size_t>(chars), '0');
  for (char& c : s) c = kHex[gen() & 15];
  return s;
}

}  // namespace kiln::serve
