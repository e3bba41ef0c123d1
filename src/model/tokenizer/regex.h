// Regular expressions of tokenizer.json. The `tokenizers` library runs them with Oniguruma (Ruby
// syntax); kiln translates each pattern into PCRE2 syntax with every Unicode class (\p{..}, \w,
// \s, \d, \h, POSIX brackets, bracket expressions with nesting and &&) spelled out as code point
// sets of kiln's Unicode 16.0 tables (unicode_data.h), so that matches follow Oniguruma's data and
// definitions rather than PCRE2's, and compiles it with PCRE2 (UTF, ^ and $ at line breaks as in
// Ruby, JIT when available).
// Ownership: a Regex owns its compiled code. Thread safety: immutable after compile; find_all may
// run from several threads (match data is per call).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/tokenizer/unicode_data.h"

namespace kiln::tok {

class Regex {
 public:
  // `pattern` in Oniguruma syntax; an invalid one is an error naming the pattern and the position.
  static Result<std::unique_ptr<Regex>> compile(const std::string& pattern);
  ~Regex();
  // The non-overlapping matches (byte offsets) in `subject`, empty matches handled like Rust's
  // find_iter (an empty match right after the previous match is skipped).
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// The general categories of the linked PCRE2's own Unicode data (index: ucd::kCategoryNames), as
// sorted ranges. A class written with \p{..} items runs far faster in PCRE2 than one of hundreds of
// ranges, so the translation uses them where they equal kiln's tables up to a few corrections.
struct NativeCategories {
  std::array<std::vector<ucd::Range>, 30> ranges;
};
// Found once per process by matching each category over a string of every code point.
const NativeCategories& pcre2_native_categories();

// The PCRE2 pattern with the meaning of an Oniguruma one; without `native`, classes are written as
// explicit ranges only (exposed for tests).
Result<std::string> onig_to_pcre2(std::string_view pattern, const NativeCategories* native = nullptr);

// Escapes a literal so that it matches verbatim as an Oniguruma pattern.
std::string regex_escape(std::string_view literal);

}  // namespace kiln::tok
