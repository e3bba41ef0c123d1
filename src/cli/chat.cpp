// kiln chat: an interactive conversation with a model through its chat template, the reply
// streaming as it is generated. One user message per input line; /reset clears the conversation,
// /exit (or end of input) quits. Each turn renders the whole conversation and prefills it again
// (prefix reuse comes with the paged engine).
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "cli/common.h"
#include "infer/generator.h"

namespace kiln::cli {

Runner add_chat(CLI::App& app) {
  struct Flags {
    ModelFlags model;
    std::string system, template_name;
    int32_t max_tokens = 512;
    SamplingFlags sampling{0.7f, 0.95f};
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* c = app.add_subcommand("chat", "chat with a model: one user message per line of input, replies stream");
  f->model.add(c, "");
  c->add_option("--system", f->system, "a system prompt");
  c->add_option("--template", f->template_name, "a named chat template of the folder");
  c->add_option("--max-tokens", f->max_tokens, "most new tokens per reply")->capture_default_str();
  f->sampling.add(c);
  c->add_flag("--json", f->json, "print one JSON object per turn (prompt, ids, reply) instead of streaming");
  return [f]() -> int {
    if (f->model.model_dir.empty()) return fail(invalid_argument("kiln chat needs --model DIR"));
    Result<ops::SamplingRow> sampling = f->sampling.params();
    if (!sampling.ok()) return fail(sampling.status());
    Result<LoadedModel> l = load_model(f->model);
    if (!l.ok()) return fail(l.status());
    Result<ModelText> text = ModelText::load(f->model.model_dir);
    if (!text.ok()) return fail(text.status());
    Result<const ChatTemplate*> tmpl = text->chat_template(f->template_name, false);
    if (!tmpl.ok()) return fail(tmpl.status());

    GenerateOptions opts;
    opts.max_new_tokens = f->max_tokens;
    opts.sampling = *sampling;
    opts.stop_ids = text->stop_ids();
    for (int32_t id : l->model->config().eos_token_ids) opts.stop_ids.push_back(id);

    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!f->system.empty()) messages.push_back({{"role", "system"}, {"content", f->system}});
    const bool interactive = isatty(STDIN_FILENO);
    std::string line;
    for (uint64_t turn = 0;; ++turn) {
      if (interactive) std::fprintf(stderr, "> "), std::fflush(stderr);
      if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
      if (line == "/reset") {
        messages.erase(messages.begin() + (f->system.empty() ? 0 : 1), messages.end());
        continue;
      }
      messages.push_back({{"role", "user"}, {"content", line}});
      Result<std::string> prompt = text->render_chat(messages, nullptr, true, f->template_name);
      if (!prompt.ok()) return fail(prompt.status());
      Result<std::vector<int32_t>> ids = text->tokenizer().encode(*prompt, /*add_special_tokens=*/false);
      if (!ids.ok()) return fail(ids.status());
      Status valid = check_token_ids(*ids, l->model->config().vocab_size, "the rendered conversation");
      if (!valid.ok()) return fail(valid);
      Result<std::unique_ptr<Generator>> gen =
          Generator::create(*l->model, static_cast<int32_t>(ids->size()) + std::max(opts.max_new_tokens, 1));
      if (!gen.ok()) return fail(gen.status());
      TextStreamer stream(text->tokenizer());
      // A fresh draw sequence per turn, still reproducible from --seed.
      ops::set_sampling_seed(opts.sampling, ops::sampling_seed(opts.sampling) + turn);
      Result<GenerateResult> r =
          (*gen)->generate(*ids, opts, [&](int32_t id) { return f->json ? true : stream.push(id); });
      if (!r.ok()) return fail(r.status());
      if (!stream.status().ok()) return fail(stream.status());
      Result<std::string> reply = text->tokenizer().decode(r->tokens, /*skip_special_tokens=*/true);
      if (!reply.ok()) return fail(reply.status());
      if (f->json) {
        nlohmann::ordered_json out = {{"prompt", *prompt}, {"ids", r->tokens}, {"reply", *reply},
                                      {"finish_reason", r->finish_reason}};
        std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << std::endl;
      } else {
        stream.finish();
      }
      messages.push_back({{"role", "assistant"}, {"content", *reply}});
    }
    return 0;
  };
}

}  // namespace kiln::cli
