#include "infer/structured/json_matcher.h"

#include <algorithm>
#include <limits>
#include <ranges>
#include <unordered_set>

namespace kiln::structured {
namespace {

constexpr int32_t kUnbounded = std::numeric_limits<int32_t>::max();

// Phases of each frame kind.
enum RootPhase : uint8_t { kRootValue, kRootDone };
enum ObjectPhase : uint8_t { kObjOpen, kObjColon, kObjValue, kObjAfterValue, kObjNextKey, kObjInKey };
enum ArrayPhase : uint8_t { kArrOpen, kArrAfterValue, kArrNext };
enum StringPhase : uint8_t { kStrPlain, kStrEscape, kStrUnicode };
// Numbers: after '-', after a leading 0, in the integer digits, after '.', in the fraction, after
// 'e', after the exponent's sign, in the exponent's digits.
enum NumberPhase : uint8_t { kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };

bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
bool number_complete(uint8_t phase) {
  return phase == kNumZero || phase == kNumInt || phase == kNumFrac || phase == kNumExp;
}

// A container frame (s's top) takes a whitespace byte while its run has room (pushing s to out);
// true when the byte was whitespace, taken or not. Any other byte ends the run.
bool take_whitespace(Stack& s, uint8_t byte, std::vector<Stack>& out) {
  Frame& f = s.back();
  if (!is_ws(byte)) {
    f.ws = 0;
    return false;
  }
  if (f.ws < kMaxWhitespace) {
    ++f.ws;
    out.push_back(std::move(s));
  }
  return true;
}

void dedupe(std::vector<Stack>& v) {
  if (v.size() < 2) return;
  std::vector<Stack> unique;
  unique.reserve(v.size());
  for (Stack& s : v)
    if (std::find(unique.begin(), unique.end(), s) == unique.end()) unique.push_back(std::move(s));
  v = std::move(unique);
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {
  Frame root;
  root.kind = FrameKind::kRoot;
  root.phase = kRootValue;
  stacks_.push_back({root});
}

bool JsonMatcher::advance(std::string_view bytes) {
  std::vector<Stack> cur = stacks_, next;
  for (char c : bytes) {
    next.clear();
    step(cur, static_cast<uint8_t>(c), next);
    if (next.empty()) return false;
    cur.swap(next);
  }
  stacks_ = std::move(cur);
  return true;
}

bool JsonMatcher::stack_can_end(const Stack& s) const {
  if (s.empty() || s[0].phase != kRootDone) return false;
  if (s.size() == 1) return true;
  if (s.size() != 2) return false;
  const Frame& top = s[1];
  if (top.kind == FrameKind::kNumber) return number_complete(top.phase);
  return top.kind == FrameKind::kLiteral &&
         top.pos == static_cast<int32_t>(schema_->nodes()[top.node].literals[top.count].size());  // the shortest candidate
}

bool JsonMatcher::can_end() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [&](const Stack& s) { return stack_can_end(s); });
}

bool JsonMatcher::finished() const {
  return std::all_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.size() == 1 && s[0].phase == kRootDone; });
}

void JsonMatcher::step(const std::vector<Stack>& stacks, uint8_t byte, std::vector<Stack>& out) const {
  for (const Stack& s : stacks) {
    step_stack(s, byte, out);
    if (out.size() > 4 * kMaxStacks) dedupe(out);  // ambiguous alternatives multiply
    if (out.size() > 4 * kMaxStacks) out.resize(4 * kMaxStacks);
  }
  dedupe(out);
  if (out.size() > kMaxStacks) out.resize(kMaxStacks);  // the first parses, in a fixed order
}

void JsonMatcher::step_stack(Stack s, uint8_t byte, std::vector<Stack>& out) const {
  Frame& top = s.back();
  switch (top.kind) {
    case FrameKind::kRoot:
      if (top.phase != kRootValue) return;  // nothing after the value, not even whitespace
      top.phase = kRootDone;
      return start_value(std::move(s), schema_->root(), byte, out);
    case FrameKind::kObject: return step_object(s, byte, out);
    case FrameKind::kArray: return step_array(s, byte, out);
    case FrameKind::kString: return step_string(s, byte, out);
    case FrameKind::kNumber: {
      const bool integer = top.count != 0;
      uint8_t next = 255;
      switch (top.phase) {
        case kNumMinus: next = byte == '0' ? kNumZero : is_digit(byte) ? kNumInt : 255; break;
        case kNumZero:
        case kNumInt:
          if (top.phase == kNumInt && is_digit(byte)) next = kNumInt;
          else if (!integer && byte == '.') next = kNumDot;
          else if (!integer && (byte == 'e' || byte == 'E')) next = kNumE;
          break;
        case kNumDot: next = is_digit(byte) ? kNumFrac : 255; break;
        case kNumFrac: next = is_digit(byte) ? kNumFrac : (byte == 'e' || byte == 'E') ? kNumE : 255; break;
        case kNumE: next = (byte == '+' || byte == '-') ? kNumESign : is_digit(byte) ? kNumExp : 255; break;
        case kNumESign:
        case kNumExp: next = is_digit(byte) ? kNumExp : 255; break;
        default: break;
      }
      if (next != 255) {
        top.phase = next;
        out.push_back(std::move(s));
        return;
      }
      if (!number_complete(top.phase)) return;
      s.pop_back();  // the number ended before this byte: the frame below takes it
      return step_stack(std::move(s), byte, out);
    }
    case FrameKind::kLiteral: {
      const Frame lit = top;
      s.pop_back();
      // The shortest candidate, when complete (a number that more digits could extend), may end
      // before this byte: the frame below takes it.
      if (static_cast<int32_t>(schema_->nodes()[lit.node].literals[lit.count].size()) == lit.pos) step_stack(s, byte, out);
      return literal_byte(std::move(s), lit.node, lit.count, lit.end, lit.pos, byte, out);
    }
  }
}

