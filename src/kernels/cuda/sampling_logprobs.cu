// Raw log-probabilities of the sampled rows that ask (ops::sample, kernels/sampling.h), the CUDA side
// of the CPU twin's logprobs_row (kernels/cpu/sampling.cpp). One block per row that asks: the max, the
// sum of exp_nonpos(l - max) in double, the chosen token's log-probability (not in rows with
// logprobs == kLogprobsSampled, whose behaviour log-prob sample_kernel wrote); then the top-N: the
// N-th first of the per-thread firsts (N block argmax rounds) is a threshold at or below the N-th
// element of the order, and at most N threads hold elements at or above it, so at most
// N * ceil(V / 1024) candidates (workspace); N block argmax rounds over them give the top-N in order.
#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/sampling_common.cuh"

namespace kiln::cuda::sampler {
namespace {

namespace sm = kiln::sampling;

__global__ void __launch_bounds__(kThreads, 1)
    logprob_kernel(const float* logits, int64_t V, const ops::SamplingRow* params, const int32_t* tokens,
                   float* logprobs, int32_t* top_ids, float* top_logprobs, char* workspace, int64_t row_bytes) {
  __shared__ ArgMax arg[32];
  __shared__ double red[32];
  __shared__ uint32_t n_cand;
  hopper::launch_dependents();  // what follows (the step's output copy) waits for this grid
  const int64_t b = blockIdx.x;
  const ops::SamplingRow& p = params[b];
  if (p.logprobs == 0 && p.top_logprobs <= 0) return;
  const int n_top = top_ids ? min(p.top_logprobs, ops::kMaxTopLogprobs) : 0;
  const bool raw_token = p.logprobs != ops::kLogprobsSampled;  // else sample_kernel wrote logprobs[b]
  if (!raw_token && n_top <= 0) return;
  const float* row = logits + b * V;

  ArgMax mine{-INFINITY, INT_MAX};  // this thread's first element of the order
  for (int64_t i = threadIdx.x; i < V; i += kThreads)
    mine = better(mine, ArgMax{sm::clean(__ldg(row + i)), static_cast<int32_t>(i)});
  const float mx = block_argmax(mine, arg).v;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads)
    sum += static_cast<double>(sm::exp_nonpos(sm::fsub(sm::clean(__ldg(row + i)), mx)));
  sum = detail::block_reduce<kThreads>(sum, detail::SumOp{}, 0.0, red);
  const bool finite = isfinite(mx);
  const double lse = static_cast<double>(mx) + log(sum);
  auto logp = [&](float v) -> float {
    if (!finite) return v == mx ? 0.0f : -INFINITY;
    return static_cast<float>(static_cast<double>(v) - lse);
  };
  if (threadIdx.x == 0 && logprobs && raw_token) logprobs[b] = logp(sm::clean(row[tokens[b]]));
  if (n_top <= 0) return;

  // Threshold: the n_top-th first of the per-thread firsts.
  ArgMax tau{INFINITY, -1};  // before everything
  for (int k = 0; k < n_top; ++k) tau = block_argmax(before(tau, mine) ? mine : ArgMax{-INFINITY, INT_MAX}, arg);
  char* ws = workspace + b * row_bytes + 2 * sm::align256(4 * V);
  const int64_t cap = sm::top_candidates(V);
  float* cand_v = reinterpret_cast<float*>(ws);
  int32_t* cand_i = reinterpret_cast<int32_t*>(ws + sm::align256(4 * cap));
  if (threadIdx.x == 0) n_cand = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const ArgMax e{sm::clean(__ldg(row + i)), static_cast<int32_t>(i)};
    if (before(tau, e)) continue;
    const uint32_t pos = atomicAdd(&n_cand, 1u);
    if (pos < cap) cand_v[pos] = e.v, cand_i[pos] = e.i;
  }
  __syncthreads();
  const int64_t n = min(static_cast<int64_t>(n_cand), cap);
  ArgMax prev{INFINITY, -1};
  for (int k = 0; k < n_top; ++k) {
    ArgMax c{-INFINITY, INT_MAX};
    for (int64_t q = threadIdx.x; q < n; q += kThreads) {
      const ArgMax e{cand_v[q], cand_i[q]};
      if (before(prev, e)) c = better(c, e);
    }
    prev = block_argmax(c, arg);
    if (threadIdx.x == 0) {
      const bool has = prev.i != INT_MAX;
      top_ids[b * ops::kMaxTopLogprobs + k] = has ? prev.i : -1;
      top_logprobs[b * ops::kMaxTopLogprobs + k] = has ? logp(prev.v) : -INFINITY;
    }
  }
}

}  // namespace

void launch_logprobs(CudaBackend& be, const ops::SamplingBatch& s, char* workspace, int64_t row_bytes) {
  float* logprobs = nullptr;
  int32_t* top_ids = nullptr;
  float* top_logprobs = nullptr;
  if (sm::present(s.logprobs)) {
    detail::check_float(be, s.logprobs);
    logprobs = s.logprobs.ptr<float>();
  }
  if (sm::present(s.top_ids)) {
    detail::check_i32(be, s.top_ids);
    detail::check_float(be, s.top_logprobs);
    top_ids = s.top_ids.ptr<int32_t>();
    top_logprobs = s.top_logprobs.ptr<float>();
  }
  if (!logprobs && !top_ids) return;
  const int64_t B = s.logits.size(0), V = s.logits.size(1);
  logprob_kernel<<<static_cast<unsigned>(B), kThreads, 0, detail::stream_of(be)>>>(
      s.logits.ptr<const float>(), V, reinterpret_cast<const ops::SamplingRow*>(s.params.data),
      s.tokens.ptr<const int32_t>(), logprobs, top_ids, top_logprobs, workspace, row_bytes);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda::sampler
