// FieldReader: typed, checked access to the fields of a request body, remembering which fields were
// read so that a field kiln does not know is refused instead of silently ignored.
// Thread safety: one per request body.
#pragma once

#include <set>
#include <string>

#include "serve/api.h"

namespace kiln::serve {

class FieldReader {
 public:
  explicit FieldReader(const Json& body) : body_(body) {}

  // The field (marked as read); null when absent or JSON null.
  const Json* get(const std::string& key);
  bool has(const std::string& key) const;  // present and not null
  // Typed reads: absent or null leaves *out as it is; a wrong type or range is an error naming the field.
  Status read_bool(const std::string& key, bool* out);
  Status read_int(const std::string& key, int32_t* out, int64_t min, int64_t max);
  Status read_float(const std::string& key, float* out, double min, double max);
  Status read_string(const std::string& key, std::string* out);
  Status read_u64(const std::string& key, uint64_t* out);  // non-negative integers (seeds)
  // A string or a list of strings (stop sequences).
  Status read_strings(const std::string& key, std::vector<std::string>* out);
  // Marks fields as read whatever they hold (accepted without effect, e.g. "user").
  void accept(std::initializer_list<const char*> keys);
  // An error naming the first field that was never read.
  Status refuse_unread(const std::string& what) const;

 private:
  const Json& body_;
  std::set<std::string> read_;
};

// The string `key` of `object`, or "" where `object` is no object or the field is absent or not a
// string: for comparing a field with the values it may take, the caller reporting a mismatch
// (nlohmann's value() throws on a field of another type).
std::string string_member(const Json& object, const char* key);

// Whether x is a JSON integer within [lo, hi], read without wrapping (unsigned values above
// INT64_MAX are not negative; a cast to a narrower type would wrap onto another value).
bool integer_within(const Json& x, int64_t lo, uint64_t hi);

// OpenAI's logit_bias: {"<token id>": bias, ...} (null or {}: none) as (id, bias) pairs in key
// order; errors name the key. The engine checks the ids against the vocabulary and the range.
Status read_logit_bias(const Json& v, std::vector<std::pair<int32_t, float>>* out);

}  // namespace kiln::serve
