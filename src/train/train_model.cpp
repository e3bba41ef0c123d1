#include "train/train_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/ops.h"
#include "kernels/train_ops.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace kiln {
namespace {

// Runs `call` over `batch`; memory running out, thrown by an op's temporary buffer (core/status.h)
// or returned by an allocation, becomes a status naming the batch and what to lower (`advice`).
template <typename T, typename F>
Result<T> naming_batch_on_oom(const char* doing, const DeviceBatch& batch, const char* advice, F&& call) {
  auto oom = [&](const std::string& what) {
    return out_of_memory(what + " " + doing + " " + std::to_string(batch.batch) + " x " +
                         std::to_string(batch.seq_len) + " tokens; " + advice);
  };
  try {
    Result<T> r = call();
    if (!r.ok() && r.status().code() == StatusCode::out_of_memory) return oom(r.status().message());
    return r;
  } catch (const OutOfMemory& e) {
    return oom(e.what());
  }
}

// What to lower when RL scoring or a token loss runs out of memory: their callers choose the
// micro-batches.
constexpr const char* kSmallerMicroBatches = "use smaller micro-batches";

constexpr int32_t kIgnore = -100;

// Rows of logits alive at once in the fused head: about 1 GiB of the compute dtype on CUDA
// (a few thousand rows of a 128K vocabulary), 64 MiB of f32 on the CPU.
int64_t head_chunk_rows(const Backend& be, int64_t vocab, DType dt) {
  const int64_t budget = be.device().is_cuda() ? (int64_t(1) << 30) : (int64_t(64) << 20);
  return std::max<int64_t>(1, budget / (vocab * dtype_size(dt)));
}

std::string layer_name(int64_t i, const char* what) { return "layers." + std::to_string(i) + "." + what; }

}  // namespace

int64_t HostBatch::tokens() const {
  if (segments.empty()) return static_cast<int64_t>(ids.size());
  return std::count_if(segments.begin(), segments.end(), [](int32_t s) { return s >= 0; });
}

int64_t HostBatch::labelled() const {
  return std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t >= 0; });
}

// What the backward of layer l reads besides x[l], for one micro-batch of T = B*S tokens.
struct TrainModel::LayerActivations {
  TensorBuffer n1;       // [T, H]: rmsnorm(x[l]), the attention's input
  TensorBuffer qkv;      // [T, (Hq + 2 Hkv) D]
  TensorBuffer q, k, v;  // [B, Hq | Hkv, S, D] after split, q/k norm and rotary
  TensorBuffer attn;     // [T, Hq D] attention output ([B, S, Hq, D])
  TensorBuffer lse;      // [B, Hq, S] f32
  TensorBuffer x_mid;    // [T, H] f32: the residual stream after the attention sublayer
  TensorBuffer n2;       // [T, H]: rmsnorm(x_mid), the MLP's input
  TensorBuffer gate_up;  // [T, 2I]
  TensorBuffer mlp;      // [T, I] swiglu output
};

// Everything the backward pass reads, for one micro-batch of T = B*S tokens.
struct TrainModel::Activations {
  std::vector<TensorBuffer> x;             // L+1 x [T, H] f32: the residual stream entering layer l (x[L]: final)
  std::vector<LayerActivations> layers;    // L, or 1 shared by all layers (recomputation, scoring)
  TensorBuffer proj;                       // [T, H] scratch: a sublayer's output before the residual add
  TensorBuffer n_final;                    // [T, H]
  TensorBuffer d_final;                    // [T, H] f32: d loss / d n_final
  LayerActivations& layer(int64_t l) { return layers.size() == 1 ? layers[0] : layers[static_cast<size_t>(l)]; }
};

TrainModel::TrainModel(Backend& be, ModelConfig config, ParameterSet params, const TrainModelOptions& options)
    : be_(be), config_(std::move(config)), params_(std::move(params)), options_(options) {}

Status TrainModel::init_rope() {
  KILN_ASSIGN_OR_RETURN(DeviceRope rope, make_device_rope(be_, config_));
  inv_freq_ = std::move(rope.inv_freq);
  rope_attention_scaling_ = rope.attention_scaling;
  return Status::Ok();
}

