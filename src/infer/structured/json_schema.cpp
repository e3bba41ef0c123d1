// The compiler of json_schema.h: one node per schema object (and per type of a type list), $refs
// resolved through JSON pointers into the document, each target compiled once (so recursive
// schemas are finite graphs).
#include "infer/structured/json_schema.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/json_text.h"

namespace kiln::structured {

using nlohmann::json;

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json& document) : document_(document) {
    add(NodeKind::kAny);  // JsonSchema::kAnyValue
    nodes_[add(NodeKind::kObject)].additional = JsonSchema::kAnyValue;
    nodes_[add(NodeKind::kArray)].items = JsonSchema::kAnyValue;
    nodes_[add(NodeKind::kLiterals)].literals = {"false", "null", "true"};
  }

  Result<int32_t> compile(const json& s, const std::string& where) {
    // Recursion follows the document's nesting (bounded by JsonSchema::compile) and its $refs: a
    // chain of definitions each referring to the next is bounded here.
    if (depth_ >= kMaxSchemaNesting)
      return bad(where, "the schema's nesting and references go deeper than " + std::to_string(kMaxSchemaNesting) + " levels");
    ++depth_;
    Result<int32_t> n = compile_at(s, where);
    --depth_;
    return n;
  }

  Result<int32_t> compile_at(const json& s, const std::string& where) {
    if (s.is_boolean()) return s.get<bool>() ? JsonSchema::kAnyValue : add(NodeKind::kNever);
    if (!s.is_object()) return bad(where, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (refused().count(it.key()))
        return bad(where, "'" + it.key() + "' is not enforced by kiln's structured outputs (supported: type, "
                          "properties, required, additionalProperties, items, prefixItems, minItems, maxItems, "
                          "minLength, maxLength, enum, const, anyOf, oneOf, allOf of one schema, $ref)");
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return bad(where, "'$ref' must be a string");
      if (has_constraints(s, {"$ref", "$defs", "definitions"}))
        return bad(where, "'$ref' beside other constraints is not supported; move them into the referenced schema");
      return reference(s["$ref"].get<std::string>(), where);
    }
    for (const char* k : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(k)) continue;
      const json& list = s[k];
      if (!list.is_array() || list.empty()) return bad(where, std::string("'") + k + "' must be a non-empty list");
      if (has_constraints(s, {k, "$defs", "definitions"}))
        return bad(where, std::string("'") + k + "' beside other constraints is not supported; put them into each alternative");
      if (std::string(k) == "allOf") {
        if (list.size() != 1) return bad(where, "'allOf' of more than one schema is not supported");
        return compile(list[0], where + "/allOf/0");
      }
      std::vector<int32_t> options;
      for (size_t i = 0; i < list.size(); ++i) {
        KILN_ASSIGN_OR_RETURN(int32_t o, compile(list[i], where + "/" + k + "/" + std::to_string(i)));
        options.push_back(o);
      }
      const int32_t n = add(NodeKind::kAnyOf);
      nodes_[n].options = std::move(options);
      return n;
    }
    if (s.contains("enum") || s.contains("const")) {
      const int32_t n = add(NodeKind::kLiterals);
      std::vector<std::string> literals;
      if (s.contains("const")) literals.push_back(s["const"].dump());
      if (s.contains("enum")) {
        if (!s["enum"].is_array() || s["enum"].empty()) return bad(where, "'enum' must be a non-empty list");
        for (const json& v : s["enum"]) literals.push_back(v.dump());
      }
      if (s.contains("const") && s.contains("enum")) {  // both: the const, if the enum has it
        const bool in_enum = std::find(literals.begin() + 1, literals.end(), literals[0]) != literals.end();
        literals.resize(in_enum ? 1 : 0);
      }
      std::sort(literals.begin(), literals.end());
      literals.erase(std::unique(literals.begin(), literals.end()), literals.end());
      if (literals.empty()) nodes_[n].kind = NodeKind::kNever;
      nodes_[n].literals = std::move(literals);
      return n;
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& e : t) {
          if (!e.is_string()) return bad(where, "'type' must be a string or a list of strings");
          types.push_back(e.get<std::string>());
        }
      } else {
        return bad(where, "'type' must be a string or a non-empty list of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else {
      return JsonSchema::kAnyValue;
    }
    if (types.size() == 1) return typed(s, types[0], where);
    std::vector<int32_t> options;
    for (const std::string& t : types) {
      KILN_ASSIGN_OR_RETURN(int32_t o, typed(s, t, where));
      options.push_back(o);
    }
    const int32_t n = add(NodeKind::kAnyOf);
    nodes_[n].options = std::move(options);
    return n;
  }

  const std::vector<SchemaNode>& nodes() const { return nodes_; }
  const std::map<std::string, int32_t>& refs() const { return refs_; }
  std::vector<SchemaNode> take() { return std::move(nodes_); }

 private:
  static const std::set<std::string>& refused() {
    static const std::set<std::string> k = {
        "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems", "not",
        "if", "then", "else", "patternProperties", "dependentRequired", "dependentSchemas", "dependencies",
        "propertyNames", "minProperties", "maxProperties", "contains", "minContains", "maxContains",
        "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"};
    return k;
  }
  // Whether `s` has keys beyond annotations and `allowed`.
  static bool has_constraints(const json& s, std::initializer_list<const char*> allowed) {
    static const std::set<std::string> annotations = {"title", "description", "default", "examples", "$schema",
                                                      "$id", "$comment", "format", "deprecated", "readOnly",
                                                      "writeOnly", "discriminator", "nullable"};
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (annotations.count(it.key())) continue;
      if (std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return it.key() == a; })) continue;
      return true;
    }
    return false;
  }

  static Status bad(const std::string& where, const std::string& what) {
    return invalid_argument("JSON schema at " + (where.empty() ? std::string("#") : where) + ": " + what);
  }

  int32_t add(NodeKind kind) {
    nodes_.emplace_back();
    nodes_.back().kind = kind;
    return static_cast<int32_t>(nodes_.size() - 1);
  }

  Result<int32_t> reference(const std::string& ref, const std::string& where) {
    if (ref.empty() || ref[0] != '#')
      return bad(where, "'$ref' to '" + ref + "': only references into this schema (#/$defs/..., #/definitions/...) are supported");
    auto known = refs_.find(ref);
    if (known != refs_.end()) return known->second;
    const json* target = nullptr;
    try {
      target = &document_.at(json::json_pointer(ref.substr(1)));
    } catch (const std::exception&) {
      return bad(where, "'$ref' '" + ref + "' points at nothing in the schema");
    }
    // A placeholder node, so that a reference back to it while it compiles ends there.
    const int32_t n = add(NodeKind::kAnyOf);
    refs_[ref] = n;
    KILN_ASSIGN_OR_RETURN(int32_t inner, compile(*target, ref));
    nodes_[n].options = {inner};
    return n;
  }

  Result<int32_t> typed(const json& s, const std::string& type, const std::string& where) {
    auto length = [&](const char* key, int32_t* out) -> Status {
      if (!s.contains(key)) return Status::Ok();
      if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0 || s[key].get<int64_t>() > (int64_t(1) << 30))
        return bad(where, std::string("'") + key + "' must be a non-negative integer");
      *out = s[key].get<int32_t>();
      return Status::Ok();
    };
    if (type == "string") {
      const int32_t n = add(NodeKind::kString);
      KILN_RETURN_IF_ERROR(length("minLength", &nodes_[n].min_length));
      KILN_RETURN_IF_ERROR(length("maxLength", &nodes_[n].max_length));
      if (nodes_[n].min_length > nodes_[n].max_length) return bad(where, "'minLength' exceeds 'maxLength'");
      return n;
    }
    if (type == "number") return add(NodeKind::kNumber);
    if (type == "integer") return add(NodeKind::kInteger);
    if (type == "boolean" || type == "null") {
      const int32_t n = add(NodeKind::kLiterals);
      nodes_[n].literals = type == "null" ? std::vector<std::string>{"null"} : std::vector<std::string>{"false", "true"};
      return n;
    }
    if (type == "array") return array(s, where, length);
    if (type == "object") return object(s, where);
    return bad(where, "unknown type '" + type + "'");
  }

  template <typename Length>
  Result<int32_t> array(const json& s, const std::string& where, Length& length) {
    std::vector<int32_t> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) return bad(where, "'prefixItems' must be a list of schemas");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
        KILN_ASSIGN_OR_RETURN(int32_t p, compile(s["prefixItems"][i], where + "/prefixItems/" + std::to_string(i)));
        prefix.push_back(p);
      }
    }
    int32_t items = -1;
    if (!s.contains("items") || s["items"] == json(true)) {
      items = JsonSchema::kAnyValue;
    } else if (s["items"] != json(false)) {
      if (s["items"].is_array()) return bad(where, "'items' as a list is the old form of 'prefixItems'; use 'prefixItems'");
      KILN_ASSIGN_OR_RETURN(items, compile(s["items"], where + "/items"));
    }
    const int32_t n = add(NodeKind::kArray);
    nodes_[n].prefix = std::move(prefix);
    nodes_[n].items = items;
    KILN_RETURN_IF_ERROR(length("minItems", &nodes_[n].min_items));
    KILN_RETURN_IF_ERROR(length("maxItems", &nodes_[n].max_items));
    if (nodes_[n].min_items > nodes_[n].max_items) return bad(where, "'minItems' exceeds 'maxItems'");
    if (items < 0) nodes_[n].max_items = std::min<int32_t>(nodes_[n].max_items, static_cast<int32_t>(nodes_[n].prefix.size()));
    if (nodes_[n].min_items > nodes_[n].max_items) return bad(where, "'minItems' asks for more items than the schema allows");
    return n;
  }

  Result<int32_t> object(const json& s, const std::string& where) {
    std::vector<SchemaProperty> props;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return bad(where, "'properties' must be an object");
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
        KILN_ASSIGN_OR_RETURN(int32_t p, compile(it.value(), where + "/properties/" + it.key()));
        const std::string quoted = json(it.key()).dump();
        props.push_back({quoted.substr(1, quoted.size() - 2), p, false});
      }
    }
    if (props.size() > static_cast<size_t>(kMaxObjectProperties))
      return bad(where, "more than " + std::to_string(kMaxObjectProperties) + " properties in one object");
    int32_t additional = -1;
    const bool declared = s.contains("properties");
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (a == json(true)) additional = JsonSchema::kAnyValue;
      else if (a != json(false)) {
        KILN_ASSIGN_OR_RETURN(additional, compile(a, where + "/additionalProperties"));
      }
    } else if (!declared) {
      additional = JsonSchema::kAnyValue;  // {"type": "object"}: any keys
    }
    if (s.contains("required")) {
      if (!s["required"].is_array()) return bad(where, "'required' must be a list of property names");
      for (const json& r : s["required"]) {
        if (!r.is_string()) return bad(where, "'required' must be a list of property names");
        const std::string quoted = r.dump();
        const std::string key = quoted.substr(1, quoted.size() - 2);
        auto p = std::find_if(props.begin(), props.end(), [&](const SchemaProperty& q) { return q.key == key; });
        if (p == props.end())
          return bad(where, "required property '" + r.get<std::string>() + "' is not among 'properties'");
        p->required = true;
      }
    }
    const int32_t n = add(NodeKind::kObject);
    nodes_[n].properties = std::move(props);
    nodes_[n].additional = additional;
    return n;
  }

  const json& document_;
  std::vector<SchemaNode> nodes_;
  std::map<std::string, int32_t> refs_;
  int64_t depth_ = 0;
};

