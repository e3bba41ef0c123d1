# Writes OUT, a header defining KILN_GIT_REVISION (the source tree's commit, "-dirty" with local
# changes to tracked files, "unknown" outside a git checkout). Run at every build by the kiln_revision
# target (src/CMakeLists.txt); the file is rewritten only when the text changes, so only the version
# source recompiles, and only when the revision moves.
execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR rev STREQUAL "")
  set(rev "unknown")
else()
  execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT changes STREQUAL "")
    string(APPEND rev "-dirty")
  endif()
endif()
set(text "#define KILN_GIT_REVISION \"${rev}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
