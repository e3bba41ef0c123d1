// Scheduler: decides what each engine step computes. Plain C++ over the page pool and the radix
// cache; no model, no device (unit-tested on its own, tests/cpu/test_scheduler.cpp).
//
// A sequence is a request's tokens (prompt, then generated ids) of which the first `computed` have
// their keys/values in the sequence's pages. Every step packs, under a token budget and a limit on
// running sequences (the budget: max_step_tokens, or mixed_step_tokens where the step decodes, so
// that a long prompt's chunks hold the running requests' next tokens for a shorter step, and a
// prompt prefilled while nothing decodes takes fewer, larger steps):
//   1. one token of every running sequence that has exactly one uncomputed token (the decode of
//      every running request, every step), oldest admission first;
//   2. the next chunk of every running sequence with more (chunked prefill, or a recompute after
//      preemption), oldest first, while the budget lasts;
//   3. the waiting sequences in arrival order (FCFS: the first that does not fit stops admission;
//      while admission is closed, only sequences admitted before (preempted ones) are taken),
//      each starting after the longest prefix the radix cache holds for its tokens (of the current
//      policy version), with a first chunk that fits the budget. A sequence that shares at least one
//      more full page with a running sequence that has not computed (and cached) it yet waits for
//      those pages instead of computing them again: 64 requests arriving together with one 2K-token
//      system prompt prefill it once. Later arrivals are still admitted past it.
// An entry whose chunk reaches the end of the sequence's tokens asks for logits (a new token).
// Prompt scoring: a sequence with score_from > 0 wants log p(tokens[t] | tokens[<t]) for every prompt
// token t >= score_from, i.e. the logits of positions score_from - 1 .. prompt_len - 2 ("score
// rows"). At most max_score_rows of them are planned per step (chunks are cut there; a sequence
// with none left to give waits for the next step); the radix cache serves at most the pages before
// position score_from - 1, since cached positions have no logits; a recompute after preemption
// scores only what was not delivered yet (next_scored).
// When pages run out, unreferenced cached pages are evicted (LRU); if that is not enough, the
// newest running sequence is preempted: its full pages are offered to the radix cache, its pages
// released, and it waits again (ahead of later arrivals) to be recomputed from its tokens so far.
// A request is never aborted for capacity; submit-time checks refuse what can never fit.
//
// Policy versions: every sequence remembers the version its KV was (re)computed under
// (kv_version, set at admission, when its computation restarts from radix pages of the current
// version). When the version moves on while a sequence runs (an engine weight update in `keep`
// mode), its later tokens are computed by the new weights over its own older KV: such a sequence
// never offers pages to the radix cache (they are not the KV of either version alone), so prefix
// KV is only ever shared between sequences of one version. Pages of older versions in the cache
// are never matched again and age out by LRU.
// Thread safety: none; the engine thread owns the scheduler.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "infer/cache/page_pool.h"
#include "infer/cache/radix_cache.h"

namespace kiln {

struct SchedulerConfig {
  int32_t num_pages = 0;
  int32_t page_size = 16;
  int32_t max_running = 256;        // sequences in flight at once
  int32_t max_step_tokens = 16384;  // tokens packed in one step (>= max_running)
  int32_t mixed_step_tokens = 0;    // ... in a step that decodes (0: max_step_tokens; else within
                                    // [max_running, max_step_tokens])
  bool prefix_cache = true;
  int32_t max_score_rows = 0;       // prompt-scoring logit rows per step (0: no sequence may score)
};

struct Sequence {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then the generated ids
  int32_t prompt_len = 0;
  int32_t computed = 0;         // tokens whose keys/values sit in `pages`
  std::vector<int32_t> pages;   // the request-to-page row: pages[k] holds tokens k*ps .. (k+1)*ps-1
  int32_t cached_prompt_tokens = -1;  // prompt tokens the radix cache served at the first admission
  int32_t offered_pages = 0;    // full pages already offered to the radix cache
  uint64_t arrival = 0;         // FCFS order
  uint64_t admission = 0;       // order of the latest admission (the newest is preempted first); 0: never admitted
  uint64_t kv_version = 0;      // the policy version its KV was computed under (since its latest admission)
  uint64_t first_admission_version = 0;  // the policy version at its first admission
  bool running = false;
  int32_t preemptions = 0;
  int32_t score_from = 0;       // > 0: the first prompt token whose log-probability is wanted
  int32_t next_scored = 0;      // the next prompt token to score (score_from .. prompt_len)
};

// One request's part of a step: tokens[start .. start + count) are computed.
struct StepEntry {
  Sequence* seq = nullptr;
  int32_t start = 0, count = 0;
  bool wants_logits = false;  // start + count == tokens.size(): the step yields a new token
  // Prompt scoring: positions score_begin .. score_begin + score_rows - 1 (within the chunk) give
  // the log-probabilities of tokens score_begin + 1 .. score_begin + score_rows.
  int32_t score_begin = 0, score_rows = 0;
};

struct StepPlan {
  std::vector<StepEntry> entries;  // decodes first, then prefill chunks, in the order above
  std::vector<uint64_t> preempted; // sequences preempted while planning this step
  int32_t tokens = 0;
  int32_t score_rows = 0;          // over all entries (<= max_score_rows)
  bool empty() const { return entries.empty(); }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);
  ~Scheduler();