// A schema that refers to itself before any value begins ({"$ref": "#"}, two definitions that are
// each other's alternative) describes no JSON text and would send the matcher around the cycle for
// ever: found as a cycle among anyOf nodes (references compile to anyOf nodes), by an iterative
// depth-first walk. The error names one node of the cycle's reference, when it has one.
Status check_alternative_cycles(const std::vector<SchemaNode>& nodes, const std::map<std::string, int32_t>& refs) {
  enum : uint8_t { kNew, kOpen, kDone };
  std::vector<uint8_t> state(nodes.size(), kNew);
  for (int32_t start = 0; start < static_cast<int32_t>(nodes.size()); ++start) {
    if (nodes[start].kind != NodeKind::kAnyOf || state[start] != kNew) continue;
    std::vector<std::pair<int32_t, size_t>> path = {{start, 0}};  // node, next option to visit
    state[start] = kOpen;
    while (!path.empty()) {
      auto& [n, next] = path.back();
      if (next == nodes[n].options.size()) {
        state[n] = kDone;
        path.pop_back();
        continue;
      }
      const int32_t o = nodes[n].options[next++];
      if (nodes[o].kind != NodeKind::kAnyOf || state[o] == kDone) continue;
      if (state[o] == kOpen) {
        std::string name;
        for (const auto& [ref, node] : refs)
          if (node == o) name = " ('" + ref + "')";
        return invalid_argument("the schema refers to itself" + name +
                                " before any value begins, so no JSON text can follow it");
      }
      state[o] = kOpen;
      path.push_back({o, 0});
    }
  }
  return Status::Ok();
}

