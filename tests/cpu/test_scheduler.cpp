// Page pool, radix cache and scheduler, without a model: budgets, chunking, refill of freed slots,
// the per-step entries, preemption order, cancellation, reference counts, radix insert / match /
// evict, version isolation and the page mapping after a prefix hit.
#include <gtest/gtest.h>

#include <numeric>

#include "infer/cache/page_pool.h"
#include "infer/cache/radix_cache.h"
#include "infer/scheduler.h"

namespace kiln {
namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 100) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(PagePool, AllocatesLowestFirstAndCountsReferences) {
  PagePool pool = PagePool::paged(4, 16);
  EXPECT_EQ(pool.page_size(), 16);
  EXPECT_EQ(pool.allocate(7), 0);
  EXPECT_EQ(pool.allocate(7), 1);
  EXPECT_EQ(pool.version(1), 7u);
  EXPECT_EQ(pool.used_pages(), 2);
  pool.retain(0);
  EXPECT_EQ(pool.ref_count(0), 2);
  pool.release(0);
  EXPECT_EQ(pool.used_pages(), 2);
  pool.release(0);
  EXPECT_EQ(pool.used_pages(), 1);
  EXPECT_EQ(pool.allocate(8), 0);  // page 0 again, restamped
  EXPECT_EQ(pool.version(0), 8u);
  EXPECT_EQ(pool.allocate(8), 2);
  EXPECT_EQ(pool.allocate(8), 3);
  EXPECT_EQ(pool.allocate(8), -1);
  EXPECT_EQ(pool.free_pages(), 0);
}

TEST(RadixCache, InsertMatchAndReferenceCounts) {
  PagePool pool = PagePool::paged(8, 4);
  RadixCache radix(pool);
  const std::vector<int32_t> tokens = iota_tokens(10);  // 2 full pages + 2 tokens
  std::vector<int32_t> pages = {pool.allocate(0), pool.allocate(0)};
  radix.insert(tokens.data(), pages, 0);
  EXPECT_EQ(radix.cached_pages(), 2);
  EXPECT_EQ(pool.ref_count(pages[0]), 2);  // the request's and the cache's
  // A sequence sharing 6 tokens matches one full page; one sharing all 10 matches two.
  std::vector<int32_t> other = tokens;
  other[6] = 1;
  EXPECT_EQ(radix.match(other.data(), 10, 0, 10), std::vector<int32_t>{pages[0]});
  EXPECT_EQ(pool.ref_count(pages[0]), 3);
  EXPECT_EQ(radix.match(tokens.data(), 10, 0, 10), pages);
  EXPECT_EQ(radix.match(tokens.data(), 10, 0, 1), std::vector<int32_t>{pages[0]});  // max_pages
  EXPECT_TRUE(radix.match(tokens.data(), 3, 0, 10).empty());                       // no full page
  // Inserting the same prefix from other pages keeps the cached ones.
  std::vector<int32_t> dup = {pool.allocate(0)};
  radix.insert(tokens.data(), dup, 0);
  EXPECT_EQ(radix.cached_pages(), 2);
  EXPECT_EQ(pool.ref_count(dup[0]), 1);
}

TEST(RadixCache, VersionIsolation) {
  PagePool pool = PagePool::paged(8, 4);
  RadixCache radix(pool);
  const std::vector<int32_t> tokens = iota_tokens(8);
  std::vector<int32_t> v0 = {pool.allocate(0), pool.allocate(0)};
  radix.insert(tokens.data(), v0, 0);
  EXPECT_TRUE(radix.match(tokens.data(), 8, 1, 10).empty());  // version 1 never sees version 0's KV
  std::vector<int32_t> v1 = {pool.allocate(1)};
  radix.insert(tokens.data(), v1, 1);
  EXPECT_EQ(radix.match(tokens.data(), 8, 1, 10), v1);
  for (int32_t p : v1) pool.release(p);  // the match's reference
  EXPECT_EQ(radix.match(tokens.data(), 8, 0, 10), v0);
  for (int32_t p : v0) pool.release(p);
  for (int32_t p : v0) pool.release(p);  // the inserting request's
  pool.release(v1[0]);
  EXPECT_EQ(radix.evict_other_versions(1), 2);
  EXPECT_EQ(radix.cached_pages(), 1);
  EXPECT_TRUE(radix.match(tokens.data(), 8, 0, 10).empty());
}

