// The built-in rewards (answer, regex), the penalties and make_reward (see reward.h); the external
// kinds (command, url) are in reward_external.cpp.
#include "rl/reward.h"
#include "rl/reward_text.h"

#include <pcre2.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <new>
#include <utility>

#include "model/tokenizer/unicode.h"

namespace kiln::rl {

Reward::~Reward() = default;

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string format_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// An error where a reward that reads the completion text meets a rollout with tokens but no text
// (a model without a tokenizer).
Status check_text(size_t i, const Rollout& r, const char* who) {
  if (!r.has_text && !r.completion_ids.empty())
    return invalid_argument(sample_name(i, r) + ": " + who +
                            " reads the completion text, and this rollout has none: the model needs a tokenizer "
                            "(tokenizer.json beside its weights)");
  return Status::Ok();
}

// A compiled reward pattern: PCRE2 (Perl syntax, UTF-8), JIT-compiled where the library can.
// Immutable after compile; each search brings its own match data and JIT stack, so searches may run
// from several threads.
class Pattern {
 public:
  static Result<std::unique_ptr<Pattern>> compile(const std::string& pattern, const char* option) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_NEVER_BACKSLASH_C, &err, &off, nullptr);  // \C: one byte
    if (!code)
      return invalid_argument(std::string(option) + " " + quote(pattern) + " does not compile at offset " +
                              std::to_string(off) + ": " + error_text(err));
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT the interpreter runs it
    return std::unique_ptr<Pattern>(new Pattern(pattern, option, code));
  }
  ~Pattern() { pcre2_code_free(code_); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  const std::string& text() const { return text_; }

  // Whether the pattern matches anywhere in `subject` (bytes that are not UTF-8 read as U+FFFD).
  // PCRE2 giving up (a pattern that backtracks past its limits) is an error naming the sample.
  Result<bool> search(const std::string& subject, size_t i, const Rollout& r) const {
    const std::string fixed = tok::valid_utf8(subject) ? std::string() : tok::utf8_lossy(subject);
    const std::string& s = fixed.empty() ? subject : fixed;
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    pcre2_match_context* mc = pcre2_match_context_create(nullptr);
    // The JIT's own stack, grown on demand up to kJitStack (its default, 32 KiB, is exhausted by a
    // repeated group over a few thousand characters).
    pcre2_jit_stack* js = pcre2_jit_stack_create(32 * 1024, kJitStack, nullptr);
    if (!md || !mc || !js) {
      free_all(md, mc, js);
      throw std::bad_alloc();
    }
    pcre2_jit_stack_assign(mc, nullptr, js);
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, PCRE2_NO_UTF_CHECK, md, mc);
    free_all(md, mc, js);
    if (rc >= 0) return true;
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    return invalid_argument(sample_name(i, r) + ": " + option_ + " " + quote(text_) + " could not be matched against its " +
                            std::to_string(s.size()) + "-byte completion: " + error_text(rc) +
                            "; write the pattern so that it backtracks less (e.g. [^<]* rather than (.|\\n)*)");
  }

 private:
  static constexpr size_t kJitStack = 256u << 20;  // virtual: committed as the match needs it

  Pattern(std::string text, const char* option, pcre2_code* code) : text_(std::move(text)), option_(option), code_(code) {}
  static std::string error_text(int code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(code, buf, sizeof(buf));
    return reinterpret_cast<const char*>(buf);
  }
  static void free_all(pcre2_match_data* md, pcre2_match_context* mc, pcre2_jit_stack* js) {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    pcre2_jit_stack_free(js);
  }

  std::string text_;
  const char* option_;  // the option it came from, for errors ("reward.pattern")
  pcre2_code* code_;
};

// '-' (or U+2212) at `sign` is a minus sign unless it follows something it could subtract from.
bool is_sign_position(std::string_view s, size_t sign) {
  if (sign == 0) return true;
  const char c = s[sign - 1];
  return !(is_alnum(c) || c == ')');
}

