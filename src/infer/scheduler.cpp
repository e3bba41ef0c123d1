#include "infer/scheduler.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "core/status.h"

namespace kiln {

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), pool_(PagePool::paged(config.num_pages, config.page_size)), radix_(pool_) {
  KILN_ASSERT(config.num_pages > 0 && config.page_size > 0 && config.max_running > 0);
  KILN_ASSERT(config.max_step_tokens >= config.max_running);
  KILN_ASSERT(config.mixed_step_tokens == 0 ||
              (config.mixed_step_tokens >= config.max_running && config.mixed_step_tokens <= config.max_step_tokens));
}

int32_t Scheduler::step_budget(const StepPlan& plan) const {
  const int32_t mixed = config_.mixed_step_tokens > 0 ? config_.mixed_step_tokens : config_.max_step_tokens;
  return (plan.tokens > 0 ? mixed : config_.max_step_tokens) - plan.tokens;
}

Scheduler::~Scheduler() {
  for (auto& [id, seq] : sequences_) release_pages(seq.get());
}

Sequence* Scheduler::add(uint64_t id, std::vector<int32_t> prompt, int32_t score_from) {
  KILN_ASSERT(!prompt.empty() && !sequences_.count(id));
  KILN_ASSERT(score_from == 0 || (score_from > 0 && score_from < static_cast<int32_t>(prompt.size()) &&
                                  config_.max_score_rows > 0));
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->prompt_len = static_cast<int32_t>(prompt.size());
  seq->score_from = seq->next_scored = score_from;
  seq->tokens = std::move(prompt);
  seq->arrival = ++arrivals_;
  Sequence* s = seq.get();
  sequences_.emplace(id, std::move(seq));
  waiting_.push_back(s);
  return s;
}

Sequence* Scheduler::find(uint64_t id) {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : it->second.get();
}

bool Scheduler::remove(uint64_t id) {
  Sequence* seq = find(id);
  if (!seq) return false;
  offer_full_pages(seq);
  release_pages(seq);
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
  sequences_.erase(id);
  return true;
}

void Scheduler::offer_full_pages(Sequence* seq) {
  if (!config_.prefix_cache) return;
  // KV computed (partly) under other weights than the current ones stays private to its sequence.
  if (seq->kv_version != version_) return;
  const int32_t full = std::min<int32_t>(seq->computed / config_.page_size, static_cast<int32_t>(seq->pages.size()));
  if (full <= seq->offered_pages) return;
  const std::vector<int32_t> pages(seq->pages.begin(), seq->pages.begin() + full);
  radix_.insert(seq->tokens.data(), pages, version_);
  seq->offered_pages = full;
}

int32_t Scheduler::admitted_count() const {
  int32_t n = static_cast<int32_t>(running_.size());
  for (const Sequence* w : waiting_) n += w->admission > 0 ? 1 : 0;
  return n;
}

void Scheduler::release_pages(Sequence* seq) {
  for (int32_t p : seq->pages) pool_.release(p);
  seq->pages.clear();
  seq->computed = 0;
  seq->offered_pages = 0;
}

void Scheduler::enqueue_waiting(Sequence* seq) {
  auto at = std::find_if(waiting_.begin(), waiting_.end(), [&](Sequence* w) { return w->arrival > seq->arrival; });
  waiting_.insert(at, seq);
}

void Scheduler::preempt(Sequence* victim, StepPlan& plan) {
  for (auto it = plan.entries.begin(); it != plan.entries.end();) {
    if (it->seq == victim) {
      plan.tokens -= it->count;
      it = plan.entries.erase(it);
    } else {
      ++it;
    }
  }
  offer_full_pages(victim);
  release_pages(victim);
  victim->running = false;
  ++victim->preemptions;
  running_.erase(std::remove(running_.begin(), running_.end(), victim), running_.end());
  enqueue_waiting(victim);
  plan.preempted.push_back(victim->id);
}

