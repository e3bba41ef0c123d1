#include "serve/batch.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "serve/chat_messages.h"
#include "serve/completion_run.h"
#include "serve/openai_protocol.h"
#include "serve/request_fields.h"

namespace kiln::serve {
namespace {

struct Line {
  Json custom_id;
  Json output;                         // set once final
  std::unique_ptr<CompletionRun> run;  // while it runs
  std::string request_id;
  int64_t created = 0;
};

Json line_error(const Json& custom_id, const std::string& code, const std::string& message) {
  return {{"id", "batch_req_" + random_id(24)}, {"custom_id", custom_id}, {"response", Json()},
          {"error", {{"code", code}, {"message", message}}}};
}

Json line_response(const Json& custom_id, int status, const std::string& request_id, Json body) {
  return {{"id", "batch_req_" + random_id(24)}, {"custom_id", custom_id},
          {"response", {{"status_code", status}, {"request_id", request_id}, {"body", std::move(body)}}},
          {"error", Json()}};
}

}  // namespace

Result<BatchSummary> run_batch(Engine& engine, const ServeContext& ctx, std::istream& in, std::ostream& out,
                               int32_t max_in_flight, const std::function<void(int64_t, int64_t)>& progress) {
  std::vector<std::string> texts;
  for (std::string s; std::getline(in, s);)
    if (s.find_first_not_of(" \t\r") != std::string::npos) texts.push_back(std::move(s));
  BatchSummary sum;
  sum.requests = static_cast<int64_t>(texts.size());
  std::vector<Line> lines(texts.size());
  // One wake-up for the whole batch: any stream's news.
  std::mutex mu;
  std::condition_variable cv;
  bool news = false;
  auto on_event = [&] {
    std::lock_guard<std::mutex> lock(mu);
    news = true;
    cv.notify_one();
  };
  std::unordered_map<std::string, size_t> first_line_of;  // custom_id -> its first line
  size_t next_to_start = 0, next_to_write = 0;
  int32_t running = 0;
  int64_t done = 0;
  auto finish_line = [&](Line& l, Json output, bool ok) {
    l.output = std::move(output);
    l.run.reset();
    ok ? ++sum.succeeded : ++sum.failed;
    ++done;
  };
  while (next_to_write < lines.size()) {
    // Start lines up to the in-flight bound.
    while (next_to_start < lines.size() && running < max_in_flight) {
      const size_t i = next_to_start++;
      Line& l = lines[i];
      const std::string where = "line " + std::to_string(i + 1);
      Result<Json> parsed = parse_request_body(texts[i]);
      if (!parsed.ok()) {
        finish_line(l, line_error(Json(), "invalid_request", where + ": " + parsed.status().message()), false);
        continue;
      }
      const Json& j = *parsed;
      l.custom_id = j.contains("custom_id") ? j["custom_id"] : Json();
      if (!l.custom_id.is_string()) {
        finish_line(l, line_error(l.custom_id, "invalid_request", where + ": 'custom_id' (a string) is required"), false);
        continue;
      }
      // Results are matched to requests by custom_id (OpenAI's batches refuse a repeated one): a
      // repeat is an error of its own line, the first keeps running.
      if (auto [first, added] = first_line_of.emplace(l.custom_id.get<std::string>(), i + 1); !added) {
        finish_line(l, line_error(l.custom_id, "invalid_request",
                                  where + ": 'custom_id' " + l.custom_id.dump() + " repeats line " +
                                      std::to_string(first->second) + "'s; each request needs its own"),
                    false);
        continue;
      }
      const std::string method = string_member(j, "method");
      const std::string url = string_member(j, "url");
      if (method != "POST" || (url != "/v1/chat/completions" && url != "/v1/completions") || !j.contains("body") ||
          !j["body"].is_object()) {
        finish_line(l, line_error(l.custom_id, "invalid_request",
                                  where + ": expected \"method\": \"POST\", \"url\": \"/v1/chat/completions\" or "
                                          "\"/v1/completions\" and a \"body\" object"),
                    false);
        continue;
      }
      const bool chat = url == "/v1/chat/completions";
      l.request_id = (chat ? "chatcmpl-" : "cmpl-") + random_id(24);
      l.created = unix_seconds();
      Json body = j["body"];
      if (body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>()) {
        ApiError e{400, "invalid_request_error", "a batch request cannot be streamed: drop 'stream'", "stream", ""};
        finish_line(l, line_response(l.custom_id, 400, l.request_id, openai_error_body(e)), false);
        continue;
      }
      // What the parser throws (JSON of a type it did not check) is this line's error, not the batch's.
      Result<CompletionJob> job = invalid_argument("");
      try {
        job = chat ? parse_openai_chat(body, ctx) : parse_openai_completion(body, ctx);
      } catch (const std::exception& e) {
        job = invalid_argument(std::string("invalid request: ") + e.what());
      }
      Result<std::unique_ptr<CompletionRun>> run =
          job.ok() ? CompletionRun::start(engine, *job, on_event) : Result<std::unique_ptr<CompletionRun>>(job.status());
      if (!run.ok()) {
        ApiError e = api_error_from(run.status());
        finish_line(l, line_response(l.custom_id, e.status, l.request_id, openai_error_body(e)), false);
        continue;
      }
      l.run = std::move(run).value();
      ++running;
    }
    // Collect what finished.
    for (size_t i = next_to_write; i < next_to_start; ++i) {
      Line& l = lines[i];
      if (!l.run) continue;
      l.run->poll();
      if (!l.run->finished()) continue;
      --running;
      std::string error;
      for (const ChoiceResult& r : l.run->results())
        if (!r.error.empty()) error = r.error;
      const Usage u = l.run->total_usage();
      sum.prompt_tokens += u.prompt_tokens;
      sum.completion_tokens += u.completion_tokens;
      if (!error.empty()) {
        ApiError e{500, "server_error", error, "", ""};
        finish_line(l, line_response(l.custom_id, 500, l.request_id, openai_error_body(e)), false);
      } else {
        finish_line(l, line_response(l.custom_id, 200, l.request_id, openai_response(*l.run, ctx, l.request_id, l.created)),
                    true);
      }
    }
    while (next_to_write < next_to_start && !lines[next_to_write].output.is_null()) {
      out << lines[next_to_write].output.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
      lines[next_to_write].output = Json();
      ++next_to_write;
    }
    if (progress) progress(done, sum.requests);
    if (next_to_write >= lines.size()) break;
    if (running > 0) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return news; });
      news = false;
    }
  }
  out.flush();
  if (!out) return io_error("could not write the batch output");
  return sum;
}

}  // namespace kiln::serve