Result<std::unique_ptr<TrainModel>> TrainModel::load(Backend& be, const std::string& model_dir,
                                                     const TrainModelOptions& options) {
  KILN_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  KILN_RETURN_IF_ERROR(check_checkpoint(model_tensor_layout(config), model_dir));  // before any allocation
  KILN_ASSIGN_OR_RETURN(ParameterSet params,
                        ParameterSet::create(be, config, options.no_decay, /*mixed_precision=*/be.device().is_cuda(),
                                             options.parameter_shards));
  std::unique_ptr<TrainModel> m(new TrainModel(be, std::move(config), std::move(params), options));
  KILN_RETURN_IF_ERROR(m->init_rope());
  KILN_RETURN_IF_ERROR(load_weights(be, m->params_.layout(), m->params_.master_weights(), model_dir));
  m->params_.sync_compute(be);
  KILN_RETURN_IF_ERROR(be.synchronize());
  return m;
}

Result<std::unique_ptr<TrainModel>> TrainModel::random(Backend& be, const ModelConfig& config,
                                                       const TrainModelOptions& options) {
  KILN_ASSIGN_OR_RETURN(ParameterSet params,
                        ParameterSet::create(be, config, options.no_decay, /*mixed_precision=*/be.device().is_cuda(),
                                             options.parameter_shards));
  std::unique_ptr<TrainModel> m(new TrainModel(be, config, std::move(params), options));
  KILN_RETURN_IF_ERROR(m->init_rope());
  randomize_weights(be, m->params_.layout(), m->params_.master_weights(), options.random_seed);
  m->params_.sync_compute(be);
  KILN_RETURN_IF_ERROR(be.synchronize());
  return m;
}