TEST(RadixCache, EvictsLeastRecentlyUsedUnreferencedLeaves) {
  PagePool pool = PagePool::paged(8, 2);
  RadixCache radix(pool);
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  std::vector<int32_t> pa = {pool.allocate(0), pool.allocate(0)}, pb = {pool.allocate(0), pool.allocate(0)};
  radix.insert(a.data(), pa, 0);
  radix.insert(b.data(), pb, 0);
  for (int32_t p : pa) pool.release(p);
  for (int32_t p : pb) pool.release(p);
  EXPECT_EQ(radix.evictable_pages(), 4);
  for (int32_t p : radix.match(a.data(), 4, 0, 2)) pool.release(p);  // a is now the most recent
  std::vector<int32_t> held = radix.match(b.data(), 2, 0, 1);        // b's first page is in use
  EXPECT_EQ(radix.evictable_pages(), 3);                             // a's two pages, b's leaf
  EXPECT_EQ(radix.evict(1), 1);  // the least recently used leaf: b's second page
  EXPECT_EQ(pool.used_pages(), 3);
  std::vector<int32_t> again = radix.match(a.data(), 4, 0, 2);
  EXPECT_EQ(again, pa);  // a survived
  for (int32_t p : again) pool.release(p);
  EXPECT_EQ(radix.match(b.data(), 4, 0, 2).size(), 1u);  // b lost its second page
  pool.release(pb[0]);
  for (int32_t p : held) pool.release(p);
  EXPECT_EQ(radix.evict(10), 3);
  EXPECT_EQ(radix.cached_pages(), 0);
  EXPECT_EQ(pool.used_pages(), 0);
}

// `mixed`: the budget of steps that decode (0: `budget`, as for the others).
SchedulerConfig small_config(int32_t pages, int32_t page_size, int32_t max_running, int32_t budget,
                             int32_t mixed = 0) {
  SchedulerConfig c;
  c.num_pages = pages;
  c.page_size = page_size;
  c.max_running = max_running;
  c.max_step_tokens = budget;
  c.mixed_step_tokens = mixed;
  return c;
}

// Runs a planned step as an engine would: commit, then append a token to every entry with logits.
void finish_step(Scheduler& s, const StepPlan& plan, int32_t token = 7) {
  s.commit(plan);
  for (const StepEntry& e : plan.entries)
    if (e.wants_logits) s.append(e.seq, token);
}

TEST(Scheduler, ChunkedPrefillMixedWithDecodesUnderTheBudget) {
  Scheduler s(small_config(64, 4, 8, 10));
  s.add(1, iota_tokens(3));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].count, 3);
  EXPECT_TRUE(p.entries[0].wants_logits);
  finish_step(s, p);
  s.add(2, iota_tokens(25));  // 25 tokens: chunks of 9 (budget 10 - 1 decode), 9, 7
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[0].seq->id, 1u);  // the decode first
  EXPECT_EQ(p.entries[0].start, 3);
  EXPECT_EQ(p.entries[0].count, 1);
  EXPECT_EQ(p.entries[1].seq->id, 2u);
  EXPECT_EQ(p.entries[1].count, 9);
  EXPECT_FALSE(p.entries[1].wants_logits);
  EXPECT_EQ(p.tokens, 10);
  finish_step(s, p);
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[1].start, 9);
  EXPECT_EQ(p.entries[1].count, 9);
  finish_step(s, p);
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[1].start, 18);
  EXPECT_EQ(p.entries[1].count, 7);
  EXPECT_TRUE(p.entries[1].wants_logits);
  finish_step(s, p);
  EXPECT_EQ(s.find(2)->tokens.size(), 26u);
  EXPECT_EQ(s.find(2)->pages.size(), 7u);  // 25 computed tokens in pages of 4
}

