#include "infer/generator.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace kiln {
namespace {

// One step of a single request, packed in one i32 buffer so that it moves to the device in one copy:
//   [q_indptr(2) page_indptr(2) last_rows_indptr(2) page(1) last_page_len(1) | positions(n) | slots(n) |
//    ids(n) | logit_rows(r)]
// The request holds `context` tokens before the step and adds n; its cache is one page of the whole
// cache (page 0, page size = the cache's slots), so a token's slot is its position.
// logit_rows is the last new token (r = 1; the final layer is then trimmed to it) or every new token
// (r = n, for scoring).
constexpr int64_t kHeader = 8;

int64_t step_size(int64_t n, bool all_rows) { return kHeader + 3 * n + (all_rows ? n : 1); }

// Fills `h`; `ids` may be null when the ids come from elsewhere (the sampler's buffer).
void pack_step(int32_t* h, int32_t context, int32_t n, const int32_t* ids, bool all_rows) {
  h[0] = 0, h[1] = n;                  // q_indptr
  h[2] = 0, h[3] = 1;                  // page_indptr: one page
  h[4] = 0, h[5] = 1;                  // last_rows_indptr
  h[6] = 0, h[7] = context + n;        // page id 0, tokens in it
  int32_t* rows = h + kHeader + 3 * n;
  for (int32_t i = 0; i < n; ++i) {
    h[kHeader + i] = context + i;      // position
    h[kHeader + n + i] = context + i;  // cache slot
    if (ids) h[kHeader + 2 * n + i] = ids[i];
    if (all_rows) rows[i] = i;
  }
  if (!all_rows) rows[0] = n - 1;
}

// Views of a packed step on the device.
ForwardBatch step_batch(Tensor d, int32_t n, bool all_rows, int32_t kv_bound, int32_t cache_slots) {
  ForwardBatch b;
  b.q_indptr = d.rows(0, 2);
  b.kv = PagedKV{d.rows(2, 4), d.rows(6, 7), d.rows(7, 8), cache_slots};
  b.positions = d.rows(kHeader, kHeader + n);
  b.slots = d.rows(kHeader + n, kHeader + 2 * n);
  b.ids = d.rows(kHeader + 2 * n, kHeader + 3 * n);
  b.logit_rows = d.rows(kHeader + 3 * n, step_size(n, all_rows));
  b.bounds = {1, n, kv_bound};
  if (!all_rows && n > 1) b.last_rows_indptr = d.rows(4, 6);  // a single row gains nothing from trimming
  return b;
}

int32_t context_bucket(int32_t kv_len, int32_t max_context) {
  int32_t b = 256;
  while (b < kv_len) b *= 2;
  return std::min(b, max_context);
}

}  // namespace

