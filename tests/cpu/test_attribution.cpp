// Attribution property test of the engine's weight updates (infer/engine.h): random interleavings
// of submits, cancels, shared-prefix prompts, preemptions (a small KV pool), prefix-cache flushes
// and weight updates in the three modes, on tiny models whose weights differ per version. Against
// an independent record kept by the test:
//   - every token's version is the version of the weights that computed it: its log-probability
//     equals a fresh score of the request's tokens by the test's own copy of that version's model
//     (Transformer::forward step by step over a plain KV cache, no engine, no scheduler, no radix
//     cache), where the context's keys/values are those of the versions that computed them: the
//     prompt's by the first token's version, token i's by the version of token i + 1. For a request
//     that one version generated from start to end that is simply a fresh score under that version;
//     only a `keep` update mixes versions inside one request;
//   - so no request read a KV page written under another version except its own in `keep` mode
//     (another version's page would change the scores: the weights of two versions give
//     log-probabilities that differ by far more than the tolerance, checked first);
//   - the acknowledged versions are exactly the published ones; stale versions and wrong shapes
//     are refused and leave the serving version unchanged; modes behave as documented.
// A `keep` request that was also preempted after an update has no such simple record (its
// recomputation rewrote its context with the newer version): only its versions are checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <filesystem>
#include <fstream>
#include <thread>