TEST(Scheduler, StepsThatDecodeTakeTheMixedBudget) {
  // max_step_tokens 20, mixed_step_tokens 8: a prompt goes in chunks of 20 while nothing decodes;
  // once a request decodes, its steps hold 8 tokens in all.
  Scheduler s(small_config(64, 4, 8, 20, 8));
  s.add(1, iota_tokens(30, 1000));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].count, 20);
  finish_step(s, p);
  s.add(2, iota_tokens(30, 2000));
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[0].seq->id, 1u);
  EXPECT_EQ(p.entries[0].count, 10);  // the rest of request 1's prompt
  EXPECT_TRUE(p.entries[0].wants_logits);
  EXPECT_EQ(p.entries[1].seq->id, 2u);
  EXPECT_EQ(p.entries[1].count, 10);  // up to max_step_tokens: nothing decodes in this step
  finish_step(s, p);
  p = s.schedule();  // request 1 decodes
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[0].seq->id, 1u);
  EXPECT_EQ(p.entries[0].count, 1);
  EXPECT_EQ(p.entries[1].seq->id, 2u);
  EXPECT_EQ(p.entries[1].start, 10);
  EXPECT_EQ(p.entries[1].count, 7);
  EXPECT_EQ(p.tokens, 8);
  finish_step(s, p);
  for (int step = 0; step < 8 && s.find(2)->computed < 30; ++step) finish_step(s, s.schedule());
  ASSERT_EQ(s.find(2)->computed, 30);
  // A step of two decodes, and an arrival while it runs: the continuation admits it with the 6
  // tokens the mixed budget leaves, as schedule() would.
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);
  s.add(3, iota_tokens(30, 3000));
  StepPlan next;
  ASSERT_TRUE(s.plan_continuation(p, {1, 1}, next));
  ASSERT_EQ(next.entries.size(), 3u);
  EXPECT_EQ(next.entries[2].seq->id, 3u);
  EXPECT_EQ(next.entries[2].count, 6);
  EXPECT_EQ(next.tokens, 8);
}

TEST(Scheduler, RefillsFreedSlotsAndPlansExactlyTheActiveRequests) {
  Scheduler s(small_config(64, 4, 2, 64));
  for (uint64_t id = 1; id <= 4; ++id) s.add(id, iota_tokens(5, 10 * static_cast<int32_t>(id)));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);  // the running limit
  EXPECT_EQ(s.waiting_count(), 2);
  finish_step(s, p);
  EXPECT_TRUE(s.remove(1));  // request 1 finishes
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);  // request 2 decodes, request 3 takes the freed place at once
  EXPECT_EQ(p.entries[0].seq->id, 2u);
  EXPECT_EQ(p.entries[0].count, 1);
  EXPECT_EQ(p.entries[1].seq->id, 3u);
  EXPECT_EQ(p.entries[1].count, 5);
  finish_step(s, p);
  EXPECT_TRUE(s.remove(2));
  EXPECT_TRUE(s.remove(3));
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].seq->id, 4u);
  EXPECT_FALSE(s.remove(99));
}

TEST(Scheduler, PrefixHitRebuildsTheMappingOntoSharedPages) {
  Scheduler s(small_config(64, 4, 8, 64));
  std::vector<int32_t> prompt = iota_tokens(14);
  s.add(1, prompt);
  StepPlan p = s.schedule();
  finish_step(s, p);
  const std::vector<int32_t> first_pages = s.find(1)->pages;  // 4 pages, 3 of them full
  std::vector<int32_t> second = prompt;
  second.resize(12);
  second.push_back(5);  // shares 12 tokens = 3 full pages
  s.add(2, second);
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);
  const StepEntry& e = p.entries[1];
  EXPECT_EQ(e.seq->id, 2u);
  EXPECT_EQ(e.start, 12);
  EXPECT_EQ(e.count, 1);
  EXPECT_EQ(e.seq->cached_prompt_tokens, 12);
  ASSERT_EQ(e.seq->pages.size(), 4u);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(e.seq->pages[k], first_pages[k]);
  EXPECT_NE(e.seq->pages[3], first_pages[3]);
  EXPECT_EQ(s.pool().ref_count(first_pages[0]), 3);  // request 1, request 2, the cache
  // A prompt that is entirely cached still computes its last token.
  std::vector<int32_t> third(prompt.begin(), prompt.begin() + 12);
  s.add(3, third);
  finish_step(s, p);
  p = s.schedule();
  const StepEntry& t = p.entries.back();
  EXPECT_EQ(t.seq->id, 3u);
  EXPECT_EQ(t.start, 8);
  EXPECT_EQ(t.count, 4);
}