Result<DeviceBatch> TrainModel::upload(const HostBatch& hb) const {
  const int64_t n = static_cast<int64_t>(hb.batch) * hb.seq_len;
  if (hb.batch <= 0 || hb.seq_len <= 0) return invalid_argument("empty training batch");
  if (static_cast<int64_t>(hb.ids.size()) != n || static_cast<int64_t>(hb.positions.size()) != n ||
      static_cast<int64_t>(hb.targets.size()) != n || (!hb.segments.empty() && static_cast<int64_t>(hb.segments.size()) != n))
    return invalid_argument("training batch arrays do not all hold batch x seq_len entries");
  const int64_t V = config_.vocab_size, context = config_.context_length();
  for (int64_t i = 0; i < n; ++i) {
    if (hb.ids[i] < 0 || hb.ids[i] >= V)
      return invalid_argument("token id " + std::to_string(hb.ids[i]) + " is outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    if (hb.targets[i] != kIgnore && (hb.targets[i] < 0 || hb.targets[i] >= V))
      return invalid_argument("label " + std::to_string(hb.targets[i]) + " is outside the vocabulary [0, " +
                              std::to_string(V) + ") and is not -100");
    if (hb.positions[i] < 0 || hb.positions[i] >= context)
      return invalid_argument("position " + std::to_string(hb.positions[i]) + " is outside the model's range [0, " +
                              config_.context_length_source() + " = " + std::to_string(context) + ")");
  }
  auto ints = [&](const std::vector<int32_t>& v) -> Result<TensorBuffer> {
    TensorBuffer h = host_empty(Shape{static_cast<int64_t>(v.size())}, DType::i32);
    std::copy(v.begin(), v.end(), h.ptr<int32_t>());
    return to_device(be_, h);
  };
  DeviceBatch db;
  db.batch = hb.batch;
  db.seq_len = hb.seq_len;
  KILN_ASSIGN_OR_RETURN(db.ids, ints(hb.ids));
  KILN_ASSIGN_OR_RETURN(db.positions, ints(hb.positions));
  if (!hb.segments.empty()) {
    KILN_ASSIGN_OR_RETURN(db.segments, ints(hb.segments));
  }
  std::vector<int32_t> rows, targets;
  for (int64_t i = 0; i < n; ++i) {
    if (hb.targets[i] < 0) continue;
    rows.push_back(static_cast<int32_t>(i));
    targets.push_back(hb.targets[i]);
  }
  db.labelled = static_cast<int64_t>(rows.size());
  if (!rows.empty()) {
    KILN_ASSIGN_OR_RETURN(db.target_rows, ints(rows));
    KILN_ASSIGN_OR_RETURN(db.targets, ints(targets));
  }
  return db;
}

Status TrainModel::forward(const DeviceBatch& batch, Activations& act, bool keep_layers) {
  const ModelConfig& c = config_;
  const int64_t B = batch.batch, S = batch.seq_len, T = B * S;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, L = c.num_hidden_layers;
  const DType dt = params_.compute_dtype();
  const float eps = c.rms_norm_eps;
  const ParameterSet& P = params_;

  act.x.resize(L + 1);
  for (TensorBuffer& x : act.x) {
    KILN_ASSIGN_OR_RETURN(x, empty(be_, {T, H}, DType::f32));
  }
  act.layers.resize(keep_layers ? L : 1);
  for (LayerActivations& a : act.layers) {
    KILN_ASSIGN_OR_RETURN(a.n1, empty(be_, {T, H}, dt));
    KILN_ASSIGN_OR_RETURN(a.qkv, empty(be_, {T, (Hq + 2 * Hkv) * D}, dt));
    KILN_ASSIGN_OR_RETURN(a.q, empty(be_, {B, Hq, S, D}, dt));
    KILN_ASSIGN_OR_RETURN(a.k, empty(be_, {B, Hkv, S, D}, dt));
    KILN_ASSIGN_OR_RETURN(a.v, empty(be_, {B, Hkv, S, D}, dt));
    KILN_ASSIGN_OR_RETURN(a.attn, empty(be_, {T, Hq * D}, dt));
    KILN_ASSIGN_OR_RETURN(a.lse, empty(be_, {B, Hq, S}, DType::f32));
    KILN_ASSIGN_OR_RETURN(a.x_mid, empty(be_, {T, H}, DType::f32));
    KILN_ASSIGN_OR_RETURN(a.n2, empty(be_, {T, H}, dt));
    KILN_ASSIGN_OR_RETURN(a.gate_up, empty(be_, {T, 2 * I}, dt));
    KILN_ASSIGN_OR_RETURN(a.mlp, empty(be_, {T, I}, dt));
  }
  KILN_ASSIGN_OR_RETURN(act.n_final, empty(be_, {T, H}, dt));
  KILN_ASSIGN_OR_RETURN(act.proj, empty(be_, {T, H}, dt));

  ops::embedding_forward(be_, act.x[0], P.weight("embed_tokens"), batch.ids);
  ops::rmsnorm_forward(be_, act.layer(0).n1, act.x[0], P.weight(layer_name(0, "input_norm")), eps);
  for (int64_t l = 0; l < L; ++l) {
    // Each layer's output is normed for the next layer (or the head) in the same pass. With a shared
    // workspace the next layer's n1 overwrites this layer's, which its q/k/v projection has read.
    const bool last = l + 1 == L;
    const Tensor n_next = last ? act.n_final.view() : act.layer(l + 1).n1.view();
    layer_forward(l, batch, act.layer(l), act.x[l], act.proj, act.x[l + 1], n_next,
                  last ? P.weight("final_norm") : P.weight(layer_name(l + 1, "input_norm")));
  }
  return Status::Ok();
}

void TrainModel::layer_forward(int64_t l, const DeviceBatch& batch, LayerActivations& a, Tensor x_in, Tensor proj,
                               Tensor x_out, Tensor n_next, Tensor next_norm) {
  const ModelConfig& c = config_;
  const int64_t B = batch.batch, S = batch.seq_len, Hq = c.num_attention_heads, D = c.head_dim;
  const float eps = c.rms_norm_eps, scale = 1.0f / std::sqrt(static_cast<float>(D));
  const Tensor segments = batch.segments.allocated() ? batch.segments.view().view({B, S}) : Tensor{};
  auto w = [&](const char* what) { return params_.weight_or_empty(layer_name(l, what)); };
  ops::linear_forward(be_, a.qkv, a.n1, w("qkv_proj"), w("qkv_bias"));
  ops::qkv_split_rope_forward(be_, a.q, a.k, a.v, a.qkv, batch.positions, inv_freq_, rope_attention_scaling_,
                              w("q_norm"), w("k_norm"), eps);
  ops::attention_train_forward(be_, a.attn.view().view({B, S, Hq, D}), a.lse, a.q, a.k, a.v, segments,
                               /*causal=*/true, scale);
  ops::linear_forward(be_, proj, a.attn, w("o_proj"), w("o_bias"));
  ops::add_rmsnorm_forward(be_, a.n2, a.x_mid, proj, w("post_norm"), eps, /*residual_in=*/x_in);
  ops::linear_forward(be_, a.gate_up, a.n2, w("gate_up_proj"), w("gate_up_bias"));
  ops::swiglu_forward(be_, a.mlp, a.gate_up);
  if (x_out.data == nullptr) return;  // recomputation: the backward reads nothing past the MLP activation
  ops::linear_forward(be_, proj, a.mlp, w("down_proj"), w("down_bias"));
  ops::add_rmsnorm_forward(be_, n_next, x_out, proj, next_norm, eps, /*residual_in=*/a.x_mid);
}

Result<double> TrainModel::head_loss(const DeviceBatch& batch, Activations& act, const HeadPass& pass,
                                     TokenScores* scores) {
  const int64_t T = static_cast<int64_t>(batch.batch) * batch.seq_len, H = config_.hidden_size;
  const int64_t V = config_.vocab_size, R = batch.labelled;
  const DType dt = params_.compute_dtype();
  const std::string head = config_.tie_word_embeddings ? "embed_tokens" : "lm_head";
  const Tensor W = params_.weight(head);  // [V, H]
  if (pass.backward) {
    KILN_ASSIGN_OR_RETURN(act.d_final, empty(be_, {T, H}, DType::f32));
    be_.zero(act.d_final);
  }
  if (scores) *scores = TokenScores{};
  if (R == 0) return 0.0;
  KILN_ASSIGN_OR_RETURN(TensorBuffer gathered, empty(be_, {R, H}, dt));
  ops::embedding_forward(be_, gathered, act.n_final, batch.target_rows);  // row gather
  KILN_ASSIGN_OR_RETURN(TensorBuffer losses, empty(be_, {R}, DType::f32));
  KILN_ASSIGN_OR_RETURN(TensorBuffer logprobs, empty(be_, {R}, DType::f32));
  TensorBuffer entropies, d_gathered;
  if (pass.entropies) {
    KILN_ASSIGN_OR_RETURN(entropies, empty(be_, {R}, DType::f32));
  }
  if (pass.backward) {
    KILN_ASSIGN_OR_RETURN(d_gathered, empty(be_, {R, H}, DType::f32));
  }
  const int64_t chunk = std::min(R, head_chunk_rows(be_, V, dt));
  KILN_ASSIGN_OR_RETURN(TensorBuffer logits_buf, empty(be_, {chunk, V}, dt));
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t r1 = std::min(R, r0 + chunk);
    const Tensor logits = logits_buf.view().rows(0, r1 - r0);
    const Tensor rows = gathered.view().rows(r0, r1);
    ops::linear_forward(be_, logits, rows, W);
    ops::CrossEntropyOptions ce;
    ce.label_smoothing = pass.label_smoothing;
    ce.grad_scale = pass.grad_scale;
    ce.write_grad = pass.backward;
    ce.logit_scale = pass.logit_scale;
    if (pass.row_scales.data) ce.row_scales = pass.row_scales.rows(r0, r1);
    if (pass.entropies) ce.entropies = entropies.view().rows(r0, r1);
    ops::cross_entropy_forward_backward(be_, logits, losses.view().rows(r0, r1), logprobs.view().rows(r0, r1),
                                        batch.targets.view().rows(r0, r1), ce);
    if (pass.backward) {
      ops::gemm(be_, d_gathered.view().rows(r0, r1), logits, false, W, false, 1.0f, 0.0f);  // [r, V] @ [V, H]
      ops::gemm(be_, params_.grad(head), logits, true, rows, false, 1.0f, 1.0f);         // += [r, V]^T @ [r, H]
    }
  }
  if (pass.backward) ops::embedding_backward(be_, act.d_final, d_gathered, batch.target_rows);  // row scatter
  TensorBuffer host_losses = to_host(be_, losses);
  double sum = 0.0;
  for (int64_t r = 0; r < R; ++r) sum += host_losses.ptr<float>()[r];
  if (scores) {
    TensorBuffer host_lp = to_host(be_, logprobs);
    scores->logprobs.assign(host_lp.ptr<float>(), host_lp.ptr<float>() + R);
    if (pass.entropies) {
      TensorBuffer host_h = to_host(be_, entropies);
      scores->entropies.assign(host_h.ptr<float>(), host_h.ptr<float>() + R);
    }
  }
  return sum;
}

