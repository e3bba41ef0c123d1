#include "serve/request_fields.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>

#include "core/json_text.h"

namespace kiln::serve {

std::string string_member(const Json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Status read_logit_bias(const Json& v, std::vector<std::pair<int32_t, float>>* out) {
  if (v.is_null()) return Status::Ok();
  if (!v.is_object()) return invalid_argument("'logit_bias' must be an object mapping token ids to biases");
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || key.empty() || id < 0 || id > INT32_MAX)
      return invalid_argument("'logit_bias' keys must be token ids, not '" + key.substr(0, 40) + "'");
    if (!it.value().is_number() || !std::isfinite(it.value().get<double>()))
      return invalid_argument("'logit_bias' of token " + key + " must be a number");
    out->emplace_back(static_cast<int32_t>(id), it.value().get<float>());
  }
  return Status::Ok();
}

bool integer_within(const Json& x, int64_t lo, uint64_t hi) {
  if (x.is_number_unsigned()) {
    const uint64_t u = x.get<uint64_t>();
    return u <= hi && (lo <= 0 || u >= static_cast<uint64_t>(lo));
  }
  if (!x.is_number_integer()) return false;
  const int64_t i = x.get<int64_t>();
  return i >= lo && (i < 0 || static_cast<uint64_t>(i) <= hi);
}

const Json* FieldReader::get(const std::string& key) {
  read_.insert(key);
  auto it = body_.find(key);
  if (it == body_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool FieldReader::has(const std::string& key) const {
  auto it = body_.find(key);
  return it != body_.end() && !it->is_null();
}

Status FieldReader::read_bool(const std::string& key, bool* out) {
  const Json* v = get(key);
  if (!v) return Status::Ok();
  if (!v->is_boolean()) return invalid_argument("'" + key + "' must be true or false");
  *out = v->get<bool>();
  return Status::Ok();
}

Status FieldReader::read_int(const std::string& key, int32_t* out, int64_t min, int64_t max) {
  const Json* v = get(key);
  if (!v) return Status::Ok();
  // Integers, and numbers such as 5.0 that hold one (some clients send those); unsigned values above
  // INT64_MAX saturate and fail the range check.
  const double d = v->is_number() ? v->get<double>() : 0.5;
  if (!v->is_number_integer() && !(std::floor(d) == d && std::fabs(d) < 9e15))
    return invalid_argument("'" + key + "' must be an integer");
  const int64_t x = v->is_number_unsigned()  ? static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX))
                    : v->is_number_integer() ? v->get<int64_t>()
                                             : static_cast<int64_t>(d);
  if (x < min || x > max)
    return invalid_argument("'" + key + "' must be within [" + std::to_string(min) + ", " + std::to_string(max) +
                            "], got " + json_brief(*v));
  *out = static_cast<int32_t>(x);
  return Status::Ok();
}

Status FieldReader::read_float(const std::string& key, float* out, double min, double max) {
  const Json* v = get(key);
  if (!v) return Status::Ok();
  if (!v->is_number()) return invalid_argument("'" + key + "' must be a number");
  const double x = v->get<double>();
  if (!(x >= min && x <= max))
    return invalid_argument("'" + key + "' must be within [" + std::to_string(min).substr(0, 6) + ", " +
                            std::to_string(max).substr(0, 6) + "], got " + json_brief(*v));
  *out = static_cast<float>(x);
  return Status::Ok();
}

Status FieldReader::read_string(const std::string& key, std::string* out) {
  const Json* v = get(key);
  if (!v) return Status::Ok();
  if (!v->is_string()) return invalid_argument("'" + key + "' must be a string");
  *out = v->get<std::string>();
  return Status::Ok();
}

Status FieldReader::read_u64(const std::string& key, uint64_t* out) {
  const Json* v = get(key);
  if (!v) return Status::Ok();
  if (!v->is_number_integer() || (v->is_number_integer() && !v->is_number_unsigned() && v->get<int64_t>() < 0))
    return invalid_argument("'" + key + "' must be a non-negative integer");
  *out = v->get<uint64_t>();
  return Status::Ok();
}

Status FieldReader::read_strings(const std::string& key, std::vector<std::string>* out) {
  const Json* v = get(key);
  if (!v) return Status::Ok();
  auto add = [&](const Json& s) -> Status {
    if (!s.is_string()) return invalid_argument("'" + key + "' must be a string or a list of strings");
    if (s.get<std::string>().empty()) return invalid_argument("'" + key + "' must not hold empty strings");
    out->push_back(s.get<std::string>());
    return Status::Ok();
  };
  if (v->is_array()) {
    for (const Json& s : *v) KILN_RETURN_IF_ERROR(add(s));
    return Status::Ok();
  }
  return add(*v);
}

void FieldReader::accept(std::initializer_list<const char*> keys) {
  for (const char* k : keys) read_.insert(k);
}

Status FieldReader::refuse_unread(const std::string& what) const {
  for (auto it = body_.begin(); it != body_.end(); ++it)
    if (!read_.count(it.key()))
      return invalid_argument("unknown or unsupported parameter '" + it.key() + "' for " + what);
  return Status::Ok();
}

}  // namespace kiln::serve
