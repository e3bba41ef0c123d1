// Runtime values of the Jinja interpreter: construction from JSON, Python str()/repr() printing,
// json.dumps as transformers' tojson calls it, Python equality, and UTF-8 helpers.
#include "model/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>

namespace kiln::jinja {

const Value* Args::get(size_t index, const std::string& name) const {
  for (auto& [k, v] : kw)
    if (k == name) return &v;
  return index < pos.size() ? &pos[index] : nullptr;
}

Value::~Value() {
  const bool owns_list = l && l.use_count() == 1, owns_dict = d && d.use_count() == 1;
  if (!owns_list && !owns_dict) return;
  std::vector<Value> pending;
  // Moves the elements of the containers only `v` holds into `pending`, leaving them empty.
  auto detach = [&pending](Value& v) {
    if (v.l && v.l.use_count() == 1) {
      for (Value& e : *v.l) pending.push_back(std::move(e));
      v.l->clear();
    }
    if (v.d && v.d.use_count() == 1) {
      for (auto& kv : v.d->items) {
        pending.push_back(std::move(kv.first));
        pending.push_back(std::move(kv.second));
      }
      v.d->items.clear();
    }
  };
  detach(*this);
  while (!pending.empty()) {
    Value v = std::move(pending.back());
    pending.pop_back();
    detach(v);  // v's own destructor then finds its containers empty
  }
}

Value Value::list(List x, bool tuple) {
  Value v;
  v.t = T::List;
  v.l = std::make_shared<List>(std::move(x));
  v.tuple = tuple;
  return v;
}

Value Value::dict() {
  Value v;
  v.t = T::Dict;
  v.d = std::make_shared<Dict>();
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return integer(int64_t(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (auto& e : j) l.push_back(from_json(e));
      return list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = dict();
      for (auto& [k, e] : j.items()) v.d->set(k, from_json(e));
      return v;
    }
    default: return undef();
  }
}

bool Value::truthy() const {
  switch (t) {
    case T::Undefined: case T::None: return false;
    case T::Bool: return b;
    case T::Int: return i != 0;
    case T::Float: return f != 0;
    case T::Str: return !s.empty();
    case T::List: return !l->empty();
    case T::Dict: return ns || !d->items.empty();
    case T::Func: return true;
  }
  return false;
}

const Value* Dict::find(const Value& k) const {
  for (auto& [key, v] : items)
    if (equals(key, k)) return &v;
  return nullptr;
}

const Value* Dict::find(const std::string& k) const {
  for (auto& [key, v] : items)
    if (key.is_str() && key.s == k) return &v;
  return nullptr;
}

void Dict::set(Value k, Value v) {
  for (auto& [key, old] : items)
    if (equals(key, k)) { old = std::move(v); return; }  // Python keeps the first key object
  items.emplace_back(std::move(k), std::move(v));
}

bool is_hashable(const Value& v) {
  std::vector<const Value*> pending = {&v};  // tuples can nest as deep as a loop builds them
  while (!pending.empty()) {
    const Value* x = pending.back();
    pending.pop_back();
    if (x->is_dict() || (x->is_list() && !x->tuple)) return false;
    if (x->is_list())
      for (const Value& e : *x->l) pending.push_back(&e);
  }
  return true;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: scientific when exp < -4 or exp >= 16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(size_t(-exp - 1), '0') + digits;
  } else if (size_t(exp + 1) >= digits.size()) {
    out = digits + std::string(size_t(exp + 1) - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
  }
  return neg ? "-" + out : out;
}

static bool py_printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x2028 || c == 0x2029 || (c >= 0x200b && c <= 0x200f) || (c >= 0x202a && c <= 0x202e)) return false;
  if ((c >= 0x2060 && c <= 0x2064) || c == 0xfeff || (c >= 0xd800 && c <= 0xdfff)) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x202f || c == 0x205f || c == 0x3000) return false;
  return true;
}

static std::string str_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == char32_t(q) || c == '\\') { out += '\\'; out += char(c); }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (!py_printable(c)) {
      char b[16];
      if (c < 0x100) std::snprintf(b, sizeof b, "\\x%02x", unsigned(c));
      else if (c < 0x10000) std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
      else std::snprintf(b, sizeof b, "\\U%08x", unsigned(c));
      out += b;
    } else utf8_append(out, c);
  }
  out += q;
  return out;
}

namespace {

// repr() with Python's guard for containers that hold themselves ("[...]", "{...}"), and a bound
// on nesting (kMaxValueNesting; deeper parts print as "..."), so no value can exhaust the stack.
struct ReprWriter {
  std::vector<const void*> open;  // containers being printed, outermost first

