// JSON values of outside origin (request bodies, data lines, config files, a reward server's
// replies) measured and quoted without recursion: copying or printing an nlohmann value recurses as
// deep as it nests, so a line of 100,000 nested brackets would end the process where a message
// quoted it. Header-only templates over nlohmann::json and ordered_json; no state.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/plural.h"
#include "core/status.h"

namespace kiln {

// Nesting depth of a JSON value (a scalar is 1), found without recursion.
template <typename Json>
int64_t json_depth(const Json& root) {
  int64_t deepest = 0;
  std::vector<std::pair<const Json*, int64_t>> stack = {{&root, 1}};
  while (!stack.empty()) {
    auto [j, d] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, d);
    if (j->is_array() || j->is_object())
      for (const auto& e : *j) stack.emplace_back(&e, d + 1);
  }
  return deepest;
}

// invalid_argument "<what> nests deeper than <limit> levels" where `v` does, else Ok: for values
// about to be copied or printed (both recurse as deep as they nest).
template <typename Json>
Status check_nesting(const Json& v, int64_t limit, const std::string& what) {
  if (json_depth(v) <= limit) return Status::Ok();
  return invalid_argument(what + " nests deeper than " + std::to_string(limit) + " levels");
}

// A value as a message quotes it: its compact JSON text when it nests at most 8 levels and holds at
// most 64 elements, cut at a character boundary after `max_bytes` bytes ("..." marks the cut);
// otherwise its kind and size ("an array of 3 values nested 100000 levels deep"). Equal to dump()
// for the short values messages usually quote.
template <typename Json>
std::string json_brief(const Json& v, size_t max_bytes = 80) {
  if (v.is_array() || v.is_object()) {
    const int64_t depth = json_depth(v);
    if (depth > 8 || v.size() > 64) {
      std::string s = with_article(v.type_name()) + " of " +
                      count_of(static_cast<int64_t>(v.size()), v.is_array() ? "value" : "key");
      if (depth > 8) s += " nested " + std::to_string(depth) + " levels deep";
      return s;
    }
  }
  std::string s = v.dump();
  if (s.size() <= max_bytes) return s;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  return s.substr(0, cut) + "...";
}

}  // namespace kiln
