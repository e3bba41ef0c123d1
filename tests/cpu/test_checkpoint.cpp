// Tests of safetensors reading and writing, checkpoint lookup and tensor loading (dtype
// conversion, sharded indexes), and that every bad file is a clear error naming the file or tensor.
// Bad inputs are written to a temporary folder that each test removes again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "model_loading_test.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

// ---- checkpoints --------------------------------------------------------------------------

// The tensors a config implies, named as transformers names them.
std::map<std::string, Shape> expected_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  std::map<std::string, Shape> out;
  out["model.embed_tokens.weight"] = {V, H};
  out["model.norm.weight"] = {H};
  if (!c.tie_word_embeddings) out["lm_head.weight"] = {V, H};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out[p + "input_layernorm.weight"] = {H};
    out[p + "post_attention_layernorm.weight"] = {H};
    out[p + "self_attn.q_proj.weight"] = {q, H};
    out[p + "self_attn.k_proj.weight"] = {kv, H};
    out[p + "self_attn.v_proj.weight"] = {kv, H};
    out[p + "self_attn.o_proj.weight"] = {H, q};
    if (c.attention_bias) {
      out[p + "self_attn.q_proj.bias"] = {q};
      out[p + "self_attn.k_proj.bias"] = {kv};
      out[p + "self_attn.v_proj.bias"] = {kv};
    }
    if (c.o_proj_bias) out[p + "self_attn.o_proj.bias"] = {H};
    if (c.qk_norm) {
      out[p + "self_attn.q_norm.weight"] = {c.head_dim};
      out[p + "self_attn.k_norm.weight"] = {c.head_dim};
    }
    out[p + "mlp.gate_proj.weight"] = {I, H};
    out[p + "mlp.up_proj.weight"] = {I, H};
    out[p + "mlp.down_proj.weight"] = {H, I};
  }
  return out;
}

TEST(Checkpoint, FixturesHoldEveryTensorWithTheExpectedShape) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  for (const std::string& dir : {kTinyLlama, kTinyQwen2}) {
    SCOPED_TRACE(dir);
    Result<ModelConfig> c = load_model_config(dir);
    ASSERT_TRUE(c.ok()) << c.status().message();
    Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
    std::map<std::string, Shape> want = expected_tensors(*c);
    std::vector<std::string> names = ckpt->names();
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), want.size());
    for (const std::string& n : names) EXPECT_TRUE(want.count(n)) << "unexpected tensor " << n;
    for (const auto& [name, shape] : want) {
      Result<TensorInfo> info = ckpt->find(name);
      ASSERT_TRUE(info.ok()) << info.status().message();
      EXPECT_EQ(info->shape, shape) << name;
      EXPECT_EQ(info->dtype, DType::f32) << name;
      EXPECT_NE(info->file.find("model.safetensors"), std::string::npos);

      Result<TensorBuffer> w = load_tensor(*be, *ckpt, name, shape, DType::f32);
      ASSERT_TRUE(w.ok()) << w.status().message();
      EXPECT_EQ(w->shape(), shape);
      EXPECT_EQ(std::memcmp(w->view().data, info->data, static_cast<size_t>(info->nbytes())), 0) << name;
    }
  }
}

TEST(Checkpoint, LoadConvertsDtypes) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(kTinyLlama);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  Result<TensorInfo> info = ckpt->find(name);
  ASSERT_TRUE(info.ok());
  std::vector<float> src(static_cast<size_t>(info->shape.numel()));
  std::memcpy(src.data(), info->data, src.size() * 4);

  Result<TensorBuffer> b = load_tensor(*be, *ckpt, name, {64, 64}, DType::bf16);
  ASSERT_TRUE(b.ok()) << b.status().message();
  Result<TensorBuffer> h = load_tensor(*be, *ckpt, name, {64, 64}, DType::f16);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(b->view().dtype, DType::bf16);
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(b->ptr<uint16_t>()[i], f32_to_bf16(src[i])) << i;
    ASSERT_EQ(h->ptr<uint16_t>()[i], f32_to_f16(src[i])) << i;
  }

  // bf16 / f16 files load back to f32 exactly and convert across 16-bit formats.
  TempDir tmp;
  ASSERT_TRUE(write_safetensors(tmp.sub("model.safetensors"), {{"b", b->view()}, {"h", h->view()}}, {}).ok());
  Result<SafetensorsCheckpoint> c16 = SafetensorsCheckpoint::open(tmp.path.string());
  ASSERT_TRUE(c16.ok()) << c16.status().message();
  Result<TensorBuffer> b32 = load_tensor(*be, *c16, "b", {64, 64}, DType::f32);
  Result<TensorBuffer> h2b = load_tensor(*be, *c16, "h", {64, 64}, DType::bf16);
  ASSERT_TRUE(b32.ok() && h2b.ok());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(b32->ptr<float>()[i], bf16_to_f32(f32_to_bf16(src[i]))) << i;
    ASSERT_EQ(h2b->ptr<uint16_t>()[i], f32_to_bf16(f16_to_f32(f32_to_f16(src[i])))) << i;
  }
}

