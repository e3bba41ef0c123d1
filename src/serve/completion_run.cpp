#include "serve/completion_run.h"

namespace kiln::serve {

Json version_runs(const std::vector<GeneratedToken>& tokens) {
  Json runs = Json::array();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (i == 0 || tokens[i].policy_version != tokens[i - 1].policy_version)
      runs.push_back({static_cast<int64_t>(i), tokens[i].policy_version});
  return runs;
}

Result<std::unique_ptr<CompletionRun>> CompletionRun::start(Engine& engine, const CompletionJob& job,
                                                            std::function<void()> on_event) {
  std::unique_ptr<CompletionRun> run(new CompletionRun(engine, job));
  const int32_t total = job.choices();
  run->choices_.resize(static_cast<size_t>(total));
  run->results_.resize(static_cast<size_t>(total));
  for (int32_t c = 0; c < total; ++c) {
    const int32_t p = c / job.n;
    GenerationRequest r = job.request;
    r.prompt = job.prompts[static_cast<size_t>(p)];
    r.seed = job.request.seed + static_cast<uint64_t>(c);  // choices differ, and repeat with the seed
    Result<std::shared_ptr<RequestStream>> stream = engine.submit(std::move(r));
    if (!stream.ok()) {
      run->cancel();
      return stream.status();
    }
    Choice& ch = run->choices_[static_cast<size_t>(c)];
    ch.stream = std::move(stream).value();
    if (job.tools.enabled && job.tools.format != ToolCallFormat::none)
      ch.tools = std::make_unique<ToolCallParser>(job.tools.format, job.tools.forced_prefix);
    if (job.reasoning) ch.reasoning = std::make_unique<ReasoningSplitter>(job.reasoning_opened);
    run->results_[static_cast<size_t>(c)].prompt_index = p;
    ++run->open_;
  }
  // Listeners last: on_event may poll at once, and every choice must exist by then.
  for (Choice& ch : run->choices_) ch.stream->set_listener(on_event);
  return run;
}

CompletionRun::~CompletionRun() {
  for (Choice& ch : choices_)
    if (ch.stream) ch.stream->set_listener(nullptr);
  cancel();
}

void CompletionRun::cancel() {
  for (size_t c = 0; c < choices_.size(); ++c)
    if (choices_[c].stream && !results_[c].finished) engine_.cancel(choices_[c].stream->id());
}

void CompletionRun::apply(int32_t index, EngineEvent& e, ChoiceDelta& d) {
  Choice& ch = choices_[static_cast<size_t>(index)];
  ChoiceResult& r = results_[static_cast<size_t>(index)];
  for (GeneratedToken& t : e.tokens) {
    r.tokens.push_back(t);
    d.tokens.push_back(std::move(t));
  }
  auto take = [&](ToolCallParser::Output out) {
    d.text += out.content;
    r.text += out.content;
    for (ToolCallDelta& td : out.calls) {
      if (!job_.tools.parallel && td.index > 0) continue;  // one call only: later ones are dropped
      d.tool_calls.push_back(std::move(td));
    }
  };
  std::string text = std::move(e.text);
  if (ch.reasoning) {
    ReasoningSplitter::Output split = ch.reasoning->feed(text);
    if (e.finished) {
      ReasoningSplitter::Output rest = ch.reasoning->finish();
      split.reasoning += rest.reasoning;
      split.content += rest.content;
    }
    d.reasoning += split.reasoning;
    r.reasoning += split.reasoning;
    text = std::move(split.content);
  }
  if (ch.tools) {
    take(ch.tools->feed(text));
  } else {
    d.text += text;
    r.text += text;
  }
  if (!e.finished) return;
  if (ch.tools) {
    take(ch.tools->finish());
    // A call cut off (max_tokens) or broken after it began streaming was streamed, but only complete
    // calls are results: their arguments are JSON objects.
    for (const ToolCall& c : ch.tools->calls())
      if (c.complete) r.tool_calls.push_back(c);
    if (!job_.tools.parallel && r.tool_calls.size() > 1) r.tool_calls.resize(1);
  }
  r.finished = true;
  --open_;
  r.usage = e.usage;
  r.error = e.error;
  r.stop_string = e.stop_string;
  r.admission_version = e.admission_version;
  r.finish_version = e.finish_version;
  if (!e.error.empty()) r.finish_reason = "error";
  else if (!r.tool_calls.empty() && e.finish_reason == "stop") r.finish_reason = "tool_calls";
  else if (e.finish_reason == "stop" && !e.stop_string.empty()) r.finish_reason = "stop_string";
  else r.finish_reason = e.finish_reason;
  d.finished = true;
  d.finish_reason = r.finish_reason;
  d.stop_string = r.stop_string;
}

std::vector<ChoiceDelta> CompletionRun::poll() {
  std::vector<ChoiceDelta> out;
  for (size_t c = 0; c < choices_.size(); ++c) {
    if (results_[c].finished) continue;
    while (std::optional<EngineEvent> e = choices_[c].stream->poll()) {
      ChoiceDelta d;
      d.index = static_cast<int32_t>(c);
      apply(d.index, *e, d);
      out.push_back(std::move(d));
      if (results_[c].finished) break;
    }
  }
  return out;
}

Usage CompletionRun::total_usage() const {
  Usage u;
  std::vector<bool> counted(job_.prompts.size(), false);
  for (const ChoiceResult& r : results_) {
    u.completion_tokens += r.usage.completion_tokens;
    u.preemptions += r.usage.preemptions;
    if (!counted[static_cast<size_t>(r.prompt_index)]) {
      counted[static_cast<size_t>(r.prompt_index)] = true;
      u.prompt_tokens += r.usage.prompt_tokens;
      u.cached_tokens += r.usage.cached_tokens;
    }
  }
  return u;
}

}  // namespace kiln::serve
