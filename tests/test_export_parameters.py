"""The papermill ``parameters`` cell is read once (``lmnb.export.parameters``), for the exported
job's options and for ``lmnb run -p`` alike."""

from __future__ import annotations

import sys

import pytest

from helpers_export import notebook
from lmnb.export import plan_notebook
from lmnb.export.parameters import NO_DEFAULT, read_parameters

CELL = """\
import os
from pathlib import Path
n: int = 2
short = True
a, (b, *c) = 1, (2, 3)
x = y = "z"
limit = 3
limit = len(os.sep)
hint: str
if True:
    nested = 1
def f():
    inner = 2
ratio = 0.5
ratio = 0.25
"""


def test_the_parameters_are_the_top_level_assignments_with_their_literal_defaults():
    # Worked out by hand: imports, the def, the block and the bare annotation (hint: str binds
    # nothing) are set-up; a, b, c unpack a tuple (no default of their own); limit is last set
    # to a call; ratio's last literal counts; order is that of the first assignment.
    got = read_parameters(CELL)
    assert list(got) == ["n", "short", "a", "b", "c", "x", "y", "limit", "ratio"]
    assert got == {"n": 2, "short": True, "a": NO_DEFAULT, "b": NO_DEFAULT, "c": NO_DEFAULT, "x": "z", "y": "z",
                   "limit": NO_DEFAULT, "ratio": 0.25}
    with pytest.raises(SyntaxError):
        read_parameters("files = !ls")


def test_lmnb_run_and_the_export_read_the_same_parameters(capsys):
    """They were read three ways: the export took `hint: str` for a parameter (the script then
    failed with NameError on `hint=hint`), `lmnb run` took no default from `n: int = 2` and
    counted names bound inside `if` as parameters."""
    from lmnb_kernel.run import inject_parameters, parameter_defaults

    nb = notebook(("parameters", CELL), "%%lm\n{x}{gen out max_tokens=n}")
    assert plan_notebook(nb).parameters == ("n", "short", "a", "b", "c", "x", "y", "limit", "ratio")
    assert parameter_defaults(nb) == {"n": 2, "short": True, "x": "z", "y": "z", "ratio": 0.25}
    inject_parameters(nb, {"b": 1, "nested": 2, "hint": "h"})
    err = capsys.readouterr().err
    assert "'b'" not in err
    for name in ("nested", "hint"):
        assert (f"parameter {name!r} is not set in the cell tagged 'parameters' "
                "(it sets a, b, c, limit, n, ratio, short, x, y)") in err
    assert nb.cells[1].metadata["tags"] == ["injected-parameters"]


def test_a_parameters_cell_with_ipython_syntax_is_read_by_lmnb_run_as_by_the_export(capsys):
    """lmnb run did not read a parameters cell holding IPython syntax, while the export read it
    with that syntax left out: `-p limit 5` was the int 5 in the run and the text "5" in the job
    (whose option reads it like the default "3"), and a misspelt -p name went unwarned."""
    from lmnb_kernel.run import inject_parameters, parameter_defaults, parse_value

    nb = notebook(("parameters", '%env X=1\n!echo hi\nlimit = "3"\nn = 2'), "%%lm\n{limit}{gen out max_tokens=n}")
    assert plan_notebook(nb).parameters == ("limit", "n")
    assert parameter_defaults(nb) == {"limit": "3", "n": 2}
    assert parse_value("5", parameter_defaults(nb)["limit"]) == "5"
    inject_parameters(nb, {"limt": "5"})
    assert "parameter 'limt' is not set in the cell tagged 'parameters' (it sets limit, n)" in capsys.readouterr().err
    nb.cells[0].source = "files = !ls\nn = 2"  # (the export refuses it: no names to check, no warning)
    assert parameter_defaults(nb) == {}