TEST(Scheduler, ConcurrentRequestsWaitForASharedPrefixInsteadOfRecomputingIt) {
  // Page size 4, budget 12 tokens: request 1's 20-token prompt takes two steps. Request 2 shares its
  // first 16 tokens (4 full pages); request 3 shares nothing and is admitted past the waiting 2.
  Scheduler s(small_config(64, 4, 8, 12));
  std::vector<int32_t> a = iota_tokens(20), b = iota_tokens(18), c = iota_tokens(6, 900);
  b[16] = 1, b[17] = 2;
  s.add(1, a);
  s.add(2, b);
  s.add(3, c);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.entries.size(), 1u);  // request 1's first chunk uses the whole budget
  EXPECT_EQ(p.entries[0].seq->id, 1u);
  finish_step(s, p);
  p = s.schedule();  // 1 computes 12..20; 2 waits for pages 3 and 4 (12..16); 3 goes ahead
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[0].seq->id, 1u);
  EXPECT_EQ(p.entries[1].seq->id, 3u);
  EXPECT_EQ(p.entries[1].start, 0);
  EXPECT_EQ(s.waiting_count(), 1);
  finish_step(s, p);
  p = s.schedule();  // the shared 16 tokens are cached now: 2 computes only its own 2
  const StepEntry& e = p.entries.back();
  ASSERT_EQ(e.seq->id, 2u);
  EXPECT_EQ(e.start, 16);
  EXPECT_EQ(e.count, 2);
  EXPECT_EQ(e.seq->cached_prompt_tokens, 16);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(e.seq->pages[k], s.find(1)->pages[k]);
}

TEST(Scheduler, NoPrefixCacheAdmitsSharedPrefixesAtOnce) {
  SchedulerConfig cfg = small_config(64, 4, 8, 64);
  cfg.prefix_cache = false;
  Scheduler s(cfg);
  s.add(1, iota_tokens(20));
  s.add(2, iota_tokens(20));
  EXPECT_EQ(s.schedule().entries.size(), 2u);
}

TEST(Scheduler, NoPrefixCacheMeansNoSharing) {
  SchedulerConfig c = small_config(64, 4, 8, 64);
  c.prefix_cache = false;
  Scheduler s(c);
  s.add(1, iota_tokens(12));
  finish_step(s, s.schedule());
  s.add(2, iota_tokens(12));
  StepPlan p = s.schedule();
  EXPECT_EQ(p.entries.back().start, 0);
  EXPECT_EQ(s.radix().cached_pages(), 0);
}

TEST(Scheduler, PreemptsTheNewestWhenPagesRunOut) {
  // 6 pages of 2 tokens; three prompts of 4 tokens fill them, and every decode then needs a page.
  Scheduler s(small_config(6, 2, 8, 64));
  for (uint64_t id = 1; id <= 3; ++id) s.add(id, iota_tokens(4, 10 * static_cast<int32_t>(id)));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.entries.size(), 3u);
  finish_step(s, p);
  EXPECT_EQ(s.pool().free_pages(), 0);
  p = s.schedule();
  // Request 1 needs a page: request 3 (the newest) is preempted, its pages go to the radix cache
  // and are evicted for requests 1 and 2.
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], 3u);
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[0].seq->id, 1u);
  EXPECT_EQ(p.entries[1].seq->id, 2u);
  EXPECT_EQ(s.waiting_count(), 1);
  Sequence* third = s.find(3);
  EXPECT_EQ(third->computed, 0);
  EXPECT_TRUE(third->pages.empty());
  EXPECT_EQ(third->tokens.size(), 5u);  // keeps its generated token: recomputed later
  EXPECT_EQ(third->preemptions, 1);
  finish_step(s, p);
  EXPECT_TRUE(s.remove(1));
  p = s.schedule();  // request 3 comes back, recomputing prompt + generated token
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[1].seq->id, 3u);
  EXPECT_EQ(p.entries[1].start + p.entries[1].count, 5);
  EXPECT_TRUE(p.entries[1].wants_logits);
  EXPECT_EQ(third->cached_prompt_tokens, 0);  // usage keeps the first admission's figure
}

