// Small wording helpers for messages: counts with the right noun form ("1 step", "2 steps") and a
// JSON value's kind with its article ("an array", "a string"). Pure functions, no state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

// "1 step", "3 steps": `noun` is the singular; the plural adds "s" unless given.
inline std::string count_of(int64_t n, std::string_view noun, std::string_view plural = {}) {
  std::string out = std::to_string(n) + " ";
  if (n == 1) return out + std::string(noun);
  return out + (plural.empty() ? std::string(noun) + "s" : std::string(plural));
}

// "an array", "an object", "a number": nlohmann::json::type_name() with its article.
inline std::string with_article(std::string_view kind) {
  const bool vowel = !kind.empty() && std::string_view("aeiou").find(kind[0]) != std::string_view::npos;
  return (vowel ? "an " : "a ") + std::string(kind);
}

}  // namespace kiln
