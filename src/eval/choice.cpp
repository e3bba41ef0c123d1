// kiln eval --task choice (eval.h): multiple-choice log-likelihood, lm-evaluation-harness's way.
#include <cmath>

#include "eval/eval.h"

namespace kiln::eval {
namespace {

struct Question {
  std::vector<int32_t> context;                // tokens
  std::vector<std::vector<int32_t>> continuations;
  std::vector<int64_t> chars;                  // each choice's length in characters (acc_norm)
  int32_t answer = 0;
  int64_t line = 0;
  int32_t truncated = 0;                       // choices that lost context tokens to the limit
};

int64_t utf8_chars(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// One line: the context is text ("context", tokenized with the tokenizer's special tokens) or a chat
// ("messages", rendered with the generation prompt, tokenized without them, as apply_chat_template).
// Like lm-evaluation-harness: trailing whitespace of a text context moves to the continuations, and
// a continuation's tokens are those of context + choice after the context's own tokens.
Result<Question> read_question(const EvalContext& ctx, const std::string& line, const std::string& where,
                               int64_t number) {
  KILN_ASSIGN_OR_RETURN(nlohmann::ordered_json j, parse_object_line(line, where));
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].size() < 2)
    return invalid_argument(where + ": a choice line needs \"choices\", an array of at least two strings");
  if (!j.contains("answer") || !j["answer"].is_number_integer() || j["answer"].get<int64_t>() < 0 ||
      j["answer"].get<int64_t>() >= static_cast<int64_t>(j["choices"].size()))
    return invalid_argument(where + ": \"answer\" must be the index of the right choice (0 .. " +
                            std::to_string(j["choices"].size() - 1) + ")");
  std::string context;
  bool special = true;
  if (j.contains("messages")) {
    Result<std::string> rendered = ctx.text->render_chat(j["messages"], nlohmann::ordered_json(), true);
    if (!rendered.ok()) return invalid_argument(where + ": " + rendered.status().message());
    context = std::move(rendered).value();
    special = false;  // the template writes the special tokens
  } else if (j.contains("context") && j["context"].is_string()) {
    context = j["context"].get<std::string>();
  } else {
    return invalid_argument(where + ": a choice line needs \"context\" (text) or \"messages\" (a chat)");
  }
  // Trailing whitespace of the context belongs to the continuations.
  const size_t keep = context.find_last_not_of(" \t\n\r");
  const std::string moved = context.substr(keep == std::string::npos ? 0 : keep + 1);
  context.resize(context.size() - moved.size());
  Question q;
  q.line = number;
  q.answer = j["answer"].get<int32_t>();
  const Tokenizer& tok = ctx.text->tokenizer();
  // An empty context: the end-of-text token stands for it and the choices are encoded alone, as in
  // the harness.
  const bool empty_context = context.empty();
  if (empty_context) {
    if (ctx.text->stop_ids().empty())
      return invalid_argument(where + ": the context is empty and the model names no end-of-text token to stand for it");
    q.context.push_back(ctx.text->stop_ids().front());
  } else {
    KILN_ASSIGN_OR_RETURN(q.context, tok.encode(context, special));
  }
  for (size_t c = 0; c < j["choices"].size(); ++c) {
    const nlohmann::ordered_json& choice = j["choices"][c];
    if (!choice.is_string()) return invalid_argument(where + ": choice " + std::to_string(c) + " is not a string");
    const std::string continuation = moved + choice.get<std::string>();
    KILN_ASSIGN_OR_RETURN(std::vector<int32_t> whole,
                          empty_context ? tok.encode(continuation, false) : tok.encode(context + continuation, special));
    const size_t skip = empty_context ? 0 : std::min(whole.size(), q.context.size());
    std::vector<int32_t> cont(whole.begin() + static_cast<std::ptrdiff_t>(skip), whole.end());
    if (cont.empty()) return invalid_argument(where + ": choice " + std::to_string(c) + " adds no token to the context");
    q.continuations.push_back(std::move(cont));
    q.chars.push_back(utf8_chars(choice.get<std::string>()));
  }
  return q;
}

double stderr_of(double acc, int64_t n) { return n > 1 ? std::sqrt(acc * (1.0 - acc) / static_cast<double>(n - 1)) : 0.0; }

}  // namespace