bool Scheduler::reserve(Sequence* seq, int32_t tokens, StepPlan& plan, bool may_preempt) {
  const int32_t ps = config_.page_size;
  const int32_t need_pages = (tokens + ps - 1) / ps;
  while (static_cast<int32_t>(seq->pages.size()) < need_pages) {
    int32_t page = pool_.allocate(version_);
    if (page < 0 && radix_.evict(need_pages - static_cast<int32_t>(seq->pages.size())) > 0) page = pool_.allocate(version_);
    if (page >= 0) {
      seq->pages.push_back(page);
      continue;
    }
    if (!may_preempt) return false;
    Sequence* victim = running_.back();  // the newest admission
    if (victim == seq) return false;
    preempt(victim, plan);
  }
  return true;
}

int32_t Scheduler::max_cached_pages(const Sequence& seq) const {
  const int32_t ps = config_.page_size;
  int32_t pages = (static_cast<int32_t>(seq.tokens.size()) - 1) / ps;
  if (seq.score_from > 0 && seq.next_scored < seq.prompt_len) pages = std::min(pages, (seq.next_scored - 1) / ps);
  return pages;
}

bool Scheduler::awaits_shared_prefix(const Sequence* seq) const {
  const int32_t ps = config_.page_size;
  const int32_t matched = static_cast<int32_t>(seq->pages.size());
  const int32_t max_pages = max_cached_pages(*seq);
  if (matched >= max_pages) return false;
  for (const Sequence* r : running_) {
    // Full pages both share beyond what the cache gave, that r has not offered to the cache yet.
    const int32_t limit = std::min<int32_t>(max_pages * ps, static_cast<int32_t>(r->tokens.size()));
    int32_t common = matched * ps;
    while (common < limit && r->tokens[common] == seq->tokens[common]) ++common;
    const int32_t shared_pages = common / ps;
    if (shared_pages > matched && r->offered_pages < shared_pages) return true;
  }
  return false;
}

namespace {

// The first position of a chunk starting at `start` whose logits score a prompt token, and how
// many positions from there on do (up to the prompt's second-to-last position).
std::pair<int32_t, int32_t> scored_positions(const Sequence& s, int32_t start, int32_t count) {
  if (s.score_from == 0 || s.next_scored >= s.prompt_len) return {start, 0};
  const int32_t begin = std::max(start, s.next_scored - 1);
  const int32_t end = std::min(start + count, s.prompt_len - 1);
  return {begin, std::max(0, end - begin)};
}

}  // namespace

int32_t Scheduler::fit_chunk(const Sequence& seq, int32_t chunk, int32_t score_budget) const {
  const auto [begin, rows] = scored_positions(seq, seq.computed, chunk);
  if (rows <= score_budget) return chunk;
  return begin - seq.computed + score_budget;  // cut where the step's score rows run out (maybe 0)
}

void Scheduler::add_entry(StepPlan& plan, Sequence* seq, int32_t count, int32_t& budget) {
  StepEntry e;
  e.seq = seq;
  e.start = seq->computed;
  e.count = count;
  e.wants_logits = seq->computed + count == static_cast<int32_t>(seq->tokens.size());
  std::tie(e.score_begin, e.score_rows) = scored_positions(*seq, e.start, count);
  plan.entries.push_back(e);
  plan.tokens += count;
  plan.score_rows += e.score_rows;
  budget -= count;
}

