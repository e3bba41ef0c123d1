// Post-processors of tokenizer.json (they add special tokens around a single sequence):
// TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel (ids unchanged), Sequence.
// With offsets, added tokens get {0, 0}, and ByteLevel / RobertaProcessing with trim_offsets move
// each token's offsets past its leading and trailing spaces as tokenizers' process_offsets does.
// Immutable after construction; thread-safe.
#include "core/json_text.h"
#include "model/tokenizer/components.h"

namespace kiln::tok {
namespace {

// Inserts `before` and `after` ids (offsets {0, 0}) around the sequence.
void surround_offsets(std::vector<int32_t>& ids, std::vector<Align>& offsets, const std::vector<int32_t>& before,
                      const std::vector<int32_t>& after) {
  ids.insert(ids.begin(), before.begin(), before.end());
  ids.insert(ids.end(), after.begin(), after.end());
  offsets.insert(offsets.begin(), before.size(), Align{});
  offsets.insert(offsets.end(), after.size(), Align{});
}

// tokenizers' byte-level process_offsets: leading / trailing spaces of a token (U+0120 or
// whitespace characters of its string) are cut from its offsets, except the one space a prefix
// space added to the first token.
void trim_offsets(const std::vector<int32_t>& ids, std::vector<Align>& offsets, bool add_prefix_space,
                  const OffsetContext& ctx) {
  auto spacey = [](char32_t c) { return c == 0x120 || is_whitespace(c); };
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string_view t = ctx.token(ids[k], offsets[k]);
    std::u32string cps;
    for (size_t i = 0; i < t.size();) cps.push_back(next_cp(t, i));
    size_t leading = 0, trailing = 0;
    while (leading < cps.size() && spacey(cps[leading])) ++leading;
    while (trailing < cps.size() && spacey(cps[cps.size() - 1 - trailing])) ++trailing;
    Align& o = offsets[k];
    if (leading > 0) {
      const bool first = k == 0 || o.begin == 0;
      if (first && add_prefix_space && leading == 1) leading = 0;
      for (size_t n = 0; n < leading && o.begin < o.end; ++n) {  // min(begin + leading chars, end)
        size_t i = o.begin;
        next_cp(ctx.input, i);
        o.begin = static_cast<uint32_t>(std::min<size_t>(i, o.end));
      }
    }
    if (trailing > 0) {
      size_t chars_before_end = 0;  // end >= trailing, in characters
      for (size_t i = 0; i < o.end && chars_before_end < trailing; i += utf8_len(static_cast<unsigned char>(ctx.input[i])))
        ++chars_before_end;
      if (chars_before_end >= trailing) {
        for (size_t n = 0; n < trailing && o.end > o.begin; ++n) {  // max(end - trailing chars, begin)
          size_t e = o.end - 1;
          while (e > 0 && (static_cast<unsigned char>(ctx.input[e]) & 0xC0) == 0x80) --e;
          o.end = static_cast<uint32_t>(std::max<size_t>(e, o.begin));
        }
      }
    }
  }
}

// Both TemplateProcessing and Roberta/Bert reduce, for one sequence, to ids before and after it.
class Surround final : public PostProcessor {
 public:
  // trim: RobertaProcessing's trim_offsets (with its add_prefix_space); BertProcessing has none.
  Surround(std::vector<int32_t> before, std::vector<int32_t> after, bool trim = false, bool add_prefix_space = false)
      : before_(std::move(before)), after_(std::move(after)), trim_(trim), add_prefix_space_(add_prefix_space) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }
  void process_offsets(std::vector<int32_t>& ids, std::vector<Align>& offsets, bool add_special_tokens,
                       const OffsetContext& ctx) const override {
    if (trim_) trim_offsets(ids, offsets, add_prefix_space_, ctx);
    if (add_special_tokens) surround_offsets(ids, offsets, before_, after_);
  }
 private:
  std::vector<int32_t> before_, after_;
  bool trim_, add_prefix_space_;
};

