// Every code point through every tokenizer component that depends on Unicode data, compared with
// the Python `tokenizers` library: testdata/tokenizers/unicode/scan.json holds, per scan, the CRC-32
// of the reference outputs of each block of 1024 code points (tests/reference/make_unicode_scan.py
// says how the outputs are serialized; its --explain mode prints the reference for one code point).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "model/tokenizer.h"
#include "model/tokenizer/components.h"
#include "test_util.h"

namespace kiln {
namespace {

using nlohmann::json;

std::string scan_path() { return test::testdata_dir() + "/tokenizers/unicode/scan.json"; }

const json& scan_file() {
  static const json j = [] {
    std::ifstream in(scan_path());
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  }();
  return j;
}

// A scan's name as a gtest parameter name ('-' is not allowed there).
std::string test_name(const json& scan) {
  std::string n = scan["name"];
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

std::vector<std::string> scan_names() {
  std::vector<std::string> names;
  const json& j = scan_file();
  if (!j.is_object()) return {"missing_scan_file"};
  for (const auto& s : j["scans"]) names.push_back(test_name(s));
  return names;
}

struct Crc32 {
  std::array<uint32_t, 256> table{};
  Crc32() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
  }
  uint32_t update(uint32_t crc, std::string_view s) const {
    uint32_t c = crc ^ 0xFFFFFFFFu;
    for (unsigned char b : s) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
  }
};

// Serializes one probe's output exactly as make_unicode_scan.py does.
using Runner = std::function<void(const std::string& probe, std::string& out)>;

Runner make_runner(const json& scan) {
  std::string kind = scan["kind"];
  const std::string src = "scan " + scan["name"].get<std::string>();
  if (kind == "normalizer") {
    auto r = tok::make_normalizer(scan["component"], src);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return nullptr;
    std::shared_ptr<tok::Normalizer> n = std::move(r).value();
    return [n](const std::string& probe, std::string& out) {
      std::string s = probe;
      n->normalize(s);
      out += s;
      out += '\xFF';
    };
  }
  if (kind == "pre_tokenizer") {
    auto r = tok::make_pre_tokenizer(scan["component"], src);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return nullptr;
    std::shared_ptr<tok::PreTokenizer> p = std::move(r).value();
    return [p](const std::string& probe, std::string& out) {
      std::vector<tok::Split> splits{{probe, true}};
      p->pre_tokenize(splits);
      for (const auto& s : splits) {
        out += s.text;
        out += '\xFE';
      }
      out += '\xFF';
    };
  }
  auto r = Tokenizer::from_file(test::testdata_dir() + "/tokenizers/" + scan["file"].get<std::string>());
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return nullptr;
  std::shared_ptr<Tokenizer> t = std::move(r).value();
  return [t](const std::string& probe, std::string& out) {
    auto ids = t->encode(probe, false);
    if (!ids.ok()) {
      out += "error: " + ids.status().message();
    } else {
      for (int32_t id : *ids) out += std::to_string(id) + ",";
    }
    out += '\xFF';
  };
}

class UnicodeScan : public ::testing::TestWithParam<std::string> {};

TEST_P(UnicodeScan, EveryCodePointMatchesTokenizers) {
  const json& file = scan_file();
  ASSERT_TRUE(file.is_object()) << "cannot read " << scan_path();
  const json* scan = nullptr;
  for (const auto& s : file["scans"])
    if (test_name(s) == GetParam()) scan = &s;
  ASSERT_NE(scan, nullptr);
  const int64_t block = file["block"];
  std::vector<uint32_t> want;
  {
    std::istringstream in((*scan)["crc32"].get<std::string>());
    std::string h;
    while (in >> h) want.push_back(static_cast<uint32_t>(std::stoul(h, nullptr, 16)));
  }
  ASSERT_EQ(static_cast<int64_t>(want.size()) * block, 0x110000);
  Runner run = make_runner(*scan);
  ASSERT_TRUE(run);
  std::vector<std::string> probes;
  for (const auto& p : (*scan)["probes"]) probes.push_back(p);

  auto fill = [](const std::string& p, const std::string& ch, std::string& text) {
    text.clear();
    for (size_t i = 0; i < p.size(); ++i) {
      if (p.compare(i, 2, "{}") == 0) { text += ch; ++i; } else { text += p[i]; }
    }
  };
  if (const char* explain = std::getenv("KILN_UNICODE_EXPLAIN")) {  // kiln's side of --explain
    std::string ch, text, out;
    tok::append_utf8(ch, static_cast<char32_t>(std::stoul(explain, nullptr, 16)));
    for (const auto& p : probes) {
      fill(p, ch, text);
      out.clear();
      run(text, out);
      std::printf("%s probe %s -> ", GetParam().c_str(), p.c_str());
      for (unsigned char b : out) std::printf(b >= 0x20 && b < 0x7F ? "%c" : "\\x%02x", b);
      std::printf("\n");
    }
  }

  const Crc32 crc;
  const int64_t blocks = static_cast<int64_t>(want.size());
  std::vector<uint32_t> got(want.size(), 0);
  auto work = [&](int64_t first, int64_t step) {
    std::string ch, text, out;
    for (int64_t b = first; b < blocks; b += step) {
      uint32_t c32 = 0;
      for (int64_t cp = b * block; cp < (b + 1) * block; ++cp) {
        if (cp >= 0xD800 && cp < 0xE000) continue;
        ch.clear();
        tok::append_utf8(ch, static_cast<char32_t>(cp));
        out.clear();
        for (const auto& p : probes) {
          fill(p, ch, text);
          run(text, out);
        }
        c32 = crc.update(c32, out);
      }
      got[static_cast<size_t>(b)] = c32;
    }
  };
  const int threads = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work, t, threads);
  for (auto& t : pool) t.join();

  int bad = 0;
  std::ostringstream where;
  for (int64_t b = 0; b < blocks; ++b) {
    if (got[static_cast<size_t>(b)] == want[static_cast<size_t>(b)]) continue;
    if (++bad <= 12) {
      char buf[40];
      std::snprintf(buf, sizeof(buf), " U+%04llX..U+%04llX", static_cast<long long>(b * block),
                    static_cast<long long>((b + 1) * block - 1));
      where << buf;
    }
  }
  EXPECT_EQ(bad, 0) << (*scan)["name"].get<std::string>() << ": " << bad << " of " << blocks
                    << " blocks differ from tokenizers " << file["tokenizers"].get<std::string>() << ":"
                    << where.str() << "\n(python3 tests/reference/make_unicode_scan.py --explain NAME HEXCP "
                    << "prints the reference output of one code point)";
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, UnicodeScan, ::testing::ValuesIn(scan_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
