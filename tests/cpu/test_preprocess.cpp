// Preprocessing on hand-made data: best-fit-decreasing packing (which documents share a row),
// the split of long documents, target masks and rotary positions at document boundaries, the shard
// format's round trip and its damage checks, the validation split, determinism for a seed, bad
// lines reported with file and line, and the sampler's resumable position.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "train/dataset.h"
#include "train/packing.h"
#include "train/preprocess.h"
#include "train/sampler.h"
#include "train/shards.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

// A document whose ids are base, base+1, ... (so each token says where it came from), all targets.
TokenDocument doc(int32_t base, int32_t length) {
  TokenDocument d;
  for (int32_t i = 0; i < length; ++i) d.ids.push_back(base + i);
  d.mask.assign(static_cast<size_t>(length), 1);
  return d;
}

// Each row as the multiset of its piece lengths, rows sorted: the packing independent of row order.
std::vector<std::vector<size_t>> row_shapes(const PackedRows& p) {
  std::vector<std::vector<size_t>> out;
  for (const auto& row : p.rows) {
    std::vector<size_t> lens;
    for (int32_t i : row) lens.push_back(p.pieces[i].ids.size());
    std::sort(lens.begin(), lens.end());
    out.push_back(lens);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Packing, BestFitDecreasing) {
  // seq_len 10, lengths 3 7 2 5 3: decreasing 7 5 3 3 2. 7 opens row A (3 free), 5 opens B (5 free);
  // the first 3 fits A exactly (best fit: 3 free < 5 free); the second 3 goes to B (2 free), 2 fills B.
  std::vector<TokenDocument> docs = {doc(100, 3), doc(200, 7), doc(300, 2), doc(400, 5), doc(500, 3)};
  PackedRows p = pack_documents(docs, 10, /*pack=*/true, /*seed=*/1);
  std::vector<std::vector<size_t>> want = {{2, 3, 5}, {3, 7}};
  EXPECT_EQ(row_shapes(p), want);
  EXPECT_EQ(p.tokens, 20);
  EXPECT_DOUBLE_EQ(p.efficiency(10), 1.0);
  EXPECT_EQ(p.split_documents, 0);
  // Which 3-token document went where: equal lengths keep input order, so doc(100) is placed
  // first and takes row A with the 7.
  for (const auto& row : p.rows)
    for (int32_t i : row)
      if (p.pieces[i].ids[0] == 100) {
        ASSERT_EQ(row.size(), 2u);
        EXPECT_TRUE(p.pieces[row[0]].ids[0] == 200 || p.pieces[row[1]].ids[0] == 200);
      }
}

TEST(Packing, LongDocumentsSplitAndMaskEachPieceStart) {
  std::vector<TokenDocument> docs = {doc(1000, 25), doc(50, 4)};
  PackedRows p = pack_documents(docs, 10, /*pack=*/false, 0);
  ASSERT_EQ(p.pieces.size(), 4u);  // 10 + 10 + 5, then 4
  EXPECT_EQ(p.split_documents, 1);
  const std::vector<int32_t> starts = {1000, 1010, 1020, 50};
  const std::vector<size_t> lens = {10, 10, 5, 4};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(p.pieces[i].ids.front(), starts[i]);
    EXPECT_EQ(p.pieces[i].ids.size(), lens[i]);
    EXPECT_EQ(p.pieces[i].mask[0], 0) << "piece " << i << " starts a row: nothing predicts it";
    for (size_t t = 1; t < lens[i]; ++t) EXPECT_EQ(p.pieces[i].mask[t], 1);
  }
  // Unpacked: one piece per row, input order.
  ASSERT_EQ(p.rows.size(), 4u);
  for (int32_t i = 0; i < 4; ++i) EXPECT_EQ(p.rows[i], std::vector<int32_t>{i});
}

