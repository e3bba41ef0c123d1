// Test helpers for ops::sample: a host description of one sampling call (logits, per-row parameters,
// optional counts table) and a runner that uploads it to any backend, calls the op and reads every
// output back. Outputs the op must leave untouched start as sentinels (kUntouched*).
#pragma once

#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "kernels/sampling.h"

namespace kiln::test {

constexpr int32_t kUntouchedId = -7;
constexpr float kUntouchedLogprob = 123.0f;

struct SamplerCall {
  int64_t B = 0, V = 0;
  std::vector<float> logits;            // [B, V]
  std::vector<ops::SamplingRow> rows;   // [B]
  std::vector<int32_t> counts;          // [count_rows, V] or empty
  int64_t count_rows = 0;
  bool logprob_outputs = true;          // pass the log-prob tensors
};

struct SamplerOutputs {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;          // [B]
  std::vector<int32_t> top_ids;         // [B, kMaxTopLogprobs]
  std::vector<float> top_logprobs;      // [B, kMaxTopLogprobs]
  std::vector<int32_t> counts;          // the table after the call
};

inline TensorBuffer sampler_params_host(const std::vector<ops::SamplingRow>& rows) {
  TensorBuffer t = host_empty(Shape{static_cast<int64_t>(rows.size()), ops::kSamplingRowWords}, DType::i32);
  if (!rows.empty()) std::memcpy(t.ptr<int32_t>(), rows.data(), rows.size() * sizeof(ops::SamplingRow));
  return t;
}

template <typename T>
TensorBuffer sampler_upload(Backend& be, Shape shape, DType dt, const std::vector<T>& values) {
  TensorBuffer h = host_empty(shape, dt);
  std::memcpy(h.ptr<T>(), values.data(), values.size() * sizeof(T));
  Result<TensorBuffer> d = to_device(be, h);
  KILN_ASSERT(d.ok());
  return std::move(d).value();
}

template <typename T>
std::vector<T> sampler_read(Backend& be, Tensor t) {
  TensorBuffer h = to_host(be, t);
  return std::vector<T>(h.ptr<T>(), h.ptr<T>() + h.numel());
}

// Device buffers of one call, kept so that a test can replay or change them.
struct SamplerBuffers {
  TensorBuffer logits, params, counts, tokens, logprobs, top_ids, top_logprobs, workspace;
  ops::SamplingBatch batch(bool full) const {
    ops::SamplingBatch s;
    s.logits = logits;
    s.params = params;
    if (counts.allocated()) s.counts = counts;
    s.tokens = tokens;
    if (logprobs.allocated()) s.logprobs = logprobs, s.top_ids = top_ids, s.top_logprobs = top_logprobs;
    s.workspace = workspace;
    s.full = full;
    return s;
  }
  SamplerOutputs read(Backend& be) const {
    SamplerOutputs o;
    o.tokens = sampler_read<int32_t>(be, tokens);
    if (logprobs.allocated()) {
      o.logprobs = sampler_read<float>(be, logprobs);
      o.top_ids = sampler_read<int32_t>(be, top_ids);
      o.top_logprobs = sampler_read<float>(be, top_logprobs);
    }
    if (counts.allocated()) o.counts = sampler_read<int32_t>(be, counts);
    return o;
  }
};

inline SamplerBuffers sampler_buffers(Backend& be, const SamplerCall& c) {
  SamplerBuffers b;
  const int64_t B = c.B, V = c.V, K = ops::kMaxTopLogprobs;
  b.logits = sampler_upload(be, Shape{B, V}, DType::f32, c.logits);
  Result<TensorBuffer> p = to_device(be, sampler_params_host(c.rows));
  KILN_ASSERT(p.ok());
  b.params = std::move(p).value();
  if (c.count_rows > 0) b.counts = sampler_upload(be, Shape{c.count_rows, V}, DType::i32, c.counts);
  b.tokens = sampler_upload(be, Shape{B}, DType::i32, std::vector<int32_t>(B, kUntouchedId));
  if (c.logprob_outputs) {
    b.logprobs = sampler_upload(be, Shape{B}, DType::f32, std::vector<float>(B, kUntouchedLogprob));
    b.top_ids = sampler_upload(be, Shape{B, K}, DType::i32, std::vector<int32_t>(B * K, kUntouchedId));
    b.top_logprobs = sampler_upload(be, Shape{B, K}, DType::f32, std::vector<float>(B * K, kUntouchedLogprob));
  }
  Result<TensorBuffer> w = empty(be, Shape{(ops::sampling_workspace_bytes(B, V) + 3) / 4}, DType::i32);
  KILN_ASSERT(w.ok());
  b.workspace = std::move(w).value();
  return b;
}

// One call of ops::sample on `be`; every output read back.
inline SamplerOutputs run_sampler(Backend& be, const SamplerCall& c, bool full = true) {
  SamplerBuffers b = sampler_buffers(be, c);
  ops::sample(be, b.batch(full));
  return b.read(be);
}

}  // namespace kiln::test
