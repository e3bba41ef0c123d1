#include "infer/executor.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/step_io.h"
#include "kernels/train_ops.h"
#ifdef KILN_WITH_CUDA
#include "backend/cuda_backend.h"
#endif

namespace kiln {
namespace {

int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

// Token rows an eager step is padded to: powers of two up to 256, then multiples of 256. The GEMM
// plans (and their one-time tuning) are per shape, so padding bounds the shapes a server meets.
int32_t padded_tokens(int32_t t) {
  if (t <= 256) {
    int32_t p = 1;
    while (p < t) p *= 2;
    return p;
  }
  return (t + 255) / 256 * 256;
}

bool row_needs_full_sampler(const ops::SamplingRow& r) {
  return r.temperature > 0.0f || r.logprobs != 0 || r.top_logprobs > 0 || r.counts_row >= 0;
}

// Decode buckets above this many rows launch every kernel after the one before it has finished:
// programmatic launch (kernels starting under their predecessor's tail) pays at small batches
// (8-11% of a B=1 step) and costs 1-2% from 32 rows (docs/perf-notes.md, 2026-12-05).
constexpr int32_t kProgrammaticMaxBucket = 16;

// Turns programmatic launch off on a CUDA backend while it lives (when `off`), as it was after.
class SerialLaunches {
 public:
  SerialLaunches(Backend& be, bool off) {
#ifdef KILN_WITH_CUDA
    cuda_ = off ? dynamic_cast<CudaBackend*>(&be) : nullptr;
    if (cuda_) {
      was_ = cuda_->programmatic_launch();
      cuda_->set_programmatic_launch(false);
    }
#else
    (void)be, (void)off;
#endif
  }
  ~SerialLaunches() {
#ifdef KILN_WITH_CUDA
    if (cuda_) cuda_->set_programmatic_launch(was_);
#endif
  }
  SerialLaunches(const SerialLaunches&) = delete;
  SerialLaunches& operator=(const SerialLaunches&) = delete;

