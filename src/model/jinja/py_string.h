// Python's str operations by code point, for the chat-template interpreter's methods and filters
// (builtins.cpp, filters.cpp): whitespace, case mapping (utf8proc), strip, split, replace, length,
// and HTML escaping as Jinja's `escape` (markupsafe) does it. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/jinja/value.h"

namespace kiln::jinja {

// str.isspace() of one code point.
bool py_space(char32_t c);
char32_t py_upper(char32_t c);
char32_t py_lower(char32_t c);
// A code point with an upper or lower case form.
bool cased_letter(char32_t c);
// str.upper() / str.lower().
std::string map_case(const std::string& s, bool upper);
// str.strip / lstrip / rstrip with optional `chars` (a string Value; else whitespace).
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
// str.split(sep, maxsplit): sep absent or none splits on runs of whitespace; maxsplit < 0: no limit.
// str.split; stops after max_parts + 1 parts (more than the caller allows: it then refuses them).
std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit,
                                  size_t max_parts = SIZE_MAX);
// str.replace(a, b, count): count < 0 replaces every occurrence.
std::string py_replace(const std::string& s, const std::string& a, const std::string& b, int64_t count);
std::string html_escape(const std::string& s);
// markupsafe.escape(v): a Markup as it is, anything else printed (str()) and HTML-escaped into a Markup.
Value markup_escape(const Value& v);
// len(str): code points of UTF-8 text.
int64_t str_len(const std::string& s);

}  // namespace kiln::jinja
