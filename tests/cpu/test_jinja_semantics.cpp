// Jinja language semantics of kiln's chat-template interpreter, case by case: each template is
// rendered and compared with what jinja2 3.x gives as transformers configures it (its
// _compile_jinja_template: ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, its tojson);
// the expected strings were produced by running those templates there. A null expectation means
// jinja2 raises, and kiln must return an error (its wording is not compared).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"

namespace kiln {
namespace {

using ojson = nlohmann::ordered_json;

struct Case {
  const char* src;
  const char* context;   // a JSON object, or "" for none
  const char* expected;  // nullptr: jinja2 raises
};

template <size_t N>
void check_cases(const Case (&cases)[N]) {
  for (const Case& c : cases) {
    auto t = ChatTemplate::parse(c.src, "t");
    ojson ctx = *c.context ? ojson::parse(c.context) : ojson::object();
    Result<std::string> r = t.ok() ? t.value().render(ctx) : Result<std::string>(t.status());
    if (!c.expected) {
      EXPECT_FALSE(r.ok()) << c.src << " rendered " << r.value() << " where jinja2 raises";
    } else if (!r.ok()) {
      ADD_FAILURE() << c.src << ": " << r.status().message();
    } else {
      EXPECT_EQ(r.value(), c.expected) << c.src;
    }
  }
}

// Dict literals keep their keys' types: {1: 'a'} and {'1': 'a'} differ, 1, 1.0 and True are one key,
// dictsort compares typed keys (ByteDance-Seed-OSS compares them with an int), tojson turns keys into
// strings as json.dumps does; [1] and (1,) are not equal.
TEST(JinjaSemantics, DictKeysKeepTheirTypes) {
  const Case cases[] = {
    {"{% set d = {0: 0, 512: 128} %}{% for k, v in d|dictsort %}{{ k <= 100 }},{{ v }};{% endfor %}", "", "True,0;False,128;"},
    {"{% set d = {1: 'one', '1': 'str'} %}[{{ d[1] }}][{{ d['1'] }}][{{ d }}][{{ d|length }}]", "", "[one][str][{1: 'one', '1': 'str'}][2]"},
    {"{{ {true: 'T', none: 'N', 1.5: 'F', (1, 'a'): 'tuple'} }}", "", "{True: 'T', None: 'N', 1.5: 'F', (1, 'a'): 'tuple'}"},
    {"{% set d = {1: 'a', 1.0: 'b', true: 'c'} %}{{ d }}", "", "{1: 'c'}"},
    {"{% set d = {2: 'b', 1: 'a'} %}{{ d.keys()|list }} {{ d.items()|list }} {{ d.get(2) }} {{ d.get('2') }} {{ 1 in d }} {{ '1' in d }}", "", "[2, 1] [(2, 'b'), (1, 'a')] b None True False"},
    {"{% set d = {2: 'b', 10: 'a'} %}{% for k in d %}{{ k + 1 }},{% endfor %}{{ d|dictsort }} {{ d|dictsort(by='value') }}", "", "3,11,[(2, 'b'), (10, 'a')] [(10, 'a'), (2, 'b')]"},
    {"{{ {1: 'a', none: 'b', true: 'c', 2.5: 'd'}|tojson }}", "", "{\"1\": \"c\", \"null\": \"b\", \"2.5\": \"d\"}"},
    {"{{ {2: 'a', 1: 'b'}|tojson(sort_keys=true) }}", "", "{\"1\": \"b\", \"2\": \"a\"}"},
    {"{{ {'b': 1, 'a': {'y': 1, 'x': 2}}|tojson(indent=2) }}|{{ [1, [2]]|tojson(indent='  ') }}|{{ {'a': 1}|tojson(indent='\\t') }}|{{ [1]|tojson(indent=0) }}", "", "{\n  \"b\": 1,\n  \"a\": {\n    \"y\": 1,\n    \"x\": 2\n  }\n}|[\n  1,\n  [\n    2\n  ]\n]|{\n\t\"a\": 1\n}|[\n1\n]"},
    {"{{ [1] == (1,) }} {{ (1, 2) in [[1, 2]] }} {{ (1, 2) == (1, 2) }} {{ [1, 2] == [1, 2] }} {{ (1, 2) in [(1, 2)] }}", "", "False False True True True"},
    {"{{ d[1] }}|{{ d['1'] }}|{{ d.a }}", "{\"d\": {\"1\": \"json\", \"a\": 2}}", "|json|2"},
  };
  check_cases(cases);
}

// select / reject / selectattr / rejectattr / map iterate their input only when it is true: on none
// (functionary-medium-v3.1 with tools=None, MiniMax-M1) or any false value they give nothing.
TEST(JinjaSemantics, SelectAndMapOfAFalseValueAreEmpty) {
  const Case cases[] = {
    {"{{ tools | selectattr('type', 'equalto', 'x') | list | length }}", "{\"tools\": null}", "0"},
    {"[{{ x|map('upper')|list }}][{{ x|reject|list }}][{{ x|rejectattr('a')|list }}][{{ x|select|list }}][{{ x|map(attribute='a')|list }}]", "{\"x\": null}", "[[]][[]][[]][[]][[]]"},
    {"{{ x|select|list }}|{{ y|selectattr('a')|list }}|{{ z|map('string')|list }}", "{\"x\": 0, \"y\": \"\", \"z\": false}", "[]|[]|[]"},
    {"{{ missing|selectattr('a')|list }}|{{ missing|map('upper')|list }}", "", "[]|[]"},
    {"{{ 5|select|list }}", "", nullptr},  // TypeError: 'int' object is not iterable
  };
  check_cases(cases);
}

// Markup (jinja2's safe strings; transformers renders with autoescape off): |safe and |escape make
// one, Markup + str escapes the str (functionary-medium-v3.1 prints its tools' JSON escaped this
// way), |escape leaves a Markup alone, ~ and |replace give plain strings, Markup's methods escape
// their arguments, and a Markup prints as Markup('...') inside a list.
TEST(JinjaSemantics, MarkupAsJinja2WithAutoescapeOff) {
  const Case cases[] = {
    {"{{ 'a: '|safe + x }}|{{ x + 'b'|safe }}", "{\"x\": \"\\\"<b>&'\"}", "a: &#34;&lt;b&gt;&amp;&#39;|&#34;&lt;b&gt;&amp;&#39;b"},
    {"{{ 'f: '|safe + t|tojson }}", "{\"t\": {\"k\": \"v\", \"q\": \"<'>\"}}", "f: {&#34;k&#34;: &#34;v&#34;, &#34;q&#34;: &#34;&lt;&#39;&gt;&#34;}"},
    {"{{ '<'|e|e }}|{{ ('<'|e) + '<' }}|{{ ('<'|e) ~ '<' }}|{{ '<'|forceescape|forceescape }}|{{ '<'|safe|forceescape }}", "", "&lt;|&lt;&lt;|&lt;<|&amp;lt;|&lt;"},
    {"{{ 'x'|safe is escaped }} {{ 'x' is escaped }} {{ 'x'|e is escaped }} {{ ('x'|safe)|string is escaped }} {{ ('x'|safe ~ 'y') is escaped }} {{ 1|e is escaped }}", "", "True False True True False True"},
    {"{{ ['a'|safe, '<'|e, 'b'] }}|{{ {'k': 'v'|safe} }}|{{ none|e }}|{{ 3|safe + '<' }}", "", "[Markup('a'), Markup('&lt;'), 'b']|{'k': Markup('v')}|None|3&lt;"},
    {"{{ ('<'|e * 2) }}|{{ ('<x>'|safe)[1] is escaped }}|{{ ('<x>'|safe)[1:] }}|{{ ('<x>'|safe)[1:] is escaped }}", "", "&lt;&lt;|True|x>|True"},
    {"{{ ('a,b'|safe).split(',') }}|{{ ('a'|safe).replace('a', '<') }}|{{ (', '|safe).join(['<', 'b'|safe]) }}|{{ ('x'|safe).upper() }}|{{ ('x'|safe).startswith('x') }}", "", "[Markup('a'), Markup('b')]|&lt;|&lt;, b|X|True"},
    {"{{ ('a'|safe)|upper is escaped }} {{ ('a'|safe)|lower }} {{ (' a '|safe)|trim is escaped }} {{ ('a'|safe)|title is escaped }} {{ ('a'|safe)|replace('a', '<') is escaped }} {{ ('a'|safe)|replace('a', '<') }} {{ ('a\nb'|safe)|indent is escaped }} {{ ('a'|safe)|center(3) is escaped }}", "", "True a True False False < True True"},
    {"{{ 'x'|safe == 'x' }} {{ 'x'|safe in ['x'] }} {{ ('x'|safe)|length }}", "", "True True 1"},
    {"{{ (('x'|safe) + 1) }}", "", nullptr},  // TypeError: unsupported operand type(s) for +: 'Markup' and 'int'
  };
  check_cases(cases);
}

}  // namespace
}  // namespace kiln