TEST(Scheduler, PreemptedRequestsWaitAheadOfLaterArrivals) {
  Scheduler s(small_config(4, 2, 8, 64));
  s.add(1, iota_tokens(4));
  s.add(2, iota_tokens(4, 50));
  finish_step(s, s.schedule());  // 2 pages each: full
  s.add(3, iota_tokens(1, 90));
  StepPlan p = s.schedule();  // request 1 needs a page: request 2 is preempted; 3 cannot be admitted
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], 2u);
  ASSERT_EQ(p.entries.size(), 1u);
  finish_step(s, p);
  EXPECT_TRUE(s.remove(1));
  p = s.schedule();
  ASSERT_GE(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].seq->id, 2u);  // before request 3
}

TEST(Scheduler, CancellationReleasesPages) {
  Scheduler s(small_config(16, 4, 8, 64));
  s.add(1, iota_tokens(10));
  finish_step(s, s.schedule());
  EXPECT_EQ(s.pool().used_pages(), 3);
  EXPECT_TRUE(s.remove(1));
  EXPECT_EQ(s.pool().used_pages(), 2);  // the two full pages stay in the radix cache
  EXPECT_EQ(s.radix().evictable_pages(), 2);
  s.add(2, iota_tokens(5));
  EXPECT_TRUE(s.remove(2));  // a waiting request goes too
  EXPECT_TRUE(s.idle());
}

TEST(Scheduler, VersionChangeStopsReuse) {
  Scheduler s(small_config(16, 4, 8, 64));
  s.add(1, iota_tokens(9));
  finish_step(s, s.schedule());
  EXPECT_TRUE(s.remove(1));
  s.set_policy_version(1);
  s.add(2, iota_tokens(9));
  StepPlan p = s.schedule();
  EXPECT_EQ(p.entries[0].start, 0);  // version 0's pages are not reused
  EXPECT_EQ(s.pool().version(p.entries[0].seq->pages[0]), 1u);
}

TEST(Scheduler, PromptScoringRowsAreBudgetedAndNeverServedFromTheCache) {
  // Page size 4, 8 score rows per step, budget 64 tokens.
  SchedulerConfig cfg = small_config(64, 4, 8, 64);
  cfg.max_score_rows = 8;
  Scheduler s(cfg);
  const std::vector<int32_t> prompt = iota_tokens(20);
  s.add(1, prompt);  // unscored: fills the cache with 4 full pages
  finish_step(s, s.schedule());
  EXPECT_TRUE(s.remove(1));
  // Tokens 10..19 scored: positions 9..18 give their logits, so only the first 2 pages (positions
  // 0..7) may come from the cache, and 10 rows over an 8-row budget split the prompt in two chunks.
  s.add(2, prompt, 10);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.entries.size(), 1u);
  StepEntry e = p.entries[0];
  EXPECT_EQ(e.start, 8);
  EXPECT_EQ(e.seq->cached_prompt_tokens, 8);
  EXPECT_EQ(e.count, 9);  // positions 8 .. 16: 8 of them (9 .. 16) score tokens 10 .. 17
  EXPECT_EQ(e.score_begin, 9);
  EXPECT_EQ(e.score_rows, 8);
  EXPECT_EQ(p.score_rows, 8);
  EXPECT_FALSE(e.wants_logits);
  finish_step(s, p);
  EXPECT_EQ(s.find(2)->next_scored, 18);
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 1u);
  e = p.entries[0];
  EXPECT_EQ(e.start, 17);
  EXPECT_EQ(e.count, 3);  // positions 17, 18 score tokens 18, 19; position 19 samples a new token
  EXPECT_EQ(e.score_begin, 17);
  EXPECT_EQ(e.score_rows, 2);
  EXPECT_TRUE(e.wants_logits);
  finish_step(s, p);
  EXPECT_EQ(s.find(2)->next_scored, 20);
  p = s.schedule();  // decoding: no more score rows
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].score_rows, 0);
  EXPECT_EQ(p.entries[0].count, 1);
}