 private:
#ifdef KILN_WITH_CUDA
  CudaBackend* cuda_ = nullptr;
  bool was_ = false;
#endif
};

}  // namespace

int64_t Executor::kv_bytes_per_token(const Transformer& model) {
  const ModelConfig& c = model.config();
  return 2 * static_cast<int64_t>(c.num_hidden_layers) * c.num_key_value_heads * c.head_dim *
         dtype_size(model.compute_dtype());
}

Result<std::unique_ptr<Executor>> Executor::create(const Transformer& model, const ExecutorConfig& config) {
  if (config.num_pages < 0 || config.page_size <= 0 || config.max_running <= 0 || config.max_seq_len <= 0 ||
      config.max_step_tokens < config.max_running || config.max_score_rows < 0)
    return invalid_argument("executor: page size, running limit and sequence length must be positive, and the "
                            "step token budget at least the running limit");
  std::unique_ptr<Executor> e(new Executor(model, config));
  KILN_RETURN_IF_ERROR(e->init());
  return e;
}

Status Executor::init() {
  const ModelConfig& c = model_.config();
  vocab_ = c.vocab_size;
  const int64_t Bm = config_.max_running, Tm = padded_tokens(config_.max_step_tokens);
  const int64_t SR = config_.max_score_rows;
  max_logit_rows_ = static_cast<int32_t>(Bm + SR);
  max_pages_per_step_ = static_cast<int32_t>(
      std::min<int64_t>(Bm * ceil_div(config_.max_seq_len, config_.page_size), int64_t(1) << 30));
  Result<ForwardWorkspace> ws = model_.make_workspace(Tm, max_logit_rows_);
  if (!ws.ok())
    return out_of_memory("the step workspace for " + std::to_string(config_.max_step_tokens) + " tokens and " +
                         std::to_string(Bm) + " requests" +
                         (SR > 0 ? " (and " + std::to_string(SR) + " prompt-scoring rows)" : std::string()) +
                         " does not fit: " + ws.status().message() + "; lower --max-step-tokens or --max-running" +
                         (SR > 0 ? " or --max-score-rows" : ""));
  ws_ = std::move(ws).value();

  int64_t at = kStagingHeaderWords;  // word 0: the words a step's inputs take (stage_step_inputs)
  auto section = [&](int64_t& off, int64_t n) {
    off = at;
    at += (n + 31) / 32 * 32;  // 128-byte aligned sections
  };
  section(off_q_indptr_, Bm + 1);
  section(off_page_indptr_, Bm + 1);
  section(off_last_page_, Bm);
  section(off_last_rows_, Bm + 1);
  section(off_logit_rows_, max_logit_rows_);
  section(off_params_, Bm * ops::kSamplingRowWords);
  section(off_targets_, std::max<int64_t>(SR, 1));
  off_tokens_ = at;  // then ids, positions and slots of T tokens and the page lists (pack)
  // Then a token mask and logit biases per sampled row at most (ops::adjust_logits).
  staging_ints_ = (at + 3 * Tm + max_pages_per_step_ + Bm * (mask_words() + 2 * ops::kMaxLogitBias) + 31) / 32 * 32;
  KILN_ASSIGN_OR_RETURN(staging_dev_, empty(be(), {staging_ints_}, DType::i32));
  be().zero(staging_dev_);

  const int64_t N = ops::kMaxTopLogprobs;
  off_out_logprobs_ = Bm;
  off_out_top_ids_ = 2 * Bm;
  off_out_top_logprobs_ = 2 * Bm + Bm * N;
  output_words_ = 2 * Bm + 2 * Bm * N;
  KILN_ASSIGN_OR_RETURN(outputs_dev_, empty(be(), {output_words_}, DType::i32));
  const int64_t sampler_words = (ops::sampling_workspace_bytes(Bm, vocab_) + 3) / 4;
  KILN_ASSIGN_OR_RETURN(sampler_ws_, empty(be(), {std::max<int64_t>(sampler_words, 1)}, DType::i32));
  KILN_ASSIGN_OR_RETURN(counts_, empty(be(), {Bm, vocab_}, DType::i32));
  be().zero(counts_);
  KILN_ASSIGN_OR_RETURN(counts_upload_, empty(be(), {2 * static_cast<int64_t>(config_.max_seq_len)}, DType::i32));
  for (HostSide& side : sides_) {
    KILN_ASSIGN_OR_RETURN(side.staging, pinned_host_empty(be(), {staging_ints_}, DType::i32));
    std::memset(side.staging.ptr<int32_t>(), 0, static_cast<size_t>(staging_ints_) * 4);
    KILN_ASSIGN_OR_RETURN(side.outputs, pinned_host_empty(be(), {output_words_}, DType::i32));
    if (SR > 0) {
      KILN_ASSIGN_OR_RETURN(side.score_logprobs, pinned_host_empty(be(), {SR}, DType::f32));
    }
    side.done = be().create_event();
    side.rows.reserve(static_cast<size_t>(Bm));
  }
  for (GraphEvents& g : graph_events_) {
    g.start = be().create_event();
    g.end = be().create_event();
  }
  if (SR > 0) {
    KILN_ASSIGN_OR_RETURN(score_logprobs_dev_, empty(be(), {SR}, DType::f32));
    score_rows_scratch_.resize(static_cast<size_t>(SR));
  }
  for (int32_t r = static_cast<int32_t>(Bm) - 1; r >= 0; --r) free_counts_rows_.push_back(r);
  KILN_RETURN_IF_ERROR(be().synchronize());

  if (config_.num_pages == 0) {
    Result<std::pair<int64_t, int64_t>> mem = be().memory_info();
    const int64_t per_page = kv_bytes_per_token(model_) * config_.page_size;
    if (mem.ok()) {
      KILN_RETURN_IF_ERROR(warm_up());
      mem = be().memory_info();
      if (!mem.ok()) return mem.status();
      const int64_t budget = static_cast<int64_t>(static_cast<double>(mem->first) * config_.kv_memory_fraction);
      config_.num_pages = static_cast<int32_t>(std::min<int64_t>(budget / per_page, INT32_MAX / config_.page_size));
    } else {
      // Host memory: room for four full-length sequences, within 2 GiB (but at least 4096 tokens).
      const int64_t bpt = kv_bytes_per_token(model_);
      const int64_t tokens = std::min<int64_t>(4 * int64_t(config_.max_seq_len), std::max<int64_t>((int64_t(2) << 30) / bpt, 4096));
      config_.num_pages = static_cast<int32_t>((tokens + config_.page_size - 1) / config_.page_size);
    }
    if (config_.num_pages < 1)
      return out_of_memory("no device memory is left for the KV cache after the weights and the workspace; lower "
                           "--max-step-tokens or --max-running, or give --kv-tokens");
  }
  Result<KVCache> cache = model_.make_kv_cache(config_.num_pages * config_.page_size);
  if (!cache.ok())
    return out_of_memory("the KV cache of " + std::to_string(config_.num_pages * int64_t(config_.page_size)) +
                         " tokens does not fit in " + (be().device().is_cpu() ? "memory" : "device memory") + ": " +
                         cache.status().message() + "; lower --kv-tokens or --kv-memory");
  cache_ = std::move(cache).value();
  for (size_t l = 0; l < cache_.k.size(); ++l) {  // no stale bits: padding reads and tests see zeros
    be().zero(cache_.k[l]);
    be().zero(cache_.v[l]);
  }
  return be().synchronize();
}

Status Executor::warm_up() {
  KILN_ASSIGN_OR_RETURN(KVCache dummy, model_.make_kv_cache(config_.page_size));
  std::swap(cache_, dummy);
  const int32_t T = config_.max_step_tokens, B = config_.max_running, ps = config_.page_size;
  // Prefill: one request of T tokens; decode: B requests of one token at the longest context. Every
  // page is page 0 of the one-page cache; the steps go through pack() like real ones.
  struct Shape {
    int32_t requests, q_len, kv_len;
  };
  for (const Shape shape : {Shape{1, T, T}, Shape{B, 1, config_.max_seq_len}}) {
    const int32_t n_pages = ceil_div(shape.kv_len, ps);
    if (static_cast<int64_t>(n_pages) * shape.requests > max_pages_per_step_) continue;
    std::vector<Sequence> seqs(static_cast<size_t>(shape.requests));
    StepPlan plan;
    for (Sequence& seq : seqs) {
      seq.tokens.assign(static_cast<size_t>(shape.kv_len), 0);
      seq.pages.assign(static_cast<size_t>(n_pages), 0);
      seq.computed = shape.kv_len - shape.q_len;
      StepEntry e{&seq, seq.computed, shape.q_len, true};
      if (shape.q_len > 1) {  // the most prompt-scoring rows a step may have, too
        seq.prompt_len = shape.kv_len;
        e.score_rows = std::min(config_.max_score_rows, shape.q_len - 1);
        e.score_begin = seq.computed;
        plan.score_rows = e.score_rows;
      }
      plan.entries.push_back(e);
    }
    const std::vector<ops::SamplingRow> rows(seqs.size());
    const Packed p = pack(sides_[0], plan, rows, shape.q_len == 1 ? bucket_for(shape.requests) : 0);
    finish_staging(sides_[0], input_words(p), nullptr);
    issue(sides_[0], p, true, false, 0);
    KILN_RETURN_IF_ERROR(be().synchronize());
  }
  std::swap(cache_, dummy);
  return Status::Ok();
}

int32_t decode_context_bucket(int32_t kv_len, int32_t max_seq_len) {
  int32_t b = 1024;
  while (b < kv_len) b *= 2;
  return std::min(b, max_seq_len);
}

int32_t Executor::bucket_for(int32_t batch) const {
  int32_t b = 1;
  while (b < batch) b *= 2;
  return std::min(b, config_.max_running);
}

Executor::Packed Executor::pack(HostSide& side, const StepPlan& plan, const std::vector<ops::SamplingRow>& rows,
                                int32_t bucket) {
  int32_t* h = side.staging.ptr<int32_t>();
  int32_t* q_indptr = h + off_q_indptr_;
  int32_t* page_indptr = h + off_page_indptr_;
  int32_t* last_page = h + off_last_page_;
  int32_t* last_rows = h + off_last_rows_;
  int32_t* logit_rows = h + off_logit_rows_;
  int32_t* targets = h + off_targets_;
  const int32_t ps = config_.page_size;
  Packed p;
  int32_t real_tokens = 0;
  for (const StepEntry& e : plan.entries) real_tokens += e.count;
  // The token rows with padding: p.tokens once packed (the sections' length).
  const int32_t T = bucket > 0 ? bucket : padded_tokens(real_tokens);
  int32_t* ids = h + off_tokens_;
  int32_t* positions = ids + T;
  int32_t* slots = positions + T;
  int32_t* pages = slots + T;
  q_indptr[0] = page_indptr[0] = last_rows[0] = 0;
  for (const StepEntry& e : plan.entries) {
    const Sequence& s = *e.seq;
    KILN_ASSERT(p.score_rows + e.score_rows <= config_.max_score_rows);
    for (int32_t j = e.score_begin; j < e.score_begin + e.score_rows; ++j) {
      score_rows_scratch_[p.score_rows] = p.tokens + (j - e.start);  // the row of position j
      targets[p.score_rows++] = s.tokens[j + 1];
    }
    const int32_t known = static_cast<int32_t>(s.tokens.size());
    for (int32_t j = e.start; j < e.start + e.count; ++j) {
      ids[p.tokens] = j < known ? s.tokens[j] : 0;  // a continuation's input: copied on the device
      positions[p.tokens] = j;
      slots[p.tokens] = s.pages[j / ps] * ps + j % ps;
      ++p.tokens;
    }
    const int32_t kv_len = e.start + e.count, n_pages = ceil_div(kv_len, ps);
    KILN_ASSERT(n_pages <= static_cast<int32_t>(s.pages.size()) && p.pages + n_pages <= max_pages_per_step_);
    std::memcpy(pages + p.pages, s.pages.data(), static_cast<size_t>(n_pages) * 4);
    p.pages += n_pages;
    last_page[p.requests] = kv_len - (n_pages - 1) * ps;
    if (e.wants_logits) logit_rows[p.logit_rows++] = p.tokens - 1;
    ++p.requests;
    q_indptr[p.requests] = p.tokens;
    page_indptr[p.requests] = p.pages;
    last_rows[p.requests] = p.logit_rows;
    p.max_q = std::max(p.max_q, e.count);
    p.max_kv = std::max(p.max_kv, kv_len);
  }
  KILN_ASSERT(static_cast<int32_t>(rows.size()) == p.logit_rows);
  if (!rows.empty()) std::memcpy(h + off_params_, rows.data(), rows.size() * sizeof(ops::SamplingRow));  // none: a scoring step
  p.sampled_rows = p.logit_rows;
  if (p.score_rows > 0) {
    // Score rows after the sampled ones; one logit row per request no longer holds: no trimming.
    KILN_ASSERT(bucket == 0);
    std::memcpy(logit_rows + p.logit_rows, score_rows_scratch_.data(), static_cast<size_t>(p.score_rows) * 4);
    p.logit_rows += p.score_rows;
    int32_t padded = 1;
    while (padded < p.logit_rows) padded *= 2;
    padded = std::min(padded, max_logit_rows_);
    for (int32_t r = p.logit_rows; r < padded; ++r) logit_rows[r] = 0;
    p.logit_rows = padded;
    p.trim = false;
    for (int32_t t = p.tokens; t < T; ++t) ids[t] = 0, positions[t] = 0, slots[t] = -1;
    p.tokens = T;
    return p;
  }
  if (bucket > 0) {
    // Pad a decode step: rows that write no KV, requests with no queries and no pages.
    const ops::SamplingRow greedy;
    for (int32_t b = p.requests; b < bucket; ++b) {
      ids[b] = 0, positions[b] = 0, slots[b] = -1;
      q_indptr[b + 1] = p.tokens;
      page_indptr[b + 1] = p.pages;
      last_page[b] = 0;
      std::memcpy(h + off_params_ + b * ops::kSamplingRowWords, &greedy, sizeof(greedy));
    }
    for (int32_t b = 0; b < bucket; ++b) logit_rows[b] = b;
    KILN_ASSERT(p.tokens == p.requests);  // one token each
    p.tokens = p.requests = p.logit_rows = bucket;
    p.max_q = 1;
    p.max_kv = context_bucket(p.max_kv);
    p.trim = false;
    p.every_row = true;
    return p;
  }
  const int32_t sampled = p.logit_rows;
  if (p.logit_rows == 0) {  // a step of prefill chunks only: the forward still wants one row
    logit_rows[0] = p.tokens - 1;
    last_rows[p.requests] = 1;
    p.logit_rows = 1;
  }
  p.trim = p.max_q > 1;  // a single row per request gains nothing from trimming
  // Logit rows padded to a power of two (copies of row 0, sampled greedily and ignored), so the
  // final layer's and the head's GEMM shapes repeat too. Every row no request samples gets these
  // parameters, the lone row of a step of prefill chunks too: what a step before left there names
  // a counts row that another request may own by now, and sampling it would count a token there.
  const ops::SamplingRow greedy;
  for (int32_t r = sampled, end = bucket_for(p.logit_rows); r < end; ++r) {
    logit_rows[r] = 0;
    std::memcpy(h + off_params_ + r * ops::kSamplingRowWords, &greedy, sizeof(greedy));
  }
  p.logit_rows = bucket_for(p.logit_rows);
  // Padding rows (no request, no KV write) up to the padded token count.
  for (int32_t t = p.tokens; t < T; ++t) ids[t] = 0, positions[t] = 0, slots[t] = -1;
  p.tokens = T;
  return p;
}

int64_t Executor::input_words(const Packed& p) const {
  // The per-request sections, the sampling parameters and targets, then the token rows (ids,
  // positions, slots of p.tokens rows) and the page lists right after them.
  return off_tokens_ + 3 * static_cast<int64_t>(p.tokens) + p.pages;
}

int64_t Executor::pack_constraints(HostSide& side, const Packed& p, const std::vector<RowConstraints>& constraints) {
  int64_t n = input_words(p);
  int32_t* h = side.staging.ptr<int32_t>();
  const int64_t words = mask_words();
  for (size_t i = 0; i < constraints.size(); ++i) {
    ops::SamplingRow* row = reinterpret_cast<ops::SamplingRow*>(h + off_params_) + i;
    if (const uint32_t* mask = constraints[i].mask) {
      KILN_ASSERT(n + words <= staging_ints_ && n < (int64_t(1) << 31));
      std::memcpy(h + n, mask, static_cast<size_t>(words) * 4);
      row->mask_offset = static_cast<int32_t>(n);
      n += words;
    }
    if (const auto* bias = constraints[i].bias; bias && !bias->empty()) {
      const int64_t pairs = static_cast<int64_t>(bias->size());
      KILN_ASSERT(pairs <= ops::kMaxLogitBias && n + 2 * pairs <= staging_ints_ && n < (int64_t(1) << 31));
      for (const auto& [id, value] : *bias) {
        h[n++] = id;
        h[n++] = std::bit_cast<int32_t>(value);
      }
      row->bias_offset = static_cast<int32_t>(n - 2 * pairs);
      row->bias_count = static_cast<int32_t>(pairs);
    }
  }
  return n;
}

void Executor::finish_staging(HostSide& side, int64_t n, const std::vector<int32_t>* continued_from) {
  int32_t* h = side.staging.ptr<int32_t>();
  KILN_ASSERT(n <= staging_ints_);
  h[0] = static_cast<int32_t>(n);
  if (!continued_from) return;
  // Entry i's input token (token row i: the continued entries come first, one token each) is row
  // continued_from[i] of the samples of the step in flight, which stage_step_inputs reads on the
  // device: -1 - row marks it.
  for (size_t i = 0; i < continued_from->size(); ++i) {
    const int32_t from = (*continued_from)[i];
    KILN_ASSERT(from >= 0 && from < config_.max_running);
    h[off_tokens_ + static_cast<int64_t>(i)] = -1 - from;
  }
}

void Executor::issue(const HostSide& side, const Packed& p, bool full, bool masked, int64_t output_words) {
  // At most the longest context's pages for every request: the bound a captured step reads ahead.
  const int64_t expected = std::min<int64_t>(
      staging_ints_, off_tokens_ + 3 * static_cast<int64_t>(p.tokens) +
                         static_cast<int64_t>(p.requests) * ceil_div(p.max_kv, config_.page_size));
  ops::stage_step_inputs(be(), staging_dev_.view(), side.staging.view(), expected, off_tokens_, p.tokens,
                         output_view(outputs_dev_, 0, config_.max_running, DType::i32));
  forward_and_sample(p, full, masked);
  if (output_words > 0)
    ops::publish_step_outputs(be(), side.outputs.view().rows(0, output_words), outputs_dev_.view().rows(0, output_words));
}

int64_t Executor::output_words(int32_t rows, int32_t level) const {
  return level == 2 ? off_out_top_logprobs_ + static_cast<int64_t>(rows) * ops::kMaxTopLogprobs
         : level == 1 ? off_out_logprobs_ + rows
                      : rows;
}

ForwardBatch Executor::batch_view(const Packed& p) const {
  const Tensor d = staging_dev_.view();
  const int64_t T = p.tokens, ids = off_tokens_, positions = ids + T, slots = positions + T, pages = slots + T;
  ForwardBatch b;
  b.ids = d.rows(ids, ids + T);
  b.positions = d.rows(positions, positions + T);
  b.slots = d.rows(slots, slots + T);
  b.q_indptr = d.rows(off_q_indptr_, off_q_indptr_ + p.requests + 1);
  b.kv = PagedKV{d.rows(off_page_indptr_, off_page_indptr_ + p.requests + 1),
                 d.rows(pages, pages + max_pages_per_step_),
                 d.rows(off_last_page_, off_last_page_ + p.requests), config_.page_size};
  b.logit_rows = d.rows(off_logit_rows_, off_logit_rows_ + p.logit_rows);
  b.bounds = {p.requests, p.max_q, p.max_kv};
  if (p.trim) b.last_rows_indptr = d.rows(off_last_rows_, off_last_rows_ + p.requests + 1);
  b.logits_of_every_row = p.every_row;
  return b;
}

Tensor Executor::output_view(const TensorBuffer& buffer, int64_t offset, int64_t n, DType dtype) {
  Tensor t = buffer.view().rows(offset, offset + n);
  t.dtype = dtype;  // i32 and f32 words alike
  return t;
}

ops::SamplingBatch Executor::sampling_view(int32_t rows, bool full) const {
  ops::SamplingBatch s;
  s.logits = ws_.logits.view().rows(0, rows);
  s.params = staging_dev_.view().rows(off_params_, off_params_ + rows * ops::kSamplingRowWords)
                 .view({rows, ops::kSamplingRowWords});
  s.counts = counts_;
  const int64_t N = ops::kMaxTopLogprobs;
  s.tokens = output_view(outputs_dev_, 0, rows, DType::i32);
  s.logprobs = output_view(outputs_dev_, off_out_logprobs_, rows, DType::f32);
  s.top_ids = output_view(outputs_dev_, off_out_top_ids_, rows * N, DType::i32).view({rows, N});
  s.top_logprobs = output_view(outputs_dev_, off_out_top_logprobs_, rows * N, DType::f32).view({rows, N});
  s.workspace = sampler_ws_;
  s.full = full;
  return s;
}

void Executor::forward_and_sample(const Packed& p, bool full, bool masked) {
  ForwardBatch batch = batch_view(p);
  // Greedy rows without penalties, masks or log-probs: the head's kernel may pick the tokens itself.
  const bool head_samples =
      !full && !masked && p.score_rows == 0 && model_.head_takes_greedy(p.tokens, p.logit_rows);
  if (head_samples) batch.greedy_tokens = sampling_view(p.logit_rows, full).tokens;
  last_logits_ = model_.forward(batch, cache_, ws_);
  if (head_samples) return;
  if (masked) {
    const int32_t rows = p.score_rows == 0 ? p.logit_rows : p.sampled_rows;
    ops::adjust_logits(be(), last_logits_.rows(0, rows), sampling_view(rows, full).params, staging_dev_.view());
  }
  if (p.score_rows == 0) return ops::sample(be(), sampling_view(p.logit_rows, full));
  if (p.sampled_rows > 0) ops::sample(be(), sampling_view(p.sampled_rows, full));
  const int32_t s0 = p.sampled_rows, s1 = p.sampled_rows + p.score_rows;
  const Tensor targets = staging_dev_.view().rows(off_targets_, off_targets_ + p.score_rows);
  ops::cross_entropy_forward_backward(be(), last_logits_.rows(s0, s1), Tensor{},
                                      score_logprobs_dev_.view().rows(0, p.score_rows), targets, {});
}

Result<std::vector<SampledToken>> Executor::run(const StepPlan& plan, const std::vector<ops::SamplingRow>& rows) {
  launch(plan, rows);
  return wait();
}

void Executor::launch(const StepPlan& plan, const std::vector<ops::SamplingRow>& rows,
                      const std::vector<int32_t>* continued_from, const std::vector<RowConstraints>* constraints) {
  KILN_ASSERT(!constraints || constraints->empty() || constraints->size() == rows.size());
  KILN_ASSERT(!plan.entries.empty() && in_flight_ < static_cast<int32_t>(sides_.size()));
  KILN_ASSERT(!continued_from || (in_flight_ == 1 && continued_from->size() <= plan.entries.size()));
  const auto t0 = std::chrono::steady_clock::now();
  HostSide& side = sides_[next_side_];
  bool decode_only = true, full = false, any_logprobs = false, any_top = false;
  for (const StepEntry& e : plan.entries) decode_only = decode_only && e.count == 1 && e.wants_logits;
  for (const ops::SamplingRow& r : rows) {
    full = full || row_needs_full_sampler(r);
    any_logprobs = any_logprobs || r.logprobs != 0 || r.top_logprobs > 0;
    any_top = any_top || r.top_logprobs > 0;
  }
  const int32_t real_rows = static_cast<int32_t>(rows.size());
  const int32_t bucket = decode_only ? bucket_for(static_cast<int32_t>(plan.entries.size())) : 0;
  bool timed_graph = false;
  const Packed p = pack(side, plan, rows, bucket);
  const auto t_packed = std::chrono::steady_clock::now();
  pack_seconds_ += std::chrono::duration<double>(t_packed - t0).count();
  if (continued_from)
    for (size_t i = 0; i < continued_from->size(); ++i)
      KILN_ASSERT(plan.entries[i].count == 1 &&
                  static_cast<int32_t>(plan.entries[i].seq->tokens.size()) == plan.entries[i].start);
  const bool masked = constraints && std::any_of(constraints->begin(), constraints->end(), [](const RowConstraints& c) {
                       return c.mask != nullptr || (c.bias && !c.bias->empty());
                     });
  finish_staging(side, masked ? pack_constraints(side, p, *constraints) : input_words(p), continued_from);
  // The step moves its own inputs in and its samples out (issue()): the outputs' sections up to the
  // last one the rows ask for.
  const int32_t level = any_top ? 2 : any_logprobs ? 1 : 0;
  // Launch attributes matter where kernels are launched or captured, not where a graph replays.
  const bool serial = bucket > kProgrammaticMaxBucket;
  if (bucket > 0 && config_.use_graphs && graphs_ok_) {
    const GraphKey key{bucket, p.max_kv, full, level, next_side_, masked};
    const int64_t words = output_words(p.logit_rows, level);  // the bucket's rows: fixed per graph
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      const auto tl = std::chrono::steady_clock::now();
      const GraphEvents& g = graph_events_[launches_ % 3];
      g.start->record();
      it->second->replay();
      g.end->record();
      graph_launch_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - tl).count();
      timed_graph = true;
      last_logits_ = ws_.logits.view().rows(0, p.logit_rows);
      ++graph_replays_;
    } else {
      const SerialLaunches launches(be(), serial);
      issue(side, p, full, masked, words);  // eager first: sizes scratch and tunes GEMMs outside capture
      Result<std::unique_ptr<CapturedWork>> g = be().capture([&] { issue(side, p, full, masked, words); });
      if (g.ok())
        graphs_[key] = std::move(g).value();
      else
        graphs_ok_ = false;  // CPU, or capture unsupported: stay eager
    }
  } else {
    const SerialLaunches launches(be(), serial);
    issue(side, p, full, masked, real_rows > 0 ? output_words(real_rows, level) : 0);
  }
  if (p.score_rows > 0)
    be().copy_async(side.score_logprobs.view().rows(0, p.score_rows), score_logprobs_dev_.view().rows(0, p.score_rows));
  side.score_rows = p.score_rows;
  side.done->record();
  const auto t1 = std::chrono::steady_clock::now();
  issue_seconds_ += std::chrono::duration<double>(t1 - t_packed).count();
  run_seconds_ += std::chrono::duration<double>(t1 - t0).count();
  side.rows.assign(rows.begin(), rows.end());
  side.timed_graph = timed_graph;
  side.full_bucket = timed_graph && real_rows == bucket;
  side.launch = launches_++;
  next_side_ = (next_side_ + 1) % static_cast<int32_t>(sides_.size());
  ++in_flight_;
}