  std::string write(const Value& v) {
    switch (v.t) {
      case Value::T::Undefined: return "";
      case Value::T::None: return "None";
      case Value::T::Bool: return v.b ? "True" : "False";
      case Value::T::Int: return std::to_string(v.i);
      case Value::T::Float: return float_repr(v.f);
      case Value::T::Str: return v.safe ? "Markup(" + str_repr(v.s) + ")" : str_repr(v.s);
      case Value::T::List: {
        if (std::find(open.begin(), open.end(), v.l.get()) != open.end()) return v.tuple ? "(...)" : "[...]";
        if (open.size() >= kMaxValueNesting) return "...";
        open.push_back(v.l.get());
        std::string out = v.tuple ? "(" : "[";
        for (size_t k = 0; k < v.l->size(); ++k) out += (k ? ", " : "") + write((*v.l)[k]);
        if (v.tuple && v.l->size() == 1) out += ",";
        open.pop_back();
        return out + (v.tuple ? ")" : "]");
      }
      case Value::T::Dict: {
        const bool cycle = std::find(open.begin(), open.end(), v.d.get()) != open.end();
        if (cycle) return v.ns ? "<Namespace {...}>" : "{...}";
        if (open.size() >= kMaxValueNesting) return "...";
        open.push_back(v.d.get());
        std::string out = v.ns ? "<Namespace {" : "{";
        bool first = true;
        for (auto& [k, e] : v.d->items) {
          out += (first ? "" : ", ") + write(k) + ": " + write(e);
          first = false;
        }
        open.pop_back();
        return out + (v.ns ? "}>" : "}");
      }
      case Value::T::Func: return "<function>";
    }
    return "";
  }
};

}  // namespace

std::string repr(const Value& v) { return ReprWriter{}.write(v); }

std::string to_str(const Value& v) { return v.is_str() ? v.s : repr(v); }

static void json_str(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    char b[16];
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
          if (c >= 0x10000) {
            char32_t u = c - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", unsigned(0xd800 + (u >> 10)), unsigned(0xdc00 + (u & 0x3ff)));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
          }
          out += b;
        } else {
          utf8_append(out, c);
        }
    }
  }
  out += '"';
}

namespace {
// json.dumps turns dict keys into strings: str as it is, numbers as printed, true/false/null.
Result<std::string> json_key(const Value& k) {
  switch (k.t) {
    case Value::T::Str: return k.s;
    case Value::T::Int: return std::to_string(k.i);
    case Value::T::Bool: return std::string(k.b ? "true" : "false");
    case Value::T::None: return std::string("null");
    case Value::T::Float:
      if (std::isnan(k.f)) return std::string("NaN");
      if (std::isinf(k.f)) return std::string(k.f > 0 ? "Infinity" : "-Infinity");
      return float_repr(k.f);
    default: return invalid_argument(std::string("keys must be str, int, float, bool or None, not ") + type_name(k));
  }
}

struct JsonWriter {
  bool ensure_ascii;
  std::optional<std::string> indent;  // none: one line
  std::string item_sep, key_sep;
  bool sort_keys;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) out += *indent;
  }
  Status write(const Value& v, int level) {
    if (level >= kMaxValueNesting) return invalid_argument("Circular reference detected (or nesting deeper than " +
                                                           std::to_string(kMaxValueNesting) + " levels)");
    switch (v.t) {
      case Value::T::None: out += "null"; return Status::Ok();
      case Value::T::Bool: out += v.b ? "true" : "false"; return Status::Ok();
      case Value::T::Int: out += std::to_string(v.i); return Status::Ok();
      case Value::T::Float:
        if (std::isnan(v.f)) out += "NaN";
        else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
        else out += float_repr(v.f);
        return Status::Ok();
      case Value::T::Str: json_str(out, v.s, ensure_ascii); return Status::Ok();
      case Value::T::List: {
        if (v.l->empty()) { out += "[]"; return Status::Ok(); }
        out += '[';
        for (size_t k = 0; k < v.l->size(); ++k) {
          if (k) out += item_sep;
          if (indent) newline(level + 1);
          KILN_RETURN_IF_ERROR(write((*v.l)[k], level + 1));
        }
        if (indent) newline(level);
        out += ']';
        return Status::Ok();
      }
      case Value::T::Dict: {
        if (v.d->items.empty()) { out += "{}"; return Status::Ok(); }
        std::vector<const std::pair<Value, Value>*> items;
        for (auto& kv : v.d->items) items.push_back(&kv);
        if (sort_keys) {
          bool mixed = false;
          std::stable_sort(items.begin(), items.end(), [&mixed](auto* a, auto* b) {
            const Value &x = a->first, &y = b->first;
            if (x.is_num() && y.is_num()) return x.is_int() && y.is_int() ? x.as_int() < y.as_int() : x.as_double() < y.as_double();
            if (x.is_str() && y.is_str()) return x.s < y.s;  // UTF-8 bytes sort as code points
            mixed = true;
            return false;
          });
          if (mixed) return invalid_argument("'<' not supported between the dict's keys (sort_keys needs keys of one kind)");
        }
        out += '{';
        for (size_t k = 0; k < items.size(); ++k) {
          if (k) out += item_sep;
          if (indent) newline(level + 1);
          KILN_ASSIGN_OR_RETURN(std::string key, json_key(items[k]->first));
          json_str(out, key, ensure_ascii);
          out += key_sep;
          KILN_RETURN_IF_ERROR(write(items[k]->second, level + 1));
        }
        if (indent) newline(level);
        out += '}';
        return Status::Ok();
      }
      case Value::T::Undefined: return invalid_argument("Object of type Undefined is not JSON serializable");
      case Value::T::Func: return invalid_argument("Object of type function is not JSON serializable");
    }
    return Status::Ok();
  }
};
}  // namespace

