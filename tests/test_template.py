"""The %%lm cell language (lmnb.template): grammar → lmnb programs, and errors with positions.

Each case pairs a cell with the lmnb program a person writes by hand for it (the reference). All
three — the hand-written program, the parsed template run directly (face 1) and the Python source
the template emits (face 2) — run on a recording state; their lmnb calls must be identical.
"""

from __future__ import annotations

import dataclasses
import threading
import types

import numpy as np
import pytest

import lmnb
from lmnb import ir
from lmnb.template import TemplateRuntimeError, TemplateSyntaxError, parse, parse_python
from lmnb.template.errors import UnclosedError


# ---------------------------------------------------------------------------------- recording
def describe(x):
    """A comparable description of what was added to a state (lmnb IR objects have no __eq__)."""
    if isinstance(x, str):
        return ("text", x)
    if isinstance(x, ir.ConstantText):
        return ("text", x.value)
    if isinstance(x, ir.ExprList):
        return ("list", [describe(e) for e in x.exprs])
    if isinstance(x, ir.Gen):
        return ("gen", x.name, dataclasses.asdict(x.params))
    if isinstance(x, ir.Select):
        return ("select", x.name, list(x.choices), x.temperature, type(x.choices_method).__name__)
    if isinstance(x, (ir.RoleBegin, ir.RoleEnd)):
        return (type(x).__name__, x.role)
    if isinstance(x, ir.Image):
        return ("image", x.source)
    if isinstance(x, ir.Video):
        return ("video", x.source, x.num_frames)
    raise AssertionError(f"unexpected {x!r}")


class Rec:
    """Stands in for a ProgramState: logs every +=, fork, read and join, in order."""

    def __init__(self, log, path=()):
        self.log, self.path = log, path

    def __iadd__(self, x):
        self.log.append((self.path, "add", describe(x)))
        return self

    def __getitem__(self, name):
        self.log.append((self.path, "read", name))
        return f"<{name}>"

    def fork(self, n):
        self.log.append((self.path, "fork", n))
        return Group([Rec(self.log, self.path + (i,)) for i in range(n)], self)


class Group(list):
    def __init__(self, states, parent):
        super().__init__(states)
        self.parent = parent

    def join(self, mode="gather_variable"):
        self.parent.log.append((self.parent.path, "join", mode))

    def join_or_abort(self, mode="gather_variable"):  # face 1's {join}: the same join where no branch fails
        self.join(mode)


def record(func, **kwargs):
    log = []
    func(Rec(log), **kwargs)
    return log


def faces(cell: str, **kwargs):
    """(face-1 log, face-2 log) of a cell run with kernel variables ``kwargs``."""
    t = parse(cell)
    params = t.bind(kwargs)
    one = record(t.program().func, **params)
    ns = {"lmnb": lmnb}
    exec(t.to_python("cell"), ns)
    two = record(ns["cell"].func, **params)
    return one, two


def check(cell: str, reference, **kwargs):
    """Both faces of ``cell`` make the calls of the hand-written ``reference`` program."""
    one, two = faces(cell, **kwargs)
    renamed = {"s": "s_", "stop": "stop_"}  # kernel names that clash with lmnb's (see parameters)
    expected = record(reference.func, **{renamed.get(k, k): v for k, v in kwargs.items()})
    assert one == expected
    assert two == expected


# ------------------------------------------------------------------------------ grammar cases
def test_text_interpolation_and_gen_with_braces_in_regex():
    cell = 'Rate {{0-9}} for {item}:\n{gen score max_tokens=4 regex=r"\\d{1,2}" stop=["\\n", "}"]}'

    @lmnb.function
    def ref(s, item):
        s += "Rate {0-9} for "
        s += item + ":\n"
        s += lmnb.gen("score", max_tokens=4, regex=r"\d{1,2}", stop=["\n", "}"])

    check(cell, ref, item="soup")
    t = parse(cell)
    assert t.arguments == ("item",) and t.captures == ("score",)


@pytest.mark.parametrize("cell, gen", [
    ('{gen x stop="}"}', lambda: lmnb.gen("x", stop="}")),
    ("{gen x stop='{' max_tokens=2}", lambda: lmnb.gen("x", stop="{", max_tokens=2)),
    ('{gen x stop="\\"}" max_tokens=2}', lambda: lmnb.gen("x", stop='"}', max_tokens=2)),  # (an escaped quote)
    ("{gen x stop='''}\n{'''}", lambda: lmnb.gen("x", stop="}\n{")),
    ('{select x choices=["a}", "{b", "c\\"}"]}', lambda: lmnb.select("x", choices=["a}", "{b", 'c"}'])),
])
def test_braces_and_escaped_quotes_in_a_holes_strings_are_the_strings(cell, gen):
    @lmnb.function
    def ref(s):
        s += "<"
        s += gen()
        s += ">"

    check("<" + cell + ">", ref)


def test_a_gen_with_regex_none_is_a_gen_with_no_regex_as_in_gen():
    """regex=None is gen()'s default (no constraint); the cell refused the literal: "regex must be a
    string, got NoneType"."""

    @lmnb.function
    def ref(s):
        s += lmnb.gen("n", max_tokens=3)

    check("{gen n max_tokens=3 regex=None}", ref)


def test_select_unnamed_gen_and_options_with_commas_or_spaces():
    cell = (
        "Is {x} positive? {select verdict choices=labels, temperature=0}\n"
        "Because{gen max_tokens=8, stop=\".\"} {select again choices=['a b', \"c=d\"]}"
    )

    @lmnb.function
    def ref(s, x, labels):
        s += "Is "
        s += str(x) + " positive? "
        s += lmnb.select("verdict", choices=labels, temperature=0)
        s += "\nBecause"
        s += lmnb.gen(max_tokens=8, stop=".")
        s += " "
        s += lmnb.select("again", choices=["a b", "c=d"])

    check(cell, ref, x=3, labels=["yes", "no"])


def test_the_parameters_of_a_lambda_option_value_are_not_options():
    # "q=1" in the lambda's parameters was read as an option q (an invalid expression "lambda")
    # (a syntax error at the hole); now it is the lambda, which the option's own check refuses, at it
    cell = "{gen v stop=lambda q=1, r=lambda t=2: t: q max_tokens=3}"
    t = parse(cell)
    assert [(o.key, o.value.source) for o in t.body[0].options] == [
        ("stop", "lambda q=1, r=lambda t=2: t: q"), ("max_tokens", "3")]
    with pytest.raises(TemplateRuntimeError) as e:
        record(t.program().func)
    assert (e.value.line, e.value.col) == (1, 13) and "give a string or a list of strings" in str(e.value)


def test_a_name_bound_in_a_lambda_or_comprehension_is_read_from_the_kernel_outside_it():
    # a lambda's parameter or a comprehension's target counted as bound in the whole hole: the
    # kernel's x was never passed, and the hole failed with NameError: x
    t = parse("{(lambda x: x)(1) + x} {[x for x in xs] + [x]} {[(a, b) for a in xs for b in range(a) if b > n]}")
    assert t.arguments == ("x", "xs", "n")
    one, two = faces(t.source, x=2, xs=[3], n=1)
    assert one == two == [((), "add", ("text", "3 [3, 2] [(3, 2)]"))]


@pytest.mark.parametrize("cell, col", [('Q: {"a\ud800"}', 7), ("{gen a stop='\ud800'}", 14), ("{fork x\ud800 in xs}{join}", 8)])
def test_a_lone_surrogate_in_a_hole_is_refused_at_it(cell, col):
    # (JSON can escape one into a notebook) Python's parser raised UnicodeEncodeError: a traceback
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell)
    assert (e.value.line, e.value.col) == (1, col)
    assert e.value.message == ("the lone surrogate '\\ud800' is half of a UTF-16 pair and no character, so Python "
                               "cannot run code that holds it; delete it, or write the character it was part of")


@pytest.mark.parametrize("cell, kernel, col, hole, text, at", [
    ('{"\\ud800"} {gen u max_tokens=3}', {}, 1, '{"\\ud800"}', "\ud800", 0),
    ("Q:\n{user}x {v:>3}{/user}{gen u}", {"v": "a\udfff"}, 9, "{v}", " a\udfff", 2)])  # (formatted: " a" and it)
def test_a_lone_surrogate_in_a_holes_value_is_refused_at_the_hole(cell, kernel, col, hole, text, at):
    # the value's text was refused only once joined with the text around it, as
    # "ProgramError: the body of program 'cell' failed: ValueError: the text ...", at no hole
    from helpers_lang import ScriptedBackend

    t = parse(cell)
    with pytest.raises(TemplateRuntimeError) as e:
        t.program().run(**t.bind(kernel), backend=ScriptedBackend(lambda p, params: "x"))
    assert (e.value.line, e.value.col) == (cell.count("\n") + 1, col)
    assert e.value.message == (f"the text of {hole}: {text!r} holds the lone surrogate {text[at]!r} at position {at}, "
                               "which is no Unicode character (text decoded with errors='surrogateescape', or half "
                               "of a \\ud83d\\ude00 pair); fix the text, e.g. text.encode('utf-8', 'replace').decode()")


_LIMIT_FIX = ("more digits than Python writes as an integer (at most 4300); write a smaller number, or lift Python's "
              "limit in the kernel first (sys.set_int_max_str_digits(0))")


@pytest.mark.parametrize("cell, value, said", [
    ("{xs}", [1, 2, 3, 10**5000], "xs[3] is 1.000e+5000 (an integer of 5001 digits)"),
    ("{xs!r}", ([0], {"k": [-(10**4300)]}), "xs[1]['k'][0] is -1.000e+4300 (an integer of 4301 digits)"),
    ("{xs + [1]}", [2 * 10**4999], "it holds 2.000e+4999 (an integer of 5000 digits) at [0]"),
    ("{xs}", {10**5000}, "it holds 1.000e+5000 (an integer of 5001 digits) as an item of the set"),
])
def test_a_hole_holding_an_integer_too_long_to_write_names_which_item_it_is(cell, value, said):
    """A list holding an int of more digits than Python writes (4300 by default) failed in Python's
    words, naming no item ("Exceeds the limit (4300 digits) for integer string conversion; use
    sys.set_int_max_str_digits() ..."), though the hole's text is the list's repr: the user had to
    search the list. It names the item now, as an index where one reaches it, with the fix, as a
    hole holding the int itself did. By hand: 10**5000 has 5001 digits, 1.000e+5000; 2*10**4999 has
    5000, 2.000e+4999; 10**4300 (4301 digits) is over the limit of 4300, 10**4299 is not."""
    with pytest.raises(TemplateRuntimeError) as e:
        record(parse(f"Q: {cell}").program().func, xs=value)
    hole = "{" + cell[1:].split("!")[0].rstrip("}") + "}"
    assert (e.value.line, e.value.col) == (1, 4) and e.value.message == f"cannot format {hole}: {said}, {_LIMIT_FIX}"
    one, two = faces("{xs}", xs=[10**4299 - 1])  # (4299 digits: written)
    assert one == two == [((), "add", ("text", f"[{'9' * 4299}]"))]


def test_a_kernel_variable_named_builtins_does_not_replace_the_builtins_of_a_hole():
    # the hole was eval'ed with its names as globals, so __builtins__={"a": 1} became its builtins:
    # len was a NameError. Names read in a comprehension or lambda in the hole are seen too.
    one, two = faces("{len(__builtins__)} {[x + n for x in xs]} {(lambda: n)()}", __builtins__={"a": 1}, xs=[1, 2], n=10)
    assert one == two == [((), "add", ("text", "1 [11, 12] 10"))]


def test_a_value_whose_str_raises_is_reported_at_its_hole():
    # only TypeError/ValueError from formatting were: a __str__ raising anything else surfaced as
    # "the body of program 'cell' failed: RuntimeError: no str", with no line or column
    class Bad:
        def __str__(self):
            raise RuntimeError("no str")

    with pytest.raises(TemplateRuntimeError) as e:
        record(parse("Q:\nsee {b} now").program().func, b=Bad())
    assert (e.value.line, e.value.col) == (2, 5) and e.value.message == "cannot format {b}: RuntimeError: no str"
    with pytest.raises(TemplateRuntimeError) as e:
        record(parse("{x:.2f}").program().func, x="abc")
    assert e.value.message == "cannot format {x}: Unknown format code 'f' for object of type 'str'"


def test_a_format_spec_may_start_with_an_equals_sign_as_in_f_strings():
    # "{x:=^5}" was read as the walrus "x := ^5" and refused as invalid Python
    one, two = faces("[{x:=^5}] [{x:=+4}]", x=1)
    assert one == two == [((), "add", ("text", "[")), ((), "add", ("text", "==1==] [+  1]"))]


def test_a_number_literal_with_a_format_spec_is_formatted_as_a_variable_is():
    # {3.14159:.2f} was refused as "looks like JSON or a dict", though {x:.2f} worked
    one, two = faces("pi is {3.14159:.2f}, {x:.2f} or {7:03d}", x=3.14159)
    assert one == two
    assert "".join(args[1] for _, _, args in one) == "pi is 3.14, 3.14 or 007"
    for dict_like in ('{"a": 1}', "{1: 2}", "{1.5: 'x'}"):
        with pytest.raises(TemplateSyntaxError, match="looks like JSON or a dict"):
            parse(dict_like)


def test_kernel_variables_named_like_the_programs_own_helpers_are_read_as_any_other():
    # program() called _execute(_template, ...), which a parameter of the same name hid
    one, two = faces("{_execute} {_template}", _execute="E", _template="T")
    assert one == two == [((), "add", ("text", "E T"))]


def test_a_bare_tuple_as_an_option_value_or_fork_items_is_one_value_in_the_export_too():
    # the export wrote choices="a", "b" and list(a, b): a SyntaxError and a TypeError
    cell = '{select v choices="yes", "no"}{fork t in a, b}{t}{join}'

    @lmnb.function
    def ref(s, a, b):
        s += lmnb.select("v", choices=["yes", "no"])
        forks = s.fork(2)
        for f, t in zip(forks, ["A", "B"]):
            f += t
        forks.join()

    check(cell, ref, a="A", b="B")


def test_roles_on_their_own_lines_hold_exactly_the_lines_between_tags():
    cell = (
        "{system}\nYou are terse.\n{/system}\n"
        "{user}\nName a {kind}.\nOne word.\n{/user}\n"
        "{assistant}\n{gen name max_tokens=5}\n{/assistant}\n"
        "{user}Why?{/user}"
    )

    @lmnb.function
    def ref(s, kind):
        s += lmnb.system("You are terse.")
        s += lmnb.user("Name a " + kind + ".\nOne word.")
        s += lmnb.assistant_begin()
        s += lmnb.gen("name", max_tokens=5)
        s += lmnb.assistant_end()
        s += lmnb.user("Why?")

    check(cell, ref, kind="color")


def test_fork_over_items_with_per_branch_variables_then_gathered_list():
    cell = (
        "Tips for {topic}:\n"
        "{fork i, tip in enumerate(tips)}\n"
        "Tip {i + 1}: {tip}. Details:{gen detail max_tokens=16 stop=\"\\n\\n\"}\n"
        "{join}\n"
        "First: {detail[0]}\n"
        "Summary:{gen summary}"
    )

    @lmnb.function
    def ref(s, topic, tips):
        s += "Tips for "
        s += topic + ":\n"
        items = list(enumerate(tips))
        forks = s.fork(len(items))
        for f, (i, tip) in zip(forks, items):
            f += "Tip "
            f += str(i + 1) + ": " + tip + ". Details:"
            f += lmnb.gen("detail", max_tokens=16, stop="\n\n")
        forks.join()
        s += "First: "
        s += s["detail"][0] + "\nSummary:"
        s += lmnb.gen("summary")

    check(cell, ref, topic="health", tips=["sleep", "walk"])
    assert parse(cell).captures == ("detail", "summary")


def test_nested_forks_roles_inside_branches_and_concat_join():
    cell = (
        "{user}Judge: {q}{/user}\n"
        "{fork dim in dims}\n"
        "{assistant}\nOn {dim}: {gen view max_tokens=8}\n{/assistant}\n"
        "{fork 2}{gen vote choices=[\"A\", \"B\"]}{join}\n"
        "Votes {vote}\n"
        "{join concat}\n"
        "Verdict from {view}:{gen verdict}"
    )

    @lmnb.function
    def ref(s, q, dims):
        s += lmnb.user("Judge: " + q)
        s += "\n"
        items = list(dims)
        forks = s.fork(len(items))
        for f, dim in zip(forks, items):
            f += lmnb.assistant_begin()
            f += "On "
            f += dim + ": "
            f += lmnb.gen("view", max_tokens=8)
            f += lmnb.assistant_end()
            forks2 = f.fork(2)
            for f2 in forks2:
                f2 += lmnb.gen("vote", choices=["A", "B"])
            forks2.join()
            f += "\nVotes "
            f += str(f["vote"])
        forks.join("concate_and_append")
        s += "Verdict from "
        s += str(s["view"]) + ":"
        s += lmnb.gen("verdict")

    check(cell, ref, q="Which is better?", dims=["accuracy", "style"])
    assert parse(cell).captures == ("view", "vote", "verdict")


def test_format_specs_conversions_and_kernel_variables_named_like_lmnb_names():
    # `s` is the program state and `stop` a keyword of run(): such kernel variables are renamed.
    cell = "{s} scored {score:.1f} ({label!r}) for {data['k']} until {stop}"

    @lmnb.function
    def ref(s, s_, score, label, data, stop_):
        s += str(s_) + " scored " + format(score, ".1f") + " (" + repr(label) + ") for " + str(data["k"]) + " until " + stop_

    check(cell, ref, s="Ann", score=0.456, label="ok", data={"k": "v"}, stop="noon")
    t = parse(cell)
    assert t.parameters == {"s": "s_", "score": "score", "label": "label", "data": "data", "stop": "stop_"}


