#include "golden.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "infer/engine.h"
#include "infer/executor.h"
#include "infer/scheduler.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "test_util.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/train_model.h"

namespace kiln::test {
namespace {

TensorInfo golden_tensor(const SafetensorsFile& f, const std::string& name) {
  Result<TensorInfo> t = f.find(name);
  KILN_ASSERT(t.ok());
  return *t;
}

SafetensorsFile open_golden(const std::string& model) {
  const std::string file = model.ends_with(".safetensors") ? model : model + "/golden.safetensors";
  Result<SafetensorsFile> f = SafetensorsFile::open(testdata_dir() + "/" + file);
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", f.status().message().c_str());
    std::abort();
  }
  return std::move(f).value();
}

std::vector<float> row_slice(const std::vector<float>& m, int64_t row, int64_t width) {
  return std::vector<float>(m.begin() + row * width, m.begin() + (row + 1) * width);
}

}  // namespace

std::vector<float> full_forward_logits(const Transformer& m, const std::vector<int32_t>& ids) {
  Backend& be = m.backend();
  const int32_t n = static_cast<int32_t>(ids.size());
  Result<KVCache> cache = m.make_kv_cache(n);
  Result<ForwardWorkspace> ws = m.make_workspace(n, n);
  KILN_ASSERT(cache.ok() && ws.ok());
  std::vector<int32_t> positions(n), rows(n);
  for (int32_t i = 0; i < n; ++i) positions[i] = rows[i] = i;
  auto dev = [&](const std::vector<int32_t>& v) {
    Result<TensorBuffer> t = to_device(be, host_ints(v));
    KILN_ASSERT(t.ok());
    return std::move(t).value();
  };
  TensorBuffer d_ids = dev(ids), d_pos = dev(positions), d_rows = dev(rows), d_q = dev({0, n});
  TensorBuffer d_page_indptr = dev({0, 1}), d_pages = dev({0}), d_last = dev({n});  // one page of n slots
  ForwardBatch b;
  b.ids = d_ids;
  b.positions = d_pos;
  b.slots = d_pos;
  b.q_indptr = d_q;
  b.kv = PagedKV{d_page_indptr, d_pages, d_last, n};
  b.logit_rows = d_rows;
  b.bounds = {1, n, n};
  Tensor logits = m.forward(b, *cache, *ws);
  return to_f32(be, logits);
}