// Writes tiny-llama's tensors as two shards plus an index into `dir`; returns the weight map.
json write_sharded(const std::string& dir) {
  Result<SafetensorsFile> f = SafetensorsFile::open(kTinyLlama + "/model.safetensors");
  KILN_ASSERT(f.ok());
  std::vector<std::pair<std::string, Tensor>> shard[2];
  json weight_map = json::object();
  int i = 0;
  for (const std::string& name : f->names()) {
    TensorInfo info = f->find(name).value();
    Tensor t;
    t.data = const_cast<void*>(info.data);
    t.dtype = info.dtype;
    t.shape = info.shape;
    int s = (i++ % 2);
    shard[s].push_back({name, t});
    weight_map[name] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  for (int s = 0; s < 2; ++s) {
    Status st = write_safetensors(dir + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors", shard[s],
                                  {{"format", "pt"}});
    KILN_ASSERT(st.ok());
  }
  json index = {{"metadata", {{"total_size", 541952}}}, {"weight_map", weight_map}};
  write_json(dir + "/model.safetensors.index.json", index);
  return index;
}

TEST(Checkpoint, ShardedIndex) {
  TempDir tmp;
  write_sharded(tmp.path.string());
  Result<SafetensorsCheckpoint> sharded = SafetensorsCheckpoint::open(tmp.path.string());
  ASSERT_TRUE(sharded.ok()) << sharded.status().message();
  Result<SafetensorsCheckpoint> single = SafetensorsCheckpoint::open(kTinyLlama);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(sharded->names(), single->names());
  std::set<std::string> files;
  for (const std::string& name : single->names()) {
    TensorInfo a = sharded->find(name).value();
    TensorInfo b = single->find(name).value();
    EXPECT_EQ(a.shape, b.shape);
    ASSERT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(b.nbytes())), 0) << name;
    files.insert(a.file);
  }
  EXPECT_EQ(files.size(), 2u);
}