  const SchedulerConfig& config() const { return config_; }
  // Tokens a sequence may ever hold (the pool's capacity).
  int64_t capacity_tokens() const { return static_cast<int64_t>(config_.num_pages) * config_.page_size; }

  // Queues a new sequence (prompt ids, at least one); the id must be new. score_from: 0, or the
  // first prompt token (1 .. prompt size - 1) whose log-probability the sequence wants (needs
  // max_score_rows > 0).
  Sequence* add(uint64_t id, std::vector<int32_t> prompt, int32_t score_from = 0);
  // Removes a sequence, running or waiting, and releases its pages (full computed pages are offered
  // to the radix cache first). Returns false for an unknown id.
  bool remove(uint64_t id);
  Sequence* find(uint64_t id);

  StepPlan schedule();
  // The step after `current` (planned, its tokens not appended yet) when `current` is a step of
  // decodes only that holds every running sequence: first the entries keep[i] marks, each
  // computing the token `current` samples for it (tokens[start] once appended), with pages
  // reserved for it (evicting cached pages, never preempting); then admissions as schedule()
  // makes them (the sequences `current` ends still count against max_running). This is the plan
  // schedule() would make after committing `current` with those sequences still running (or one
  // with fewer admissions), so a step can be planned and launched before the one before it
  // finishes. False (`next` untouched; pages reserved so far stay with their sequences, which
  // need them next) when the conditions do not hold, pages run out for a kept entry, or the plan
  // is empty.
  bool plan_continuation(const StepPlan& current, const std::vector<char>& keep, StepPlan& next);
  // After the step ran: every entry's tokens are computed; full pages go to the radix cache.
  void commit(const StepPlan& plan);
  // Appends a token sampled for a sequence (after commit).
  void append(Sequence* seq, int32_t token) { seq->tokens.push_back(token); }

  // The policy version new pages are stamped with and radix lookups match.
  uint64_t policy_version() const { return version_; }
  void set_policy_version(uint64_t v) { version_ = v; }

  // While closed, step 3 only takes back sequences admitted before (preempted ones), so that the
  // sequences in flight can finish (a synchronous weight update waits for that).
  void set_admission_open(bool open) { admission_open_ = open; }
  bool admission_open() const { return admission_open_; }
  // Sequences admitted at least once and not removed: running, or waiting after a preemption.
  int32_t admitted_count() const;
  // Drops every node of the radix cache (pages that running sequences hold stay theirs).
  void flush_prefix_cache() { radix_.clear(); }
  // Radix pages matched whose version differed from the current one: always 0 (an audit of the
  // rule above, reported in the engine's stats).
  int64_t cross_version_hits() const { return cross_version_hits_; }

  int32_t running_count() const { return static_cast<int32_t>(running_.size()); }
  int32_t waiting_count() const { return static_cast<int32_t>(waiting_.size()); }
  const PagePool& pool() const { return pool_; }
  const RadixCache& radix() const { return radix_; }
  const std::vector<Sequence*>& running() const { return running_; }
  bool idle() const { return running_.empty() && waiting_.empty(); }

 private:
  // Gives `seq` pages for its first `tokens` tokens; evicts, then preempts the newest running
  // sequence other than `seq` (recording it in `plan`). False when even that is not enough.
  bool reserve(Sequence* seq, int32_t tokens, StepPlan& plan, bool may_preempt);
  // The tokens a step may still take after `plan`'s entries so far: mixed_step_tokens once it
  // decodes (every entry so far a decode), else max_step_tokens.
  int32_t step_budget(const StepPlan& plan) const;
  // Appends an entry computing `count` tokens of `seq` from seq->computed (budget -= count).
  void add_entry(StepPlan& plan, Sequence* seq, int32_t count, int32_t& budget);
  // Step 3 of a plan: admissions in arrival order under `budget` (never preempting).
  void admit_waiting(StepPlan& plan, int32_t& budget);
  void preempt(Sequence* victim, StepPlan& plan);
  void offer_full_pages(Sequence* seq);
  void release_pages(Sequence* seq);
  void enqueue_waiting(Sequence* seq);  // by arrival order
  // Whether a running sequence is computing full pages of `seq`'s prefix beyond its radix match
  // (seq->pages), which the cache will hold once they are committed.
  bool awaits_shared_prefix(const Sequence* seq) const;
  // Full pages the radix cache may serve `seq`: never its last token (computed for its logits)
  // nor a position whose logits score its prompt.
  int32_t max_cached_pages(const Sequence& seq) const;
  // `chunk` cut so that its score rows fit in `score_budget` (0 when its first position needs one).
  int32_t fit_chunk(const Sequence& seq, int32_t chunk, int32_t score_budget) const;

  SchedulerConfig config_;
  PagePool pool_;
  RadixCache radix_;
  uint64_t version_ = 0;
  bool admission_open_ = true;
  int64_t cross_version_hits_ = 0;
  uint64_t arrivals_ = 0, admissions_ = 0;
  std::map<uint64_t, std::unique_ptr<Sequence>> sequences_;
  std::deque<Sequence*> waiting_;   // arrival order
  std::vector<Sequence*> running_;  // admission order (oldest first)
};

}  // namespace kiln