std::vector<float> golden_floats(const std::string& model, const std::string& name) {
  SafetensorsFile f = open_golden(model);
  TensorInfo t = golden_tensor(f, name);
  KILN_ASSERT(t.dtype == DType::f32);
  std::vector<float> v(static_cast<size_t>(t.shape.numel()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  return v;
}

std::vector<int32_t> golden_ints(const std::string& model, const std::string& name) {
  SafetensorsFile f = open_golden(model);
  TensorInfo t = golden_tensor(f, name);
  std::vector<int32_t> v(static_cast<size_t>(t.shape.numel()));
  if (t.dtype == DType::i32) {
    std::memcpy(v.data(), t.data, v.size() * sizeof(int32_t));
  } else {
    KILN_ASSERT(t.dtype == DType::i64);
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t x;
      std::memcpy(&x, static_cast<const char*>(t.data) + 8 * i, 8);
      v[i] = static_cast<int32_t>(x);
    }
  }
  return v;
}

void check_golden_model(Backend& be, const std::string& model, double tol, GreedyCheck greedy) {
  Result<std::unique_ptr<Transformer>> m = Transformer::load(be, testdata_dir() + "/" + model);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const int64_t vocab = (*m)->config().vocab_size;

  // 1) one forward over each sequence: every position's logits
  for (const char* seq : {"seq_a", "seq_b"}) {
    std::vector<int32_t> ids = golden_ints(model, std::string(seq) + ".input_ids");
    std::vector<float> ref = golden_floats(model, std::string(seq) + ".logits");
    std::vector<float> got = full_forward_logits(**m, ids);
    double err = rel_error(got, ref);
    EXPECT_LE(err, tol) << model << " " << seq << " logits";
  }

  // 2) one full forward over seq_b + the reference's greedy tokens
  std::vector<int32_t> prompt = golden_ints(model, "seq_b.input_ids");
  std::vector<int32_t> expected = golden_ints(model, "greedy.new_tokens");
  std::vector<float> full = golden_floats(model, "greedy.full_logits");
  std::vector<int32_t> extended = prompt;
  extended.insert(extended.end(), expected.begin(), expected.end());
  EXPECT_LE(rel_error(full_forward_logits(**m, extended), full), tol) << model << " full forward of seq_b + greedy";

  // 3) greedy generation from seq_b; every incremental step's logits against the full forward's
  //    (for as long as the generated prefix equals the reference's)
  int64_t compare_steps = static_cast<int64_t>(expected.size());
  if (greedy == GreedyCheck::until_near_tie) {
    for (int64_t j = 0; j < compare_steps; ++j) {
      std::vector<float> row = row_slice(full, static_cast<int64_t>(prompt.size()) - 1 + j, vocab);
      std::vector<float> sorted = row;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      float scale = 0;
      for (float x : row) scale = std::max(scale, std::fabs(x));
      if (sorted[0] - sorted[1] < 0.01f * scale) compare_steps = j + 1;  // step j's logits still compare
    }
  }
  // Greedy decoding through the engine, with the top log-probabilities of every step compared with
  // the log-softmax of the reference's logits for the same tokens.
  std::shared_ptr<const Transformer> shared(m->get(), [](const Transformer*) {});  // *m outlives the engine
  EngineOptions eo;
  eo.kv_tokens = 4 * static_cast<int64_t>(prompt.size() + expected.size());
  eo.page_size = 8;
  eo.max_running = 4;
  eo.max_step_tokens = 64;
  Result<std::unique_ptr<Engine>> engine = Engine::create(shared, nullptr, {}, eo);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  GenerationRequest request;
  request.prompt = prompt;
  request.max_tokens = static_cast<int32_t>(expected.size());
  request.ignore_eos = true;
  request.top_logprobs = static_cast<int32_t>(std::min<int64_t>(20, vocab));
  Result<std::shared_ptr<RequestStream>> stream = (*engine)->submit(request);
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  std::vector<int32_t> tokens;
  int64_t step = 0;
  double worst = 0;
  while (std::optional<EngineEvent> e = (*stream)->next()) {
    for (const GeneratedToken& t : e->tokens) {
      tokens.push_back(t.id);
      if (step < compare_steps) {
        const std::vector<float> row = row_slice(full, static_cast<int64_t>(prompt.size()) - 1 + step, vocab);
        double mx = -INFINITY, z = 0;
        for (float x : row) mx = std::max<double>(mx, x);
        for (float x : row) z += std::exp(x - mx);
        std::vector<float> got, want;
        for (const auto& [id, lp] : t.top) {
          got.push_back(lp);
          want.push_back(static_cast<float>(row[id] - mx - std::log(z)));
        }
        worst = std::max(worst, rel_error(got, want));
      }
      ++step;
    }
  }
  EXPECT_EQ(step, static_cast<int64_t>(expected.size()));
  const int64_t token_steps = greedy == GreedyCheck::exact ? static_cast<int64_t>(expected.size()) : compare_steps - 1;
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.begin() + std::min<int64_t>(token_steps, tokens.size())),
            std::vector<int32_t>(expected.begin(), expected.begin() + token_steps))
      << model << " greedy tokens (first " << token_steps << ")";
  EXPECT_LE(worst, tol) << model << " engine decode log-probabilities vs the reference";
}

namespace {

bool golden_has(const std::string& file, const std::string& name) {
  return open_golden(file).find(name).ok();
}

}  // namespace