@pytest.mark.parametrize("cell", ["limit = 1\nparam_limit = 2", "param_limit = 2\nlimit = 1"])
def test_two_parameters_that_would_be_one_option_are_refused_at_export(cell, monkeypatch):
    """limit's option is --param-limit (--limit is the job's own), as is param_limit's: the export
    wrote the script, and it failed as it started with argparse's "conflicting option string"."""
    from lmnb.export import ExportError, export_notebook

    nb = notebook(("parameters", cell), "%%lm\n{gen out max_tokens=limit}{param_limit}")
    with pytest.raises(ExportError) as e:
        export_notebook(nb)
    assert str(e.value) == ("cell 1 (parameters): the parameters limit and param_limit would both be the job's option "
                            "--param-limit (the job has a --limit of its own, so limit becomes --param-limit); rename "
                            "one of them in the parameters cell")
    # a script that runs its cells once has no --limit: limit is --limit, and the two options differ
    source, _ = export_notebook(notebook(("parameters", cell), "got = (limit, param_limit)"))
    monkeypatch.setattr(sys, "argv", ["job.py", "--limit", "5", "--param-limit", "6"])
    import lmnb.api

    # (the script starts its backend, the demo Engine, as lmnb's default: put back, and shut down, after)
    previous = lmnb.api._default_backend
    monkeypatch.setattr(lmnb.api, "_default_backend", previous)
    ns: dict = {"__name__": "__main__"}
    try:
        exec(compile(source, "job.py", "exec"), ns)
    finally:
        if lmnb.api._default_backend not in (None, previous):
            lmnb.api._default_backend.shutdown()
    assert ns["got"] == (5, 6)


def test_list_tuple_set_and_none_defaults_read_python_literals_and_ints_read_python_int_literals(tmp_path, capsys):
    """`-p tags b` (and the job's `--tags b`) for `tags = ["a"]` gave the text "b", which a cell
    looping over tags read letter by letter, without a word; `-p n 0x20` was refused for `n = 3`.
    A list / tuple / set / dict default now takes a Python literal of its type (else an error with
    an example); None, as papermill's -p: a literal (None, 3, [1]) or else the text; an int, any
    Python integer literal."""
    import argparse

    import nbformat

    from lmnb.batch import Job
    from lmnb_kernel.run import parse_value, run

    assert [parse_value(t, 3) for t in ("0x20", "0o17", "0b101", "1_000", "-7", "010")] == [32, 15, 5, 1000, -7, 10]
    assert parse_value("['b', 'c']", ["a"]) == ["b", "c"]
    assert parse_value("(1, 2)", ()) == (1, 2) and parse_value("{3}", {1}) == {3}
    assert parse_value("{'k': 1}", {}) == {"k": 1}
    assert [parse_value(t, None) for t in ("None", "3", "[1]", "abc")] == [None, 3, [1], "abc"]
    for text, default, problem in [("b", ["a"], "expected a list as a Python literal or JSON, e.g. [1, 2]"),
                                   ("{1}", (1,), "expected a tuple or a list as a Python literal or JSON, e.g. (1, 2)"),
                                   ("x", {1}, "expected a set or a list as a Python literal or JSON, e.g. {1, 2}"),
                                   # (it said '{'a': 1}', which the shell hands on as {a: 1}, no literal)
                                   ("[1]", {}, """expected a dict as a Python literal or JSON, e.g. {"a": 1} (in """
                                               """quotes for the shell: '{"a": 1}')"""),
                                   ("2.5", 3, "expected an integer (e.g. 3, 1_000 or 0x20), got '2.5'")]:
        with pytest.raises(ValueError) as e:
            parse_value(text, default)
        assert str(e.value).startswith(f"the parameters cell sets it to {default!r}: {problem}")
    # the exported job reads its options the same way
    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--n", "0x20", "--tags", "['b']", "--opt", "x"])
    assert vars(job.parameters(n=3, tags=["a"], opt=None)) == {"n": 32, "tags": ["b"], "opt": "x"}
    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--tags", "b"])
    with pytest.raises(SystemExit) as e:
        job.parameters(tags=["a"])
    assert e.value.code == 2
    assert ("argument --tags: expected a list as a Python literal or JSON, e.g. [1, 2] (in quotes for the shell: "
            "'[1, 2]'), got 'b'") in capsys.readouterr().err
    # lmnb run names the parameter, and runs nothing
    src = tmp_path / "nb.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('tags = ["a"]',
                                                                             metadata={"tags": ["parameters"]})]), src)
    args = argparse.Namespace(notebook=str(src), output=str(tmp_path / "out.ipynb"), parameter=[["tags", "b"]],
                              timeout=60, allow_errors=False)
    assert run(args) == 2
    assert capsys.readouterr().err == ("lmnb run: -p tags 'b': the parameters cell sets it to ['a']: expected a list as "
                                       "a Python literal or JSON, e.g. [1, 2] (in quotes for the shell: '[1, 2]'), "
                                       "got 'b'\n")


