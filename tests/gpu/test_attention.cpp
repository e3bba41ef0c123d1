// CUDA attention_forward against the CPU twin on random inputs: the decode (split-KV) path, the
// prefill (tensor-core) path, mixed batches, chunked prefill, loose bounds, MHA, f16, the generic
// path (other head sizes, f32), and contexts on shuffled pages of many sizes (kernels/paged_kv.h);
// graph replay is in test_attention_graph.cpp, the cases and check_case in attention_cases.h.
// Outputs are poisoned with NaN first and cache rows outside every request hold NaN, so a row
// left unwritten or a key read from the wrong row shows up as a non-finite error; q/out rows past
// the last request (extra_rows) must still hold NaN afterwards (rows of no request are untouched).
// Cases that reach the prefill path run once per compiled prefill variant (see
// kernels/cuda/attention_internal.h), each against the same CPU reference.
#include "attention_cases.h"

namespace kiln::test {
namespace {

// ---- Decode (split-KV path)

TEST(AttentionGpu, DecodeSingleRequest) {
  KILN_REQUIRE_GPU(be);
  for (int kv_len : {1, 7, 64, 65, 1000, 4097, 30000}) check_case(*be, decode_case(kv_len), kTolBf16);
}

TEST(AttentionGpu, DecodeHeadDim128) {
  KILN_REQUIRE_GPU(be);
  for (int kv_len : {1, 33, 1000, 5000}) check_case(*be, decode_case(kv_len, 32, 8, 128), kTolBf16);
}

TEST(AttentionGpu, DecodeBatched) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1, 1, 1, 1, 1};
  c.kv_lens = {1, 17, 300, 2048, 777};
  check_case(*be, c, kTolBf16);
  c.Hq = 32;
  c.Hkv = 8;
  c.D = 128;
  c.seed = 9;
  check_case(*be, c, kTolBf16);
}

TEST(AttentionGpu, DecodePeakedScores) {
  KILN_REQUIRE_GPU(be);
  AttnCase c = decode_case(4097);
  c.q_std = 4.0f;  // scores with std ~4: exercises the rescaling of the running max
  check_case(*be, c, kTolBf16);
}

// Several query rows per request on the decode path (speculative / short chunks): causal inside
// the 16-row tiles of packed (query, head) rows, up to 4 tiles.
TEST(AttentionGpu, DecodeShortQueries) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {3, 2};
  c.kv_lens = {500, 40};
  check_case(*be, c, kTolBf16);
  AttnCase g8;  // G = 8: 8 queries x 8 heads = 64 rows, the largest decode-path shape
  g8.Hq = 32;
  g8.Hkv = 4;
  g8.q_lens = {8, 5};
  g8.kv_lens = {3000, 5};
  check_case(*be, g8, kTolBf16);
  AttnCase mha;  // G = 1: 16 query rows of one head per tile
  mha.Hq = mha.Hkv = 8;
  mha.q_lens = {16, 1, 9};
  mha.kv_lens = {16, 900, 2000};
  check_case(*be, mha, kTolBf16);
}

TEST(AttentionGpu, DecodeLooseBounds) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1, 1, 1};
  c.kv_lens = {5, 1000, 129};
  c.extra_q_bound = 2;
  c.extra_kv_bound = 20000;
  c.kv_offset = 3;
  check_case(*be, c, kTolBf16);
}

// ---- Prefill (tensor-core path)

TEST(AttentionGpu, PrefillSingleRequest) {
  KILN_REQUIRE_GPU(be);
  for (int n : {1, 17, 64, 127, 128, 129, 300, 1030}) check_prefill(*be, prefill_case(n, n), kTolBf16);
}

TEST(AttentionGpu, PrefillHeadDim128) {
  KILN_REQUIRE_GPU(be);
  for (int n : {17, 64, 65, 128, 129, 300, 1030}) check_prefill(*be, prefill_case(n, n, 8, 2, 128), kTolBf16);
  // Llama/Qwen-8B-like heads (G = 4), peaked scores, a cached prefix, two requests.
  AttnCase c;
  c.Hq = 32;
  c.Hkv = 8;
  c.D = 128;
  c.q_lens = {700, 129};
  c.kv_lens = {1900, 129};
  c.q_std = 3.0f;
  c.kv_offset = 5;
  c.seed = 11;
  check_prefill(*be, c, kTolBf16);
}

TEST(AttentionGpu, PrefillPeakedScores) {
  KILN_REQUIRE_GPU(be);
  AttnCase c = prefill_case(300, 300);
  c.q_std = 4.0f;
  check_prefill(*be, c, kTolBf16);
}