def test_json_schema_from_a_pydantic_model_in_the_kernel():
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    cell = "Extract: {text}\n{gen person json_schema=Person max_tokens=64}"

    @lmnb.function
    def ref(s, text, Person):
        s += "Extract: "
        s += text + "\n"
        s += lmnb.gen("person", json_schema=Person, max_tokens=64)

    check(cell, ref, text="Ann is 31.", Person=Person)


def test_emitted_source_reads_like_hand_written_lmnb():
    t = parse('Q: {question}\nA: {gen answer max_tokens=16 stop="\\n"}')
    assert t.to_python("qa") == (
        "@lmnb.function\n"
        "def qa(s, question):\n"
        '    s += "Q: "\n'
        "    s += (\n"
        '        f"{question}\\n"\n'
        '        "A: "\n'
        "    )\n"
        '    s += lmnb.gen("answer", max_tokens=16, stop="\\n")\n'
    )
    # A kernel variable left as a global (the exporter's choice) is not a parameter.
    assert "def qa(s):" in t.to_python("qa", parameters=())


def test_python_mode_body_with_implicit_state():
    body = 's += "Hi " + who\ns += lmnb.gen("x", max_tokens=2)\n'
    cell = parse_python(body, first_line=2)
    log = record(cell.program({"who": "Bo", "lmnb": lmnb}).func)
    assert log == [((), "add", ("text", "Hi Bo")), ((), "add", describe(lmnb.gen("x", max_tokens=2)))]
    assert cell.to_python("p") == '@lmnb.function\ndef p(s):\n    s += "Hi " + who\n    s += lmnb.gen("x", max_tokens=2)\n'
    assert cell.to_python("p", parameters=("who",)).startswith("@lmnb.function\ndef p(s, who):\n")
    text = 's += """a\nb"""\n'
    assert parse_python(text).to_python("p") == '@lmnb.function\ndef p(s):\n    s += """a\nb"""\n'


def test_image_and_video_holes_from_kernel_variables_and_literal_paths():
    cell = (
        "{user}\n"
        "{image photo}\n"
        "{image 'cat.png'} {video clip frames=n} {video \"walk.mp4\", frames=2}\n"
        "Same animal as {name}?\n"
        "{/user}\n"
        "{fork pic in pics}{image pic}{gen d max_tokens=2}{join}"
    )

    @lmnb.function
    def ref(s, photo, clip, n, name, pics):
        s += lmnb.user_begin()
        s += lmnb.image(photo)
        s += "\n"
        s += lmnb.image("cat.png")
        s += " "
        s += lmnb.video(clip, n)
        s += " "
        s += lmnb.video("walk.mp4", 2)
        s += "\nSame animal as "
        s += name + "?"
        s += lmnb.user_end()  # the {/user} line takes its line break with it
        items = list(pics)
        forks = s.fork(len(items))
        for f, pic in zip(forks, items):
            f += lmnb.image(pic)
            f += lmnb.gen("d", max_tokens=2)
        forks.join()

    check(cell, ref, photo="p.png", clip="c.mp4", n=3, name="Rex", pics=["a.png", "b.png"])
    t = parse(cell)
    assert t.arguments == ("photo", "clip", "n", "name", "pics")
    assert "    s += lmnb.image(photo)\n    s += \"\\n\"\n    s += lmnb.image('cat.png')\n" in t.to_python()
    assert "s += lmnb.video(clip, n_)" in t.to_python()  # n is a keyword of run(): renamed


def test_video_frame_count_from_a_variable_is_checked_at_the_hole():
    t = parse("Look:\n{video clip frames=k}", first_line=2)
    with pytest.raises(TemplateRuntimeError) as e:
        record(t.program().func, **t.bind({"clip": "c.mp4", "k": 0}))
    assert (e.value.line, e.value.col) == (3, 20) and "positive integer" in str(e.value)


# ------------------------------------------------------------------------- errors and positions
@pytest.mark.parametrize(
    "cell, line, col, words",
    [
        ("Hello {name", 2, 7, "never closed"),
        ("a }", 2, 3, "single '}'"),
        ('JSON: {"a": 1}', 2, 7, "looks like JSON"),
        ("x\n  {gen a max_token=3}", 3, 10, "did you mean 'max_tokens'"),
        ("{gen a stop=}", 2, 12, "has no value"),
        ("{select pick}", 2, 1, "choices"),
        ('{select pick choices=["", "a"]}', 2, 22, "choices must be non-empty strings: choice 1 of 2 is ''"),
        # at export too, where a job ran with it and every row failed (found by a review helper)
        ('{select pick choices=["a", "b", "a"]}', 2, 22, "choices must differ; 'a' is listed more than once"),
        ('{gen n regex="(ab"}', 2, 14, 'regex "(ab" cannot be compiled: it is not a valid regular expression (missing '
                                        "), unterminated subpattern at position 0); fix the pattern"),
        # a back-reference passed here and failed when the gen ran ("Gen('n') failed: GrammarError ..."): no backend
        # can constrain output with one (the engine's words)
        ('{gen n regex="(a)\\\\1"}', 2, 14, 'regex "(a)\\\\1" has a back-reference \\1 at position 3: it matches again '
                                          "the very text the group 1 matched, which no regular language expresses; "
                                          "constrained decoding cannot do a back-reference, in ECMA's syntax or Python's "
                                          "(patterns compile to a finite automaton): repeat the group's pattern instead "
                                          "of referring to it"),
        # ECMA's named group was told only "fix the pattern": Python's spelling is offered
        ('{gen n regex="(?<y>a)"}', 2, 14, 'regex "(?<y>a)" cannot be compiled: it is not a valid regular expression '
                                           "(unknown extension ?<y at position 1); Python's re, which reads a regex "
                                           "here, names a group (?P<y>...), where ECMA 262, .NET and Rust's regex "
                                           'write (?<y>...): write "(?P<y>a)"'),
        # a Unicode class at an end of a range passed (re read it held as a range a-z) and failed in the engine
        ('{gen n regex="[\\\\p{L}-z]"}', 2, 14, 'regex "[\\\\p{L}-z]" uses the class \\p{L} as an end of the range'),
        # Python's parser ran out of recursion, and the RecursionError escaped parse
        ('{gen n regex="' + "(" * 1000 + "a" + ")" * 1000 + '"}', 2, 14, 'regex "' + "(" * 79 + "\u2026 nests its "
                                                                        "parentheses too deeply for Python's re"),
        # gen()'s words for it (the cell said "got int"); tested to be gen()'s in test_lang_interpreter
        ("{gen n regex=5}", 2, 14, "regex must be a string, not int"),
        ('{gen n stop_regex="(ab"}', 2, 19, 'stop_regex="(ab" is invalid: "(ab" is not a valid regular expression'),
        ('{gen n stop_regex=["x", "a*"]}', 2, 19, 'stop_regex=["x", "a*"] is invalid: "a*" matches the empty string'),
        # as JSON, as the other stop_regex errors write a pattern (it said "stop_regex the pattern 'x\\ud800'")
        ('{gen n stop_regex="x\\ud800"}', 2, 19, 'stop_regex="x\\ud800" is invalid: "x\\ud800" holds the lone surrogate '
                                                '"\\ud800" at position 1'),
        ('{gen c json_schema={"type": "objekt"}}', 2, 20, "#/type is not a valid JSON Schema"),  # before any gen runs
        ("{gen c json_schema='[1]'}", 2, 20, "must be a JSON object"),
        ("{gen c json_schema=[1]}", 2, 20, "json_schema must be a JSON string, a dict, a bool or a pydantic model "
                                           "class, not list"),  # (gen()'s words)
        ('{gen c json_schema={"$schema": []}}', 2, 20, "#/$schema must be a string"),  # was a TypeError
        ('{gen c json_schema={"enum": ("a", 1j)}}', 2, 20, "a value JSON cannot represent"),
        # a pattern no regex dialect reads passed here and failed when the gen ran, reported twice at {gen
        ('{gen c json_schema={"properties": {"a": {"pattern": "a(b"}}}}', 2, 20,
         'JSON schema at #/properties/a/pattern: the pattern "a(b" cannot be compiled: it is not a valid regular '
         "expression (missing ), unterminated subpattern at position 1); fix the pattern"),
        ("{user}hi{user}", 2, 9, "roles cannot nest"),
        # a kernel variable named user, meant as text, got only the hint to close a chat turn
        ("Hi {user}, bye {user}.", 2, 16, "before {user}; to insert a variable named user as text, write {(user)}"),
        ("Hello {system}!", 2, 7, "add {/system} where the block ends; to insert a variable named system as text, "
                                  "write {(system)}"),
        ("{user}\nhi\n{/assistant}", 4, 1, "does not match {user}"),
        ("{assistant}\n{gen a}", 2, 1, "never closed"),
        ("{fork 0}{join}", 2, 7, "integer >= 1"),
        ("{fork 100000}{join}", 2, 7, "fork count 100000 is over the limit of 256 branches per {fork N}"),
        # a literal count in braces was told to write {fork n}, a name it never had
        ("{fork {2}}{join}", 2, 7, "write the count without them ({fork 2}, not {fork {2}})"),
        ("{join}", 2, 1, "without an open {fork}"),
        ("{fork 2}\n{user}x\n{join}", 4, 1, "{join} inside {user}"),
        ("{user}{fork 2}{/user}{join}", 2, 15, "inside the {fork}"),
        ("{gen a}{fork 2}{gen a}{join concat}", 2, 23, "already exists before the fork"),
        ("{fork 1, x in y}{join}", 2, 7, "name or a tuple of names"),
        ("{x +* 2}", 2, 5, "invalid Python expression"),
        # a misspelt or capitalised construct word said only "invalid Python expression: invalid syntax. Perhaps
        # you forgot a comma?", with the hint to double literal braces
        ("{gne x max_tokens=3}", 2, 2, "'gne' starts no construct of the %%lm cell language, and the hole is no "
                                       "Python expression either; did you mean {gen ...}?"),
        ("A: {Gen x}", 2, 5, "'Gen' starts no construct of the %%lm cell language"),
        ('{selct x choices=["a"]}', 2, 2, "did you mean {select ...}?"),
        ("{for x in xs}\n{join}", 2, 2, "did you mean {fork ...}?"),
        ("{usr hi}", 2, 2, "did you mean {user}?"),
        ("{fork 2}{Join concat}", 2, 10, "did you mean {join concat}?"),  # (it offered {join}, dropping concat)
        # (a tag is no word before a space: the hint said "(lowercase, then a space)" of {user} and {join} too)
        ("{Usr hi}", 2, 2, "hint: a hole is a construct where it starts with one of the words gen, select, fork, "
                               "join, image, video, system, user, assistant, in lowercase, alone ({user}) or before a "
                               "space ({gen x}); any other hole is a Python expression"),
        ("{gen_int x}", 2, 2, "'gen_int' starts no construct of the %%lm cell language, and the hole is no Python "
                              "expression either; did you mean {gen NAME dtype=int}?"),
        ("{x y}", 2, 2, "invalid Python expression: invalid syntax"),  # no word close to a keyword
        # a tag in another case is a Python variable: the error fell on the block it left open or unopened, with the
        # hint to add {join} or none at all
        ("{System}\nhi\n{/system}", 4, 1, "hint: {System} at line 2, col 1 is read as a Python variable, not the "
                                           "tag: write {system} (lowercase)"),
        ("{fork 2}\nA{Join}", 2, 1, "hint: {Join} at line 3, col 2 is read as a Python variable, not the tag: write "
                                    "{join} (lowercase)"),
        ("{fork 2}\n{Join}\n{join}{user}x", 4, 7, "add {/user} where the block ends"),  # ({Join} is no hint there)
        # an opener in another case, bare or the start of a Python expression ({Fork 2} is none, told at itself),
        # left the {join} after it "without an open {fork}" with no hint, or "inside {user}" with the hint to close it
        ("{Fork}\nA\n{join}", 4, 1, "hint: {Fork} at line 2, col 1 is read as a Python variable, not the tag: write "
                                    "{fork ...} (lowercase, then a space)"),
        ("{Fork(2)}A{join}", 2, 11, "hint: {Fork(2)} at line 2, col 1 is read as a Python expression, not the tag: "
                                    "write {fork ...} (lowercase, then a space)"),
        ("{user}{FORK -1}x{join}{/user}", 2, 17, "hint: {FORK -1} at line 2, col 7 is read as a Python expression"),
        ("{Fork 2}\nA\n{join}", 2, 2, "did you mean {fork ...}?"),
        ("{in x}", 2, 2, "invalid Python expression: invalid syntax"),  # a Python keyword is no misspelt {join}
        ("{x!z}", 2, 3, "!r, !s or !a"),
        ('{gen "a"}', 2, 6, "not a variable name"),
        ("{/fork}", 2, 1, "closed with {join}"),
        ("{}", 2, 1, "empty hole"),
        ("é {gen a stop=[1,}", 2, 18, "does not match"),
        ("{image}", 2, 1, "needs a source"),
        ("a\n{image }", 3, 1, "needs a source"),
        ("{video clip}", 2, 1, "needs frames=N"),
        ("{image p frames=2}", 2, 10, "takes no options"),
        ("{video c num_frames=3}", 2, 10, "did you mean 'frames'"),
        # every unknown option, each offered its own (only the first was, so the next showed on the next run)
        ("{gen a max_token=3 temprature=0.5}", 2, 8, "gen has no options 'max_token', 'temprature'; did you mean "
                                                     "'max_token' → 'max_tokens', 'temprature' → 'temperature'?"),
        ('{select a choice=["x"] temprature=0 bogus=1}', 2, 11, "select has no options 'choice', 'temprature', "
                                                                "'bogus'; did you mean 'choice' → 'choices', "
                                                                "'temprature' → 'temperature'?"),
        ("{video c fps=2 num_frames=3}", 2, 10, "video has no options 'fps', 'num_frames'; did you mean 'num_frames' "
                                                "→ 'frames'?"),
        ("{video c frames=0}", 2, 17, "integer >= 1"),
        ("{video c frames=2, frames=3}", 2, 20, "given twice"),
        ("{video c frames=}", 2, 16, "has no value"),
        ("{image 42}", 2, 8, "must be a path"),
        ("{image photo)}", 2, 13, "unmatched ')'"),
        # a cell keyword said "'image' is not a variable name", which it is in Python (found by the docs audit)
        ("{gen image}", 2, 6, "'image' is a word of the %%lm cell language (its {image} tag), so it cannot name a gen"),
        ('{select user choices=["a"]}', 2, 9, "'user' is a word of the %%lm cell language (its {user} tag), so it "
                                              "cannot name a select result"),
        ("{gen if max_tokens=2}", 2, 6, "'if' is reserved in Python"),  # the exported script would not compile
        ('{select True choices=["a"]}', 2, 9, "'True' is reserved in Python"),
        ("{gen __debug__}", 2, 6, "'__debug__' is reserved in Python"),
        ("{gen __ｄｅｂｕｇ__}", 2, 6, "'__debug__' is reserved in Python"),  # checked after NFKC
        ("{gen ｉｆ}", 2, 6, "'if' is reserved in Python"),
        ("{fork __debug__ in xs}{join}", 2, 7, "'__debug__' is reserved in Python, so it cannot be a fork target"),
        ("{gen x # note\n max_tokens=3}", 2, 8, "a comment (#) cannot go inside {...}"),
        ('{gen x regex="[0-9]+" dtype=int}', 2, 23, "gen() takes one of regex, dtype"),
        ("{gen x temperature=-1}", 2, 20, "temperature must be a finite number >= 0"),
        ("{gen x top_p=0}", 2, 14, "top_p must be a number in (0, 1]"),
        ("{gen x n=0}", 2, 10, "n must be an integer >= 1"),
        ("{gen x stop=5}", 2, 13, "stop=5 is invalid: give a string or a list of strings"),
        ('{gen x stop=["a", ""]}', 2, 13, "stop is invalid: an empty string (item 1) names no place to stop"),
        # the engine refused these only once the gen was sent, away from the hole
        ('{gen x seed="a"}', 2, 13, "seed='a' is invalid: must be an integer"),
        ("{gen x min_p=2}", 2, 14, "min_p=2 is invalid: must be in [0, 1]"),
        ("{gen x ignore_eos='yes'}", 2, 19, "ignore_eos='yes' is invalid: must be True or False"),
        # certain to fail, but refused only as the cell ran: at the option now, as gen() refuses them
        ('{gen x dtype="complex"}', 2, 14, "gen(dtype='complex') is not supported; use int, float, bool or str"),
        ('{select x choices=["a", "b"] choices_method="x"}', 2, 45, "choices_method must be one of "
                                                                   "lmnb.token_length_normalized"),
        # a literal dict got "choices must be a non-empty list of strings", one in a variable the dict's words
        ('{select x choices={"a": 1}}', 2, 19, 'choices is a dict, whose keys or values may be meant; pass '
                                               'list({"a": 1}) for its keys or list({"a": 1}.values()) for its values'),
        # select's words, as lmnb.select refuses it; the cell gave gen's ("0 is greedy")
        ('{select x choices=["a", "b"] temperature=-1}', 2, 42, "temperature must be a finite number >= 0 "
                                                               "(0 picks the likeliest), got -1"),
        # gen(choices=...)'s words, as select's; the cell gave gen's ("0 is greedy"), after the choices or before
        ('{gen x choices=["a", "b"] temperature=-1}', 2, 39, "temperature must be a finite number >= 0 "
                                                            "(0 picks the likeliest), got -1"),
        ('{gen x temperature=-1 choices=["a", "b"]}', 2, 20, "temperature must be a finite number >= 0 "
                                                            "(0 picks the likeliest), got -1"),
        # (None, gen()'s "inherit", is no select temperature: it passed the parse and failed as the cell ran)
        ('{select x choices=["a", "b"] temperature=None}', 2, 42, "temperature must be a finite number >= 0 "
                                                                 "(0 picks the likeliest), got None"),
        ("{gen x min_tokens=5 max_tokens=2}", 2, 19, "min_tokens=5 must not exceed max_tokens=2"),
        ("{gen x max_tokens=2, min_tokens=5}", 2, 33, "min_tokens=5 must not exceed max_tokens=2"),
        ("{gen x max_tokens=4 # four}", 2, 21, "a comment (#) cannot go inside {...}"),
        ("a {(yield)}", 2, 5, "'yield' outside function"),  # Python's compiler refused it: a bare SyntaxError
        ("{gen a stop=await x}", 2, 13, "'await' outside function"),
        ("{x}\n{(x := 1)}", 3, 3, "':=' cannot go in a hole"),  # the export then read 1 for {x}, the kernel x
        ("{gen a stop=[y := 'a' for q in z]}", 2, 14, "':=' cannot go in a hole"),
        ("a {ｉn}", 2, 4, "'ｉn' reads as the Python keyword 'in'"),  # exported as def cell(s, in): ...
        ("{gen x max_tokens=ｉｆ}", 2, 19, "'ｉｆ' reads as the Python keyword 'if'"),
        # braces around a variable, as around a hole: a set, refused only as the gen ran, with no position
        ("A: {gen x max_tokens={n}}", 2, 22, "max_tokens={n} is a set: inside a hole an option's value is a Python "
                                             "expression already"),
    ],
)
def test_malformed_cells_report_line_and_column(cell, line, col, words):
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell, first_line=2)
    assert (e.value.line, e.value.col) == (line, col), str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("cell, col, words, hint", [
    ('{select c choices=["yes" "no"]}', 20, '"yes" "no" in choices= is one string, \'yesno\'', 'write "yes", "no"'),
    ("{select c choices=['a', 'b' 'c' 'd']}", 25, "'b' 'c' 'd' in choices= is one string, 'bcd'", "write 'b', 'c', 'd'"),
    ('{gen x stop=("\\n" "Q:",) max_tokens=3}', 14, '"\\n" "Q:" in stop= is one string, \'\\nQ:\'', 'write "\\n", "Q:"'),
    ('{select c choices=["a" f"{x}"]}', 20, '"a" f"{x}" in choices= is one string', 'write "a", f"{x}"'),
])
def test_strings_side_by_side_in_a_list_option_are_a_missing_comma(cell, col, words, hint):
    """Options are separated by spaces, and so, to a newcomer, are a list's items: choices=["yes"
    "no"] was Python's one string 'yesno', a select of one choice that always "won"."""
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell, first_line=2)
    assert (e.value.line, e.value.col) == (2, col), str(e.value)  # the item's first character
    assert str(e.value).splitlines()[0] == (
        f"line 2, col {col}: {words}: Python joins strings written side by side; a list's items are separated "
        "by commas (spaces separate only a hole's options)")
    assert e.value.hint == hint