#include "infer/engine.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace kiln::test {
namespace {

constexpr float kTolerance = 2e-4f;  // same weights, other batch shapes: f32 rounding only

// A private copy of tiny-llama whose weights are scaled elementwise by (1 + 0.15 u), u uniform in
// [-1, 1) from a seed: every version gets different weights.
std::unique_ptr<Transformer> version_model(Backend& be, uint64_t seed) {
  Result<std::unique_ptr<Transformer>> m = Transformer::load(be, testdata_dir() + "/tiny-llama");
  KILN_ASSERT(m.ok());
  std::mt19937_64 rng(seed * 7919 + 17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const auto& [name, shape] : model_tensor_layout((*m)->config()).fused) {
    Tensor t = (*m)->weights().get(name);
    float* p = t.ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= 1.0f + 0.15f * u(rng);
  }
  return std::move(m).value();
}

// Log-probabilities of completion[i] given prompt + completion[0 .. i), the context's keys/values
// written by the versions described at the top.
std::vector<float> reference_logprobs(const std::map<uint64_t, std::unique_ptr<Transformer>>& models,
                                      const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                                      const std::vector<uint64_t>& versions) {
  const Transformer& any = *models.begin()->second;
  const int32_t P = static_cast<int32_t>(prompt.size()), n = P + static_cast<int32_t>(completion.size());
  Result<KVCache> cache = any.make_kv_cache(n);
  Result<ForwardWorkspace> ws = any.make_workspace(n, 1);
  KILN_ASSERT(cache.ok() && ws.ok());
  std::vector<float> out;
  for (size_t i = 0; i < completion.size(); ++i) {
    // Step 0 computes the prompt; step i >= 1 the token i - 1.
    const int32_t begin = i == 0 ? 0 : P + static_cast<int32_t>(i) - 1, end = P + static_cast<int32_t>(i);
    std::vector<int32_t> ids, pos;
    for (int32_t p = begin; p < end; ++p) {
      ids.push_back(p < P ? prompt[p] : completion[p - P]);
      pos.push_back(p);
    }
    TensorBuffer d_ids = host_ints(ids), d_pos = host_ints(pos), q_indptr = host_ints({0, end - begin}),
                 rows = host_ints({end - begin - 1});
    PagedTables pages = contiguous_pages({0, end});
    ForwardBatch b;
    b.ids = d_ids;
    b.positions = d_pos;
    b.slots = d_pos;  // slot = position
    b.q_indptr = q_indptr;
    b.kv = pages.view();
    b.logit_rows = rows;
    b.bounds = {1, end - begin, end};
    const Transformer& m = *models.at(versions[i]);
    const Tensor logits = m.forward(b, *cache, *ws);
    const float* l = logits.ptr<float>();
    const int64_t V = m.config().vocab_size;
    double mx = -INFINITY, s = 0.0;
    for (int64_t v = 0; v < V; ++v) mx = std::max<double>(mx, l[v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(l[v]) - mx);
    out.push_back(static_cast<float>(static_cast<double>(l[completion[i]]) - mx - std::log(s)));
  }
  return out;
}

struct Record {
  GenerationRequest request;
  std::shared_ptr<RequestStream> stream;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<uint64_t> versions;
  EngineEvent final;
};

void drain(Record& r) {
  while (std::optional<EngineEvent> e = r.stream->next()) {
    for (const GeneratedToken& t : e->tokens) {
      r.ids.push_back(t.id);
      r.logprobs.push_back(t.logprob);
      r.versions.push_back(t.policy_version);
    }
    if (e->finished) r.final = *e;
  }
}

struct Tally {
  int64_t operations = 0, requests = 0, tokens_checked = 0, mixed_requests = 0, unchecked_requests = 0;
  int64_t updates = 0, refused = 0, aborted = 0;
  int64_t preemptions = 0, prefix_hit_tokens = 0;  // the engine's, over the runs
};

// One run of `operations` random operations; `modes` are the update modes drawn from.
void run_interleaving(uint64_t seed, int64_t operations, const std::vector<WeightUpdateMode>& modes, Tally& tally) {
  std::unique_ptr<Backend> engine_be = make_cpu_backend(), ref_be = make_cpu_backend();
  std::map<uint64_t, std::unique_ptr<Transformer>> models;  // the test's copy of every published version
  models[0] = version_model(*ref_be, 0);
  std::shared_ptr<const Transformer> served(version_model(*engine_be, 0).release());
  const int64_t V = served->config().vocab_size;

  EngineOptions o;
  o.max_running = 6;
  o.max_step_tokens = 512;  // no prompt is ever split into chunks (see the reference's rule)
  o.page_size = 4;
  o.kv_tokens = 160;        // small: preemptions
  o.use_graphs = false;
  Result<std::unique_ptr<Engine>> made = Engine::create(served, nullptr, {}, o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  Engine& engine = **made;

  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> prefixes;  // shared system prompts
  for (int k = 0; k < 3; ++k) {
    std::vector<int32_t> p;
    for (int64_t i = 0, n = uniform(8, 24); i < n; ++i) p.push_back(static_cast<int32_t>(uniform(3, V - 1)));
    prefixes.push_back(p);
  }
  std::vector<Record> records;
  records.reserve(static_cast<size_t>(operations));
  uint64_t version = 0;
  for (int64_t op = 0; op < operations; ++op) {
    const int64_t kind = uniform(0, 99);
    if (kind < 55) {  // submit
      Record r;
      r.request.prompt = prefixes[uniform(0, 2)];
      for (int64_t i = 0, n = uniform(1, 10); i < n; ++i) r.request.prompt.push_back(static_cast<int32_t>(uniform(3, V - 1)));
      r.request.max_tokens = static_cast<int32_t>(uniform(1, 20));
      r.request.temperature = uniform(0, 1) ? 1.0f : 0.0f;
      r.request.seed = rng();
      r.request.logprobs = true;
      r.request.ignore_eos = true;
      Result<std::shared_ptr<RequestStream>> s = engine.submit(r.request);
      ASSERT_TRUE(s.ok()) << s.status().message();
      r.stream = *s;
      records.push_back(std::move(r));
    } else if (kind < 65) {  // cancel one
      if (!records.empty()) engine.cancel(records[uniform(0, static_cast<int64_t>(records.size()) - 1)].stream->id());
    } else if (kind < 75) {  // publish a new version
      const uint64_t next = version + static_cast<uint64_t>(uniform(1, 3));
      models[next] = version_model(*ref_be, next);
      const WeightUpdateMode mode = modes[uniform(0, static_cast<int64_t>(modes.size()) - 1)];
      Result<WeightUpdateAck> ack = engine.update_weights(WeightSource::in_process(models[next]->weights(), *ref_be), next, mode);
      ASSERT_TRUE(ack.ok()) << ack.status().message();
      EXPECT_EQ(ack->version, next);
      EXPECT_FALSE(ack->zero_copy);
      EXPECT_EQ(engine.policy_version(), next);
      if (mode == WeightUpdateMode::sync) {
        EXPECT_EQ(ack->kept + ack->aborted, 0);
      }
      tally.aborted += ack->aborted;
      version = next;
      ++tally.updates;
    } else if (kind < 78) {  // a stale version, or the right version with wrong shapes: refused
      Result<WeightUpdateAck> ack = Status::Ok();
      if (uniform(0, 1)) {
        ack = engine.update_weights(WeightSource::in_process(models[version]->weights(), *ref_be), version,
                                    WeightUpdateMode::keep);
      } else {
        ModelWeights wrong = models[version]->weights();
        const Tensor head = wrong.get("embed_tokens");
        wrong.set("embed_tokens", head.rows(0, head.size(0) - 1));
        ack = engine.update_weights(WeightSource::in_process(wrong, *ref_be), version + 1, WeightUpdateMode::keep);
      }
      EXPECT_FALSE(ack.ok());
      EXPECT_EQ(engine.policy_version(), version);
      ++tally.refused;
    } else if (kind < 80) {
      engine.flush_prefix_cache();
    } else {  // let the engine run a little
      std::this_thread::sleep_for(std::chrono::microseconds(uniform(0, 1500)));
    }
    ++tally.operations;
  }
  for (Record& r : records) drain(r);
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.cross_version_hits, 0);
  EXPECT_EQ(st.policy_version, version);
  tally.preemptions += st.preemptions;
  tally.prefix_hit_tokens += st.prefix_hit_tokens;

  for (Record& r : records) {
    ++tally.requests;
    const EngineEvent& f = r.final;
    ASSERT_TRUE(f.finished);
    ASSERT_TRUE(f.error.empty()) << f.error;
    ASSERT_EQ(r.versions.size(), r.ids.size());
    EXPECT_EQ(f.usage.completion_tokens, static_cast<int32_t>(r.ids.size()));
    if (f.finish_reason == "length") {
      EXPECT_EQ(static_cast<int32_t>(r.ids.size()), r.request.max_tokens);
    }
    for (size_t i = 0; i < r.versions.size(); ++i) {
      EXPECT_TRUE(models.count(r.versions[i])) << "token version " << r.versions[i] << " was never published";
      if (i > 0) {
        EXPECT_LE(r.versions[i - 1], r.versions[i]);
      }
    }
    if (!r.versions.empty()) {
      EXPECT_LE(f.admission_version, r.versions.front());
      EXPECT_GE(f.finish_version, r.versions.back());
    }
    const bool mixed = !r.versions.empty() && r.versions.front() != r.versions.back();
    if (mixed) {
      ++tally.mixed_requests;
      // Only `keep` lets a request go on under newer weights.
      EXPECT_NE(std::find(modes.begin(), modes.end(), WeightUpdateMode::keep), modes.end());
    }
    if (mixed && f.usage.preemptions > 0) {
      ++tally.unchecked_requests;
      continue;
    }
    const std::vector<float> ref = reference_logprobs(models, r.request.prompt, r.ids, r.versions);
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(r.logprobs[i], ref[i], kTolerance)
          << "token " << i << " of a request (versions " << r.versions.front() << ".." << r.versions.back()
          << ", preemptions " << f.usage.preemptions << ") is not the score of its version's weights";
      ++tally.tokens_checked;
    }
  }
}

// The versions' weights must be far apart for the scores to tell them apart.
TEST(Attribution, VersionsAreDistinguishable) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::map<uint64_t, std::unique_ptr<Transformer>> models;
  models[0] = version_model(*be, 0);
  models[1] = version_model(*be, 1);
  const std::vector<int32_t> prompt = {5, 9, 13, 17, 21, 3, 7, 11}, completion = {40, 41, 42, 43, 44, 45};
  const std::vector<float> a = reference_logprobs(models, prompt, completion, std::vector<uint64_t>(6, 0));
  const std::vector<float> b = reference_logprobs(models, prompt, completion, std::vector<uint64_t>(6, 1));
  const std::vector<float> mixed = reference_logprobs(models, prompt, completion, {0, 0, 0, 1, 1, 1});
  for (size_t i = 0; i < a.size(); ++i) EXPECT_GT(std::fabs(a[i] - b[i]), 50 * kTolerance) << i;
  // A mixed history differs from both once the newer version computes a token over older KV.
  for (size_t i = 3; i < a.size(); ++i) EXPECT_GT(std::fabs(mixed[i] - b[i]), 10 * kTolerance) << i;
}

