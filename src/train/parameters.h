// ParameterSet: a model's trainable parameters laid out in flat buffers, so that the optimizer
// update is one kernel over all of them and a future gradient all-reduce is one call.
//
//   master  [N] f32            the parameters the optimizer updates
//   grads   [N] f32            d loss / d parameter, accumulated over micro-batches (unless
//                              sharded: below)
//   compute [N] bf16           the copy the forward and backward read (CUDA, mixed precision);
//                              on the CPU the model reads `master` directly (everything f32)
//
// Data parallel with sharded optimizer state (ZeRO, train/trainer.h): N is padded at the end to a
// multiple of `shards` x 128, so that [0, N) splits into equal, aligned shards (the padding holds
// zeros and belongs to no tensor); with mixed precision each rank may keep only its shard of the
// master weights (keep_master_range), the compute copy staying whole. With ZeRO-2 it may keep only
// its shard of the accumulated gradients (shard_gradients): the backward then writes each layer's
// gradients into one of two layer-sized scratch buffers in turn (layer l into l % 2) and the other
// tensors' (embeddings, head, final norm) into a scratch of their own; the trainer reduces each
// scratch into the ranks that own its elements and adds this rank's part to the shard.
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
  // splits them is an error. `mixed_precision` adds the bf16 compute copy. `shards` >= 1: N is a
  // multiple of shards x 128. Buffers start at zero.
  static Result<ParameterSet> create(Backend& be, const ModelConfig& config, const std::string& no_decay_regex,
                                     bool mixed_precision, int32_t shards = 1);

  int64_t size() const { return size_; }                  // N, padding included
  int32_t shards() const { return shards_; }
  int64_t shard_size() const { return size_ / shards_; }  // elements of one shard
  int64_t parameter_count() const { return count_; }      // elements of real tensors
  int64_t decay_end() const { return decay_end_; }
  // The block matrices' range (128-aligned ends; empty for a model without layers) and its matrices
  // in Hugging Face granularity, in layout order.
  int64_t matrix_begin() const { return matrix_begin_; }
  int64_t matrix_end() const { return matrix_end_; }
  const std::vector<ParameterMatrix>& block_matrices() const { return block_matrices_; }
  bool mixed_precision() const { return compute_.allocated(); }
  DType compute_dtype() const { return mixed_precision() ? DType::bf16 : DType::f32; }

  // The master weights this process holds: elements [master_begin, master_end) of the flat layout
  // ([0, N) unless keep_master_range sharded them).
  Tensor master() const { return master_.view(); }
  int64_t master_begin() const { return master_begin_; }
  int64_t master_end() const { return master_begin_ + master_.view().numel(); }
  bool master_sharded() const { return master_.view().numel() != size_; }
  // The flat gradients [N]; not while they are sharded.
  Tensor grads() const {
    KILN_ASSERT(!gradients_sharded() && "grads() of sharded gradients");
    return grads_.view();
  }
  // The accumulated gradients of elements [begin, end): rows of grads(), or of the shard when they
  // are sharded (the range must then lie in it).
  Tensor grad_rows(int64_t begin, int64_t end) const;
  // Every accumulated gradient and scratch to zero (after a failed step).
  void zero_grads(Backend& be) const;
  // The accumulated gradients to zero (after a step; the scratch of sharded gradients is already
  // clear then: the trainer clears each one once its sums are collected).
  void zero_accumulated_grads(Backend& be) const { be.zero(gradients_sharded() ? grad_shard_.view() : grads_.view()); }

  // ZeRO-2: keeps the accumulated gradients of elements [begin, end) only (zero), freeing the flat
  // buffer, and gives the backward its scratch (above). Called once, before the first step.
  Status shard_gradients(Backend& be, int64_t begin, int64_t end);
  bool gradients_sharded() const { return grad_shard_.allocated(); }
  int64_t grad_shard_begin() const { return grad_shard_begin_; }
  // Where the backward writes the gradients of layer `layer` (-1: of the tensors outside the
  // layers, the padding at the end included), as spans of the flat layout: flat elements [begin,
  // end) are in `scratch` ([end - begin] f32: rows of grads(), or of a scratch buffer when the
  // gradients are sharded). Together the spans of every layer and of -1 cover [0, N) once.
  struct GradientSpan {
    int64_t begin = 0, end = 0;
    Tensor scratch;
  };
  std::vector<GradientSpan> gradient_spans(int64_t layer) const;
  Tensor compute() const { return mixed_precision() ? compute_.view() : master_.view(); }

  // Views of one fused tensor (kiln name) or Hugging Face tensor; an absent name is a bug (asserts),
  // and so is master(name) once the master weights are sharded.
  bool has(const std::string& fused_name) const { return offsets_.count(fused_name) != 0; }
  Tensor master(const std::string& fused_name) const;
  Tensor grad(const std::string& fused_name) const;
  Tensor weight(const std::string& fused_name) const { return slice(compute(), fused_name); }
  Tensor hf_view(Tensor flat, const HfTensor& t) const { return slice(flat, t.fused).rows(t.row_begin, t.row_end); }
  // Absent optional tensors (a bias the config does not have) as an empty Tensor.
  Tensor weight_or_empty(const std::string& fused_name) const { return has(fused_name) ? weight(fused_name) : Tensor{}; }
  Tensor grad_or_empty(const std::string& fused_name) const { return has(fused_name) ? grad(fused_name) : Tensor{}; }

  // Flat ranges [begin, end) (alignment padding included) holding the tensors of transformer layer
  // `layer` (adjacent tensors merged: a few ranges per layer), and those holding everything else
  // (embeddings, final norm, head, and the padding at the end): together they cover [0, N) once.
  // The data-parallel trainer reduces a layer's gradients as soon as its backward is done.
  const std::vector<std::pair<int64_t, int64_t>>& layer_ranges(int64_t layer) const {
    return layer_ranges_.at(static_cast<size_t>(layer));
  }
  std::vector<std::pair<int64_t, int64_t>> non_layer_ranges() const;

  const ModelTensorLayout& layout() const { return layout_; }
  // The compute copy as the model's tensor table (what Transformer::borrow and TrainModel read).
  ModelWeights compute_weights() const;
  ModelWeights master_weights() const;
  // Names of the Hugging Face tensors exempt from weight decay, for the log.
  std::vector<std::string> no_decay_names() const;

  // Refreshes the compute copy from the master weights (after loading them; unsharded only).
  void sync_compute(Backend& be) const;
  // Sets the weights from `full` ([N] f32 on this backend): the master elements this process holds
  // and the whole compute copy.
  void assign(Backend& be, Tensor full) const;
  // Keeps only the master elements [begin, end) (mixed precision: the model reads the compute copy),
  // freeing the rest; the compute copy must be current. Called once, right after loading.
  Status keep_master_range(Backend& be, int64_t begin, int64_t end);

 private:
  Tensor slice(Tensor flat, const std::string& fused_name) const;

  ModelTensorLayout layout_;
  std::map<std::string, std::pair<int64_t, Shape>> offsets_;  // fused name -> (offset, shape)
  std::map<std::string, bool> decayed_;                       // fused name -> weight decay applies
  int64_t size_ = 0, count_ = 0, decay_end_ = 0, matrix_begin_ = 0, matrix_end_ = 0, master_begin_ = 0;
  int32_t shards_ = 1;
  std::vector<ParameterMatrix> block_matrices_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> layer_ranges_;  // [layers] -> merged ranges
  TensorBuffer master_, grads_, compute_;
  // Sharded gradients: the shard [grad_shard_begin_, + numel) and the scratch (two layer buffers,
  // the rest's buffer; a range's elements sit in them in layout order, each range at the offset
  // scratch_offset_ gives for its begin).
  TensorBuffer grad_shard_, layer_scratch_[2], rest_scratch_;
  int64_t grad_shard_begin_ = 0;
  std::map<int64_t, int64_t> scratch_offset_;  // range begin -> offset in its scratch buffer
  std::map<std::string, Tensor> scratch_grads_;  // fused name -> its view in the scratch
};

}  // namespace kiln
