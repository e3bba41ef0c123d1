// The lexer of kiln's Jinja (internal to src/model/jinja/). It follows jinja2's lexer (lexer.py)
// rule by rule: `{%-`/`-%}` strip all whitespace, lstrip_blocks removes spaces/tabs between a line
// start and `{%` or `{#` (not `{{`), trim_blocks removes one newline after `%}` or `#}`, and `+`
// disables either; brackets must balance inside tags. The caller has normalised newlines to \n and
// dropped one trailing newline. Thread safety: pure function.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::jinja {

enum class TT { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Tok {
  TT type;
  std::string v;
  int line;
};

// The tokens of `src`, ending with Eof; errors read "chat template NAME, line N: ...".
Result<std::vector<Tok>> lex(const std::string& src, const std::string& name);

}  // namespace kiln::jinja
