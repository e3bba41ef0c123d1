#include "test_util.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <cstring>
#include <iterator>
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

TensorBuffer upload(Backend& be, Tensor host) {
  Result<TensorBuffer> r = to_device(be, host);
  KILN_ASSERT(r.ok());
  return std::move(r).value();
}

TensorBuffer device_empty(Backend& be, Shape shape, DType dtype) {
  Result<TensorBuffer> r = empty(be, shape, dtype);
  KILN_ASSERT(r.ok());
  return std::move(r).value();
}

TensorBuffer host_copy(Tensor host) {
  TensorBuffer c = host_empty(host.shape, host.dtype);
  std::memcpy(c.view().data, host.data, static_cast<size_t>(host.nbytes()));
  return c;
}

PagedTables contiguous_pages(const std::vector<int32_t>& kv_indptr) {
  PagedTables p;
  p.page_size = 1;
  p.indptr = host_ints(kv_indptr);
  std::vector<int32_t> indices(static_cast<size_t>(std::max(kv_indptr.back(), 1)));
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int32_t>(i);
  p.indices = host_ints(indices);
  p.last = host_ints(std::vector<int32_t>(std::max<size_t>(kv_indptr.size() - 1, 1), 1));
  return p;
}

PagedTables scattered_pages(const std::vector<int32_t>& kv_lens, int32_t page_size, int32_t pool_pages, uint64_t seed,
                            std::vector<std::vector<int32_t>>* slot_of) {
  std::vector<int32_t> order(static_cast<size_t>(pool_pages));
  for (int32_t i = 0; i < pool_pages; ++i) order[i] = i;
  for (int32_t i = pool_pages - 1; i > 0; --i) {  // seeded Fisher-Yates
    const int32_t j = static_cast<int32_t>(rng::uniform(seed, static_cast<uint64_t>(i)) * (i + 1));
    std::swap(order[i], order[j]);
  }
  std::vector<int32_t> indptr = {0}, indices, last;
  slot_of->assign(kv_lens.size(), {});
  size_t next = 0;
  for (size_t b = 0; b < kv_lens.size(); ++b) {
    const int32_t n = kv_lens[b], pages = (n + page_size - 1) / page_size;
    for (int32_t p = 0; p < pages; ++p) {
      KILN_ASSERT(next < order.size());
      indices.push_back(order[next++]);
    }
    for (int32_t j = 0; j < n; ++j)
      (*slot_of)[b].push_back(indices[indptr.back() + j / page_size] * page_size + j % page_size);
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(n == 0 ? 0 : n - (pages - 1) * page_size);
  }
  if (indices.empty()) indices.push_back(0);
  if (last.empty()) last.push_back(0);
  PagedTables t;
  t.page_size = page_size;
  t.indptr = host_ints(indptr);
  t.indices = host_ints(indices);
  t.last = host_ints(last);
  return t;
}

void expect_repeats_and_replays(Backend& be, const std::function<Tensor()>& run, Tensor clear,
                                const std::vector<float>& want) {
  EXPECT_EQ(to_f32(be, run()), want) << "repeated";
  Tensor out;
  Result<std::unique_ptr<CapturedWork>> graph = be.capture([&] { out = run(); });
  ASSERT_TRUE(graph.ok()) << graph.status().message();
  be.zero(clear);
  (*graph)->replay();
  ASSERT_TRUE(be.synchronize().ok());
  EXPECT_EQ(to_f32(be, out), want) << "graph replay";
  (*graph)->replay();
  EXPECT_EQ(to_f32(be, out), want) << "second replay";
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

double elem_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double ss = 0;
  for (float v : b) ss += static_cast<double>(v) * v;
  const double rms = b.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(b.size()));
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return std::numeric_limits<double>::infinity();
    const double scale = std::fabs(static_cast<double>(b[i])) + rms;
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    worst = std::max(worst, scale > 0 ? d / scale : d);
  }
  return worst;
}

double elem_bound(double l2_tolerance) {
  if (l2_tolerance >= 5e-3) return 4.0 / 256.0;
  if (l2_tolerance >= 5e-4) return 4.0 / 2048.0;
  return 100.0 * l2_tolerance;
}

testing::AssertionResult assert_close(const char* got_expr, const char* want_expr, const char* tol_expr,
                                      const std::vector<float>& got, const std::vector<float>& want, double tol) {
  return assert_close_bound(got_expr, want_expr, tol_expr, "elem_bound(tol)", got, want, tol, elem_bound(tol));
}

testing::AssertionResult assert_close_bound(const char* got_expr, const char* want_expr, const char* tol_expr,
                                            const char* bound_expr, const std::vector<float>& got,
                                            const std::vector<float>& want, double tol, double bound) {
  const double l2 = rel_error(got, want), elem = elem_error(got, want);
  if (l2 < tol && elem < bound) return testing::AssertionSuccess();
  size_t worst = 0;
  double worst_d = -1;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst_d)) worst = i, worst_d = d;
  }
  testing::AssertionResult r = testing::AssertionFailure();
  r << got_expr << " against " << want_expr << " (tolerance " << tol_expr << " = " << tol << "): relative L2 error "
    << l2 << ", per-element error " << elem << " (bound " << bound_expr << " = " << bound << ")";
  if (got.size() != want.size()) return r << "; sizes " << got.size() << " and " << want.size();
  if (!got.empty()) r << "; largest difference at element " << worst << ": " << got[worst] << " against " << want[worst];
  return r;
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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    ADD_FAILURE() << "cannot open " << path;
    return "";
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  path = std::filesystem::temp_directory_path() /
         ("kiln_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string TempDir::file(const std::string& name, const std::string& text) const {
  std::ofstream(path / name, std::ios::binary) << text;
  return (path / name).string();
}

std::string TempDir::sub(const std::string& name) const { return (path / name).string(); }

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

Shell shell(const std::string& cmd) {
  Shell r;
  FILE* p = popen(("{ " + cmd + "; } 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return r;
}

std::string mpirun(int ranks) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 mpirun --oversubscribe -np " +
         std::to_string(ranks) + " ";
}

int run_kiln_and_signal(const std::string& args, int after_lines, int sig, int delay_us) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return -1;
  const std::string cmd = "exec " + kiln_binary() + " " + args + " 2>/dev/null";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  FILE* out = ::fdopen(pipefd[0], "r");
  char line[4096];
  int steps = 0;
  bool sent = false;
  while (std::fgets(line, sizeof(line), out)) {
    if (std::strncmp(line, "step ", 5) == 0) ++steps;
    if (!sent && after_lines > 0 && steps == after_lines) {
      if (delay_us > 0) ::usleep(static_cast<useconds_t>(delay_us));
      ::kill(pid, sig);
      sent = true;
    }
  }
  std::fclose(out);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
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