def test_strings_side_by_side_over_lines_in_a_list_option_are_one_long_string():
    """Pieces on separate lines are how a long string is written; they stay one choice."""
    assert parse('{select c choices=["a long "\n "choice", "b"]}') is not None


@pytest.mark.parametrize("key, text, value", [
    ("max_tokens", "3", 3), ("stop", "'.'", "."), ("seed", "7", 7), ("n", "2", 2), ("top_p", "0.5", 0.5)])
def test_a_gen_with_choices_refuses_a_generation_option_at_the_option(key, text, value):
    # lmnb.gen refused these only once the cell ran (after the model loaded), at the hole's column 1
    cell = '{gen c choices=["x","y"] ' + f"{key}={text}}}"
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell, first_line=2)
    assert (e.value.line, e.value.col) == (2, 26), str(e.value)  # the option's first character
    assert e.value.hint.startswith(f"drop {key};")
    with pytest.raises(ValueError):  # gen refuses the same combination
        lmnb.gen("c", choices=["x", "y"], **{key: value})


@pytest.mark.parametrize("cell, kernel, options", [
    ('{gen x choices=c regex="a+"}', {"c": ["a", "b"]}, {"regex": "a+"}),
    ("{gen x choices=c max_tokens=3}", {"c": ["a", "b"]}, {"max_tokens": 3}),
    ('{gen x choices=c json_schema={"type": "integer"} n=2}', {"c": ["a", "b"]},
     {"json_schema": {"type": "integer"}, "n": 2}),
    ('{gen x choices=["a", "b"] seed=k}', {"k": 7}, {"choices": ["a", "b"]}),
    ('{gen x regex=r dtype="int"}', {"r": "[0-9]+"}, {"dtype": "int"}),
])
def test_a_combination_with_a_variable_is_decided_by_its_value_as_gen_decides_it(cell, kernel, options):
    """A combination gen() refuses (choices beside regex or max_tokens, two output constraints) was
    refused as the cell was parsed where one of the two was a variable, which may hold None, gen()'s
    default: gen(choices=None, regex=...) is a gen with a regex. Now the value decides, as it runs:
    None makes the calls of the gen written without it, another value gen()'s refusal, at the hole."""
    (name, value), = kernel.items()
    parse(cell)  # (nothing is known to be wrong before the variable is read)

    @lmnb.function
    def ref(s):
        s += lmnb.gen("x", **options)  # the variable's option left out: its None is gen()'s default

    one, two = faces(cell, **{name: None})
    assert one == two == record(ref.func)
    key = cell.split(f"={name}")[0].split()[-1]  # the option the variable is the value of
    with pytest.raises(ValueError) as python:
        lmnb.gen("x", **options, **{key: value})
    with pytest.raises(TemplateRuntimeError) as e:
        faces(cell, **kernel)
    # (gen()'s words, which name gen already, unprefixed: "gen: gen() takes one of ..." read twice)
    words = str(python.value)
    assert e.value.message == (words if words.startswith("gen(") else f"gen: {words}")


def test_a_gen_with_choices_keeps_what_a_pick_takes():
    t = parse('{gen c choices=labels, temperature=0.5, choices_method=m, n=1}')
    assert t.arguments == ("labels", "m")
    # (temperature None is gen()'s default, 0, on a pick too, where a select's None is refused)
    assert parse('{gen c choices=["x", "y"] temperature=None}').arguments == ()
    assert lmnb.gen("c", choices=["x", "y"], temperature=None).temperature == 0


@pytest.mark.parametrize("cell, value", [('{gen c choices=["x", "y"] temperature=-1}', -1),
                                         ('{gen c temperature=True choices=labels}', True)])
def test_a_gen_with_choices_refuses_a_literal_temperature_in_the_words_gen_gives(cell, value):
    """The cell refused a gen pick's temperature in gen's words ("0 is greedy"), where Python's
    gen(choices=...) gives select's ("0 picks the likeliest"): the same words now, after its caller."""
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell)
    with pytest.raises(ValueError) as python:
        lmnb.gen("c", choices=["x", "y"], temperature=value)
    said = f"temperature must be a finite number >= 0 (0 picks the likeliest), got {value!r}"
    assert [e.value.message, str(python.value)] == [said, f"gen(..., choices=...) {said}"]


@pytest.mark.parametrize("cell, options, named", [
    ("{gen x temperature=-2 max_tokens=-1}", {"temperature": -2, "max_tokens": -1}, "max_tokens"),
    ("{gen x max_tokens=-1 temperature=-2}", {"max_tokens": -1, "temperature": -2}, "max_tokens"),
    ("{gen x top_p=5 temperature=-2}", {"top_p": 5, "temperature": -2}, "temperature"),
    ("{gen x top_logprobs_num=-1 n=0}", {"top_logprobs_num": -1, "n": 0}, "n"),
    ("{gen x min_tokens=-1 ignore_eos=2}", {"min_tokens": -1, "ignore_eos": 2}, "ignore_eos"),
    ('{gen x choices=["a", "b"] choices_method=3 temperature=-1}',
     {"choices": ["a", "b"], "choices_method": 3, "temperature": -1}, "temperature"),
])
def test_two_bad_values_in_one_gen_are_told_as_python_gen_tells_them(cell, options, named):
    """A cell told the first bad literal it read (temperature last of all, after the others), Python's
    gen() the first in its own order of checks: {gen x top_p=5 temperature=-2} said top_p where
    gen(top_p=5, temperature=-2) says temperature. Now the cell names the option gen() names, in its
    words and at its value, whatever the order written; from kernel variables too (where the cell's
    own check of seed, min_p, ... came first)."""
    with pytest.raises((TypeError, ValueError)) as python:
        lmnb.gen("x", **options)
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell)
    words = str(python.value).removeprefix("gen(..., choices=...) ")  # (a pick's words name no option)
    assert e.value.message == words and named in words
    assert e.value.col == cell.index(f" {named}=") + 2 + len(named) + 1  # (1-based: the value's first character)


@pytest.mark.parametrize("cell", ["{gen x seed=a max_tokens=b}", "{gen x max_tokens=b seed=a}",
                                  "{gen x min_p=c top_p=d}"])
def test_two_bad_values_from_variables_are_told_as_python_gen_tells_them(cell):
    kernel = {"a": 2**70, "b": -1, "c": 2, "d": 5}
    keys = dict(item.split("=") for item in cell[7:-1].split())
    with pytest.raises(ValueError) as python:
        lmnb.gen("x", **{key: kernel[var] for key, var in keys.items()})
    with pytest.raises(TemplateRuntimeError) as e:
        faces(cell, **{var: kernel[var] for var in keys.values()})
    assert e.value.message == f"gen: {python.value}"  # seed/min_p (the cell's own check) were told first


def test_a_lone_carriage_return_ends_a_line_as_it_does_for_python():
    # ast numbered the lines of "{x/\ry}" at \r and the parser at \n only: an IndexError, not a position
    with pytest.raises(TemplateSyntaxError) as e:
        parse("a\r{x +\r* 2}", first_line=2)
    assert (e.value.line, e.value.col) == (4, 1), str(e.value)
    assert parse("{x/\ry}").arguments == ("x", "y")


def test_debug_in_a_hole_is_pythons_constant_not_a_kernel_variable():
    # it was an argument, so the export began "def cell(s, __debug__):", which does not compile
    t = parse("{__debug__}")
    assert t.arguments == ()
    one, two = faces("{__debug__}")
    assert one == two == [((), "add", ("text", "True"))]


def test_the_literal_braces_hint_comes_only_for_a_name_that_opens_a_hole():
    # {who} may be text meant literally ({{who}}); a name inside an option's value cannot be
    with pytest.raises(TemplateRuntimeError) as e:
        parse("Hi {who}").bind({})
    assert e.value.hint == "define who in a Python cell first, or write {{ }} for literal braces"
    with pytest.raises(TemplateRuntimeError) as e:
        parse("Hi {gen x json_schema=Person}").bind({})
    assert e.value.hint == "define Person in a Python cell first"


def test_a_misspelt_kernel_variable_is_told_the_variable_it_is_closest_to():
    """A typo ({persn}) got only "define persn in a Python cell first", which is not the fix; Python's
    own NameError names the close variable. IPython's history names (_i1, _oh) are not offered."""
    namespace = {"person": "Arvel", "place": "Udrin", "_i1": "x", "_oh": {}, "In": []}
    with pytest.raises(TemplateRuntimeError) as e:
        parse("Q: Where does {persn} live?").bind(namespace)
    assert str(e.value).startswith("line 1, col 16: name 'persn' is not defined; did you mean 'person'?")
    with pytest.raises(TemplateRuntimeError) as e:
        parse("{_i}").bind(namespace)  # a name with "_" may be one of them: _i1 is offered
    assert str(e.value).startswith("line 1, col 2: name '_i' is not defined; did you mean '_i1'?")
    with pytest.raises(TemplateRuntimeError) as e:
        parse("{o}").bind(namespace)  # nothing close: the message as before
    assert str(e.value).startswith("line 1, col 2: name 'o' is not defined\n")


@pytest.mark.parametrize("cell, name, col", [
    ("Q: {frozenset([x])}", "frozenset", 5), ("{chr(65)}", "chr", 2), ("{hex(x)}", "hex", 2),
    ("{type(x)}", "type", 2), ('{gen a stop=format(x, "d")}', "format", 13),
])
def test_a_python_builtin_a_hole_does_not_provide_is_told_so(cell, name, col):
    """{frozenset([x])} said "name 'frozenset' is not defined" with the hint "define frozenset in a
    Python cell first", which reads as if Python lacked it: a hole reads builtins outside
    parser.BUILTIN_NAMES as kernel variables, and the error now says so, with the fix."""
    with pytest.raises(TemplateRuntimeError) as e:
        parse(cell).bind({"x": 1})
    assert ((e.value.line, e.value.col), e.value.message, e.value.hint) == (
        (1, col), f"{name!r} is a Python builtin that a hole does not provide",
        f"compute the value in a Python cell (v = {name}(...)) and write {{v}}, or write the cell as %%lm --python, "
        "whose Python has every builtin")


def test_ipythons_display_in_a_hole_is_told_whose_it_is(monkeypatch):
    """A kernel's builtins hold IPython's display: {display(x)} said "'display' is a Python builtin
    that a hole does not provide", or, where lmnb.template was imported before the shell added it,
    "name 'display' is not defined"; a process without IPython's has none, and says that."""
    import builtins

    monkeypatch.setattr(builtins, "display", print, raising=False)  # (as InteractiveShell does)
    with pytest.raises(TemplateRuntimeError) as e:
        parse("Q: {display(x)}").bind({"x": 1})
    assert ((e.value.line, e.value.col), e.value.message) == (
        (1, 5), "'display' is IPython's display, which a kernel adds to the builtins and a hole does not provide")
    monkeypatch.delattr(builtins, "display")
    with pytest.raises(TemplateRuntimeError) as e:
        parse("Q: {display(x)}").bind({"x": 1})
    assert e.value.message == "name 'display' is not defined"


def test_a_misspelt_name_in_a_plain_hole_is_offered_no_function():
    # IPython puts open, exit, quit and get_ipython in every kernel's namespace: {persn}, with no
    # variable close, was offered 'open', which a prompt hole never means
    def summarize(doc):
        return doc[:10]

    namespace = {"open": open, "exit": lambda: None, "get_ipython": lambda: None, "summarize": summarize,
                 "summary": "a text", "doc": "a document"}
    with pytest.raises(TemplateRuntimeError) as e:
        parse("Q: Where does {persn} live?").bind(namespace)
    assert e.value.message == "name 'persn' is not defined"
    with pytest.raises(TemplateRuntimeError) as e:
        parse("{summarise}").bind(namespace)  # a value, not the function, as the hole reads it
    assert e.value.message == "name 'summarise' is not defined; did you mean 'summary'?"
    with pytest.raises(TemplateRuntimeError) as e:
        parse("{summarise(doc)}").bind(namespace)  # a call: the function first
    assert e.value.message == "name 'summarise' is not defined; did you mean 'summarize'?"
    with pytest.raises(TemplateRuntimeError) as e:
        parse("{opn(doc)}").bind(namespace)
    assert e.value.message == "name 'opn' is not defined; did you mean 'open'?"


@pytest.mark.parametrize("cell, col, tag", [
    ("a {Join} b", 4, "{join}"),
    ("{System}", 2, "{system}"),
    ("{ USER }", 3, "{user}"),
    ("{Gen}", 2, "{gen ...}"),
    ("{fork 2}x{Join}{join}", 11, "{join}"),  # inside a fork closed by {join}, so no block error names it
])
def test_a_lone_tag_in_another_case_is_told_the_tag(cell, col, tag):
    """A lone {Join} or {System}, which unbalances no block, was read as a kernel variable and said
    only "name 'Join' is not defined", with the hint to define it, though the construct was meant
    (the block errors name it since 91edd9b)."""
    name = cell.split("{")[-2 if cell.endswith("{join}") else -1].split("}")[0].strip()
    with pytest.raises(TemplateRuntimeError) as e:
        parse(cell).bind({"Joins": 1})  # (a variable close to the name: the tag is offered, not it)
    assert str(e.value).startswith(f"line 1, col {col}: name {name!r} is not defined; did you mean {tag}?\n")
    assert e.value.hint.startswith(f"{{{name}}} is read as a Python variable, not the tag: write {tag} (lowercase), "
                                   f"or define {name} in a Python cell first")


# (lmnb's call, the construct offered, and the call that construct makes: the call as lmnb reads it, by hand)
@pytest.mark.parametrize("call, construct, same", [
    ('gen("a", max_tokens=3)', "{gen a max_tokens=3}", 'gen("a", max_tokens=3)'),
    ('gen("a", 3, stop="\\n")', '{gen a max_tokens=3 stop="\\n"}', 'gen("a", max_tokens=3, stop="\\n")'),
    ('gen(name="a")', "{gen a}", 'gen("a")'),
    ("gen(temperature=0)", "{gen temperature=0}", "gen(temperature=0)"),
    ('select("v", choices=["y", "n"])', '{select v choices=["y", "n"]}', 'select("v", choices=["y", "n"])'),
    ('gen_int("n", max_tokens=2)', "{gen n dtype=int max_tokens=2}", 'gen("n", dtype=int, max_tokens=2)'),
    ("image(p)", "{image p}", "image(p)"),
    ("video(p, num_frames=8)", "{video p frames=8}", "video(p, 8)"),
])
def test_a_python_call_of_an_lmnb_construct_in_a_hole_is_told_the_construct(call, construct, same):
    """{gen("a", max_tokens=3)} (lmnb's Python call, as SGLang programs write it) reads a variable gen, and
    was told only "define gen in a Python cell first, or write {{ }} for literal braces"."""
    with pytest.raises(TemplateRuntimeError) as e:
        parse(f"Q: {{q}}\nA: {{{call}}}").bind({"q": "hi", "p": "cat.png"})
    name = call.split("(")[0]
    assert str(e.value).startswith(f"line 2, col 5: name {name!r} is not defined; did you mean {construct}?\n")
    assert e.value.hint == (f"a hole holds Python, where {name}(...) calls a variable {name}; the cell language "
                            f"writes it {construct}: write that, or define {name} in a Python cell first")
    assert parse(construct).to_python("f").splitlines()[2:] == [f"    s += lmnb.{same}"]


