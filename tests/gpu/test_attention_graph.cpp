// CUDA attention_forward captured in a CUDA graph once and replayed for other context lengths and
// page tables: each replay against the CPU twin and bit for bit against an eager call with tight
// bounds (the decode launch must not depend on max_kv_len), for the decode launches of every batch
// size class (many splits and the combine pass, two splits merged in the kernel, one split).
#include "attention_cases.h"

namespace kiln::test {
namespace {

// ---- CUDA graph: capture the decode call once, replay it for other context lengths.

#ifdef KILN_WITH_CUDA
// Captures ops::attention_forward on `stream` into an executable graph.
cudaGraphExec_t capture_attention(CudaBackend& cbe, const std::function<void()>& call) {
  cudaStream_t stream = cbe.stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  call();
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  return exec;
}

// Contiguous single-request context (page size 1), the captured form with bounds for kMaxKv.
TEST(AttentionGpu, DecodeGraphReplay) {
  KILN_REQUIRE_GPU(be);
  CudaBackend& cbe = static_cast<CudaBackend&>(*be);
  constexpr int kMaxKv = 6000;
  AttnCase c = decode_case(kMaxKv);
  c.pad_slots = 0;
  Inputs in = make_inputs(c);
  TensorBuffer q = upload(*be, in.q), k = upload(*be, in.k), v = upload(*be, in.v);
  TensorBuffer qi = upload(*be, in.qi);
  const DevicePages pages(*be, in.pages);  // indptr {0, kv_len}, pages 0 .. kMaxKv - 1, last {1}
  TensorBuffer out = upload(*be, nan_host(in.q.shape(), c.dtype));
  const ops::AttentionBounds bounds{1, 1, kMaxKv};

  // An eager call first sizes the scratch (it cannot grow during capture).
  ops::attention_forward(*be, out, q, k, v, qi, pages.view(), bounds, in.scale);
  ASSERT_TRUE(be->synchronize().ok());
  std::vector<float> eager = to_f32(*be, out);

  cudaGraphExec_t exec =
      capture_attention(cbe, [&] { ops::attention_forward(*be, out, q, k, v, qi, pages.view(), bounds, in.scale); });
  ASSERT_NE(exec, nullptr);

  for (int kv_len : {kMaxKv, 1, 33, 64, 65, 1234, 5999}) {
    SCOPED_TRACE("kv_len " + std::to_string(kv_len));
    be->copy(pages.indptr, host_ints({0, kv_len}));
    be->copy(out, nan_host(in.q.shape(), c.dtype));
    ASSERT_EQ(cudaGraphLaunch(exec, cbe.stream()), cudaSuccess);
    ASSERT_TRUE(be->synchronize().ok());
    std::vector<float> got = to_f32(*be, out);

    Inputs ref_in = make_inputs(c);  // same seed: same values
    ref_in.pages.indptr = host_ints({0, kv_len});
    ref_in.bounds = ops::AttentionBounds{1, 1, kv_len};
    std::vector<float> want = cpu_reference(ref_in);
    EXPECT_EQ(count_nonfinite(got), 0);
    EXPECT_CLOSE(got, want, kTolBf16);
    if (kv_len == kMaxKv) {
      EXPECT_EQ(got, eager) << "graph replay differs from the eager call";
    } else {
      // The eager call with tight bounds must give bit-identical output (same key partition).
      TensorBuffer out2 = upload(*be, nan_host(in.q.shape(), c.dtype));
      ops::attention_forward(*be, out2, q, k, v, qi, pages.view(), ref_in.bounds, in.scale);
      EXPECT_EQ(to_f32(*be, out2), got) << "tight-bounds eager call differs from the graph replay";
    }
  }
  cudaGraphExecDestroy(exec);
}

// A batch of decode requests on shuffled 16-key pages, captured once with the bounds of the first
// round's lengths (0: a padding request), replayed after rewriting the page tables for the other
// rounds' lengths and other pages of the pool: each replay must match the CPU twin and be
// bit-identical to an eager call with tight bounds on the same tables.
// heads: the case's Hq, Hkv and D.
void check_decode_graph_replay_paged(Backend& be, const std::vector<std::vector<int32_t>>& lengths,
                                     const AttnCase& heads = AttnCase{}) {
  CudaBackend& cbe = static_cast<CudaBackend&>(be);
  constexpr int kPage = 16;
  const int batch = static_cast<int>(lengths[0].size());
  const int max_kv = *std::max_element(lengths[0].begin(), lengths[0].end());
  AttnCase c;
  c.Hq = heads.Hq;
  c.Hkv = heads.Hkv;
  c.D = heads.D;
  for (int32_t len : lengths[0]) c.q_lens.push_back(len > 0 ? 1 : 0);
  c.kv_lens = lengths[0];
  c.page_size = kPage;
  c.spare_pages = 200;
  Inputs in = make_inputs(c);
  // Every pool row finite: the later layouts use pages that the first one leaves unused.
  in.k = random_host(in.k.shape(), c.dtype, 77);
  in.v = random_host(in.v.shape(), c.dtype, 78);
  const int32_t pool_pages = static_cast<int32_t>(in.k.shape().dims[0] / kPage);
  TensorBuffer q = upload(be, in.q), k = upload(be, in.k), v = upload(be, in.v);
  TensorBuffer qi = upload(be, in.qi);
  // Device tables of fixed size (the graph keeps their addresses), room for every page of the pool.
  TensorBuffer indptr = upload(be, in.pages.indptr), last = upload(be, in.pages.last);
  TensorBuffer indices = upload(be, host_ints(std::vector<int32_t>(pool_pages, 0)));
  be.copy(indices.view().rows(0, in.pages.indices.numel()), in.pages.indices);
  const PagedKV view{indptr, indices, last, kPage};
  TensorBuffer out = upload(be, nan_host(in.q.shape(), c.dtype));
  const ops::AttentionBounds bounds{batch, 1, max_kv};

  ops::attention_forward(be, out, q, k, v, qi, view, bounds, in.scale);  // sizes the scratch
  ASSERT_TRUE(be.synchronize().ok());
  const std::vector<float> eager = to_f32(be, out);
  cudaGraphExec_t exec =
      capture_attention(cbe, [&] { ops::attention_forward(be, out, q, k, v, qi, view, bounds, in.scale); });
  ASSERT_NE(exec, nullptr);

  for (size_t round = 0; round < lengths.size(); ++round) {
    const std::vector<int32_t>& lens = lengths[round];
    ASSERT_EQ(static_cast<int>(lens.size()), batch);
    SCOPED_TRACE("kv_lens [" + join(lens) + "]");
    std::vector<std::vector<int32_t>> slot_of;
    const PagedTables t = round == 0 ? std::move(in.pages)
                                     : scattered_pages(lens, kPage, pool_pages, 100 + round, &slot_of);
    be.copy(indptr, t.indptr);
    be.copy(last, t.last);
    be.copy(indices.view().rows(0, t.indices.numel()), t.indices);
    be.copy(out, nan_host(in.q.shape(), c.dtype));
    ASSERT_EQ(cudaGraphLaunch(exec, cbe.stream()), cudaSuccess);
    ASSERT_TRUE(be.synchronize().ok());
    const std::vector<float> got = to_f32(be, out);
    if (round == 0) {
      EXPECT_EQ(got, eager) << "graph replay differs from the eager call";
    }

    const ops::AttentionBounds tight{batch, 1, *std::max_element(lens.begin(), lens.end())};
    const std::vector<float> want = cpu_reference(in.q, in.k, in.v, in.qi, t.view(), tight, in.scale, in.used_rows);
    EXPECT_EQ(count_nonfinite(got), 0);
    EXPECT_CLOSE(got, want, kTolBf16);
    TensorBuffer out2 = upload(be, nan_host(in.q.shape(), c.dtype));
    ops::attention_forward(be, out2, q, k, v, qi, view, tight, in.scale);
    EXPECT_EQ(to_f32(be, out2), got) << "tight-bounds eager call differs from the graph replay";
  }
  cudaGraphExecDestroy(exec);
}

TEST(AttentionGpu, DecodeGraphReplayPaged) {
  KILN_REQUIRE_GPU(be);
  check_decode_graph_replay_paged(
      *be, {{6000, 2500, 0, 4097}, {1, 33, 0, 64}, {65, 5999, 0, 17}, {1234, 1, 0, 3001}});
}

// Batches of the engine's larger buckets on the astrai-1b heads (24 / 4, D 64), each on another
// decode launch (attention_decode.cu): 32 requests in two splits merged inside the kernel through
// a cluster, 64 likewise on the 4-blocks-per-SM kernel, 128 in one split on that kernel; and 16
// requests of 32 / 8 heads at D 128 in two merged splits. Requests too short to use every split
// and a padding request in each round.
std::vector<std::vector<int32_t>> decode_rounds(int batch, uint64_t seed) {
  std::vector<std::vector<int32_t>> rounds(4, std::vector<int32_t>(batch));
  uint64_t x = seed;
  for (size_t r = 0; r < rounds.size(); ++r)
    for (int b = 0; b < batch; ++b) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const int32_t cap = r == 1 ? 100 : 3000;  // round 1: short requests, some in one split only
      rounds[r][b] = b == 9 ? 0 : 1 + static_cast<int32_t>((x >> 33) % cap);
    }
  rounds[0][0] = 3000;  // the capture's bound
  return rounds;
}

TEST(AttentionGpu, DecodeGraphReplayPagedLargeBatches) {
  KILN_REQUIRE_GPU(be);
  for (int batch : {32, 64, 128}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    check_decode_graph_replay_paged(*be, decode_rounds(batch, 777 + batch));
  }
  AttnCase d128;
  d128.Hq = 32;
  d128.Hkv = 8;
  d128.D = 128;
  SCOPED_TRACE("batch 16, D 128");
  check_decode_graph_replay_paged(*be, decode_rounds(16, 801), d128);
}
#endif

}  // namespace
}  // namespace kiln::test