TEST(Safetensors, WriteRoundTrip) {
  TempDir tmp;
  TensorBuffer a = host_empty({3, 5}, DType::f32);
  for (int i = 0; i < 15; ++i) a.ptr<float>()[i] = 0.25f * i - 1.0f;
  TensorBuffer b = host_empty({7}, DType::bf16);  // 14 bytes: the next tensor starts unaligned
  for (int i = 0; i < 7; ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(static_cast<float>(i));
  TensorBuffer c = host_empty({2, 2}, DType::i64);
  for (int i = 0; i < 4; ++i) c.ptr<int64_t>()[i] = -5 + (int64_t{1} << 40) * i;
  TensorBuffer d = host_empty({3}, DType::i32);
  for (int i = 0; i < 3; ++i) d.ptr<int32_t>()[i] = 100 * i - 7;
  TensorBuffer e = host_empty({2, 0}, DType::f16);
  TensorBuffer f = host_empty({}, DType::f32);  // a scalar
  f.ptr<float>()[0] = 3.5f;
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"z.first", a}, {"b", b}, {"c", c}, {"d", d}, {"empty", e}, {"scalar", f}};
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "42"}};
  const std::string path = tmp.sub("out.safetensors");
  Status st = write_safetensors(path, tensors, meta);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(fs::exists(path + ".partial"));

  std::string bytes = read_file(path);
  uint64_t n = header_length(bytes);
  EXPECT_EQ(n % 8, 0u);
  // Data in the given order, contiguous.
  json header = json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["z.first"]["data_offsets"], json({0, 60}));
  EXPECT_EQ(header["b"]["data_offsets"], json({60, 74}));
  EXPECT_EQ(header["c"]["dtype"], "I64");
  EXPECT_EQ(bytes.size(), 8 + n + 60 + 14 + 32 + 12 + 0 + 4);

  Result<SafetensorsFile> r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->metadata(), meta);
  EXPECT_EQ(r->names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    Result<TensorInfo> info = r->find(name);
    ASSERT_TRUE(info.ok()) << info.status().message();
    EXPECT_EQ(info->dtype, t.dtype) << name;
    EXPECT_EQ(info->shape, t.shape) << name;
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(info->data, t.data, static_cast<size_t>(t.nbytes())), 0) << name;
    }
  }

  // The fixture rewritten tensor by tensor gives back the same tensors.
  Result<SafetensorsFile> fixture = SafetensorsFile::open(kTinyQwen2 + "/model.safetensors");
  ASSERT_TRUE(fixture.ok());
  std::vector<std::pair<std::string, Tensor>> all;
  for (const std::string& name : fixture->names()) {
    TensorInfo info = fixture->find(name).value();
    Tensor t;
    t.data = const_cast<void*>(info.data);
    t.dtype = info.dtype;
    t.shape = info.shape;
    all.push_back({name, t});
  }
  ASSERT_TRUE(write_safetensors(tmp.sub("copy.safetensors"), all, fixture->metadata()).ok());
  Result<SafetensorsFile> copy = SafetensorsFile::open(tmp.sub("copy.safetensors"));
  ASSERT_TRUE(copy.ok()) << copy.status().message();
  EXPECT_EQ(copy->metadata().at("format"), "pt");
  for (const auto& [name, t] : all) {
    TensorInfo info = copy->find(name).value();
    EXPECT_EQ(info.shape, t.shape);
    EXPECT_EQ(std::memcmp(info.data, t.data, static_cast<size_t>(t.nbytes())), 0) << name;
  }
}

TEST(Safetensors, WriteErrors) {
  TempDir tmp;
  TensorBuffer a = host_empty({2}, DType::f32);
  a.ptr<float>()[0] = a.ptr<float>()[1] = 0;
  expect_error(write_safetensors(tmp.sub("x.safetensors"), {{"a", a}, {"a", a}}, {}), {"'a'", "twice"},
               StatusCode::invalid_argument);
  expect_error(write_safetensors(tmp.sub("x.safetensors"), {{"__metadata__", a}}, {}), {"__metadata__"},
               StatusCode::invalid_argument);
  Tensor dev = a.view();
  dev.device = Device::cuda(0);
  expect_error(write_safetensors(tmp.sub("x.safetensors"), {{"g", dev}}, {}), {"'g'", "cuda:0", "host"},
               StatusCode::invalid_argument);
  const std::string bad = tmp.sub("no/such/folder/x.safetensors");
  expect_error(write_safetensors(bad, {{"a", a}}, {}), {bad}, StatusCode::io_error);
}

// ---- safetensors / checkpoint errors ------------------------------------------------------

TEST(SafetensorsErrors, MissingFolderAndFiles) {
  const std::string missing = (fs::temp_directory_path() / "kiln_no_such_model_folder_xyz").string();
  expect_error(SafetensorsCheckpoint::open(missing), {missing}, StatusCode::not_found);
  TempDir tmp;
  expect_error(SafetensorsCheckpoint::open(tmp.path.string()),
               {tmp.sub("model.safetensors"), tmp.sub("model.safetensors.index.json")}, StatusCode::not_found);
  expect_error(SafetensorsFile::open(tmp.sub("nope.safetensors")), {tmp.sub("nope.safetensors")},
               StatusCode::not_found);
}