class TemplatePost final : public PostProcessor {
 public:
  // pieces: -1 for the sequence, else an index into `special`.
  TemplatePost(std::vector<std::vector<int32_t>> items) : items_(std::move(items)) {}
  void process(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    for (const auto& it : items_) {
      if (it.empty()) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), it.begin() + 1, it.end());
    }
    ids = std::move(out);
  }
  void process_offsets(std::vector<int32_t>& ids, std::vector<Align>& offsets, bool add_special_tokens,
                       const OffsetContext&) const override {
    if (!add_special_tokens) return;
    std::vector<int32_t> out;
    std::vector<Align> out_offsets;
    for (const auto& it : items_) {
      if (it.empty()) {
        out.insert(out.end(), ids.begin(), ids.end());
        out_offsets.insert(out_offsets.end(), offsets.begin(), offsets.end());
      } else {
        out.insert(out.end(), it.begin() + 1, it.end());
        out_offsets.insert(out_offsets.end(), it.size() - 1, Align{});
      }
    }
    ids = std::move(out);
    offsets = std::move(out_offsets);
  }
 private:
  std::vector<std::vector<int32_t>> items_;  // empty: the sequence; else {0, ids...}
};

// ByteLevel: ids unchanged; offsets trimmed when trim_offsets.
class ByteLevelPost final : public PostProcessor {
 public:
  ByteLevelPost(bool trim, bool add_prefix_space) : trim_(trim), add_prefix_space_(add_prefix_space) {}
  void process(std::vector<int32_t>&) const override {}
  void process_offsets(std::vector<int32_t>& ids, std::vector<Align>& offsets, bool, const OffsetContext& ctx) const override {
    if (trim_) trim_offsets(ids, offsets, add_prefix_space_, ctx);
  }
 private:
  bool trim_, add_prefix_space_;
};

class SequencePost final : public PostProcessor {
 public:
  explicit SequencePost(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
  }
  void process_offsets(std::vector<int32_t>& ids, std::vector<Align>& offsets, bool add_special_tokens,
                       const OffsetContext& ctx) const override {
    for (const auto& p : parts_) p->process_offsets(ids, offsets, add_special_tokens, ctx);
  }
 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

Result<int32_t> pair_id(const Json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 || !j[key][1].is_number_integer())
    return config_error(source, std::string("post_processor needs \"") + key + "\": [token, id]");
  return j[key][1].get<int32_t>();
}

}  // namespace

Result<std::unique_ptr<PostProcessor>> make_post_processor(const Json& j, const std::string& source) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return config_error(source, "a post_processor has no \"type\" string");
  const std::string type = j["type"];
  if (type == "TemplateProcessing") {
    const Json& specials = j.value("special_tokens", Json::object());
    std::vector<std::vector<int32_t>> items;
    for (const auto& piece : j.value("single", Json::array())) {
      if (piece.contains("Sequence")) {
        items.push_back({});
      } else if (piece.contains("SpecialToken")) {
        std::string name = piece["SpecialToken"].value("id", std::string());
        if (!specials.contains(name))
          return config_error(source, "TemplateProcessing uses special token '" + name + "' missing from special_tokens");
        std::vector<int32_t> it{0};
        for (const auto& id : specials[name].value("ids", Json::array())) it.push_back(id.get<int32_t>());
        items.push_back(std::move(it));
      } else {
        return config_error(source, "TemplateProcessing piece is neither Sequence nor SpecialToken: " + json_brief(piece));
      }
    }
    return std::unique_ptr<PostProcessor>(new TemplatePost(std::move(items)));
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    KILN_ASSIGN_OR_RETURN(int32_t cls, pair_id(j, "cls", source));
    KILN_ASSIGN_OR_RETURN(int32_t sep, pair_id(j, "sep", source));
    if (type == "BertProcessing") return std::unique_ptr<PostProcessor>(new Surround({cls}, {sep}));
    return std::unique_ptr<PostProcessor>(
        new Surround({cls}, {sep}, j.value("trim_offsets", true), j.value("add_prefix_space", true)));
  }
  if (type == "ByteLevel")
    return std::unique_ptr<PostProcessor>(new ByteLevelPost(j.value("trim_offsets", true), j.value("add_prefix_space", true)));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (const auto& p : j.value("processors", Json::array())) {
      KILN_ASSIGN_OR_RETURN(auto part, make_post_processor(p, source));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<PostProcessor>(new SequencePost(std::move(parts)));
  }
  return config_error(source, "unknown post_processor type '" + type +
                                  "' (kiln supports TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, "
                                  "Sequence)");
}

}  // namespace kiln::tok