TEST(Packing, DeterministicForASeedAndSeedChangesRowOrder) {
  std::vector<TokenDocument> docs;
  for (int i = 0; i < 200; ++i) docs.push_back(doc(i * 1000, 1 + (i * 7919) % 31));
  PackedRows a = pack_documents(docs, 32, true, 5), b = pack_documents(docs, 32, true, 5),
             c = pack_documents(docs, 32, true, 6);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_NE(a.rows, c.rows);
  EXPECT_EQ(row_shapes(a), row_shapes(c));  // the seed orders rows; the packing itself is the same
  for (const auto& row : a.rows) {
    size_t used = 0;
    for (int32_t i : row) used += a.pieces[i].ids.size();
    EXPECT_LE(used, 32u);
  }
  EXPECT_GT(a.efficiency(32), 0.95);
}

TEST(Shards, RoundTripAndDamage) {
  TempDir tmp;
  const std::string path = tmp.sub("s.kshard");
  TokenDocument a = doc(10, 3), b = doc(20, 2), c = doc(30, 4);
  a.mask = {0, 1, 0};
  ShardWriter w(path);
  w.add_row({&a, &b});
  w.add_row({&c});
  ASSERT_TRUE(w.finish().ok());
  Result<Shard> s = Shard::open(path);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->rows(), 2);
  EXPECT_EQ(s->tokens(), 9);
  EXPECT_EQ(s->documents(), 3);
  ShardRow r0 = s->row(0), r1 = s->row(1);
  EXPECT_EQ(std::vector<int32_t>(r0.ids.begin(), r0.ids.end()), (std::vector<int32_t>{10, 11, 12, 20, 21}));
  EXPECT_EQ(std::vector<uint8_t>(r0.mask.begin(), r0.mask.end()), (std::vector<uint8_t>{0, 1, 0, 1, 1}));
  EXPECT_EQ(r0.doc_starts, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(std::vector<int32_t>(r1.ids.begin(), r1.ids.end()), (std::vector<int32_t>{30, 31, 32, 33}));
  EXPECT_EQ(r1.doc_starts, (std::vector<int32_t>{0}));

  // Truncated, wrong magic, and an inconsistent header are errors naming the file.
  const auto size = fs::file_size(path);
  fs::copy_file(path, tmp.sub("t.kshard"));
  fs::resize_file(tmp.sub("t.kshard"), size - 1);
  Result<Shard> t = Shard::open(tmp.sub("t.kshard"));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("t.kshard"), std::string::npos);
  EXPECT_NE(t.status().message().find("truncated"), std::string::npos);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_FALSE(Shard::open(tmp.file("m.kshard", bad_magic)).ok());
  std::string bad_offsets = bytes;
  bad_offsets[64 + 8] = 9;  // row_offsets[1] = 9: row 1 empty
  Result<Shard> o = Shard::open(tmp.file("o.kshard", bad_offsets));
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("damaged"), std::string::npos) << o.status().message();
}

// A maker that takes the ids from the line ({"ids": [...]}), all targets.
DocumentMaker ids_maker() {
  return [](const nlohmann::ordered_json& line) -> Result<TokenDocument> {
    if (!line.contains("ids") || !line["ids"].is_array()) return invalid_argument("no \"ids\" array");
    TokenDocument d;
    for (const auto& v : line["ids"]) d.ids.push_back(v.get<int32_t>());
    d.mask.assign(d.ids.size(), 1);
    return d;
  };
}

std::string jsonl_of(const std::vector<std::vector<int32_t>>& docs) {
  std::string s;
  for (const auto& d : docs) s += nlohmann::json({{"ids", d}}).dump() + "\n";
  return s;
}

PreprocessOptions options(const TempDir& tmp, const std::string& input, const std::string& out) {
  PreprocessOptions o;
  o.inputs = {input};
  o.output = tmp.sub(out);
  o.seq_len = 8;
  o.threads = 2;
  o.tokenizer_info = {{"sha256", "none"}, {"vocab_size", 384}};
  return o;
}

