// The kiln binary: one subcommand per job; each parses its flags and calls the layers below.
// Every failure prints "kiln: error: <what to do>" on stderr and exits non-zero.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cli/common.h"
#include "cli/config_file.h"

namespace {

// Edits (insertions, deletions, substitutions) turning a into b: the nearest command to a typo.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

const CLI::App* find_command(const CLI::App& app, const std::string& name) {
  for (const CLI::App* c : app.get_subcommands({}))
    if (c->get_name() == name) return c;
  return nullptr;
}

// "kiln bogus": says so, with the nearest command when one is close; exit 2 like other usage errors.
int unknown_command(const CLI::App& app, const std::string& name) {
  std::string nearest;
  size_t best = std::max<size_t>(2, name.size() / 3) + 1;
  for (const CLI::App* c : app.get_subcommands({})) {
    const size_t d = edit_distance(name, c->get_name());
    if (d < best) best = d, nearest = c->get_name();
  }
  std::fprintf(stderr, "kiln: error: '%s' is not a kiln command%s; 'kiln help' lists them\n", name.c_str(),
               nearest.empty() ? "" : (" (did you mean '" + nearest + "'?)").c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: train, align and serve large language models", "kiln"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kiln::cli::version_text(), "print kiln's version and build, then exit");
  app.footer("Run 'kiln help COMMAND' or 'kiln COMMAND --help' for a command's flags.");
  std::vector<std::pair<CLI::App*, kiln::cli::Runner>> commands;
  auto add = [&](kiln::cli::Runner (*adder)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    kiln::cli::Runner run = adder(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(run));
  };
  add(kiln::cli::add_generate);
  add(kiln::cli::add_score);
  add(kiln::cli::add_eval);
  add(kiln::cli::add_info);
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
  // Before flags are parsed: the help command, a missing or unknown command.
  if (args.empty()) {
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  if (args[0] == "help") {
    if (args.size() == 1) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    const CLI::App* cmd = find_command(app, args[1]);
    if (!cmd) return unknown_command(app, args[1]);
    std::fputs(cmd->help("kiln").c_str(), stdout);
    return 0;
  }
  if (args[0].empty() || args[0][0] != '-') {
    if (!find_command(app, args[0])) return unknown_command(app, args[0]);
  } else if (args[0] != "-h" && args[0] != "--help" && args[0] != "--version") {
    std::fprintf(stderr, "kiln: error: '%s' is not a flag of kiln itself: flags follow the command "
                 "('kiln COMMAND --help' lists them)\n", args[0].c_str());
    return 2;
  }
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