Result<std::vector<SampledToken>> Executor::wait() {
  KILN_ASSERT(in_flight_ > 0);
  const int32_t n_sides = static_cast<int32_t>(sides_.size());
  HostSide& side = sides_[(next_side_ - in_flight_ + n_sides) % n_sides];
  --in_flight_;
  const std::vector<ops::SamplingRow>& rows = side.rows;
  const int32_t real_rows = static_cast<int32_t>(rows.size());
  const auto t1 = std::chrono::steady_clock::now();
  KILN_RETURN_IF_ERROR(side.done->wait());
  const auto t2 = std::chrono::steady_clock::now();
  last_graph_seconds_ = 0.0;
  if (side.timed_graph) {
    const GraphEvents& g = graph_events_[side.launch % 3];
    last_graph_seconds_ = g.end->elapsed_ms(*g.start) * 1e-3;
    if (last_timed_launch_ == side.launch - 1) {
      graph_gap_seconds_ += g.start->elapsed_ms(*graph_events_[(side.launch - 1) % 3].end) * 1e-3;
      ++graph_gaps_;
    }
  }
  last_timed_launch_ = side.timed_graph ? side.launch : -2;
  graph_device_seconds_ += last_graph_seconds_;
  if (side.full_bucket) {
    ++full_bucket_replays_;
    full_bucket_seconds_ += last_graph_seconds_;
  }
  wait_seconds_ += std::chrono::duration<double>(t2 - t1).count();
  run_seconds_ += std::chrono::duration<double>(t2 - t1).count();
  const float* scored = side.score_rows > 0 ? side.score_logprobs.ptr<float>() : nullptr;
  prompt_logprobs_.assign(scored, scored + side.score_rows);
  std::vector<SampledToken> out(static_cast<size_t>(real_rows));
  const int32_t* tokens = side.outputs.ptr<int32_t>();
  const float* logprobs = reinterpret_cast<const float*>(tokens + off_out_logprobs_);
  const int32_t* top_ids = tokens + off_out_top_ids_;
  const float* top_logprobs = reinterpret_cast<const float*>(tokens + off_out_top_logprobs_);
  for (int32_t i = 0; i < real_rows; ++i) {
    SampledToken& t = out[i];
    t.token = tokens[i];
    if (rows[i].logprobs != 0 || rows[i].top_logprobs > 0) t.logprob = logprobs[i];
    for (int32_t k = 0; k < rows[i].top_logprobs; ++k) {
      const int32_t id = top_ids[i * ops::kMaxTopLogprobs + k];
      if (id >= 0) t.top.emplace_back(id, top_logprobs[i * ops::kMaxTopLogprobs + k]);
    }
  }
  return out;
}

int32_t Executor::acquire_counts_row() {
  KILN_ASSERT(!free_counts_rows_.empty());  // one row per running request: max_running rows
  const int32_t r = free_counts_rows_.back();
  free_counts_rows_.pop_back();
  return r;
}

void Executor::release_counts_row(int32_t row) { free_counts_rows_.push_back(row); }

Status Executor::reset_counts(int32_t row, const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  const int64_t np = static_cast<int64_t>(prompt.size()), no = static_cast<int64_t>(output.size());
  KILN_ASSERT(np + no <= counts_upload_.numel());
  TensorBuffer host = host_empty({std::max<int64_t>(np + no, 1)}, DType::i32);
  std::copy(prompt.begin(), prompt.end(), host.ptr<int32_t>());
  std::copy(output.begin(), output.end(), host.ptr<int32_t>() + np);
  Tensor up = counts_upload_.view().rows(0, np + no);
  be().copy(up, host.view().rows(0, np + no));  // synchronous: `host` dies here (admission only)
  ops::reset_token_counts(be(), counts_.view().rows(row, row + 1).view({vocab_}), up.rows(0, np), up.rows(np, np + no));
  return Status::Ok();
}

}  // namespace kiln