Status TrainModel::backward(const DeviceBatch& batch, Activations& act) {
  const ModelConfig& c = config_;
  const int64_t B = batch.batch, S = batch.seq_len, T = B * S;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, L = c.num_hidden_layers;
  const DType dt = params_.compute_dtype();
  const float eps = c.rms_norm_eps, scale = 1.0f / std::sqrt(static_cast<float>(D));
  const ParameterSet& P = params_;
  // d loss / d residual stream, and its copy in the compute dtype for the GEMMs (aliased on the CPU).
  KILN_ASSIGN_OR_RETURN(TensorBuffer d_res, empty(be_, {T, H}, DType::f32));
  TensorBuffer d_res_c;
  if (dt != DType::f32) {
    KILN_ASSIGN_OR_RETURN(d_res_c, empty(be_, {T, H}, dt));
  }
  const Tensor dy = dt == DType::f32 ? d_res.view() : d_res_c.view();
  KILN_ASSIGN_OR_RETURN(TensorBuffer d_normed, empty(be_, {T, H}, DType::f32));
  KILN_ASSIGN_OR_RETURN(TensorBuffer d_mlp, empty(be_, {T, I}, dt));
  KILN_ASSIGN_OR_RETURN(TensorBuffer d_gate_up, empty(be_, {T, 2 * I}, dt));
  KILN_ASSIGN_OR_RETURN(TensorBuffer d_attn, empty(be_, {T, Hq * D}, dt));
  KILN_ASSIGN_OR_RETURN(TensorBuffer dq, empty(be_, {B, Hq, S, D}, dt));
  KILN_ASSIGN_OR_RETURN(TensorBuffer dk, empty(be_, {B, Hkv, S, D}, dt));
  KILN_ASSIGN_OR_RETURN(TensorBuffer dv, empty(be_, {B, Hkv, S, D}, dt));
  KILN_ASSIGN_OR_RETURN(TensorBuffer d_qkv, empty(be_, {T, (Hq + 2 * Hkv) * D}, dt));

  const Tensor segments = batch.segments.allocated() ? batch.segments.view().view({B, S}) : Tensor{};
  // Every rmsnorm backward also writes the compute-dtype copy of d_res the next GEMMs read.
  ops::rmsnorm_backward(be_, d_res, P.grad("final_norm"), act.d_final, act.x[L], P.weight("final_norm"), eps,
                        /*accumulate_dx=*/false, d_res_c);
  const bool shared = act.layers.size() == 1;  // recomputation: one workspace, holding layer L-1
  for (int64_t l = L - 1; l >= 0; --l) {
    auto w = [&](const char* what) { return P.weight_or_empty(layer_name(l, what)); };
    auto g = [&](const char* what) { return P.grad_or_empty(layer_name(l, what)); };
    LayerActivations& a = act.layer(l);
    if (shared && l + 1 < L) {
      // Layer l's activations again, from its saved input. rmsnorm_forward of the stored x[l] gives
      // the bits of the forward's fused add_rmsnorm (both normalise the stored sum by the same code),
      // and the layer's ops see the same inputs, so everything below matches the kept activations.
      ops::rmsnorm_forward(be_, a.n1, act.x[l], w("input_norm"), eps);
      layer_forward(l, batch, a, act.x[l], act.proj, Tensor{}, Tensor{}, Tensor{});
    }
    // MLP: x'' = x' + down(swiglu(gate_up(n2)))
    ops::gemm(be_, g("down_proj"), dy, true, a.mlp, false, 1.0f, 1.0f);  // [H, I] += dy^T m
    if (c.mlp_bias) ops::bias_backward(be_, g("down_bias"), dy);
    ops::gemm(be_, d_mlp, dy, false, w("down_proj"), false, 1.0f, 0.0f);  // [T, I] = dy Wd
    ops::swiglu_backward(be_, d_gate_up, d_mlp, a.gate_up);
    ops::gemm(be_, g("gate_up_proj"), d_gate_up, true, a.n2, false, 1.0f, 1.0f);  // [2I, H] += dgu^T n2
    if (c.mlp_bias) ops::bias_backward(be_, g("gate_up_bias"), d_gate_up);
    ops::gemm(be_, d_normed, d_gate_up, false, w("gate_up_proj"), false, 1.0f, 0.0f);  // [T, H] = dgu Wgu
    ops::rmsnorm_backward(be_, d_res, g("post_norm"), d_normed, a.x_mid, w("post_norm"), eps, true, d_res_c);
    // Attention: x' = x + o(attention(rope(split(qkv(n1)))))
    ops::gemm(be_, g("o_proj"), dy, true, a.attn, false, 1.0f, 1.0f);  // [H, Hq D] += dy^T a
    if (c.o_proj_bias) ops::bias_backward(be_, g("o_bias"), dy);
    ops::gemm(be_, d_attn, dy, false, w("o_proj"), false, 1.0f, 0.0f);  // [T, Hq D] = dy Wo
    ops::attention_train_backward(be_, dq, dk, dv, d_attn.view().view({B, S, Hq, D}), a.q, a.k, a.v,
                                  a.attn.view().view({B, S, Hq, D}), a.lse, segments, /*causal=*/true, scale);
    ops::qkv_split_rope_backward(be_, d_qkv, g("q_norm"), g("k_norm"), dq, dk, dv, a.qkv, batch.positions, inv_freq_,
                                 rope_attention_scaling_, w("q_norm"), w("k_norm"), eps);
    if (c.attention_bias) ops::bias_backward(be_, g("qkv_bias"), d_qkv);
    ops::gemm(be_, g("qkv_proj"), d_qkv, true, a.n1, false, 1.0f, 1.0f);  // [QKV, H] += dqkv^T n1
    ops::gemm(be_, d_normed, d_qkv, false, w("qkv_proj"), false, 1.0f, 0.0f);  // [T, H] = dqkv Wqkv
    ops::rmsnorm_backward(be_, d_res, g("input_norm"), d_normed, act.x[l], w("input_norm"), eps, true, d_res_c);
    if (!shared) act.layers[static_cast<size_t>(l)] = LayerActivations{};  // released as the backward passes
    if (layer_hook_) KILN_RETURN_IF_ERROR(layer_hook_(l));
  }
  ops::embedding_backward(be_, P.grad("embed_tokens"), d_res, batch.ids);
  return Status::Ok();
}

