// CUDA training attention (kernels/cuda/attention_train.cu) against the CPU twin on random inputs.
// Both sides read the same storage-rounded inputs (bf16 unless stated); the CPU reference writes f32
// outputs. Checked: out, lse (finite entries, and -inf exactly where a query sees nothing), dq, dk,
// dv, by relative L2 error (bf16: <= 1e-2, lse <= 1e-3; f32 generic path: <= 1e-4). GPU outputs
// are poisoned with NaN first, so an element left unwritten shows up; padded queries must give
// out = 0 and dq = 0, padded keys dk = dv = 0, exactly.
// Tensor-core cases run once per variant (KILN_ATTN_TRAIN_VARIANT: 1 wgmma, 3 wgmma with the
// one-warpgroup D = 64 backward (the default)); on a GPU without wgmma every case takes the generic
// path.
// Cases: the tensor-core path (D = 64, 128) and the generic path (D = 32, 96; f32); S not a
// multiple of any tile (200, 1000) and S = 2048 with several heads per group; B = 2; GQA and MHA;
// causal with and without segment ids (3 documents + padding), non-causal with and without; many
// short documents (segment block skipping); non-monotonic ids where one id appears in two runs and
// padding sits between documents (the skipping must stay conservative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/train_ops.h"
#include "test_util.h"