Result<TaskOutput> choice(const EvalContext& ctx, const ChoiceOptions& o) {
  if (!ctx.text) return invalid_argument("the choice task needs the model's tokenizer.json");
  const int64_t longest = ctx.engine->max_sequence_tokens();
  const int64_t L = o.context > 0 ? o.context : longest;
  if (L < 2 || L > longest)
    return invalid_argument("--context must be within [2, " + std::to_string(longest) + "], but it is " + std::to_string(L));
  std::vector<Question> questions;
  KILN_RETURN_IF_ERROR(for_each_line(o.data, [&](int64_t number, const std::string& line) -> Status {
    KILN_ASSIGN_OR_RETURN(Question q, read_question(ctx, line, o.data + ":" + std::to_string(number), number));
    questions.push_back(std::move(q));
    return Status::Ok();
  }));
  if (questions.empty()) return invalid_argument(o.data + " has no questions");
  // One request per choice, the choices of a question one after the other: their shared context
  // is computed once (the prefix cache; the scheduler holds later ones back while the first
  // computes it).
  std::vector<std::pair<int32_t, int32_t>> order;  // (question, choice)
  for (size_t q = 0; q < questions.size(); ++q)
    for (size_t c = 0; c < questions[q].continuations.size(); ++c) order.emplace_back(q, c);
  std::vector<std::vector<double>> ll(questions.size());
  for (size_t q = 0; q < questions.size(); ++q) ll[q].resize(questions[q].continuations.size());
  TaskOutput out;
  int64_t correct = 0, correct_norm = 0, truncated = 0, done_questions = 0;
  Status run = run_requests(
      ctx, static_cast<int64_t>(order.size()),
      [&](int64_t i) -> Result<GenerationRequest> {
        auto [qi, ci] = order[static_cast<size_t>(i)];
        Question& q = questions[qi];
        const std::vector<int32_t>& cont = q.continuations[ci];
        GenerationRequest r;
        r.prompt = q.context;
        r.prompt.insert(r.prompt.end(), cont.begin(), cont.end());
        if (static_cast<int64_t>(r.prompt.size()) > L) {  // the oldest context tokens go
          const int64_t drop = static_cast<int64_t>(r.prompt.size()) - L;
          if (static_cast<int64_t>(cont.size()) >= L)
            return invalid_argument((o.data + ":" + std::to_string(q.line)) + ": choice " + std::to_string(ci) + " has " +
                                    std::to_string(cont.size()) + " tokens, more than the context of " +
                                    std::to_string(L) + " leaves room for");
          r.prompt.erase(r.prompt.begin(), r.prompt.begin() + drop);
          ++q.truncated;
        }
        r.prompt_logprobs_from = static_cast<int32_t>(r.prompt.size() - cont.size());
        r.max_tokens = 0;
        return r;
      },
      [&](int64_t i, Finished&& f) -> Status {
        auto [qi, ci] = order[static_cast<size_t>(i)];
        const Question& q = questions[qi];
        double sum = 0.0;
        for (float lp : f.prompt_logprobs) sum += lp;
        ll[qi][ci] = sum;
        if (ci + 1 < static_cast<int32_t>(q.continuations.size())) return Status::Ok();
        // The question's last choice: argmax by the sum and by the sum per character (first on ties).
        int32_t best = 0, best_norm = 0;
        for (size_t c = 1; c < ll[qi].size(); ++c) {
          if (ll[qi][c] > ll[qi][best]) best = static_cast<int32_t>(c);
          const auto norm = [&](size_t k) { return ll[qi][k] / static_cast<double>(std::max<int64_t>(q.chars[k], 1)); };
          if (norm(c) > norm(best_norm)) best_norm = static_cast<int32_t>(c);
        }
        correct += best == q.answer;
        correct_norm += best_norm == q.answer;
        truncated += q.truncated > 0;
        nlohmann::ordered_json item;
        item["line"] = q.line;
        item["answer"] = q.answer;
        item["loglikelihoods"] = ll[qi];
        item["prediction"] = best;
        item["prediction_norm"] = best_norm;
        item["correct"] = best == q.answer;
        item["correct_norm"] = best_norm == q.answer;
        out.details.push_back(std::move(item));
        if (ctx.progress) ctx.progress(++done_questions, static_cast<int64_t>(questions.size()));
        return Status::Ok();
      });
  KILN_RETURN_IF_ERROR(run);
  const int64_t n = static_cast<int64_t>(questions.size());
  const double acc = static_cast<double>(correct) / static_cast<double>(n);
  const double acc_norm = static_cast<double>(correct_norm) / static_cast<double>(n);
  out.items = n;
  out.results["questions"] = n;
  out.results["acc"] = acc;
  out.results["acc_stderr"] = stderr_of(acc, n);
  out.results["acc_norm"] = acc_norm;
  out.results["acc_norm_stderr"] = stderr_of(acc_norm, n);
  out.results["truncated_questions"] = truncated;
  out.results["context"] = L;
  return out;
}

}  // namespace kiln::eval
