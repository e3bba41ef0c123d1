// Post-processors of tokenizer.json (they add special tokens around a single sequence):
// TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel (ids unchanged), Sequence.
// Immutable after construction; thread-safe.
#include "model/tokenizer/components.h"

namespace kiln::tok {
namespace {

// Both TemplateProcessing and Roberta/Bert reduce, for one sequence, to ids before and after it.
class Surround final : public PostProcessor {
 public:
  Surround(std::vector<int32_t> before, std::vector<int32_t> after) : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }
 private:
  std::vector<int32_t> before_, after_;
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
 private:
  std::vector<std::vector<int32_t>> items_;  // empty: the sequence; else {0, ids...}
};

class NoOpPost final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&) const override {}
};

class SequencePost final : public PostProcessor {
 public:
  explicit SequencePost(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
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
        return config_error(source, "TemplateProcessing piece is neither Sequence nor SpecialToken: " + piece.dump());
      }
    }
    return std::unique_ptr<PostProcessor>(new TemplatePost(std::move(items)));
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    KILN_ASSIGN_OR_RETURN(int32_t cls, pair_id(j, "cls", source));
    KILN_ASSIGN_OR_RETURN(int32_t sep, pair_id(j, "sep", source));
    return std::unique_ptr<PostProcessor>(new Surround({cls}, {sep}));
  }
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new NoOpPost());
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
