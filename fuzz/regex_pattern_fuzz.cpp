// Fuzz target (fuzz_common.h): the input is an Oniguruma pattern, optionally followed by a NUL and
// a subject. Compiling may fail with a Status; a pattern that compiles must match the subject (and
// a fixed multilingual text) with ordered, non-overlapping matches on UTF-8 character boundaries.
#include <string>

#include "fuzz_common.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/unicode.h"

int kiln::fuzz::regex_pattern(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string pattern = input.substr(0, nul);
  std::string subject = nul == std::string::npos ? "" : input.substr(nul + 1);
  if (!tok::valid_utf8(subject)) subject = tok::utf8_lossy(subject);
  auto re = tok::Regex::compile(pattern);
  if (!re.ok()) return 0;
  std::vector<std::pair<size_t, size_t>> m;
  for (const std::string& s : {subject, std::string("Hello world's 123 \r\n ü 你好 \t x\u00b2 \U0001F600 ABC")}) {
    (*re)->find_all(s, m);
    size_t last = 0;
    for (const auto& [a, b] : m) {
      if (a < last || b < a || b > s.size()) invariant_failed("regex_pattern", "matches out of order or outside the subject");
      auto boundary = [&](size_t i) { return i == s.size() || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80; };
      if (!boundary(a) || !boundary(b)) invariant_failed("regex_pattern", "a match splits a UTF-8 character");
      last = b;
    }
  }
  return 0;
}

KILN_FUZZ_ENTRY(regex_pattern)
