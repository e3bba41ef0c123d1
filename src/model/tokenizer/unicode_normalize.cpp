// Unicode normalization (UAX #15) over the tables of unicode_data.h: full decomposition, canonical
// ordering of combining marks, canonical composition, Hangul syllables by arithmetic.
// Thread safety: pure functions.
#include <algorithm>
#include <vector>

#include "model/tokenizer/unicode.h"
#include "model/tokenizer/unicode_data.h"

namespace kiln::tok {
namespace {

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint16_t combining_class(char32_t c) {
  return c < 0x300 ? 0 : ucd::value_of(ucd::kNormCombiningClass, c, 0);
}

void decompose(char32_t c, bool compat, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const ucd::Mapping* m = nullptr;
  if (c >= 0xA0) {
    if (compat) m = ucd::mapping_of(ucd::kNormCompatibility, c);
    if (!m) m = ucd::mapping_of(ucd::kNormCanonical, c);
  }
  if (!m) {
    out.push_back(c);
    return;
  }
  for (uint32_t k = 0; k < m->length; ++k) out.push_back(ucd::kNormDecompositionPool[m->offset + k]);
}

// The primary composite of (a, b), or 0.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto table = ucd::kNormComposition;
  auto it = std::lower_bound(table.begin(), table.end(), std::pair{a, b}, [](const ucd::Composition& x, std::pair<char32_t, char32_t> key) {
    return x.first != key.first ? x.first < key.first : x.second < key.second;
  });
  return it != table.end() && it->first == a && it->second == b ? it->composite : 0;
}

// Composes in place: each character joins the last starter unless a character between them
// blocks it (one of combining class 0 or of a class not below its own).
void compose(std::vector<char32_t>& cps) {
  size_t out = 0;
  ptrdiff_t starter = -1;
  uint16_t last_class = 0;
  for (char32_t c : cps) {
    uint16_t cc = combining_class(c);
    if (starter >= 0) {
      bool adjacent = static_cast<ptrdiff_t>(out) == starter + 1;
      if (adjacent || (last_class != 0 && last_class < cc)) {
        if (char32_t comp = compose_pair(cps[static_cast<size_t>(starter)], c)) {
          cps[static_cast<size_t>(starter)] = comp;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<ptrdiff_t>(out);
    last_class = cc;
    cps[out++] = c;
  }
  cps.resize(out);
}

}  // namespace

std::string normalize_form(std::string_view s, int form) {
  bool ascii = true;
  for (char ch : s) {
    if (static_cast<unsigned char>(ch) >= 0x80) { ascii = false; break; }
  }
  if (ascii) return std::string(s);  // ASCII is invariant under all four forms
  const bool compat = form >= 2, composed = form == 0 || form == 2;
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t first = cps.size();
    decompose(next_cp(s, i), compat, cps);
    // Canonical ordering: each new non-starter moves before the marks of a higher class.
    for (size_t k = first; k < cps.size(); ++k) {
      uint16_t cc = combining_class(cps[k]);
      if (cc == 0) continue;
      for (size_t j = k; j > 0 && combining_class(cps[j - 1]) > cc; --j) std::swap(cps[j], cps[j - 1]);
    }
  }
  if (composed) compose(cps);
  std::string out;
  out.reserve(s.size());
  for (char32_t c : cps) append_utf8(out, c);
  return out;
}

}  // namespace kiln::tok
