#include "fuzz_common.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace kiln::fuzz {

std::string write_input(const char* target, const uint8_t* data, size_t size) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln-fuzz-" + std::to_string(getpid()) + "-" + target)).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

void invariant_failed(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: invariant failed: %s\n", target, what.c_str());
  std::abort();
}

}  // namespace kiln::fuzz