// Longer runs: many 64/128-key tiles, the diagonal at every offset inside a tile, two requests of
// different lengths, bounds past the true lengths, GQA group 8, peaked scores.
TEST(AttentionGpu, PrefillLongerRuns) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1500, 333};
  c.kv_lens = {1500, 2011};
  c.extra_q_bound = 70;
  c.kv_offset = 9;
  check_prefill(*be, c, kTolBf16);
  AttnCase g8 = prefill_case(517, 1203, 32, 4, 64);
  g8.q_std = 3.0f;
  g8.seed = 5;
  check_prefill(*be, g8, kTolBf16);
}

// Chunked prefill: queries continue a cached prefix (q_len < kv_len).
TEST(AttentionGpu, PrefillWithCachedPrefix) {
  KILN_REQUIRE_GPU(be);
  check_prefill(*be, prefill_case(200, 1500), kTolBf16);
  check_prefill(*be, prefill_case(130, 194), kTolBf16);
  check_prefill(*be, prefill_case(70, 1000, 8, 2, 128), kTolBf16);
}

// Prefill and decode requests (one with no query this step, one padding request: no query, no
// context) in one call, rows after the last request left alone.
TEST(AttentionGpu, MixedBatch) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1, 300, 0, 1, 0, 45, 1};
  c.kv_lens = {1000, 300, 10, 64, 0, 545, 2};
  c.kv_offset = 5;
  c.extra_rows = 3;
  check_prefill(*be, c, kTolBf16);
  c.Hq = 16;
  c.Hkv = 4;
  c.D = 128;
  c.seed = 3;
  check_prefill(*be, c, kTolBf16);
}

TEST(AttentionGpu, PrefillLooseBounds) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {100, 1, 33};
  c.kv_lens = {100, 70, 400};
  c.extra_q_bound = 300;  // whole query tiles past every request
  c.extra_kv_bound = 1000;
  check_prefill(*be, c, kTolBf16);
}

TEST(AttentionGpu, MultiHeadAttention) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, decode_case(3000, 8, 8, 64), kTolBf16);
  check_prefill(*be, prefill_case(257, 257, 8, 8, 64), kTolBf16);
  check_prefill(*be, prefill_case(100, 150, 4, 4, 128), kTolBf16);
}

TEST(AttentionGpu, Float16) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.dtype = DType::f16;
  c.q_lens = {1, 200, 1};
  c.kv_lens = {2000, 200, 33};
  check_prefill(*be, c, kTolBf16);
  AttnCase d = decode_case(5000);
  d.dtype = DType::f16;
  check_case(*be, d, kTolBf16);
}

// ---- Generic path (head sizes without a fast kernel, f32)

TEST(AttentionGpu, GenericF32) {
  KILN_REQUIRE_GPU(be);
  for (int D : {48, 96, 64}) {
    AttnCase c;
    c.dtype = DType::f32;
    c.Hq = 6;
    c.Hkv = 2;
    c.D = D;
    c.q_lens = {1, 37, 5};
    c.kv_lens = {300, 37, 90};
    c.kv_offset = 2;
    check_case(*be, c, kTolF32);
  }
}

TEST(AttentionGpu, GenericOtherHeadDims) {
  KILN_REQUIRE_GPU(be);
  for (int D : {2, 96, 256}) {
    AttnCase c;
    c.Hq = 4;
    c.Hkv = 2;
    c.D = D;
    c.q_lens = {1, 20};
    c.kv_lens = {500, 30};
    check_case(*be, c, kTolBf16);
  }
}

// ---- Paged caches: contexts on shuffled pages (kernels/paged_kv.h)

// Decode batches of many requests with odd lengths on pages of every size, a padding request in
// the middle, lengths on and around page and step boundaries, rows after the last request.
TEST(AttentionGpu, DecodePaged) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : kPageSizes) {
    AttnCase c;
    c.q_lens = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1};
    c.kv_lens = {1, 17, 300, 2049, 0, 777, 15, 16, 65, 1000, 4099};
    c.page_size = page_size;
    c.extra_rows = 2;
    c.seed = 20 + page_size;
    check_case(*be, c, kTolBf16);
    c.Hq = 32;  // D = 128 fast path, G = 4
    c.Hkv = 8;
    c.D = 128;
    c.dtype = DType::f16;
    check_case(*be, c, kTolBf16);
  }
}

// Many decode requests (more blocks than one wave: one split each), odd lengths, padding
// requests scattered through the batch, 16-key pages.
TEST(AttentionGpu, DecodePagedManyRequests) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  uint64_t x = 12345;
  for (int b = 0; b < 67; ++b) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const bool pad = b % 11 == 5;
    c.q_lens.push_back(pad ? 0 : 1);
    c.kv_lens.push_back(pad ? 0 : 1 + static_cast<int32_t>((x >> 33) % 3000));
  }
  c.page_size = 16;
  c.extra_kv_bound = 500;
  c.extra_rows = 1;
  check_case(*be, c, kTolBf16);
}

