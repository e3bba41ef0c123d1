// kiln --version (see common.h).
#include <string>

#include "cli/common.h"
#include "kiln_revision.h"  // KILN_GIT_REVISION, written by cmake/revision.cmake at every build

namespace kiln::cli {

std::string version_text() {
  std::string text = std::string("kiln ") + KILN_VERSION + " (git " + KILN_GIT_REVISION + ", ";
#ifdef KILN_WITH_CUDA
  text += std::string("CUDA on: ") + KILN_CUDA_TARGETS;
#else
  text += "CUDA off";
#endif
  return text + ")";
}

}  // namespace kiln::cli
