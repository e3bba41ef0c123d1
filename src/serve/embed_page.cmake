# Writes OUTPUT, a C++ source defining kiln::serve::chat_page_html() with the bytes of INPUT.
# The page is split into raw-string pieces so that no piece comes near compiler literal limits.
file(READ ${INPUT} page)
string(FIND "${page}" ")kiln_page\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )kiln_page\"")
endif()
string(LENGTH "${page}" n)
set(body "")
set(pos 0)
while(pos LESS n)
  string(SUBSTRING "${page}" ${pos} 8000 piece)
  string(APPEND body "    R\"kiln_page(${piece})kiln_page\"\n")
  math(EXPR pos "${pos} + 8000")
endwhile()
file(WRITE ${OUTPUT} "// Generated from serve/chat_page.html by serve/embed_page.cmake: do not edit.\n"
     "#include <string_view>\n\nnamespace kiln::serve {\n\nstd::string_view chat_page_html() {\n"
     "  static constexpr char kPage[] =\n${body}      \"\";\n  return {kPage, sizeof(kPage) - 1};\n}\n\n}  // namespace kiln::serve\n")