void check_training_golden(Backend& be, const std::string& model, const std::string& golden, const std::string& prefix,
                           const TrainingTolerances& tol) {
  TrainModelOptions options;
  options.no_decay = "";  // torch.optim.AdamW(model.parameters()) decays everything
  if (golden_has(golden, prefix + ".label_smoothing"))
    options.label_smoothing = golden_floats(golden, prefix + ".label_smoothing")[0];
  Result<std::unique_ptr<TrainModel>> loaded = TrainModel::load(be, testdata_dir() + "/" + model, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  TrainModel& m = **loaded;

  // The batch: rows of input_ids / labels (/ position_ids), as the JSONL reader would give them.
  const std::vector<int32_t> ids = golden_ints(golden, prefix + ".input_ids");
  const std::vector<int32_t> labels = golden_ints(golden, prefix + ".labels");
  std::vector<int32_t> positions;
  if (golden_has(golden, prefix + ".position_ids")) positions = golden_ints(golden, prefix + ".position_ids");
  Result<SafetensorsFile> f = SafetensorsFile::open(testdata_dir() + "/" + golden);
  ASSERT_TRUE(f.ok());
  const Shape id_shape = f->find(prefix + ".input_ids")->shape;
  const int64_t rows = id_shape.ndim == 2 ? id_shape[0] : 1, n = id_shape.numel() / rows;
  std::vector<TrainExample> examples(rows);
  std::vector<int32_t> lengths(rows, static_cast<int32_t>(n));  // rows of a ragged batch are shorter
  if (golden_has(golden, prefix + ".lengths")) lengths = golden_ints(golden, prefix + ".lengths");
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t begin = r * n, end = r * n + lengths[r];
    examples[r].input_ids.assign(ids.begin() + begin, ids.begin() + end);
    examples[r].labels.assign(labels.begin() + begin, labels.begin() + end);
    if (!positions.empty()) examples[r].position_ids.assign(positions.begin() + begin, positions.begin() + end);
  }
  std::vector<const TrainExample*> row_ptrs;
  for (const TrainExample& e : examples) row_ptrs.push_back(&e);
  const HostBatch hb = make_host_batch(row_ptrs);
  Result<DeviceBatch> db = m.upload(hb);
  ASSERT_TRUE(db.ok()) << db.status().message();
  const double labelled = static_cast<double>(hb.labelled());

  Result<double> loss_sum = m.forward_backward(*db, static_cast<float>(1.0 / labelled));
  ASSERT_TRUE(loss_sum.ok()) << loss_sum.status().message();
  const std::vector<float> ref_loss = golden_floats(golden, prefix + ".loss");
  EXPECT_LE(rel_error({static_cast<float>(*loss_sum / labelled)}, ref_loss), tol.loss)
      << golden << ": loss " << *loss_sum / labelled << " vs " << ref_loss[0];

  const ParameterSet& P = m.params();
  // Gradients are grad.<name>, or grad.<prefix>.<name> where one file holds several cases.
  const std::string grad_key =
      golden_has(golden, "grad." + prefix + ".model.norm.weight") ? "grad." + prefix + "." : "grad.";
  for (const HfTensor& t : P.layout().hf) {
    const std::vector<float> got = to_f32(be, P.hf_view(P.grads(), t));
    const double err = rel_error(got, golden_floats(golden, grad_key + t.name));
    EXPECT_LE(err, tol.grads) << golden << ": gradient of " << t.name;
  }
  // Every reference gradient was compared: the reference has no parameter kiln does not lay out.
  int reference_grads = 0;
  for (const std::string& name : f->names())
    if (name.starts_with(grad_key + "model.") || name.starts_with(grad_key + "lm_head.")) ++reference_grads;
  EXPECT_EQ(reference_grads, static_cast<int>(P.layout().hf.size())) << golden;
  if (!golden_has(golden, "adamw_step1.model.norm.weight")) return;

  // The optimizer step starts from the reference's gradients. Its first step moves each element by
  // about lr * g / (|g| + eps), so elements whose true gradient is ~1e-8 (e.g. k-projection biases
  // in rotary dimensions that barely turn over 16 positions) are f32 rounding noise in both
  // implementations, yet decide a full +-lr move; the gradients themselves were checked above.
  for (const HfTensor& t : P.layout().hf) {
    const std::vector<float> ref = golden_floats(golden, grad_key + t.name);
    TensorBuffer host = host_empty(Shape{static_cast<int64_t>(ref.size())}, DType::f32);
    std::copy(ref.begin(), ref.end(), host.ptr<float>());
    be.copy(P.hf_view(P.grads(), t).view(host.shape()), host);
  }
  OptimizerOptions opt;
  opt.lr = 1e-2f;
  opt.beta1 = 0.9f;
  opt.beta2 = 0.95f;
  opt.eps = 1e-8f;
  opt.weight_decay = 0.1f;
  Result<Optimizer> optimizer = Optimizer::create(be, m.params(), opt);
  ASSERT_TRUE(optimizer.ok());
  Result<OptimizerStepInfo> info = optimizer->step(opt.lr);
  ASSERT_TRUE(info.ok()) << info.status().message();
  for (const HfTensor& t : P.layout().hf) {
    const std::vector<float> got = to_f32(be, P.hf_view(P.master(), t));
    EXPECT_LE(rel_error(got, golden_floats(golden, "adamw_step1." + t.name)), tol.params)
        << golden << ": " << t.name << " after one AdamW step";
  }
  // The loss after the step (forward only, through the same fused head).
  Result<std::vector<float>> logprobs = m.target_logprobs(*db);
  ASSERT_TRUE(logprobs.ok());
  double nll = 0.0;
  for (float lp : *logprobs) nll -= lp;
  const std::vector<float> ref_after = golden_floats(golden, "train.loss_after_step1");
  EXPECT_LE(rel_error({static_cast<float>(nll / labelled)}, ref_after), tol.loss)
      << golden << ": loss after the AdamW step " << nll / labelled << " vs " << ref_after[0];
}

