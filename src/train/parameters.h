// ParameterSet: a model's trainable parameters laid out in flat buffers, so that the optimizer
// update is one kernel over all of them and a future gradient all-reduce is one call.
//
//   master  [N] f32            the parameters the optimizer updates
//   grads   [N] f32            d loss / d parameter, accumulated over micro-batches
//   compute [N] bf16           the copy the forward and backward read (CUDA, mixed precision);
//                              on the CPU the model reads `master` directly (everything f32)
//
// Each model tensor (kiln's fused layout: q/k/v rows in one qkv_proj, gate and up in one
// gate_up_proj) is one contiguous range, aligned to 128 elements; Hugging Face's tensor names are
// row views of those ranges. The order is
//   [other decayed][block matrices decayed][block matrices exempt][other exempt]
// where "block matrices" are the 2-D weights of the transformer layers (qkv_proj, o_proj,
// gate_up_proj, down_proj: what Muon updates) and "exempt" means exempt from weight decay. So
// "decayed" is simply "offset < decay_end", and the block matrices are the one contiguous range
// [matrix_begin, matrix_end) that AdamW skips when the optimizer is Muon.
//
// Ownership: owns the three buffers on its backend. Thread safety: none (one thread drives it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/config.h"
#include "model/tensor_table.h"

namespace kiln {

// Parameters matching the default --no-decay expression: norms, biases and embeddings.
inline constexpr const char* kDefaultNoDecay = R"(norm|\.bias$|embed_tokens)";

// One Hugging Face weight matrix of a transformer layer inside the flat buffers (q, k and v are
// separate row blocks of qkv_proj, gate and up of gate_up_proj): elements
// [offset, offset + rows * cols) of master / grads, row-major [rows, cols].
struct ParameterMatrix {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.k_proj.weight"
  int64_t offset = 0, rows = 0, cols = 0;
  bool decayed = true;
};

class ParameterSet {
 public:
  // Lays out the parameters of `config` on `be`; tensors whose Hugging Face names match
  // `no_decay_regex` (ECMAScript syntax, searched anywhere in the name; empty: none) are exempt from
  // weight decay. Fused tensors must be exempt as a whole (q/k/v, gate/up): an expression that
  // splits them is an error. `mixed_precision` adds the bf16 compute copy. Buffers start at zero.
  static Result<ParameterSet> create(Backend& be, const ModelConfig& config, const std::string& no_decay_regex,
                                     bool mixed_precision);

  int64_t size() const { return size_; }                  // N, padding included
  int64_t parameter_count() const { return count_; }      // elements of real tensors
  int64_t decay_end() const { return decay_end_; }
  // The block matrices' range (128-aligned ends; empty for a model without layers) and its matrices
  // in Hugging Face granularity, in layout order.
  int64_t matrix_begin() const { return matrix_begin_; }
  int64_t matrix_end() const { return matrix_end_; }
  const std::vector<ParameterMatrix>& block_matrices() const { return block_matrices_; }
  bool mixed_precision() const { return compute_.allocated(); }
  DType compute_dtype() const { return mixed_precision() ? DType::bf16 : DType::f32; }

  Tensor master() const { return master_.view(); }
  Tensor grads() const { return grads_.view(); }
  Tensor compute() const { return mixed_precision() ? compute_.view() : master_.view(); }

  // Views of one fused tensor (kiln name) or Hugging Face tensor; an absent name is a bug (asserts).
  bool has(const std::string& fused_name) const { return offsets_.count(fused_name) != 0; }
  Tensor master(const std::string& fused_name) const { return slice(master_.view(), fused_name); }
  Tensor grad(const std::string& fused_name) const { return slice(grads_.view(), fused_name); }
  Tensor weight(const std::string& fused_name) const { return slice(compute(), fused_name); }
  Tensor hf_view(Tensor flat, const HfTensor& t) const { return slice(flat, t.fused).rows(t.row_begin, t.row_end); }
  // Absent optional tensors (a bias the config does not have) as an empty Tensor.
  Tensor weight_or_empty(const std::string& fused_name) const { return has(fused_name) ? weight(fused_name) : Tensor{}; }
  Tensor grad_or_empty(const std::string& fused_name) const { return has(fused_name) ? grad(fused_name) : Tensor{}; }

  const ModelTensorLayout& layout() const { return layout_; }
  // The compute copy as the model's tensor table (what Transformer::borrow and TrainModel read).
  ModelWeights compute_weights() const;
  ModelWeights master_weights() const;
  // Names of the Hugging Face tensors exempt from weight decay, for the log.
  std::vector<std::string> no_decay_names() const;

  // Refreshes the compute copy from the master weights (after loading them).
  void sync_compute(Backend& be) const;

 private:
  Tensor slice(Tensor flat, const std::string& fused_name) const;

  ModelTensorLayout layout_;
  std::map<std::string, std::pair<int64_t, Shape>> offsets_;  // fused name -> (offset, shape)
  std::map<std::string, bool> decayed_;                       // fused name -> weight decay applies
  int64_t size_ = 0, count_ = 0, decay_end_ = 0, matrix_begin_ = 0, matrix_end_ = 0;
  std::vector<ParameterMatrix> block_matrices_;
  TensorBuffer master_, grads_, compute_;
};

}  // namespace kiln