namespace kiln::test {
namespace {

// Runs of (segment id, length) per batch row; empty: no segment ids.
using Runs = std::vector<std::pair<int32_t, int>>;

struct TrainAttnCase {
  int B = 2, Hq = 4, Hkv = 2, S = 200, D = 64;
  bool causal = true;
  std::vector<Runs> segments;  // one per batch row, or empty
  DType dtype = DType::bf16;
  uint64_t seed = 1;
};

std::string describe(const TrainAttnCase& c) {
  return std::string(dtype_name(c.dtype)) + " B=" + std::to_string(c.B) + " Hq=" + std::to_string(c.Hq) +
         " Hkv=" + std::to_string(c.Hkv) + " S=" + std::to_string(c.S) + " D=" + std::to_string(c.D) +
         (c.causal ? " causal" : " non-causal") + (c.segments.empty() ? "" : " segments");
}

// The row's segment ids from its runs (the runs must cover S exactly).
std::vector<int32_t> segment_ids(const TrainAttnCase& c) {
  std::vector<int32_t> ids;
  for (const Runs& runs : c.segments) {
    size_t start = ids.size();
    for (const auto& [id, len] : runs) ids.insert(ids.end(), static_cast<size_t>(len), id);
    KILN_ASSERT(ids.size() - start == static_cast<size_t>(c.S));
  }
  return ids;
}

// Three documents then padding: lengths a, b, c and S - a - b - c padded tokens.
Runs three_docs(int a, int b, int c, int S) { return {{0, a}, {1, b}, {2, c}, {-1, S - a - b - c}}; }

// Documents of `len` tokens (ids 0, 1, ...) filling S, the last one shorter.
Runs short_docs(int len, int S) {
  Runs r;
  for (int s = 0, id = 0; s < S; s += len, ++id) r.push_back({id, std::min(len, S - s)});
  return r;
}

TensorBuffer nan_host(Shape shape, DType dtype) {
  TensorBuffer t = host_empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (dtype) {
      case DType::f32: t.ptr<float>()[i] = std::numeric_limits<float>::quiet_NaN(); break;
      case DType::bf16: t.ptr<uint16_t>()[i] = 0x7fc0; break;
      case DType::f16: t.ptr<uint16_t>()[i] = 0x7e00; break;
      default: KILN_ASSERT(false);
    }
  }
  return t;
}

int64_t count_nonfinite(const std::vector<float>& x) {
  return std::count_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  EXPECT_EQ(count_nonfinite(got), 0) << what << ": elements left unwritten or not finite";
  // P (and dS in the backward) are rounded to bf16 before their products, so an element's error is
  // up to u times the scale of the other operand, several times the result's own: sixteen units of
  // rounding per element (elem_bound's four for the tolerance class, times four).
  EXPECT_CLOSE_BOUND(got, want, tol, 4 * elem_bound(tol)) << what;
}

// Sets KILN_ATTN_TRAIN_VARIANT for the scope (restores the previous value).
struct VariantScope {
  explicit VariantScope(const char* v) {
    const char* prev = std::getenv("KILN_ATTN_TRAIN_VARIANT");
    had_ = prev != nullptr;
    if (had_) prev_ = prev;
    setenv("KILN_ATTN_TRAIN_VARIANT", v, 1);
  }
  ~VariantScope() {
    if (had_)
      setenv("KILN_ATTN_TRAIN_VARIANT", prev_.c_str(), 1);
    else
      unsetenv("KILN_ATTN_TRAIN_VARIANT");
  }
  bool had_ = false;
  std::string prev_;
};

void check_case(Backend& gpu, const TrainAttnCase& c) {
  SCOPED_TRACE(describe(c));
  auto cpu = make_cpu_backend();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const Shape q_shape{c.B, c.Hq, c.S, c.D}, kv_shape{c.B, c.Hkv, c.S, c.D}, o_shape{c.B, c.S, c.Hq, c.D};
  const Shape lse_shape{c.B, c.Hq, c.S};
  TensorBuffer q = random_host(q_shape, c.dtype, c.seed);
  TensorBuffer k = random_host(kv_shape, c.dtype, c.seed + 1);
  TensorBuffer v = random_host(kv_shape, c.dtype, c.seed + 2);
  TensorBuffer dout = random_host(o_shape, c.dtype, c.seed + 3);
  const std::vector<int32_t> ids = segment_ids(c);
  TensorBuffer seg_host;
  Tensor seg_cpu;
  if (!ids.empty()) {
    seg_host = host_ints(ids);
    seg_cpu = seg_host.view().view(Shape{c.B, c.S});
  }

  // CPU reference (f32 outputs from the same rounded inputs).
  TensorBuffer out_ref = host_empty(o_shape, DType::f32), lse_ref = host_empty(lse_shape, DType::f32);
  ops::attention_train_forward(*cpu, out_ref, lse_ref, q, k, v, seg_cpu, c.causal, scale);
  TensorBuffer dq_ref = host_empty(q_shape, DType::f32), dk_ref = host_empty(kv_shape, DType::f32),
               dv_ref = host_empty(kv_shape, DType::f32);
  ops::attention_train_backward(*cpu, dq_ref, dk_ref, dv_ref, dout, q, k, v, out_ref, lse_ref, seg_cpu, c.causal,
                                scale);

  // GPU, once per tensor-core variant (KILN_ATTN_TRAIN_VARIANT: 1 wgmma, 3 wgmma with the
  // one-warpgroup D = 64 backward; the generic path ignores it).
  TensorBuffer gq = upload(gpu, q), gk = upload(gpu, k), gv = upload(gpu, v);
  TensorBuffer gdout = upload(gpu, dout);
  TensorBuffer gseg;
  Tensor seg_gpu;
  if (!ids.empty()) {
    gseg = upload(gpu, seg_host);
    seg_gpu = gseg.view().view(Shape{c.B, c.S});
  }
  const std::vector<float> out_want = to_f32(*cpu, out_ref), dq_want = to_f32(*cpu, dq_ref),
                           dk_want = to_f32(*cpu, dk_ref), dv_want = to_f32(*cpu, dv_ref),
                           lse_want = to_f32(*cpu, lse_ref);
  for (const char* variant : {"1", "3"}) {
    SCOPED_TRACE(std::string("KILN_ATTN_TRAIN_VARIANT=") + variant);
    VariantScope scope(variant);
    TensorBuffer gout = upload(gpu, nan_host(o_shape, c.dtype));
    TensorBuffer glse = upload(gpu, nan_host(lse_shape, DType::f32));
    ops::attention_train_forward(gpu, gout, glse, gq, gk, gv, seg_gpu, c.causal, scale);
    TensorBuffer gdq = upload(gpu, nan_host(q_shape, c.dtype));
    TensorBuffer gdk = upload(gpu, nan_host(kv_shape, c.dtype));
    TensorBuffer gdv = upload(gpu, nan_host(kv_shape, c.dtype));
    ops::attention_train_backward(gpu, gdq, gdk, gdv, gdout, gq, gk, gv, gout, glse, seg_gpu, c.causal, scale);
    Status st = gpu.synchronize();
    ASSERT_TRUE(st.ok()) << st.message();

    const double tol = c.dtype == DType::f32 ? 1e-4 : 1e-2;
    const std::vector<float> out = to_f32(gpu, gout), dq = to_f32(gpu, gdq), dk = to_f32(gpu, gdk),
                             dv = to_f32(gpu, gdv);
    expect_close(out, out_want, tol, "out");
    expect_close(dq, dq_want, tol, "dq");
    expect_close(dk, dk_want, tol, "dk");
    expect_close(dv, dv_want, tol, "dv");

    // lse: -inf exactly where the reference has it (queries that see nothing), close elsewhere.
    const std::vector<float> lse = to_f32(gpu, glse);
    std::vector<float> lse_fin, lse_want_fin;
    int64_t bad_inf = 0;
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(lse_want[i])) {
        bad_inf += !(std::isinf(lse[i]) && lse[i] < 0);
      } else {
        lse_fin.push_back(lse[i]);
        lse_want_fin.push_back(lse_want[i]);
      }
    }
    EXPECT_EQ(bad_inf, 0) << "lse of queries that see nothing must be -inf";
    expect_close(lse_fin, lse_want_fin, c.dtype == DType::f32 ? 1e-5 : 1e-3, "lse");