@pytest.mark.parametrize("call, outline", [
    ("gen(x)", "{gen ...}"),  # (the cell names a result with a bare word, not a variable's value)
    ('gen("a", max_token=3)', "{gen ...}"),  # (no such option: the cell's check names the close one)
    ('gen_string("s", 4)', "{gen NAME dtype=str}"),  # (gen_string's later positions are SGLang's, not gen's)
    ("gen(*args)", "{gen ...}"),
    ('user("hi")', "{user}...{/user}"),
    ("join()", "{join}"),
])
def test_a_python_call_of_a_construct_word_with_no_spelling_in_the_cell_is_told_its_outline(call, outline):
    with pytest.raises(TemplateRuntimeError) as e:
        parse(f"{{{call}}}").bind({"x": "a", "args": ()})
    assert f"; did you mean {outline}?\n" in str(e.value) and f"writes it {outline}: write that" in e.value.hint


def test_a_call_of_another_name_is_offered_no_construct():
    with pytest.raises(TemplateRuntimeError) as e:
        parse("{f(q)}").bind({"q": 1})
    assert e.value.hint == "define f in a Python cell first, or write {{ }} for literal braces"
    assert "did you mean" not in str(e.value)
    # a name gen bound in the hole is no variable the cell reads
    assert parse("{[gen(1) for gen in fs]}").bind({"fs": []}) == {"fs": []}


@pytest.mark.parametrize("cell", ["{Join + 1}", "{join_}", "{Joins}"])
def test_a_name_that_is_no_bare_tag_in_another_case_is_offered_no_tag(cell):
    with pytest.raises(TemplateRuntimeError) as e:
        parse(cell).bind({})
    assert "did you mean {" not in str(e.value) and "not the tag" not in e.value.hint


def test_a_json_constant_in_a_hole_is_told_its_python_spelling():
    # json_schema={"required": true} or stop=null read a kernel variable `true`/`null`, and the hint said
    # only "define true in a Python cell first"
    with pytest.raises(TemplateRuntimeError) as e:
        parse('{gen x json_schema={"type": "object", "additionalProperties": false}}').bind({})
    assert str(e.value).startswith("line 1, col 63: name 'false' is not defined")
    assert e.value.hint == ("a hole holds Python, where JSON's false is False: write False, or define false in a "
                            "Python cell first")
    with pytest.raises(TemplateRuntimeError) as e:
        parse("{gen x stop=null}").bind({})
    assert e.value.hint == "a hole holds Python, where JSON's null is None: write None, or define null in a Python cell first"
    assert parse("{gen x json_schema=true}").bind({"true": {}}) == {"true": {}}  # a variable of that name is read


@pytest.mark.parametrize("hole,col,same", [
    # what f-strings write for each form, by hand: f"{x=}" == "x=" + repr(x), f"{x = }" keeps the
    # spaces, a conversion or a format spec replaces repr
    ("{x=}", 6, "x={x!r}"),
    ("{x = }", 7, "x = {x!r}"),
    ("{x=!s}", 6, "x={x!s}"),
    ("{a.b=:>5}", 8, "a.b={a.b:>5}"),
])
def test_fstrings_self_documenting_hole_is_refused_with_the_hole_that_writes_the_same(hole, col, same):
    with pytest.raises(TemplateSyntaxError) as e:
        parse("Hi " + hole)
    assert str(e.value).startswith(f"line 1, col {col}: f-strings' self-documenting {{expr=}} is not supported")
    assert e.value.hint == f"write {same}"
    x, a = 7, types.SimpleNamespace(b="q")
    assert f"{x=}{x = }{x=!s}{a.b=:>5}" == "x={x!r}x = {x!r}x={x!s}a.b={a.b:>5}".format(x=x, a=a)  # f-string parity


def test_an_expression_ending_in_a_comparison_is_still_plain_invalid_syntax():
    with pytest.raises(TemplateSyntaxError, match="invalid Python expression"):
        parse("Hi {x==}")


def test_a_gen_name_is_any_python_identifier_that_is_not_a_keyword():
    cell = "Ciao {gen città max_tokens=2} {gen _x1 stop='#'} {gen é} {select 名前 choices=['a']} {gen caﬁle}"
    # NFKC-normalized, as Python normalizes the names in code ("caﬁle" with the ligature reads "cafile")
    assert list(parse(cell).captures) == ["città", "_x1", "é", "名前", "cafile"]


def test_missing_kernel_variable_and_failing_expression_point_at_the_hole():
    t = parse("Hi {who}\nand {1 / zero}", first_line=2)
    with pytest.raises(TemplateRuntimeError) as e:
        t.bind({})
    assert (e.value.line, e.value.col) == (2, 5) and "'who' is not defined" in str(e.value)
    with pytest.raises(TemplateRuntimeError) as e:
        record(t.program().func, **t.bind({"who": "x", "zero": 0}))
    assert (e.value.line, e.value.col) == (3, 6) and "ZeroDivisionError" in str(e.value)
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    assert str(e.value).startswith("line 3, col 6: {1 / zero} failed: ZeroDivisionError")
    t = parse("Hi {gen x max_tokens=1 // zero}")  # an option's value is named as the option, not as a hole
    with pytest.raises(TemplateRuntimeError) as e:
        record(t.program().func, **t.bind({"zero": 0}))
    assert str(e.value).startswith("line 1, col 22: gen option max_tokens=1 // zero failed: ZeroDivisionError")
    # an image's or video's source, and a video's frames, as the hole shows them: "{1 / zero} failed"
    # named a hole the cell does not have (as did "{video 1 / zero}" of a video with frames=2)
    for cell, col, what in [("{image 1 / zero}", 8, "{image 1 / zero}"), ("{video 1 / zero frames=2}", 8,
                             "{video 1 / zero frames=2}"), ("{video v frames=1 // zero}", 17,
                                                            "video option frames=1 // zero")]:
        t = parse(cell)
        with pytest.raises(TemplateRuntimeError) as e:
            record(t.program().func, **t.bind({"zero": 0, "v": "clip.mp4"}))
        assert str(e.value).startswith(f"line 1, col {col}: {what} failed: ZeroDivisionError"), cell


@pytest.mark.parametrize("before, after, shown, caret", [
    # 1,000,000 characters before the error: its 100 before the column, and 100 from it
    ("x" * 1_000_000, "y" * 1000, "…" + "x" * 93 + "{gen a max_token=3}" + "y" * 88 + "…", 1 + 93 + 7),
    ("x" * 50, "y" * 1000, "x" * 50 + "{gen a max_token=3}" + "y" * 88 + "…", 57),  # the line's start is near
    ("x" * 1000, "", "…" + "x" * 93 + "{gen a max_token=3}", 101),  # and its end
    ("x" * 100, "y" * 121, "x" * 100 + "{gen a max_token=3}" + "y" * 121, 107),  # 240 characters: quoted whole
    ("🦉" * 300, "", "…" + "🦉" * 93 + "{gen a max_token=3}", 1 + 2 * 93 + 7),  # wide characters: two columns each
])
def test_a_long_line_is_quoted_around_the_error(before, after, shown, caret):
    # a %%lm cell with a 1 MB prompt line and a typo quoted the whole line and a caret line as long:
    # 4 MB in the saved notebook, whose error record holds the message twice (evalue and traceback)
    with pytest.raises(TemplateSyntaxError) as e:
        parse(before + "{gen a max_token=3}" + after)
    assert str(e.value).split("\n")[:3] == [
        f"line 1, col {len(before) + 8}: gen has no option 'max_token'; did you mean 'max_tokens'?",
        "    " + shown, "    " + " " * caret + "^"]


def test_a_long_indented_line_keeps_its_margin_when_its_start_is_shown():
    with pytest.raises(TemplateSyntaxError) as e:
        parse("{gen a max_token=3}" + "y" * 300, indent="\t")
    assert str(e.value).split("\n")[1:3] == ["    \t{gen a max_token=3}" + "y" * 88 + "…", "    \t       ^"]


@pytest.mark.parametrize("indent, col", [("    ", 12), ("\t", 9)])
def test_columns_count_the_indentation_an_indented_cell_was_typed_with(indent, col):
    # an indented %%lm cell is read without the indentation its lines share (IPython drops it);
    # its columns were counted without it too, so they pointed left of the text they named
    with pytest.raises(TemplateSyntaxError) as e:
        parse("x\n{gen a max_token=3}", first_line=2, indent=indent)  # as typed: indent + "{gen a max_token=3}"
    assert (e.value.line, e.value.col) == (3, col)  # 'max_token' is the typed line's 8th character past indent
    assert str(e.value).startswith(f"line 3, col {col}: gen has no option 'max_token'")
    assert f"\n    {indent}{{gen a max_token=3}}\n    {indent}       ^" in str(e.value)  # the caret under 'm'


def test_every_position_an_indented_cell_reports_is_as_typed():
    # typed "  {f(a]}": '(' is the 5th character, ']' the 7th
    with pytest.raises(TemplateSyntaxError) as e:
        parse("{f(a]}", first_line=2, indent="  ")
    assert str(e.value).startswith("line 2, col 7: ']' does not match '(' opened at col 5")
    with pytest.raises(TemplateSyntaxError) as e:  # typed "  {user}" ... "  {/assistant}"
        parse("{user}\nhi\n{/assistant}", first_line=2, indent="  ")
    assert str(e.value).startswith("line 4, col 3: {/assistant} does not match {user} opened at line 2, col 3")
    t = parse("Hi {who}\nand {1 / zero}", first_line=2, indent="  ")  # typed "  Hi {who}", "  and {1 / zero}"
    with pytest.raises(TemplateRuntimeError) as e:
        t.bind({})
    assert (e.value.line, e.value.col) == (2, 7)
    with pytest.raises(TemplateRuntimeError) as e:
        record(t.program().func, **t.bind({"who": "x", "zero": 0}))
    assert (e.value.line, e.value.col) == (3, 8)
    with pytest.raises(TemplateSyntaxError) as e:  # typed "\tif False:", "\t    yield 1": yield is the 6th
        parse_python("s += 'Hi'\nif False:\n    yield 1", first_line=2, indent="\t")
    assert (e.value.line, e.value.col) == (4, 6)


@pytest.mark.parametrize(
    "cell, kernel, col, words",
    [
        ("{gen x regex=pat}", {"pat": "[a-"}, 14, 'regex "[a-" cannot be compiled: it is not a valid regular '
                                                   "expression (unterminated character set at position 0); fix the pattern"),
        ("{gen x stop_regex=pat}", {"pat": 5}, 19, "stop_regex=5 is invalid: must be a regular expression (a string)"),
        ("{gen x json_schema=S}", {"S": {"type": "objectx"}}, 20, "not a valid JSON Schema"),
        ("{select x choices=labels}", {"labels": "ab"}, 19, "choices must be a non-empty list of strings, not a str ('ab'); list the choices, e.g. ['yes', 'no']"),
        ("{select x choices=labels}", {"labels": ["a", ""]}, 19, "choices must be non-empty strings: choice 2 of 2 is ''"),
        ("{select x choices=labels}", {"labels": ["a", "a"]}, 19, "choices must differ; 'a' is listed more than once"),
        ("{fork doc in docs}{doc}{join}", {"docs": []}, 14, "docs has no items"),
        ("{fork doc in docs}{doc}{join}", {"docs": 5}, 14, "docs is not iterable (got int)"),
        ("{fork n}x{join}", {"n": 0}, 7, "fork count must be an integer >= 1, got 0"),
        # {fork {n}} forks over the set {n}: the message said "got {2}", which reads as the hole itself
        ("{fork {n}}x{join}", {"n": 2}, 7, "fork count must be an integer >= 1, got {2}: a set, as braces inside a "
                                           "hole make one; write the count without them ({fork n}, not {fork {n}})"),
        ("{fork {k}}x{join}", {"k": 2}, 7, "write the count without them ({fork k}, not {fork {k}})"),
        # an expression of the fork that fails is named as written there: "{{n}} failed" and "{items + 1}
        # failed" read as the literal-brace escape and a hole the cell does not have
        ("{fork {n}}x{join}", {"n": [2]}, 7, "{fork {n}} failed: TypeError: unhashable type: 'list' (the braces "
                                             "inside the hole make a set of n; write n without them)"),
        ("{fork p in items + 1}x{join}", {"items": [1]}, 12, '{fork ... in items + 1} failed: TypeError: can only '
                                                             'concatenate list (not "int") to list'),
        # (a set the variable holds: the braces are where s was set; the fix said {fork n}, not the user's s)
        ("{fork s}x{join}", {"s": {2}}, 7, "got {2}: a set; {fork s} takes the count itself: make s an integer "
                                           "(2, not {2})"),
        ("{fork s}x{join}", {"s": {2, 3}}, 7, "got {2, 3}: a set; {fork s} takes the count itself: make s an integer"),
        # (the one item is the example only where it is a count: it said "make s an integer ('a', not {'a'})")
        ("{fork s}x{join}", {"s": {"a"}}, 7, "got {'a'}: a set; {fork s} takes the count itself: make s an integer\n"),
        ("{fork s}x{join}", {"s": {0}}, 7, "got {0}: a set; {fork s} takes the count itself: make s an integer\n"),
        # the engine refused it only once the gen was sent, away from the hole
        ("{gen x seed=my_seed}", {"my_seed": "42"}, 13, "seed='42' is invalid: must be an integer"),
        # refused by lmnb's gen itself (the message names the option): at that option, not the hole
        ("{gen x max_tokens=8 stop=st}", {"st": 5}, 26, "stop=5 is invalid: give a string or a list of strings"),
        ("{gen x stop_token_ids=ids}", {"ids": [-1]}, 23, "stop_token_ids=[-1] is invalid"),
        # taken by gen() (ranges were the backend's), refused by the engine once the gen was sent
        ("{gen x temperature=t}", {"t": -1}, 20, "temperature must be a finite number >= 0 (0 is greedy), got -1"),
        # a dict's keys were taken as the choices without a word, where {fork x in d} refuses a dict
        ("{select x choices=labels}", {"labels": {"y": 1}}, 19, "choices is a dict, whose keys or values may be "
                                                                 "meant; pass list(labels) for its keys or "
                                                                 "list(labels.values()) for its values"),
    ],
)
def test_a_bad_value_from_a_kernel_variable_points_at_its_hole(cell, kernel, col, words):
    # A literal gets these checks at parse time; the same value from a variable was refused by
    # lmnb with no position ("the body of program 'cell' failed"), or by the engine later.
    t = parse(cell, first_line=2)
    with pytest.raises(TemplateRuntimeError) as e:
        record(t.program().func, **t.bind(kernel))
    assert (e.value.line, e.value.col) == (2, col), str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("labels", [np.array(["owl", "cat"]), {"owl", "cat"}, ("cat", "owl")])
def test_numpy_and_other_values_lmnb_takes_are_taken_by_the_kernel_too(labels):
    """A fork count and choices made with numpy (np.int64 from a sum, df.label.unique()), or choices
    in a set, were refused by the kernel ("fork count must be an integer >= 1, got np.int64(2)",
    "choices must be a non-empty list of strings"), where s.fork(n) and lmnb.select take them and
    the exported program ran. Both faces now make the calls of the program written with the Python
    values (a set's choices sorted, as lmnb.select sorts them)."""
    @lmnb.function
    def ref(s):
        forks = s.fork(2)
        for f in forks:
            f += lmnb.select("pick", choices=sorted(["owl", "cat"]) if isinstance(labels, set) else list(labels))
        forks.join()

    one, two = faces("{fork n}{select pick choices=labels}{join}", n=np.int64(2), labels=labels)
    assert one == two == record(ref.func)


@pytest.mark.parametrize("cell", ['{select pick choices={"owl", "cat"}}', '{gen pick choices={"owl", "cat"}}'])
def test_a_literal_set_of_choices_is_taken_sorted_as_one_in_a_variable(cell):
    """A literal set was refused at parse time ("choices must be a non-empty list of strings"), where
    the same set in a variable, and in lmnb.select, is taken in sorted order."""
    @lmnb.function
    def ref(s):
        s += lmnb.select("pick", choices=["cat", "owl"])  # sorted by hand

    one, two = faces(cell)
    assert one == two == record(ref.func)


@pytest.mark.parametrize("cell, kernel, options", [
    ("{gen x choices=None max_tokens=3 temperature=0.5 regex=r'a+'}", {}, {"max_tokens": 3, "temperature": 0.5,
                                                                          "regex": "a+"}),
    ("{gen x choices=c}", {"c": None}, {}),  # (from a variable: checked as the cell runs)
])
def test_a_gen_with_choices_none_is_a_gen_without_choices_as_in_python(cell, kernel, options):
    """gen(choices=None) is gen()'s default, no choices, so a gen that generates; the cell refused
    a literal choices=None at parse time ("choices must be a non-empty list of strings"), and the
    options a pick cannot use beside it, and a None held in a variable as the cell ran."""
    @lmnb.function
    def ref(s):
        s += lmnb.gen("x", **options)  # no choices: gen()'s own reading

    one, two = faces(cell, **kernel)
    assert one == two == record(ref.func)
    with pytest.raises(TemplateSyntaxError, match="choices must be a non-empty list of strings"):
        parse("{select x choices=None}")  # (select has no default choices: lmnb.select refuses None too)


