// Tokenizer (tokenizer.json loading, encode, decode) and StreamingDecoder; see model/tokenizer.h.
// The pipeline is tokenizers' Tokenizer::encode for one sequence: added tokens and normalizer,
// pre-tokenizer, BPE model, post-processor. Immutable after loading; thread-safe.
#include "model/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/json_text.h"
#include "model/tokenizer/components.h"

namespace kiln {
namespace tok {

struct TokenizerImpl {
  std::string source;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;
  Vocab added_by_content;
  std::vector<int32_t> added_index_by_id;  // id -> index into added.tokens(), -1 when not added
  int32_t vocab_size = 0;

  const std::string* token_of(int32_t id) const {
    if (id < 0 || id >= vocab_size) return nullptr;
    int32_t a = added_index_by_id[static_cast<size_t>(id)];
    if (a >= 0) return &added.tokens()[static_cast<size_t>(a)].decoded;
    const auto& model_tokens = model->id_to_token();
    if (static_cast<size_t>(id) < model_tokens.size() && !model_tokens[static_cast<size_t>(id)].empty())
      return &model_tokens[static_cast<size_t>(id)];
    return nullptr;
  }
  bool special(int32_t id) const {
    if (id < 0 || id >= vocab_size) return false;
    int32_t a = added_index_by_id[static_cast<size_t>(id)];
    return a >= 0 && added.tokens()[static_cast<size_t>(a)].special;
  }
};

}  // namespace tok

using tok::Json;
using tok::config_error;

Tokenizer::Tokenizer(std::unique_ptr<tok::TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open tokenizer file '" + path + "': check the path (a model folder keeps it as tokenizer.json)");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text(const std::string& text, const std::string& source) {
  // The error boundary of tokenizer.json: the component parsers check what they rely on, and any
  // other value of the wrong type (nlohmann's exception, which names the key's path) becomes an
  // error naming the file.
  try {
    return from_json_unchecked(text, source);
  } catch (const Json::exception& e) {
    return config_error(source, std::string("a value has the wrong type or is missing: ") + e.what());
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_unchecked(const std::string& text, const std::string& source) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return config_error(source, "not valid JSON (expected a Hugging Face tokenizer.json object)");
  // The components are built by recursion over nested Sequence entries.
  constexpr int64_t kMaxNesting = 64;  // tokenizers' own files nest a few levels
  if (json_depth(j) > kMaxNesting)
    return config_error(source, "nests deeper than " + std::to_string(kMaxNesting) +
                                    " levels; a tokenizer.json saved by the tokenizers library is a few levels deep");
  auto impl = std::make_unique<tok::TokenizerImpl>();
  impl->source = source;
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  if (!present("model") || !j["model"].is_object())
    return config_error(source, "no \"model\" section (is this a tokenizer.json saved by the tokenizers library?)");
  const Json& mj = j["model"];
  std::string model_type = mj.value("type", std::string(mj.contains("merges") ? "BPE" : ""));
  if (model_type != "BPE")
    return config_error(source, "unknown model type '" + model_type + "' (kiln supports BPE)");
  KILN_ASSIGN_OR_RETURN(impl->model, tok::BpeModel::from_json(mj, source));
  if (present("normalizer")) { KILN_ASSIGN_OR_RETURN(impl->normalizer, tok::make_normalizer(j["normalizer"], source)); }
  if (present("pre_tokenizer")) { KILN_ASSIGN_OR_RETURN(impl->pre_tokenizer, tok::make_pre_tokenizer(j["pre_tokenizer"], source)); }
  if (present("post_processor")) { KILN_ASSIGN_OR_RETURN(impl->post_processor, tok::make_post_processor(j["post_processor"], source)); }
  if (present("decoder")) { KILN_ASSIGN_OR_RETURN(impl->decoder, tok::make_decoder(j["decoder"], source)); }

  std::vector<tok::AddedToken> added;
  int32_t max_id = static_cast<int32_t>(impl->model->id_to_token().size()) - 1;
  const Json no_tokens = Json::array();
  for (const auto& t : present("added_tokens") ? j["added_tokens"] : no_tokens) {
    if (!t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") || !t["content"].is_string())
      return config_error(source, "an added_tokens entry needs \"id\" and \"content\": " + json_brief(t));
    if (t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > tok::kMaxTokenId)
      return config_error(source, "added token " + json_brief(t["content"]) + " has id " + json_brief(t["id"]) +
                                      "; ids go from 0 to " + std::to_string(tok::kMaxTokenId));
    tok::AddedToken a;
    a.id = t["id"].get<int32_t>();
    a.content = t["content"];
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);
    if (impl->added_by_content.count(a.content)) continue;  // tokenizers keeps the first of duplicates
    impl->added_by_content[a.content] = a.id;
    max_id = std::max(max_id, a.id);
    added.push_back(std::move(a));
  }
  impl->vocab_size = max_id + 1;
  impl->added_index_by_id.assign(static_cast<size_t>(impl->vocab_size), -1);
  for (size_t k = 0; k < added.size(); ++k) impl->added_index_by_id[static_cast<size_t>(added[k].id)] = static_cast<int32_t>(k);
  impl->added.init(std::move(added), impl->normalizer.get());
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  size_t valid = tok::valid_utf8_prefix(text);
  if (valid != text.size())
    return invalid_argument("text to encode is not valid UTF-8 (bad byte at offset " + std::to_string(valid) +
                            "): convert it to UTF-8 first");
  const tok::TokenizerImpl& t = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<tok::AddedVocabulary::Piece> pieces;
  t.added.extract_and_normalize(text, t.normalizer.get(), pieces);
  std::vector<tok::Split> splits;
  for (auto& p : pieces) {
    if (p.token >= 0) { ids.push_back(p.token); continue; }
    splits.clear();
    splits.push_back({std::move(p.text), p.at_start});
    if (t.pre_tokenizer) t.pre_tokenizer->pre_tokenize(splits);
    for (const auto& s : splits) t.model->tokenize(s.text, ids);
  }
  if (add_special_tokens && t.post_processor) t.post_processor->process(ids);
  return ids;
}

Result<EncodingWithOffsets> Tokenizer::encode_with_offsets(std::string_view text, bool add_special_tokens) const {
  size_t valid = tok::valid_utf8_prefix(text);
  if (valid != text.size())
    return invalid_argument("text to encode is not valid UTF-8 (bad byte at offset " + std::to_string(valid) +
                            "): convert it to UTF-8 first");
  if (text.size() >= (size_t(1) << 32) - 1)
    return invalid_argument("text to encode with offsets is " + std::to_string(text.size()) +
                            " bytes; offsets are tracked for texts below 4 GiB: split it");
  const tok::TokenizerImpl& t = *impl_;
  std::vector<int32_t> ids;
  std::vector<tok::Align> offsets;
  ids.reserve(text.size() / 3 + 4);
  offsets.reserve(text.size() / 3 + 4);
  std::vector<tok::AddedVocabulary::Piece> pieces;
  KILN_RETURN_IF_ERROR(t.added.extract_and_normalize_aligned(text, t.normalizer.get(), pieces));
  std::vector<tok::Split> splits;
  std::vector<uint32_t> lengths;
  for (auto& p : pieces) {
    if (p.token >= 0) {
      ids.push_back(p.token);
      offsets.push_back(p.span);
      continue;
    }
    splits.clear();
    splits.push_back({std::move(p.text), p.at_start, std::move(p.align)});
    if (t.pre_tokenizer) t.pre_tokenizer->pre_tokenize(splits);
    for (const auto& s : splits) {
      lengths.clear();
      t.model->tokenize_with_lengths(s.text, ids, lengths);
      size_t pos = 0;  // a token's bytes of the split, mapped through its alignment
      for (uint32_t n : lengths) {
        // (Lengths past the split, possible only with byte fallback of prefixed pieces, are clamped.)
        const size_t a = std::min(pos, s.align.size() - 1), b = std::min(pos + n, s.align.size());
        offsets.push_back({s.align[a].begin, s.align[std::max(a + 1, b) - 1].end});
        pos += n;
      }
    }
  }
  KILN_ASSERT(ids.size() == offsets.size());
  if (t.post_processor) {
    tok::OffsetContext ctx{[&t, text](int32_t id, tok::Align o) -> std::string_view {
                             if (o.end > o.begin && t.added_index_by_id[static_cast<size_t>(id)] >= 0)
                               return text.substr(o.begin, o.end - o.begin);
                             const std::string* s = t.token_of(id);
                             return s ? std::string_view(*s) : std::string_view();
                           },
                           text};
    t.post_processor->process_offsets(ids, offsets, add_special_tokens, ctx);
  }
  EncodingWithOffsets out;
  out.ids = std::move(ids);
  out.offsets.reserve(offsets.size());
  for (const auto& o : offsets) out.offsets.push_back({o.begin, o.end});
  return out;
}

std::optional<size_t> token_at_byte(const std::vector<TokenOffset>& offsets, size_t pos) {
  for (size_t k = 0; k < offsets.size(); ++k)
    if (pos >= offsets[k].begin && pos < offsets[k].end) return k;
  return std::nullopt;
}

Result<std::string> Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const tok::TokenizerImpl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= t.vocab_size)
      return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(t.vocab_size) + ") of '" + t.source + "'");
    const std::string* s = t.token_of(id);
    if (!s) continue;  // an id the vocabulary does not use: tokenizers skips it too
    if (skip_special_tokens && t.special(id)) continue;
    tokens.push_back(*s);
  }
  if (!t.decoder) {
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k) out.push_back(' ');
      out += tokens[k];
    }
    return out;
  }
  t.decoder->decode_chain(tokens);
  std::string out;
  for (const auto& s : tokens) out += s;
  return out;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(token);
  if (it != impl_->added_by_content.end()) return it->second;
  auto jt = impl_->model->vocab().find(token);
  if (jt != impl_->model->vocab().end()) return jt->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* s = impl_->token_of(id);
  if (!s) return std::nullopt;
  return *s;
}