    // Padding gives exact zeros.
    int64_t nonzero = 0;
    for (int b = 0; b < c.B && !ids.empty(); ++b)
      for (int s = 0; s < c.S; ++s) {
        if (ids[static_cast<size_t>(b) * c.S + s] >= 0) continue;
        for (int d = 0; d < c.D; ++d) {
          for (int h = 0; h < c.Hq; ++h) {
            nonzero += out[((static_cast<int64_t>(b) * c.S + s) * c.Hq + h) * c.D + d] != 0.0f;
            nonzero += dq[((static_cast<int64_t>(b) * c.Hq + h) * c.S + s) * c.D + d] != 0.0f;
          }
          for (int h = 0; h < c.Hkv; ++h) {
            nonzero += dk[((static_cast<int64_t>(b) * c.Hkv + h) * c.S + s) * c.D + d] != 0.0f;
            nonzero += dv[((static_cast<int64_t>(b) * c.Hkv + h) * c.S + s) * c.D + d] != 0.0f;
          }
        }
      }
    EXPECT_EQ(nonzero, 0) << "padded tokens must give zero out / dq / dk / dv";
  }
}

TrainAttnCase make(int D, int S, bool causal, bool segments, int Hq = 4, int Hkv = 2, int B = 2) {
  TrainAttnCase c;
  c.B = B;
  c.Hq = Hq;
  c.Hkv = Hkv;
  c.S = S;
  c.D = D;
  c.causal = causal;
  c.seed = static_cast<uint64_t>(D * 7919 + S * 31 + (causal ? 1 : 0) + (segments ? 2 : 0) + Hq * 5);
  if (segments)
    for (int b = 0; b < B; ++b) c.segments.push_back(three_docs(S * 3 / 10 + 5 * b, S * 2 / 5 - 7 * b, S / 5, S));
  return c;
}

// ---- Tensor-core path (bf16, D = 64 / 128) ---------------------------------------------------------

TEST(AttentionTrainGpu, D64Causal) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(64, 200, true, false));
}
TEST(AttentionTrainGpu, D64CausalSegments) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(64, 1000, true, true));
}
TEST(AttentionTrainGpu, D64NonCausalMha) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(64, 200, false, false, 2, 2));
}
TEST(AttentionTrainGpu, D64NonCausalSegments) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(64, 1000, false, true));
}
TEST(AttentionTrainGpu, D64CausalLongGqa) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(64, 2048, true, false, 8, 2, 1));
}
TEST(AttentionTrainGpu, D128Causal) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(128, 1000, true, false));
}
TEST(AttentionTrainGpu, D128CausalSegments) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(128, 200, true, true));
}
TEST(AttentionTrainGpu, D128NonCausalSegmentsMha) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(128, 1000, false, true, 2, 2));
}
TEST(AttentionTrainGpu, D128NonCausal) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(128, 200, false, false));
}

// Many short documents: most tile pairs are skipped by the segment summaries.
TEST(AttentionTrainGpu, ShortDocuments) {
  KILN_REQUIRE_GPU(be);
  for (int D : {64, 128}) {
    TrainAttnCase c = make(D, 1000, true, false);
    c.segments = {short_docs(50, 1000), short_docs(173, 1000)};
    check_case(*be, c);
  }
}

// Ids that are not increasing, one id in two separate runs (they see each other: the mask compares
// ids), padding between documents and at the start.
TEST(AttentionTrainGpu, IrregularSegmentIds) {
  KILN_REQUIRE_GPU(be);
  for (bool causal : {true, false})
    for (int D : {64, 128, 96}) {
      TrainAttnCase c = make(D, 1000, causal, false);
      c.segments = {Runs{{7, 300}, {3, 150}, {-1, 40}, {7, 260}, {5, 200}, {-1, 50}},
                    Runs{{-1, 10}, {9, 500}, {2, 70}, {9, 300}, {-1, 120}}};
      check_case(*be, c);
    }
}

// ---- Generic path ----------------------------------------------------------------------------------

TEST(AttentionTrainGpu, GenericD96CausalSegments) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(96, 200, true, true));
}
TEST(AttentionTrainGpu, GenericD32NonCausal) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, make(32, 200, false, false));
}
TEST(AttentionTrainGpu, GenericF32CausalSegments) {
  KILN_REQUIRE_GPU(be);
  TrainAttnCase c = make(64, 200, true, true);
  c.dtype = DType::f32;
  check_case(*be, c);
}

}  // namespace
}  // namespace kiln::test
