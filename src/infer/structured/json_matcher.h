// JsonMatcher: which bytes may extend a text so that it stays the beginning of a JSON value that
// follows a JsonSchema (json_schema.h), byte by byte, for constrained decoding.
//
// A state is a set of parse stacks (alternatives of anyOf, enum literals and type lists each
// continue on their own stack until a byte rules them out); a byte is accepted when at least one
// stack takes it. A stack is a list of frames, the innermost last: the root, then one frame per
// open object, array, string, number or literal. A container's frame records the phase it is in
// (e.g. after a key, after a value) and, while a child value is open, the phase that follows it, so
// a child that closes is simply popped. Numbers (and literals ending in a digit) have no closing
// byte: such a frame stays complete-but-extensible, and a byte that cannot extend it pops it and
// goes to the frame below. Alternatives that stay ambiguous multiply the stacks (two identical
// alternatives of a recursive array double them at every '['): past kMaxStacks a state keeps the
// first kMaxStacks in a fixed order, so every text it accepts still follows the schema, though some
// continuations of the dropped parses may be refused.
// Value type (copyable); not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "infer/structured/json_schema.h"

namespace kiln::structured {

constexpr size_t kMaxStacks = 256;  // parse stacks a state keeps

// UTF-8 as a byte automaton (Unicode's well-formed sequences: no overlong forms, no surrogates, at
// most U+10FFFF). `pending`: continuation bytes still expected (bits 0-1) and the range the next one
// must fall in (bits 2-4: 0 any of 80-BF, 1 A0-BF, 2 80-9F, 3 90-BF, 4 80-8F).
// A byte >= 0x80 where no sequence is open: a lead byte sets `pending`; false if it is none.
inline bool utf8_lead(uint8_t b, uint8_t& pending) {
  if (b >= 0xC2 && b <= 0xDF) pending = 1;
  else if (b == 0xE0) pending = 2 | 1 << 2;
  else if (b == 0xED) pending = 2 | 2 << 2;
  else if (b >= 0xE1 && b <= 0xEF) pending = 2;
  else if (b == 0xF0) pending = 3 | 3 << 2;
  else if (b == 0xF4) pending = 3 | 4 << 2;
  else if (b >= 0xF1 && b <= 0xF3) pending = 3;
  else return false;
  return true;
}
// A byte while a sequence is open (pending != 0): false if it cannot continue it.
inline bool utf8_continue(uint8_t b, uint8_t& pending) {
  static constexpr uint8_t kLow[] = {0x80, 0xA0, 0x80, 0x90, 0x80}, kHigh[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
  const int range = pending >> 2;
  if (b < kLow[range] || b > kHigh[range]) return false;
  pending = static_cast<uint8_t>((pending & 3) - 1);
  return true;
}

enum class FrameKind : uint8_t { kRoot, kObject, kArray, kString, kNumber, kLiteral };

constexpr int32_t kKeyOther = 1;  // Frame::pos of a key string that names no declared property

struct Frame {
  FrameKind kind = FrameKind::kRoot;
  uint8_t phase = 0;
  uint8_t ws = 0;        // whitespace bytes of the current run (containers)
  uint8_t pending = 0;   // strings: UTF-8 continuation bytes or \u hex digits still expected
  int32_t node = -1;     // the schema node (literals: the kLiterals node)
  int32_t count = 0;     // arrays: items begun; strings: code points; literals: the first candidate
  int32_t end = 0;       // literals: one past the last candidate (the node's literals are sorted; the
                         //   candidates [count, end) begin with the pos bytes read, and each is longer
                         //   or, the first only, exactly as long and a number more digits could extend)
  int32_t pos = 0;       // literals: bytes matched; objects: the property of the current key (-1: other);
                         //   key strings: kKeyOther once the key can name no declared property
                         //   (its text, no longer needed, is then dropped)
  uint64_t seen = 0;     // objects: declared properties present
  std::string key;       // key strings: the text so far
  bool operator==(const Frame&) const = default;
};
using Stack = std::vector<Frame>;

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonSchema> schema);

  // Advances over `bytes`; false (and the state unchanged) when they cannot continue the text.
  bool advance(std::string_view bytes);
  // The text so far is a complete value (an end of text may come).
  bool can_end() const;
  // Complete, and no byte may follow.
  bool finished() const;

  const JsonSchema& schema() const { return *schema_; }
  const std::shared_ptr<const JsonSchema>& shared_schema() const { return schema_; }
  const std::vector<Stack>& stacks() const { return stacks_; }
  // The stacks after `byte` from `stacks` (none: rejected). Duplicates removed.
  void step(const std::vector<Stack>& stacks, uint8_t byte, std::vector<Stack>& out) const;
  // A key equal for two stacks that accept the same continuations (counts that no longer matter
  // are left out), for caching token masks.
  std::string stack_key(const Stack& s) const;
  // The stack's innermost frame is a plain string (no escape or UTF-8 sequence open, not a key):
  // any byte but '"', '\\' and controls continues it, up to `*room` more code points.
  bool in_plain_string(const Stack& s, int32_t* room) const;
  bool stack_can_end(const Stack& s) const;

 private:
  // Appends the stacks `s` becomes after `byte` to out.
  void step_stack(Stack s, uint8_t byte, std::vector<Stack>& out) const;
  // `s` (whose top expects a value of `node`) after the value's first byte.
  void start_value(Stack s, int32_t node, uint8_t byte, std::vector<Stack>& out) const;
  void step_object(Stack& s, uint8_t byte, std::vector<Stack>& out) const;
  void step_array(Stack& s, uint8_t byte, std::vector<Stack>& out) const;
  void step_string(Stack& s, uint8_t byte, std::vector<Stack>& out) const;
  // Below `s`, a literal of `node` whose candidates [lo, hi) share `pos` bytes read, after `byte`.
  void literal_byte(Stack s, int32_t node, int32_t lo, int32_t hi, int32_t pos, uint8_t byte,
                    std::vector<Stack>& out) const;
  // The key string on top of an object frame may take `byte` (key text so far + byte).
  bool key_allows(const Frame& object, const std::string& key, uint8_t byte) const;
  // After a key's closing quote: the declared property it names (-1: another key), or -2: refused.
  int32_t key_property(const Frame& object, const std::string& key) const;

  std::shared_ptr<const JsonSchema> schema_;
  std::vector<Stack> stacks_;
};

}  // namespace kiln::structured
