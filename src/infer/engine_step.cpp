// The engine's steps: planning, launching, committing a step's tokens and delivering their
// events, with lookahead (the next decode step planned and launched while the current one runs).
//
// Lookahead: after a step of decodes only (every running request; no cancel or update pending) is
// launched, the step after it is planned at once from its plan (Scheduler::plan_continuation):
// the decode of every request whose last token the first step cannot give (max_tokens), then the
// admissions of waiting requests (new arrivals included); it is launched behind the first. Its
// decodes' input tokens are the first step's samples, copied on the device (Executor::launch's
// continued_from). It is the step schedule() would plan after committing the first, so outputs
// are those without lookahead. A request that the first step ends (a stop token) or a stop string
// ends has a row in the second whose token is dropped; it leaves the scheduler (its pages and
// counts row freed) once no step in flight computes for it. The chain goes on while the conditions
// hold; step() returns with nothing in flight.
//
// Pacing: a request that arrives while a step runs is admitted by the next step planned, and with a
// step always queued that would be one step later than without lookahead. So the next step is
// planned once the device has about kLookaheadLead of the current one left (from the replayed
// steps' measured device time), late enough for most arrivals and early enough for the host to
// plan, pack and launch it before the device runs dry.
#include <algorithm>
#include <thread>

#include "infer/engine_internal.h"
#include "infer/executor.h"
#include "infer/structured/token_masks.h"

namespace kiln {
namespace {

bool has_penalties(const GenerationRequest& r) {
  return r.repetition_penalty != 1.0f || r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f;
}

}  // namespace

void Engine::retire_when_free(Live& live) {
  if (live.retired || live.retire_queued) return;
  if (live.last_step <= committed_steps_) return retire(live);
  live.retire_queued = true;
  retire_after_step_.push_back(&live);
}

void Engine::commit_step(const StepWork& work, const std::vector<SampledToken>& out) {
  KILN_ASSERT(work.number == committed_steps_ + 1);
  committed_steps_ = work.number;
  const StepPlan& plan = work.plan;
  scheduler_->commit(plan);
  const std::vector<float>& prompt_logprobs = executor_->prompt_logprobs();
  // Prompt log-probabilities first: they go out before the request's first generated token.
  size_t at = 0;
  for (const StepEntry& e : plan.entries) {
    if (e.score_rows == 0) continue;
    Live& live = *live_.at(e.seq->id);
    PendingToken p{&live, std::nullopt, nullptr, {}};
    p.prompt_logprobs.assign(prompt_logprobs.begin() + at, prompt_logprobs.begin() + at + e.score_rows);
    at += e.score_rows;
    pending_.push_back(std::move(p));
  }
  KILN_ASSERT(at == prompt_logprobs.size());
  for (size_t i = 0; i < work.sampled.size(); ++i) {
    Live& live = *work.sampled[i];
    // Ended while this step ran (a stop string) or by an earlier step (a stop token, with this
    // step launched ahead): its token is dropped.
    if (live.done || live.ended) continue;
    const GenerationRequest& r = live.request;
    if (r.max_tokens == 0) {  // a scoring request that generates nothing: its prompt is done
      live.ended = true;
      retire_when_free(live);
      pending_.push_back(PendingToken{&live, std::nullopt, "length", {}});
      continue;
    }
    const SampledToken& s = out[i];
    scheduler_->append(scheduler_->find(live.id), s.token);
    ++generated_total_;
    ++live.generated;
    PendingToken p{&live, GeneratedToken{}, nullptr, {}};
    p.token->id = s.token;
    p.token->logprob = s.logprob;
    p.token->top = s.top;
    p.token->policy_version = work.version;
    bool stop = std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), s.token) != r.stop_token_ids.end() ||
                (!r.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), s.token) != eos_ids_.end());
    if (live.matcher && !stop) {
      // A structured output ends once its value is complete and nothing may follow (or, had no
      // token continued it, at whatever was drawn).
      const std::optional<std::string> bytes = tokenizer_->token_bytes(s.token);
      stop = !bytes || !live.matcher->advance(*bytes) || live.matcher->finished();
    }
    if (stop || live.generated >= r.max_tokens) {
      p.finish_reason = stop ? "stop" : "length";
      live.ended = true;
      retire_when_free(live);  // not planned again; its events still go out in order
    }
    pending_.push_back(std::move(p));
  }
  // Requests ended while steps computed for them leave once the last of those is committed.
  auto it = retire_after_step_.begin();
  for (Live* live : retire_after_step_) {
    if (live->last_step > committed_steps_) {
      *it++ = live;
      continue;
    }
    live->retire_queued = false;
    retire(*live);
    if (live->done) live_.erase(live->id);  // its final event went out (else delivery erases it)
  }
  retire_after_step_.erase(it, retire_after_step_.end());
}