Result<std::string> to_json(const Value& v, bool ensure_ascii, const std::optional<std::string>& indent, const std::string& item_sep,
                            const std::string& key_sep, bool sort_keys) {
  JsonWriter w{ensure_ascii, indent, item_sep, key_sep, sort_keys, {}};
  if (w.item_sep.empty()) w.item_sep = indent ? "," : ", ";
  if (w.key_sep.empty()) w.key_sep = ": ";
  KILN_RETURN_IF_ERROR(w.write(v, 0));
  return std::move(w.out);
}

static bool equals_at(const Value& a, const Value& b, int depth);
bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }

// Past kMaxValueNesting (a container holding itself) values compare unequal.
static bool equals_at(const Value& a, const Value& b, int depth) {
  if (depth >= kMaxValueNesting) return false;
  if (a.is_num() && b.is_num()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case Value::T::Undefined: case Value::T::None: return true;
    case Value::T::Str: return a.s == b.s;
    case Value::T::List:
      if (a.tuple != b.tuple) return false;  // [1] != (1,)
      if (a.l == b.l) return true;  // the same object (Python compares identical elements equal)
      if (a.l->size() != b.l->size()) return false;
      for (size_t k = 0; k < a.l->size(); ++k)
        if (!equals_at((*a.l)[k], (*b.l)[k], depth + 1)) return false;
      return true;
    case Value::T::Dict:
      if (a.d == b.d) return true;
      if (a.ns || b.ns) return false;  // namespaces compare by identity, like jinja2's Namespace
      if (a.d->items.size() != b.d->items.size()) return false;
      for (auto& [k, v] : a.d->items) {
        const Value* o = b.d->find(k);  // keys are hashable: their comparison is shallow or bounded
        if (!o || !equals_at(v, *o, depth + 1)) return false;
      }
      return true;
    case Value::T::Func: return a.fn == b.fn;
    default: return false;
  }
}

const char* type_name(const Value& v) {
  switch (v.t) {
    case Value::T::Undefined: return "Undefined";
    case Value::T::None: return "NoneType";
    case Value::T::Bool: return "bool";
    case Value::T::Int: return "int";
    case Value::T::Float: return "float";
    case Value::T::Str: return "str";
    case Value::T::List: return v.tuple ? "tuple" : "list";
    case Value::T::Dict: return "dict";
    case Value::T::Func: return "function";
  }
  return "?";
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    unsigned char c = s[k];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || k + n > s.size()) { out += char32_t(0xfffd); ++k; continue; }
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int m = 1; m < n; ++m) cp = (cp << 6) | (static_cast<unsigned char>(s[k + m]) & 0x3f);
    out += cp;
    k += n;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) out += char(c);
  else if (c < 0x800) { out += char(0xc0 | (c >> 6)); out += char(0x80 | (c & 0x3f)); }
  else if (c < 0x10000) { out += char(0xe0 | (c >> 12)); out += char(0x80 | ((c >> 6) & 0x3f)); out += char(0x80 | (c & 0x3f)); }
  else { out += char(0xf0 | (c >> 18)); out += char(0x80 | ((c >> 12) & 0x3f)); out += char(0x80 | ((c >> 6) & 0x3f)); out += char(0x80 | (c & 0x3f)); }
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

}  // namespace kiln::jinja