def test_a_video_frame_count_in_a_numpy_integer_is_the_int_it_holds():
    """video() refused np.int64(3) frames ("num_frames must be a positive integer"), where gen() takes
    numpy integers, and took True as 1 frame."""
    one, two = faces("{video clip frames=k}", clip="walk.mp4", k=np.int64(3))
    assert one == two == [((), "add", ("video", "walk.mp4", 3))]
    assert type(lmnb.video("walk.mp4", np.int64(3)).num_frames) is int
    with pytest.raises(ValueError, match=r"^video\(\) num_frames must be a positive integer, got True$"):
        lmnb.video("walk.mp4", True)


@pytest.mark.parametrize("cell, col, error, hint", [
    ("{image cat.png}", 8, "name 'cat' is not defined",
     'a file path goes in quotes: {image "cat.png"}; or define cat in a Python cell first'),
    ("{user}{image photos/cat.JPG}{/user}", 14, "name 'photos' is not defined",
     'a file path goes in quotes: {image "photos/cat.JPG"}; or define photos in a Python cell first'),
    ("{fork i in xs}{video walk.gif frames=2}{join}", 22, "name 'walk' is not defined",
     'a file path goes in quotes: {video "walk.gif" frames=2}; or define walk in a Python cell first'),
    ("{image /tmp/cat.png}", 8, "invalid Python expression: invalid syntax", 'a file path goes in quotes: {image "/tmp/cat.png"}'),
    ("{image ~/cat.png}", 9, "invalid Python expression: invalid syntax", 'a file path goes in quotes: {image "~/cat.png"}'),
    # (the hint of a path Python cannot parse gives the frames as written, as the hint above does)
    ("{video /tmp/walk.mp4 frames=k + 1, }", 8, "invalid Python expression: invalid syntax",
     'a file path goes in quotes: {video "/tmp/walk.mp4" frames=k + 1}'),
    ("{image photo.image}", 8, "name 'photo' is not defined", "define photo in a Python cell first"),  # an attribute
])
def test_an_image_path_written_without_quotes_is_told_to_quote_it(cell, col, error, hint):
    """{image cat.png} said "name 'cat' is not defined; define cat in a Python cell first", and
    {image /tmp/cat.png} "invalid Python expression": the hint now says to put the path in quotes."""
    with pytest.raises((TemplateSyntaxError, TemplateRuntimeError)) as e:
        parse(cell, first_line=2).bind({"xs": [1]})
    assert ((e.value.line, e.value.col), e.value.message, e.value.hint) == ((2, col), error, hint)



CURLY = "Python's strings take straight quotes (\" and '), not curly ones (“ ” ‘ ’)"


@pytest.mark.parametrize("cell, col, char, hint", [
    ("Q {gen x stop=“\\n”}", 15, "“' (U+201C)", CURLY + ': {gen x stop="\\n"}'),
    # every curly-quoted string of the hole is fixed; a straight-quoted one keeps its curly text
    ('{gen x stop=“a” regex="[’]+" max_tokens=‘3’}', 13, "“' (U+201C)",
     CURLY + """: {gen x stop="a" regex="[’]+" max_tokens='3'}"""),
    ("{select x choices=[‘yes’, ‘no’]}", 20, "‘' (U+2018)", CURLY + ": {select x choices=['yes', 'no']}"),
    ("{“it’s”}", 2, "“' (U+201C)", CURLY + ': {"it’s"}'),  # (not the hint to double literal braces)
    ("{image “cat.png”}", 8, "“' (U+201C)", CURLY + ': {image "cat.png"}'),
    ('{fork t in [“say "hi"”]}{join}', 13, "“' (U+201C)", CURLY + ': {fork t in ["say \\"hi\\""]}'),
    ("{‘it’s’}", 2, "‘' (U+2018)", CURLY),  # straight, it is still no Python: no hole offered
    # what a curly-quoted string holds is not the cell's syntax (it was "gen has no option 'x'")
    ("{gen x stop=“Answer: x=1”}", 13, "“' (U+201C)", CURLY + ': {gen x stop="Answer: x=1"}'),
    ("{“x!r”}", 2, "“' (U+201C)", CURLY + ': {"x!r"}'),
    # a brace inside one is the string's, not the hole's end or start (it was "single '}' outside a
    # hole", "'{' opens a hole that is never closed", "'}' does not match '['")
    ("{gen x stop=“}”}", 13, "“' (U+201C)", CURLY + ': {gen x stop="}"}'),
    ("{gen x stop=‘}’ max_tokens=2}", 13, "‘' (U+2018)", CURLY + ": {gen x stop='}' max_tokens=2}"),
    ("{gen x stop=“{”}", 13, "“' (U+201C)", CURLY + ': {gen x stop="{"}'),
    ("{select x choices=[“a}”, “{b”]}", 20, "“' (U+201C)", CURLY + ': {select x choices=["a}", "{b"]}'),
    ('{gen x stop=“a\\”}”}', 13, "“' (U+201C)", CURLY + ': {gen x stop="a\\”}"}'),  # (an escaped quote: the string's)
])
def test_curly_quotes_in_a_hole_get_the_hole_with_straight_quotes(cell, col, char, hint):
    """A string pasted with curly quotes ({gen x stop=“\\n”}) got Python's "invalid character '“'
    (U+201C)" and no hint, where other slips get the hole written right."""
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell, first_line=2)
    assert ((e.value.line, e.value.col), e.value.message, e.value.hint) == (
        (2, col), f"invalid Python expression: invalid character '{char}", hint)


@pytest.mark.parametrize("cell, col", [("{gen x stop=“a", 13), ("{gen x stop=“a\nb", 13), ("{f(‘a’, ‘b", 9)])
def test_a_curly_quote_left_open_in_an_open_hole_is_an_unterminated_string(cell, col):
    """{gen x stop=“a was "'{' opens a hole that is never closed" (the kernel's is_complete:
    "incomplete") where {gen x stop="a is an unterminated string: now that, with the curly-quote
    hint."""
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell, first_line=2)
    assert not isinstance(e.value, UnclosedError)
    assert ((e.value.line, e.value.col), e.value.message, e.value.hint) == (
        (2, col), "unterminated string literal in hole", CURLY)


def test_curly_quotes_in_a_python_cell_get_the_line_with_straight_quotes():
    """The same in a --python body: its line is offered with straight quotes (comments and straight
    strings as they stand); where straight quotes leave it no Python, the words alone."""
    body = "s += 'Q: it’s'  # “x”\n\ns += lmnb.gen(“x”, stop=“\\n”)"
    with pytest.raises(TemplateSyntaxError) as e:
        parse_python(body, first_line=2)
    assert ((e.value.line, e.value.col), e.value.message, e.value.hint) == (
        (4, 15), "invalid Python: invalid character '“' (U+201C)", CURLY + ': s += lmnb.gen("x", stop="\\n")')
    with pytest.raises(TemplateSyntaxError) as e:
        parse_python("x = ‘it’s’", first_line=2)
    assert e.value.hint == CURLY


@pytest.mark.parametrize("cell, defined, col, undefined, quoted", [
    ("{image photos/cat.png}", "photos", 15, "cat", '{image "photos/cat.png"}'),
    ("{video clips/walk.mp4 frames=2}", "clips", 14, "walk", '{video "clips/walk.mp4" frames=2}'),
])
def test_a_quoted_path_is_hinted_where_the_undefined_name_is_inside_the_path(cell, defined, col, undefined, quoted):
    """{image photos/cat.png} in a notebook that has a variable photos failed at cat, a name after
    the path's first: the hint to quote the path was given only where the undefined name opened it."""
    with pytest.raises(TemplateRuntimeError) as e:
        parse(cell).bind({defined: 1})
    assert ((e.value.line, e.value.col), e.value.message, e.value.hint) == (
        (1, col), f"name {undefined!r} is not defined",
        f"a file path goes in quotes: {quoted}; or define {undefined} in a Python cell first")

def test_a_fork_count_over_the_limit_from_a_variable_is_refused_by_the_kernel_and_the_export_alike():
    """{fork N} had no bound: a typo ({fork n} with n = 100000) forked that many states, each
    with its own requests. The limit holds for a literal (at parse time) and for a count from a
    variable, in the kernel's run and in the exported program, with the same message."""
    why = ("fork count 257 is over the limit of 256 branches per {fork N} (a typo?); for more branches, fork in a "
           "%%lm --python cell (forks = s.fork(n)), or run one program per input with run_batch")
    t = parse("{fork n}x{join}")
    with pytest.raises(TemplateRuntimeError) as kernel:
        record(t.program().func, **t.bind({"n": 257}))
    ns = {"lmnb": lmnb}
    exec(t.to_python("cell"), ns)
    with pytest.raises(ValueError) as export:
        record(ns["cell"].func, **t.bind({"n": 257}))
    assert str(kernel.value).startswith("line 1, col 7: " + why + "\n") and str(export.value) == why
    assert faces("{fork n}x{join}", n=256)[0] == faces("{fork n}x{join}", n=256)[1]
    assert [e for e in faces("{fork n}x{join}", n=256)[0] if e[1] == "fork"] == [((), "fork", 256)]
    assert "s.fork(3)" in parse("{fork 3}x{join}").to_python()  # a literal was checked at parse time


@pytest.mark.parametrize(
    "value, why",
    [
        ("Arvel", "{fork ... in person}: person is a str ('Arvel'), which would fork one branch per character; "
                  "fork over a list of items, e.g. {fork ... in [person]}"),
        (b"Ar", "{fork ... in person}: person is a bytes (b'Ar'), which would fork one branch per byte; "
                "fork over a list of items, e.g. {fork ... in [person]}"),
        ({"Arvel": 1, "Bo": 2}, "{fork ... in person}: person is a dict, which would fork one branch per key; say "
                                "which you mean: person.keys(), person.values() or person.items(), or a list of "
                                "items, e.g. [person]"),
        (5, "{fork ... in person}: person is not iterable (got int); a fork makes one branch per item: fork over "
            "a list of items, e.g. [person]"),
        ([], "{fork ... in person}: person has no items; a fork needs at least one branch"),
        ({"Arvel", "Bo"}, "{fork ... in person}: person is a set, whose order (the branches' order, and the order "
                          "a join puts them in) can change from run to run (strings hash differently in each "
                          "process); fork over a list in the order you want, e.g. sorted(person)"),
        (frozenset({"Bo"}), "{fork ... in person}: person is a frozenset, whose order (the branches' order, and "
                            "the order a join puts them in) can change from run to run (strings hash differently in "
                            "each process); fork over a list in the order you want, e.g. sorted(person)"),
    ],
)
def test_fork_over_a_string_dict_set_or_non_iterable_is_refused_by_the_kernel_and_the_export_alike(value, why):
    """{fork q in person} with person = "Arvel" forked five branches, one per character, in the
    kernel and in the exported program; a dict forked one per key; a set forked in an order that
    changes with PYTHONHASHSEED. Both now refuse, at the hole in the kernel, with the same message."""
    t = parse("Hi {fork q in person}{q}{join}")
    with pytest.raises(TemplateRuntimeError) as kernel:
        record(t.program().func, **t.bind({"person": value}))
    ns = {"lmnb": lmnb}
    exec(t.to_python("cell"), ns)
    with pytest.raises((TypeError, ValueError)) as export:
        record(ns["cell"].func, **t.bind({"person": value}))
    assert str(kernel.value).startswith("line 1, col 15: " + why + "\n") and str(export.value) == why
    # what the user is told to write instead forks once, over the whole value, in both
    one, two = faces("Hi {fork q in [person]}{q!r}{join}", person=value)
    assert one == two and [e for e in one if e[1] == "fork"] == [((), "fork", 1)]


def test_fork_over_a_dicts_items_or_a_generator_still_forks_once_per_item():
    one, two = faces("{fork k, v in d.items()}{k}={v}{join}", d={"a": 1, "b": 2})
    assert one == two and [e for e in one if e[1] == "fork"] == [((), "fork", 2)]
    one, two = faces("{fork k in d.keys()}{k}{join}", d={"a": 1, "b": 2})  # a keys view is a Set, but ordered
    assert one == two and [e for e in one if e[1] == "fork"] == [((), "fork", 2)]
    one, two = faces("{fork k in sorted(names)}{k}{join}", names={"b", "a", "c"})
    assert one == two and [e for e in one if e[1] == "fork"] == [((), "fork", 3)]
    one, two = faces("{fork c in (c for c in word)}{c}{join}", word="ab")
    assert one == two and [e for e in one if e[1] == "fork"] == [((), "fork", 2)]


@pytest.mark.parametrize("source", ["opts", "cfg.opts"])
def test_an_iterator_every_fork_branch_reads_as_choices_is_refused_not_used_up_by_the_first(source):
    """The first branch's select read the generator to its end (lmnb.select takes any iterable
    as the list of its items) and the second was refused as having no choices, in both faces;
    each now refuses it at the first branch, naming the fix."""
    def cell_args():
        gen = (c for c in ["yes", "no"])
        return {"opts": gen, "cfg": types.SimpleNamespace(opts=gen)}

    t = parse("{fork 2}{select v choices=" + source + "}{join}", first_line=1)
    why = (f"choices={source} is an iterator (generator), which the first branch of the fork would use up, leaving "
           f"the other branches no choices; make it a list before the cell ({source} = list({source}))")
    log = []
    with pytest.raises(TemplateRuntimeError) as kernel:
        t.program().func(Rec(log), **t.bind(cell_args()))
    assert str(kernel.value).startswith(f"line 1, col 27: {why}\n")
    assert [e for e in log if e[1] == "add"] == []  # (refused before the first branch's pick)
    ns = {"lmnb": lmnb}
    exec(t.to_python("cell"), ns)
    with pytest.raises(TypeError) as export:
        record(ns["cell"].func, **t.bind(cell_args()))
    assert str(export.value) == why


def test_choices_made_anew_in_each_fork_branch_or_bound_by_it_may_be_iterators():
    """A generator expression, a call, or the fork's own item gives each branch its own iterator:
    every branch picks among all its choices, in both faces, as the lists of a reference program."""
    picks = ("select", "v", ["yes", "no"], 0.0, "TokenLengthNormalized")
    for cell, make_args in [
            ("{fork 2}{select v choices=(c for c in opts)}{join}", lambda: {"opts": ["yes", "no"]}),
            ("{fork 2}{select v choices=gen(opts)}{join}", lambda: {"opts": ["yes", "no"], "gen": lambda xs: iter(xs)}),
            ("{fork g in gens}{select v choices=g}{join}",
             lambda: {"gens": [iter(["yes", "no"]), iter(["yes", "no"])]})]:
        t = parse(cell)
        one = record(t.program().func, **t.bind(make_args()))
        ns = {"lmnb": lmnb}
        exec(t.to_python("cell"), ns)
        two = record(ns["cell"].func, **t.bind(make_args()))  # (new iterators: the first face used its own up)
        assert one == two
        assert [e[2] for e in one if e[1] == "add"] == [picks, picks], cell


def test_forks_nest_as_deep_as_the_exported_loops_can():
    # 21 nested forks exported as 21 nested for loops: "too many statically nested blocks"
    deepest = parse("{fork 1}" * 20 + "x" + "{join}" * 20)
    compile(deepest.to_python(), "<export>", "exec")
    with pytest.raises(TemplateSyntaxError) as e:
        parse("{fork 1}" * 21 + "x" + "{join}" * 21, first_line=2)
    assert (e.value.line, e.value.col) == (2, 161) and "forks nest at most 20 deep" in str(e.value)


def test_an_expression_too_deep_for_pythons_parser_is_a_syntax_error_at_its_hole():
    # ast.parse raised MemoryError or RecursionError, not SyntaxError, out of parse
    for deep in ("-" * 100_000 + "1", "x" + ".a" * 5_000):
        with pytest.raises(TemplateSyntaxError) as e:
            parse("ab\n  {gen x max_tokens=" + deep + "}", first_line=2)
        assert (e.value.line, e.value.col) == (3, 21) and "too deeply for Python's parser" in str(e.value)
        with pytest.raises(TemplateSyntaxError) as e:
            parse_python("s += " + deep, first_line=2)
        assert (e.value.line, e.value.col) == (2, 1) and "too deeply for Python's parser" in str(e.value)


def test_python_mode_body_of_only_comments_is_an_empty_program():
    # compiling it failed with "ValueError: AST node line range (2, 1) is not valid", and the export
    # was a def holding only the comment (IndentationError)
    cell = parse_python("# to do: ask the model\n", first_line=2)
    assert record(cell.program({}).func) == []
    assert cell.to_python("p") == "@lmnb.function\ndef p(s):\n    # to do: ask the model\n    pass\n"
    compile(cell.to_python("p"), "<export>", "exec")


def test_python_mode_refuses_a_lone_surrogate_at_it():
    with pytest.raises(TemplateSyntaxError) as e:  # ast.parse raised UnicodeEncodeError: a traceback
        parse_python("s += 'a'\ns += '\ud800'", first_line=2)
    assert (e.value.line, e.value.col) == (3, 7) and e.value.message.startswith("the lone surrogate '\\ud800'")


def test_python_mode_syntax_error_position():
    with pytest.raises(TemplateSyntaxError) as e:
        parse_python("s += 'a'\ns += (", first_line=2)
    assert e.value.line == 3


