// Flags shared by kiln serve and kiln run-batch: how requests are read (served model name, chat
// template, tool-call format, limits). The HTTP-only flags are serve's own (cli/serve.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include "serve/server.h"

namespace kiln::cli {

struct ServeFlags {
  serve::ServerOptions options;
  void add(CLI::App* cmd);
};

}  // namespace kiln::cli