def test_negative_numbers_of_every_form_are_values_of_p_and_of_the_jobs_options():
    """argparse (before Python 3.14) took -1 and -1.5 alone for negative numbers: `-p lr -1e-3`
    (or -1_000, -0x20, -inf) said "argument -p/--parameter: expected 2 arguments", and the job's
    `--lr -1e-3` "expected one argument"; papermill takes them."""
    import argparse

    from lmnb.batch import Job
    from lmnb_kernel.run import run_arguments

    parser = argparse.ArgumentParser()
    run_arguments(parser)
    args = parser.parse_args(["nb.ipynb", "-p", "lr", "-1e-3", "-p", "n", "-0x20", "-p", "big", "-1_000",
                              "-p", "low", "-inf", "-o", "out.ipynb"])
    assert args.parameter == [["lr", "-1e-3"], ["n", "-0x20"], ["big", "-1_000"], ["low", "-inf"]]
    assert args.output == "out.ipynb"
    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--lr", "-1e-3", "--n", "-0x20", "--low", "-inf"])
    assert vars(job.parameters(lr=0.1, n=3, low=0.0)) == {"lr": -0.001, "n": -32, "low": float("-inf")}


def test_a_jobs_option_value_starting_with_a_dash_is_refused_with_the_equals_form(capsys):
    # `--name -Bob` (not a number) is argparse's "expected one argument", which said nothing of
    # --name=-Bob, the form the README gives
    from lmnb.batch import Job

    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--name", "-Bob"])
    with pytest.raises(SystemExit):
        job.parameters(name="Ann")
    assert capsys.readouterr().err.endswith(
        "error: argument --name: expected one argument; a value starting with '-' is written --name=VALUE "
        "(e.g. --name=-x)\n")
    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--name=-Bob"])
    assert vars(job.parameters(name="Ann")) == {"name": "-Bob"}


def test_container_defaults_take_json_and_tuple_or_set_defaults_take_a_list(capsys):
    """`-p limits '{"low": true}'` was refused for a dict default though its example reads as JSON,
    and `-p pair '[1, 2]'` for a tuple one, though an input row's JSON list is taken for it
    (found by the final review helper); Python literals are still read as before."""
    from lmnb.batch import Job
    from lmnb_kernel.run import parse_value

    assert parse_value('{"a": true, "b": null, "c": [false]}', {}) == {"a": True, "b": None, "c": [False]}
    assert parse_value("{'a': True}", {}) == {"a": True} and parse_value("[true, null]", ["x"]) == [True, None]
    pair, tags = parse_value("[1, 2]", (0,)), parse_value('["b", "a", "b"]', {"x"})
    assert (type(pair), pair, type(tags), tags) == (tuple, (1, 2), set, {"a", "b"})
    with pytest.raises(ValueError, match=r"expected a set or a list as a Python literal or JSON, e\.g\. \{1, 2\} "
                                         r"\(in quotes for the shell: '\{1, 2\}'\), got '\[\[1\]\]'"):
        parse_value("[[1]]", {1})  # (a list can be no set member)
    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--limits", '{"low": null}', "--pair", "[3]"])
    assert vars(job.parameters(limits={"low": 0}, pair=(1, 2))) == {"limits": {"low": None}, "pair": (3,)}


def test_json_with_escaped_characters_outside_the_basic_plane_is_read_as_json():
    # json.dumps writes "😀" as "\\ud83d\\ude00" (its default ensure_ascii), which a Python literal
    # reads as two lone surrogates: -p tags "$(python -c 'import json; print(json.dumps(["😀"]))')"
    # gave half characters that no tokenizer encodes (found by the break-it review)
    import json

    from lmnb.batch import Job
    from lmnb_kernel.run import parse_value

    tags, limits = json.dumps(["\U0001F600 ok"]), json.dumps({"k": "\U00020000"})
    assert "\\ud83d" in tags
    assert parse_value(tags, ["a"]) == ["\U0001F600 ok"] and parse_value(tags) == ["\U0001F600 ok"]
    assert parse_value(limits, {}) == {"k": "\U00020000"} and parse_value(limits, None) == {"k": "\U00020000"}
    assert parse_value(tags, ("a",)) == ("\U0001F600 ok",)
    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--tags", tags])
    assert vars(job.parameters(tags=["a"])) == {"tags": ["\U0001F600 ok"]}