Result<double> TrainModel::forward_backward(const DeviceBatch& batch, float grad_scale) {
  return naming_batch_on_oom<double>("in a training step of", batch,
                                     "lower --batch-size (raising --grad-accum keeps the step's examples) or the "
                                     "sequence length",
                                     [&] { return forward_backward_unchecked(batch, grad_scale); });
}

Result<double> TrainModel::forward_backward_unchecked(const DeviceBatch& batch, float grad_scale) {
  using Clock = std::chrono::steady_clock;
  auto mark = [&](Clock::time_point* t) -> Status {
    if (profile_phases_) KILN_RETURN_IF_ERROR(be_.synchronize());
    *t = Clock::now();
    return Status::Ok();
  };
  auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  Clock::time_point t0, t1, t2, t3;
  KILN_RETURN_IF_ERROR(mark(&t0));
  Activations act;
  KILN_RETURN_IF_ERROR(forward(batch, act, /*keep_layers=*/!options_.recompute));
  KILN_RETURN_IF_ERROR(mark(&t1));
  HeadPass pass;
  pass.grad_scale = grad_scale;
  pass.backward = true;
  pass.label_smoothing = options_.label_smoothing;
  KILN_ASSIGN_OR_RETURN(double loss_sum, head_loss(batch, act, pass, nullptr));
  KILN_RETURN_IF_ERROR(mark(&t2));
  KILN_RETURN_IF_ERROR(backward(batch, act));
  KILN_RETURN_IF_ERROR(be_.synchronize());
  t3 = Clock::now();
  phase_times_ = {ms(t0, t1), ms(t1, t2), ms(t2, t3)};
  return loss_sum;
}