void Scheduler::admit_waiting(StepPlan& plan, int32_t& budget) {
  for (auto it = waiting_.begin();
       it != waiting_.end() && budget > 0 && static_cast<int32_t>(running_.size()) < config_.max_running;) {
    Sequence* seq = *it;
    if (!admission_open_ && seq->admission == 0) {  // closed: only preempted sequences come back
      ++it;
      continue;
    }
    const int32_t n = static_cast<int32_t>(seq->tokens.size());
    KILN_ASSERT(seq->pages.empty() && seq->computed == 0);
    if (config_.prefix_cache) {
      seq->pages = radix_.match(seq->tokens.data(), n, version_, max_cached_pages(*seq));
      for (int32_t p : seq->pages) cross_version_hits_ += pool_.version(p) != version_ ? 1 : 0;
      seq->computed = static_cast<int32_t>(seq->pages.size()) * config_.page_size;
      seq->offered_pages = static_cast<int32_t>(seq->pages.size());
      if (awaits_shared_prefix(seq)) {  // it waits for those pages instead of computing them again
        release_pages(seq);
        ++it;
        continue;
      }
    }
    const int32_t chunk = fit_chunk(*seq, std::min(n - seq->computed, budget), config_.max_score_rows - plan.score_rows);
    if (chunk == 0) {  // no score rows left in this step: it is admitted next step (FCFS)
      release_pages(seq);
      break;
    }
    if (!reserve(seq, seq->computed + chunk, plan, false)) {
      release_pages(seq);
      break;
    }
    if (seq->cached_prompt_tokens < 0) seq->cached_prompt_tokens = std::min(seq->computed, seq->prompt_len);
    it = waiting_.erase(it);
    seq->running = true;
    if (seq->admission == 0) seq->first_admission_version = version_;
    seq->admission = ++admissions_;
    seq->kv_version = version_;
    running_.push_back(seq);
    add_entry(plan, seq, chunk, budget);
  }
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int32_t budget = config_.max_step_tokens;
  // 1. Decodes: every running sequence with one token left, oldest first.
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence* seq = running_[i];
    const int32_t left = static_cast<int32_t>(seq->tokens.size()) - seq->computed;
    if (left != 1) continue;
    if (!reserve(seq, seq->computed + 1, plan, true)) {
      preempt(seq, plan);  // it is the newest: it waits and recomputes later
      break;               // everyone older is planned; nobody newer is left
    }
    add_entry(plan, seq, 1, budget);
  }
  budget = std::min(budget, step_budget(plan));
  // 2. Chunks of running sequences with more than one token left.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    const int32_t left = static_cast<int32_t>(seq->tokens.size()) - seq->computed;
    if (left <= 1) continue;
    const int32_t chunk = fit_chunk(*seq, std::min(left, budget), config_.max_score_rows - plan.score_rows);
    if (chunk == 0) continue;  // its next positions score the prompt and this step has no rows left
    if (!reserve(seq, seq->computed + chunk, plan, true)) {
      preempt(seq, plan);
      break;
    }
    add_entry(plan, seq, chunk, budget);
  }
  // 3. Admissions in arrival order.
  admit_waiting(plan, budget);
  return plan;
}

bool Scheduler::plan_continuation(const StepPlan& current, const std::vector<char>& keep, StepPlan& next) {
  KILN_ASSERT(keep.size() == current.entries.size());
  if (running_.size() != current.entries.size()) return false;
  for (size_t i = 0; i < current.entries.size(); ++i) {
    const StepEntry& e = current.entries[i];
    if (e.count != 1 || !e.wants_logits || e.score_rows != 0 || !e.seq->running) return false;
    if (keep[i] && (e.seq->computed != e.start || e.start + 1 != static_cast<int32_t>(e.seq->tokens.size())))
      return false;
  }
  StepPlan plan;
  for (size_t i = 0; i < current.entries.size(); ++i) {
    if (!keep[i]) continue;
    Sequence* seq = current.entries[i].seq;
    if (!reserve(seq, seq->computed + 2, plan, false)) return false;
    StepEntry e;
    e.seq = seq;
    e.start = e.score_begin = seq->computed + 1;
    e.count = 1;
    e.wants_logits = true;
    plan.entries.push_back(e);
    ++plan.tokens;
  }
  // Sequences that `current` ends still count against max_running until they leave: every running
  // sequence may hold one of the executor's per-request rows (penalty counts) until then.
  int32_t budget = step_budget(plan);
  admit_waiting(plan, budget);
  if (plan.empty()) return false;
  next = std::move(plan);
  return true;
}

void Scheduler::commit(const StepPlan& plan) {
  for (const StepEntry& e : plan.entries) {
    KILN_ASSERT(e.seq->computed == e.start);
    e.seq->computed += e.count;
    if (e.score_rows > 0) e.seq->next_scored = e.score_begin + e.score_rows + 1;
    offer_full_pages(e.seq);
  }
}

}  // namespace kiln
