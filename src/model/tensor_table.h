// The one table of a model's tensors, shared by inference (Transformer) and training (TrainModel):
// kiln's fused tensors (q/k/v rows in one qkv_proj, gate and up rows in one gate_up_proj, ...) with
// their shapes, the Hugging Face tensors as row ranges of them, and the operations both sides need
// on such a table: seeded random initialisation, loading a checkpoint, the rotary tables.
//
// ModelWeights holds borrowed views by fused name: whoever owns the memory (a Transformer's own
// buffers, a ParameterSet's compute copy) keeps it alive while the views are used.
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/config.h"

namespace kiln {

// One Hugging Face tensor: which fused tensor holds it and which rows.
struct HfTensor {
  std::string name;   // e.g. "model.layers.0.self_attn.k_proj.weight"
  std::string fused;  // kiln's tensor holding it, e.g. "layers.0.qkv_proj"
  int64_t row_begin = 0, row_end = 0;
};

// The tensors of a config, in checkpoint order: kiln's fused tensors with their shapes, and the
// Hugging Face tensors that make them up.
struct ModelTensorLayout {
  std::vector<std::pair<std::string, Shape>> fused;  // kiln name -> shape, model order
  std::vector<HfTensor> hf;
};
ModelTensorLayout model_tensor_layout(const ModelConfig& config);

// Views of a model's fused tensors by kiln name (borrowed).
class ModelWeights {
 public:
  void set(const std::string& fused_name, Tensor t) { views_[fused_name] = t; }
  bool has(const std::string& fused_name) const { return views_.count(fused_name) != 0; }
  // The view; an absent name is a bug (asserts).
  Tensor get(const std::string& fused_name) const;
  // Absent optional tensors (a bias the config does not have) as an empty Tensor.
  Tensor get_or_empty(const std::string& fused_name) const { return has(fused_name) ? get(fused_name) : Tensor{}; }
  Tensor hf_view(const HfTensor& t) const { return get(t.fused).rows(t.row_begin, t.row_end); }
  // Checks that every tensor of `layout` is present with its shape, all in `dtype` on `device`.
  Status check(const ModelTensorLayout& layout, DType dtype, Device device) const;

 private:
  std::map<std::string, Tensor> views_;
};

// Seeded random weights, the same for inference and training: norms 1, biases 0, every other
// tensor N(0, 0.02^2) from ops::fill_normal keyed by (seed * 1000003 + its 1-based index in
// layout.fused), so one config and seed give one model on every device up to storage rounding.
void randomize_weights(Backend& be, const ModelTensorLayout& layout, const ModelWeights& w, uint64_t seed);

// Checks that the safetensors of `model_dir` hold every Hugging Face tensor of `layout` with its
// shape, allocating nothing (run before the weights are allocated).
Status check_checkpoint(const ModelTensorLayout& layout, const std::string& model_dir);

// Loads every Hugging Face tensor of `layout` from the safetensors of `model_dir` into `w`
// (converting dtypes); errors name the tensor and the file.
Status load_weights(Backend& be, const ModelTensorLayout& layout, const ModelWeights& w, const std::string& model_dir);

// The rotary embedding's inverse frequencies on the device ([head_dim / 2] f32) and its scaling.
struct DeviceRope {
  TensorBuffer inv_freq;
  float attention_scaling = 1.0f;
};
Result<DeviceRope> make_device_rope(Backend& be, const ModelConfig& config);

}  // namespace kiln