void Engine::deliver_pending() {
  const double t0 = now_seconds();
  for (PendingToken& p : pending_) {
    Live& live = *p.live;
    if (live.done) continue;
    if (!p.token) {
      if (!p.prompt_logprobs.empty()) {
        EngineEvent e;
        e.prompt_logprobs = std::move(p.prompt_logprobs);
        live.stream->push(std::move(e));
      }
      if (!p.finish_reason) continue;
      finish(live, p.finish_reason);
    } else {
      EngineEvent e;
      e.tokens.push_back(std::move(*p.token));
      bool by_string = false;
      // With special tokens in the text, the EOS that ends the request still shows nothing.
      const bool silent_eos = !live.request.skip_special_tokens && p.finish_reason && !live.request.ignore_eos &&
                              std::find(eos_ids_.begin(), eos_ids_.end(), e.tokens.back().id) != eos_ids_.end();
      if (live.text && !silent_eos) {
        StopStringMatcher::Update u = live.text->push(e.tokens.back().id);
        e.text = std::move(u.text);
        live.stopped_by_string = u.stopped;
        live.stop_string = std::move(u.matched);
        by_string = u.stopped;
      }
      live.stream->push(std::move(e));
      if (!by_string && !p.finish_reason) continue;
      finish(live, by_string ? "stop" : p.finish_reason);
    }
    retire_when_free(live);  // a step in flight may still compute for it: it leaves after that
    if (live.retired) live_.erase(live.id);
  }
  pending_.clear();
  deliver_seconds_ += now_seconds() - t0;
}

bool Engine::plan_step(StepWork& work) {
  const double t_start = now_seconds();
  work.plan = scheduler_->schedule();
  schedule_seconds_ += now_seconds() - t_start;
  preemptions_ += static_cast<int64_t>(work.plan.preempted.size());
  for (uint64_t id : work.plan.preempted) {  // a preempted request gives its counts row back
    Live& live = *live_.at(id);
    if (live.counts_row >= 0) executor_->release_counts_row(live.counts_row);
    live.counts_row = -1;
  }
  if (work.plan.empty()) return false;
  work.version = scheduler_->policy_version();
  return plan_rows(work, 0);
}

bool Engine::plan_rows(StepWork& work, size_t first) {
  for (size_t i = first; i < work.plan.entries.size(); ++i) {
    const StepEntry& e = work.plan.entries[i];
    Live& live = *live_.at(e.seq->id);
    const GenerationRequest& r = live.request;
    if (live.admission_seen != e.seq->admission) {  // admitted (again) in this step
      live.admission_seen = e.seq->admission;
      hits_total_ += e.start;
      if (has_penalties(r)) {
        // Rebuild the request's token counts from its prompt and output so far.
        if (live.counts_row < 0) live.counts_row = executor_->acquire_counts_row();
        const std::vector<int32_t> output(e.seq->tokens.begin() + e.seq->prompt_len, e.seq->tokens.end());
        Status st = executor_->reset_counts(live.counts_row, r.prompt, output);
        if (!st.ok()) {
          fail_all(st.message());
          return false;
        }
      }
    }
    if (!e.wants_logits) continue;
    ops::SamplingRow row;
    row.temperature = r.temperature;
    row.top_k = r.top_k;
    row.top_p = r.top_p;
    row.min_p = r.min_p;
    row.repetition_penalty = r.repetition_penalty;
    row.frequency_penalty = r.frequency_penalty;
    row.presence_penalty = r.presence_penalty;
    row.logprobs = r.logprobs || r.top_logprobs > 0 ? ops::kLogprobsRaw : ops::kLogprobsOff;
    if (r.behaviour_logprobs) row.logprobs = ops::kLogprobsSampled;  // implies logprobs
    row.top_logprobs = r.top_logprobs;
    row.counts_row = live.counts_row;
    row.seed_lo = static_cast<uint32_t>(r.seed);
    row.seed_hi = static_cast<uint32_t>(r.seed >> 32);
    row.position = e.start + e.count;  // the position the new token will take
    work.rows.push_back(row);
    work.sampled.push_back(&live);
    work.constraints.push_back({live.matcher ? next_token_mask(live) : nullptr, &r.logit_bias});
  }
  return true;
}

