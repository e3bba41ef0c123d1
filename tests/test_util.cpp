#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <limits>

#include "kernels/rng.h"

namespace kiln::test {

TensorBuffer random_host(Shape shape, DType dtype, uint64_t seed, float std) {
  TensorBuffer t = host_empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float u1 = rng::uniform_open(seed, 2 * static_cast<uint64_t>(i));
    float u2 = rng::uniform_open(seed, 2 * static_cast<uint64_t>(i) + 1);
    float v = std * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    switch (dtype) {
      case DType::f32: t.ptr<float>()[i] = v; break;
      case DType::bf16: t.ptr<uint16_t>()[i] = f32_to_bf16(v); break;
      case DType::f16: t.ptr<uint16_t>()[i] = f32_to_f16(v); break;
      default: KILN_ASSERT(false);
    }
  }
  return t;
}

TensorBuffer random_ints(Shape shape, int32_t lo, int32_t hi, uint64_t seed) {
  TensorBuffer t = host_empty(shape, DType::i32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.ptr<int32_t>()[i] = lo + static_cast<int32_t>(rng::uniform(seed, static_cast<uint64_t>(i)) * (hi - lo));
  return t;
}

TensorBuffer host_ints(const std::vector<int32_t>& values) {
  TensorBuffer t = host_empty(Shape{static_cast<int64_t>(values.size())}, DType::i32);
  for (size_t i = 0; i < values.size(); ++i) t.ptr<int32_t>()[i] = values[i];
  return t;
}

std::vector<float> to_f32(Backend& be, Tensor t) {
  TensorBuffer h = to_host(be, t);
  std::vector<float> out(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) {
    switch (t.dtype) {
      case DType::f32: out[i] = h.ptr<float>()[i]; break;
      case DType::bf16: out[i] = bf16_to_f32(h.ptr<uint16_t>()[i]); break;
      case DType::f16: out[i] = f16_to_f32(h.ptr<uint16_t>()[i]); break;
      case DType::i32: out[i] = static_cast<float>(h.ptr<int32_t>()[i]); break;
      case DType::i64: out[i] = static_cast<float>(h.ptr<int64_t>()[i]); break;
    }
  }
  return out;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return std::numeric_limits<double>::infinity();
    double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= m)) m = d;  // NaN propagates as the max
  }
  return m;
}

std::string testdata_dir() {
  const char* env = std::getenv("KILN_TESTDATA");
  return env && *env ? env : KILN_TESTDATA;
}

std::string kiln_binary() {
  const char* env = std::getenv("KILN_BINARY");
  return env && *env ? env : KILN_BINARY;
}

RunResult run_kiln(const std::string& args, const std::string& stdin_text) {
  RunResult r;
  const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(reinterpret_cast<uintptr_t>(&r));
  const std::string err_file = (std::filesystem::temp_directory_path() / ("kiln_cli_err_" + tag)).string();
  const std::string in_file = (std::filesystem::temp_directory_path() / ("kiln_cli_in_" + tag)).string();
  std::ofstream(in_file, std::ios::binary) << stdin_text;
  std::string cmd = kiln_binary() + " " + args + " <" + in_file + " 2>" + err_file;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.stdout_only.append(buf, n);
  int status = pclose(p);
  std::ifstream err(err_file);
  std::string err_text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  std::filesystem::remove(err_file);
  std::filesystem::remove(in_file);
  r.output = r.stdout_only + err_text;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) >= 128)) r.crashed = true;
  return r;
}

std::unique_ptr<Backend> gpu_backend_or_null(std::string* reason) {
  if (cuda_device_count() == 0) {
    *reason = "no CUDA GPU on this machine (or kiln built without CUDA): GPU test skipped";
    return nullptr;
  }
  Result<std::unique_ptr<Backend>> b = make_backend(Device::cuda(0));
  if (!b.ok()) {
    *reason = b.status().message();
    return nullptr;
  }
  return std::move(b).value();
}

}  // namespace kiln::test
