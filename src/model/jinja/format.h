// Python's string formatting for the chat-template interpreter, one implementation behind the `%`
// operator and |format (printf-style), str.format (replacement fields and the format-spec
// mini-language) and the round filter. Floats are formatted by the C library's printf, which rounds
// the exact binary value correctly (half to even), as Python's formatting and round() do.
// Errors (Python's TypeError / ValueError / KeyError) are invalid_argument with Python's message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "model/jinja/value.h"

namespace kiln::jinja {

struct Interp;

// format(v, spec): the format-spec mini-language ([[fill]align][sign][#][0][width][,_][.precision][type]).
Result<std::string> format_value(const Value& v, const std::string& spec);
// fmt % args: a tuple gives the positional values, a dict the %(name)s ones, anything else is the one value.
Result<std::string> percent_format(const std::string& fmt, const Value& args);
// fmt.format(*a.pos, **a.kw): {}, {0}, {name}, {0.attr}, {0[key]} (looked up as the template would),
// !r / !s / !a conversions and a spec (which may hold {} fields itself).
Result<std::string> brace_format(Interp& in, const std::string& fmt, const Args& a);
// Python's int(text, base): whitespace around, a sign, '_' between digits, a 0x / 0o / 0b prefix
// matching the base (base 0: the prefix decides). nullopt: not an int; an error: one past 64 bits.
Result<std::optional<int64_t>> py_parse_int(const std::string& text, int64_t base);
// Python's float(text): whitespace around, '_' between digits, inf / infinity / nan; nullopt when not a float.
std::optional<double> py_parse_float(const std::string& text);
// A markupsafe Markup's `%` arguments: each value (a tuple's items, a dict's values) that is not a
// number becomes its escaped text.
Value escape_format_args(const Value& args);
// Python's round(x, ndigits) of a float.
double py_round(double x, int64_t ndigits);
// Python's round(x, ndigits) of an int (ndigits < 0 rounds to tens, hundreds, ... half to even);
// an error where the result does not fit in 64 bits.
Result<int64_t> py_round_int(int64_t x, int64_t ndigits);

}  // namespace kiln::jinja