Status check_token_ids(const std::vector<int32_t>& ids, int64_t vocab, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return invalid_argument(std::string(what) + ": token id " + std::to_string(ids[i]) + " at index " +
                              std::to_string(i) + " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
  return Status::Ok();
}

Result<std::unique_ptr<Generator>> Generator::create(const Transformer& model, int32_t max_context) {
  if (max_context <= 0) return invalid_argument("the context must hold at least one token");
  std::unique_ptr<Generator> g(new Generator(model, max_context));
  KILN_RETURN_IF_ERROR(g->init());
  return g;
}

Status Generator::init() {
  const int64_t chunk = std::min<int64_t>(max_context_, 8192);
  KILN_ASSIGN_OR_RETURN(cache_, model_.make_kv_cache(max_context_));
  KILN_ASSIGN_OR_RETURN(ws_, model_.make_workspace(chunk, 1));
  KILN_ASSIGN_OR_RETURN(inputs_dev_, empty(be(), {step_size(chunk, false)}, DType::i32));
  inputs_host_ = host_empty({step_size(chunk, false)}, DType::i32);
  KILN_ASSIGN_OR_RETURN(token_dev_, empty(be(), {1}, DType::i32));
  sampling_host_ = host_empty({1, ops::kSamplingRowWords}, DType::i32);
  KILN_ASSIGN_OR_RETURN(sampling_dev_, empty(be(), {1, ops::kSamplingRowWords}, DType::i32));
  const int64_t ws_bytes = ops::sampling_workspace_bytes(1, model_.config().vocab_size);
  KILN_ASSIGN_OR_RETURN(sampling_ws_, empty(be(), {(ws_bytes + 3) / 4}, DType::i32));
  return Status::Ok();
}

void Generator::stage_inputs(const std::vector<int32_t>& ids, bool ids_from_device) {
  const int32_t n = static_cast<int32_t>(ids_from_device ? 1 : ids.size());
  pack_step(inputs_host_.ptr<int32_t>(), length_, n, ids_from_device ? nullptr : ids.data(), false);
  const int64_t count = step_size(n, false);
  be().copy(inputs_dev_.view().rows(0, count), inputs_host_.view().rows(0, count));
}

ForwardBatch Generator::batch_for(int32_t n, bool ids_from_device, int32_t kv_bound) {
  ForwardBatch b = step_batch(inputs_dev_.view(), n, false, kv_bound, cache_.slots);
  if (ids_from_device) b.ids = token_dev_.view();
  return b;
}

Status Generator::sample_and_fetch() {
  // The token being drawn sits at position length_ (the rng counter of its draw).
  ops::SamplingRow row = sampling_;
  row.position = length_;
  std::memcpy(sampling_host_.ptr<int32_t>(), &row, sizeof(row));
  be().copy(sampling_dev_, sampling_host_);
  ops::SamplingBatch batch;
  batch.logits = logits_;
  batch.params = sampling_dev_;
  batch.tokens = token_dev_;
  batch.workspace = sampling_ws_;
  batch.full = row.temperature > 0.0f;
  ops::sample(be(), batch);
  if (on_logits_) {
    TensorBuffer host = to_host(be(), logits_);
    on_logits_(host.ptr<float>(), host.numel());
  }
  TensorBuffer tok = to_host(be(), token_dev_);
  KILN_RETURN_IF_ERROR(be().synchronize());
  last_token_ = tok.ptr<int32_t>()[0];
  return Status::Ok();
}

Status Generator::prefill(const std::vector<int32_t>& prompt) {
  if (prompt.empty()) return invalid_argument("the prompt is empty; give at least one token id");
  KILN_RETURN_IF_ERROR(check_token_ids(prompt, model_.config().vocab_size, "prompt"));
  if (static_cast<int64_t>(prompt.size()) > max_context_)
    return invalid_argument("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds " +
                            std::to_string(max_context_));
  length_ = 0;
  const int64_t chunk = ws_.max_tokens;
  for (int64_t start = 0; start < static_cast<int64_t>(prompt.size()); start += chunk) {
    int64_t end = std::min<int64_t>(start + chunk, prompt.size());
    std::vector<int32_t> piece(prompt.begin() + start, prompt.begin() + end);
    const int32_t n = static_cast<int32_t>(piece.size());
    stage_inputs(piece, false);
    logits_ = model_.forward(batch_for(n, false, length_ + n), cache_, ws_);
    length_ += n;
  }
  return sample_and_fetch();
}

Status Generator::decode_step() {
  if (length_ >= max_context_) return invalid_argument("the context is full (" + std::to_string(max_context_) + " tokens)");
  stage_inputs({}, true);
  const int32_t bucket = context_bucket(length_ + 1, max_context_);
  ForwardBatch batch = batch_for(1, true, bucket);
  auto it = decode_graphs_.find(bucket);
  if (it != decode_graphs_.end()) {
    it->second->replay();
    logits_ = ws_.logits.view().rows(0, 1);
  } else {
    logits_ = model_.forward(batch, cache_, ws_);  // eager (also sizes the scratch for capture)
    if (use_graphs_) {
      Result<std::unique_ptr<CapturedWork>> g = be().capture([&] { model_.forward(batch, cache_, ws_); });
      if (g.ok())
        decode_graphs_[bucket] = std::move(g).value();
      else
        use_graphs_ = false;  // CPU, or capture unsupported: stay eager
    }
  }
  length_ += 1;
  return sample_and_fetch();
}

Result<GenerateResult> Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                           const TokenCallback& on_token, const LogitsCallback& on_logits) {
  if (options.max_new_tokens < 0) return invalid_argument("--max-tokens must be >= 0");
  if (static_cast<int64_t>(prompt.size()) + std::max(options.max_new_tokens - 1, 0) > max_context_)
    return invalid_argument("prompt (" + std::to_string(prompt.size()) + " tokens) plus " +
                            std::to_string(options.max_new_tokens) + " new tokens exceed the context of " +
                            std::to_string(max_context_));
  GenerateResult result;
  result.finish_reason = "length";
  if (options.max_new_tokens == 0) return result;
  sampling_ = options.sampling;
  on_logits_ = on_logits;
  use_graphs_ = options.use_graphs;
  KILN_RETURN_IF_ERROR(prefill(prompt));
  while (true) {
    result.tokens.push_back(last_token_);
    bool keep_going = on_token ? on_token(last_token_) : true;
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), last_token_) != options.stop_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    if (!keep_going || static_cast<int32_t>(result.tokens.size()) >= options.max_new_tokens) break;
    KILN_RETURN_IF_ERROR(decode_step());
  }
  on_logits_ = nullptr;
  return result;
}

