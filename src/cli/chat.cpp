// kiln chat: an interactive conversation with a model through its chat template, the reply
// streaming as it is generated. One user message per input line (empty lines are skipped; a line
// starting "//" sends the text after the first "/"); /reset clears the conversation, /help lists the
// commands, /exit (or end of input) quits; unknown /commands are reported, never sent. Each turn renders the whole conversation and submits it to the
// engine, whose radix cache holds the earlier turns' KV: only the new text is prefilled. A message the
// model cannot take (not UTF-8, beyond the context, refused by the template or the engine) is
// reported and left out of the conversation, which goes on; the exit status is then 1.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "model/tokenizer/unicode.h"

namespace kiln::cli {

Runner add_chat(CLI::App& app) {
  struct Flags {
    ModelFlags model;
    std::string system, template_name;
    int32_t max_tokens = 512;
    SamplingFlags sampling{0.7f, 0.95f};
    bool json = false;
    EngineFlags engine;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* c = app.add_subcommand("chat", "chat with a model: one user message per line of input, replies stream");
  f->model.add(c, "");
  c->add_option("--system", f->system, "a system prompt");
  c->add_option("--template", f->template_name, "a named chat template of the folder");
  c->add_option("--max-tokens", f->max_tokens, "most new tokens per reply")->capture_default_str();
  f->sampling.add(c);
  c->add_flag("--json", f->json, "print one JSON object per turn (prompt, ids, reply) instead of streaming");
  f->engine.add(c);
  f->engine.add_generation_config(c);
  return [f]() -> int {
    if (f->model.model_dir.empty()) return fail(invalid_argument("kiln chat needs --model DIR"));
    GenerationRequest base;
    Status st = f->sampling.apply(&base);
    if (!st.ok()) return fail(st);
    if (f->max_tokens < 1) return fail(invalid_argument("--max-tokens must be at least 1"));
    base.max_tokens = f->max_tokens;
    Result<std::unique_ptr<EngineSession>> started = start_engine(f->model, f->engine, /*need_text=*/true);
    if (!started.ok()) return fail(started.status());
    EngineSession& s = **started;
    f->sampling.prefer_model_defaults(s.sampling_defaults, &base);
    Result<const ChatTemplate*> tmpl = s.text->chat_template(f->template_name, false);
    if (!tmpl.ok()) return fail(tmpl.status());

    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!f->system.empty()) messages.push_back({{"role", "system"}, {"content", f->system}});
    const bool interactive = isatty(STDIN_FILENO);
    // The seed on stderr (stdout holds only replies): --seed repeats a conversation exactly.
    std::fprintf(stderr, "kiln chat: seed %llu; /help lists the commands\n", static_cast<unsigned long long>(base.seed));
    std::string line;
    int failed_turns = 0;
    // A turn that fails loses only its own message: the conversation before it is kept.
    auto turn_failed = [&](const std::string& why) {
      messages.erase(messages.end() - 1);
      std::fprintf(stderr, "kiln chat: error: %s (the message is left out; the conversation goes on, /reset clears it)\n",
                   why.c_str());
      if (f->json)
        std::cout << nlohmann::ordered_json{{"error", why}}.dump(-1, ' ', false,
                                                                 nlohmann::ordered_json::error_handler_t::replace)
                  << std::endl;
      failed_turns++;
    };
    for (uint64_t turn = 0;;) {
      if (interactive) std::fprintf(stderr, "> "), std::fflush(stderr);
      if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // nothing to send
      if (line == "/reset") {
        messages.erase(messages.begin() + (f->system.empty() ? 0 : 1), messages.end());
        std::fprintf(stderr, "kiln chat: conversation cleared\n");
        continue;
      }
      if (line == "/help") {
        std::fprintf(stderr, "kiln chat commands: /reset clears the conversation, /exit or /quit (or end of input) "
                             "quits, /help prints this; start a message with // to send one beginning with /\n");
        continue;
      }
      if (line.rfind("//", 0) == 0) {
        line.erase(0, 1);
      } else if (line[0] == '/') {
        std::fprintf(stderr, "kiln chat: unknown command '%s' (not sent); /help lists the commands\n", line.c_str());
        continue;
      }
      ++turn;
      messages.push_back({{"role", "user"}, {"content", line}});
      if (!tok::valid_utf8(line)) {  // (some templates would pass the bytes on, others replace them)
        turn_failed("the message is not valid UTF-8 text");
        continue;
      }
      Result<std::string> prompt = s.text->render_chat(messages, nullptr, true, f->template_name);
      if (!prompt.ok()) {
        turn_failed(prompt.status().message());
        continue;
      }
      Result<std::vector<int32_t>> ids = s.text->tokenizer().encode(*prompt, /*add_special_tokens=*/false);
      if (!ids.ok()) {
        turn_failed(ids.status().message());
        continue;
      }
      GenerationRequest r = base;
      r.prompt = std::move(ids).value();
      r.seed = base.seed + turn - 1;  // a fresh draw sequence per turn, still reproducible from --seed
      Result<std::shared_ptr<RequestStream>> stream = s.engine->submit(std::move(r));
      if (!stream.ok()) {
        turn_failed(stream.status().message());
        continue;
      }
      std::vector<int32_t> reply_ids;
      std::string reply, finish_reason, error;
      int32_t cached = 0;
      while (std::optional<EngineEvent> e = (*stream)->next()) {
        for (const GeneratedToken& t : e->tokens) reply_ids.push_back(t.id);
        reply += e->text;
        if (!f->json && !e->text.empty()) {
          std::fwrite(e->text.data(), 1, e->text.size(), stdout);
          std::fflush(stdout);
        }
        if (e->finished) finish_reason = e->finish_reason, error = e->error, cached = e->usage.cached_tokens;
      }
      if (!error.empty()) {
        if (!f->json && !reply.empty()) std::fputc('\n', stdout);
        turn_failed(error);
        continue;
      }
      if (f->json) {
        nlohmann::ordered_json out = {{"prompt", *prompt}, {"ids", reply_ids}, {"reply", reply},
                                      {"finish_reason", finish_reason}, {"cached_tokens", cached}};
        std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << std::endl;
      } else {
        std::fputc('\n', stdout);
        std::fflush(stdout);
      }
      messages.push_back({{"role", "assistant"}, {"content", reply}});
    }
    return failed_turns > 0 ? 1 : 0;
  };
}

}  // namespace kiln::cli
