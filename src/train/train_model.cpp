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

// Everything the backward pass reads, for one micro-batch of T = B*S tokens.
struct TrainModel::Activations {
  std::vector<TensorBuffer> x;       // L+1 x [T, H] f32: the residual stream entering layer l (x[L]: final)
  std::vector<TensorBuffer> x_mid;   // L x [T, H] f32: after the attention sublayer
  std::vector<TensorBuffer> n1, n2;  // L x [T, H]: the normed inputs of attention and MLP
  std::vector<TensorBuffer> qkv;     // L x [T, (Hq + 2 Hkv) D]
  std::vector<TensorBuffer> q, k, v; // L x [B, H, S, D]
  std::vector<TensorBuffer> attn;    // L x [T, Hq D] (attention output, [B, S, Hq, D])
  std::vector<TensorBuffer> lse;     // L x [B, Hq, S] f32
  std::vector<TensorBuffer> gate_up; // L x [T, 2I]
  std::vector<TensorBuffer> mlp;     // L x [T, I] swiglu output
  TensorBuffer n_final;              // [T, H]
  TensorBuffer d_final;              // [T, H] f32: d loss / d n_final
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
                        ParameterSet::create(be, config, options.no_decay, /*mixed_precision=*/be.device().is_cuda()));
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
                        ParameterSet::create(be, config, options.no_decay, /*mixed_precision=*/be.device().is_cuda()));
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
  const int64_t V = config_.vocab_size;
  for (int64_t i = 0; i < n; ++i) {
    if (hb.ids[i] < 0 || hb.ids[i] >= V)
      return invalid_argument("token id " + std::to_string(hb.ids[i]) + " is outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    if (hb.targets[i] != kIgnore && (hb.targets[i] < 0 || hb.targets[i] >= V))
      return invalid_argument("label " + std::to_string(hb.targets[i]) + " is outside the vocabulary [0, " +
                              std::to_string(V) + ") and is not -100");
    if (hb.positions[i] < 0 || hb.positions[i] >= config_.max_position_embeddings)
      return invalid_argument("position " + std::to_string(hb.positions[i]) +
                              " is outside the model's range [0, max_position_embeddings = " +
                              std::to_string(config_.max_position_embeddings) + ")");
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

Status TrainModel::forward(const DeviceBatch& batch, Activations& act) {
  const ModelConfig& c = config_;
  const int64_t B = batch.batch, S = batch.seq_len, T = B * S;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, L = c.num_hidden_layers;
  const DType dt = params_.compute_dtype();
  const float eps = c.rms_norm_eps, scale = 1.0f / std::sqrt(static_cast<float>(D));
  const ParameterSet& P = params_;

  auto alloc = [&](std::vector<TensorBuffer>& v, int64_t count, Shape s, DType t) -> Status {
    v.resize(count);
    for (TensorBuffer& b : v) {
      KILN_ASSIGN_OR_RETURN(b, empty(be_, s, t));
    }
    return Status::Ok();
  };
  KILN_RETURN_IF_ERROR(alloc(act.x, L + 1, {T, H}, DType::f32));
  KILN_RETURN_IF_ERROR(alloc(act.x_mid, L, {T, H}, DType::f32));
  KILN_RETURN_IF_ERROR(alloc(act.n1, L, {T, H}, dt));
  KILN_RETURN_IF_ERROR(alloc(act.n2, L, {T, H}, dt));
  KILN_RETURN_IF_ERROR(alloc(act.qkv, L, {T, (Hq + 2 * Hkv) * D}, dt));
  KILN_RETURN_IF_ERROR(alloc(act.q, L, {B, Hq, S, D}, dt));
  KILN_RETURN_IF_ERROR(alloc(act.k, L, {B, Hkv, S, D}, dt));
  KILN_RETURN_IF_ERROR(alloc(act.v, L, {B, Hkv, S, D}, dt));
  KILN_RETURN_IF_ERROR(alloc(act.attn, L, {T, Hq * D}, dt));
  KILN_RETURN_IF_ERROR(alloc(act.lse, L, {B, Hq, S}, DType::f32));
  KILN_RETURN_IF_ERROR(alloc(act.gate_up, L, {T, 2 * I}, dt));
  KILN_RETURN_IF_ERROR(alloc(act.mlp, L, {T, I}, dt));
  KILN_ASSIGN_OR_RETURN(act.n_final, empty(be_, {T, H}, dt));
  KILN_ASSIGN_OR_RETURN(TensorBuffer proj, empty(be_, {T, H}, dt));  // a sublayer's output

  const Tensor segments = batch.segments.allocated() ? batch.segments.view().view({B, S}) : Tensor{};
  ops::embedding_forward(be_, act.x[0], P.weight("embed_tokens"), batch.ids);
  ops::rmsnorm_forward(be_, act.n1[0], act.x[0], P.weight(layer_name(0, "input_norm")), eps);
  for (int64_t l = 0; l < L; ++l) {
    auto w = [&](const char* what) { return P.weight_or_empty(layer_name(l, what)); };
    ops::linear_forward(be_, act.qkv[l], act.n1[l], w("qkv_proj"), w("qkv_bias"));
    ops::qkv_split_rope_forward(be_, act.q[l], act.k[l], act.v[l], act.qkv[l], batch.positions, inv_freq_,
                                rope_attention_scaling_, w("q_norm"), w("k_norm"), eps);
    ops::attention_train_forward(be_, act.attn[l].view().view({B, S, Hq, D}), act.lse[l], act.q[l], act.k[l],
                                 act.v[l], segments, /*causal=*/true, scale);
    ops::linear_forward(be_, proj, act.attn[l], w("o_proj"), w("o_bias"));
    ops::add_rmsnorm_forward(be_, act.n2[l], act.x_mid[l], proj, w("post_norm"), eps, /*residual_in=*/act.x[l]);
    ops::linear_forward(be_, act.gate_up[l], act.n2[l], w("gate_up_proj"), w("gate_up_bias"));
    ops::swiglu_forward(be_, act.mlp[l], act.gate_up[l]);
    ops::linear_forward(be_, proj, act.mlp[l], w("down_proj"), w("down_bias"));
    // x[l+1] = x_mid + mlp output, normed for the next layer (or the head) in the same pass.
    const bool last = l + 1 == L;
    ops::add_rmsnorm_forward(be_, last ? act.n_final.view() : act.n1[l + 1].view(), act.x[l + 1], proj,
                             last ? P.weight("final_norm") : P.weight(layer_name(l + 1, "input_norm")), eps,
                             /*residual_in=*/act.x_mid[l]);
  }
  return Status::Ok();
}

Result<double> TrainModel::head_loss(const DeviceBatch& batch, Activations& act, float grad_scale, bool backward,
                                     std::vector<float>* logprobs_out) {
  const int64_t T = static_cast<int64_t>(batch.batch) * batch.seq_len, H = config_.hidden_size;
  const int64_t V = config_.vocab_size, R = batch.labelled;
  const DType dt = params_.compute_dtype();
  const std::string head = config_.tie_word_embeddings ? "embed_tokens" : "lm_head";
  const Tensor W = params_.weight(head);  // [V, H]
  if (backward) {
    KILN_ASSIGN_OR_RETURN(act.d_final, empty(be_, {T, H}, DType::f32));
    be_.zero(act.d_final);
  }
  if (R == 0) {
    if (logprobs_out) logprobs_out->clear();
    return 0.0;
  }
  KILN_ASSIGN_OR_RETURN(TensorBuffer gathered, empty(be_, {R, H}, dt));
  ops::embedding_forward(be_, gathered, act.n_final, batch.target_rows);  // row gather
  KILN_ASSIGN_OR_RETURN(TensorBuffer losses, empty(be_, {R}, DType::f32));
  KILN_ASSIGN_OR_RETURN(TensorBuffer logprobs, empty(be_, {R}, DType::f32));
  TensorBuffer d_gathered;
  if (backward) {
    KILN_ASSIGN_OR_RETURN(d_gathered, empty(be_, {R, H}, DType::f32));
  }
  const int64_t chunk = std::min(R, head_chunk_rows(be_, V, dt));
  KILN_ASSIGN_OR_RETURN(TensorBuffer logits_buf, empty(be_, {chunk, V}, dt));
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t r1 = std::min(R, r0 + chunk);
    const Tensor logits = logits_buf.view().rows(0, r1 - r0);
    const Tensor rows = gathered.view().rows(r0, r1);
    ops::linear_forward(be_, logits, rows, W);
    ops::cross_entropy_forward_backward(be_, logits, losses.view().rows(r0, r1), logprobs.view().rows(r0, r1),
                                        batch.targets.view().rows(r0, r1), options_.label_smoothing, grad_scale,
                                        backward);
    if (backward) {
      ops::gemm(be_, d_gathered.view().rows(r0, r1), logits, false, W, false, 1.0f, 0.0f);  // [r, V] @ [V, H]
      ops::gemm(be_, params_.grad(head), logits, true, rows, false, 1.0f, 1.0f);         // += [r, V]^T @ [r, H]
    }
  }
  if (backward) ops::embedding_backward(be_, act.d_final, d_gathered, batch.target_rows);  // row scatter
  TensorBuffer host_losses = to_host(be_, losses);
  double sum = 0.0;
  for (int64_t r = 0; r < R; ++r) sum += host_losses.ptr<float>()[r];
  if (logprobs_out) {
    TensorBuffer host_lp = to_host(be_, logprobs);
    logprobs_out->assign(host_lp.ptr<float>(), host_lp.ptr<float>() + R);
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
  for (int64_t l = L - 1; l >= 0; --l) {
    auto w = [&](const char* what) { return P.weight_or_empty(layer_name(l, what)); };
    auto g = [&](const char* what) { return P.grad_or_empty(layer_name(l, what)); };
    // MLP: x'' = x' + down(swiglu(gate_up(n2)))
    ops::gemm(be_, g("down_proj"), dy, true, act.mlp[l], false, 1.0f, 1.0f);  // [H, I] += dy^T m
    if (c.mlp_bias) ops::bias_backward(be_, g("down_bias"), dy);
    ops::gemm(be_, d_mlp, dy, false, w("down_proj"), false, 1.0f, 0.0f);  // [T, I] = dy Wd
    ops::swiglu_backward(be_, d_gate_up, d_mlp, act.gate_up[l]);
    ops::gemm(be_, g("gate_up_proj"), d_gate_up, true, act.n2[l], false, 1.0f, 1.0f);  // [2I, H] += dgu^T n2
    if (c.mlp_bias) ops::bias_backward(be_, g("gate_up_bias"), d_gate_up);
    ops::gemm(be_, d_normed, d_gate_up, false, w("gate_up_proj"), false, 1.0f, 0.0f);  // [T, H] = dgu Wgu
    ops::rmsnorm_backward(be_, d_res, g("post_norm"), d_normed, act.x_mid[l], w("post_norm"), eps, true, d_res_c);
    // Attention: x' = x + o(attention(rope(split(qkv(n1)))))
    ops::gemm(be_, g("o_proj"), dy, true, act.attn[l], false, 1.0f, 1.0f);  // [H, Hq D] += dy^T a
    if (c.o_proj_bias) ops::bias_backward(be_, g("o_bias"), dy);
    ops::gemm(be_, d_attn, dy, false, w("o_proj"), false, 1.0f, 0.0f);  // [T, Hq D] = dy Wo
    ops::attention_train_backward(be_, dq, dk, dv, d_attn.view().view({B, S, Hq, D}), act.q[l], act.k[l], act.v[l],
                                  act.attn[l].view().view({B, S, Hq, D}), act.lse[l], segments,
                                  /*causal=*/true, scale);
    ops::qkv_split_rope_backward(be_, d_qkv, g("q_norm"), g("k_norm"), dq, dk, dv, act.qkv[l], batch.positions,
                                 inv_freq_, rope_attention_scaling_, w("q_norm"), w("k_norm"), eps);
    if (c.attention_bias) ops::bias_backward(be_, g("qkv_bias"), d_qkv);
    ops::gemm(be_, g("qkv_proj"), d_qkv, true, act.n1[l], false, 1.0f, 1.0f);  // [QKV, H] += dqkv^T n1
    ops::gemm(be_, d_normed, d_qkv, false, w("qkv_proj"), false, 1.0f, 0.0f);  // [T, H] = dqkv Wqkv
    ops::rmsnorm_backward(be_, d_res, g("input_norm"), d_normed, act.x[l], w("input_norm"), eps, true, d_res_c);
  }
  ops::embedding_backward(be_, P.grad("embed_tokens"), d_res, batch.ids);
  return Status::Ok();
}

Result<double> TrainModel::forward_backward(const DeviceBatch& batch, float grad_scale) {
  try {
    return forward_backward_unchecked(batch, grad_scale);
  } catch (const OutOfMemory& e) {  // an op's temporary buffer (core/status.h)
    return out_of_memory(std::string(e.what()) + " in a training step of " + std::to_string(batch.batch) + " x " +
                         std::to_string(batch.seq_len) + " tokens; lower --batch-size (raising --grad-accum keeps "
                         "the step's examples) or the sequence length");
  }
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
  KILN_RETURN_IF_ERROR(forward(batch, act));
  KILN_RETURN_IF_ERROR(mark(&t1));
  KILN_ASSIGN_OR_RETURN(double loss_sum, head_loss(batch, act, grad_scale, /*backward=*/true, nullptr));
  KILN_RETURN_IF_ERROR(mark(&t2));
  KILN_RETURN_IF_ERROR(backward(batch, act));
  KILN_RETURN_IF_ERROR(be_.synchronize());
  t3 = Clock::now();
  phase_times_ = {ms(t0, t1), ms(t1, t2), ms(t2, t3)};
  return loss_sum;
}

Result<std::vector<float>> TrainModel::target_logprobs(const DeviceBatch& batch) {
  try {
    return target_logprobs_unchecked(batch);
  } catch (const OutOfMemory& e) {
    return out_of_memory(std::string(e.what()) + " scoring " + std::to_string(batch.batch) + " x " +
                         std::to_string(batch.seq_len) + " tokens; lower the batch or the sequence length");
  }
}

Result<std::vector<float>> TrainModel::target_logprobs_unchecked(const DeviceBatch& batch) {
  Activations act;
  KILN_RETURN_IF_ERROR(forward(batch, act));
  std::vector<float> out;
  KILN_ASSIGN_OR_RETURN(double unused, head_loss(batch, act, 0.0f, /*backward=*/false, &out));
  (void)unused;
  return out;
}

}  // namespace kiln