def test_a_none_default_keeps_a_tuple_without_parentheses_as_text_as_papermill_does():
    """`-p x 1,2` for `x = None` was the tuple (1, 2); papermill keeps the text "1,2". A tuple in
    its parentheses, and other literals, are still read (found by a review)."""
    from lmnb.batch import Job
    from lmnb_kernel.run import parse_value

    for text in ("1,2", "1,", "(1), (2)", "'a', 'b'", " 1, 2 # c"):
        assert parse_value(text, None) == text and parse_value(text) == text
    assert [parse_value(t) for t in ("(1, 2)", "(1,)", "()", "((1, 2))", "[1, 2]", "3")] == [(1, 2), (1,), (), (1, 2),
                                                                                         [1, 2], 3]
    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--x", "1,2", "--y", "(1, 2)"])
    assert vars(job.parameters(x=None, y=None)) == {"x": "1,2", "y": (1, 2)}


@pytest.mark.parametrize("text", ["0x" + "f" * 5000, "1" * 5000, "[0x" + "f" * 5000 + "]"])
def test_an_integer_too_long_to_write_in_decimal_is_refused_clearly(tmp_path, capsys, text):
    """`-p n 0xfff…` (5000 hex digits) read, and then failed with a ValueError traceback where lmnb
    run wrote it into the injected cell, as the job did where it recorded its parameters (Python
    writes no integer of over 4300 decimal digits); 5000 decimal digits said "expected an integer"
    (found by a review)."""
    import argparse

    import nbformat

    from lmnb.batch import Job
    from lmnb_kernel.run import parse_value, run

    expected = ("expected an integer of at most 4300 decimal digits (Python's limit for writing an integer as text; "
                f"PYTHONINTMAXSTRDIGITS raises it), got {text[:40] + '…'!r}")
    defaults = [3, None, NO_DEFAULT] if not text.startswith("[") else [[1], None]
    for default in defaults:
        with pytest.raises(ValueError) as e:
            parse_value(text, default)
        assert str(e.value).endswith(expected)
    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--n", text])
    with pytest.raises(SystemExit) as stopped:
        job.parameters(n=defaults[0])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: argument --n: {expected}\n")
    src = tmp_path / "nb.ipynb"
    cell = nbformat.v4.new_code_cell("n = None", metadata={"tags": ["parameters"]})
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), src)
    args = argparse.Namespace(notebook=str(src), output=str(tmp_path / "out.ipynb"), parameter=[["n", text]],
                              timeout=60, allow_errors=False)
    assert run(args) == 2
    shown = text[:60] + "…"  # (the text is cut here too)
    assert capsys.readouterr().err == f"lmnb run: -p n {shown!r}: the parameters cell sets it to None: {expected}\n"


REBOUND = """\
label = 3
for _ in range(1):
    label = 'x'
count = 5
count += 1
temperature = 0.5
temperature = 0.25
for step in range(2):
    pass
step = 9
found = 1
try:
    pass
except ValueError as found:
    pass
walrus = 1
ys = [(walrus := y) for y in range(3)]
y = 4
zs = [y for y in range(3)]
name = 'a'
import os as name
gone = 1
del gone
shared = 1
def bump():
    global shared
    shared = 2
local = 1
def own():
    local = 2
    return local
class Box:
    attr = 1
attr = 'kept'
with open(__file__) as handle:
    pass
handle = 0
"""


def test_a_default_is_a_literal_only_where_the_cell_binds_the_name_only_by_top_level_assignments():
    """The first literal was the default of a name the cell then set again: `label = 3` and a
    loop's `label = 'x'` gave --label an int option (--label hello refused, the job ran with 'x'),
    `count = 5` and `count += 1` showed 5 for 6. Worked out by hand from the cell as it runs:
    label, count, step, found, walrus, name, gone, shared and handle are also bound by a loop,
    `+=`, a for/except/with target, a walrus in a comprehension, an import, del or a function's
    global, so the cell computes them; temperature's last top-level literal is its value; y's and
    attr's other bindings are a comprehension's and a class's own, and local is the function's."""
    got = read_parameters(REBOUND)
    computed = ["label", "count", "step", "found", "walrus", "name", "gone", "shared", "handle"]
    assert {n for n, v in got.items() if v is NO_DEFAULT} == {*computed, "ys", "zs"}
    assert {n: v for n, v in got.items() if v is not NO_DEFAULT} == {
        "temperature": 0.25, "y": 4, "local": 1, "attr": "kept"}
    assert read_parameters("n = 1\nfrom os.path import *")["n"] is NO_DEFAULT  # (it may bind any name)


