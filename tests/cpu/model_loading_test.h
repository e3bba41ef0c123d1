// Shared helpers of the model-folder loading tests (test_model_config.cpp: config.json and RoPE;
// test_checkpoint.cpp: safetensors and checkpoints): bad inputs written byte for byte into a
// TempDir, and assertions that an error names what is wrong.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "test_util.h"

namespace kiln::test {

using nlohmann::json;

inline const std::string kTinyLlama = testdata_dir() + "/tiny-llama";
inline const std::string kTinyQwen2 = testdata_dir() + "/tiny-qwen2";

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline json read_json(const std::string& path) { return json::parse(read_file(path)); }

inline void write_json(const std::string& path, const json& j) { write_bytes(path, j.dump(2)); }

// A safetensors file from a header text and a data section, byte for byte.
inline std::string raw_safetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

inline uint64_t header_length(const std::string& file_bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file_bytes[i]);
  return n;
}

// Asserts a non-ok status whose message contains every one of `parts`.
template <typename S>
inline void expect_error(const S& st, std::initializer_list<std::string> parts, StatusCode code) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << *parts.begin();
  EXPECT_EQ(static_cast<int>(st.code()), static_cast<int>(code)) << st.message();
  for (const std::string& p : parts) EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' not in: " << st.message();
}
template <typename T>
inline void expect_error(const Result<T>& r, std::initializer_list<std::string> parts, StatusCode code) {
  expect_error(r.status(), parts, code);
  EXPECT_FALSE(r.ok());
}

// Units in the last place between two floats (same sign assumed).
inline int64_t ulp_diff(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

}  // namespace kiln::test
