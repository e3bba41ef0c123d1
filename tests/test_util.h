// Helpers for kiln's tests: random host tensors, error norms, and a GPU backend that skips the
// test with a visible reason where no GPU is present.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/paged_kv.h"

namespace kiln::test {

// Host tensor of N(0, std^2) values (seeded), stored in `dtype` (f32/bf16/f16).
TensorBuffer random_host(Shape shape, DType dtype, uint64_t seed, float std = 1.0f);
// Host i32 tensor with values uniform in [lo, hi).
TensorBuffer random_ints(Shape shape, int32_t lo, int32_t hi, uint64_t seed);
TensorBuffer host_ints(const std::vector<int32_t>& values);
// A device copy of a host tensor, an uninitialised device tensor and a host copy of a host tensor;
// a failure (out of memory) aborts the test binary.
TensorBuffer upload(Backend& be, Tensor host);
TensorBuffer device_empty(Backend& be, Shape shape, DType dtype);
TensorBuffer host_copy(Tensor host);
// Host f32 copy of a float tensor of any float dtype, from any device.
std::vector<float> to_f32(Backend& be, Tensor t);
// A step run again eagerly, then captured as a graph and replayed twice, gives `want` bit for bit
// each time (kernels that keep scratch between launches must leave it as they found it); `clear`
// (the output's storage) is zeroed before the first replay, so that a replay writing nothing fails.
void expect_repeats_and_replays(Backend& be, const std::function<Tensor()>& run, Tensor clear,
                                const std::vector<float>& want);
// ||a - b|| / ||b||, with NaN anywhere giving +inf.
double rel_error(const std::vector<float>& a, const std::vector<float>& b);
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);
// max_i |a_i - b_i| / (|b_i| + rms(b)): every element against its own magnitude, floored at the
// tensor's typical one so that values near zero are judged at its scale; NaN anywhere gives +inf.
double elem_error(const std::vector<float>& a, const std::vector<float>& b);
// The per-element bound that goes with a relative-L2 tolerance, from the rounding of the result's
// type: a bf16 result (tolerance >= 5e-3) four bf16 roundings (2^-6), an f16 result or a bf16
// product kept in f32 (>= 5e-4) four f16 roundings (2^-9), an f32 result 100 x the tolerance.
double elem_bound(double l2_tolerance);
// gtest predicates of EXPECT_CLOSE(_BOUND): the relative L2 error below tol and elem_error below
// elem_bound(tol) (or the bound given), naming the worst element when not.
testing::AssertionResult assert_close(const char* got_expr, const char* want_expr, const char* tol_expr,
                                      const std::vector<float>& got, const std::vector<float>& want, double tol);
testing::AssertionResult assert_close_bound(const char* got_expr, const char* want_expr, const char* tol_expr,
                                            const char* bound_expr, const std::vector<float>& got,
                                            const std::vector<float>& want, double tol, double elem_bound);
// A device result against its reference: relative L2 error and every element (one wrong row in
// thousands fails, which the L2 norm alone lets pass).
#define EXPECT_CLOSE(got, want, tol) EXPECT_PRED_FORMAT3(::kiln::test::assert_close, got, want, tol)
// The same with a per-element bound of the caller's (for results whose rounding error scales with
// their inputs rather than with their own magnitude; the caller says why).
#define EXPECT_CLOSE_BOUND(got, want, tol, elem_bound) \
  EXPECT_PRED_FORMAT4(::kiln::test::assert_close_bound, got, want, tol, elem_bound)

// A paged KV view held in host i32 tensors (GPU tests copy them with to_device).
struct PagedTables {
  TensorBuffer indptr, indices, last;
  int32_t page_size = 1;
  PagedKV view() const { return PagedKV{indptr, indices, last, page_size}; }
};
// The view of contiguous per-request slot ranges kv_indptr[b] .. kv_indptr[b + 1] (page size 1).
PagedTables contiguous_pages(const std::vector<int32_t>& kv_indptr);
// Contexts of kv_lens[b] tokens on distinct pages of `page_size` slots drawn in a seeded random
// order from a pool of `pool_pages` pages; (*slot_of)[b][j] is the pool row of token j of request b.
PagedTables scattered_pages(const std::vector<int32_t>& kv_lens, int32_t page_size, int32_t pool_pages, uint64_t seed,
                            std::vector<std::vector<int32_t>>* slot_of);

// testdata/ of the repository and the kiln binary: the paths compiled in, unless the environment
// variables KILN_TESTDATA / KILN_BINARY say otherwise (binaries run from another checkout).
std::string testdata_dir();
std::string kiln_binary();

// The bytes of a file; a file that cannot be opened is a test failure (and gives ""), so that two
// missing files never compare equal unnoticed.
std::string read_file(const std::string& path);

// A fresh scratch folder under the system's temporary directory, removed with everything in it when
// the object goes.
struct TempDir {
  std::filesystem::path path;
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // Writes `text` to the file `name` inside the folder; returns its path.
  std::string file(const std::string& name, const std::string& text) const;
  // The path of `name` inside the folder (nothing is created).
  std::string sub(const std::string& name) const;
};

// Runs the kiln binary with `args` (a shell command line tail, e.g. "generate --model X"), optionally
// feeding `stdin_text`; captures stdout, and stdout + stderr together.
struct RunResult {
  int exit_code = -1;
  bool crashed = false;       // killed by a signal or exited with a code >= 128
  std::string output;         // stdout + stderr
  std::string stdout_only;
};
RunResult run_kiln(const std::string& args, const std::string& stdin_text = "");
// Starts `kiln <args>` (stderr discarded) and, after its `after_lines`-th stdout line starting with
// "step " (0: never), sends `sig`, after a further `delay_us`. Returns the status waitpid gives.
int run_kiln_and_signal(const std::string& args, int after_lines, int sig, int delay_us);

// Runs a shell command line; its exit code (128 + signal when killed) and stdout + stderr together.
struct Shell {
  int code = -1;
  std::string output;
};
Shell shell(const std::string& cmd);
// "mpirun -np <ranks> " with what a root CI machine with two cores needs (oversubscription, root
// allowed, one BLAS thread per rank), for a command line to follow.
std::string mpirun(int ranks);

// The CUDA backend for device 0, or nullptr; tests call GTEST_SKIP() with the reason on nullptr.
std::unique_ptr<Backend> gpu_backend_or_null(std::string* reason);

}  // namespace kiln::test

#define KILN_REQUIRE_GPU(be_var)                                      \
  std::string _kiln_skip_reason;                                      \
  auto be_var = ::kiln::test::gpu_backend_or_null(&_kiln_skip_reason); \
  if (!be_var) GTEST_SKIP() << _kiln_skip_reason
