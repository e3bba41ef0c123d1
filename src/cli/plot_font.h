// kiln plot's bitmap font: printable ASCII in cells of 5 x 9 pixels (7 rows above the baseline,
// 2 of descenders), drawn by Canvas::text at an integer scale. The glyphs are kiln's own design.
// Thread safety: a constant table.
#pragma once

namespace kiln::cli {

constexpr int kGlyphWidth = 5, kGlyphRows = 9, kGlyphAscent = 7;

// The rows of character c, top first, each kGlyphWidth characters of '#' (ink) or '.'; characters
// outside printable ASCII get '?'.
const char* const* glyph_rows(char c);

}  // namespace kiln::cli