Result<std::shared_ptr<const JsonSchema>> JsonSchema::compile(const json& schema) {
  // The compiler recurses as deep as the schema nests (and keeps it: copying recurses too).
  KILN_RETURN_IF_ERROR(check_nesting(schema, kMaxSchemaNesting, "the schema"));
  SchemaCompiler c(schema);
  KILN_ASSIGN_OR_RETURN(int32_t root, c.compile(schema, ""));
  KILN_RETURN_IF_ERROR(check_alternative_cycles(c.nodes(), c.refs()));
  auto s = std::make_shared<JsonSchema>();
  s->source_ = schema;
  s->nodes_ = c.take();
  s->root_ = root;
  return std::shared_ptr<const JsonSchema>(std::move(s));
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  Result<std::shared_ptr<const JsonSchema>> s = compile(json{{"type", "object"}});
  KILN_ASSERT(s.ok());
  return *s;
}

Result<std::shared_ptr<const JsonSchema>> JsonSchema::from_response_format(const json& rf) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return invalid_argument("'response_format' must be an object with a 'type' (text, json_object or json_schema)");
  const std::string type = rf["type"];
  if (type == "text") return std::shared_ptr<const JsonSchema>();
  if (type == "json_object") return any_object();
  if (type != "json_schema")
    return unsupported("'response_format' of type '" + type + "' is not supported (text, json_object, json_schema are)");
  const json* js = rf.contains("json_schema") ? &rf["json_schema"] : nullptr;
  if (!js || !js->is_object()) return invalid_argument("'response_format.json_schema' must be an object with a 'schema'");
  if (js->contains("name") && !(*js)["name"].is_string())
    return invalid_argument("'response_format.json_schema.name' must be a string");
  if (js->contains("strict") && !(*js)["strict"].is_boolean() && !(*js)["strict"].is_null())
    return invalid_argument("'response_format.json_schema.strict' must be true or false");
  if (!js->contains("schema")) return invalid_argument("'response_format.json_schema.schema' is required");
  Result<std::shared_ptr<const JsonSchema>> schema = compile((*js)["schema"]);
  if (!schema.ok()) return invalid_argument("'response_format.json_schema.schema': " + schema.status().message());
  return *schema;
}

}  // namespace kiln::structured
