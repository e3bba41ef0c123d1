// kiln preprocess: JSONL text or chat documents -> packed token shards for kiln train
// (train/preprocess.h describes the output). Text lines {"text": ...}: the tokenizer's special
// tokens (e.g. BOS) and an EOS per document, every token a target. Chat lines {"messages": [...],
// "tools": [...]}: the model's chat template, targets only on assistant tokens
// (model/chat_tokens.h says how they are found).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/common.h"
#include "cli/progress.h"
#include "core/sha256.h"
#include "model/chat_tokens.h"
#include "model/model_text.h"
#include "train/preprocess.h"

namespace kiln::cli {
namespace {

struct PreprocessFlags {
  std::string model_dir, output, format = "text", seed = "0", text_key = "text", chat_template;
  std::vector<std::string> inputs;
  int32_t seq_len = 0, threads = 0;
  double val_fraction = 0.0;
  int64_t shard_tokens = int64_t(1) << 26;
  bool no_pack = false, skip_bad_lines = false, overwrite = false, no_eos = false;
};

Result<DocumentMaker> text_maker(const ModelText& text, const PreprocessFlags& f) {
  std::optional<int32_t> eos;
  if (!f.no_eos) {
    if (!text.special_tokens().eos.empty()) eos = text.tokenizer().token_to_id(text.special_tokens().eos);
    if (!eos && !text.stop_ids().empty()) eos = text.stop_ids().front();
    if (!eos)
      return invalid_argument("the model names no EOS token to end each document with; pass --no-eos to go without");
  }
  const Tokenizer* tok = &text.tokenizer();
  const std::string key = f.text_key;
  return DocumentMaker([tok, eos, key](const nlohmann::ordered_json& line) -> Result<TokenDocument> {
    auto it = line.find(key);
    if (it == line.end()) return invalid_argument("no \"" + key + "\" key");
    if (!it->is_string()) return invalid_argument("\"" + key + "\" must be a string");
    TokenDocument d;
    KILN_ASSIGN_OR_RETURN(d.ids, tok->encode(it->get_ref<const std::string&>(), /*add_special_tokens=*/true));
    if (eos && (d.ids.empty() || d.ids.back() != *eos)) d.ids.push_back(*eos);
    d.mask.assign(d.ids.size(), 1);
    return d;
  });
}

// Chat lines: the conversation through the model's chat template (the tool-use template when the
// line has tools and the model has one), targets on the assistant tokens only.
Result<DocumentMaker> chat_maker(const ModelText& text, const PreprocessFlags& f) {
  KILN_RETURN_IF_ERROR(text.chat_template(f.chat_template, /*with_tools=*/false).status());
  const ModelText* t = &text;
  const std::string name = f.chat_template;
  return DocumentMaker([t, name](const nlohmann::ordered_json& line) -> Result<TokenDocument> {
    auto messages = line.find("messages");
    if (messages == line.end()) return invalid_argument("no \"messages\" key");
    const nlohmann::ordered_json no_tools;
    auto tools_it = line.find("tools");
    const nlohmann::ordered_json& tools = tools_it == line.end() ? no_tools : *tools_it;  // not copied: it may nest deep
    KILN_ASSIGN_OR_RETURN(const ChatTemplate* tmpl, t->chat_template(name, !tools.is_null()));
    KILN_ASSIGN_OR_RETURN(ChatTemplateInputs inputs, t->chat_inputs(*messages, tools, false));
    KILN_ASSIGN_OR_RETURN(ChatTokens chat, tokenize_chat_for_training(t->tokenizer(), *tmpl, inputs));
    return TokenDocument{std::move(chat.ids), std::move(chat.assistant_mask)};
  });
}

int run_preprocess(const PreprocessFlags& f) {
  Result<uint64_t> seed = parse_u64(f.seed, "--seed");
  if (!seed.ok()) return fail(seed.status());
  if (f.format != "text" && f.format != "chat")
    return fail(invalid_argument("--format must be text or chat (got '" + f.format + "')"));
  Result<ModelText> text = ModelText::load(f.model_dir);
  if (!text.ok()) return fail(text.status());
  Result<std::string> tok_sha = sha256_file((std::filesystem::path(f.model_dir) / "tokenizer.json").string());
  if (!tok_sha.ok()) return fail(tok_sha.status());
  Result<DocumentMaker> maker = f.format == "text" ? text_maker(*text, f) : chat_maker(*text, f);
  if (!maker.ok()) return fail(maker.status());

  PreprocessOptions o;
  o.inputs = f.inputs;
  o.output = f.output;
  o.data_format = f.format;
  o.seq_len = f.seq_len;
  o.pack = !f.no_pack;
  o.val_fraction = f.val_fraction;
  o.seed = *seed;
  o.skip_bad_lines = f.skip_bad_lines;
  o.overwrite = f.overwrite;
  o.threads = f.threads;
  o.shard_tokens = f.shard_tokens;
  o.tokenizer_info = {{"sha256", *tok_sha}, {"vocab_size", text->tokenizer().vocab_size()}};

  std::unique_ptr<ProgressBar> bar;
  double last_line = 0.0;
  auto progress = [&](const PreprocessProgress& p) {
    if (!bar) bar = std::make_unique<ProgressBar>("preprocess", static_cast<double>(p.bytes_total), 1e6, "MB");
    const double done = static_cast<double>(p.bytes_done);
    char note[96];
    std::snprintf(note, sizeof(note), "%.1f MB/s %lld documents", bar->rate(done) / 1e6,
                  static_cast<long long>(p.documents));
    if (bar->active()) {
      bar->update(done, note, p.finished_reading);
    } else if (done - last_line >= 0.1 * static_cast<double>(p.bytes_total) && !p.finished_reading) {
      last_line = done;
      std::fprintf(stderr, "kiln: preprocess %.1f/%.1f MB %s\n", done / 1e6, p.bytes_total / 1e6, note);
    }
  };
  auto warn = [&](const std::string& msg) {
    if (bar) bar->clear();
    std::fprintf(stderr, "kiln: skipped %s\n", msg.c_str());
  };
  Result<PreprocessReport> r = preprocess(o, *maker, warn, progress);
  if (bar) bar->clear();
  if (!r.ok()) return fail(r.status());
  const auto& train = r->meta["splits"]["train"];
  std::fprintf(stderr,
               "kiln: %lld document%s (%lld bad line%s skipped) -> %s: train %lld rows of <= %d tokens, %lld tokens, "
               "%lld targets, packing efficiency %.3f",
               static_cast<long long>(r->documents), r->documents == 1 ? "" : "s", static_cast<long long>(r->bad_lines),
               r->bad_lines == 1 ? "" : "s", f.output.c_str(),
               train["rows"].get<long long>(), f.seq_len, train["tokens"].get<long long>(),
               train["targets"].get<long long>(), train["packing_efficiency"].get<double>());
  if (r->meta["splits"].contains("val"))
    std::fprintf(stderr, "; val %lld rows, %lld tokens", r->meta["splits"]["val"]["rows"].get<long long>(),
                 r->meta["splits"]["val"]["tokens"].get<long long>());
  std::fprintf(stderr, "; %.1f MB in %.2f s (%.1f MB/s)\n", static_cast<double>(r->bytes) / 1e6, r->seconds,
               r->seconds > 0 ? static_cast<double>(r->bytes) / 1e6 / r->seconds : 0.0);
  return 0;
}

}  // namespace

Runner add_preprocess(CLI::App& app) {
  auto f = std::make_shared<PreprocessFlags>();
  CLI::App* p = app.add_subcommand("preprocess", "tokenize and pack JSONL text or chat data into shards for kiln train");
  p->add_option("--model", f->model_dir, "model folder: its tokenizer and chat template")->required();
  p->add_option("--input", f->inputs, "JSONL files (one document per line)")->required();
  p->add_option("--output", f->output, "output folder: shards and meta.json")->required();
  p->add_option("--seq-len", f->seq_len, "tokens per training row")->required();
  p->add_option("--format", f->format, "text ({\"text\": ...}) or chat ({\"messages\": [...], \"tools\": [...]})")
      ->capture_default_str();
  p->add_option("--val-fraction", f->val_fraction, "fraction of the documents held out as the val split")
      ->capture_default_str();
  p->add_option("--seed", f->seed, "seed of the validation choice and the row order")->capture_default_str();
  p->add_flag("--no-pack", f->no_pack, "one document (or piece of a long one) per row instead of packing");
  p->add_flag("--skip-bad-lines", f->skip_bad_lines, "skip malformed lines with a warning (default: stop at the first)");
  p->add_flag("--overwrite", f->overwrite, "replace an existing preprocessed folder");
  p->add_flag("--no-eos", f->no_eos, "text: do not end each document with the EOS token");
  p->add_option("--text-key", f->text_key, "text: the key holding the document")->capture_default_str();
  p->add_option("--chat-template", f->chat_template, "chat: the template's name (default: the model's)");
  p->add_option("--threads", f->threads, "worker threads (default: all cores)");
  p->add_option("--shard-tokens", f->shard_tokens, "tokens per shard file at most")->capture_default_str();
  return [f] { return run_preprocess(*f); };
}

}  // namespace kiln::cli
