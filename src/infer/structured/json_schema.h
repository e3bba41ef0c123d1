// JSON schemas compiled for constrained decoding (structured outputs): a graph of value nodes that
// json_matcher.h walks byte by byte. The subset enforced, as the OpenAI API's structured outputs and
// vLLM's guided decoding use it:
//   type (one or a list), properties, required, additionalProperties (false, true or a schema),
//   items, prefixItems, minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf (as
//   anyOf), allOf of one schema, $ref into #/$defs or #/definitions (recursion allowed), and the
//   boolean schemas true / false.
// Annotations (title, description, default, examples, $schema, $id, $comment, format, deprecated,
// readOnly, writeOnly) are accepted and not enforced. Keywords that constrain values in ways this
// matcher cannot (pattern, minimum, maximum, multipleOf, uniqueItems, not, if/then/else,
// patternProperties, dependent*, ...) are refused with an error naming them, so that an output is
// never claimed to follow a schema it may break.
// Policy where JSON Schema leaves freedom (as OpenAI's strict mode and xgrammar): an object with
// `properties` and no `additionalProperties` takes only the declared keys; keys come in any order,
// each at most once, required ones before the closing brace. Whitespace: at most kMaxWhitespace
// bytes (space, tab, newline, carriage return) between tokens of the JSON text, none around the
// top-level value.
// Immutable after compilation; thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kiln::structured {

constexpr int32_t kMaxWhitespace = 16;       // bytes of one whitespace run
constexpr int32_t kMaxObjectProperties = 64;  // declared properties of one object
constexpr int64_t kMaxSchemaNesting = 128;    // JSON levels of a schema document

// kBoolean and kNull compile to kLiterals.
enum class NodeKind : uint8_t { kAny, kObject, kArray, kString, kNumber, kInteger, kLiterals, kAnyOf, kNever };

struct SchemaProperty {
  std::string key;  // the key's text between its quotes, JSON-escaped (as a model writes it)
  int32_t node = -1;
  bool required = false;
};

struct SchemaNode {
  NodeKind kind = NodeKind::kAny;
  // kObject: declared properties; values of other keys follow `additional` (-1: no other keys).
  std::vector<SchemaProperty> properties;
  int32_t additional = -1;
  // kArray: items [0, prefix.size()) follow prefix[i], later ones `items` (-1: none allowed).
  std::vector<int32_t> prefix;
  int32_t items = -1;
  int32_t min_items = 0, max_items = std::numeric_limits<int32_t>::max();
  // kString: length in code points.
  int32_t min_length = 0, max_length = std::numeric_limits<int32_t>::max();
  // kLiterals: the JSON texts (compact) of enum / const values; one of them, byte for byte.
  std::vector<std::string> literals;
  // kAnyOf: the alternatives.
  std::vector<int32_t> options;
};

class JsonSchema {
 public:
  // `schema`: a JSON schema (an object or a boolean). Errors name the keyword and where it stands.
  static Result<std::shared_ptr<const JsonSchema>> compile(const nlohmann::json& schema);
  // Any JSON object ({"type": "json_object"} of the OpenAI API).
  static std::shared_ptr<const JsonSchema> any_object();
  // The OpenAI API's response_format: {"type": "text"} (nullptr: no constraint), {"type":
  // "json_object"}, or {"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
  // "strict": ...}}. Errors name the field.
  static Result<std::shared_ptr<const JsonSchema>> from_response_format(const nlohmann::json& response_format);

  // Nodes 0-3 of every schema: any value, any object, any array, and the literals false / null /
  // true (what a value of kAny may begin).
  static constexpr int32_t kAnyValue = 0, kAnyObject = 1, kAnyArray = 2, kAnyLiteral = 3;
  const std::vector<SchemaNode>& nodes() const { return nodes_; }
  int32_t root() const { return root_; }
  const nlohmann::json& source() const { return source_; }  // the schema compiled

 private:
  nlohmann::json source_;
  std::vector<SchemaNode> nodes_;
  int32_t root_ = 0;
  friend class SchemaCompiler;
};

}  // namespace kiln::structured