const uint32_t* Engine::next_token_mask(Live& live) {
  if (!masker_) masker_ = std::make_unique<structured::TokenMasker>(token_vocab_);
  live.mask.resize(static_cast<size_t>(masker_->vocabulary().words()));
  masker_->allowed(*live.matcher, live.end_ids, live.mask.data());
  if (std::all_of(live.mask.begin(), live.mask.end(), [](uint32_t w) { return w == 0; }))
    for (int32_t t : live.end_ids) live.mask[t >> 5] |= uint32_t(1) << (t & 31);  // no token continues it: end it
  return live.mask.data();
}

bool Engine::plan_lookahead(const StepWork& current, StepWork& next, std::vector<int32_t>& continued_from) {
  if (!options_.lookahead || current.sampled.size() != current.plan.entries.size()) return false;
  // A structured output's next mask needs the token this step draws.
  for (const Live* live : current.sampled)
    if (live->matcher) return false;
  std::vector<std::pair<uint64_t, std::unique_ptr<Live>>> arrivals;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !cancels_.empty() || !updates_.empty() || flush_requested_) return false;
    arrivals.swap(inbox_);  // admitted by the step planned here, as the next scheduled one would
  }
  queue_arrivals(arrivals);
  // Kept: requests still running after `current` unless its token ends them (unknown yet). Its
  // token is the last by max_tokens when they have generated max_tokens - 1 before it.
  std::vector<char> keep(current.sampled.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    const Live& live = *current.sampled[i];
    keep[i] = !live.done && !live.ended && live.generated + 1 < live.request.max_tokens;
  }
  const double t_start = now_seconds();
  const bool planned = scheduler_->plan_continuation(current.plan, keep, next.plan);
  schedule_seconds_ += now_seconds() - t_start;
  if (!planned) return false;
  next.version = current.version;
  continued_from.clear();
  for (size_t i = 0; i < keep.size(); ++i) {
    if (!keep[i]) continue;
    ops::SamplingRow row = current.rows[i];
    ++row.position;
    next.rows.push_back(row);
    next.sampled.push_back(current.sampled[i]);
    next.constraints.push_back({nullptr, &current.sampled[i]->request.logit_bias});
    continued_from.push_back(static_cast<int32_t>(i));
  }
  // Admissions after the continued entries.
  return plan_rows(next, continued_from.size());
}

void Engine::launch_step(StepWork& work, const std::vector<int32_t>* continued_from) {
  work.number = ++launched_steps_;
  for (const StepEntry& e : work.plan.entries) live_.at(e.seq->id)->last_step = work.number;
  executor_->launch(work.plan, work.rows, continued_from, &work.constraints);
  if (continued_from) ++lookahead_steps_;
}

void Engine::pace_lookahead(const StepWork& current, double current_start, double step_seconds) const {
  // Only where a step may follow ahead: decodes only, after a replayed step of the chain.
  if (!options_.lookahead || current.sampled.size() != current.plan.entries.size() || !(step_seconds > 0.0))
    return;
  const double target = current_start + step_seconds * (1.0 - kLookaheadLead);
  const double wait = target - now_seconds();
  if (wait > 0.0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
}

void Engine::step() {
  StepWork current;
  if (!plan_step(current)) return deliver_pending();
  launch_step(current, nullptr);
  double current_start = now_seconds();  // when the device started it (nothing was queued before it)
  double step_seconds = 0.0;             // device time of the chain's last replayed step (0: none yet)
  std::vector<int32_t> continued_from;
  while (true) {
    deliver_pending();  // the previous step's events, while the device runs this one
    pace_lookahead(current, current_start, step_seconds);
    StepWork next;
    const bool ahead = plan_lookahead(current, next, continued_from);
    if (!executor_->in_flight()) return;  // a failure while planning it ended everything
    if (ahead) launch_step(next, &continued_from);
    Result<std::vector<SampledToken>> out = executor_->wait();
    const double finished = now_seconds();
    ++steps_;
    if (!out.ok()) return fail_all(out.status().message());
    // The device time of this step when it was a replay: the next one of a chain has its shape
    // (or a smaller batch), so it paces the next planning.
    step_seconds = executor_->last_graph_seconds();
    commit_step(current, *out);
    if (!ahead) return;
    publish_stats();
    current = std::move(next);
    current_start = finished;  // it was queued: it started when the one before it ended
  }
}

}  // namespace kiln
