// kiln tokenize, kiln detokenize, kiln chat-template: the text side of a model folder.
#include <nlohmann/json.hpp>

#include <iostream>

#include "cli/common.h"

namespace kiln::cli {
namespace {

// JSON output; invalid UTF-8 (which decode never produces) would be replaced, not thrown.
void print_json(const nlohmann::ordered_json& j) {
  std::cout << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << std::endl;
}

struct TokenizerFlags {
  std::string model_dir, tokenizer_file;
  void add(CLI::App* cmd) {
    auto* m = cmd->add_option("--model", model_dir, "model folder holding tokenizer.json (and tokenizer_config.json)");
    auto* t = cmd->add_option("--tokenizer", tokenizer_file, "a tokenizer.json file");
    m->excludes(t);
  }
  Result<ModelText> load() const {
    if (!tokenizer_file.empty()) return ModelText::load_tokenizer_file(tokenizer_file);
    if (!model_dir.empty()) return ModelText::load(model_dir);
    return invalid_argument("give --model DIR or --tokenizer FILE");
  }
};

}  // namespace

Runner add_tokenize(CLI::App& app) {
  struct Flags {
    TokenizerFlags tok;
    bool add_special = false;
    std::string text;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* c = app.add_subcommand("tokenize", "encode text (--text, or stdin) to ids; prints {\"ids\": [...]}");
  f->tok.add(c);
  c->add_flag("--add-special", f->add_special, "add the post-processor's special tokens (e.g. BOS)");
  c->add_option("--text", f->text, "the text (default: all of stdin)");
  return [f, c]() -> int {
    Result<ModelText> t = f->tok.load();
    if (!t.ok()) return fail(t.status());
    std::string text = f->text;
    if (c->count("--text") == 0) {
      Result<std::string> in = read_text("-");
      if (!in.ok()) return fail(in.status());
      text = std::move(in).value();
    }
    Result<std::vector<int32_t>> ids = t->tokenizer().encode(text, f->add_special);
    if (!ids.ok()) return fail(ids.status());
    print_json({{"ids", *ids}});
    return 0;
  };
}

Runner add_detokenize(CLI::App& app) {
  struct Flags {
    TokenizerFlags tok;
    std::string ids;
    bool skip_special = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* c = app.add_subcommand("detokenize", "decode ids to text; prints {\"text\": \"...\"}");
  f->tok.add(c);
  c->add_option("--ids", f->ids, "token ids, comma separated")->required();
  c->add_flag("--skip-special", f->skip_special, "leave special tokens out of the text");
  return [f]() -> int {
    Result<ModelText> t = f->tok.load();
    if (!t.ok()) return fail(t.status());
    Result<std::vector<int32_t>> ids = parse_ids(f->ids, "--ids");
    if (!ids.ok()) return fail(ids.status());
    Result<std::string> text = t->tokenizer().decode(*ids, f->skip_special);
    if (!text.ok()) return fail(text.status());
    print_json({{"text", *text}});
    return 0;
  };
}

Runner add_chat_template(CLI::App& app) {
  struct Flags {
    std::string model_dir, messages_file, tools_file, template_name;
    bool add_generation_prompt = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* c = app.add_subcommand("chat-template", "render a conversation with the model's chat template; prints {\"prompt\": \"...\"}");
  c->add_option("--model", f->model_dir, "model folder (tokenizer.json, tokenizer_config.json, chat_template.jinja)")->required();
  c->add_option("--messages", f->messages_file, "JSON file with the list of messages (- for stdin)")->required();
  c->add_option("--tools", f->tools_file, "JSON file with the list of tool definitions");
  c->add_option("--template", f->template_name, "a named template of the folder (e.g. tool_use)");
  c->add_flag("--add-generation-prompt", f->add_generation_prompt, "end with the assistant turn's opening");
  return [f]() -> int {
    Result<ModelText> t = ModelText::load(f->model_dir);
    if (!t.ok()) return fail(t.status());
    auto read_json = [](const std::string& path, const char* what) -> Result<nlohmann::ordered_json> {
      KILN_ASSIGN_OR_RETURN(std::string text, read_text(path));
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
      if (j.is_discarded() || !j.is_array())
        return invalid_argument(std::string(what) + " file " + path + " must hold a JSON list");
      return j;
    };
    Result<nlohmann::ordered_json> messages = read_json(f->messages_file, "--messages");
    if (!messages.ok()) return fail(messages.status());
    nlohmann::ordered_json tools;  // null: no tools
    if (!f->tools_file.empty()) {
      Result<nlohmann::ordered_json> tl = read_json(f->tools_file, "--tools");
      if (!tl.ok()) return fail(tl.status());
      tools = std::move(tl).value();
    }
    Result<std::string> prompt = t->render_chat(*messages, tools, f->add_generation_prompt, f->template_name);
    if (!prompt.ok()) return fail(prompt.status());
    print_json({{"prompt", *prompt}});
    return 0;
  };
}

}  // namespace kiln::cli