std::string normalize(bool negative, std::string digits, const std::string& frac) {
  size_t nz = digits.find_first_not_of('0');
  digits = nz == std::string::npos ? "0" : digits.substr(nz);
  std::string out = digits;
  if (!frac.empty()) out += "." + frac;
  if (negative && (out != "0")) out = "-" + out;
  return out;
}

// The last number of `s`, normalized (see extract_answer).
std::optional<std::string> last_number(std::string_view s) {
  std::optional<std::string> last;
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (!is_digit(s[i])) {
      ++i;
      continue;
    }
    const size_t start = i;
    std::string digits;
    while (i < n && is_digit(s[i])) digits += s[i++];
    // Thousands separators: ",ddd" groups after a leading group of at most three digits.
    if (digits.size() <= 3)
      while (i + 3 < n && s[i] == ',' && is_digit(s[i + 1]) && is_digit(s[i + 2]) && is_digit(s[i + 3]) &&
             (i + 4 == n || !is_digit(s[i + 4]))) {
        digits.append(s.substr(i + 1, 3));
        i += 4;
      }
    std::string frac;
    if (i + 1 < n && s[i] == '.' && is_digit(s[i + 1])) {
      ++i;
      while (i < n && is_digit(s[i])) frac += s[i++];
    }
    bool negative = false;
    if (start >= 1 && s[start - 1] == '-') negative = is_sign_position(s, start - 1);
    else if (start >= 3 && s.substr(start - 3, 3) == "\xE2\x88\x92") negative = is_sign_position(s, start - 3);
    last = normalize(negative, std::move(digits), frac);
  }
  return last;
}

// The content of the \boxed{...} that opens last among those that close, or nullopt. One pass
// with a stack of open braces (each remembers whether it opens a \boxed).
std::optional<std::string_view> last_boxed(std::string_view s) {
  static constexpr std::string_view kBoxed = "\\boxed";
  std::vector<std::pair<size_t, bool>> open;
  std::optional<std::string_view> best;
  size_t best_open = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '{') {
      size_t j = k;
      while (j > 0 && s[j - 1] == ' ') --j;
      const bool boxed = j >= kBoxed.size() && s.substr(j - kBoxed.size(), kBoxed.size()) == kBoxed;
      open.emplace_back(k, boxed);
    } else if (s[k] == '}' && !open.empty()) {
      const auto [at, boxed] = open.back();
      open.pop_back();
      if (boxed && (!best || at > best_open)) {
        best = s.substr(at + 1, k - at - 1);
        best_open = at;
      }
    }
  }
  return best;
}

bool is_integer(const std::string& s) {
  size_t i = !s.empty() && s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (!is_digit(s[i])) return false;
  return true;
}

std::optional<double> to_double(const std::string& s) {
  double v = 0.0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The expected answer of a rollout, normalized like extract_answer's.
Result<std::string> expected_answer(size_t i, const Rollout& r, const std::string& field) {
  if (!r.fields.is_object() || !r.fields.contains(field))
    return invalid_argument(sample_name(i, r) + " has no field '" + field +
                            "' (reward.answer_field): its prompt line needs the expected answer there");
  const nlohmann::json& v = r.fields[field];
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_float()) {
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof(buf), v.get<double>());
    return std::string(buf, res.ptr);
  }
  if (v.is_string()) {
    std::optional<std::string> n = extract_answer(v.get<std::string>());
    if (!n)
      return invalid_argument(sample_name(i, r) + ": its field '" + field + "' has no number: " +
                              quote(v.get<std::string>()) + " (the answer reward compares numbers)");
    return *n;
  }
  return invalid_argument(sample_name(i, r) + ": its field '" + field + "' is " + std::string(v.type_name()) +
                          ": give the expected answer as a number or a string with a number");
}

class AnswerReward final : public Reward {
 public:
  explicit AnswerReward(std::string field) : field_(std::move(field)) {}