void JsonMatcher::start_value(Stack s, int32_t node, uint8_t byte, std::vector<Stack>& out) const {
  // The alternatives of an anyOf tree (through $refs, a graph: compile refused its cycles) in
  // depth-first order, each node once, without recursion: two paths to one node give the same stack.
  if (schema_->nodes()[node].kind == NodeKind::kAnyOf) {
    std::vector<int32_t> todo = {node};
    std::unordered_set<int32_t> seen;
    while (!todo.empty()) {
      const int32_t n = todo.back();
      todo.pop_back();
      if (!seen.insert(n).second) continue;
      const SchemaNode& alt = schema_->nodes()[n];
      if (alt.kind != NodeKind::kAnyOf) {
        start_value(s, n, byte, out);
        continue;
      }
      for (auto o = alt.options.rbegin(); o != alt.options.rend(); ++o) todo.push_back(*o);
    }
    return;
  }
  const SchemaNode& n = schema_->nodes()[node];
  Frame f;
  f.node = node;
  switch (n.kind) {
    case NodeKind::kAny:
      if (byte == '{') return start_value(std::move(s), JsonSchema::kAnyObject, byte, out);
      if (byte == '[') return start_value(std::move(s), JsonSchema::kAnyArray, byte, out);
      if (byte == 't' || byte == 'f' || byte == 'n') return start_value(std::move(s), JsonSchema::kAnyLiteral, byte, out);
      if (byte == '"') {
        f.kind = FrameKind::kString;
        break;
      }
      if (byte == '-' || is_digit(byte)) {
        f.kind = FrameKind::kNumber;
        f.phase = byte == '-' ? kNumMinus : byte == '0' ? kNumZero : kNumInt;
        break;
      }
      return;
    case NodeKind::kObject:
      if (byte != '{') return;
      f.kind = FrameKind::kObject;
      f.phase = kObjOpen;
      f.pos = -1;
      break;
    case NodeKind::kArray:
      if (byte != '[') return;
      f.kind = FrameKind::kArray;
      f.phase = kArrOpen;
      break;
    case NodeKind::kString:
      if (byte != '"') return;
      f.kind = FrameKind::kString;
      break;
    case NodeKind::kNumber:
    case NodeKind::kInteger:
      if (byte != '-' && !is_digit(byte)) return;
      f.kind = FrameKind::kNumber;
      f.phase = byte == '-' ? kNumMinus : byte == '0' ? kNumZero : kNumInt;
      f.count = n.kind == NodeKind::kInteger ? 1 : 0;
      break;
    case NodeKind::kLiterals:
      return literal_byte(std::move(s), node, 0, static_cast<int32_t>(n.literals.size()), 0, byte, out);
    case NodeKind::kAnyOf: return;  // expanded above
    case NodeKind::kNever: return;
  }
  s.push_back(std::move(f));
  out.push_back(std::move(s));
}

void JsonMatcher::literal_byte(Stack s, int32_t node, int32_t lo, int32_t hi, int32_t pos, uint8_t byte,
                               std::vector<Stack>& out) const {
  // The candidates are sorted and share their first pos bytes, so those whose next byte is `byte`
  // are a contiguous run, and a candidate that is exactly pos + 1 long comes first in it.
  const std::vector<std::string>& lits = schema_->nodes()[node].literals;
  const auto next = [&](int32_t i) -> int32_t {
    return lits[i].size() > static_cast<size_t>(pos) ? static_cast<uint8_t>(lits[i][pos]) : -1;
  };
  const auto ids = std::views::iota(lo, hi);
  const auto first_where = [&](auto pred) {
    return lo + static_cast<int32_t>(std::ranges::distance(ids.begin(), std::ranges::partition_point(ids, pred)));
  };
  int32_t a = first_where([&](int32_t i) { return next(i) < byte; });
  const int32_t end = first_where([&](int32_t i) { return next(i) <= byte; });
  if (a == end) return;
  if (lits[a].size() == static_cast<size_t>(pos) + 1 && !is_digit(byte)) {
    out.push_back(s);  // a complete literal (not a number that could go on): the value ended
    ++a;
  }
  if (a == end) return;
  Frame lit;
  lit.kind = FrameKind::kLiteral;
  lit.node = node;
  lit.count = a;
  lit.end = end;
  lit.pos = pos + 1;
  s.push_back(lit);
  out.push_back(std::move(s));
}