def test_python_mode_refuses_a_body_that_yields_but_not_a_function_defined_in_it():
    with pytest.raises(TemplateSyntaxError) as e:  # it would silently run nothing (a generator function)
        parse_python("s += 'Hi'\nif False:\n    yield 1", first_line=2)
    assert (e.value.line, e.value.col) == (4, 5) and "cannot use yield" in str(e.value)
    parse_python("def pieces():\n    yield 'a'\ns += ''.join(pieces())", first_line=2)
    with pytest.raises(TemplateSyntaxError) as e:  # a lone \r ends a line, for ast and for the caret
        parse_python("x = 'é'\ry = 'ü'; yield 1", first_line=2)
    assert (e.value.line, e.value.col) == (3, 10)


@pytest.mark.parametrize(
    "body, line, col, words",
    [
        # valid at a module's top level, so ast.parse took them; compiled as the program's function
        # they failed later, as a traceback through the magic
        ("s += 'a'\nawait something", 3, 1, "'await' outside async function"),
        ("s += 'a'\nif s:\n    nonlocal q", 4, 5, "no binding for nonlocal 'q' found"),
        # s = ... silently cut the program off from its state: the cell ran and showed nothing
        ("s = 'You are helpful.'\ns += lmnb.gen('x')", 2, 1, "s is the program's state; binding it (s = ..."),
        ("x = 1\nif x:\n    s: str = 'a'", 4, 5, "s is the program's state"),
        # only s = ... and s: T = ... were caught; these cut the program off from its state as silently
        ("s += 'a'\nfor s in ['b']:\n    pass\ns += lmnb.gen('x')", 3, 5, "s is the program's state"),
        ("s, t = 'a', 'b'", 2, 1, "s is the program's state"),
        ("s += 'a'\nwith open('f') as s:\n    pass", 3, 19, "s is the program's state"),
        ("import s", 2, 8, "s is the program's state"),
        ("s += (s := 'a')", 2, 7, "s is the program's state"),
        # a comprehension has its own scope, but := in it (or a default value, a decorator, a base
        # class) binds the enclosing function's name: these rebound the state unnoticed
        ("s += 'a'\nx = [(s := 1) for _ in range(1)]", 3, 7, "s is the program's state"),
        ("x = [[(s := 1) for _ in y] for y in [[1]]]", 2, 8, "s is the program's state"),
        ("def f(a=(s := 1)):\n    pass", 2, 10, "s is the program's state"),
        ("f = lambda a=(s := 1): a", 2, 15, "s is the program's state"),
        ("class C((s := object)):\n    pass", 2, 10, "s is the program's state"),
        # a helper declaring nonlocal s (directly, or below a function that does not bind s, or in
        # a method) rebinds the state too
        ("def f():\n    nonlocal s\n    s = 'x'\nf()", 4, 5, "s is the program's state"),
        ("def f():\n    def g():\n        nonlocal s\n        s = 1\n    g()", 5, 9, "s is the program's state"),
        ("class C:\n    s = 1\n    def m(self):\n        nonlocal s\n        s = 2", 6, 9,
         "s is the program's state"),
    ],
)
def test_python_mode_refuses_what_a_function_body_cannot_run(body, line, col, words):
    with pytest.raises(TemplateSyntaxError) as e:
        parse_python(body, first_line=2)
    assert (e.value.line, e.value.col) == (line, col), str(e.value)
    assert words in str(e.value)
    parse_python("def helper(s):\n    s = s.strip()\n    return s\ns += helper(' a ')", first_line=2)  # its own s
    parse_python("s += ''.join(s for s in 'ab')\ns.x = 1\ns[0] += 'a'", first_line=2)  # neither rebinds the state
    parse_python("fs = [lambda: (s := 1) for _ in 'ab']", first_line=2)  # the lambda's own s
    parse_python("def add(t):\n    nonlocal s\n    s += t\nadd('x')", first_line=2)  # adds to the state
    parse_python("def f():\n    s = 1\n    def g():\n        nonlocal s\n        s = 2", first_line=2)  # f's s
    parse_python("class C:\n    s = 1", first_line=2)  # an attribute of C


@pytest.mark.parametrize("body, line, col, message, fix", [
    ('s += "Q:"\ns += lmnb.gen("my answer", max_tokens=3)', 3, 15, "lmnb.gen('my answer') names the kernel variable its "
     "result goes in, but 'my answer' is no Python name, so no code could read the variable; name it 'my_answer'",
     "lmnb.gen('my_answer', ...)"),
    ('s += "Q:"\ns += gen(name="1st pick", max_tokens=3)', 3, 15, "'1st pick' is no Python name", "gen('_1st_pick', ...)"),
    ('s += "Q:"\ns += select("class", choices=["a"])', 3, 13, "'class' is reserved in Python", "select('class_', ...)"),
    # Python reads the name ﬁle as file (NFKC): a variable ﬁle in the namespace is one no code reads
    ('s += "Q:"\nif True:\n    s += lmnb.gen_int("ﬁle")', 4, 23, "Python reads the name 'ﬁle' as 'file'",
     "lmnb.gen_int('file', ...)"),
    ('with s.var_scope("the text"):\n    s += "x"', 2, 18, "'the text' is no Python name", "s.var_scope('the_text')"),
])
def test_a_python_cells_literal_result_name_that_no_variable_can_have_is_refused_at_it(body, line, col, message, fix):
    """gen("my answer") in a --python body put a kernel variable named 'my answer' in the
    namespace without a word, which no code can read (a {gen my answer} hole is refused); it is
    refused at the name now, before anything runs, with a Python name to give it."""
    with pytest.raises(TemplateSyntaxError) as e:
        parse_python(body, first_line=2)
    assert (e.value.line, e.value.col) == (line, col), str(e.value)
    assert message in e.value.message and e.value.hint.endswith(f'(s += "..."): {fix}')


def test_a_python_cells_captures_are_the_names_its_body_writes_as_string_literals():
    # what the kernel checks before the cell runs (gen("lmnb") replaced the lmnb module)
    cell = parse_python('s += lmnb.select(name="b", choices=["x"])\nwith s.var_scope("v"):\n    s += gen("a")\n'
                        's += lmnb.gen(f"c{1}") + lmnb.gen("a")\ndef ask(t):\n    return lmnb.gen("own")', first_line=2)
    assert cell.captures == ("b", "v", "a")


def test_a_python_cells_result_names_that_are_taken_or_known_only_as_it_runs_are_not_refused():
    for body in ['s += lmnb.gen("my_answer")', 's += lmnb.gen(f"my {x}")', 's += lmnb.gen("")',  # (gen's own refusal)
                 'def ask(t):\n    return lmnb.gen("a b")\nprog = lmnb.function(lambda t: t + lmnb.gen("c d"))',
                 'x = {"my answer": 1}["my answer"]', 's += lmnb.gen(None)']:
        parse_python(body, first_line=2)


def test_a_python_cells_call_of_another_objects_select_or_gen_is_no_result_name():
    # soup.select("div.item p") (BeautifulSoup), df.select("first name") (polars), db.select(...)
    # were refused as results no variable can hold, and their strings checked as the cell's
    # variables (df.select("o") beside --out o, "input" warned of as a builtin): a method of
    # another object is not lmnb's. lmnb's own, bare, of the module or of an alias the body
    # imports it as, still are
    for body in ['rows = soup.select("div.item p")\ns += rows[0].text', 'cols = df.select("first name")\ns += str(cols)',
                 'x = db.select("SELECT * FROM t")\ns += model.gen("class")', 's += str(df.select("o", "input"))']:
        assert parse_python(body, first_line=2).captures == (), body
    for body, name in [('import lmnb as sgl\ns += sgl.gen("my answer")', "my answer"),
                       ('s += lmnb.select("class", choices=["a"])', "class"), ('s += gen("a b")', "a b")]:
        with pytest.raises(TemplateSyntaxError, match=f"\\({name!r}\\) names the kernel variable"):
            parse_python(body, first_line=2)
    assert parse_python('import lmnb as sgl\ns += sgl.gen("a") + lmnb.gen("b") + x.gen("c")').captures == ("a", "b")


def test_a_python_cells_fork_branch_result_name_is_not_refused_before_the_cell_runs():
    # b += lmnb.gen("idea text") of a fork's branch b is a kernel variable only once the branches are
    # joined (then the kernel keeps a name no variable can have in the state, said on stderr); the
    # body reading b["idea text"] of each branch was refused as naming a kernel variable
    body = ('f = s.fork(3)\nfor b in f:\n    b += "Idea:" + lmnb.gen("idea text", max_tokens=20)\n'
            's += "\\n".join(b["idea text"] for b in f)\nwith f[0].var_scope("the text"):\n    f[0] += "x"')
    assert parse_python(body, first_line=2).captures == ("idea text", "the text")
    for body in ['f = s.fork(2)\ns += lmnb.gen("a b")', 'x = lmnb.gen("a b")\ns += x', 'with s.var_scope("a b"):\n    s += "x"']:
        with pytest.raises(TemplateSyntaxError, match="'a b' is no Python name"):
            parse_python(body, first_line=2)


def test_constant_prefix_is_visible_to_the_batch_tracer():
    # run_batch prefills the text every item starts with; both faces must let the tracer see it.
    from lmnb.tracer import extract_prefix

    t = parse("Answer briefly.\nQ: Where does {person} live?\nA:{gen city}")
    template = lmnb.get_chat_template("default")
    ns = {"lmnb": lmnb}
    exec(t.to_python("p"), ns)
    assert extract_prefix(t.program(), template) == "Answer briefly.\nQ: Where does "
    assert extract_prefix(ns["p"], template) == "Answer briefly.\nQ: Where does "


def test_a_boolean_json_schema_literal_is_checked_as_json_schema_reads_it():
    """``true`` (any value) was refused as "must be a JSON object"; ``false`` (no value) is refused
    before anything runs, in the engine's words."""
    for source in ("{gen c json_schema=True}", "{gen c json_schema='true'}"):
        assert 's += lmnb.gen("c", json_schema=' in parse(source).to_python()
    assert lmnb.gen("c", json_schema=True).params.json_schema is True
    with pytest.raises(TemplateSyntaxError, match="JSON schema false accepts no value"):
        parse("{gen c json_schema='false'}")


def test_top_logprobs_num_above_the_engines_bound_is_left_to_the_backend_as_gen_leaves_it():
    """{gen ... top_logprobs_num=25} was refused when the cell was parsed, with the engine's bound
    (20), whatever the backend (an SGLang server sets none), where gen(top_logprobs_num=25) is
    sent on: the cell now parses, and the engine refuses it with its own message when it runs."""
    from helpers_lang import RecordingEngine

    from lmnb.executor import ProgramError

    t = parse("Q: {gen x max_tokens=2 return_logprob=True top_logprobs_num=25}")
    engine = RecordingEngine()
    state = t.program().run(backend=lmnb.Engine(engine=engine))
    with pytest.raises(ProgramError, match=r"Gen\('x'\) failed: ValueError: top_logprobs_num=25 is invalid: must be "
                                           r"an integer from 0 to 20 \(top alternatives per token\)$"):
        state.sync()
    assert engine.received == []
    # what no backend takes is still refused at the option, with gen()'s message
    with pytest.raises(TemplateSyntaxError, match="top_logprobs_num=-1 is invalid: give a count of top alternatives "
                                                  "per token, an integer >= 0") as e:
        parse("Q: {gen x top_logprobs_num=-1}")
    assert e.value.col == 28


@pytest.mark.parametrize("before, padding", [
    ("a\tb\t", " \t \t"),  # tabs are kept: the terminal expands both lines alike
    ("日本語 ", "       "),  # each wide character is two columns: 3 * 2 + 1
    ("🙂x", "   "),  # an emoji is wide too
    ("e\u0301 ", "  "),  # a combining accent takes no column
    ("กิน ", "   "),  # nor a Thai vowel sign (a nonspacing mark of combining class 0)
    ("हिंदी ", "     "),  # Devanagari: the vowel signs ि and ी take a column each, the ं none
    ("❤\ufe0f ", "   "),  # the emoji variation selector shows the one-column ❤ two columns wide
    ("🙂\ufe0f ", "   "),  # and leaves a wide one two
    # (each of these took a column per character, or two per emoji: the caret stood right of its column)
    ("👩\u200d💻 ", "   "),  # an emoji sequence joined by ZWJ shows as one emoji, two columns
    ("👍🏽 ", "   "),  # and so does an emoji with a skin tone modifier
    ("a\u200bb ", "   "),  # a zero-width space (pasted from a web page) takes none
    ("\u1112\u1161 ", "   "),  # nor a Hangul vowel joined to its consonant (NFD 하: two columns)
])
def test_the_caret_is_under_the_column_on_a_line_with_tabs_or_wide_characters(before, padding):
    """The caret was padded with one space per character: on a line with tabs or CJK / emoji text
    it stood left of the column (the column number itself was right)."""
    with pytest.raises(TemplateSyntaxError) as e:
        parse(before + "{gen a max_token=3}")
    assert e.value.col == len(before) + 8
    assert str(e.value).split("\n")[1:3] == ["    " + before + "{gen a max_token=3}", "    " + padding + "       ^"]


@pytest.mark.parametrize("items, why", [
    # the expression as written in the fork ("{{items}} failed" read as the literal-brace escape)
    (["a", "b"], "{fork ... in {items}} failed: TypeError: unhashable type: 'list' (the braces inside the hole make "
                 "a set of items; write items without them)"),
    (("a", "b"), "{fork ... in {items}}: {items} is a set, as braces inside a hole make one; write the items without "
                 "them ({fork ... in items}, not {fork ... in {items}})"),
])
def test_fork_items_in_braces_inside_the_hole_say_the_braces_made_a_set(items, why):
    """{fork x in {items}} (a hole in a hole, as {fork {n}} for a count) made a Python set of items:
    a list was 'unhashable type' with no word of the braces, and a tuple was told to fork over
    sorted({items}), one branch holding the whole tuple."""
    t = parse("{fork x in {items}}{x}{join}", first_line=1)
    with pytest.raises(TemplateRuntimeError) as e:
        record(t.program().func, **t.bind({"items": items}))
    assert str(e.value).startswith(f"line 1, col 12: {why}\n")


@pytest.mark.parametrize("bad", ["bogus", 0, ""])
def test_a_choices_method_that_is_no_method_is_refused_with_or_without_choices(bad):
    """gen(choices_method="bogus") without choices was taken without a word (SGLang's gen drops the
    method there), where a %%lm cell refused the literal and gen(choices=..., choices_method="bogus")
    is refused: it is a wrong value wherever it stands, so gen() refuses it too, in the words of
    select() and the cell; from a variable the cell refuses it as it runs, at the option."""
    from lmnb.choices import choices_method_problem

    words = choices_method_problem(bad)  # select()'s own check, asked alone
    assert words.startswith("choices_method must be one of ")
    with pytest.raises(TypeError) as python:
        lmnb.gen("x", choices_method=bad)
    assert str(python.value) == words
    with pytest.raises(TemplateSyntaxError) as e:
        parse(f"{{gen x choices_method={bad!r}}}")
    assert e.value.message == words
    cell = "{gen x max_tokens=2 choices_method=m}"
    with pytest.raises(TemplateRuntimeError) as e:
        faces(cell, m=bad)
    assert (e.value.message, e.value.offset) == (f"gen: {words}", cell.index("=m") + 1)
    # a method without choices is still taken, as SGLang takes it: the gen generates as without it

    @lmnb.function
    def ref(s):
        s += lmnb.gen("x", max_tokens=2)

    one, two = faces(cell, m=lmnb.greedy_token_selection)
    assert one == two == record(ref.func)


@pytest.mark.parametrize("key, bad", [
    ("max_tokens", "8"), ("max_tokens", 2.5), ("min_tokens", True), ("n", 1.0), ("stop", 5), ("stop", [5]),
    ("stop_token_ids", 3), ("stop_token_ids", ["a"]), ("temperature", "a"), ("temperature", True), ("top_p", "a"),
    ("top_k", 2.5), ("min_p", "a"), ("frequency_penalty", "a"), ("presence_penalty", None), ("ignore_eos", "yes"),
    ("ignore_eos", 1), ("seed", 2.5), ("seed", "a"), ("return_logprob", 1), ("logprob_start_len", "a"),
    ("top_logprobs_num", 2.5), ("return_text_in_logprobs", "x"), ("max_tokens", -1), ("seed", 2**64),
    ("logit_bias", [3]), ("logit_bias", {"a": 1}), ("logit_bias", {5: 200}),
])
def test_a_literal_option_is_refused_in_the_words_gen_refuses_it_with(key, bad):
    """The cell worded a value of the wrong type its own way ("max_tokens must be an integer >= 0,
    got '8'", "ignore_eos='yes' is invalid: must be true or false", the engine's JSON words), where
    gen() says "max_tokens='8' is invalid: must be an integer" and "must be True or False"; the cell
    now asks gen()'s own check of the option alone. (None, the default, is taken by both.)"""
    cell = f"{{gen x {key}={bad!r}}}"
    if bad is None:
        assert parse(cell).arguments == () and lmnb.gen("x", **{key: bad}).params == lmnb.gen("x").params
        return
    with pytest.raises((TypeError, ValueError)) as python:
        lmnb.gen("x", **{key: bad})
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell)
    assert (e.value.message, e.value.offset) == (str(python.value), cell.index("=") + 1)
    # from a variable, the same words at the same column, as the cell runs
    with pytest.raises(TemplateRuntimeError) as e:
        faces(f"{{gen x {key}=v}}", v=bad)
    assert e.value.message in (str(python.value), f"gen: {python.value}")


