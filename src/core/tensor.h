// Tensor: a small, trivially copyable, non-owning view of contiguous row-major memory on one device.
// Ownership lives elsewhere (backend::Buffer / TensorBuffer); views are passed by value.
// Shapes are int64 per dimension; a tensor has at most kMaxDims dimensions.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace kiln {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

constexpr int kMaxDims = 6;

struct Shape {
  int ndim = 0;
  int64_t dims[kMaxDims] = {};

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    KILN_ASSERT(d.size() <= static_cast<size_t>(kMaxDims));
    for (int64_t v : d) dims[ndim++] = v;
  }
  int64_t operator[](int i) const { return dims[i < 0 ? ndim + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device;
  Shape shape;

  int64_t numel() const { return shape.numel(); }
  int64_t nbytes() const { return numel() * dtype_size(dtype); }
  int ndim() const { return shape.ndim; }
  int64_t size(int d) const { return shape[d]; }
  bool defined() const { return data != nullptr || numel() == 0; }

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }

  // Same memory, another shape with the same element count.
  Tensor view(Shape s) const {
    KILN_ASSERT(s.numel() == numel());
    Tensor t = *this;
    t.shape = s;
    return t;
  }
  // Rows [begin, end) along dimension 0.
  Tensor rows(int64_t begin, int64_t end) const {
    KILN_ASSERT(shape.ndim >= 1 && 0 <= begin && begin <= end && end <= shape.dims[0]);
    int64_t row_elems = shape.dims[0] == 0 ? 0 : numel() / shape.dims[0];
    Tensor t = *this;
    t.data = static_cast<char*>(data) + begin * row_elems * dtype_size(dtype);
    t.shape.dims[0] = end - begin;
    return t;
  }
  std::string str() const { return std::string(dtype_name(dtype)) + shape.str() + "@" + device.str(); }
};

}  // namespace kiln
