# Reference renders for kiln's chat-template interpreter (tests/cpu/test_chat_template.cpp).
# Model-family templates (testdata/chat_templates/more/*.jinja) are rendered through transformers'
# render_jinja_template (what apply_chat_template(tokenize=False) calls, with tools=None/documents=None
# passed the same way) over a set of conversations; language-feature micro-templates are rendered with
# transformers' own compiled jinja environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
# loopcontrols, its tojson, raise_exception, strftime_now). Writes testdata/chat_templates/more/cases.json.
# Run: python3 tests/reference/make_template_cases.py   (transformers 5.x, jinja2 3.1)
import glob, json, os, copy
import jinja2, transformers
from transformers.utils.chat_template_utils import render_jinja_template, _compile_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "..", "..", "testdata", "chat_templates", "more")

weather = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
                                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
search = {"type": "function", "function": {"name": "search", "description": "Web search — returns «snippets»",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer", "default": 3}}, "required": ["q"]}}}
U = "user"; A = "assistant"; S = "system"; T = "tool"
def m(role, content, **kw): d = {"role": role, "content": content}; d.update(kw); return d
call_dict = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
call_str = {"id": "call67890", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}
call_search = {"id": "callabcde", "type": "function", "function": {"name": "search", "arguments": {"q": "日本 天気", "k": 2}}}
convs = [
  ("hello", [m(U, "Hello!")], None, True, {}),
  ("system_multi", [m(S, "You are terse."), m(U, "What is 2+2?"), m(A, "4"), m(U, "And 3+3?")], None, True, {}),
  ("no_gen_prompt", [m(U, "Hi"), m(A, "Hello, how can I help?")], None, False, {}),
  ("unicode", [m(S, "Réponds en français 🇫🇷"), m(U, "Привет 👋\n  spaced  \t tab «quotes» \"dq\" 'sq' \\ backslash")], None, True, {}),
  ("tools_system", [m(S, "Use tools when useful."), m(U, "Weather in Tokyo and Oslo?")], [weather, search], True, {}),
  ("tool_call_dict", [m(U, "Weather in Paris?"), m(A, "", tool_calls=[call_dict]), m(T, "{\"temp\": 18, \"sky\": \"clear\"}", tool_call_id="call12345")], [weather], True, {}),
  ("tool_call_str", [m(S, "Be brief."), m(U, "Weather in Oslo?"), m(A, None, tool_calls=[call_str]), m(T, "-3 C, snow", tool_call_id="call67890"), m(A, "It is -3 C and snowing in Oslo.")], [weather], False, {}),
  ("tool_calls_multi", [m(U, "Weather in Paris, and search news"), m(A, "Let me check.", tool_calls=[call_dict, call_search]), m(T, "18 C", tool_call_id="call12345"), m(T, "[\"news 1\", \"news 2\"]", tool_call_id="callabcde")], [weather, search], True, {}),
  ("reasoning_in_content", [m(U, "Think first: 17*3?"), m(A, "<think>\n17*3 = 51\n</think>\n\n51"), m(U, "thanks")], None, True, {}),
  ("reasoning_last_turn", [m(U, "17*3?"), m(A, "<think>\nmultiply\n</think>\n\n51")], None, False, {}),
  ("reasoning_field", [m(U, "2^10?"), m(A, "1024", reasoning_content="2^10 = 1024")], None, False, {}),
  ("thinking_off", [m(U, "Quick: capital of Italy?")], None, True, {"enable_thinking": False}),
  ("extra_kwargs", [m(S, "sys"), m(U, "What day is it?")], [weather], True, {"date_string": "01 Jan 2025", "tools_in_user_message": False}),
  ("alternation_error", [m(U, "a"), m(U, "b")], None, True, {}),
  ("bad_role", [m(U, "a"), m("narrator", "b")], None, True, {}),
  ("multimodal_content", [m(U, [{"type": "image"}, {"type": "text", "text": " Describe this image. "}])], None, True, {}),
]

def err_record(rec, e):
    rec["error"] = str(e) if isinstance(e, jinja2.exceptions.TemplateError) and type(e) is jinja2.exceptions.TemplateError else type(e).__name__ + ": " + str(e)
    rec["error_exact"] = type(e) is jinja2.exceptions.TemplateError

cases = []
for path in sorted(glob.glob(os.path.join(DIR, "*.jinja"))):
    fname = os.path.basename(path); src = open(path, encoding="utf-8").read()
    for cname, msgs, tools, gen, extra in convs:
        inputs = {"messages": msgs, "tools": tools, "add_generation_prompt": gen, "bos_token": "<s>", "eos_token": "</s>", "extra": extra}
        rec = {"name": fname[:-6] + "/" + cname, "template_file": fname, "inputs": inputs}
        try:
            kwargs = {"bos_token": "<s>", "eos_token": "</s>", **extra}
            out, _ = render_jinja_template(conversations=[copy.deepcopy(msgs)], tools=tools, chat_template=src, add_generation_prompt=gen, **kwargs)
            rec["expected"] = out[0]
        except Exception as e:
            err_record(rec, e)
        cases.append(rec)

# Language-feature micro-templates: (name, source, context).
ctx = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo", "tool_calls": None}],
       "items": [3, 1, 2], "words": ["b", "A", "c", "a"], "d": {"z": 1, "a": [1, 2.5, None, True], "ü": "ß"},
       "s": "  Hello, Wörld! ", "n": 7, "f": 2.5, "none_v": None, "t": True, "empty": [], "nested": {"x": {"y": [{"k": "v"}]}},
       "people": [{"name": "Ann", "age": 31}, {"name": "bob", "age": 25}, {"name": "Cy", "age": 31}]}
micro = [
  ("loop_vars", "{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}"),
  ("loop_prev_next", "{% for x in items %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{% endfor %}"),
  ("loop_cycle", "{% for x in items %}{{ loop.cycle('odd', 'even') }} {% endfor %}"),
  ("loop_else", "{% for x in empty %}{{ x }}{% else %}none!{% endfor %}"),
  ("loop_filter", "{% for x in items if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }},{% endfor %}"),
  ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
  ("loop_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}"),
  ("loop_unpack_filter", "{% for k, v in d|items %}{{ k }}{% endfor %}|{% for k, v in d|dictsort %}{{ k }}{% endfor %}"),
  ("loop_dict_iter", "{% for k in d %}{{ k }}{% endfor %}"),
  ("loop_string_iter", "{% for c in 'héllo' %}{{ c }}.{% endfor %}"),
  ("loop_scope", "{% set y = 5 %}{% for i in items %}{{ y }}{% set y = i %}{{ y }}{% endfor %}{{ y }}"),
  ("nested_loops", "{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}/{{ loop.length }} {% endfor %}{% endfor %}"),
  ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in items %}{% set ns.count = ns.count + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}"),
  ("namespace_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}"),
  ("macro_defaults", "{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet('Cy', punct='?') }}"),
  ("macro_scope", "{% set g = 'global' %}{% macro m(x) %}{% set g = 'local' %}{{ x }}-{{ g }}{% endmacro %}{{ m(1) }} {{ g }}"),
  ("macro_recursive", "{% macro render(v) %}{% if v is mapping %}{% for k, x in v.items() %}{{ k }}:({{ render(x) }}){% endfor %}{% elif v is string %}{{ v }}{% elif v is iterable %}[{% for x in v %}{{ render(x) }}{% endfor %}]{% else %}{{ v }}{% endif %}{% endmacro %}{{ render(nested) }}"),
  ("set_block", "{% set body %}  line {{ n }}\n{% endset %}[{{ body }}]{{ body|length }}"),
  ("set_tuple", "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set c = (1, 2) %}{{ c }}{{ (3,) }}"),
  ("filter_block", "{% filter upper %}hello {{ s|trim }}{% endfilter %}"),
  ("generation_block", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}"),
  ("if_elif_else", "{% for x in [0, 1, 2, 3] %}{% if x == 0 %}zero{% elif x == 1 %}one{% elif x is even %}even{% else %}other{% endif %} {% endfor %}"),
  ("ternary", "{{ 'yes' if t else 'no' }} {{ 'a' if none_v }}|{{ 'x' if n > 5 else 'y' if n > 2 else 'z' }}"),
  ("arith", "{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2.5 }} {{ 3 * 'ab' }} {{ [1] + [2] }} {{ 10 - 3 - 2 }} {{ 2 * 3 + 4 }} {{ (2 + 3) * 4 }} {{ 7.0 // 2 }} {{ -7.5 % 2 }} {{ 2**3**2 }}"),
  ("concat_tilde", "{{ 'a' ~ 1 ~ none_v ~ t ~ undefined_var ~ [1, 'x'] ~ f }}"),
  ("compare", "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ n != 7 }} {{ n >= 7 }} {{ 'ell' in s }} {{ 3 not in items }} {{ 'z' in d }} {{ none_v == none }} {{ t == 1 }}"),
  ("logic", "{{ t and 'x' }} {{ none_v or 'fallback' }} {{ not empty }} {{ empty or 0 or '' }}| {{ not (t and none_v) }}"),
  ("print_repr", "{{ items }} {{ d }} {{ none_v }} {{ t }} {{ f }} {{ 1.0 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 0.1 + 0.2 }} {{ ['it\\'s', \"q\\\"x\", 'tab\\t'] }} {{ {'k': (1, 2)} }} {{ 100000000000000000.0 }} {{ -0.0 }}"),
  ("print_nested", "{{ messages }}|{{ people[0] }}|{{ nested.x }}"),
  ("undefined", "[{{ missing }}][{{ missing is defined }}][{{ d.nope }}][{{ d.nope is undefined }}][{{ missing|default('dflt') }}][{{ ''|default('e', true) }}][{{ none_v|default('n') }}][{{ missing|length }}][{% for x in missing %}x{% endfor %}][{{ d['nope'] is defined }}]"),
  ("attr_item", "{{ d.z }}{{ d['z'] }}{{ d.a[1] }}{{ d.a.0 }}{{ nested.x.y[0].k }}{{ nested['x']['y'][0]['k'] }}{{ people[-1].name }}{{ items[10] is defined }}"),
  ("slicing", "{{ items[1:] }} {{ items[:-1] }} {{ items[::-1] }} {{ items[::2] }} {{ s[2:7] }} {{ 'héllo wörld'[1:4] }} {{ 'héllo'[::-1] }} {{ 'abc'[-1] }} {{ items[5:] }} {{ items[-10:2] }} {{ 'héllo'[1] }}"),
  ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.upper() }}|{{ s.lower() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b c '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'xxhixx'.strip('x') }}|{{ s.startswith('  He') }}|{{ s.endswith(('x', '! ')) }}|{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 1) }}|{{ 'hello world'.title() }}|{{ s.find('W') }}|{{ s.find('zz') }}|{{ 'banana'.count('a') }}|{{ '-'.join(['a', 'b']) }}|{{ 'x{}y{}'.format(1, 'z') }}|{{ 'aBc'.capitalize() }}|{{ 'a\\nb\\n'.splitlines() }}|{{ 'a/b/c'.rsplit('/', 1) }}"),
  ("dict_methods", "{{ d.keys()|list }} {{ d.values()|list }} {{ d.get('z') }} {{ d.get('q', 'dflt') }} {{ d.get('q') }} {{ d.items()|list }}"),
  ("filters_text", "{{ s|trim }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello wORLD-foo bar(baz'|title }}|{{ 'hELLO'|capitalize }}|{{ s|replace('l', '_') }}|{{ s|length }}|{{ 'wörds and more words'|wordcount }}|{{ '<a&b>'|e }}|{{ '<a>'|safe }}|{{ 'abc'|reverse }}|{{ 'xyz'|list }}|{{ 'abc'|first }}{{ 'abc'|last }}|{{ 'x-%s-%d'|format('s', 3) }}|{{ s|trim('! ') }}"),
  ("filters_list", "{{ items|sort }} {{ items|sort(reverse=true) }} {{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ words|unique|list }} {{ items|reverse|list }} {{ items|first }} {{ items|last }} {{ items|length }} {{ items|count }} {{ items|join(', ') }} {{ items|sum }} {{ items|min }} {{ items|max }} {{ words|join }} {{ empty|first is defined }}"),
  ("filters_attr", "{{ people|map(attribute='name')|join(',') }} {{ people|selectattr('age', 'equalto', 31)|map(attribute='name')|list }} {{ people|rejectattr('age', 'gt', 30)|list }} {{ people|sort(attribute='age')|map(attribute='name')|join }} {{ people|sort(attribute='name')|map(attribute='name')|join }} {{ people|map(attribute='missing', default='?')|list }} {{ people|sum(attribute='age') }} {{ people|max(attribute='age') }} {{ people|unique(attribute='age')|map(attribute='name')|list }}"),
  ("filters_select", "{{ items|select('odd')|list }} {{ items|reject('odd')|list }} {{ [0, 1, '', 'a', none]|select|list }} {{ items|select('greaterthan', 1)|list }} {{ items|select('in', [1, 3])|list }} {{ items|map('string')|join('+') }} {{ ['a', 'b']|map('upper')|list }}"),
  ("filters_num", "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 4.7|int }} {{ '2.5'|float }} {{ 3|float }} {{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.567|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ 3|round }} {{ t|int }} {{ n|string ~ '!' }}"),
  ("filters_dict", "{{ d|dictsort }} {{ d|dictsort(reverse=true)|map('first')|list }} {{ d|items|list }} {{ d|list }} {{ d|length }} {{ {'b': 2, 'a': 1}|dictsort(by='value') }}"),
  ("indent", "[{{ 'a\\nb\\n\\nc'|indent }}][{{ 'a\\nb'|indent(2, true) }}][{{ 'a\\n\\nb'|indent(3, blank=true) }}][{{ 'x\\ny'|indent('> ') }}]"),
  ("tojson", "{{ d|tojson }}\n{{ d|tojson(indent=2) }}\n{{ nested|tojson(indent=4) }}\n{{ 'ünï \"q\" \\n \\t \\\\ \\u0001 😀'|tojson }}\n{{ items|tojson(separators=(',', ':')) }}\n{{ {'b': 1, 'a': {'d': 0, 'c': []}}|tojson(sort_keys=true) }}\n{{ 'é😀'|tojson(ensure_ascii=true) }}\n{{ f|tojson }} {{ 1e100|tojson }} {{ none_v|tojson }} {{ t|tojson }} {{ empty|tojson(indent=2) }} {{ {}|tojson(indent=2) }}\n{{ people|tojson(indent=2) }}"),
  ("tests", "{{ n is number }}{{ n is integer }}{{ f is float }}{{ f is integer }}{{ t is boolean }}{{ t is number }}{{ t is integer }}{{ s is string }}{{ d is mapping }}{{ items is iterable }}{{ s is iterable }}{{ items is sequence }}{{ none_v is none }}{{ t is true }}{{ t is false }}{{ n is odd }}{{ n is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ n is eq 7 }}{{ n is equalto(7) }}{{ n == 7 }}{{ 2 is in items }}{{ 'Ab' is lower }}{{ 'ab' is lower }}{{ d is not mapping }}{{ missing is not defined }}{{ n is gt 3 }}{{ n is le 3 }}"),
  ("literals", "{{ 'it''s' }} {{ \"dq\\\"\" }} {{ 'esc\\x41\\u00e9\\q' }} {{ 1_000 }} {{ 0.5e1 }} {{ True }}{{ False }}{{ None }} {{ true }}{{ false }}{{ none }} {{ [1, [2, 'x'], {'k': none}] }} {{ ('a', 1) }} {{ {'a': 1, 'b': [2]} }} {{ 'adj' 'acent' }}"),
  ("unicode_len", "{{ 'héllo 👋'|length }} {{ 'héllo 👋'|upper }} {{ 'ÀÉÎ'|lower }} {{ '日本語'[1] }} {{ '日本語'|reverse }} {{ 'straße'.title() }}"),
  ("raw_block", "{% raw %}{{ not rendered }} {% if %}{% endraw %}|done"),
  ("comments", "a{# comment #}b\n  {# own line comment #}\nc{#- strip -#}  d"),
  ("ws_trim_lstrip", "<ul>\n    {% for x in items %}\n    <li>{{ x }}</li>\n    {% endfor %}\n</ul>\n"),
  ("ws_minus", "a  \n  {%- if t -%}  \n  b  \n  {%- endif -%}  \n  c  {{- ' d ' -}}  e"),
  ("ws_plus", "a\n    {%+ if t %}b\n{%+ endif +%}\nc\n  {% if t +%}\nd{% endif %}"),
  ("ws_var_no_lstrip", "x\n    {{ 'v' }}\n    {% if t %}\ny{% endif %}\n"),
  ("ws_inline_blocks", "a {% if t %}b{% endif %} c\n{% if t %} d {% endif %}\ne"),
  ("ws_trailing_newline", "line1\n{{ 'x' }}\n"),
  ("ws_crlf", "a\r\n{% if t %}\r\nb\r\n{% endif %}\r\nc\r\n"),
  ("ws_tab_lstrip", "\t\t{% if t %}tab{% endif %}\n \t {# c #}\nend"),
  ("ws_comment_trim", "{# first #}\nA\n   {#- minus #}\nB {#+ plus +#}\nC"),
  ("ws_mixed_qwen_style", "{%- for m in messages %}\n    {{- '<|' + m.role + '|>\\n' }}\n    {%- if m.content %}\n        {{- m.content + '\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|assistant|>' }}\n{%- endif %}\n"),
  ("with_block", "{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]"),
  ("range_dict_globals", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b='x') }} {{ dict(a=1).a }}"),
  ("raise_exception", "{% if messages|length > 1 %}{{ raise_exception('Too many messages: ' ~ messages|length) }}{% endif %}"),
  ("error_undefined_attr", "{{ missing.attr }}"),
  ("error_add_types", "{{ 1 + 'a' }}"),
  ("error_none_iter", "{% for x in none_v %}{% endfor %}"),
  ("none_content_concat", "{{ 'a' + none_v }}"),
  ("neg_filter_precedence", "{{ -3|abs }} {{ -(3)|abs }} {{ 1 - 3|abs }} {{ not t|string }} {{ 'ab' ~ 'cd'|upper }} {{ 2 * 3|string }}"),
  ("messages_idioms", "{%- set loop_messages = messages[1:] if messages[0].role == 'system' else messages %}{%- for m in loop_messages %}{{ m['role']|upper }}:{{ m.content|trim }}{% if m.tool_calls is not none and m.tool_calls is defined %}+calls{% endif %}{% if not loop.last %}\\n{% endif %}{% endfor %}"),
  ("more_idioms", "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ '\\n'.join(['a', 'b']) }}|{% for m in messages|reverse %}{{ m.role }}{% endfor %}|{{ 'x</think>y'.split('</think>')|last }}|{{ s.content }}|{{ [1, 2, ] }}{{ {'a': 1, } }}|{{ 'b' > 'a' }}|{{ n is divisibleby 7 }}"),
  ("counter_in_loop", "{% set c = 0 %}{% for x in items %}{% set c = c + x %}{{ c }}{% endfor %}|{{ c }}"),
  ("tools_schema_walk", "{% for t in tools %}{% set fn = t.function %}{{ fn.name }}({% for pname, p in fn.parameters.properties|items %}{{ pname }}: {{ p.type }}{% if p.enum is defined %} in {{ p.enum|join('/') }}{% endif %}{% if pname in fn.parameters.required %}!{% endif %}{% if not loop.last %}, {% endif %}{% endfor %}){% endfor %}"),
  ("error_tojson_undefined", "{{ missing|tojson }}"),
  ("error_length_none", "{{ none_v|length }}"),
  ("in_string_undefined", "{{ 'a' in s }}{{ 'H' in s }}"),
  ("macro_call_kw_default_expr", "{% macro f(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ f('x') }}{{ f(a='y') }}{{ f('z', b=none) }}"),
  ("macro_nested_call", "{% macro inner(x) %}<{{ x }}>{% endmacro %}{% macro outer(xs) %}{% for x in xs %}{{ inner(x) }}{% endfor %}{% endmacro %}{{ outer(items) }}"),
  ("bool_print", "{{ t }} {{ not t }} {{ 1 == 1 }} {{ [t, none_v] }} {{ t + 1 }} {{ t * 3 }}"),
  ("int_float_mix", "{{ 3 + 0.5 }} {{ 10 / 5 }} {{ 1 / 3 }} {{ 2.0 * 3 }} {{ 1e3 }} {{ 123456789.123 }} {{ 0.000123 }} {{ -1.5e-10 }}"),
  ("str_escape_repr", "{{ ['a\\nb', 'c\\\\d', '\\x01', 'ü', '\\u2028'] }}"),
  ("ws_nested_blocks_lstrip", "{% for x in items %}\n  {% if x > 1 %}\n    big {{ x }}\n  {% else %}\n    small {{ x }}\n  {% endif %}\n{% endfor %}\ndone"),
  ("ws_minus_var_only", "a\n  {{- 'b' }}\n  {{ 'c' -}}\n  d"),
  ("ws_block_end_minus_then_text", "{% if t -%}\n\n   x{%- endif %}  y"),
  ("ws_comment_inline", "a {# c #} b\n   {# c2 #}   \nz"),
  ("is_not_none_chain", "{% if d.a is defined and d.a is not none and d.a|length > 2 %}ok{% endif %}"),
  ("string_multiply_join", "{{ '=' * 5 }}{{ ['a'] * 2 }}"),
  ("loop_over_items_tuple", "{% for pair in d|dictsort %}{{ pair[0] }}={{ pair[1] }} {% endfor %}{% for (k, v) in d.items() %}{{ k }}{% endfor %}"),
  ("strftime_static", "{{ strftime_now('%Y')|length }}"),
  ("in_undefined", "{{ 'a' in missing }}|{{ 'a' not in missing }}|{{ 'x' in d.nope }}|{{ 'a' is in missing }}|{% if 'citations' in missing and t %}c{% else %}n{% endif %}"),
  ("error_undefined_in_string", "{{ missing in 'abc' }}"),
]
env_render = lambda src, c: _compile_jinja_template(src).render(**c)
for name, src in micro:
    rec = {"name": "micro/" + name, "source": src, "context": ctx}
    try:
        rec["expected"] = env_render(src, copy.deepcopy(ctx))
    except Exception as e:
        err_record(rec, e)
    cases.append(rec)

out = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "cases": cases}
with open(os.path.join(DIR, "cases.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
print(len(cases), "cases,", sum("error" in c for c in cases), "errors")
