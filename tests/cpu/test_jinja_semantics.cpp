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

// Python's string formatting: the % operator and |format (flags, width, precision, *, %(name)s, the
// conversions), str.format (auto / numbered / named fields, attribute and item lookups, conversions,
// the format-spec mini-language, nested fields), round as Python rounds (the exact binary value, half
// to even: 2.675 -> 2.67), int with base prefixes, underscores and its fallback through float.
TEST(JinjaSemantics, FormattingRoundingAndNumberParsingAsPython) {
  const Case cases[] = {
    {"{{ '%s-%s' % ('a', 1) }}|{{ '%d%%' % 50 }}|{{ '%.1f' % 2.25 }}|{{ '%s' % 'x' }}|{{ '%s' % [1, 'a'] }}|{{ '%s' % {'a': 1} }}|{{ '%(a)s+%(b)05.1f' % {'a': 'x', 'b': 2.5} }}", "", "a-1|50%|2.2|x|[1, 'a']|{'a': 1}|x+002.5"},
    {"{{ '%5s|%-5s|%.2s|%5.1s|' % ('a', 'b', 'xyz', 'pq') }}{{ '%-5d|%05d|%+d|% d|%3d|%.3d' % (3, -3, 3, 3, 42, 7) }}", "", "    a|b    |xy|    p|3    |-0003|+3| 3| 42|007"},
    {"{{ '%x %X %o %#x %#o %e %E %g %G %c %c %r %i %u' % (255, 255, 8, 255, 8, 12345.678, 0.000123, 1e-5, 1e20, 65, 'z', 'q', 3.9, -2) }}", "", "ff FF 10 0xff 0o10 1.234568e+04 1.230000E-04 1e-05 1E+20 A z 'q' 3 -2"},
    {"{{ '%5.2f|%-8.3e|%08.3f|%+.0f|%.0f|%.0f|%#.0f' % (3.14159, 1234.5, -3.14159, 2.5, 0.5, 1.5, 3.0) }}", "", " 3.14|1.234e+03|-003.142|+2|0|2|3."},
    {"{{ '%*d|%-*d|%.*f' % (5, 42, 4, 7, 2, 3.14159) }}", "", "   42|7   |3.14"},
    {"{{ '%d'|format(3.7) }}|{{ '%.2f'|format(2) }}|{{ '%5s|%-5s|'|format('a','b') }}|{{ '%x %o %e'|format(255, 8, 12345.678) }}|{{ '%s %r'|format(none, 'q') }}|{{ '%(a)s'|format(a=1) }}|{{ '%%'|format() }}|{{ '%s'|format([1,'a']) }}|{{ '%5.1f|'|format(3.14159) }}|{{ '%c'|format(65) }}|{{ '%+d'|format(3) }}", "", "3|2.00|    a|b    ||ff 10 1.234568e+04|None 'q'|1|%|[1, 'a']|  3.1||A|+3"},
    {"{{ '%d'|format('3') }}", "", nullptr},  // TypeError: %d format: a real number is required, not str
    {"{{ '%s %s' % ('a',) }}", "", nullptr},  // TypeError: not enough arguments for format string
    {"{{ '%s' % ('a', 'b') }}", "", nullptr},  // TypeError: not all arguments converted during string formatting
    {"{{ '%x' % 2.5 }}", "", nullptr},  // TypeError: %x format: an integer is required, not float
    {"{{ '%f' % 'x' }}", "", nullptr},  // TypeError: must be real number, not str
    {"{{ '%(a)s' % ('x',) }}", "", nullptr},  // TypeError: format requires a mapping
    {"{{ '<%s>'|safe % '<b>' }}|{{ ('%s'|safe % 5) is escaped }}|{{ ('%s and %d'|safe)|format('&', 3) }}", "", "<&lt;b&gt;>|True|&amp; and 3"},
    {"{{ '{} and {}'.format('a', 1) }}|{{ '{0}{0}{1}'.format('r', 's') }}|{{ '{name}!'.format(name='N') }}|{{ '{{literal}}'.format() }}|{{ '{!r}'.format('x') }}|{{ '{0!s:>4}'.format(1) }}", "", "a and 1|rrs|N!|{literal}|'x'|   1"},
    {"{{ '{:>5}|{:<5}|{:^5}|{:*^7}|{:05}|{:>5}'.format('a', 'b', 'c', 'ab', 42, 1.5) }}", "", "    a|b    |  c  |**ab***|00042|  1.5"},
    {"{{ '{:.2f}|{:05d}|{:,}|{:_}|{:,.2f}|{:+d}|{: d}|{:x}|{:#x}|{:#b}|{:o}|{:X}|{:e}|{:.3e}|{:g}|{:%}|{:.1%}|{:c}'.format(3.14159, 42, 1234567, 1234567, 1234567.891, 5, 5, 255, 255, 5, 8, 255, 1234.5, 0.00012345, 0.0001, 0.5, 0.123, 65) }}", "", "3.14|00042|1,234,567|1_234_567|1,234,567.89|+5| 5|ff|0xff|0b101|10|FF|1.234500e+03|1.234e-04|0.0001|50.000000%|12.3%|A"},
    {"{{ '{}|{:.3}|{:.3}|{:.2}|{:10.3f}|{:<10.3f}|{:=+8}|{:08}|{}|{}|{:.0f}|{:.0f}'.format(1.0, 1.0, 1234.5678, 0.0001, 3.14159, 3.14159, -5, -5, 1e16, 1e-5, 0.5, 2.5) }}", "", "1.0|1.0|1.23e+03|0.0001|     3.142|3.142     |-      5|-0000005|1e+16|1e-05|0|2"},
    {"{{ '{:>{w}}|{:{f}^{w}}|{:.{p}f}'.format('x', 'y', 2.71828, w=5, f='-', p=3) }}", "", "    x|--y--|2.718"},
    {"{{ '{0[a]}|{0.a}|{1[1]}|{0[b][0]}'.format(d, [1, 2]) }}", "{\"d\": {\"a\": \"A\", \"b\": [7]}}", "A|A|2|7"},
    {"{{ '{}'.format(none) }}|{{ '{}'.format([1, 'a']) }}|{{ '{:>3}'.format(true) }}|{{ '{}'.format(true) }}|{{ '{:d}'.format(true) }}", "", "None|[1, 'a']|  1|True|1"},
    {"{{ '{:d}'.format('x') }}", "", nullptr},  // ValueError: Unknown format code 'd' for object of type 'str'
    {"{{ '{:.2}'.format(5) }}", "", nullptr},  // ValueError: Precision not allowed in integer format specifier
    {"{{ '{} {}'.format(1) }}", "", nullptr},  // IndexError: tuple index out of range
    {"{{ '{0} {}'.format(1, 2) }}", "", nullptr},  // ValueError: cannot switch from manual field specification to automatic field num
    {"{{ '{x}'.format(y=1) }}", "", nullptr},  // KeyError: 'x'
    {"{{ '{:>5}'.format(none) }}", "", nullptr},  // TypeError: unsupported format string passed to NoneType.__format__
    {"{{ 2.675|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ -2.5|round }} {{ 0.125|round(2) }} {{ 0.375|round(2) }} {{ 1.005|round(2) }} {{ 1234.5|round(-1) }} {{ 1250.0|round(-2) }} {{ 1350.0|round(-2) }} {{ 15|round(-1) }} {{ 25|round(-1) }} {{ -15|round(-1) }} {{ 3|round }} {{ 3|round(2) }} {{ true|round }}", "", "2.67 2.0 4.0 -2.0 0.12 0.38 1.0 1230.0 1200.0 1400.0 20 20 -20 3 3 1"},
    {"{{ 2.675|round(2, 'floor') }} {{ 2.671|round(2, 'ceil') }} {{ 3|round(method='ceil') }} {{ -2.5|round(0, 'floor') }} {{ 1e300|round(2) }} {{ 123.456|round(-5) }} {{ 0.1|round(20) }}", "", "2.67 2.68 3.0 -3.0 1e+300 0.0 0.1"},
    {"{{ 1e300|round(-400) }} {{ 5e-324|round(400) }} {{ 123456789.123|round(-3) }}", "", "0.0 5e-324 123457000.0"},
    {"{{ '0b11'|int(base=2) }} {{ '0o17'|int(base=8) }} {{ '0x1A'|int(0, 16) }} {{ '0x1a'|int(base=0) }} {{ ' -1_000 '|int }} {{ '1__0'|int }} {{ '12'|int(base=3) }} {{ 'z'|int(base=36) }} {{ '010'|int(base=0) }} {{ '0b2'|int(7, 2) }} {{ '3.9'|int }} {{ '-3.9e1'|int }} {{ 'nan'|int(5) }} {{ none|int }} {{ ''|int }} {{ '1_0.5'|float }} {{ '0x10'|float(-1) }} {{ ' inf '|float }} {{ '_1'|int(-1) }}", "", "3 15 26 26 -1000 0 5 35 10 7 3 -39 5 0 0 10.5 -1 inf -1"},
    {"{{ 9223372036854775807|string|int }} {{ '-9223372036854775808'|int }} {{ 1e18|int }} {{ -3.99|int }}", "", "9223372036854775807 -9223372036854775808 1000000000000000000 -3"},
    {"{{ 'inf'|int }}", "", "0"},
  };
  check_cases(cases);
  // Python's ints are unbounded, kiln's are 64-bit: a value past that is an error, never a wrong number
  // (jinja2 gives 99999999999999999999 and 100000000000000000000).
  for (const char* src : {"{{ '99999999999999999999'|int }}", "{{ 1e20|int }}"}) {
    auto r = ChatTemplate::parse(src, "t").value().render(ojson::object());
    ASSERT_FALSE(r.ok()) << src;
    EXPECT_NE(r.status().message().find("64-bit"), std::string::npos) << r.status().message();
  }
}