TEST(SafetensorsErrors, Truncated) {
  TempDir tmp;
  const std::string fixture = read_file(kTinyLlama + "/model.safetensors");
  const uint64_t n = header_length(fixture);
  const std::string path = tmp.sub("model.safetensors");

  write_bytes(path, fixture.substr(0, 5));
  expect_error(SafetensorsFile::open(path), {path, "too short"}, StatusCode::invalid_argument);

  write_bytes(path, fixture.substr(0, 8 + n / 2));  // cut in the middle of the header
  expect_error(SafetensorsFile::open(path), {path, "header length", "truncated"}, StatusCode::invalid_argument);

  // Cut in the middle of the data: the first tensor (in name order) past the cut is reported.
  const size_t data_bytes = fixture.size() - 8 - n;
  write_bytes(path, fixture.substr(0, 8 + n + data_bytes / 2));
  Result<SafetensorsFile> r = SafetensorsFile::open(path);
  expect_error(r, {path, "tensor '", "data_offsets", "truncated"}, StatusCode::invalid_argument);
  // ... and through the checkpoint too.
  expect_error(SafetensorsCheckpoint::open(tmp.path.string()), {path, "data_offsets"}, StatusCode::invalid_argument);
}

TEST(SafetensorsErrors, CorruptHeader) {
  TempDir tmp;
  const std::string path = tmp.sub("bad.safetensors");
  std::string fixture = read_file(kTinyLlama + "/model.safetensors");

  std::string corrupt = fixture;
  const size_t colon = corrupt.find("\"dtype\":") + 7;
  ASSERT_LT(colon, 8 + header_length(fixture));
  corrupt[colon] = ' ';  // "dtype" "F32": no longer JSON
  write_bytes(path, corrupt);
  expect_error(SafetensorsFile::open(path), {path, "not valid JSON"}, StatusCode::invalid_argument);

  std::string huge = fixture;
  uint64_t len = fixture.size() * 2;
  for (int i = 0; i < 8; ++i) huge[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  write_bytes(path, huge);
  expect_error(SafetensorsFile::open(path), {path, "header length", std::to_string(len)}, StatusCode::invalid_argument);

  std::string all_ones = fixture;
  for (int i = 0; i < 8; ++i) all_ones[i] = static_cast<char>(0xff);
  write_bytes(path, all_ones);
  expect_error(SafetensorsFile::open(path), {path, "header length"}, StatusCode::invalid_argument);

  write_bytes(path, raw_safetensors("[1, 2, 3]", ""));
  expect_error(SafetensorsFile::open(path), {path, "object"}, StatusCode::invalid_argument);
}

TEST(SafetensorsErrors, BadEntries) {
  TempDir tmp;
  const std::string path = tmp.sub("bad.safetensors");
  const std::string data(16, '\0');
  struct Case {
    const char* header;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", "dtype"},
      {R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", "shape"},
      {R"({"w": {"dtype": "F32", "shape": [2]}})", "data_offsets"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", "data_offsets"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 24]}})", "data section"},     // out of range
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 4]}})", "begin <= end"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", "non-negative"},
      {R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}})", "needs 4 x 4 bytes"},  // size mismatch
      {R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})", "non-negative"},
      {R"({"w": [1, 2]})", "dtype, shape and data_offsets"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    write_bytes(path, raw_safetensors(c.header, data));
    expect_error(SafetensorsFile::open(path), {path, "tensor 'w'", c.expect}, StatusCode::invalid_argument);
  }
  // Overlapping tensors are allowed; metadata is skipped.
  write_bytes(path, raw_safetensors(R"({"__metadata__": {"k": "v"}, "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "I32", "shape": [2], "data_offsets": [8, 16]}})",
                                    data));
  Result<SafetensorsFile> ok = SafetensorsFile::open(path);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ok->metadata().at("k"), "v");
}

TEST(SafetensorsErrors, UnsupportedDtypeOnlyWhenRequested) {
  TempDir tmp;
  const std::string path = tmp.sub("model.safetensors");
  write_bytes(path, raw_safetensors(R"({"d": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]},
      "q": {"dtype": "Q4_K", "shape": [3], "data_offsets": [8, 10]},
      "u": {"dtype": "U8", "shape": [2, 3], "data_offsets": [10, 16]},
      "f": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                                    std::string(16, '\0')));
  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->find("f").ok());
  expect_error(f->find("d"), {"tensor 'd'", path, "F64"}, StatusCode::unsupported);
  expect_error(f->find("q"), {"tensor 'q'", path, "Q4_K"}, StatusCode::unsupported);
  expect_error(f->find("u"), {"tensor 'u'", path, "U8"}, StatusCode::unsupported);

  Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(tmp.path.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  std::unique_ptr<Backend> be = make_cpu_backend();
  expect_error(load_tensor(*be, *ckpt, "d", {1}, DType::f32), {"tensor 'd'", path, "F64"}, StatusCode::unsupported);
}