TEST(Scheduler, ScoringRequestsShareTheStepsRowBudgetInArrivalOrder) {
  SchedulerConfig cfg = small_config(64, 4, 8, 64);
  cfg.max_score_rows = 6;
  Scheduler s(cfg);
  s.add(1, iota_tokens(5), 1);        // scores tokens 1..4: 4 rows
  s.add(2, iota_tokens(6, 300), 2);   // scores tokens 2..5: 4 rows, 2 fit; cut after position 2
  s.add(3, iota_tokens(6, 200), 1);   // no rows left: waits (FCFS)
  StepPlan p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[0].score_rows, 4);
  EXPECT_EQ(p.entries[1].start, 0);
  EXPECT_EQ(p.entries[1].count, 3);
  EXPECT_EQ(p.entries[1].score_begin, 1);
  EXPECT_EQ(p.entries[1].score_rows, 2);
  EXPECT_EQ(p.score_rows, 6);
  EXPECT_EQ(s.waiting_count(), 1);
  finish_step(s, p);
  p = s.schedule();  // 1 decodes; 2 scores tokens 4, 5 and samples; 3 is admitted with 4 rows
  ASSERT_EQ(p.entries.size(), 3u);
  EXPECT_EQ(p.entries[1].seq->id, 2u);
  EXPECT_EQ(p.entries[1].start, 3);
  EXPECT_EQ(p.entries[1].score_rows, 2);
  EXPECT_EQ(p.entries[2].seq->id, 3u);
  EXPECT_EQ(p.entries[2].score_rows, 4);
  EXPECT_EQ(p.entries[2].count, 4);  // positions 0..3 score tokens 1..4: cut at the row budget
  EXPECT_FALSE(p.entries[2].wants_logits);
}

TEST(Scheduler, PreemptedScoringSequenceScoresOnlyWhatWasNotDelivered) {
  // Five pages of 4 tokens, 4 score rows per step.
  SchedulerConfig cfg = small_config(5, 4, 8, 64);
  cfg.max_score_rows = 4;
  Scheduler s(cfg);
  s.add(1, iota_tokens(8, 500));
  finish_step(s, s.schedule());
  s.add(2, iota_tokens(12), 1);
  StepPlan p = s.schedule();  // 1 decodes; 2 scores tokens 1..4 at positions 0..3
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[1].count, 4);
  EXPECT_EQ(p.entries[1].score_rows, 4);
  finish_step(s, p);
  p = s.schedule();  // positions 4..7 score tokens 5..8
  EXPECT_EQ(p.entries[1].score_begin, 4);
  EXPECT_EQ(p.entries[1].score_rows, 4);
  finish_step(s, p);
  EXPECT_EQ(s.find(2)->next_scored, 9);
  p = s.schedule();  // 2 needs a third page: none is left, and it is the newest: preempted
  ASSERT_EQ(p.preempted, std::vector<uint64_t>{2});
  finish_step(s, p);
  EXPECT_TRUE(s.remove(1));
  p = s.schedule();  // back: positions 0..7 from the cache, 8..10 score tokens 9..11, 11 samples
  ASSERT_EQ(p.entries.size(), 1u);
  const StepEntry& e = p.entries[0];
  EXPECT_EQ(e.seq->id, 2u);
  EXPECT_EQ(e.start, 8);
  EXPECT_EQ(e.count, 4);
  EXPECT_EQ(e.score_begin, 8);
  EXPECT_EQ(e.score_rows, 3);
  EXPECT_TRUE(e.wants_logits);
  EXPECT_EQ(e.seq->preemptions, 1);
}

