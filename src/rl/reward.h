// Rewards of kiln's RL trainer: each scores a batch of rollouts (rl/rollout.h) with one number per
// rollout, before advantages are computed.
//
//   answer    numeric answer match: the last \boxed{...} of the completion text (else its last
//             number) against the rollout's fields[answer_field] (a number, or text whose last
//             \boxed{} or last number is the answer, e.g. GSM8K's "... #### 42"): 1 or 0
//   regex     1 when the completion text matches `pattern`, else 0
//   command   an external program: `command` runs through /bin/sh -c once per batch (in a process
//             group of its own), reads one JSON record per line on stdin (rl::to_json(rollout,
//             false), in batch order; stdin is closed after the last) and prints one finite number
//             per line (JSON number syntax), one line per record, then exits 0. Past timeout_s its
//             process group is killed.
//   url       an HTTP service: POST {"rollouts": [records]} (Content-Type application/json) to an
//             http:// URL, which answers 200 with {"rewards": [one finite number per record]}.
//             timeout_s bounds connecting, sending and receiving (a host name is resolved first,
//             by the system's resolver).
//
// Penalties combine with every kind: reward -= length_penalty * max(0, completion tokens -
// length_target), -= format_penalty when the text does not match format_pattern, -=
// truncation_penalty when the completion stopped at its length limit (finish_reason "length").
//
// Patterns (`pattern`, `format_pattern`) are PCRE2 regular expressions (Perl syntax, UTF-8; ^ and
// $ anchor at the start and end of the text and `.` stops at line breaks: (?m), (?s) change that). A
// pattern matches when it matches anywhere in the text. A match PCRE2 gives up on (a pattern that
// backtracks past its limits on a long completion) is an error, not a 0.
//
// Errors are values: a reward that cannot score a batch says which sample (its index in the batch
// and its group) and what was wrong, and the run stops.
// Ownership: make_reward returns an owned Reward; it keeps copies of its options.
// Thread safety: a Reward holds no mutable state: score() may run from several threads at once
// (command blocks SIGPIPE in the calling thread only, while its program runs).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "rl/rollout.h"

namespace kiln::rl {

struct RewardResult {
  double reward = 0.0;
  std::optional<bool> correct;  // set by the kinds with a notion of accuracy (answer, regex)
};

class Reward {
 public:
  virtual ~Reward();
  // One result per rollout, in order. The rollouts' own reward and advantage are not read.
  virtual Result<std::vector<RewardResult>> score(const std::vector<Rollout>& rollouts) = 0;
  // One line for logs, e.g. "answer (fields.answer); length penalty 0.001 per token beyond 512".
  virtual std::string describe() const = 0;
};

struct RewardOptions {
  std::string kind;                     // "answer", "regex", "command" or "url"
  std::string answer_field = "answer";  // answer: the field holding the expected answer
  std::string pattern;                  // regex
  std::string command;                  // command: a shell command line
  std::string url;                      // url: http://host[:port][/path]
  double timeout_s = 60.0;              // command, url: for one batch

  double length_penalty = 0.0;  // per completion token beyond length_target
  int32_t length_target = 0;
  double format_penalty = 0.0;  // when the completion text does not match format_pattern
  std::string format_pattern;
  double truncation_penalty = 0.0;  // when finish_reason is "length"
};

// Checks the options (an unknown kind, a missing or invalid pattern, an https URL, an option the
// kind does not use, a negative penalty are errors naming the option) and builds the reward.
Result<std::unique_ptr<Reward>> make_reward(const RewardOptions& options);

// The external kinds on their own, without penalties (make_reward wraps them); reward_external.cpp.
Result<std::unique_ptr<Reward>> make_command_reward(const std::string& command, double timeout_s);
Result<std::unique_ptr<Reward>> make_url_reward(const std::string& url, double timeout_s);

// The answer kind's pieces (exposed for tests).
// The number the answer kind reads from `text`: the last \boxed{...}'s content's last number if
// the text has a closed \boxed{}, else the text's last number; nullopt when there is none. Numbers
// are ASCII digits with an optional sign ('-' or U+2212 where not preceded by a letter, digit or
// ')'), thousands separators ("1,234,567") and a decimal part ("3.25"; a trailing period is
// punctuation). The result is normalized: no separators, integers without leading zeros ("-0"
// is "0").
std::optional<std::string> extract_answer(std::string_view text);
// Numeric equality of two normalized numbers: exact for two integers, relative 1e-6 otherwise.
bool same_number(const std::string& a, const std::string& b);

}  // namespace kiln::rl