def test_lmnb_run_reads_a_rebound_parameters_value_like_the_value_the_cell_sets(capsys):
    """lmnb run -p label hello was refused: "the parameters cell sets it to 3: expected an
    integer", for a cell that sets label to 'x'; the exported job's --help showed (default: 3)."""
    from lmnb_kernel.run import parameter_defaults, parse_value

    nb = notebook(("parameters", "label = 3\nfor _ in range(1):\n    label = 'x'\ncount = 5\ncount += 1"),
                  "%%lm\n{label}{gen out max_tokens=count}")
    assert parameter_defaults(nb) == {}
    assert parse_value("hello", parameter_defaults(nb).get("label", NO_DEFAULT)) == "hello"
    from lmnb.export import export_notebook

    source, _ = export_notebook(nb, "nb.ipynb", "job.py")
    assert "parameters={'label': None, 'count': None}, computed=['label', 'count'], options_first=True,\n" in source


def test_a_percent_sign_in_the_notebooks_texts_shows_in_the_jobs_help(tmp_path):
    """argparse fills %(default)s in help texts: a parameter's default '%d items' ended python
    job.py --help in a TypeError traceback, and a notebook model path or server URL with a % in it
    (an escaped URL's %7e) in a ValueError; a title with %(prog)s in it had its % read too."""
    import argparse
    import subprocess
    from pathlib import Path

    from lmnb.batch.options import add_parameters, job_parser
    from lmnb.export import export_notebook

    source, _ = export_notebook(notebook(("parameters", "fmt = '%d items'\nshare = 0.5"), 'q = "x"',
                                         "%%lm\n{q}{gen a max_tokens=1}"), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    done = subprocess.run([sys.executable, "job.py", "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--fmt VALUE (default: '%d items') --share VALUE (default: 0.5)" in " ".join(done.stdout.split())

    parser = job_parser("100% done by %(prog)s", backend="http://h/%7e/v1", openai_model="m%s", model="/m/50%",
                        timeout=5)
    add_parameters(parser, {"ratio": "5%"})
    parser.prog = "job.py"
    helped = " ".join(parser.format_help().split())
    for said in ("100% done by %(prog)s", "(default: http://h/%7e/v1, the notebook's)",
                 "(default with the default --backend: m%s)", "(default: /m/50%)", "(default: '5%')"):
        assert said in helped
    assert parser.parse_args(["--input", "i.jsonl", "--output", "o.jsonl"]) == argparse.Namespace(
        input=Path("i.jsonl"), output=Path("o.jsonl"), backend="http://h/%7e/v1", openai="m%s", completion=False,
        continue_final_message=False,
        api_key=None, timeout=5, model=None, device=None, dtype=None, max_total_tokens=None, chat_template=None,
        num_threads=16, limit=None, id_field=None, input_format=None, retry_errors=False, no_progress=False,
        param_ratio="5%")


def test_bytes_and_complex_defaults_read_their_own_type_in_the_job_and_in_lmnb_run(tmp_path):
    """A bytes or complex default took any text as a str (--data xyz ran with 'xyz' where the
    notebook's code expects bytes); now a bytes literal and a complex number, else refused."""
    import subprocess

    from lmnb.export import export_notebook
    from lmnb_kernel.run import parse_value

    assert parse_value("b'a\\x00'", b"z") == b"a\x00" and parse_value("1-2j", 1j) == complex(1, -2)
    assert parse_value("3", 1j) == complex(3, 0) and parse_value("1 + 2j", 1j) == complex(1, 2)
    with pytest.raises(ValueError, match="the parameters cell sets it to b'z': expected a Python bytes literal"):
        parse_value("xyz", b"z")
    source, _ = export_notebook(notebook(("parameters", "data = b'z'\nz = 1j"), 'q = "x"',
                                         "%%lm\n{q}{gen a max_tokens=1}"), "nb.ipynb", "job.py")
    assert "parameters={'data': b'z', 'z': 1j}, options_first=True,\n" in source
    (tmp_path / "job.py").write_text(source)
    for option, said in (["--data", "xyz"], "argument --data: expected a Python bytes literal, e.g. b'abc' (in quotes "
                                            "for the shell: \"b'abc'\"), got 'xyz'"), \
                        (["--z", "1+x"], "argument --z: expected a complex number (e.g. 1+2j, 0.5 or 3j), got '1+x'"):
        done = subprocess.run([sys.executable, "job.py", "--input", "rows.jsonl", "--output", "o.jsonl", *option],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stderr.splitlines()[-1]) == (2, f"job.py: error: {said}")
