#include "train/parameters.h"

#include <algorithm>
#include <regex>

#include "kernels/ops.h"

namespace kiln {
namespace {

constexpr int64_t kAlignElements = 128;  // 512 bytes of f32, 256 of bf16: what cuBLASLt likes best

int64_t align_up(int64_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; }

// A 2-D weight of a transformer layer ("layers.<i>.qkv_proj", ...): the tensors Muon updates.
bool is_block_matrix(const std::string& fused_name, const Shape& shape) {
  return fused_name.rfind("layers.", 0) == 0 && shape.ndim == 2;
}

}  // namespace

Result<ParameterSet> ParameterSet::create(Backend& be, const ModelConfig& config, const std::string& no_decay_regex,
                                          bool mixed_precision, int32_t shards) {
  if (shards < 1) return invalid_argument("the parameter shard count must be >= 1");
  ParameterSet set;
  set.shards_ = shards;
  set.layout_ = model_tensor_layout(config);
  std::regex no_decay;
  try {
    if (!no_decay_regex.empty()) no_decay = std::regex(no_decay_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return invalid_argument("--no-decay: '" + no_decay_regex + "' is not a valid regular expression (" +
                                   e.what() + ")");
  }
  // Decay per fused tensor: every Hugging Face part must agree.
  std::map<std::string, std::string> first_part;  // fused -> the hf name that decided it
  for (const HfTensor& t : set.layout_.hf) {
    const bool decayed = no_decay_regex.empty() || !std::regex_search(t.name, no_decay);
    auto it = set.decayed_.find(t.fused);
    if (it == set.decayed_.end()) {
      set.decayed_[t.fused] = decayed;
      first_part[t.fused] = t.name;
    } else if (it->second != decayed) {
      return invalid_argument("--no-decay '" + no_decay_regex + "' exempts " +
                                     (decayed ? first_part[t.fused] : t.name) + " but not " +
                                     (decayed ? t.name : first_part[t.fused]) +
                                     "; kiln stores them as one tensor, so name both or neither");
    }
  }
  // [other decayed][block matrices decayed][block matrices exempt][other exempt].
  for (int pass = 0; pass < 4; ++pass) {
    const bool want_decayed = pass < 2, want_matrix = pass == 1 || pass == 2;
    if (pass == 1) set.matrix_begin_ = set.size_;
    if (pass == 2) set.decay_end_ = set.size_;
    for (const auto& [name, shape] : set.layout_.fused) {
      if (set.decayed_[name] != want_decayed || is_block_matrix(name, shape) != want_matrix) continue;
      set.offsets_[name] = {set.size_, shape};
      set.size_ += align_up(shape.numel());
      set.count_ += shape.numel();
    }
    if (pass == 2) set.matrix_end_ = set.size_;
  }
  // Each layer's ranges, in layout order, adjacent ones merged.
  set.layer_ranges_.resize(static_cast<size_t>(std::max<int64_t>(config.num_hidden_layers, 0)));
  std::vector<std::pair<int64_t, std::string>> by_offset;
  for (const auto& [name, at] : set.offsets_) by_offset.emplace_back(at.first, name);
  std::sort(by_offset.begin(), by_offset.end());
  for (const auto& [offset, name] : by_offset) {
    if (name.rfind("layers.", 0) != 0) continue;
    const size_t layer = static_cast<size_t>(std::stoll(name.substr(7)));
    if (layer >= set.layer_ranges_.size()) continue;
    auto& ranges = set.layer_ranges_[layer];
    const int64_t end = offset + align_up(set.offsets_.at(name).second.numel());
    if (!ranges.empty() && ranges.back().second == offset)
      ranges.back().second = end;
    else
      ranges.emplace_back(offset, end);
  }
  const int64_t multiple = kAlignElements * shards;  // the padding at the end: equal, aligned shards
  set.size_ = (set.size_ + multiple - 1) / multiple * multiple;
  // The Hugging Face matrices inside the block range, in layout order.
  for (const HfTensor& t : set.layout_.hf) {
    const auto& [offset, shape] = set.offsets_.at(t.fused);
    if (!is_block_matrix(t.fused, shape)) continue;
    const int64_t cols = shape[1];
    set.block_matrices_.push_back({t.name, offset + t.row_begin * cols, t.row_end - t.row_begin, cols,
                                   set.decayed_.at(t.fused)});
  }
  std::sort(set.block_matrices_.begin(), set.block_matrices_.end(),
            [](const ParameterMatrix& a, const ParameterMatrix& b) { return a.offset < b.offset; });
  KILN_ASSIGN_OR_RETURN(set.master_, empty(be, {set.size_}, DType::f32));
  KILN_ASSIGN_OR_RETURN(set.grads_, empty(be, {set.size_}, DType::f32));
  be.zero(set.master_);
  be.zero(set.grads_);
  if (mixed_precision) {
    KILN_ASSIGN_OR_RETURN(set.compute_, empty(be, {set.size_}, DType::bf16));
    be.zero(set.compute_);
  }
  return set;
}

Tensor ParameterSet::grad(const std::string& fused_name) const {
  if (!gradients_sharded()) return slice(grads_.view(), fused_name);
  auto it = scratch_grads_.find(fused_name);
  KILN_ASSERT(it != scratch_grads_.end() && "unknown parameter");
  return it->second;
}

std::vector<ParameterSet::GradientSpan> ParameterSet::gradient_spans(int64_t layer) const {
  const std::vector<std::pair<int64_t, int64_t>> ranges =
      layer < 0 ? non_layer_ranges() : layer_ranges_.at(static_cast<size_t>(layer));
  std::vector<GradientSpan> out;
  for (const auto& [b, e] : ranges) {
    Tensor scratch;
    if (!gradients_sharded()) {
      scratch = grads_.view().rows(b, e);
    } else {
      const TensorBuffer& buf = layer < 0 ? rest_scratch_ : layer_scratch_[layer % 2];
      const int64_t at = scratch_offset_.at(b);
      scratch = buf.view().rows(at, at + (e - b));
    }
    out.push_back({b, e, scratch});
  }
  return out;
}

Tensor ParameterSet::grad_rows(int64_t begin, int64_t end) const {
  if (!gradients_sharded()) return grads_.view().rows(begin, end);
  KILN_ASSERT(begin >= grad_shard_begin_ && end <= grad_shard_begin_ + grad_shard_.view().numel());
  return grad_shard_.view().rows(begin - grad_shard_begin_, end - grad_shard_begin_);
}

void ParameterSet::zero_grads(Backend& be) const {
  for (const TensorBuffer* b : {&grads_, &grad_shard_, &layer_scratch_[0], &layer_scratch_[1], &rest_scratch_})
    if (b->allocated()) be.zero(b->view());
}

Status ParameterSet::shard_gradients(Backend& be, int64_t begin, int64_t end) {
  KILN_ASSERT(!gradients_sharded() && 0 <= begin && begin <= end && end <= size_);
  // Offsets in the scratch buffers: each layer's ranges one after the other (every layer has the
  // same tensors, so one size fits all), and the other ranges likewise.
  int64_t layer_size = 0, rest_size = 0;
  for (const auto& ranges : layer_ranges_) {
    int64_t at = 0;
    for (const auto& [b, e] : ranges) {
      scratch_offset_[b] = at;
      at += e - b;
    }
    layer_size = std::max(layer_size, at);
  }
  for (const auto& [b, e] : non_layer_ranges()) {
    scratch_offset_[b] = rest_size;
    rest_size += e - b;
  }
  KILN_ASSIGN_OR_RETURN(grad_shard_, empty(be, {end - begin}, DType::f32));
  for (TensorBuffer& b : layer_scratch_) {
    KILN_ASSIGN_OR_RETURN(b, empty(be, {std::max<int64_t>(layer_size, 1)}, DType::f32));
  }
  KILN_ASSIGN_OR_RETURN(rest_scratch_, empty(be, {std::max<int64_t>(rest_size, 1)}, DType::f32));
  grad_shard_begin_ = begin;
  grads_ = TensorBuffer();
  // Each tensor's view inside its layer's (or the rest's) spans, for grad().
  for (const auto& [name, at] : offsets_) {
    const auto& [offset, shape] = at;
    const int64_t layer = name.rfind("layers.", 0) == 0 ? std::stoll(name.substr(7)) : -1;
    const bool in_layers = layer >= 0 && layer < static_cast<int64_t>(layer_ranges_.size());
    for (const GradientSpan& s : gradient_spans(in_layers ? layer : -1))
      if (s.begin <= offset && offset + shape.numel() <= s.end)
        scratch_grads_[name] = s.scratch.rows(offset - s.begin, offset - s.begin + shape.numel()).view(shape);
    KILN_ASSERT(scratch_grads_.count(name) && "a parameter outside its layer's ranges");
  }
  zero_grads(be);
  return be.synchronize();
}

Tensor ParameterSet::slice(Tensor flat, const std::string& fused_name) const {
  auto it = offsets_.find(fused_name);
  KILN_ASSERT(it != offsets_.end() && "unknown parameter");
  const auto& [offset, shape] = it->second;
  return flat.rows(offset, offset + shape.numel()).view(shape);
}

std::vector<std::pair<int64_t, int64_t>> ParameterSet::non_layer_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> layers, out;
  for (const auto& ranges : layer_ranges_) layers.insert(layers.end(), ranges.begin(), ranges.end());
  std::sort(layers.begin(), layers.end());
  int64_t at = 0;
  for (const auto& [b, e] : layers) {
    if (b > at) out.emplace_back(at, b);
    at = e;
  }
  if (at < size_) out.emplace_back(at, size_);
  return out;
}

Tensor ParameterSet::master(const std::string& fused_name) const {
  KILN_ASSERT(!master_sharded() && "master(name) of sharded master weights");
  return slice(master_.view(), fused_name);
}

ModelWeights ParameterSet::compute_weights() const {
  ModelWeights w;
  for (const auto& [name, shape] : layout_.fused) w.set(name, weight(name));
  return w;
}

ModelWeights ParameterSet::master_weights() const {
  ModelWeights w;
  for (const auto& [name, shape] : layout_.fused) w.set(name, master(name));
  return w;
}

std::vector<std::string> ParameterSet::no_decay_names() const {
  std::vector<std::string> out;
  for (const HfTensor& t : layout_.hf)
    if (!decayed_.at(t.fused)) out.push_back(t.name);
  return out;
}

void ParameterSet::sync_compute(Backend& be) const {
  KILN_ASSERT(!master_sharded());
  if (mixed_precision()) ops::cast(be, compute_.view(), master_.view());
}

void ParameterSet::assign(Backend& be, Tensor full) const {
  KILN_ASSERT(full.numel() == size_ && full.dtype == DType::f32);
  be.copy(master_.view(), full.rows(master_begin(), master_end()));
  if (mixed_precision()) ops::cast(be, compute_.view(), full);
}

Status ParameterSet::keep_master_range(Backend& be, int64_t begin, int64_t end) {
  KILN_ASSERT(mixed_precision() && !master_sharded() && 0 <= begin && begin <= end && end <= size_);
  KILN_ASSIGN_OR_RETURN(TensorBuffer kept, empty(be, {end - begin}, DType::f32));
  be.copy(kept.view(), master_.view().rows(begin, end));
  KILN_RETURN_IF_ERROR(be.synchronize());
  master_ = std::move(kept);
  master_begin_ = begin;
  return Status::Ok();
}

}  // namespace kiln