// Lookahead: the continuation of a decode step, planned before that step is committed, is the
// plan schedule() makes after committing it (with the requests it ends removed): the decodes with
// their new pages, then the admissions of waiting requests (an arrival at step 2).
TEST(Scheduler, ContinuationIsTheNextScheduledStep) {
  Scheduler a(small_config(64, 4, 4, 64)), b(small_config(64, 4, 4, 64));
  for (Scheduler* s : {&a, &b})
    for (uint64_t id = 1; id <= 3; ++id) s->add(id, iota_tokens(2 + 3 * static_cast<int32_t>(id), 10 * static_cast<int32_t>(id)));
  finish_step(a, a.schedule());  // the prompts
  finish_step(b, b.schedule());
  StepPlan pa = a.schedule();
  for (int step = 0; step < 8; ++step) {
    const StepPlan pb = b.schedule();
    ASSERT_EQ(pa.entries.size(), pb.entries.size()) << "step " << step;
    // Request 2 ends at step 3 (its token of that step is its last): it is not continued.
    const bool ends = step == 3;
    std::vector<char> keep(pa.entries.size(), 1);
    if (ends) keep[1] = 0;
    if (step == 2)
      for (Scheduler* s : {&a, &b}) s->add(4, iota_tokens(6, 400));
    StepPlan next;
    ASSERT_TRUE(a.plan_continuation(pa, keep, next)) << "step " << step;
    const int32_t token = 100 + step;
    finish_step(a, pa, token);
    finish_step(b, pb, token);
    if (ends) {
      EXPECT_TRUE(b.remove(2));
    }
    const StepPlan want = b.schedule();
    ASSERT_EQ(next.entries.size(), want.entries.size()) << "step " << step;
    EXPECT_EQ(next.tokens, want.tokens);
    for (size_t i = 0; i < want.entries.size(); ++i) {
      const StepEntry &x = next.entries[i], &y = want.entries[i];
      EXPECT_EQ(x.seq->id, y.seq->id);
      EXPECT_EQ(x.start, y.start);
      EXPECT_EQ(x.count, y.count);
      EXPECT_EQ(x.wants_logits, y.wants_logits);
      EXPECT_EQ(x.seq->tokens, y.seq->tokens);
      EXPECT_EQ(x.seq->pages.size(), y.seq->pages.size());  // the new token's page reserved
    }
    if (step == 2) {  // the arrival's prompt, admitted
      EXPECT_EQ(next.entries.back().count, 6);
    }
    // b runs its step; a commits the continuation and drops request 2 once its extra row is
    // done, as the engine does; then a plans a step the way the engine would next.
    finish_step(b, want, 200 + step);
    a.commit(next);
    for (const StepEntry& e : next.entries)
      if (e.wants_logits) a.append(e.seq, 200 + step);
    if (ends) {
      EXPECT_TRUE(a.remove(2));
    }
    EXPECT_EQ(a.running_count(), b.running_count());
    pa = a.schedule();
    finish_step(b, b.schedule(), 300 + step);  // b too: both are at the same point again
    a.commit(pa);
    for (const StepEntry& e : pa.entries)
      if (e.wants_logits) a.append(e.seq, 300 + step);
    pa = a.schedule();
  }
}

TEST(Scheduler, NoContinuationOfPrefillsOrWhenPagesRunOut) {
  Scheduler s(small_config(5, 4, 4, 64));
  s.add(1, iota_tokens(3));
  StepPlan p = s.schedule();  // the prompt: not a decode step
  StepPlan next;
  EXPECT_FALSE(s.plan_continuation(p, {1}, next));
  EXPECT_TRUE(next.empty());
  finish_step(s, p);
  p = s.schedule();
  s.add(2, iota_tokens(2, 50));  // admitted by the continuation, after request 1's decode
  ASSERT_TRUE(s.plan_continuation(p, {1}, next));
  ASSERT_EQ(next.entries.size(), 2u);
  EXPECT_EQ(next.entries[0].seq->id, 1u);
  EXPECT_EQ(next.entries[1].seq->id, 2u);
  EXPECT_EQ(next.entries[1].count, 2);
  finish_step(s, p);
  finish_step(s, next);
  p = s.schedule();
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_FALSE(s.plan_continuation(p, {0, 0}, next));  // nothing kept, nothing waiting
  // The pool (5 pages of 4) runs out: request 1 grows to its sixth page over the steps.
  int planned = 0;
  for (int step = 0; step < 20; ++step) {
    if (!s.plan_continuation(p, {1, 1}, next)) break;
    ++planned;
    finish_step(s, p);
    p = next;
  }
  EXPECT_GT(planned, 0);
  EXPECT_LT(planned, 20);
  EXPECT_EQ(s.running_count(), 2);  // a continuation never preempts
}

}  // namespace
}  // namespace kiln
