// Checkpoint tensor loading with dtype conversion. See weights.h.
#include "model/weights.h"

#include <cstdint>
#include <cstring>

namespace kiln {
namespace {

// Reads element i of a float tensor of dtype `t` at a possibly unaligned address, as f32.
inline float load_f32(const unsigned char* p, DType t, int64_t i) {
  if (t == DType::f32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// dst (aligned, `to`) <- src (possibly unaligned, `from`), n elements; both float dtypes.
void convert(void* dst, DType to, const void* src, DType from, int64_t n) {
  const auto* s = static_cast<const unsigned char*>(src);
  if (to == from) {
    std::memcpy(dst, src, static_cast<size_t>(n * dtype_size(to)));
    return;
  }
  switch (to) {
    case DType::f32: {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = load_f32(s, from, i);
      return;
    }
    case DType::bf16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(load_f32(s, from, i));
      return;
    }
    case DType::f16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(load_f32(s, from, i));
      return;
    }
    default: KILN_ASSERT(false);
  }
}

// The checkpoint entry for `name`, checked against the shape and dtype the caller wants.
Result<TensorInfo> find_checked(const SafetensorsCheckpoint& ckpt, const std::string& name, const Shape& shape,
                                DType target) {
  if (!dtype_is_float(target))
    return invalid_argument(std::string("cannot load weight '") + name + "' as " + dtype_name(target) +
                            "; weights load as f32, bf16 or f16");
  KILN_ASSIGN_OR_RETURN(TensorInfo info, ckpt.find(name));
  if (info.shape != shape)
    return invalid_argument("tensor '" + name + "' in " + info.file + " has shape " + info.shape.str() +
                            " but the config implies " + shape.str() +
                            "; config.json and the weights do not belong together");
  if (!dtype_is_float(info.dtype))
    return invalid_argument("dtype mismatch: tensor '" + name + "' in " + info.file + " is " + dtype_name(info.dtype) +
                            ", but weights must be floating point (F32, BF16 or F16)");
  return info;
}

}  // namespace

Status load_tensor_into(Backend& be, const SafetensorsCheckpoint& ckpt, const std::string& name, Tensor dst) {
  KILN_ASSIGN_OR_RETURN(TensorInfo info, find_checked(ckpt, name, dst.shape, dst.dtype));
  const int64_t n = dst.numel();
  if (n == 0) return Status::Ok();
  if (dst.device.is_cpu()) {  // convert straight into the destination
    convert(dst.data, dst.dtype, info.data, info.dtype, n);
    return Status::Ok();
  }
  KILN_ASSERT(dst.device == be.device());
  if (info.dtype == dst.dtype) {  // the file's bytes are the device's bytes: copy from the map
    Tensor src;
    src.data = const_cast<void*>(info.data);  // read only: copy() only reads src
    src.dtype = info.dtype;
    src.device = Device::cpu();
    src.shape = dst.shape;
    be.copy(dst, src);  // a pageable host source is consumed before copy() returns
    return Status::Ok();
  }
  TensorBuffer staging = host_empty(dst.shape, dst.dtype);
  convert(staging.view().data, dst.dtype, info.data, info.dtype, n);
  be.copy(dst, staging);
  return be.synchronize();  // staging must outlive the copy
}

Status check_tensor(const SafetensorsCheckpoint& ckpt, const std::string& name, const Shape& expected_shape) {
  return find_checked(ckpt, name, expected_shape, DType::f32).status();
}

Result<TensorBuffer> load_tensor(Backend& be, const SafetensorsCheckpoint& ckpt, const std::string& name,
                                 Shape expected_shape, DType target_dtype) {
  // Check first, so a mismatch never costs device memory.
  KILN_RETURN_IF_ERROR(find_checked(ckpt, name, expected_shape, target_dtype).status());
  KILN_ASSIGN_OR_RETURN(TensorBuffer out, empty(be, expected_shape, target_dtype));
  KILN_RETURN_IF_ERROR(load_tensor_into(be, ckpt, name, out.view()));
  return out;
}

}  // namespace kiln