Result<ScoreResult> score(const Transformer& model, const std::vector<int32_t>& ids, int32_t top_k, int32_t chunk) {
  if (ids.size() < 2) return invalid_argument("scoring needs at least two token ids (the first has no prediction)");
  const int64_t vocab = model.config().vocab_size;
  KILN_RETURN_IF_ERROR(check_token_ids(ids, vocab, "ids"));
  if (top_k < 0 || top_k > vocab) return invalid_argument("--top-logprobs must be within [0, vocab size]");
  Backend& be = model.backend();
  const int32_t n = static_cast<int32_t>(ids.size());
  const int32_t c = std::min(chunk, n);
  KILN_ASSIGN_OR_RETURN(KVCache cache, model.make_kv_cache(n));
  KILN_ASSIGN_OR_RETURN(ForwardWorkspace ws, model.make_workspace(c, c));
  KILN_ASSIGN_OR_RETURN(TensorBuffer logprobs, empty(be, {c, vocab}, DType::f32));
  TensorBuffer host = host_empty({step_size(c, true)}, DType::i32);
  KILN_ASSIGN_OR_RETURN(TensorBuffer dev, empty(be, {step_size(c, true)}, DType::i32));
  ScoreResult out;
  for (int32_t start = 0; start < n - 1; start += c) {
    const int32_t m = std::min(c, n - start);
    pack_step(host.ptr<int32_t>(), start, m, ids.data() + start, true);
    const int64_t count = step_size(m, true);
    be.copy(dev.view().rows(0, count), host.view().rows(0, count));
    ForwardBatch b = step_batch(dev.view(), m, true, start + m, cache.slots);
    Tensor logits = model.forward(b, cache, ws);
    Tensor lp = logprobs.view().rows(0, m);
    ops::log_softmax_forward(be, lp, logits);
    TensorBuffer lp_host = to_host(be, lp);
    KILN_RETURN_IF_ERROR(be.synchronize());
    for (int32_t i = 0; i < m && start + i + 1 < n; ++i) {
      const float* row = lp_host.ptr<float>() + static_cast<int64_t>(i) * vocab;
      out.logprobs.push_back(row[ids[start + i + 1]]);
      if (top_k > 0) {
        std::vector<int32_t> order(vocab);
        for (int64_t v = 0; v < vocab; ++v) order[v] = static_cast<int32_t>(v);
        std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b2) {
          return row[a] > row[b2] || (row[a] == row[b2] && a < b2);
        });
        std::vector<std::pair<int32_t, float>> top;
        for (int32_t j = 0; j < top_k; ++j) top.emplace_back(order[j], row[order[j]]);
        out.top.push_back(std::move(top));
      }
    }
  }
  return out;
}

}  // namespace kiln
