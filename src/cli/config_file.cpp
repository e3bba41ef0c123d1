// --config (see config_file.h): toml++ parses the file; its keys become flags of the subcommand.
#include "cli/config_file.h"

#include <toml++/toml.h>

#include <cstdio>
#include <functional>
#include <fstream>
#include <sstream>

namespace kiln::cli {
namespace {

Result<std::string> scalar(const std::string& where, const toml::node& v) {
  if (v.is_string()) return *v.value<std::string>();
  if (v.is_integer()) return std::to_string(*v.value<int64_t>());
  if (v.is_floating_point()) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.17g", *v.value<double>());
    return std::string(buf);
  }
  if (v.is_boolean()) return std::string(*v.value<bool>() ? "true" : "false");
  return invalid_argument(where + " must be a string, number or boolean");
}

// Whether the command line sets --name (as "--name", "--name=v").
bool given(const std::vector<std::string>& args, const std::string& flag) {
  for (const auto& a : args)
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  return false;
}

}  // namespace

void add_config_flag(CLI::App* cmd) {
  cmd->add_option("--config", "TOML file of flags: keys are the long flag names; the command line overrides it");
}

Result<std::vector<std::string>> expand_config_files(const CLI::App& app, const std::vector<std::string>& args) {
  // The subcommand is the first argument naming one (kiln's flags all belong to subcommands).
  const CLI::App* sub = nullptr;
  size_t sub_at = 0;
  for (size_t i = 0; i < args.size() && !sub; ++i) {
    for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
      if (s->get_name() == args[i]) { sub = s; sub_at = i; }
  }
  if (!sub) return args;
  std::vector<std::string> rest(args.begin() + static_cast<std::ptrdiff_t>(sub_at) + 1, args.end());
  std::string path;
  std::vector<std::string> command_line;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == "--config" && i + 1 < rest.size()) { path = rest[++i]; continue; }
    if (rest[i].rfind("--config=", 0) == 0) { path = rest[i].substr(9); continue; }
    command_line.push_back(rest[i]);
  }
  if (path.empty()) return args;
  std::ifstream in(path);
  if (!in) return io_error("cannot read the config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  toml::table root;
  try {
    root = toml::parse(ss.str(), path);
  } catch (const toml::parse_error& e) {
    return invalid_argument("config file '" + path + "', line " + std::to_string(e.source().begin.line) + ": " +
                            std::string(e.description()));
  }
  std::vector<std::string> out(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(sub_at) + 1);
  // Keys of a table [name] are the dotted flags --name.key (kiln rl's --reward.command); a table
  // that is the value of a JSON-object flag (--objective-kwargs) is passed on as JSON.
  std::function<Status(const std::string&, const toml::table&)> add = [&](const std::string& prefix,
                                                                           const toml::table& table) -> Status {
    for (const auto& [key, node] : table) {
      std::string name = prefix + std::string(key.str());
      for (char& c : name)
        if (c == '_') c = '-';
      const std::string where = "config file '" + path + "': '" + prefix + std::string(key.str()) + "'";
      const std::string flag = "--" + name;
      const bool json_flag = name.size() > 7 && name.compare(name.size() - 7, 7, "-kwargs") == 0;
      if (node.is_table() && !(json_flag && sub->get_option_no_throw(flag))) {
        KILN_RETURN_IF_ERROR(add(name + ".", *node.as_table()));
        continue;
      }
      if (name == "config" || !sub->get_option_no_throw(flag))
        return invalid_argument(where + " is not a flag of kiln " + sub->get_name() + " (see kiln " +
                                sub->get_name() + " --help)");
      if (given(command_line, flag)) continue;  // the command line wins
      if (const toml::table* t = node.as_table()) {
        std::ostringstream json;
        json << toml::json_formatter{*t};
        out.push_back(flag + "=" + json.str());
      } else if (const toml::array* arr = node.as_array()) {
        for (const auto& v : *arr) {
          KILN_ASSIGN_OR_RETURN(std::string s, scalar(where, v));
          out.push_back(flag + "=" + s);
        }
      } else {
        KILN_ASSIGN_OR_RETURN(std::string s, scalar(where, node));
        out.push_back(flag + "=" + s);
      }
    }
    return Status::Ok();
  };
  KILN_RETURN_IF_ERROR(add("", root));
  out.insert(out.end(), command_line.begin(), command_line.end());
  return out;
}

}  // namespace kiln::cli
