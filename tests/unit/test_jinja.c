/* test_jinja.c — the jj engine against python3-jinja2: every render case's
 * expected output was produced by jinja2 3.1 set up as transformers does
 * (tests/reference/render_jinja.py, strftime_now fixed to 2025-02-03) and
 * is checked byte for byte: whitespace control (trim_blocks, lstrip_blocks,
 * '-' and '+', comments, raw, CRLF), literals and Python number formatting,
 * operators and precedence, Undefined semantics, Jinja's scoping of loops,
 * macros and namespaces, loop variables and controls, filters, tests,
 * methods, tojson (separators, indent, sort_keys, ensure_ascii, floats,
 * escapes). Then syntax errors and unsupported constructs (named, with their
 * line), runtime errors as Jinja raises them, the limits on output, work and
 * macro depth, the parse limits, and jj_json_dumps_py. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/jinja/jj_template.h"
#include "common/base/tg_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct render_case {
    const char *tmpl;
    const char *want;
    int use_vars;
};

struct error_case {
    const char *tmpl;
    int code;
    const char *needle;
};

/* Generated from python3-jinja2 3.1 (tests/reference/render_jinja.py's
 * environment): template, variables, expected output. */
static const char *const VARS_JSON = "{\"msgs\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}], \"d\": {\"b\": 2, \"a\": 1.5, \"c\": null, \"e\": true, \"f\": [1, \"x\"], \"g\": {\"h\": \"\303\251\"}}, \"s\": \"  H\303\251llo\\tW\303\266rld \360\237\231\202\\n\", \"n\": 7, \"f\": 2.5, \"l\": [3, 1, 2], \"e\": [], \"t\": \"a\\\"b\\\\c\\u0001\177\342\200\250\"}";
static const struct render_case RENDER_CASES[] = {
    {"  {% if true %}\n  x\n  {% endif %}\n  y {{ 'z' }}\n    {%- if true %} w {% endif -%}\n   q",
     "  x\n  y z w q", 0},
    {"{%+ if true %}a{% endif %}\n   {#- c #}  b\n  {# c2 #}\nc", "a  b\nc", 0},
    {"a\015\nb\015{{ 'x' }}\015\n", "a\nb\nx", 0},
    {"  {%- if true -%}  \n  a  \n  {%- endif -%}  \n", "a", 0},
    {"x  \343\200\200{%- if true %}y{% endif %}", "xy", 0},
    {"x\n\t {% if true %}y{% endif %}\n", "x\ny", 0},
    {"x\n\t {%+ if true %}y{% endif %}\n\n", "x\n\t y", 0},
    {"{# comment #}\n  {# c2 -#}   x\n{#- c3 #}y", "xy", 0},
    {"{#-#}a{#+#}\n b", "a b", 0},
    {"{% raw %}\n  {{ x }}\n{% endraw %}\nz", "\n  {{ x }}\nz", 0},
    {"  {% raw -%}  a  {%- endraw %}  b", "a  b", 0},
    {"{{- ' x ' -}}   {{- 'y' }}", " x y", 0},
    {"{% for i in range(2) %}\n  {{ i }}\n{% endfor %}\n", "  0\n  1\n", 0},
    {"{% macro m() -%}\n  body\n{%- endmacro %}[{{ m() }}]", "[body]", 0},
    {"{%- generation %}gen {{ 1 }}{% endgeneration %}", "gen 1", 0},
    {"{{ 1.0 }} {{ 1e20 }} {{ 0.1+0.2 }} {{ 10/4 }} {{ 10//4 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 1e16 }} {{1e15}} {{ 1.5e-5 }} {{ 0.0001 }} {{ 1/3 }} {{ 5e-324 }} {{ 123456789.123456789 }}",
     "1.0 1e+20 0.30000000000000004 2.5 2 -4 2 1024 1e+16 1000000000000000.0 1.5e-05 0.0001 0.3333333333333333 5e-324 123456789.12345679",
     0},
    {"{{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ 7 % -3 }} {{ -7.5 // 2 }} {{ 2 ** -1 }} {{ True + 1 }} {{ 10 % 3.5 }} {{ -0.0 }}",
     "1000 31 5 15 ababab [1, 1] -2 -4.0 0.5 2 3.0 -0.0", 0},
    {"{{ \"a\\x41\\u00e9\\n\\\\q\\101\" }}|{{ 'it''s' }}|{{ 'tab\\there' }}",
     "aA\303\251\n\\qA|its|tab\there", 0},
    {"{{ -1 ** 2 }}|{{ 2 ** 3 ** 2 }}|{{ not true == false }}|{{ 1 + 2 * 3 - 4 / 2 }}|{{ ('a' ~ 1) ~ 2 }}",
     "1|64|True|5.0|a12", 0},
    {"{{ 1 in [1,2] }}|{{ 'a' in 'abc' }}|{{ 'k' in {'k':1} }}|{{ 3 not in [1] }}|{{ 1 == 1.0 }}|{{ [1,2] < [1,3] }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}",
     "True|True|True|True|True|True|True|False", 0},
    {"{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ none or none }}|{{ not 0 }}|{{ 'y' if 0 else 'n' }}|{{ 'y' if 0 }}|",
     "x|b||None|True|n||", 0},
    {"{{ [1, 'a', None, True, 1.5, {'k': 'v'}, ('t',)] }} {{ ['it\\'s', \"a\\\"b\", 'x\\ny', '\\t', '\303\251', '\\x01', '\\u200b'] }}",
     "[1, 'a', None, True, 1.5, {'k': 'v'}, ('t',)] [\"it's\", 'a\"b', 'x\\ny', '\\t', '\303\251', '\\x01', '\\u200b']",
     0},
    {"{{ {'a': 1}.items() }} {{ (1,) }} {{ () }} {{ {'a': 1}.keys() }} {{ range(3) }} {{ range(1, 9, 2) }} {{ namespace(a=1) }}",
     "dict_items([('a', 1)]) (1,) () dict_keys(['a']) range(0, 3) range(1, 9, 2) <Namespace {'a': 1}>",
     0},
    {"{{ 'abc'[::-1] }} {{ 'h\303\251llo'[1:3] }} {{ [1,2,3][-1] }} {{ [1,2,3][1:] }} {{ 'abc'[5] }}|{{ 'abcdef'[::2] }} {{ [1,2,3,4][::-2] }} {{ range(10)[2:8:3] }}",
     "cba \303\251l 3 [2, 3] |ace [4, 2] range(2, 8, 3)", 0},
    {"{{ x }}|{{ x is defined }}|{{ x is undefined }}|{{ x|default('d') }}|{{ ''|default('d', true) }}|{{ x|length }}{{ x|list }}{{ x|join }}{{ x|trim }}|{{ x == y }}{{ x == none }}|{{ [x] }}",
     "|False|True|d|d|0[]|TrueFalse|[Undefined]", 0},
    {"{% if x is defined and x.y %}a{% else %}b{% endif %}{{ (x.y is defined) if x is defined else 'nx' }}",
     "bnx", 0},
    {"{% set t = none %}{{ t.x }}|{{ 'abc'.x }}|{{ [1].x }}|{{ d.nope }}|{{ d['nope'] }}|{{ d.get('nope') }}",
     "|||||None", 1},
    {"{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{x}};{% endfor %}{{ x }}",
     "12;12;12;1", 0},
    {"{% for i in range(3) %}{% if i == 0 %}{% set y = 5 %}{% endif %}{{ y }};{% endfor %}",
     "5;;;", 0},
    {"{% macro m() %}{{ x }}{% endmacro %}{% set x = 1 %}{{ m() }}", "1", 0},
    {"{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}",
     "2", 0},
    {"{% macro m() %}{{ y }}{% endmacro %}{% for i in [1] %}{% set y = 3 %}{{ m() }}{% endfor %}",
     "", 0},
    {"{% for m in msgs %}{{ n }}{% set n = 1 %}{% endfor %}|{{ n }}", "777|7",
     1},
    {"{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}{{ ns.c }}",
     "4x", 0},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }};{% endfor %}",
     "12x=1;y=2;", 0},
    {"{% set x %}block {{ 1 }}{% endset %}[{{ x }}]{% set y | upper %}up{% endset %}{{ y }}{% filter upper %}hello {{ 'w' }}{% endfilter %}",
     "[block 1]UPHELLO W", 0},
    {"{% for x in [3,1,2]|sort %}{{ loop.index }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }} {% endfor %}",
     "13TrueFalse32 22FalseFalse313 31FalseTrue32 ", 0},
    {"{% for x in [1,2,3] if x > 1 %}{{ loop.index }}/{{ loop.length }}{% else %}none{% endfor %}|{% for x in [] %}a{% else %}empty{% endfor %}",
     "1/22/2|empty", 0},
    {"{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
     "0134", 0},
    {"{% for x in 'ab' %}{{ loop.cycle('o','e') }}{{ loop.changed(x) }}{{ loop.depth }}{% endfor %}{% for a in [[1, 2], [3]] %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %}",
     "oTrue1eTrue111221;132;", 0},
    {"{% macro m(a, b=2) %}{{a}}{{b}}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}{{ m(1, 3, 4, c=5) }}{{ m(b=1, a=2) }}",
     "12(){}13(4,){'c': 5}21(){}", 0},
    {"{% macro f(x) %}{% if x > 0 %}{{ x }}{{ f(x - 1) }}{% endif %}{% endmacro %}{{ f(3) }}|{% macro g(a, b=a) %}{{ b }}{% endmacro %}{{ g(5) }}|{{ g }}",
     "321|5|<Macro 'g'>", 0},
    {"{{ s|trim }}|{{ 'xxaxx'|trim('x') }}|{{ s|lower }}|{{ s|upper }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|{{ \"it's-a test(x)\"|title }}|{{ s|length }}",
     "H\303\251llo\tW\303\266rld \360\237\231\202|a|  h\303\251llo\tw\303\266rld \360\237\231\202\n|  H\303\211LLO\tW\303\226RLD \360\237\231\202\n|Hello World|Hello|It's-A Test(X)|16",
     1},
    {"{{ l|join(', ') }}|{{ l|length }}|{{ l|first }}|{{ l|last }}|{{ 'abc'|list }}|{{ l|reverse|list }}|{{ l|sort }}|{{ l|sum }}|{{ l|max }}|{{ l|min }}|{{ e|first }}|{{ ['a','A','b']|unique|list }}",
     "3, 1, 2|3|3|2|['a', 'b', 'c']|[2, 1, 3]|[1, 2, 3]|6|3|1||['a', 'b']", 1},
    {"{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}|{{ msgs|map(attribute='role')|join(',') }}|{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }}|{{ msgs|selectattr('tool_calls', 'defined')|list|length }}|{{ msgs[2].tool_calls[0].function.arguments|tojson }}",
     "1|system,user,assistant|['S', 'yo']|1|{\"a\": 1}", 1},
    {"{{ [1,2,3]|map('string')|join('-') }}|{{ ['A','B']|map('lower')|list }}|{{ [{'a': [5]}]|map(attribute='a.0')|list }}|{{ [{}]|map(attribute='x', default='d')|list }}|{{ [1, 2, 3]|select('odd')|list }}|{{ [0, 1, '']|select|list }}|{{ [1,2,3]|reject('gt', 1)|list }}",
     "1-2-3|['a', 'b']|[5]|['d']|[1, 3]|[1]|[1]", 0},
    {"{{ {'b': 2, 'a': 1}|dictsort(by='value') }}{{ {'b': 2, 'A': 1, 'a': 0}|dictsort }}|{{ [{'n': 2}, {'n': 1}]|sort(attribute='n')|map(attribute='n')|list }}|{{ ['b','A','c']|sort(case_sensitive=true) }}|{{ [3,1]|sort(reverse=true) }}",
     "[('a', 1), ('b', 2)][('A', 1), ('a', 0), ('b', 2)]|[1, 2]|['A', 'b', 'c']|[3, 1]",
     0},
    {"{{ 2.567|round(1) }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.675|round(2) }}|{{ 2.1|round(0, 'ceil') }}|{{ -3|abs }}|{{ '42'|int }}|{{ ' 4.7 '|int }}|{{ 'x'|int(-1) }}|{{ '0x1f'|int(base=16) }}|{{ '3.5'|float }}|{{ 'inf'|float }}|{{ 3|float }}|{{ 10|string }}",
     "2.6|2.0|4.0|2.67|3.0|3|42|4|-1|31|3.5|inf|3.0|10", 0},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(first=true, blank=true) }}|{{ 'x'|center(7) }}|{{ '<a & \"b\">'|e }}|{{ ('<a>'|safe) + '<b>' }}|{{ '<b>' ~ ('<a>'|safe) }}|{{ ('<a>'|e)|length }}",
     "a\n    b\n\n    c|  a\n  b|    a\n    \n    b|   x   |&lt;a &amp; &#34;b&#34;&gt;|<a>&lt;b&gt;|<b><a>|9",
     0},
    {"{{ 'ABC'|lower|replace('b', 'X') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'abc'|replace('', '-') }}|{{ 123|replace('2', 'x') }}|{{ d|items|list }}|{{ d|attr('items') is defined }}|{{ d|attr('b') is defined }}",
     "aXc|bba|-a-b-c-|1x3|[('b', 2), ('a', 1.5), ('c', None), ('e', True), ('f', [1, 'x']), ('g', {'h': '\303\251'})]|True|False",
     1},
    {"{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ [1,[2,[]],{}]|tojson(indent=4) }}|{{ t|tojson }}|{{ t|tojson(ensure_ascii=true) }}|{{ '\360\237\230\200'|tojson(true) }}",
     "{\"b\": 2, \"a\": 1.5, \"c\": null, \"e\": true, \"f\": [1, \"x\"], \"g\": {\"h\": \"\303\251\"}}|{\n  \"b\": 2,\n  \"a\": 1.5,\n  \"c\": null,\n  \"e\": true,\n  \"f\": [\n    1,\n    \"x\"\n  ],\n  \"g\": {\n    \"h\": \"\303\251\"\n  }\n}|{\"a\": 1.5, \"b\": 2, \"c\": null, \"e\": true, \"f\": [1, \"x\"], \"g\": {\"h\": \"\303\251\"}}|[\n    1,\n    [\n        2,\n        []\n    ],\n    {}\n]|\"a\\\"b\\\\c\\u0001\177\342\200\250\"|\"a\\\"b\\\\c\\u0001\\u007f\\u2028\"|\"\\ud83d\\ude00\"",
     1},
    {"{{ [1,2]|tojson(separators=[',', ':']) }}|{{ {'a': [1, {'b': {}}]}|tojson(indent='\\t') }}|{{ 1.0|tojson }}|{{ 1e100|tojson }}|{{ 0.1|tojson }}|{{ {1: 'a', none: 1, true: 2, 2.5: 3}|tojson }}|{{ (1, 'x')|tojson }}|{{ d|tojson(indent=0) }}",
     "[1,2]|{\n\t\"a\": [\n\t\t1,\n\t\t{\n\t\t\t\"b\": {}\n\t\t}\n\t]\n}|1.0|1e+100|0.1|{\"1\": 2, \"null\": 1, \"2.5\": 3}|[1, \"x\"]|{\n\"b\": 2,\n\"a\": 1.5,\n\"c\": null,\n\"e\": true,\n\"f\": [\n1,\n\"x\"\n],\n\"g\": {\n\"h\": \"\303\251\"\n}\n}",
     1},
    {"{{ 'abc' is string }}{{ 1 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ {} is mapping }}{{ [] is sequence }}{{ {} is sequence }}{{ 'x' is iterable }}{{ none is none }}{{ true is boolean }}{{ x is sequence }}{{ x is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is in 'abc' }}{{ 'ABC' is upper }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ 'upper' is filter }}{{ 'xx' is test }}{{ x is callable }}",
     "TrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrue",
     0},
    {"{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(None, 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'abc'.startswith('a') }}|{{ 'abc'.endswith(('x','c')) }}|{{ 'aXa'.replace('a','b') }}|{{ 'abc'.find('c') }}|{{ '  x '.strip() }}|{{ 'x\\ny'.splitlines() }}|{{ 'a=b'.partition('=') }}|{{ 'abc'.removeprefix('a') }}|{{ 'aBc'.swapcase() }}|{{ \"o'neil mc-x\".title() }}",
     "['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a,b', 'c']|True|True|bXb|2|x|['x', 'y']|('a', '=', 'b')|bc|AbC|O'Neil Mc-X",
     0},
    {"{{ d.get('b') }}{{ d.get('zz', 9) }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.copy() == d }}|{{ l.index(1) }}{{ l.count(2) }}|{{ ','.join(['a', 'b']) }}|{{ dict(a=1, b=[2]) }}|{{ range(5)|list }}{{ range(5, 0, -2)|list }}",
     "29|['b', 'a', 'c', 'e', 'f', 'g']|[2, 1.5, None, True, [1, 'x'], {'h': '\303\251'}]|True|11|a,b|{'a': 1, 'b': [2]}|[0, 1, 2, 3, 4][5, 3, 1]",
     1},
    {"{{ strftime_now('%Y-%m-%d %a %b') }}|{{ date_string is defined }}",
     "2025-02-03 Mon Feb|False", 0},
    /* A dict past the size that gets a hash index (16 entries), grown
     * past its first one: every key looked up, `in`, keys equal across
     * types (1 == true, 2 == 2.0), a tuple key, and unique's seen-set over
     * 46 items. */
    {"{% set d = {'k0': 0, 'k1': 1, 'k2': 2, 'k3': 3, 'k4': 4, 'k5': 5, 'k6': 6, 'k7': 7, 'k8': 8, 'k9': 9, 'k10': 10, 'k11': 11, 'k12': 12, 'k13': 13, 'k14': 14, 'k15': 15, 'k16': 16, 'k17': 17, 'k18': 18, 'k19': 19, 'k20': 20, 'k21': 21, 'k22': 22, 'k23': 23, 'k24': 24, 1: 'one', 2.0: 'two', true: 'T', (1, 'x'): 'tup'} %}{% for i in range(25) %}{{ d['k' ~ i] }},{% endfor %}|{{ d.k3 }}|{{ 'k24' in d }}{{ 'k25' in d }}|{{ d.get('nope', 'x') }}|{{ d[1] }}{{ d[2] }}{{ d[True] }}{{ d[(1, 'x')] }}|{{ d|length }}|{{ d.keys()|list|last }}|{{ (['a', 'b', 'a', 'c', 'b'] * 5 + range(20)|map('string')|list + ['a'])|unique|join(',') }}",
     "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,|3|TrueFalse|x|TtwoTtup|28|(1, 'x')|a,b,c,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19",
     0},
};
static const struct error_case PARSE_ERRORS[] = {
    {"a\n\n{% for %}", TG_EFORMAT, "line 3"}, /* jinja2 rejects */
    {"{{ x|nosuchfilter }}", TG_EFORMAT, "No filter named 'nosuchfilter'"}, /* jinja2 rejects */
    {"{{ x is nosuchtest }}", TG_EFORMAT, "No test named"}, /* jinja2 rejects */
    {"{% frob %}", TG_EFORMAT, "unknown tag 'frob'"}, /* jinja2 rejects */
    {"line1\n{% include 'x' %}", TG_EUNSUPPORTED, "line 2: unsupported tag 'include'"}, /* jinja2 accepts */
    {"{% for x in y %}{% macro m() %}{% endmacro %}{% endfor %}", TG_EUNSUPPORTED, "macro defined inside a loop"}, /* jinja2 accepts */
    {"{% for x in y recursive %}{% endfor %}", TG_EUNSUPPORTED, "recursive"}, /* jinja2 accepts */
    {"{{ 'unterminated }}", TG_EFORMAT, "unexpected char"}, /* jinja2 rejects */
    {"{% if true %}", TG_EFORMAT, "'endif'"}, /* jinja2 rejects */
    {"{{ [1, 2 }}", TG_EFORMAT, "unexpected '}'"}, /* jinja2 rejects */
    {"{% for loop in x %}{% endfor %}", TG_EFORMAT, "special loop variable"}, /* jinja2 rejects */
    {"{% break %}", TG_EFORMAT, "outside of a loop"}, /* jinja2 rejects */
    {"{{ \"\\N{DASH}\" }}", TG_EUNSUPPORTED, "\\N"}, /* jinja2 rejects */
    {"{{ 99999999999999999999 }}", TG_EUNSUPPORTED, "64 bits"}, /* jinja2 accepts */
    {"{{ caf\303\251 }}", TG_EUNSUPPORTED, "non-ASCII"}, /* jinja2 accepts */
};
static const struct error_case RENDER_ERRORS[] = {
    {"{{ x.y }}", TG_EINVAL, "'x' is undefined"},
    {"{{ d.nope.deeper }}", TG_EINVAL, "'dict object' has no attribute 'nope'"},
    {"{{ raise_exception('Roles must alternate') }}", TG_EINVAL, "raise_exception: Roles must alternate"},
    {"\n{{ 1 + 'a' }}", TG_EINVAL, "line 2: TypeError"},
    {"{{ x + 1 }}", TG_EINVAL, "UndefinedError"},
    {"{{ x|tojson }}", TG_EINVAL, "not JSON serializable"},
    {"{{ 1 / 0 }}", TG_EINVAL, "ZeroDivisionError"},
    {"{{ [1, 'a']|sort }}", TG_EINVAL, "'<' not supported"},
    {"{{ messages.append }}{{ [].append(1) }}", TG_EINVAL, "unsafe"},
    {"{% set a, b = [1] %}", TG_EINVAL, "not enough values"},
    {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", TG_EINVAL, "takes not more than 1"},
    {"{% set x = 1 %}{% set x.y = 2 %}", TG_EINVAL, "non-namespace"},
    {"\n\n{{ x|wordwrap }}", TG_EUNSUPPORTED, "line 3: unsupported filter 'wordwrap'"},
    {"{{ '%s' % 1 }}", TG_EUNSUPPORTED, "formatting"},
    {"{{ '\303\237'|upper }}", TG_EUNSUPPORTED, "U+00DF"},
    {"{{ x|items }}", TG_EUNSUPPORTED, "printing a generator"},
    {"{{ 10000000000 * 10000000000 }}", TG_EUNSUPPORTED, "64 bits"},
    {"{{ range(100001)|length }}", TG_ETOOBIG, "MAX_RANGE"},
};

static struct tm fixed_now(void)
{
    struct tm t = {.tm_year = 125, .tm_mon = 1, .tm_mday = 3, .tm_wday = 1};
    return t;
}

static struct jj_vars *make_vars(void)
{
    json_error_t je;
    json_t *doc = json_loads(VARS_JSON, 0, &je);
    assert_non_null(doc);
    struct jj_vars *v = jj_vars_new();
    assert_non_null(v);
    const char *k;
    json_t *x;
    json_object_foreach(doc, k, x)
    {
        assert_int_equal(jj_vars_set_json(v, k, x), 0);
    }
    json_t *empty = json_array();
    assert_int_equal(jj_vars_set_json(v, "messages", empty), 0);
    json_decref(empty);
    json_decref(doc);
    return v;
}

/* Parses and renders; returns the code and fills *out / err. */
static int run(const char *tmpl, const struct jj_vars *v,
               const struct jj_limits *lim, char **out, size_t *len,
               char *err, size_t errlen)
{
    struct jj_template *t = NULL;
    *out = NULL;
    int rc = jj_template_parse(tmpl, strlen(tmpl), &t, err, errlen);
    if (rc != 0)
        return rc;
    struct tm now = fixed_now();
    struct jj_render_opts o = {.now = &now};
    if (lim != NULL)
        o.limits = *lim;
    rc = jj_render(t, v, &o, out, len, err, errlen);
    /* a template renders the same way twice: it is read-only */
    if (rc == 0) {
        char *again = NULL;
        size_t alen = 0;
        assert_int_equal(jj_render(t, v, &o, &again, &alen, err, errlen), 0);
        assert_int_equal(alen, *len);
        assert_memory_equal(again, *out, alen);
        free(again);
    }
    jj_template_free(t);
    return rc;
}

static void test_render_cases(void **state)
{
    (void)state;
    struct jj_vars *v = make_vars();
    for (size_t i = 0; i < sizeof RENDER_CASES / sizeof RENDER_CASES[0]; i++) {
        const struct render_case *c = &RENDER_CASES[i];
        char err[512] = "", *out;
        size_t len;
        int rc = run(c->tmpl, c->use_vars ? v : NULL, NULL, &out, &len, err,
                     sizeof err);
        if (rc != 0)
            fail_msg("case %zu %s: %s", i, c->tmpl, err);
        if (len != strlen(c->want) || memcmp(out, c->want, len) != 0)
            fail_msg("case %zu %s:\n want [%s]\n got  [%s]", i, c->tmpl,
                     c->want, out);
        free(out);
    }
    jj_vars_free(v);
}

static void test_errors(void **state)
{
    (void)state;
    struct jj_vars *v = make_vars();
    for (size_t i = 0; i < sizeof PARSE_ERRORS / sizeof PARSE_ERRORS[0]; i++) {
        const struct error_case *c = &PARSE_ERRORS[i];
        struct jj_template *t = NULL;
        char err[512] = "";
        int rc = jj_template_parse(c->tmpl, strlen(c->tmpl), &t, err,
                                   sizeof err);
        if (rc != c->code || strstr(err, c->needle) == NULL)
            fail_msg("parse case %zu %s: rc=%d err=%s (want %d, '%s')", i,
                     c->tmpl, rc, err, c->code, c->needle);
        assert_null(t);
    }
    for (size_t i = 0; i < sizeof RENDER_ERRORS / sizeof RENDER_ERRORS[0];
         i++) {
        const struct error_case *c = &RENDER_ERRORS[i];
        char err[512] = "", *out;
        size_t len;
        int rc = run(c->tmpl, v, NULL, &out, &len, err, sizeof err);
        if (rc != c->code || strstr(err, c->needle) == NULL)
            fail_msg("render case %zu %s: rc=%d err=%s (want %d, '%s')", i,
                     c->tmpl, rc, err, c->code, c->needle);
        assert_null(out);
    }
    jj_vars_free(v);
}

static void test_unsupported_note(void **state)
{
    (void)state;
    /* a filter Jinja knows but this engine lacks: parse succeeds, the use
     * is reported, and only a render that reaches it fails */
    const char *src = "{% if x %}\n{{ x|wordwrap }}\n{% endif %}ok";
    struct jj_template *t = NULL;
    char err[512];
    assert_int_equal(jj_template_parse(src, strlen(src), &t, err, sizeof err),
                     0);
    assert_string_equal(jj_template_unsupported(t), "line 2: filter 'wordwrap'");
    char *out;
    size_t len;
    assert_int_equal(jj_render(t, NULL, NULL, &out, &len, err, sizeof err), 0);
    assert_string_equal(out, "ok");
    free(out);
    struct jj_vars *v = jj_vars_new();
    assert_int_equal(jj_vars_set_str(v, "x", "long text"), 0);
    assert_int_equal(jj_render(t, v, NULL, &out, &len, err, sizeof err),
                     TG_EUNSUPPORTED);
    assert_non_null(strstr(err, "line 2"));
    assert_non_null(strstr(err, "wordwrap"));
    jj_vars_set_bool(v, "x", false);
    jj_vars_unset(v, "x");
    jj_vars_unset(v, "nothing");
    assert_int_equal(jj_render(t, v, NULL, &out, &len, err, sizeof err), 0);
    free(out);
    jj_vars_free(v);
    jj_template_free(t);
    jj_template_free(NULL);
    src = "plain";
    assert_int_equal(jj_template_parse(src, strlen(src), &t, err, sizeof err),
                     0);
    assert_string_equal(jj_template_unsupported(t), "");
    jj_template_free(t);
}

static void test_limits(void **state)
{
    (void)state;
    char err[512], *out;
    size_t len;
    struct jj_limits lim = {.max_output = 100};
    assert_int_equal(run("{% for i in range(50) %}xyz{% endfor %}", NULL, &lim,
                         &out, &len, err, sizeof err),
                     TG_ETOOBIG);
    assert_non_null(strstr(err, "max_output"));
    assert_int_equal(run("{{ 'x' * 101 }}", NULL, &lim, &out, &len, err,
                         sizeof err),
                     TG_ETOOBIG);
    assert_int_equal(run("{{ 'x' * 100 }}", NULL, &lim, &out, &len, err,
                         sizeof err),
                     0);
    free(out);
    lim = (struct jj_limits){.max_steps = 1000};
    assert_int_equal(run("{% for i in range(100000) %}{% endfor %}", NULL,
                         &lim, &out, &len, err, sizeof err),
                     TG_ETOOBIG);
    assert_non_null(strstr(err, "max_steps"));
    lim = (struct jj_limits){.max_depth = 5};
    assert_int_equal(run("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}"
                         "{{ f(0) }}",
                         NULL, &lim, &out, &len, err, sizeof err),
                     TG_ETOOBIG);
    assert_non_null(strstr(err, "max_depth"));
    assert_int_equal(run("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}"
                         "{% endmacro %}{{ f(4) }}.",
                         NULL, &lim, &out, &len, err, sizeof err),
                     0);
    free(out);
    /* the parser's own limits */
    char deep[1000];
    memset(deep, '(', 300);
    snprintf(deep + 300, sizeof deep - 300, "1");
    memset(deep + 301, ')', 300);
    deep[601] = '\0';
    char src[1100];
    snprintf(src, sizeof src, "{{ %s }}", deep);
    struct jj_template *t = NULL;
    assert_int_equal(jj_template_parse(src, strlen(src), &t, err, sizeof err),
                     TG_ETOOBIG);
    char *big = calloc(JJ_MAX_TEMPLATE_BYTES + 2, 1);
    assert_non_null(big);
    memset(big, 'a', JJ_MAX_TEMPLATE_BYTES + 1);
    assert_int_equal(jj_template_parse(big, JJ_MAX_TEMPLATE_BYTES + 1, &t,
                                       err, sizeof err),
                     TG_ETOOBIG);
    free(big);
    assert_int_equal(jj_template_parse("a\n\xff", 3, &t, err, sizeof err),
                     TG_EFORMAT);
    assert_non_null(strstr(err, "line 2"));
    assert_non_null(strstr(err, "UTF-8"));
    /* a dotted filter name over 255 bytes is refused whole, not looked up
     * cut */
    char name[400];
    memset(name, 'a', 299);
    name[299] = '\0';
    snprintf(src, sizeof src, "{{ x|%.150s.%s }}", name, name + 150);
    assert_int_equal(jj_template_parse(src, strlen(src), &t, err, sizeof err),
                     TG_ETOOBIG);
    assert_non_null(strstr(err, "longer than 255 bytes"));
}

static void test_json_dumps_py(void **state)
{
    (void)state;
    json_error_t je;
    json_t *v = json_loads("{\"b\": [1, 2.5, 0.1, 1e22, true, null], "
                           "\"a\": \"\\u00e9\\n\\\"\", \"c\": {}}",
                           0, &je);
    assert_non_null(v);
    char *out;
    size_t len;
    assert_int_equal(jj_json_dumps_py(v, false, &out, &len), 0);
    assert_string_equal(out, "{\"b\": [1, 2.5, 0.1, 1e+22, true, null], "
                             "\"a\": \"\303\251\\n\\\"\", \"c\": {}}");
    assert_int_equal(len, strlen(out));
    free(out);
    assert_int_equal(jj_json_dumps_py(v, true, &out, &len), 0);
    assert_non_null(strstr(out, "\"\\u00e9\\n"));
    free(out);
    json_decref(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_cases),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_unsupported_note),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_json_dumps_py),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