double check_teacher_forced_decode(Backend& be, const std::string& model, double tol, bool use_graphs) {
  Result<std::unique_ptr<Transformer>> m = Transformer::load(be, testdata_dir() + "/" + model);
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return INFINITY;
  const int64_t vocab = (*m)->config().vocab_size;
  const std::vector<int32_t> prompt = golden_ints(model, "seq_b.input_ids");
  const std::vector<int32_t> forced = golden_ints(model, "greedy.new_tokens");
  const std::vector<float> full = golden_floats(model, "greedy.full_logits");
  ExecutorConfig ec;
  ec.page_size = 8;
  ec.num_pages = static_cast<int32_t>((prompt.size() + forced.size()) / 8 + 4);
  ec.max_running = 1;
  ec.max_step_tokens = static_cast<int32_t>(prompt.size());
  ec.max_seq_len = static_cast<int32_t>(prompt.size() + forced.size() + 8);
  ec.use_graphs = use_graphs;
  Result<std::unique_ptr<Executor>> ex = Executor::create(**m, ec);
  EXPECT_TRUE(ex.ok()) << ex.status().message();
  if (!ex.ok()) return INFINITY;
  SchedulerConfig sc;
  sc.num_pages = ec.num_pages;
  sc.page_size = ec.page_size;
  sc.max_running = ec.max_running;
  sc.max_step_tokens = ec.max_step_tokens;
  Scheduler sched(sc);
  sched.add(1, prompt);
  double worst = 0;
  for (size_t j = 0; j < forced.size(); ++j) {
    StepPlan plan = sched.schedule();
    EXPECT_EQ(plan.entries.size(), 1u);
    if (plan.entries.size() != 1) return INFINITY;
    ops::SamplingRow row;  // greedy; the sampled token is discarded
    row.position = plan.entries[0].start + plan.entries[0].count;
    Result<std::vector<SampledToken>> out = (*ex)->run(plan, {row});
    EXPECT_TRUE(out.ok()) << out.status().message();
    if (!out.ok()) return INFINITY;
    const std::vector<float> got = row_slice(to_f32(be, (*ex)->last_logits()), 0, vocab);
    const std::vector<float> want = row_slice(full, static_cast<int64_t>(prompt.size() + j) - 1, vocab);
    const double err = rel_error(got, want);
    EXPECT_LE(err, tol) << model << ": logits of decode step " << j << " (teacher-forced)";
    worst = std::max(worst, err);
    sched.commit(plan);
    sched.append(plan.entries[0].seq, forced[j]);
  }
  if (use_graphs && forced.size() > 2) {
    EXPECT_GT((*ex)->graph_replays(), 0) << model;
  }
  return worst;
}

}  // namespace kiln::test