  Result<std::vector<RewardResult>> score(const std::vector<Rollout>& rollouts) override {
    std::vector<RewardResult> out(rollouts.size());
    for (size_t i = 0; i < rollouts.size(); ++i) {
      const Rollout& r = rollouts[i];
      KILN_RETURN_IF_ERROR(check_text(i, r, "the answer reward"));
      KILN_ASSIGN_OR_RETURN(std::string want, expected_answer(i, r, field_));
      std::optional<std::string> got = extract_answer(r.text);
      const bool correct = got && same_number(*got, want);
      out[i].reward = correct ? 1.0 : 0.0;
      out[i].correct = correct;
    }
    return out;
  }

  std::string describe() const override { return "answer (numeric match against fields." + field_ + ")"; }

 private:
  std::string field_;
};

class RegexReward final : public Reward {
 public:
  explicit RegexReward(std::unique_ptr<Pattern> re) : re_(std::move(re)) {}

  Result<std::vector<RewardResult>> score(const std::vector<Rollout>& rollouts) override {
    std::vector<RewardResult> out(rollouts.size());
    for (size_t i = 0; i < rollouts.size(); ++i) {
      KILN_RETURN_IF_ERROR(check_text(i, rollouts[i], "the regex reward"));
      KILN_ASSIGN_OR_RETURN(const bool hit, re_->search(rollouts[i].text, i, rollouts[i]));
      out[i].reward = hit ? 1.0 : 0.0;
      out[i].correct = hit;
    }
    return out;
  }

  std::string describe() const override { return "regex (1 when the completion matches " + quote(re_->text()) + ")"; }

 private:
  std::unique_ptr<Pattern> re_;
};

// Another reward with the penalties subtracted from its rewards (`correct` is left as it was).
class PenalizedReward final : public Reward {
 public:
  PenalizedReward(std::unique_ptr<Reward> inner, const RewardOptions& o, std::unique_ptr<Pattern> format)
      : inner_(std::move(inner)), o_(o), format_(std::move(format)) {}

  Result<std::vector<RewardResult>> score(const std::vector<Rollout>& rollouts) override {
    if (format_)  // before the inner reward runs (an external program may take a while)
      for (size_t i = 0; i < rollouts.size(); ++i) KILN_RETURN_IF_ERROR(check_text(i, rollouts[i], "reward.format_pattern"));
    KILN_ASSIGN_OR_RETURN(std::vector<RewardResult> out, inner_->score(rollouts));
    KILN_ASSERT(out.size() == rollouts.size());
    for (size_t i = 0; i < rollouts.size(); ++i) {
      const Rollout& r = rollouts[i];
      const int64_t over = static_cast<int64_t>(r.completion_ids.size()) - o_.length_target;
      if (over > 0) out[i].reward -= o_.length_penalty * static_cast<double>(over);
      if (format_) {
        KILN_ASSIGN_OR_RETURN(const bool formatted, format_->search(r.text, i, r));
        if (!formatted) out[i].reward -= o_.format_penalty;
      }
      if (r.finish_reason == "length") out[i].reward -= o_.truncation_penalty;
    }
    return out;
  }

  std::string describe() const override {
    std::string d = inner_->describe();
    if (o_.length_penalty > 0)
      d += "; length penalty " + format_number(o_.length_penalty) + " per token beyond " +
           std::to_string(o_.length_target);
    if (format_) d += "; format penalty " + format_number(o_.format_penalty) + " unless it matches " + quote(o_.format_pattern);
    if (o_.truncation_penalty > 0) d += "; truncation penalty " + format_number(o_.truncation_penalty);
    return d;
  }

 private:
  std::unique_ptr<Reward> inner_;
  RewardOptions o_;
  std::unique_ptr<Pattern> format_;
};

Status check_penalty(double v, const char* name) {
  if (!std::isfinite(v) || v < 0)
    return invalid_argument(std::string(name) + " is " + format_number(v) +
                            ": a penalty is subtracted from the reward, give a number >= 0");
  return Status::Ok();
}

// An option that `kind` does not read is an error (it was meant for another kind, or misspelled one).
Status check_unused(bool set, const char* option, const char* reader, const std::string& kind) {
  if (set)
    return invalid_argument(std::string(option) + " is only read by reward.kind = \"" + reader + "\", and the kind is \"" +
                            kind + "\"");
  return Status::Ok();
}

}  // namespace