TEST(Preprocess, ShardsHoldEveryTokenOnceWithDocumentBoundaries) {
  TempDir tmp;
  std::vector<std::vector<int32_t>> docs;
  for (int i = 0; i < 50; ++i) {
    std::vector<int32_t> d;
    for (int t = 0; t < 1 + (i * 13) % 19; ++t) d.push_back(3 + (i * 7 + t) % 380);
    docs.push_back(d);
  }
  const std::string input = tmp.file("in.jsonl", jsonl_of(docs) + "\n   \n");  // blank lines are skipped
  PreprocessOptions o = options(tmp, input, "out");
  o.val_fraction = 0.2;
  o.seed = 3;
  Result<PreprocessReport> r = preprocess(o, ids_maker(), nullptr, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->documents, 50);
  EXPECT_EQ(r->meta["splits"]["val"]["documents"], 10);
  EXPECT_EQ(r->meta["splits"]["train"]["documents"], 40);

  // Reading both splits back: every document's tokens appear exactly once, as contiguous pieces of at
  // most 8 tokens; positions restart at each piece; the first token of a piece is never a target.
  ModelConfig config;
  config.vocab_size = 384;
  config.max_position_embeddings = 256;
  std::multiset<std::vector<int32_t>> pieces_seen;
  int64_t tokens = 0;
  for (const char* split : {"train", "val"}) {
    Result<std::unique_ptr<TrainingData>> data = TrainingData::open(o.output, split, config, tmp.sub("no-model"));
    ASSERT_TRUE(data.ok()) << data.status().message();
    for (int64_t row = 0; row < (*data)->rows(); ++row) {
      const TrainExample ex = (*data)->example(row, /*every_token=*/false);
      ASSERT_LE(ex.input_ids.size(), 8u);
      std::vector<int32_t> piece;
      for (size_t t = 0; t < ex.input_ids.size(); ++t) {
        if (ex.position_ids[t] == 0) {
          if (!piece.empty()) pieces_seen.insert(piece);
          piece.clear();
          EXPECT_EQ(ex.labels[t], -100);
        } else {
          EXPECT_EQ(ex.position_ids[t], ex.position_ids[t - 1] + 1);
          EXPECT_EQ(ex.labels[t], ex.input_ids[t]);
        }
        piece.push_back(ex.input_ids[t]);
        ++tokens;
      }
      pieces_seen.insert(piece);
    }
  }
  std::multiset<std::vector<int32_t>> pieces_want;
  for (const auto& d : docs)
    for (size_t b = 0; b < d.size(); b += 8)
      pieces_want.insert(std::vector<int32_t>(d.begin() + b, d.begin() + std::min(d.size(), b + 8)));
  EXPECT_EQ(pieces_seen, pieces_want);

  // Deterministic: the same input and seed give byte-identical shards; another seed another order.
  PreprocessOptions again = options(tmp, input, "again");
  again.val_fraction = 0.2;
  again.seed = 3;
  ASSERT_TRUE(preprocess(again, ids_maker(), nullptr, nullptr).ok());
  for (const char* f : {"train-00000.kshard", "val-00000.kshard"})
    EXPECT_EQ(*sha256_file(o.output + "/" + f), *sha256_file(again.output + "/" + f)) << f;
  PreprocessOptions other = options(tmp, input, "other");
  other.val_fraction = 0.2;
  other.seed = 4;
  ASSERT_TRUE(preprocess(other, ids_maker(), nullptr, nullptr).ok());
  EXPECT_NE(*sha256_file(o.output + "/train-00000.kshard"), *sha256_file(other.output + "/train-00000.kshard"));

  // An existing output is kept unless asked.
  Result<PreprocessReport> twice = preprocess(options(tmp, input, "out"), ids_maker(), nullptr, nullptr);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("--overwrite"), std::string::npos);
}