// Features real templates use: loop.changed, {% call %} blocks with caller() (and its arguments),
// macro varargs / kwargs (extra arguments only where the body uses them) / name, groupby (with default and case_sensitive; the (grouper, list)
// tuples), batch, slice, truncate, striptags, pprint, and |attr (getattr only: not a dict's keys).
TEST(JinjaSemantics, LoopChangedCallBlocksMacroArgumentsAndMoreFilters) {
  const Case cases[] = {
    {"{{ 'x\ny'|indent(-3) }}|{{ 'x\ny'|indent(true) }}|{{ 'x\ny'|indent('--', true) }}", "", "x\ny|x\n y|--x\n--y"},
    {"{{ 'x\ny'|indent(2.5) }}", "", nullptr},
    // jinja2 would build a string of 999999999 spaces (1 GB); kiln's output bound refuses it first.
    {"{{ 'x\ny'|indent(999999999) }}", "", nullptr},
    {"{% for x in [1,1,2,3,3] %}{% if loop.changed(x) %}{{ x }}{% endif %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}|{% for x in [1,2,3] %}{{ loop.previtem|default('-') }}{{ loop.nextitem|default('-') }};{% endfor %}", "", "1101021031010|-2;13;2-;"},
    {"{% for m in msgs %}{% if loop.changed(m.role) %}[{{ m.role }}]{% endif %}{{ m.content }}{% endfor %}", "{\"msgs\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}, {\"role\": \"assistant\", \"content\": \"c\"}]}", "[user]ab[assistant]c"},
    {"{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ n }}{% endcall %}", "{\"n\": 7}", "<b>inner 7</b>"},
    {"{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each(items) %}[{{ v }}]{% endcall %}", "{\"items\": [3, 1, 2]}", "[3][1][2]"},
    {"{% macro m() %}\n  {{ caller() }}\n{% endmacro %}\n{% call m() %}\n  body\n{% endcall %}\nend", "", "    body\n\nend"},
    {"{% macro f(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ f(1, 2, 3, k=4) }}|{{ f(5) }}", "", "1|(2, 3)|{'k': 4}|5|()|{}"},
    {"{% macro f(a, b=2) %}{% endmacro %}{{ f.name }}", "", "f"},
    {"{% for g in [{'k':'a','v':1},{'k':'b','v':2},{'k':'A','v':3}]|groupby('k') %}{{ g.grouper }}={{ g.list|map(attribute='v')|list }};{% endfor %}|{{ [{'k':'b'},{'k':'a'}]|groupby('k') }}", "", "a=[1, 3];b=[2];|[('a', [{'k': 'a'}]), ('b', [{'k': 'b'}])]"},
    {"{% for grouper, list in users|groupby('city', default='NY') %}{{ grouper }}:{{ list|map(attribute='name')|join(',') }};{% endfor %}", "{\"users\": [{\"name\": \"a\", \"city\": \"LA\"}, {\"name\": \"b\"}, {\"name\": \"c\", \"city\": \"la\"}]}", "LA:a,c;NY:b;"},
    {"{{ users|groupby('city', case_sensitive=true)|map(attribute='grouper')|list }}|{{ users|groupby('city')|map(attribute='grouper')|list }}|{{ users|groupby('city')|first|last|length }}", "{\"users\": [{\"name\": \"a\", \"city\": \"LA\"}, {\"name\": \"c\", \"city\": \"la\"}, {\"name\": \"d\", \"city\": \"NY\"}]}", "['LA', 'NY', 'la']|['LA', 'NY']|2"},
    {"{{ [1,2,3,4,5]|batch(2)|list }} {{ [1,2,3,4,5]|batch(3, 0)|list }} {{ [1,2,3,4,5]|slice(2)|list }} {{ [1,2,3,4,5,6,7]|slice(3, 'x')|list }} {{ []|batch(2)|list }}", "", "[[1, 2], [3, 4], [5]] [[1, 2, 3], [4, 5, 0]] [[1, 2, 3], [4, 5]] [[1, 2, 3], [4, 5, 'x'], [6, 7, 'x']] []"},
    {"{{ 'hello world foo'|truncate(9) }}|{{ 'foo bar baz qux'|truncate(9, true) }}|{{ 'foo bar baz qux'|truncate(11) }}|{{ 'foo bar baz qux'|truncate(11, false, '...', 0) }}|{{ 'abcdefghijklmnop'|truncate(10, leeway=0) }}", "", "hello...|foo ba...|foo bar baz qux|foo bar...|abcdefg..."},
    {"{{ '<b>x</b>   y <!-- c --> &amp; &lt;z&gt; &#65;&#x42;'|striptags }}|{{ 'x'|pprint }}|{{ [1, 'a', {'k': none}]|pprint }}", "", "x y & <z> AB|'x'|[1, 'a', {'k': None}]"},
    {"{{ d|attr('z') }}|{{ {'a': {'b': 1}}|attr('a') }}|{{ (d|attr('items'))()|list }}|{% set ns = namespace(q=3) %}{{ ns|attr('q') }}", "{\"d\": {\"z\": 1}}", "||[('z', 1)]|3"},
    {"{% macro f(a) %}{{ a }}{% endmacro %}{{ f(1, 2) }}", "", nullptr},  // TypeError: macro 'f' takes not more than 1 argument(s)
    {"{% macro f(a) %}{{ a }}{% endmacro %}{{ f(1, b=2) }}", "", nullptr},  // TypeError: macro 'f' takes no keyword argument 'b'
    {"{% macro f(a) %}{{ a }}{{ varargs|length }}{% endmacro %}{{ f(1, 2) }}", "", "11"},
  };
  check_cases(cases);
}

}  // namespace
}  // namespace kiln