TEST(CheckpointErrors, MissingTensorShapeAndDtypeMismatch) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(kTinyLlama);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  expect_error(ckpt->find("model.layers.7.mlp.up_proj.weight"), {"'model.layers.7.mlp.up_proj.weight'", kTinyLlama},
               StatusCode::not_found);
  expect_error(load_tensor(*be, *ckpt, "lm_head.bias", {384}, DType::f32), {"'lm_head.bias'", kTinyLlama},
               StatusCode::not_found);

  const std::string file = kTinyLlama + "/model.safetensors";
  Result<TensorBuffer> r = load_tensor(*be, *ckpt, "model.layers.0.self_attn.k_proj.weight", {64, 64}, DType::f32);
  expect_error(r,
               {"tensor 'model.layers.0.self_attn.k_proj.weight' in " + file +
                " has shape [32, 64] but the config implies [64, 64]"},
               StatusCode::invalid_argument);
  expect_error(load_tensor(*be, *ckpt, "model.norm.weight", {64, 1}, DType::f32), {"[64]", "[64, 1]"},
               StatusCode::invalid_argument);
  expect_error(load_tensor(*be, *ckpt, "model.norm.weight", {64}, DType::i32), {"'model.norm.weight'", "i32"},
               StatusCode::invalid_argument);

  TempDir tmp;
  TensorBuffer ids = host_empty({4}, DType::i64);
  for (int i = 0; i < 4; ++i) ids.ptr<int64_t>()[i] = i;
  ASSERT_TRUE(write_safetensors(tmp.sub("model.safetensors"), {{"ids", ids}}, {}).ok());
  Result<SafetensorsCheckpoint> ints = SafetensorsCheckpoint::open(tmp.path.string());
  ASSERT_TRUE(ints.ok()) << ints.status().message();
  expect_error(load_tensor(*be, *ints, "ids", {4}, DType::f32),
               {"dtype mismatch", "'ids'", tmp.sub("model.safetensors"), "i64"}, StatusCode::invalid_argument);
}

TEST(CheckpointErrors, ShardedIndexProblems) {
  TempDir tmp;
  json index = write_sharded(tmp.path.string());
  const std::string index_path = tmp.sub("model.safetensors.index.json");

  fs::remove(tmp.sub("model-00002-of-00002.safetensors"));
  expect_error(SafetensorsCheckpoint::open(tmp.path.string()),
               {index_path, "model-00002-of-00002.safetensors", tmp.sub("model-00002-of-00002.safetensors"),
                "does not exist"},
               StatusCode::not_found);

  json wrong = index;
  wrong["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  wrong["weight_map"]["not.in.any.shard"] = "model-00001-of-00002.safetensors";
  for (auto& [k, v] : wrong["weight_map"].items()) v = "model-00001-of-00002.safetensors";
  write_json(index_path, wrong);
  expect_error(SafetensorsCheckpoint::open(tmp.path.string()), {index_path, "has no such tensor"},
               StatusCode::invalid_argument);

  write_bytes(index_path, "{\"weight_map\": {\"a\": ");
  expect_error(SafetensorsCheckpoint::open(tmp.path.string()), {index_path, "not valid JSON"}, StatusCode::invalid_argument);
  write_json(index_path, json{{"metadata", json::object()}});
  expect_error(SafetensorsCheckpoint::open(tmp.path.string()), {index_path, "weight_map"}, StatusCode::invalid_argument);
  write_json(index_path, json{{"weight_map", {{"a", 3}}}});
  expect_error(SafetensorsCheckpoint::open(tmp.path.string()), {index_path, "'a'"}, StatusCode::invalid_argument);
}

}  // namespace
}  // namespace kiln::test