Result<std::vector<float>> TrainModel::target_logprobs(const DeviceBatch& batch) {
  KILN_ASSIGN_OR_RETURN(TokenScores scores, target_scores(batch, TokenScoreOptions{}));
  return std::move(scores.logprobs);
}

Result<TokenScores> TrainModel::target_scores(const DeviceBatch& batch, const TokenScoreOptions& options) {
  return naming_batch_on_oom<TokenScores>("scoring", batch, kSmallerMicroBatches, [&]() -> Result<TokenScores> {
    Activations act;
    KILN_RETURN_IF_ERROR(forward(batch, act, /*keep_layers=*/false));  // nothing is read back
    HeadPass pass;
    pass.logit_scale = options.logit_scale;
    pass.entropies = options.entropies;
    TokenScores scores;
    KILN_ASSIGN_OR_RETURN(double unused, head_loss(batch, act, pass, &scores));
    (void)unused;
    return scores;
  });
}

Result<double> TrainModel::forward_backward_token_loss(const DeviceBatch& batch, const TokenLoss& loss,
                                                       const TokenScoreOptions& options, TokenScores* scores) {
  return naming_batch_on_oom<double>("in a training step of", batch, kSmallerMicroBatches, [&] {
    return forward_backward_token_loss_unchecked(batch, loss, options, scores);
  });
}