@pytest.mark.parametrize("bad", ["(", ["a", "("], "a*", ["a"] * 33, 5, "$a"])
def test_a_bad_stop_regex_is_refused_in_gen_s_words_by_the_cell(bad):
    """{gen x stop_regex="("} said 'stop_regex "(" is not a valid regular expression ...' where
    gen(stop_regex="(") says 'gen(stop_regex="(") is invalid: "(" is not ...' (run()'s stop_regex
    was named gen's too): both now say 'stop_regex="(" is invalid: ...', the cell at the option's
    column, literal or from a variable."""
    with pytest.raises(ValueError) as python:
        lmnb.gen("x", stop_regex=bad)
    words = str(python.value)
    assert words.startswith("stop_regex=" if len(str(bad)) < 80 else "stop_regex is invalid: 33 patterns")
    cell = f"{{gen x stop_regex={bad!r}}}"
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell)
    assert (e.value.message, e.value.offset) == (words, cell.index("=") + 1)
    with pytest.raises(TemplateRuntimeError) as e:
        faces("{gen x stop_regex=p}", p=bad)
    assert (e.value.message, e.value.offset) == (words, len("{gen x stop_regex="))
    with pytest.raises(ValueError) as run:  # run()'s, which is no gen's
        lmnb.function(lambda s: None).run(stop_regex=bad)
    assert str(run.value) == words


@pytest.mark.parametrize("options, values", [
    ('regex="a" json_schema=S', {"S": "{}"}),
    ('regex=R json_schema="{}"', {"R": "a"}),
    ("regex=R json_schema=S", {"R": "a", "S": {"type": "string"}}),
    ("regex=R dtype=int", {"R": "[0-9]+"}),
])
def test_two_output_options_are_refused_in_one_wording_literal_or_from_variables(options, values):
    """{gen x regex=... json_schema=...} said "gen takes one of regex, json_schema: they each
    decide the output; keep one", and the same with json_schema from a kernel variable "gen: gen()
    got both regex and json_schema; set only one" (gen()'s words): gen(), the literal cell and the
    cell with variables now say one thing, the literal's at its second option as before."""
    pairs = [o.split("=", 1) for o in options.split()]
    with pytest.raises(ValueError) as python:
        lmnb.gen("x", **{k: values[v] if v in values else eval(v) for k, v in pairs})
    assert str(python.value) == (f"gen() takes one of {pairs[0][0]}, {pairs[1][0]}: they each decide the output; "
                                 "keep one")
    with pytest.raises(TemplateSyntaxError) as e:  # all literals
        parse("{gen x " + " ".join(f"{k}={values[v]!r}" if v in values else f"{k}={v}" for k, v in pairs) + "}")
    assert e.value.message == str(python.value)
    cell = "{gen x " + options + "}"
    with pytest.raises(TemplateRuntimeError) as e:  # one or both from variables, as the cell runs
        faces(cell, **values)
    assert (e.value.message, e.value.offset) == (str(python.value), 0)


@pytest.mark.parametrize("choices, words", [
    ([], "choices must be a non-empty list of strings"),
    ("ab", "choices must be a non-empty list of strings, not a str ('ab'); list the choices, e.g. ['yes', 'no']"),  # (a string is no list of choices: said so, a new user's find)
    ("word " * 20, "choices must be a non-empty list of strings, not a str ('word word wo...rd word word '); list "
                   "the choices, e.g. ['yes', 'no']"),  # (reprlib's cut: 13 characters of the repr, ..., its last 14)
    (b"ab", "choices must be a non-empty list of strings, not a bytes (b'ab'); list the choices, e.g. ['yes', 'no']"),
    (["a", 1], "choices must be non-empty strings: choice 2 of 2 is 1"),
    (["a", "", "b"], "choices must be non-empty strings: choice 2 of 3 is ''"),
    (["a", "a"], "choices must differ; 'a' is listed more than once: drop the repeats"),
])
def test_choices_are_refused_in_one_wording_by_select_gen_and_the_cell(choices, words):
    """select() said "needs choices: a non-empty list of strings" and "choices must be non-empty
    strings; got [1]" where a %%lm cell said "choices must be a non-empty list of strings" for both
    (a choice of another type unnamed): one check, lmnb.choices.choices_problem, words them now,
    naming the bad choice by its place; select() and gen() put their own name before it."""
    with pytest.raises(ValueError) as e:
        lmnb.select("x", choices=choices)
    assert str(e.value) == f"select() {words}"
    with pytest.raises(ValueError) as e:
        lmnb.gen("x", choices=choices)
    assert str(e.value) == f"gen(..., choices=...) {words}"
    for cell in (f"{{select x choices={choices!r}}}", f"{{gen x choices={choices!r}}}"):
        with pytest.raises(TemplateSyntaxError) as e:
            parse(cell)
        assert (e.value.message, e.value.offset) == (words, cell.index("=") + 1)
    with pytest.raises(TemplateRuntimeError) as e:  # from a variable, as the cell runs
        faces("{select x choices=c}", c=choices)
    assert e.value.message == words


@pytest.mark.parametrize("schema", [5, [1], 2.5])
def test_a_literal_json_schema_of_another_type_is_refused_in_gens_words(schema):
    """The cell said "json_schema must be a JSON object or a boolean, got int" where gen() says
    "json_schema must be a JSON string, a dict, a bool or a pydantic model class, not int": the
    cell asks gen()'s own check now."""
    with pytest.raises(TypeError) as python:
        lmnb.gen("x", json_schema=schema)
    cell = f"{{gen x json_schema={schema!r}}}"
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell)
    assert (e.value.message, e.value.offset) == (str(python.value), cell.index("=") + 1)
    assert str(python.value) == ("json_schema must be a JSON string, a dict, a bool or a pydantic model class, not "
                                 f"{type(schema).__name__}")


# ------------------------------------------------------------------------------ lmnb's objects as a hole's value
@pytest.mark.parametrize("cell, kernel, col, shown, construct, source", [
    ('Q: {q}\nA: {lmnb.gen("a", max_tokens=3)}', {"lmnb": lmnb}, 4, "Gen('a')", "{gen a max_tokens=3}",
     'lmnb.gen("a", max_tokens=3)'),
    ('Q: {q}\nA: {gen("a", max_tokens=3)!r}', {"gen": lmnb.gen}, 4, "Gen('a')", "{gen a max_tokens=3}",
     'gen("a", max_tokens=3)'),  # (from lmnb import gen; a conversion makes it no more text)
    ('Q: {q}\n{user}A: {L.select("v", choices=["y", "n"])}{/user}', {"L": lmnb}, 10,
     "Select('v', choices=['y', 'n'])", '{select v choices=["y", "n"]}', 'L.select("v", choices=["y", "n"])'),
    ('Q: {q}\n{fork 2}{lmnb.user_begin()}{join}', {"lmnb": lmnb}, 9, "RoleBegin('user')", "{user}...{/user}",
     "lmnb.user_begin()"),
])
def test_a_hole_whose_value_is_an_lmnb_primitive_is_refused_with_the_construct(cell, kernel, col, shown, construct,
                                                                               source):
    """{lmnb.gen("a", max_tokens=3)} (SGLang's s += "A:" + sgl.gen("a") written into a hole) put the text
    "Gen('a')" into the prompt, and the cell finished with no gen and no variable a."""
    t = parse(cell, first_line=2)
    log = []
    with pytest.raises(TemplateRuntimeError) as e:
        t.program().func(Rec(log), **t.bind({"q": "hi", **kernel}))
    assert not any("Gen(" in str(entry) or "Select(" in str(entry) or "RoleBegin(" in str(entry) for entry in log)
    assert (e.value.line, e.value.col) == (cell.count("\n") + 2, col)
    assert e.value.message == (f"{{{source}}} is an lmnb primitive, {shown}, not text: a hole's value becomes prompt "
                               f"text (its repr), and the primitive would not run; did you mean {construct}?")
    assert e.value.hint == f"write {construct} in place of the hole, or add it in a %%lm --python cell: s += {source}"


def test_the_construct_offered_for_a_primitive_hole_makes_the_call_the_hole_wrote():
    @lmnb.function
    def reference(s):
        s += lmnb.gen("a", max_tokens=3, stop="\n")
        s += lmnb.select("v", choices=["y", "n"])

    offered = []
    for hole in ('{lmnb.gen("a", 3, stop="\\n")}', '{lmnb.select("v", choices=["y", "n"])}'):
        with pytest.raises(TemplateRuntimeError) as e:
            record(parse(hole).program().func, lmnb_=lmnb)
        offered.append(e.value.message.split("did you mean ")[1].rstrip("?"))
    assert offered == ['{gen a max_tokens=3 stop="\\n"}', '{select v choices=["y", "n"]}']
    assert record(parse("".join(offered)).program().func) == record(reference.func)


def test_a_primitive_held_in_a_variable_or_added_to_text_is_refused_without_a_construct():
    for cell, kernel, shown in [("{g}", {"g": lmnb.gen("a")}, "Gen('a')"),
                                ('{"A: " + gen("a")}', {"gen": lmnb.gen}, "ExprList([ConstantText('A: '), Gen('a')])"),
                                ('{image("cat.png"):>5}', {"image": lmnb.image}, "Image('cat.png')")]:
        t = parse(cell)
        with pytest.raises(TemplateRuntimeError) as e:
            record(t.program().func, **t.bind(kernel))
        source = cell[1:cell.rindex(":>5") if ":>5" in cell else -1]
        if cell.startswith("{image"):
            assert e.value.message.endswith("did you mean {image \"cat.png\"}?")
            continue
        assert e.value.message == (f"{{{source}}} is an lmnb primitive, {shown}, not text: a hole's value becomes "
                                   "prompt text (its repr), and the primitive would not run")
        assert e.value.hint == ("write the construct ({gen NAME ...}, {select NAME choices=[...]}, {image SRC}, ...) in "
                                f"place of the hole, or add it in a %%lm --python cell: s += {source}")


def test_a_program_its_state_or_a_forks_branches_in_a_hole_are_refused_and_other_values_are_their_str():
    from helpers_lang import ScriptedBackend

    @lmnb.function
    def other(s):
        s += "x"

    state = other.run(backend=ScriptedBackend(lambda p, params: "y"))
    group = lmnb.ProgramStateGroup([state], state)
    for value, message, hint in [
            (state, "{v} is an lmnb ProgramState (a program's state), not text",
             "write {v.text()} for its text, or {v['NAME']} for a variable it captured"),
            (group, "{v} is a fork's branches (an lmnb ProgramStateGroup), not text",
             "write {v[0].text()} for a branch's text"),
            (other, "{v} is the lmnb program 'other' itself, not text",
             "write {v(...).text()} for the text of a run of it, or call its body on this state in a %%lm --python "
             "cell: v.func(s, ...)")]:
        with pytest.raises(TemplateRuntimeError) as e:
            record(parse("Q: {v}").program().func, v=value)
        assert (e.value.message, e.value.hint, e.value.col) == (message, hint, 4)
    # an expression the fix's .text() would bind into is parenthesised ("{c or v.text()}" called it on v alone)
    for hole, hint in [("{c or v}", "write {(c or v).text()} for its text, or {(c or v)['NAME']} for a variable it "
                                    "captured"),
                       ("{v if c else v}", "write {(v if c else v)[0].text()} for a branch's text"),
                       ("{c or v}", "write {(c or v)(...).text()} for the text of a run of it, or call its body on "
                                    "this state in a %%lm --python cell: (c or v).func(s, ...)"),
                       ("{d['k']}", "write {d['k'].text()} for its text, or {d['k']['NAME']} for a variable it captured")]:
        value = state if "captured" in hint else group if "branch" in hint else other
        names = {"v": value, "c": "", "d": {"k": value}}
        with pytest.raises(TemplateRuntimeError) as e:
            record(parse("Q: " + hole).program().func, **{n: x for n, x in names.items() if n in hole})
        assert e.value.hint == hint
    # None, a list, bytes: their str, as an f-string makes it (docs/CELL_LANGUAGE.md, Holes), in both faces
    one, two = faces("{n} {xs} {b}", n=None, xs=[1, "a"], b=b"x")
    assert one == two == [((), "add", ("text", "None [1, 'a'] b'x'"))]


def test_a_hole_that_begins_or_ends_with_a_brace_is_quoted_with_the_space_it_is_written_with():
    """{ {"k": x} } was quoted "{{"k": x}}", which reads as the escaped braces of the prompt's text."""
    from helpers_lang import ScriptedBackend

    class Bad:
        def __str__(self):
            raise RuntimeError("no str")

    state = lmnb.function(lambda s: None).run(backend=ScriptedBackend(lambda p, params: "y"))
    # (the column: the hole's "{", or for a failed expression where it begins)
    for cell, value, message, col, hint in [
            ('{ {"k": v} }', lmnb.gen("a"),
             '{ {"k": v} } holds an lmnb primitive, Gen(\'a\'), at [\'k\'], not text: ' + _LIST_HOLDS_GEN.format("dict"),
             4, None),
            ('{ {"k": v}["z"] }', 1, '{ {"k": v}["z"] } failed: KeyError: \'z\'', 6, None),
            ('{ {"k": v}["k"] }', Bad(), 'cannot format { {"k": v}["k"] }: RuntimeError: no str', 4, None),
            ('{ {"k": v}["k"] }', state, '{ {"k": v}["k"] } is an lmnb ProgramState (a program\'s state), not text', 4,
             'write { {"k": v}["k"].text() } for its text, or { {"k": v}["k"][\'NAME\'] } for a variable it captured'),
            ("{ {1}.pop() and v}", state, "{ {1}.pop() and v } is an lmnb ProgramState (a program's state), not text", 4,
             "write {({1}.pop() and v).text()} for its text, or {({1}.pop() and v)['NAME']} for a variable it captured"),
            ("{v.get({1}) }", {}, "{v.get({1})} failed: TypeError: unhashable type: 'set'", 5, None),  # (no brace at an end)
    ]:
        with pytest.raises(TemplateRuntimeError) as e:
            record(parse("Q: " + cell).program().func, v=value)
        assert (e.value.message, e.value.col) == (message, col)
        assert hint is None or e.value.hint == hint


@pytest.mark.parametrize("cell, kwargs, where", [
    # the hole reads the same source in every branch: which branch failed, for which item, was not said
    ("{fork v in items}\nQ {v}:{1/(v-1) if isinstance(v, int) else 0}\n{join}", {"items": [1, "<i>2</i>"]},
     "in fork branch 0 (v=1): {1/(v-1) if isinstance(v, int) else 0} failed: ZeroDivisionError: division by zero"),
    # (a {fork N}'s branches differ in no value a hole reads: the outer fork's item names the branch)
    ("{fork v in items}{fork 3}{1/v}{join}{join}", {"items": [1, 0]},
     "in fork branch 1.0 (v=0): {1/v} failed: ZeroDivisionError: division by zero"),
    ("{fork k, v in pairs}{fork w in v}{1/w}{join}{join}", {"pairs": [("a", [1]), ("b", [2, 0])]},
     "in fork branch 1.1 ((k, v)=('b', [2, 0]), w=0): {1/w} failed: ZeroDivisionError: division by zero"),
    ("{fork v in items}{1/v}{join}", {"items": ["x" * 100]},
     "in fork branch 0 (v='xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx'): {1/v} failed: TypeError: "
     "unsupported operand type(s) for /: 'int' and 'str'"),
])
def test_a_failure_in_a_fork_branch_names_the_branch_and_its_item(cell, kwargs, where):
    t = parse(cell)
    with pytest.raises(TemplateRuntimeError) as e:
        record(t.program().func, **t.bind(kwargs))
    assert e.value.message == where


@pytest.mark.parametrize("cell", ["{fork v in items}{gen a max_tokens=1}{join}{1/0}", "{fork 2}{1/0}{join}"])
def test_a_failure_after_a_fork_or_in_a_fork_n_names_no_branch(cell):
    t = parse(cell)
    with pytest.raises(TemplateRuntimeError) as e:
        record(t.program().func, **t.bind({"items": [1, 2]}))
    assert e.value.message == "{1/0} failed: ZeroDivisionError: division by zero"


def _one_branch_fails():
    """A scripted backend whose request of the fork branch with the prompt ending "b1" raises once
    the requests of all 3 branches are in the backend; the other two then wait (up to 20 s) to be
    aborted. Its ``rids``: each branch's request id, by its prompt's end."""
    from helpers_lang import ScriptedBackend

    class Backend(ScriptedBackend):
        def __init__(self):
            super().__init__(delay=20)
            self.in_flight = threading.Barrier(3, timeout=20)
            self.rids = {}

        def _enter(self, prompt, rid):
            self.rids[prompt.text[-2:]] = rid
            self.in_flight.wait()
            if prompt.text.endswith("b1"):
                raise RuntimeError("the model exploded")

        def generate(self, prompt, params, rid):
            self._enter(prompt, rid)
            return super().generate(prompt, params, rid)

        def generate_stream(self, prompt, params, rid):
            self._enter(prompt, rid)
            yield from super().generate_stream(prompt, params, rid)

    return Backend()


@pytest.mark.parametrize("how", ["run", "stream", "export"])  # (the kernel runs a cell streamed)
def test_a_failed_fork_branch_is_told_at_once_and_the_branches_still_running_are_aborted(how):
    # {join} waited for every branch, so a branch that failed at once was told only when its slow
    # siblings had generated to their end, which the failed cell then threw away.
    from lmnb.executor import ForkError

    t = parse('Q:{fork b in ["b0", "b1", "b2"]}{b}{gen x max_tokens=5}{join}')
    program = t.program()
    if how == "export":  # the exported program joins as the cell does
        ns = {"lmnb": lmnb}
        exec(t.to_python("cell"), ns)
        program = ns["cell"]
    backend = _one_branch_fails()
    if how == "stream":
        error = program.run(stream=True, backend=backend).error()
    else:
        with pytest.raises(ForkError) as e:
            program.run(backend=backend)
        error = e.value
    assert str(error) == ("1 of 3 fork branches failed: branch 1: Gen('x') failed: RuntimeError: the model exploded; "
                          "the branches still running (0, 2) were aborted")
    assert list(error.errors) == [1] and error.aborted == (0, 2)
    assert set(backend.aborted) == {backend.rids["b0"], backend.rids["b2"]}


