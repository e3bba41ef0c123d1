#include "infer/score.h"

#include <algorithm>
#include <string>

namespace kiln {
namespace {

// One chunk of the scored sequence, packed in one i32 buffer so that it moves to the device in one copy:
//   [q_indptr(2) page_indptr(2) unused(2) page(1) last_page_len(1) | positions(n) | slots(n) |
//    ids(n) | logit_rows(n)]
// The sequence holds `context` tokens before the chunk and adds n; its cache is one page of the whole
// cache (page 0, page size = the cache's slots), so a token's slot is its position.
// logit_rows is the last new token (r = 1; the final layer is then trimmed to it) or every new token
// (r = n, for scoring).
constexpr int64_t kHeader = 8;

int64_t step_size(int64_t n) { return kHeader + 4 * n; }

void pack_step(int32_t* h, int32_t context, int32_t n, const int32_t* ids) {
  h[0] = 0, h[1] = n;                  // q_indptr
  h[2] = 0, h[3] = 1;                  // page_indptr: one page
  h[4] = h[5] = 0;
  h[6] = 0, h[7] = context + n;        // page id 0, tokens in it
  int32_t* rows = h + kHeader + 3 * n;
  for (int32_t i = 0; i < n; ++i) {
    h[kHeader + i] = context + i;      // position
    h[kHeader + n + i] = context + i;  // cache slot
    h[kHeader + 2 * n + i] = ids[i];
    rows[i] = i;
  }
}

// Views of a packed step on the device.
ForwardBatch step_batch(Tensor d, int32_t n, int32_t kv_bound, int32_t cache_slots) {
  ForwardBatch b;
  b.q_indptr = d.rows(0, 2);
  b.kv = PagedKV{d.rows(2, 4), d.rows(6, 7), d.rows(7, 8), cache_slots};
  b.positions = d.rows(kHeader, kHeader + n);
  b.slots = d.rows(kHeader + n, kHeader + 2 * n);
  b.ids = d.rows(kHeader + 2 * n, kHeader + 3 * n);
  b.logit_rows = d.rows(kHeader + 3 * n, step_size(n));
  b.bounds = {1, n, kv_bound};
  return b;
}

}  // namespace

Status check_token_ids(const std::vector<int32_t>& ids, int64_t vocab, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return invalid_argument(std::string(what) + ": token id " + std::to_string(ids[i]) + " at index " +
                              std::to_string(i) + " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
  return Status::Ok();
}

Result<ScoreResult> score(const Transformer& model, const std::vector<int32_t>& ids, int32_t top_k, int32_t chunk) {
  if (ids.size() < 2) return invalid_argument("scoring needs at least two token ids (the first has no prediction)");
  const int64_t vocab = model.config().vocab_size;
  KILN_RETURN_IF_ERROR(check_token_ids(ids, vocab, "ids"));
  if (top_k < 0 || top_k > vocab) return invalid_argument("--top-logprobs must be within [0, vocab size]");
  const ModelConfig& mc = model.config();
  if (static_cast<int64_t>(ids.size()) > mc.exact_context())
    return invalid_argument("the sequence has " + std::to_string(ids.size()) + " tokens, more than the model's " +
                            std::to_string(mc.exact_context()) + " (its " + mc.exact_context_source() +
                            "); score a shorter text, or run kiln eval --task perplexity, which slides a window over "
                            "long texts");
  Backend& be = model.backend();
  const int32_t n = static_cast<int32_t>(ids.size());
  const int32_t c = std::min(chunk, n);
  KILN_ASSIGN_OR_RETURN(KVCache cache, model.make_kv_cache(n));
  KILN_ASSIGN_OR_RETURN(ForwardWorkspace ws, model.make_workspace(c, c));
  KILN_ASSIGN_OR_RETURN(TensorBuffer logprobs, empty(be, {c, vocab}, DType::f32));
  TensorBuffer host = host_empty({step_size(c)}, DType::i32);
  KILN_ASSIGN_OR_RETURN(TensorBuffer dev, empty(be, {step_size(c)}, DType::i32));
  ScoreResult out;
  for (int32_t start = 0; start < n - 1; start += c) {
    const int32_t m = std::min(c, n - start);
    pack_step(host.ptr<int32_t>(), start, m, ids.data() + start);
    const int64_t count = step_size(m);
    be.copy(dev.view().rows(0, count), host.view().rows(0, count));
    ForwardBatch b = step_batch(dev.view(), m, start + m, cache.slots);
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