Result<double> TrainModel::forward_backward_token_loss_unchecked(const DeviceBatch& batch, const TokenLoss& loss,
                                                                 const TokenScoreOptions& options,
                                                                 TokenScores* scores_out) {
  Activations act;
  KILN_RETURN_IF_ERROR(forward(batch, act, /*keep_layers=*/!options_.recompute));
  HeadPass score;
  score.logit_scale = options.logit_scale;
  score.entropies = options.entropies;
  TokenScores scores;
  KILN_ASSIGN_OR_RETURN(double unused, head_loss(batch, act, score, &scores));
  (void)unused;
  KILN_ASSIGN_OR_RETURN(TokenLossValue value, loss(scores.logprobs, scores.entropies));
  if (static_cast<int64_t>(value.dloss_dlogprob.size()) != batch.labelled)
    return invalid_argument("a token loss returned " + std::to_string(value.dloss_dlogprob.size()) +
                            " derivatives for " + std::to_string(batch.labelled) + " labelled tokens");
  // The cross-entropy op's gradient is d(-logprob)/d logits: scale row r by -d loss / d logprob_r.
  TensorBuffer host_scales = host_empty({std::max<int64_t>(batch.labelled, 1)}, DType::f32);
  for (int64_t r = 0; r < batch.labelled; ++r) host_scales.ptr<float>()[r] = -value.dloss_dlogprob[r];
  HeadPass grad = score;
  grad.backward = true;
  grad.entropies = false;
  TensorBuffer scales;
  if (batch.labelled > 0) {
    KILN_ASSIGN_OR_RETURN(scales, to_device(be_, host_scales.view().rows(0, batch.labelled)));
    grad.row_scales = scales;
  }
  KILN_ASSIGN_OR_RETURN(double unused2, head_loss(batch, act, grad, nullptr));
  (void)unused2;
  KILN_RETURN_IF_ERROR(backward(batch, act));
  KILN_RETURN_IF_ERROR(be_.synchronize());
  if (scores_out) *scores_out = std::move(scores);
  return value.loss;
}

}  // namespace kiln