@pytest.mark.parametrize("how", ["run", "stream", "export"])
def test_a_branch_that_had_finished_when_a_sibling_failed_is_not_aborted_and_stays_readable(how):
    # {join} aborted every branch but the failed ones, a finished one too: its whole text became a
    # ProgramAborted (ForkError.states[0]["x"] raised), and the message said it was "still running";
    # a streamed run's failed body then aborted it again (its unjoined branches were not closed yet).
    import time

    from helpers_lang import ScriptedBackend

    from lmnb.backend.base import Completion
    from lmnb.executor import ForkError

    class Backend(ScriptedBackend):
        def __init__(self):
            super().__init__(delay=20)  # (b2 waits up to 20 s to be aborted)
            self.b0_done, self.rids = threading.Event(), {}

        def _enter(self, prompt, rid):  # True: b0, which finishes at once
            self.rids[prompt.text[-2:]] = rid
            if prompt.text.endswith("b1"):
                assert self.b0_done.wait(20)
                time.sleep(0.2)  # (b0's worker takes its answer meanwhile: the branch has finished)
                raise RuntimeError("the model exploded")
            return prompt.text.endswith("b0")

        def generate(self, prompt, params, rid):
            if not self._enter(prompt, rid):
                return super().generate(prompt, params, rid)
            self.b0_done.set()
            return [Completion("done", {"id": rid, "finish_reason": {"type": "stop"}})]

        def generate_stream(self, prompt, params, rid):
            if not self._enter(prompt, rid):
                yield from super().generate_stream(prompt, params, rid)
                return
            yield "done", {"id": rid}
            self.b0_done.set()
            yield "", {"id": rid, "finish_reason": {"type": "stop"}}

    t = parse('Q:{fork b in ["b0", "b1", "b2"]}{b}{gen x max_tokens=5}{join}')
    program = t.program()
    if how == "export":
        ns = {"lmnb": lmnb}
        exec(t.to_python("cell"), ns)
        program = ns["cell"]
    backend = Backend()
    if how == "stream":
        error = program.run(stream=True, backend=backend).error()
    else:
        with pytest.raises(ForkError) as e:
            program.run(backend=backend)
        error = e.value
    assert str(error) == ("1 of 3 fork branches failed: branch 1: Gen('x') failed: RuntimeError: the model exploded; "
                          "the branch still running (2) was aborted")
    assert list(error.errors) == [1] and error.aborted == (2,)
    assert backend.aborted == [backend.rids["b2"]]
    assert error.states[0]["x"] == "done" and error.states[0].error() is None


def test_walk_yields_every_node_of_a_cell_roles_and_forks_bodies_too_in_cell_order():
    """The checks of a cell's holes (the export's of a primitive in a hole, a call of a kernel
    variable's) walk one tree: a hole inside a role inside a fork is reached, after its fork's own node."""
    from lmnb.template.nodes import walk

    cell = "{a}{user}{b}{/user}{fork 2}{c}{user}{d}{/user}{join}"
    got = [(type(n).__name__, n.offset, getattr(getattr(n, "expr", None), "source", None)) for n in walk(parse(cell).body)]
    assert got == [("Interp", 0, "a"), ("Role", 3, None), ("Interp", 9, "b"), ("Fork", 19, None),
                   ("Interp", 27, "c"), ("Role", 30, None), ("Interp", 36, "d")]


_LIST_HOLDS_GEN = ("a hole's value becomes prompt text, a {}'s text is its items' repr, and the primitive would "
                   "not run")


@pytest.mark.parametrize("cell, where, container", [
    ("{[x]}", "at [0]", "list"),
    ("{(x,)}", "at [0]", "tuple"),
    ('{ {"k": x} }', "at ['k']", "dict"),
    ("{ {x} }", "as an item of the set", "set"),
    ("{frozenset([x])}", "as an item of the set", "set"),
    ("{ {x: 1} }", "as a key of the dict", "dict"),
    ('{[1, [2, {"a": (3, x)}]]}', "at [1][1]['a'][1]", "list"),
    ("{[{(x,)}]}", "in an item of the set at [0]", "list"),
    ("{pair}", "at [1]", "tuple"),  # (a namedtuple: its text is its fields' repr too)
    ("{[[[[x]]]]!r:>3}", "at [0][0][0][0]", "list"),  # (HELD_DEPTH containers down; a conversion, a spec)
    # (their text is their items' repr too: it was sent as "deque([Gen('a')])")
    ("{collections.deque([x])}", "at [0]", "deque"),
    ("{collections.UserList([1, x])}", "at [1]", "UserList"),
    ('{collections.UserDict(k=[x])}', "at ['k'][0]", "UserDict"),
])
def test_a_primitive_held_in_a_list_tuple_dict_or_set_in_a_hole_is_refused(cell, where, container):
    """{[x]} with x = lmnb.gen("a") (and a tuple, dict or set of it) still sent the text "[Gen('a')]":
    no gen ran and no variable a was set, as with the primitive alone in the hole (refused before)."""
    import collections

    x = lmnb.gen("a")
    pair = collections.namedtuple("Pair", "q a")("hi", x)
    t = parse("Q: " + cell)
    log = []
    with pytest.raises(TemplateRuntimeError) as e:
        t.program().func(Rec(log), **t.bind({"x": x, "pair": pair, "frozenset": frozenset, "collections": collections}))
    assert log == [((), "add", ("text", "Q: "))]  # (the text before it only: nothing of the hole)
    shown = cell[:cell.index("!")] + "}" if "!" in cell else cell  # (the hole as written: "{ {x} }", not "{{x}}")
    assert (e.value.message, e.value.col) == (
        f"{shown} holds an lmnb primitive, Gen('a'), {where}, not text: " + _LIST_HOLDS_GEN.format(container), 4)
    assert e.value.hint == ("write the construct ({gen NAME ...}, {select NAME choices=[...]}, {image SRC}, ...) in "
                            "place of the hole, or add the primitive in a %%lm --python cell: s += lmnb.gen(...)")


def test_a_state_a_forks_branches_or_a_program_held_in_a_list_in_a_hole_is_refused():
    from helpers_lang import ScriptedBackend

    @lmnb.function
    def other(s):
        s += "x"

    state = other.run(backend=ScriptedBackend(lambda p, params: "y"))
    shown = {"state": "an lmnb ProgramState (a program's state)",
             "group": "a fork's branches (an lmnb ProgramStateGroup)", "other": "the lmnb program 'other'"}
    for name, value in [("state", state), ("group", lmnb.ProgramStateGroup([state], state)), ("other", other)]:
        with pytest.raises(TemplateRuntimeError) as e:
            record(parse("{[1, v]}").program().func, v=value)
        assert e.value.message == (f"{{[1, v]}} holds {shown[name]}, at [1], not text: a hole's value becomes prompt "
                                   "text, and a list's text is its items' repr")
        assert e.value.hint == ("take the text out where the value is built: a state's .text() (or ['NAME'] for a "
                                "variable it captured), a fork branch's [0].text(), a program's (...).text()")


def test_a_containers_search_is_bounded_and_other_containers_are_their_str():
    """The search stops HELD_ITEMS items in and HELD_DEPTH containers down (a hole holding a long
    list costs next to nothing more); past them, and for a value that is no list, tuple, dict or
    set, the text is its str, as docs/CELL_LANGUAGE.md says."""
    from lmnb.template.hole_values import HELD_DEPTH, HELD_ITEMS

    x = lmnb.gen("a")
    assert (HELD_DEPTH, HELD_ITEMS) == (4, 1000)
    with pytest.raises(TemplateRuntimeError) as e:
        record(parse("{v}").program().func, v=["w"] * 999 + [x])  # (the 1000th item)
    assert e.value.message.startswith("{v} holds an lmnb primitive, Gen('a'), at [999], not text")
    past = ["w"] * 1000 + [x]
    it = iter([x])
    for value, text in [(past, str(past)), ([[[[[x]]]]], "[[[[[Gen('a')]]]]]"), (it, str(it)),
                        ([1, "a", None], "[1, 'a', None]")]:
        assert record(parse("{v}").program().func, v=value) == [((), "add", ("text", text))]


def test_a_batch_traces_a_list_of_an_argument_in_a_hole_to_its_prefix_and_runs_it():
    """run_batch's prefix trace passes a placeholder (an lmnb primitive) for an argument: in a list in
    a hole it ends the trace there, as alone, and is not refused as a primitive (the trace took its
    repr, "Q: [<lmnb.tracer._Placeholder object at 0x...>]", for the prefix every item shares)."""
    from helpers_lang import ScriptedBackend

    from lmnb.tracer import extract_prefix

    t = parse("Intro.\nQ: {[q]}{gen a max_tokens=2}")
    ns = {"lmnb": lmnb}
    exec(t.to_python("p"), ns)  # (the export's face: its f-string made the list's text, the placeholder's repr)
    for program in (t.program(), ns["p"]):
        assert extract_prefix(program, lmnb.get_chat_template("default")) == "Intro.\nQ: "
    states = t.program().run_batch([{"q": "x"}, {"q": "y"}], backend=ScriptedBackend(lambda p, params: "ok"))
    assert [s.text() for s in states] == ["Intro.\nQ: ['x']ok", "Intro.\nQ: ['y']ok"]


@pytest.mark.parametrize("cell, col, name", [
    ("{gen len} n={len(xs)}", 14, "len"),
    ("{select kind choices=['a', 'b']}{gen x max_tokens=kind(3)}", 51, "kind"),  # (an option's value too)
    ("{gen summarise}\n{[summarise(d) for d in docs]}", 3, "summarise"),  # (a kernel function's name)
])
def test_a_hole_calling_a_result_the_cell_captured_is_refused_before_it_runs(cell, col, name):
    """From {gen len} on, len in a hole is the result (text), which a later {len(xs)} called once the
    gens before it had run: "'str' object is not callable", tokens spent, where the builtin (or the
    kernel's function) was meant. The cell is refused at the call as it is read, with the fix; the
    result read as a value ({len}) is as before, and a name no capture took is called as it was."""
    with pytest.raises(TemplateSyntaxError) as e:
        parse(cell)
    assert (e.value.line, e.value.col) == (cell[:cell.index(f"{name}(")].count("\n") + 1, col)
    assert e.value.message == (f"{name}(...) calls the result {name!r} captured earlier in this cell, which is text "
                               "(or a value parsed from it), not a function: from its capture on, the name "
                               f"{name} is that result in the cell's holes")
    assert e.value.hint == f"name the result otherwise (e.g. {name}_) to call {name} here"
    t = parse("{gen len} {len} {len_(xs)} {[str(x) for x in xs]}")
    assert t.arguments == ("len_", "xs") and t.captures == ("len",)
    assert parse("{len(xs)}{gen len}").captures == ("len",)  # (called before the capture: the builtin)


@pytest.mark.parametrize("body, names", [
    ("{fork t in stops}", ["t"]),
    ("{gen a}{fork i, (t, u) in xs}{gen b}{fork v in t}", ["v", "i", "t", "u", "a", "b"]),  # (innermost first)
    ("{fork t in xs}{gen b}{join}", ["b"]),  # (the fork joined: its target gone, b its list)
    ("{user}{gen a}{/user}{fork 2}", ["a"]),
    ("{gen a}{bad hole=}", []),  # (a hole the parser refuses: no scope known past it)
    ("", []),
])
def test_names_bound_are_those_a_hole_at_the_end_reads_from_the_cell(body, names):
    """docs/CELL_LANGUAGE.md, "Where names come from": a fork's target, then a result captured
    earlier in the cell (completion offers them)."""
    from lmnb.template.parser import names_bound

    assert names_bound(body) == names


_KERNEL = {"stops": [".", "!"], "xs": ["a", "b"], "ys": [b"c"], "pairs": [(1, "x"), (2, "y")],
           "d": {"k": [1.5], "j": [2.5]}}


@pytest.mark.parametrize("body, stand_ins, loop", [
    ("{fork t in stops}", {"t": "(stops)[0]"}, "for t in stops: break"),
    ("{fork i, t in enumerate(xs)}", {"i": "(0)", "t": "(xs)[0]"}, "for i, t in enumerate(xs): break"),
    ("{fork i, t in enumerate(xs, 5)}", {"i": "(0)", "t": "(xs)[0]"}, None),  # (i: an int, not its value)
    ("{fork i, t in enumerate(xs, start=5)}", {"i": "(0)", "t": "(xs)[0]"}, None),
    ("{fork p in enumerate(xs)}", {"p": "((0), (xs)[0])"}, "for p in enumerate(xs): break"),
    ("{fork t, (i, u) in zip(ys, pairs)}", {"t": "(ys)[0]", "i": "((pairs)[0])[0]", "u": "((pairs)[0])[1]"},
     "for t, (i, u) in zip(ys, pairs): break"),
    ("{fork i, t in pairs}", {"i": "((pairs)[0])[0]", "t": "((pairs)[0])[1]"}, "for i, t in pairs: break"),
    ("{fork t in pairs}{fork u in t}", {"t": "(pairs)[0]", "u": "((pairs)[0])[0]"},
     "for t in pairs:\n for u in t: break\n break"),
    ("{fork t in stops}{fork t, u in pairs}", {"t": "((pairs)[0])[0]", "u": "((pairs)[0])[1]"}, None),  # (innermost)
    ("{fork a, b, c in enumerate(xs)}", {"a": None, "b": None, "c": None}, None),  # (enumerate gives pairs)
    ("{gen a}{select b choices=xs}{fork 2}{gen c}{join}", {"a": "''", "b": "''", "c": "['']"}, None),
    ("{gen a json_schema=S}{gen b dtype=kind}{gen c dtype=None}", {"a": None, "b": None, "c": "''"}, None),
    ("{gen a}{fork t in a.split()}", {"a": "''", "t": "(''.split())[0]"}, None),
    ("{gen a dtype=kind}{fork t in a}", {"a": None, "t": None}, None),
    ("{gen a dtype=int}{fork t in a}", {"a": "(0)", "t": None}, None),  # (an int has no items)
    ("{fork i, t in enumerate(xs)}{fork u in i}", {"i": "(0)", "t": "(xs)[0]", "u": None}, None),
    # a mapping's view: its first key and value (a view has no [0])
    ("{fork k, v in d.items()}", {"k": "(list(d))[0]", "v": "(d)[(list(d))[0]]"}, "for k, v in d.items(): break"),
    ("{fork p in d.items()}", {"p": "((list(d))[0], (d)[(list(d))[0]])"}, "for p in d.items(): break"),
    ("{fork k in d.keys()}", {"k": "(list(d))[0]"}, "for k in d.keys(): break"),
    ("{fork v in d.values()}", {"v": "(d)[(list(d))[0]]"}, "for v in d.values(): break"),
    ("{fork i, (k, v) in enumerate(d.items())}", {"i": "(0)", "k": "(list(d))[0]", "v": "(d)[(list(d))[0]]"},
     "for i, (k, v) in enumerate(d.items()): break"),
    ("{gen a}{fork c in a}", {"a": "''", "c": "''"}, None),  # (a character of the text: a str)
    ("{fork 2}{gen a}{join}{fork c in a}", {"a": "['']", "c": "([''])[0]"}, None),  # (a list's item)
    ("{fork t in xs}{join}", {}, None),  # (the fork joined: its target gone)
    ("{fork t in xs}{bad hole=}", {}, None),  # (a hole the parser refuses: no scope known past it)
])
def test_stand_ins_are_values_of_the_kind_each_name_the_cell_binds_holds(body, stand_ins, loop):
    """Completion asks IPython of a name's attributes as of its stand-in's: a fork target's is its
    first item (or the part of it a destructured target takes), a result's text; where a loop is
    given, each stand-in evaluated among the kernel's variables is what Python's own loop binds."""
    from lmnb.template.parser import stand_ins as stand_ins_of

    assert stand_ins_of(body) == stand_ins
    if loop is not None:
        bound = dict(_KERNEL)
        exec(loop, bound)
        assert {n: eval(e, dict(_KERNEL)) for n, e in stand_ins.items()} == {n: bound[n] for n in stand_ins}


@pytest.mark.parametrize("dtype, kind", [
    ("int", int), ("'int'", int), ("float", float), ('"float"', float), ("bool", bool), ("str", str),
    ("'str'", str), ("'string'", str), ("None", str),  # (None: no dtype, the text)
])
def test_the_stand_in_of_a_gens_value_parsed_by_its_dtype_is_a_value_of_that_type(dtype, kind):
    """A gen with a dtype had no stand-in (its value's attributes offered nothing, even for str's
    text): it is a value of the type the dtype parses the text into (lmnb.ir.dtype_regex)."""
    from lmnb.template.parser import stand_ins

    assert type(eval(stand_ins(f"{{gen x dtype={dtype}}}")["x"], {})) is kind


@pytest.mark.parametrize("body", ["{gen x dtype=kind}", "{gen x dtype=complex}", "{gen int}{gen x dtype=int}"])
def test_a_gens_value_parsed_by_a_dtype_not_known_here_has_no_stand_in(body):
    """A kernel variable's dtype (complex is one: no builtin the cell calls), or the cell's own
    result named int: its type is not known before the cell runs."""
    from lmnb.template.parser import stand_ins

    assert stand_ins(body)["x"] is None