TEST(Preprocess, SmallShardsSplitTheRows) {
  TempDir tmp;
  std::vector<std::vector<int32_t>> docs(30, std::vector<int32_t>{5, 6, 7, 8, 9, 10, 11, 12});
  PreprocessOptions o = options(tmp, tmp.file("in.jsonl", jsonl_of(docs)), "out");
  o.shard_tokens = 20;  // two rows of 8 per shard
  Result<PreprocessReport> r = preprocess(o, ids_maker(), nullptr, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->meta["splits"]["train"]["shards"].size(), 15u);
  ModelConfig config;
  config.vocab_size = 384;
  config.max_position_embeddings = 8;
  Result<std::unique_ptr<TrainingData>> data = TrainingData::open(o.output, "train", config, tmp.sub("none"));
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ((*data)->rows(), 30);
  EXPECT_EQ((*data)->example(29, true).input_ids, docs[0]);
  config.max_position_embeddings = 7;  // rows longer than the model's context are refused
  EXPECT_FALSE(TrainingData::open(o.output, "train", config, tmp.sub("none")).ok());
}

TEST(Preprocess, BadLinesNameFileAndLine) {
  TempDir tmp;
  const std::string input = tmp.file("in.jsonl", "{\"ids\": [1, 2, 3]}\n[1, 2]\n{\"ids\": [4, 5]}\nnot json\n{\"x\": 1}\n");
  Result<PreprocessReport> fatal = preprocess(options(tmp, input, "a"), ids_maker(), nullptr, nullptr);
  ASSERT_FALSE(fatal.ok());
  EXPECT_NE(fatal.status().message().find("in.jsonl:2: expected a JSON object"), std::string::npos)
      << fatal.status().message();
  EXPECT_FALSE(fs::exists(tmp.sub("a/meta.json")));
  PreprocessOptions skip = options(tmp, input, "b");
  skip.skip_bad_lines = true;
  std::vector<std::string> warnings;
  Result<PreprocessReport> r =
      preprocess(skip, ids_maker(), [&](const std::string& w) { warnings.push_back(w); }, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->bad_lines, 3);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_NE(warnings[1].find("in.jsonl:4: not valid JSON"), std::string::npos) << warnings[1];
  EXPECT_NE(warnings[2].find("in.jsonl:5: no \"ids\" array"), std::string::npos) << warnings[2];
  EXPECT_EQ(r->documents, 2);
}

TEST(DataSampler, ResumesExactlyAndRefusesOtherData) {
  Sampler a(13, /*shuffle=*/true, 42);
  std::vector<int64_t> first = a.next(20);  // crosses into epoch 1
  std::vector<int64_t> epoch0(first.begin(), first.begin() + 13);
  std::sort(epoch0.begin(), epoch0.end());
  for (int64_t i = 0; i < 13; ++i) EXPECT_EQ(epoch0[i], i);  // a permutation per epoch
  EXPECT_EQ(a.epoch(), 1);
  const nlohmann::json saved = a.state();
  Sampler b(13, true, 42);
  ASSERT_TRUE(b.restore(saved).ok());
  EXPECT_EQ(a.next(30), b.next(30));
  Sampler c(14, true, 42), d(13, true, 7), e(13, false, 42);
  EXPECT_FALSE(c.restore(saved).ok());
  EXPECT_FALSE(d.restore(saved).ok());
  EXPECT_FALSE(e.restore(saved).ok());
  Sampler plain(4, false, 0);
  EXPECT_EQ(plain.next(6), (std::vector<int64_t>{0, 1, 2, 3, 0, 1}));
}

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // one million 'a', fed in uneven pieces
  const std::string piece(997, 'a');
  int64_t left = 1000000;
  while (left > 0) {
    const int64_t n = std::min<int64_t>(left, 997);
    h.update(std::string_view(piece.data(), static_cast<size_t>(n)));
    left -= n;
  }
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace kiln::test