// Several query rows per request on the decode path over paged contexts, GQA 8 and MHA.
TEST(AttentionGpu, DecodePagedShortQueries) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : {3, 16, 64}) {
    AttnCase g8;
    g8.Hq = 32;
    g8.Hkv = 4;
    g8.q_lens = {8, 0, 5, 2};
    g8.kv_lens = {3000, 0, 5, 130};
    g8.page_size = page_size;
    check_case(*be, g8, kTolBf16);
    AttnCase mha;
    mha.Hq = mha.Hkv = 8;
    mha.D = 128;
    mha.q_lens = {16, 1, 9};
    mha.kv_lens = {16, 900, 2000};
    mha.page_size = page_size;
    mha.seed = 31;
    check_case(*be, mha, kTolBf16);
  }
}

// Prefill chunks after a cached prefix on shuffled pages (q 100 over kv 700, q 1 over kv 1000 in
// a prefill batch), a full prefill, a padding request in the middle, every variant, D 64 and 128,
// bf16 and f16.
TEST(AttentionGpu, PrefillPaged) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : kPageSizes) {
    AttnCase c;
    c.q_lens = {100, 1, 0, 257, 64, 130};
    c.kv_lens = {700, 1000, 0, 257, 200, 194};
    c.page_size = page_size;
    c.extra_rows = 2;
    c.seed = 40 + page_size;
    check_prefill(*be, c, kTolBf16);
    c.Hq = 32;
    c.Hkv = 8;
    c.D = 128;
    c.dtype = DType::f16;
    c.q_std = 2.0f;
    check_prefill(*be, c, kTolBf16);
  }
}

// Longer paged prefill: many tiles, so the pool rows of tile t + 2 are staged while tile t is
// computed; loose bounds, GQA 8, D 128 with a long cached prefix.
TEST(AttentionGpu, PrefillPagedLonger) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : {16, 100}) {
    AttnCase c;
    c.q_lens = {1500, 333};
    c.kv_lens = {1500, 2011};
    c.extra_q_bound = 70;
    c.page_size = page_size;
    check_prefill(*be, c, kTolBf16);
    AttnCase g8 = prefill_case(517, 1203, 32, 4, 64);
    g8.q_std = 3.0f;
    g8.page_size = page_size;
    g8.seed = 5;
    check_prefill(*be, g8, kTolBf16);
    AttnCase d128 = prefill_case(700, 1900, 32, 8, 128);
    d128.page_size = page_size;
    d128.seed = 11;
    check_prefill(*be, d128, kTolBf16);
  }
}

// One page per request, larger than any tile and not a multiple of 16 (the single-request
// generator uses the whole cache as one page): steps and tiles lie in the page except near its end.
TEST(AttentionGpu, OnePagePerRequest) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1, 1, 1};
  c.kv_lens = {4097, 1, 3000};
  c.page_size = 4100;
  c.spare_pages = 1;
  check_case(*be, c, kTolBf16);
  AttnCase p;
  p.q_lens = {300, 1};
  p.kv_lens = {1000, 999};
  p.page_size = 1000;
  p.spare_pages = 1;
  check_prefill(*be, p, kTolBf16);
}

// The generic kernel (head sizes without a fast path, f32) over paged contexts.
TEST(AttentionGpu, GenericPaged) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : {1, 3, 16, 64}) {
    AttnCase c;
    c.dtype = DType::f32;
    c.Hq = 6;
    c.Hkv = 2;
    c.D = 96;
    c.q_lens = {1, 37, 0, 5};
    c.kv_lens = {300, 37, 0, 90};
    c.page_size = page_size;
    c.extra_rows = 1;
    check_case(*be, c, kTolF32);
    c.dtype = DType::bf16;
    c.D = 48;
    check_case(*be, c, kTolBf16);
  }
}

// ---- Per-backend state

#ifdef KILN_WITH_CUDA
// Kernel attributes, occupancy and wgmma support are kept per backend: a second backend on the
// same device starts with fresh state, and each device (on a multi-GPU host: up to two here) gets
// its own. Every prefill variant (shared-memory limits raised per backend) and the decode path.
TEST(AttentionGpu, StatePerBackend) {
  KILN_REQUIRE_GPU(be);
  AttnCase p;
  p.q_lens = {200, 1};
  p.kv_lens = {300, 500};
  p.page_size = 16;
  AttnCase d = decode_case(3000);
  d.page_size = 64;
  check_prefill(*be, p, kTolBf16);
  check_case(*be, d, kTolBf16);
  const int devices = std::min(cuda_device_count(), 2);
  for (int dev = 0; dev < devices; ++dev) {
    SCOPED_TRACE("fresh backend on cuda:" + std::to_string(dev));
    Result<std::unique_ptr<Backend>> other = make_backend(Device::cuda(dev));
    ASSERT_TRUE(other.ok()) << other.status().message();
    check_prefill(**other, p, kTolBf16);
    check_case(**other, d, kTolBf16);
  }
}
#endif

}  // namespace
}  // namespace kiln::test
