// `--config FILE.toml` for every subcommand: the file's top-level keys are the subcommand's long
// flags (dashes or underscores: batch-size or batch_size), their values TOML strings, numbers,
// booleans or arrays (one value per element); the keys of a table [name] are the dotted flags
// --name.key (kiln rl's [reward] table: --reward.command). The file's settings become flags placed
// before the command line's, and a flag given on the command line replaces the file's. A key that
// is not a flag of the subcommand, an unreadable file or a TOML syntax error is an error naming
// the file (and the line).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::cli {

// Documents --config on `cmd` (its value is consumed by expand_config_files).
void add_config_flag(CLI::App* cmd);

// `args` (argv without the program name) with each subcommand's --config FILE replaced by the
// flags the file sets and the command line does not.
Result<std::vector<std::string>> expand_config_files(const CLI::App& app, const std::vector<std::string>& args);

}  // namespace kiln::cli