bool JsonMatcher::key_allows(const Frame& object, const std::string& key, uint8_t byte) const {
  const SchemaNode& n = schema_->nodes()[object.node];
  if (n.additional >= 0) return true;
  for (size_t i = 0; i < n.properties.size(); ++i) {
    if (object.seen >> i & 1) continue;
    const std::string& k = n.properties[i].key;
    if (k.size() > key.size() && k.compare(0, key.size(), key) == 0 && static_cast<uint8_t>(k[key.size()]) == byte)
      return true;
  }
  return false;
}

int32_t JsonMatcher::key_property(const Frame& object, const std::string& key) const {
  const SchemaNode& n = schema_->nodes()[object.node];
  for (size_t i = 0; i < n.properties.size(); ++i)
    if (n.properties[i].key == key) return (object.seen >> i & 1) ? -2 : static_cast<int32_t>(i);
  return n.additional >= 0 ? -1 : -2;
}

void JsonMatcher::step_object(Stack& s, uint8_t byte, std::vector<Stack>& out) const {
  Frame& f = s.back();
  const SchemaNode& n = schema_->nodes()[f.node];
  if (take_whitespace(s, byte, out)) return;
  auto key_possible = [&] {
    if (n.additional >= 0) return true;
    for (size_t i = 0; i < n.properties.size(); ++i)
      if (!(f.seen >> i & 1)) return true;
    return false;
  };
  auto required_present = [&] {
    for (size_t i = 0; i < n.properties.size(); ++i)
      if (n.properties[i].required && !(f.seen >> i & 1)) return false;
    return true;
  };
  auto open_key = [&] {
    f.phase = kObjInKey;
    Frame k;
    k.kind = FrameKind::kString;
    k.node = -1;  // a key
    s.push_back(std::move(k));
    out.push_back(std::move(s));
  };
  switch (f.phase) {
    case kObjOpen:
      if (byte == '"' && key_possible()) return open_key();
      if (byte == '}' && required_present()) {
        s.pop_back();
        out.push_back(std::move(s));
      }
      return;
    case kObjNextKey:
      if (byte == '"') open_key();
      return;
    case kObjColon:
      if (byte != ':') return;
      f.phase = kObjValue;
      out.push_back(std::move(s));
      return;
    case kObjValue: {
      const int32_t child = f.pos >= 0 ? n.properties[f.pos].node : n.additional;
      f.phase = kObjAfterValue;
      return start_value(std::move(s), child, byte, out);
    }
    case kObjAfterValue:
      if (byte == ',' && key_possible()) {
        f.phase = kObjNextKey;
        out.push_back(std::move(s));
      } else if (byte == '}' && required_present()) {
        s.pop_back();
        out.push_back(std::move(s));
      }
      return;
    default: return;
  }
}

void JsonMatcher::step_array(Stack& s, uint8_t byte, std::vector<Stack>& out) const {
  Frame& f = s.back();
  const SchemaNode& n = schema_->nodes()[f.node];
  if (take_whitespace(s, byte, out)) return;
  auto start_item = [&] {
    if (f.count >= n.max_items) return;
    const int32_t child = f.count < static_cast<int32_t>(n.prefix.size()) ? n.prefix[f.count] : n.items;
    if (child < 0) return;
    ++f.count;
    f.phase = kArrAfterValue;
    start_value(std::move(s), child, byte, out);
  };
  switch (f.phase) {
    case kArrOpen:
      if (byte == ']') {
        if (n.min_items == 0) {
          s.pop_back();
          out.push_back(std::move(s));
        }
        return;
      }
      return start_item();
    case kArrNext: return start_item();
    case kArrAfterValue:
      if (byte == ',' && f.count < n.max_items) {
        f.phase = kArrNext;
        out.push_back(std::move(s));
      } else if (byte == ']' && f.count >= n.min_items) {
        s.pop_back();
        out.push_back(std::move(s));
      }
      return;
    default: return;
  }
}

