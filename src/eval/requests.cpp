// What every task shares: the engine driver (run_requests), reading lines, pass@k.
#include <deque>
#include <fstream>
#include <memory>
#include <utility>

#include "core/json_text.h"
#include "eval/eval.h"
#include "model/chat_template.h"

namespace kiln::eval {

Status run_requests(const EvalContext& ctx, int64_t n, const std::function<Result<GenerationRequest>(int64_t)>& make,
                    const std::function<Status(int64_t, Finished&&)>& done) {
  std::deque<std::pair<int64_t, std::shared_ptr<RequestStream>>> open;
  auto stop = [&](Status s) {  // what is still running is cancelled; its events are dropped
    for (const auto& [i, stream] : open) ctx.engine->cancel(stream->id());
    return s;
  };
  const size_t window = static_cast<size_t>(std::max(ctx.max_in_flight, 1));
  int64_t next = 0;
  while (next < n || !open.empty()) {
    while (next < n && open.size() < window) {
      Result<GenerationRequest> request = make(next);
      if (!request.ok()) return stop(request.status());
      Result<std::shared_ptr<RequestStream>> stream = ctx.engine->submit(std::move(request).value());
      if (!stream.ok()) return stop(stream.status());
      open.emplace_back(next++, std::move(stream).value());
    }
    auto [i, stream] = std::move(open.front());
    open.pop_front();
    Finished f;
    while (std::optional<EngineEvent> e = stream->next()) {
      f.prompt_logprobs.insert(f.prompt_logprobs.end(), e->prompt_logprobs.begin(), e->prompt_logprobs.end());
      for (const GeneratedToken& t : e->tokens) f.ids.push_back(t.id);
      f.text += e->text;
      if (e->finished) f.finish_reason = e->finish_reason, f.error = e->error;
    }
    if (!f.error.empty()) return stop(Status(StatusCode::internal, "the engine failed: " + f.error));
    Status s = done(i, std::move(f));
    if (!s.ok()) return stop(s);
  }
  return Status::Ok();
}

Status for_each_line(const std::string& path, const std::function<Status(int64_t, const std::string&)>& fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path + " for reading");
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    KILN_RETURN_IF_ERROR(fn(number, line));
  }
  if (in.bad()) return io_error("reading " + path + " failed");
  return Status::Ok();
}

Result<nlohmann::ordered_json> parse_object_line(const std::string& line, const std::string& where) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(where + ": not valid JSON");
  if (!j.is_object()) return invalid_argument(where + ": not a JSON object");
  // Lines are kept, copied and printed (details), which recurses as deep as a value nests.
  const int64_t limit = TemplateLimits{}.max_context_depth - 1;
  KILN_RETURN_IF_ERROR(check_nesting(j, limit, where + ": the line"));
  return j;
}

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  if (n - c < k) return 1.0;
  double miss = 1.0;  // C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)
  for (int64_t i = n - c + 1; i <= n; ++i) miss *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - miss;
}

}  // namespace kiln::eval