bool Tokenizer::is_special(int32_t id) const { return impl_->special(id); }

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  const std::string* s = id >= 0 && id < impl_->vocab_size ? impl_->token_of(id) : nullptr;
  if (!s) return std::nullopt;
  std::string bytes = *s;
  if (impl_->decoder) impl_->decoder->token_bytes(bytes);
  return bytes;
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {}

namespace {
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
}  // namespace

Result<std::string> StreamingDecoder::push(int32_t id) {
  if (id < 0 || id >= tok_.vocab_size())
    return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(tok_.vocab_size()) + ")");
  ids_.push_back(id);
  KILN_ASSIGN_OR_RETURN(std::string text, tok_.decode(ids_, skip_special_));
  if (text.size() <= prefix_.size() || ends_with_replacement(text) || text.compare(0, prefix_.size(), prefix_) != 0)
    return std::string();
  std::string fresh = text.substr(prefix_.size());
  // Slide the window: keep the ids from the previous prefix start, so that decoders which look at
  // neighbouring tokens (leading-space rules) see the same context.
  size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  KILN_ASSIGN_OR_RETURN(prefix_, tok_.decode(ids_, skip_special_));
  prefix_index_ = new_prefix_index;
  return fresh;
}

std::string StreamingDecoder::finish() {
  auto text = tok_.decode(ids_, skip_special_);
  std::string rest;
  if (text.ok() && text.value().size() > prefix_.size()) rest = text.value().substr(prefix_.size());
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace kiln