std::optional<std::string> extract_answer(std::string_view text) {
  if (std::optional<std::string_view> boxed = last_boxed(text)) return last_number(*boxed);
  return last_number(text);
}

bool same_number(const std::string& a, const std::string& b) {
  if (is_integer(a) && is_integer(b)) return a == b;
  std::optional<double> x = to_double(a), y = to_double(b);
  if (!x || !y) return false;
  if (*x == *y) return true;
  return std::abs(*x - *y) <= 1e-6 * std::max(std::abs(*x), std::abs(*y));
}

Result<std::unique_ptr<Reward>> make_reward(const RewardOptions& o) {
  const std::string& k = o.kind;
  if (k != "answer" && k != "regex" && k != "command" && k != "url")
    return invalid_argument((k.empty() ? std::string("reward.kind is not set") : "reward.kind \"" + k + "\" is unknown") +
                            ": use \"answer\", \"regex\", \"command\" or \"url\"");
  if (k != "answer") KILN_RETURN_IF_ERROR(check_unused(o.answer_field != "answer", "reward.answer_field", "answer", k));
  if (k != "regex") KILN_RETURN_IF_ERROR(check_unused(!o.pattern.empty(), "reward.pattern", "regex", k));
  if (k != "command") KILN_RETURN_IF_ERROR(check_unused(!o.command.empty(), "reward.command", "command", k));
  if (k != "url") KILN_RETURN_IF_ERROR(check_unused(!o.url.empty(), "reward.url", "url", k));

  KILN_RETURN_IF_ERROR(check_penalty(o.length_penalty, "reward.length_penalty"));
  KILN_RETURN_IF_ERROR(check_penalty(o.format_penalty, "reward.format_penalty"));
  KILN_RETURN_IF_ERROR(check_penalty(o.truncation_penalty, "reward.truncation_penalty"));
  if (o.length_target < 0)
    return invalid_argument("reward.length_target is " + std::to_string(o.length_target) + ": give a token count >= 0");
  if (o.length_target > 0 && o.length_penalty == 0)
    return invalid_argument("reward.length_target is set and reward.length_penalty is 0: set the penalty per token "
                            "beyond the target, or leave both out");
  if (o.format_penalty > 0 && o.format_pattern.empty())
    return invalid_argument("reward.format_penalty is set without reward.format_pattern: give the pattern a "
                            "well-formed completion matches");
  if (o.format_penalty == 0 && !o.format_pattern.empty())
    return invalid_argument("reward.format_pattern is set and reward.format_penalty is 0: set the penalty for a "
                            "completion that does not match, or leave both out");

  std::unique_ptr<Reward> base;
  if (k == "answer") {
    if (o.answer_field.empty()) return invalid_argument("reward.answer_field is empty: name the field of the expected answer");
    base = std::make_unique<AnswerReward>(o.answer_field);
  } else if (k == "regex") {
    if (o.pattern.empty()) return invalid_argument("reward.kind = \"regex\" needs reward.pattern");
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Pattern> re, Pattern::compile(o.pattern, "reward.pattern"));
    base = std::make_unique<RegexReward>(std::move(re));
  } else if (k == "command") {
    KILN_ASSIGN_OR_RETURN(base, make_command_reward(o.command, o.timeout_s));
  } else {
    KILN_ASSIGN_OR_RETURN(base, make_url_reward(o.url, o.timeout_s));
  }

  std::unique_ptr<Pattern> format;
  if (!o.format_pattern.empty()) {
    KILN_ASSIGN_OR_RETURN(format, Pattern::compile(o.format_pattern, "reward.format_pattern"));
  }
  if (o.length_penalty == 0 && !format && o.truncation_penalty == 0) return base;
  return std::unique_ptr<Reward>(std::make_unique<PenalizedReward>(std::move(base), o, std::move(format)));
}

}  // namespace kiln::rl