// A checkpoint folder as the source: loaded whole before anything is replaced; a broken one, or one
// of another architecture, is refused and the old weights keep serving.
TEST(Attribution, CheckpointUpdatesAreTransactions) {
  TempDir tmp;
  std::unique_ptr<Backend> be = make_cpu_backend(true), ref_be = make_cpu_backend();
  std::map<uint64_t, std::unique_ptr<Transformer>> models;
  models[0] = version_model(*ref_be, 0);
  models[5] = version_model(*ref_be, 5);
  // Version 5's weights as a Hugging Face folder.
  const std::string dir = tmp.sub("v5");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(testdata_dir() + "/tiny-llama/config.json", dir + "/config.json");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const HfTensor& t : model_tensor_layout(models[5]->config()).hf)
    if (!(models[5]->config().tie_word_embeddings && t.name == "lm_head.weight"))
      tensors.emplace_back(t.name, models[5]->weights().hf_view(t));
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", tensors, {}).ok());
  // A truncated copy, and a folder of another shape.
  const std::string broken = tmp.sub("broken"), other = tmp.sub("other");
  std::filesystem::create_directories(broken);
  std::filesystem::copy_file(dir + "/config.json", broken + "/config.json");
  {
    std::ifstream in(dir + "/model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(broken + "/model.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  std::filesystem::copy(testdata_dir() + "/tiny-qwen3", other);

  std::shared_ptr<const Transformer> served(version_model(*be, 0).release());
  EngineOptions o;
  o.kv_tokens = 256;
  o.use_graphs = false;
  Result<std::unique_ptr<Engine>> made = Engine::create(served, nullptr, {}, o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  Engine& engine = **made;
  auto score_now = [&](uint64_t expect_version) {
    GenerationRequest r;
    r.prompt = {5, 9, 13, 17};
    r.max_tokens = 4;
    r.logprobs = true;
    r.ignore_eos = true;
    Record rec;
    rec.request = r;
    Result<std::shared_ptr<RequestStream>> s = engine.submit(r);
    ASSERT_TRUE(s.ok());
    rec.stream = *s;
    drain(rec);
    ASSERT_EQ(rec.versions, std::vector<uint64_t>(4, expect_version));
    const std::vector<float> ref = reference_logprobs(models, r.prompt, rec.ids, rec.versions);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(rec.logprobs[i], ref[i], kTolerance) << i;
  };
  score_now(0);
  for (const std::string& bad : {broken, other, tmp.sub("missing")}) {
    Result<WeightUpdateAck> ack = engine.update_weights(WeightSource::checkpoint(bad), 5, WeightUpdateMode::sync);
    EXPECT_FALSE(ack.ok()) << bad;
    if (!ack.ok()) {
      EXPECT_NE(ack.status().message().find("version 0 keeps serving"), std::string::npos) << ack.status().message();
    }
    EXPECT_EQ(engine.policy_version(), 0u);
    score_now(0);  // the old weights, untouched
  }
  Result<WeightUpdateAck> ack = engine.update_weights(WeightSource::checkpoint(dir), 5, WeightUpdateMode::sync);
  ASSERT_TRUE(ack.ok()) << ack.status().message();
  EXPECT_EQ(ack->version, 5u);
  score_now(5);
  EXPECT_FALSE(engine.update_weights(WeightSource::checkpoint(dir), 5, WeightUpdateMode::sync).ok());  // not newer
}

// 10,000 operations over the three modes, each mode on its own and all mixed.
TEST(Attribution, RandomInterleavingsAttributeEveryToken) {
  Tally tally;
  run_interleaving(1, 2500, {WeightUpdateMode::sync}, tally);
  run_interleaving(2, 2500, {WeightUpdateMode::abort}, tally);
  run_interleaving(3, 2500, {WeightUpdateMode::keep}, tally);
  run_interleaving(4, 2500, {WeightUpdateMode::sync, WeightUpdateMode::abort, WeightUpdateMode::keep}, tally);
  EXPECT_GE(tally.operations, 10000);
  EXPECT_GT(tally.updates, 500);
  EXPECT_GT(tally.aborted, 0);
  EXPECT_GT(tally.mixed_requests, 10);  // keep updates landed mid-request
  EXPECT_LT(tally.unchecked_requests * 20, tally.requests);
  EXPECT_GT(tally.preemptions, 0);        // the small pool preempted requests
  EXPECT_GT(tally.prefix_hit_tokens, 0);  // shared prompts were served from the cache
  std::printf("%lld preemptions, %lld prefix-cache hit tokens\n", static_cast<long long>(tally.preemptions),
              static_cast<long long>(tally.prefix_hit_tokens));
  std::printf("attribution: %lld operations, %lld requests, %lld tokens checked, %lld updates (%lld refused), "
              "%lld requests aborted, %lld mixed-version requests (%lld preempted after the update, versions only)\n",
              static_cast<long long>(tally.operations), static_cast<long long>(tally.requests),
              static_cast<long long>(tally.tokens_checked), static_cast<long long>(tally.updates),
              static_cast<long long>(tally.refused), static_cast<long long>(tally.aborted),
              static_cast<long long>(tally.mixed_requests), static_cast<long long>(tally.unchecked_requests));
}

}  // namespace
}  // namespace kiln::test