void JsonMatcher::step_string(Stack& s, uint8_t byte, std::vector<Stack>& out) const {
  Frame& f = s.back();
  const bool key = f.node < 0;
  const SchemaNode* n = key ? nullptr : &schema_->nodes()[f.node];
  const int32_t min_len = n && n->kind == NodeKind::kString ? n->min_length : 0;
  const int32_t max_len = n && n->kind == NodeKind::kString ? n->max_length : kUnbounded;
  const Frame* parent = key ? &s[s.size() - 2] : nullptr;
  const bool closing = byte == '"' && f.phase == kStrPlain && f.pending == 0;
  if (key && !closing && !key_allows(*parent, f.key, byte)) return;
  switch (f.phase) {
    case kStrEscape:
      if (byte == 'u') {
        f.phase = kStrUnicode;
        f.pending = 4;
      } else if (byte == '"' || byte == '\\' || byte == '/' || byte == 'b' || byte == 'f' || byte == 'n' ||
                 byte == 'r' || byte == 't') {
        f.phase = kStrPlain;
        ++f.count;
      } else {
        return;
      }
      break;
    case kStrUnicode:
      if (!is_hex(byte)) return;
      if (--f.pending == 0) {
        f.phase = kStrPlain;
        ++f.count;
      }
      break;
    default:
      if (f.pending > 0) {  // inside a UTF-8 sequence
        if (!utf8_continue(byte, f.pending)) return;
        break;
      }
      if (byte == '"') {
        if (key) {
          const int32_t prop = f.pos == kKeyOther ? -1 : key_property(*parent, f.key);
          if (prop == -2) return;
          s.pop_back();
          Frame& obj = s.back();
          obj.phase = kObjColon;
          obj.pos = prop;
          if (prop >= 0) obj.seen |= uint64_t(1) << prop;
        } else {
          if (f.count < min_len) return;
          s.pop_back();
        }
        out.push_back(std::move(s));
        return;
      }
      if (byte < 0x20 || f.count >= max_len) return;  // controls must be escaped; no room left
      if (byte == '\\') {
        f.phase = kStrEscape;
      } else if (byte < 0x80 || utf8_lead(byte, f.pending)) {
        ++f.count;
      } else {
        return;  // not a UTF-8 lead byte
      }
      break;
  }
  if (key && f.pos != kKeyOther) {
    f.key.push_back(static_cast<char>(byte));
    // Once no declared property (present already or not: a repeated one is refused) begins with
    // it, the key's text no longer matters, only that other keys are allowed: dropped, so that a
    // long key costs no copying per byte.
    const SchemaNode& object = schema_->nodes()[parent->node];
    bool declared = false;
    for (size_t i = 0; i < object.properties.size() && !declared; ++i)
      declared = object.properties[i].key.compare(0, f.key.size(), f.key) == 0;
    if (!declared) {
      f.key.clear();
      f.key.shrink_to_fit();
      f.pos = kKeyOther;
    }
  }
  out.push_back(std::move(s));
}

bool JsonMatcher::in_plain_string(const Stack& s, int32_t* room) const {
  const Frame& f = s.back();
  if (f.kind != FrameKind::kString || f.node < 0 || f.phase != kStrPlain || f.pending != 0) return false;
  const SchemaNode& n = schema_->nodes()[f.node];
  *room = n.kind == NodeKind::kString && n.max_length != kUnbounded ? n.max_length - f.count : kUnbounded;
  return true;
}

std::string JsonMatcher::stack_key(const Stack& s) const {
  std::string k;
  auto put = [&](int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  for (const Frame& f : s) {
    int32_t count = f.count;
    if (f.kind == FrameKind::kString) {
      if (f.node < 0) {
        count = 0;  // a key's length does not matter; its text does
      } else {
        const SchemaNode& n = schema_->nodes()[f.node];
        if (n.kind != NodeKind::kString) count = 0;
        else if (n.max_length == kUnbounded) count = std::min(count, n.min_length);
      }
    } else if (f.kind == FrameKind::kArray) {
      const SchemaNode& n = schema_->nodes()[f.node];
      const int32_t settled = std::max(static_cast<int32_t>(n.prefix.size()), n.min_items);
      if (n.max_items == kUnbounded) count = std::min(count, settled);
    }
    put(static_cast<int64_t>(f.kind) | int64_t(f.phase) << 8 | int64_t(f.ws) << 16 | int64_t(f.pending) << 24 |
        int64_t(static_cast<uint32_t>(f.node)) << 32);
    put(static_cast<int64_t>(static_cast<uint32_t>(count)) | int64_t(static_cast<uint32_t>(f.pos)) << 32);
    put(static_cast<int64_t>(f.seen));
    put(static_cast<int64_t>(f.end));
    put(static_cast<int64_t>(f.key.size()));
    k += f.key;
  }
  return k;
}

}  // namespace kiln::structured
