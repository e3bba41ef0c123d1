// The Jinja syntax tree and its front end: a lexer that applies trim_blocks, lstrip_blocks and the
// -/+ whitespace markers exactly as jinja2's lexer does, and a recursive-descent parser with Jinja's
// operator precedence (filters and tests bind tighter than arithmetic).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/jinja/value.h"

namespace kiln::jinja {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

enum class EK { Const, Name, List, Tuple, Dict, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, Binary, Compare,
                And, Or, Cond };

struct Expr {
  EK kind;
  int line = 0;
  Value cval;                  // Const
  std::string name;            // Name; Attr; Filter/Test name; Binary operator
  std::vector<ExprP> ch;       // operands: Attr/Item/Filter/Test/Call: ch[0] is the object, then the args
  std::vector<std::pair<std::string, ExprP>> kwargs;  // Call/Filter/Test keyword args
  std::vector<std::string> ops;  // Compare: ops[k] between ch[k] and ch[k+1]
  bool negate = false;           // Test: `is not`

  Expr() = default;
  Expr(const Expr&) = delete;
  Expr& operator=(const Expr&) = delete;
  // Frees the subtree without recursion: a long operator chain makes a tree as deep as it is long.
  ~Expr();
};

// Nesting of expressions and blocks the parser follows (parentheses, unary operators, nested
// blocks), so that a hostile template cannot exhaust the stack while it is parsed.
constexpr int kMaxParseNesting = 200;

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

// Generation: transformers' {% generation %} ... {% endgeneration %} (its AssistantTracker): renders
// its body in a scope of its own; a tracked render also records where that output lands.
// CallBlock: {% call(params) macro(args) %}body{% endcall %}: the body is a macro named caller (params
// in targets/defaults) passed to the call in expr as the keyword argument caller.
enum class NK { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, FilterBlock, Scope, With, Generation, CallBlock };

struct Node {
  NK kind;
  int line = 0;
  std::string text;                  // Text; Macro name; Set: namespace attribute (ns.attr) when non-empty
  ExprP expr;                        // Output; If test; For iterable; Set value; FilterBlock filter chain; CallBlock call
  std::vector<std::string> targets;  // For/Set names (several: tuple unpacking); Macro / CallBlock parameters
  std::vector<ExprP> defaults;       // Macro / CallBlock parameter defaults (nullptr: required); With values
  ExprP cond;                        // For ... if cond
  bool catch_varargs = false;        // Macro / CallBlock: the body uses varargs (extra positional args go there)
  bool catch_kwargs = false;         // ... uses kwargs (extra keyword args go there)
  Body body, else_body;
};

struct Program {
  std::string name;
  std::string source;  // the template text as given
  Body body;
  bool has_generation = false;  // the template has a {% generation %} block
};

// Parses a template; errors read "chat template NAME, line N: ...".
Result<std::shared_ptr<Program>> parse_program(const std::string& source, const std::string& name);

}  // namespace kiln::jinja
