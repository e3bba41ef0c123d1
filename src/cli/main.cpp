// The kiln binary: one subcommand per job; each parses its flags and calls the layers below.
// Every failure prints "kiln: error: <what to do>" on stderr and exits non-zero.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cli/common.h"
#include "cli/config_file.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: train, align and serve large language models", "kiln"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, kiln::cli::Runner>> commands;
  auto add = [&](kiln::cli::Runner (*adder)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    kiln::cli::Runner run = adder(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(run));
  };
  add(kiln::cli::add_generate);
  add(kiln::cli::add_score);
  add(kiln::cli::add_tokenize);
  add(kiln::cli::add_detokenize);
  add(kiln::cli::add_chat_template);
  add(kiln::cli::add_chat);
  add(kiln::cli::add_preprocess);
  add(kiln::cli::add_train);
  add(kiln::cli::add_rl);
  add(kiln::cli::add_demo);
  add(kiln::cli::add_serve);
  add(kiln::cli::add_run_batch);
  add(kiln::cli::add_plot);
  for (auto& [cmd, run] : commands) kiln::cli::add_config_flag(cmd);
  std::vector<std::string> args(argv + 1, argv + argc);
  kiln::Result<std::vector<std::string>> expanded = kiln::cli::expand_config_files(app, args);
  if (!expanded.ok()) {
    std::fprintf(stderr, "kiln: error: %s\n", expanded.status().message().c_str());
    return 2;
  }
  try {
    std::vector<std::string> reversed(expanded->rbegin(), expanded->rend());  // CLI11 takes them reversed
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help
    std::fprintf(stderr, "kiln: error: %s\nRun with --help for more information.\n", e.what());
    return e.get_exit_code();
  }
  // The last error boundary: the layers below return a Status for what they expect to fail; whatever
  // else escapes (a bug, or memory running out in a container) still ends with a message and exit 1.
  try {
    for (auto& [cmd, run] : commands)
      if (cmd->parsed()) return run();
  } catch (const kiln::OutOfMemory& e) {  // an op's temporary buffer: the message names device and size
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kiln: error: out of host memory; use a smaller model, batch or context\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: error: %s (an unexpected failure: please report it)\n", e.what());
    return 1;
  }
  return 2;
}
