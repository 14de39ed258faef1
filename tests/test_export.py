"""``lmnb export`` / ``nbconvert --to lmnb``: what the script looks like and how cells map to it.

Running exported scripts is tested in test_export_run.py (real engine) and the batch runtime in
test_export_batch.py.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from helpers_export import CHAT, QA, notebook
from lmnb.export import SAVE_OVER_JOB, ExportError, export_notebook, plan_notebook
from lmnb.export.cells import Backend
from lmnb.template import parse
from lmnb.template.cell_options import CellLineError, option_parser, parse_cell_line


def nbconvert_script(nb, notebook_name: str, script_name: str, inputs=None, output: str = "",
                     to_stdout: bool = False) -> str:
    """The script `jupyter nbconvert --to lmnb` writes: lmnb export's, but for the command the job's
    messages give to export the notebook again, spelt for nbconvert (``output``: its --output option
    and a space, where the script is not the notebook's default; ``to_stdout``: written with
    --stdout, which that command gives too, and says to save over the job)."""
    import shlex

    output = "--stdout " if to_stdout else output
    reexport = (f"jupyter nbconvert --to lmnb {shlex.quote(notebook_name)} {output}--LMScriptExporter.inputs=NAMES"
                + (SAVE_OVER_JOB if to_stdout else ""))
    return export_notebook(nb, notebook_name, script_name, inputs, reexport=reexport,
                           exported_by="jupyter nbconvert --to lmnb")[0]


def options(parser) -> dict:
    """Each option of ``parser`` (but --help) with what defines it: dest, action, type, metavar, help."""
    return {o: (a.dest, type(a).__name__, a.type, a.metavar, a.help)
            for o, a in parser._option_string_actions.items() if o not in ("-h", "--help")}


def test_cell_line_options_are_the_magics_options():
    from lmnb_kernel.magics import cell_parser

    # the magic's parser and the exporter's are built from one definition: same options, same meaning
    assert options(option_parser()) == options(cell_parser())
    assert set(options(cell_parser())) == {"--python", "--state", "--temperature", "--max-tokens", "--seed",
                                           "--out", "--quiet", "--static", "--append"}
    o = parse_cell_line("--state chat.v1 --temperature 0 --max-tokens 7 --seed 3 --out st --quiet --static --append")
    assert (o.state, o.out) == ("chat.v1", "st")  # --append is accepted: an exported program runs each cell once
    assert parse_cell_line("--out ｓｔ").out == "st"  # the name Python code reads it by
    with pytest.raises(CellLineError, match="--out 'None' is reserved in Python"):  # the script did not compile
        parse_cell_line("--out None")
    assert o.run_kwargs() == {"temperature": 0.0, "max_new_tokens": 7, "seed": 3}
    with pytest.raises(CellLineError) as e:  # no guess that shares only the "--" and a letter or two
        parse_cell_line("--bogus 3")
    # it said no more than "unrecognized arguments: --bogus 3": no fix
    assert str(e.value) == "unrecognized arguments: --bogus 3 (%%lm --help lists the options)"
    for line, message in [("--temprature 0", "unrecognized arguments: --temprature 0 (did you mean: --temprature → "
                                             "--temperature?)"),
                          ("--bogus --qiet", "unrecognized arguments: --bogus --qiet (did you mean: --qiet → --quiet?; "
                                             "%%lm --help lists the options)"),
                          ("3", "unrecognized arguments: 3 (%%lm --help lists the options)"),
                          ("--qiet", "did you mean: --qiet → --quiet?"),
                          ("--state s --apend", "did you mean: --apend → --append?"),
                          # a prefix of an option, taken for it as the kernel's magic did: both refuse it
                          ("--temp 0", "unrecognized arguments: --temp 0 (did you mean: --temp → --temperature?)"),
                          # a prefix of two options: it offered --state alone (difflib's pick), and for --st nothing
                          ("--sta s", "unrecognized arguments: --sta s (--sta begins --state and --static; write the "
                                      "option in full)"),
                          ("--st x --qiet", "unrecognized arguments: --st x --qiet (did you mean: --qiet → --quiet?; "
                                            "--st begins --state and --static; write the option in full)"),
                          # it would do nothing, silently
                          ("--append", "--append only applies to a --state cell; add --state NAME, or remove --append"),
                          ("--temperature nan", "--temperature: must be a finite number >= 0"),
                          # it said "did you mean: --python → --python?"
                          ("-- --python", "unrecognized arguments: -- --python ('--' ends the options; remove it)"),
                          # argparse kept the last silently: this cell sampled
                          ("--temperature 0 --temperature 1", "--temperature is given twice; give it once"),
                          ("--state a --out x --state b", "--state is given twice; give it once"),
                          # a flag too: argparse's store_true took --quiet --quiet as one
                          ("--quiet --static --quiet", "--quiet is given twice; give it once"),
                          ("--python --python", "--python is given twice; give it once")]:
        with pytest.raises(CellLineError, match=re.escape(message)):
            parse_cell_line(line)


@pytest.mark.parametrize("command, words, message", [
    ("load", ["m", "--dtype", "float32", "--dtype", "float16"], "--dtype is given twice; give it once"),
    ("load", ["--random-weights", "--random-weights"], "--random-weights is given twice; give it once"),
    ("connect", ["http://h:9", "--timeout", "5", "--timeout", "9"], "--timeout is given twice; give it once"),
    ("connect", ["http://h:9", "--completion", "--openai", "m", "--completion"],
     "--completion is given twice; give it once"),
])
def test_a_backend_line_option_given_twice_is_refused(command, words, message):
    """``%lm load`` / ``%lm connect`` kept the last of a repeated option silently, as ``%%lm`` did."""
    from lmnb.template.cell_options import parse_backend_line

    with pytest.raises(CellLineError) as e:
        parse_backend_line(command, words)
    assert str(e.value) == message


@pytest.mark.parametrize("line, message", [
    ("%lm load demo --devise cpu", "unrecognized arguments: --devise cpu (did you mean: --devise → --device?)"),
    ("%lm connect http://h:9 --api_key k", "unrecognized arguments: --api_key k (did you mean: --api_key → --api-key?)"),
    ("%lm connect http://h:9 --bogus", "unrecognized arguments: --bogus (%lm connect --help lists the options)"),
    ("%lm connect http://h:9 extra", "unrecognized arguments: extra (%lm connect --help lists the options)"),
    # a prefix of an option was taken for it (argparse's abbreviations), as by the kernel's %lm load
    ("%lm load demo --dtyp float32", "unrecognized arguments: --dtyp float32 (did you mean: --dtyp → --dtype?)"),
])
def test_a_backend_lines_misspelt_option_is_offered_the_closest(line, message):
    """Exporting a notebook whose ``%lm load`` line misspelt an option said "unrecognized arguments:
    --devise cpu" and no more, where the kernel's ``%lm load`` offers ``--device``; now the same words.
    A prefix of an option (``--dtyp``), which both took for it, both refuse."""
    from helpers_export import notebook
    from lmnb.export import ExportError, export_notebook

    with pytest.raises(ExportError) as e:
        export_notebook(notebook(line, 'q = "x"', "%%lm\n{q}{gen a max_tokens=1}"), "nb.ipynb", "job.py")
    assert str(e.value) == f"cell 1: {line}: {message}"


def test_a_load_lines_pool_size_that_is_no_whole_number_is_named_in_words():
    """``%lm load --max-total-tokens 4k`` said argparse's "invalid int value: '4k'"."""
    from lmnb.template.cell_options import parse_backend_line

    with pytest.raises(CellLineError) as e:
        parse_backend_line("load", ["--max-total-tokens", "4k"])
    assert str(e.value) == ("argument --max-total-tokens: must be the KV pool's size as a whole number of tokens "
                            "(e.g. 4096), got '4k'")


def test_a_backend_line_option_given_once_is_read():
    from lmnb.template.cell_options import parse_backend_line

    load = parse_backend_line("load", ["m", "--dtype", "float16", "--random-weights"])
    assert (load.model, load.dtype, load.random_weights) == ("m", "float16", True)
    connect = parse_backend_line("connect", ["http://h:9", "--timeout", "5", "--completion"])
    assert (connect.url, connect.timeout, connect.completion, connect.openai) == ("http://h:9", 5.0, True, None)


def test_lmnb_export_refuses_an_option_given_twice(tmp_path, capsys):
    """``lmnb export nb.ipynb -o a.py -o b.py`` wrote b.py only, silently."""
    from lmnb_kernel.cli import main

    for words, option in [(["-o", "a.py", "--output", "b.py"], "-o/--output"), (["--inputs", "q", "--inputs", "r"], "--inputs")]:
        with pytest.raises(SystemExit) as e:
            main(["export", str(tmp_path / "nb.ipynb"), *words])
        assert e.value.code == 2
        assert capsys.readouterr().err.rstrip().endswith(f"lmnb export: error: {option} is given twice; give it once")
    assert not list(tmp_path.iterdir())


def test_script_is_plain_python_with_one_function_per_lm_cell(tmp_path):
    source, plan = export_notebook(QA, "qa.ipynb", "qa.py")
    tree = ast.parse(source)
    imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imports |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imports == {"lmnb", "lmnb.batch", "lmnb.template"}  # (lmnb.template: QA's {fork ... in examples})
    assert "get_ipython" not in source and "%lm" not in source.replace("# %lm", "").replace("%%lm", "")
    # every %%lm cell is one @lmnb.function whose source is the cell parser's own translation
    lm_cells = {i: c.source for i, c in enumerate(QA.cells, start=1) if c.source.startswith("%%lm")}
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                 and any(ast.unparse(d) == "lmnb.function" for d in n.decorator_list)}
    assert functions == {f"cell_{i}" for i in lm_cells}
    first = lm_cells[6].split("\n", 1)[1]
    assert parse(first).to_python("cell_6", parameters=("prompt",)) in source
    # Python cells keep their order; display-only commands become comments
    order = [source.index(code) for code in ('examples = ["red", "blue"]', 'prompt = f"Q: {question}\\nA:"',
                                             "short = answer.strip()[:8]")]
    assert order == sorted(order)
    assert "# %lm stats: display only, dropped" in source and "# %lm tree: display only, dropped" in source


def test_script_imports_neither_ipython_nor_torch_and_parameters_are_options(tmp_path):
    script = tmp_path / "qa.py"
    script.write_text(export_notebook(QA, "qa.ipynb", "qa.py")[0])
    probe = ("import runpy, sys\nsys.argv = ['qa.py', '--help']\n"
             "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit:\n    pass\n"
             # (lmnb_engine's package itself is cheap: it names $LMNB_MODEL for every front end,
             # cli_options holds the argparse actions every lmnb command line shares, and tokenizer,
             # standard library only until a tokenizer loads, the lone-surrogate check params uses;
             # json_schema, standard library only until a schema is checked, writes values as JSON,
             # and regex_errors with the modules it asks (regex_parts, regex_python_error, regex_edges,
             # regex_references, regex_unicode_classes, regex_ambiguous_class, regex_class_spelling,
             # regex_automaton, regex_stop_posix), which word a bad stop_regex for params, reading Python's parser
             # through regex_tree, with regex_u_flag's pattern of other dialects' back-references, and regex_empty_class with regex_dead_part, which find a class
             # matching no character in a stop_regex, and regex_never with regex_reach, which find an
             # assertion that keeps a stop_regex from ever matching, and suggest, the did-you-mean of
             # params' unknown fields, standard library only as well)
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'IPython', 'torch', 'transformers', 'lmnb_kernel'}"
             " | {m for m in sys.modules if m.startswith('lmnb_engine.')}"
             " - {'lmnb_engine.outputs', 'lmnb_engine.params', 'lmnb_engine.cli_options', 'lmnb_engine.tokenizer',"
             " 'lmnb_engine.json_schema', 'lmnb_engine.regex_errors', 'lmnb_engine.regex_tree',"
             " 'lmnb_engine.regex_empty_class', 'lmnb_engine.regex_dead_part', 'lmnb_engine.regex_never',"
             " 'lmnb_engine.regex_reach', 'lmnb_engine.suggest', 'lmnb_engine.regex_u_flag',"
             " 'lmnb_engine.regex_parts', 'lmnb_engine.regex_python_error', 'lmnb_engine.regex_edges',"
             " 'lmnb_engine.regex_references', 'lmnb_engine.regex_unicode_classes', 'lmnb_engine.regex_ambiguous_class',"
             " 'lmnb_engine.regex_class_spelling', 'lmnb_engine.regex_automaton', 'lmnb_engine.regex_stop_posix'}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("[]")
    for option in ("--input", "--output", "--backend", "--model", "--num-threads", "--limit", "--id-field", "--max-len"):
        assert option in out.stdout


def test_row_fields_are_the_examples_the_programs_depend_on():
    p = plan_notebook(QA)
    assert p.inputs == ("question",)
    assert p.parameters == ("max_len",) and p.parameters_cell == 2
    # cell 5 builds the prompt from the example, so it runs per row; cells 3-4 run once
    assert [c.index for c in p.setup if hasattr(c, "source")] == [2, 3, 4]
    assert [c.index for c in p.row if hasattr(c, "source") or hasattr(c, "options")] == [5, 6, 7, 8, 9, 10]
    assert p.lm_params == {6: ("prompt",), 8: ("short",), 9: ("short",)}  # examples, max_len: globals
    assert plan_notebook(CHAT).inputs == ("person", "topic")


def test_example_in_the_same_cell_as_code_that_uses_it_is_commented_out_per_row():
    nb = notebook('question = "Why?"\nprompt = "Q: " + question',
                  "%%lm --temperature 0\n{prompt}{gen a max_tokens=2}")
    source, p = export_notebook(nb)
    assert p.inputs == ("question",)
    body = source[source.index("def run_row(question):"):]
    assert '# question = "Why?"  <- notebook example; each row gives question' in body
    assert '    prompt = "Q: " + question' in body
    with pytest.raises(ExportError, match="line of its own"):
        export_notebook(notebook('x = 1; question = "Why?"\nprompt = "Q: " + question',
                                 "%%lm\n{prompt}{gen a}"))


def test_inputs_option_overrides_and_is_checked():
    nb = notebook('question = "Why?"\ncontext = open("doc.txt").read() if False else "ctx"',
                  "%%lm\n{context} {question}{gen a}")
    assert plan_notebook(nb).inputs == ("question",)  # context is computed, so it stays a global
    assert plan_notebook(nb, inputs=["context", "question"]).inputs == ("context", "question")
    with pytest.raises(ExportError, match="never read it$"):  # nothing close to suggest
        plan_notebook(nb, inputs=["nope"])
    # a typo was told only "never read it": the variables the rows read that are closest are named
    with pytest.raises(ExportError, match=r"^--inputs questoin, contxt: the cells that run per row never read them; "
                                          r"did you mean question, context\?$"):
        plan_notebook(nb, inputs=["questoin", "contxt"])
    # a variable a later cell reads but a gen produces: it was kept as a field, then left out of the script
    chain = notebook('question = "Why?"', "%%lm\n{question}{gen answer}", "%%lm\nSo: {answer}{gen b}")
    with pytest.raises(ExportError, match="--inputs answer: the %%lm cell 2 sets answer in each row"):
        plan_notebook(chain, inputs=["question", "answer"])
    derived = notebook('question = "Why?"', "%%lm\n{question}{gen answer}", "short = answer[:5]",
                       "%%lm\nSo: {short}{gen b}")
    with pytest.raises(ExportError, match="--inputs short: the cell 3 sets short in each row"):
        plan_notebook(derived, inputs=["short"])
    assert plan_notebook(derived, inputs=["question"]).inputs == ("question",)  # its example value is stripped
    params = notebook(("parameters", 'person = "Ada"\nn = 2'), "%%lm\n{person}{gen a max_tokens=n}")
    assert (plan_notebook(params).inputs, plan_notebook(params).parameters) == ((), ("person", "n"))
    source, p = export_notebook(params, inputs=["person"])  # a parameter named as input is a row field
    assert (p.inputs, p.parameters) == (("person",), ("n",))
    assert "def run_row(person):" in source and "params = job.parameters(n=n)" in source
    # a field named twice is one field (it was run_row(person, person): "the script does not compile")
    source, p = export_notebook(params, inputs=["person", "person"])
    assert p.inputs == ("person",) and "def run_row(person):" in source
    # a name in another Unicode form is Python's same name (NFKC): it was "never read"
    source, p = export_notebook(params, inputs=["ｐｅｒｓｏｎ", "person"])
    assert p.inputs == ("person",) and "def run_row(person):" in source
    once = plan_notebook(notebook("x = 1"))
    assert once.row == [] and any("runs its cells once" in n for n in once.notes)
    with pytest.raises(ExportError, match="no %%lm cell"):
        plan_notebook(notebook("x = 1"), inputs=["x"])


def test_a_notebook_without_lm_cells_is_told_what_its_script_leaves_out(tmp_path, capsys):
    """Its plan returned before the notes on dropped cells and lines: a %%bash cell, a !ls line or an
    unknown %lm command went unnoted, as a notebook with %%lm cells has them noted; none of the
    notes that need a per-row part ("no row fields") is added."""
    from lmnb_kernel.cli import main

    nb = notebook("%%bash\necho hi", "!ls\nx = 1", "%lm frob", "%lm load m --dtype float16", "%%capture out\nprint(1)",
                  ("md", "hi"))
    nb.cells[-1].cell_type = "markdwon"  # (noted outside the plan, as before)
    assert plan_notebook(nb).notes == [
        "the notebook has no %%lm cell: the script runs its cells once, with no input rows",
        "cell 1: dropped %%bash (IPython cell magic %%bash: its body is not Python)",
        "cell 2: dropped IPython syntax '!ls' (not plain Python)",
        "cell 3: dropped unknown command '%lm frob'",
        "cell 4: %lm load m --dtype float16: --dtype not carried into the job; pass the job's own options "
        "(e.g. --dtype, --api-key) where it has them",
        "cell 5: %%capture out: the job does not set out (IPython's captured output), so a cell that reads it "
        "fails there",
        'cell 6: left out, its cell_type "markdwon" is none Jupyter knows, so no Jupyter runs or shows it; write '
        '"code", "markdown" or "raw" in the file\'s JSON',
    ]
    nbformat.write(notebook("%%bash\necho hi", "x = 1"), tmp_path / "plain.ipynb")
    assert main(["export", str(tmp_path / "plain.ipynb")]) == 0
    assert (f"lmnb export: {tmp_path / 'plain.ipynb'}: cell 1: dropped %%bash (IPython cell magic %%bash: its body "
            "is not Python)") in capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("cell, words", [
    ("%%lm\nQ: {gen a max_token=3}", ["cell 2", "max_token"]),
    ("%%lm --heat 0\nQ: {gen a}", ["cell 2", "--heat"]),
    ("%%lm --state 'bad name'\nQ: {gen a}", ["cell 2", "not a valid name"]),
    ("%%lm\n", ["cell 2", "empty"]),
])
def test_bad_cells_are_reported_with_their_cell_number(cell, words):
    with pytest.raises(ExportError) as e:
        export_notebook(notebook("x = 1", cell))
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("cell, message", [
    # the kernel refuses these before they run (lmnb.template.cell_options.check_cell_names); the
    # export wrote a job of them, though the notebook could never have run the cell
    ("%%lm --out o\nQ: {gen o max_tokens=1}",
     "cell 2 (%%lm): --out o is also a variable the cell captures ({gen o}/{select o}), which --out would "
     "overwrite with the program state; give --out another name, e.g. --out o_state"),
    # the name offered is none of the cell's own: it offered o_state, Out_ where the cell captured them too
    ("%%lm --out o\nQ: {gen o max_tokens=1}{gen o_state max_tokens=1}",
     "cell 2 (%%lm): --out o is also a variable the cell captures ({gen o}/{select o}), which --out would "
     "overwrite with the program state; give --out another name, e.g. --out o_state_"),
    ("%%lm\nQ: {gen Out max_tokens=1} {gen Out_ max_tokens=1}",
     "cell 2 (%%lm): the result 'Out' would replace IPython's Out, one of the names it defines for itself (In, Out, "
     "_ih, _oh, _dh, exit, quit), which IPython and later cells read ({gen Out} made every cell that shows a value "
     "fail); rename it, e.g. Out__"),
    ("%%lm --out builtins\nQ: {gen __builtins__ max_tokens=1}",
     "cell 2 (%%lm): the result '__builtins__' is a dunder name (__...__), which Python and IPython keep for "
     "themselves: as a kernel variable it could break every later cell (__builtins__ made each one fail); rename "
     "it, e.g. builtins_"),
    ("%%lm\nQ: {select get_ipython choices=['a', 'b']}",
     "cell 2 (%%lm): the result 'get_ipython' would replace IPython's get_ipython, which every magic (%%lm and "
     "%lm included) calls, so no magic could run after this cell; rename it, e.g. get_ipython_"),
    ("%%lm --python --out get_ipython\ns += 'Q:'",
     "cell 2 (%%lm): --out 'get_ipython' would replace IPython's get_ipython, which every magic (%%lm and %lm "
     "included) calls, so no magic could run after this cell; rename it, e.g. get_ipython_"),
    ("%%lm --out lmnb\nQ: {gen a max_tokens=1}",  # (it was warned about only, found by a review)
     "cell 2 (%%lm): --out 'lmnb' would replace the lmnb module, which %%lm --python bodies call (lmnb.gen, "
     "lmnb.select), so every later --python cell would fail; rename it, e.g. lmnb_"),
    ("%%lm\nQ: {gen lmnb max_tokens=1}",
     "cell 2 (%%lm): the result 'lmnb' would replace the lmnb module, which %%lm --python bodies call (lmnb.gen, "
     "lmnb.select), so every later --python cell would fail; rename it, e.g. lmnb_"),
    # (only warned about: {gen print} hid print() from every later cell, {gen type} type())
    ("%%lm\nQ: {gen print max_tokens=1}",
     "cell 2 (%%lm): the result 'print' would hide Python's builtin print: it becomes a kernel variable, which every "
     "later cell reads instead, and a later hole of this cell calling print(...) would call the result; rename "
     "it, e.g. print_"),
    # (a Python body has no holes: it said "and a later hole of this cell calling type(...) would call the result")
    ("%%lm --python\ns += 'Q:' + lmnb.select('type', choices=['a', 'b'])",
     "cell 2 (%%lm): the result 'type' would hide Python's builtin type: it becomes a kernel variable, which every "
     "later cell reads instead; rename it, e.g. type_"),
    ("%%lm --out vars\nQ: {gen a max_tokens=1}",
     "cell 2 (%%lm): --out 'vars' would hide Python's builtin vars: it becomes a kernel variable, which every "
     "later cell reads instead; rename it, e.g. vars_"),
    # (IPython's, a builtin in the kernel only: refused here too; the message called it Python's)
    ("%%lm\nQ: {gen display max_tokens=1}",
     "cell 2 (%%lm): the result 'display' would hide IPython's display, which a kernel adds to the builtins: it "
     "becomes a kernel variable, which every later cell reads instead, and a later hole of this cell calling "
     "display(...) would call the result; rename it, e.g. display_"),
    # (each broke the kernel's later cells, {gen __builtins__} every Python cell, or was overwritten by IPython)
    ("%%lm\nQ: {gen __builtins__ max_tokens=1}",
     "cell 2 (%%lm): the result '__builtins__' is a dunder name (__...__), which Python and IPython keep for "
     "themselves: as a kernel variable it could break every later cell (__builtins__ made each one fail); rename "
     "it, e.g. builtins"),
    ("%%lm --out Out\nQ: {gen a max_tokens=1}",
     "cell 2 (%%lm): --out 'Out' would replace IPython's Out, one of the names it defines for itself (In, Out, _ih, "
     "_oh, _dh, exit, quit), which IPython and later cells read ({gen Out} made every cell that shows a value fail); "
     "rename it, e.g. Out_"),
    ("%%lm --python\ns += 'Q:' + lmnb.gen('_i2', max_tokens=1)",
     "cell 2 (%%lm): the result '_i2' is one of IPython's history names (_, __, ___, _i, _ii, _iii, _iN, _N), which "
     "IPython sets itself as cells run: it would overwrite the result, or the result its history; rename it, e.g. "
     "i2"),
])
def test_cells_the_kernel_refuses_are_refused_at_export_with_its_message(cell, message):
    with pytest.raises(ExportError) as e:
        export_notebook(notebook("x = 1", cell))
    assert str(e.value) == message


def test_a_python_cells_out_naming_its_literal_gen_is_refused_as_in_the_kernel():
    # the kernel ran this cell (it knew a --python body's names only as it ran) and --out overwrote the
    # gen's variable with the state; it reads a literal name before the cell runs now: so does the export
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "x"', "%%lm --python --out o\ns += q + lmnb.gen('o', max_tokens=1)"))
    assert str(e.value).startswith("cell 2 (%%lm): --out o is also a variable the cell captures")
    # a name computed as it runs is known only then, in the kernel too
    _, p = export_notebook(notebook('q = "x"', "%%lm --python --out o\ns += q + lmnb.gen(q[:0] + 'o', max_tokens=1)"))
    assert p.lm_cells[0].options.out == "o"


@pytest.mark.parametrize("cells, words", [
    # each was written into a script that failed at import (SyntaxError, NameError, RecursionError)
    (["import asyncio\nawait asyncio.sleep(0)"], ["cell 3, line 2: top-level await", "asyncio.run"]),
    (["files = !ls\nn = len(files)"], ["cell 3: 'files = !ls' assigns what IPython syntax computes"]),
    (["%%lm\n" + "\n".join('{d["k"]}{q[:3]}' for _ in range(1500))],
     ["the exported script does not compile: RecursionError"]),
])
def test_notebooks_whose_script_could_not_run_are_refused_at_export(cells, words):
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "x"\nd = {"k": 1}', "%%lm\n{q}{gen a max_tokens=1}", *cells))
    for w in words:
        assert w in str(e.value)


def test_timing_magics_keep_their_statement_and_imports_are_no_parameters(tmp_path, capsys):
    from lmnb_kernel.cli import main

    nb = notebook(("parameters", "import os\nlimit = 2"), "%time x = 5\n%timeit -n1 -r1 z = 3",
                  ("md", "broken \ud83d character"), 'q = "x"', "%%lm\n{q}{x}{limit}{gen a max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.parameters == ("limit",) and p.inputs == ("q",)  # x was a row field: its cell was dropped
    # (IPython runs %timeit's statement in a function of its own: z is not set; the job runs it once)
    assert "\nx = 5\ndef _timeit_body(): z = 3\n_timeit_body()\n" in source
    nb_path = tmp_path / "nb.ipynb"
    nb_path.write_text(json.dumps(nb))  # (json escapes the surrogate, as in a real file; nbformat.write fails)
    assert main(["export", str(nb_path), "-o", str(tmp_path / "job.py")]) == 0  # a lone surrogate: UnicodeEncodeError
    compile((tmp_path / "job.py").read_text(encoding="utf-8"), "job.py", "exec")


def test_the_names_a_timeit_body_binds_are_not_set_in_the_job_as_in_the_kernel(tmp_path, monkeypatch):
    # IPython runs a %%timeit body (and %timeit's statement) in a function of its own, so the kernel
    # kept w = 1; the script ran the body at module level or in run_row, and set w = 2
    # (found by the last review)
    from helpers_export import write_rows

    setup = 'q = "A"\nu = w = v = 1\nseen = []'
    timed_setup = '%%timeit -n1 -r1\nu = 2'
    timed_row = '%%timeit -n1 -r1 t = q * 2\nw = 2\nseen.append(t)'  # (t = ...: setup code, before the body)
    timed_line = 'if True:\n    %timeit -n1 -r1 v = 2'
    nb = notebook(setup, timed_setup, "%%lm --temperature 0\n{q}{gen x max_tokens=1}", timed_row, timed_line,
                  "%%lm --temperature 0\n{u} {w} {v} {seen}{gen y max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.inputs == ("q",) and "u" not in p.copied and "w" not in p.copied
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "A"}]), 0)
    # as the kernel has them (IPython's %%timeit -n1 -r1: u, w, v stay 1; the body ran once)
    assert prompts == ["A", "1 1 1 ['AA']"]


@pytest.mark.parametrize("cells", [
    ["%%timeit -n1 -r1\nglobal g\ng = q + '!'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}"],
    ["%%lm --temperature 0\n{q}{gen x max_tokens=1}", "%%timeit -n1 -r1\nglobal g\ng = q + '!'"],
    ["def f():\n    global g\n    g = q + '!'\nf()", "%%lm --temperature 0\n{q}{gen x max_tokens=1}"],
])
def test_a_name_a_function_or_timeit_body_declares_global_is_bound_by_its_cell(tmp_path, monkeypatch, cells):
    # the exporter did not see `global g` inside a function (a %%timeit body runs in one), so a later
    # %%lm cell that read g made it a row field, and every row was bad_input "missing field 'g'"
    from helpers_export import write_rows

    nb = notebook('q = "A"', *cells, "%%lm --temperature 0\n{g}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.inputs == ("q",)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    # the notebook's g: IPython runs a %%timeit body in a function whose globals are the notebook's,
    # so `global g` sets the notebook's g, as f() does
    assert prompts == ["B", "B!"]
    # the cell runs per row (it reads the row's q): its g is the script's global, which rows share
    index = next(i for i, c in enumerate(cells, start=2) if not c.startswith("%%lm"))
    assert (f"cell {index}: a function of this cell, which runs per row, sets g by `global`: the rows share the "
            "script's globals, so rows running at once (--num-threads above 1) may read each other's value; return "
            "the value from the function instead, or run the job with --num-threads 1") in p.notes


_BUMP = "def bump():\n    global count\n    count += 1\n"


@pytest.mark.parametrize("setup, cells", [
    ("", ["count = 0\n" + _BUMP + "bump()\nr = str(count)"]),
    ("", ["count = 0\n" + _BUMP + "from math import *\nbump()\nr = str(count)"]),
    ("count = 0\n" + _BUMP, ["from math import *\nbump()\nr = str(count)"]),  # (run_row's copy of count)
    ("", ["def more():\n    global x\n    x = x + '?'\nmore()\nr = x"]),  # (x: cell 2's gen)
])
def test_a_variable_a_cell_and_a_functions_global_both_set_is_one_in_run_row(tmp_path, monkeypatch, setup, cells):
    # count = 0 in a per-row cell made count run_row's variable, while bump() set the script's global:
    # bump() failed every row with NameError, or the row read its own count (or {gen x}'s x) unchanged;
    # after a per-row star import, run_row read its own copy of the set-up's count
    from helpers_export import write_rows

    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    notebook_ns = {}  # the set-up, cell 2's gen as the job's backend answers, then the row's cells in order
    exec(setup, notebook_ns)
    notebook_ns["x"] = "!"
    for code in cells:
        exec(code, notebook_ns)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert prompts == ["B", notebook_ns["r"]] and notebook_ns["r"] in ("1", "!?")


@pytest.mark.parametrize("setup, cell", [
    ('stats = {"calls": 0}\ndef bump():\n    stats["calls"] += 1', 'stats["row"] = q\nbump()\nr = str(stats)'),
    ("log = []\ndef note(x):\n    log.append(x)", "log.append(q)\nnote(q)\nr = str(len(log))"),
])
def test_a_setup_container_a_called_function_and_a_row_cell_change_in_place_is_one_object(tmp_path, monkeypatch,
                                                                                         setup, cell):
    # the row cell's change made stats a row copy (job.row_copy) while bump() changed the script's
    # one: the row read {'calls': 0, 'row': 'B'}, the notebook {'calls': 1, 'row': 'B'}. One object
    # now, as the function-only case was: within a row as the notebook, and it carries over between rows
    from helpers_export import write_rows

    nb = notebook(f'import lmnb\n{setup}', 'q = "A"', "%%lm --temperature 0\n{q}{gen a max_tokens=2}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    notebook_ns = {}  # the set-up once, then each row's cell with its q, in one namespace: the documented carry-over
    exec(setup, notebook_ns)
    expected = []
    for q in ("B", "C", "D"):
        notebook_ns["q"] = q
        exec(cell, notebook_ns)
        expected += [q, notebook_ns["r"]]
    rows = write_rows(tmp_path / "rows.jsonl", [{"q": "B"}, {"q": "C"}, {"q": "D"}])
    _, prompts = _run_job_rows(source, monkeypatch, rows, 0, ["--num-threads", "1"])
    assert prompts == expected and expected[1] in ("{'calls': 1, 'row': 'B'}", "2")
    name = setup.split()[0]
    assert name not in p.copied and f"row_copy(globals()[\"{name}\"])" not in source
    assert any(n.startswith(f"cell 1: {name}, which a function of this cell (run once) changes in place, is changed "
                            "in place per row too") and "what one row changes, the next row sees" in n for n in p.notes)


def test_a_setup_container_only_a_called_function_changes_in_place_is_noted_as_carried_over():
    # cache grows across rows in the job (one object, as the README says) where each notebook pass
    # starts from {}: the export noted nothing (a new-user pass found a resumed run's rows differ)
    setup = "cache = {}\ndef remember(k, v):\n    cache[k] = v\n    return len(cache)"
    nb = notebook(f"import lmnb\n{setup}", 'q = "A"', "%%lm --temperature 0\n{q}{gen a max_tokens=2}",
                  "n = remember(q, a)", "%%lm --temperature 0\n{n}{gen z max_tokens=1}")
    _, p = export_notebook(nb)
    assert [n for n in p.notes if "cache" in n] == [
        "cell 1: cache, which a function of this cell (run once) changes in place, is changed by the rows' calls: "
        "the job keeps one cache, the script's, where each pass of the notebook starts from the set-up's (a memo "
        f"cache gives the same results either way): what one row changes, the next row sees, and the rows share it, "
        f"{importlib.import_module('lmnb.export.notes_wording')._RACE}"]
    _, p = export_notebook(notebook(f"import lmnb\n{setup}", 'q = "A"', "%%lm --temperature 0\n{q}{gen a max_tokens=2}",
                                    "n = len(q)", "%%lm --temperature 0\n{n}{gen z max_tokens=1}"))
    assert not [n for n in p.notes if "cache" in n]  # (no row calls remember)
    # two such containers: one note in the plural (it said "cache, seen, ... is changed ... keeps one cache, seen")
    setup2 = "cache = {}\nseen = []\ndef remember(k, v):\n    cache[k] = v\n    seen.append(k)\n    return len(cache)"
    _, p = export_notebook(notebook(f"import lmnb\n{setup2}", 'q = "A"', "%%lm --temperature 0\n{q}{gen a max_tokens=2}",
                                    "n = remember(q, a)", "%%lm --temperature 0\n{n}{gen z max_tokens=1}"))
    assert [n for n in p.notes if "cache" in n] == [
        "cell 1: cache, seen, which a function of this cell (run once) changes in place, are changed by the rows' "
        "calls: the job keeps one of each, the script's, where each pass of the notebook starts from the set-up's (a "
        "memo cache gives the same results either way): what one row changes, the next row sees, and the rows share "
        f"them, {importlib.import_module('lmnb.export.notes_wording')._RACE}"]


def test_a_name_an_lm_cell_reads_that_only_a_later_cell_sets_is_noted():
    """Run out of order in Jupyter (cell 2 first), the notebook worked; its script runs the cells in
    order, and every row failed with NameError, told to fix its input, without a word at export."""
    nb = notebook('%%lm --temperature 0\nQ: Where does {person} live?\nA:{gen city max_tokens=5}',
                  'person = "Arvel"\nq = "x"', "%%lm\n{q}{city}{gen more max_tokens=1}", "%%lm\n{more}{q}")
    _, p = export_notebook(nb)
    assert [n for n in p.notes if "later cell" in n] == [
        "cell 1: the %%lm cell reads person, which only a later cell, 2, sets: the script runs the cells in the "
        "notebook's order, so every row would fail with NameError (in Jupyter, running cell 2 first hides it); move "
        "the code that sets person above cell 1"]
    # set above too (the later cell sets it again), a star import above that may set it: no note
    for cells in (('person = "Arvel"', *nb.cells[0:1], 'person = "Bexa"'),
                  ("from math import *", "%%lm --temperature 0\n{pi}{gen city max_tokens=5}", "pi = 3")):
        cells = [c.source if not isinstance(c, str) else c for c in cells]
        _, p = export_notebook(notebook(*cells))
        assert not [n for n in p.notes if "later cell" in n], p.notes


_LM_FIRST = "%%lm --temperature 0\n{q}{gen a max_tokens=2}"


@pytest.mark.parametrize("defined, cell, through", [
    ("greet = lambda: person", "{greet()}", "greet (cell 3)"),
    ("def g():\n    return person\ndef f():\n    return g()", "{f()}", "f (g of cell 3 reads it)"),
    ("def g():\n    return person\nf = lambda: g().upper()", "{f()}", "f (g of cell 3 reads it)"),
    ("handlers = {'a': lambda: person}", "{handlers['a']()}", "handlers (cell 3)"),
    ("def f():\n    return person", "--python\ns += f()", "f (cell 3)"),
])
def test_a_name_a_function_the_lm_cell_uses_reads_that_only_a_later_cell_sets_is_noted(defined, cell, through):
    """A function or lambda of an earlier cell, or one such a function calls, that reads a name only
    a later cell sets: as the %%lm cell's own read of it, every row failed with NameError (cell 4
    runs before cell 5 sets person), but only the cell's own reads were noted."""
    lm = f"%%lm {cell}" if cell.startswith("--") else f"%%lm --temperature 0\n{{q}}{cell}{{gen b max_tokens=2}}"
    _, p = export_notebook(notebook('q = "x"', _LM_FIRST, defined, lm, 'person = "A"'))
    assert [n for n in p.notes if "later cell" in n] == [
        f"cell 4: the %%lm cell reads person through {through}, which only a later cell, 5, sets: the script runs the "
        "cells in the notebook's order, so every row would fail with NameError (in Jupyter, running cell 5 first hides "
        "it); move the code that sets person above cell 4"]


@pytest.mark.parametrize("cells", [
    # (set above the %%lm cell too; the function the cell calls is a later cell's; it sets the name by `global`
    # before it reads it; the name is a builtin until the later cell binds it; only a method reads it)
    ("def g():\n    return person\ndef f():\n    return g()", 'person = "B"', "%%lm\n{q}{f()}", 'person = "A"'),
    ("def f():\n    return q", "%%lm\n{q}{f()}", "def f():\n    return person", 'person = "A"'),
    ("def f():\n    global person\n    person = q\n    return person", "%%lm\n{q}{f()}", 'person = "A"'),
    ("f = lambda: str(len(q))", "%%lm\n{q}{f()}", "len = 3"),
    ("def h():\n    return person\nclass C:\n    name = 'n'\n    def m(self):\n        return h()\nc = C()",
     "%%lm\n{q}{c.name}", 'person = "A"'),
])
def test_a_function_the_lm_cell_uses_reading_a_name_set_before_it_runs_is_not_noted(cells):
    _, p = export_notebook(notebook('q = "x"', _LM_FIRST, *cells))
    assert not [n for n in p.notes if "later cell" in n], p.notes


_LATER = ("the script runs the cells in the notebook's order, so every row would fail with NameError (in Jupyter, "
          "running cell {later} first hides it); move the code that sets {n} above cell {cell}")


@pytest.mark.parametrize("cells, said", [
    (["n = person + a"], "cell 3: the cell reads person, which only a later cell, 4, sets: "),
    (["def f():\n    return person", "n = f()"], "cell 4: the cell reads person through f (cell 3), which only a later "
                                                "cell, 5, sets: "),
    (["def f():\n    return person\nn = f() + a"], "cell 3: the cell reads person through f (cell 3), which only a "
                                                  "later cell, 4, sets: "),
])
def test_a_python_cell_run_per_row_reading_a_name_only_a_later_cell_sets_is_noted(tmp_path, monkeypatch, cells, said):
    """A per-row Python cell that reads a name only a later cell sets, itself or through a function,
    failed every row of the job with NameError, with no note: only %%lm cells were checked."""
    from helpers_export import write_rows

    *_, last = cells
    nb = notebook('q = "x"', _LM_FIRST, *cells, 'person = "A"', "%%lm --temperature 0\n{n}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    later = 3 + len(cells)
    assert [n for n in p.notes if "later cell" in n] == [
        said + _LATER.format(later=later, n="person", cell=later - 1)]
    results, _ = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}, {"q": "C"}]))
    # (UnboundLocalError, a NameError, where run_row binds person below: the job's summary takes it for one)
    assert [(r["status"], r["error"].split(":")[0] in ("NameError", "UnboundLocalError"), "'person'" in r["error"])
            for r in results] == [("error", True, True)] * 2


def test_a_set_up_cell_reading_a_name_only_a_later_cell_sets_is_noted():
    """The same read in a cell that runs once stopped the job before any row, with no word on cell 3."""
    _, p = export_notebook(notebook('q = "x"\nn = str(count)', _LM_FIRST, "count = 1"))
    assert p.notes == [
        "cell 1: the cell reads count, which only a later cell, 3, sets: the script runs the cells in the notebook's "
        "order, so the job would stop in its set-up with NameError before any row ran (in Jupyter, running cell 3 "
        "first hides it); move the code that sets count above cell 1"]


@pytest.mark.parametrize("cells", [
    # (a function that reads it, called below the cell that sets it; a try that asks whether it is set; the cell
    # sets it before it calls the function, or by a function's `global`; only a method reads it)
    ("def f():\n    return person", 'person = "A"', "n = f()"),
    ("try:\n    cache\nexcept NameError:\n    cache = {}", "cache = {}"),
    ("def f():\n    return person", "person = 'B'\nn = f()", 'person = "A"'),
    ("def setp():\n    global person\n    person = 'B'\nsetp()\nn = person", 'person = "A"'),
    ("class C:\n    def m(self):\n        return person\nc = C()", 'person = "A"'),
])
def test_a_python_cell_reading_a_name_set_before_it_runs_is_not_noted(cells):
    _, p = export_notebook(notebook('q = "x"', _LM_FIRST, *cells))
    assert not [n for n in p.notes if "later cell" in n], p.notes


def test_a_set_up_function_reading_a_name_only_a_later_row_cell_sets_gets_one_note_saying_to_pass_it(tmp_path,
                                                                                                    monkeypatch):
    """f = lambda: person of a set-up cell, called by a %%lm cell above the per-row cell that sets person,
    got two notes: one said to move person's code above the %%lm cell, the other to move f below the
    first %%lm cell, and neither fixes it: moved there, person is the row's variable, which f, run once,
    does not read (every row still fails with NameError). One note says to pass it; f's reads of other
    row variables (topic) keep their note."""
    from helpers_export import write_rows

    call = "%%lm --temperature 0\n{q}{f()}{gen b max_tokens=1}"
    _, p = export_notebook(notebook('q = "x"\nf = lambda: person + topic', _LM_FIRST, 'topic = q', call, 'person = q'))
    assert [n for n in p.notes if " f" in n] == [
        "cell 4: the %%lm cell reads person through f (cell 1), which only a later cell, 5, sets: the script runs the "
        "cells in the notebook's order, so every row would fail with NameError (in Jupyter, running cell 5 first hides "
        "it); f, defined in a cell that runs once, reads the script's globals, not the row's variables: pass person to "
        "f as an argument, and set person above cell 4",
        "cell 1: f, defined in a cell that runs once, reads topic, which the cells that run per row set: in the job it "
        "reads the script's globals, not the row's variables (a NameError, or the value the cells run once set); pass "
        "it as an argument to f, or move f into a cell below the first %%lm cell"]
    _, p = export_notebook(notebook('q = "x"\ndef g():\n    return person\nf = lambda: g()', _LM_FIRST, call,
                                    'person = q'))
    assert p.notes == [
        "cell 3: the %%lm cell reads person through f (g of cell 1 reads it), which only a later cell, 4, sets: the "
        "script runs the cells in the notebook's order, so every row would fail with NameError (in Jupyter, running "
        "cell 4 first hides it); g, defined in a cell that runs once, reads the script's globals, not the row's "
        "variables: pass person to g as an argument, and set person above cell 3"]
    # the code that sets person moved above cell 3 alone: every row still fails; passed too, the rows run as the notebook
    rows = [{"q": "B"}, {"q": "C"}]
    source, _ = export_notebook(notebook('q = "x"\nf = lambda: person', _LM_FIRST, 'person = q + "!"', call))
    results, _ = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "moved.jsonl", rows))
    assert [(r["status"], r["error"].startswith("NameError: name 'person' is not defined")) for r in results] == [
        ("error", True)] * 2
    source, p = export_notebook(notebook('q = "x"\nf = lambda who: who', _LM_FIRST, 'person = q + "!"',
                                         call.replace("f()", "f(person)")))
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "passed.jsonl", rows), 0,
                               ["--num-threads", "1"])
    assert (p.notes, prompts) == ([], ["B", "BB!", "C", "CC!"])


def test_a_bare_annotation_binds_nothing():
    """``x: int`` with no value binds nothing, as Python has it (a read of x after it is a NameError),
    but the export took it for a binding: ``question: str`` above ``question = "What?"`` left no
    row field (the first binding was no string), a %%lm cell's ``{person}`` below ``person: str``
    was no row field (the job's rows failed with NameError), and it hid the note on a name only a
    later cell sets."""
    from lmnb.export.cells import python_cell

    assert python_cell(0, "x: int\ny: int = 1\nif y:\n    z: str\nw: int\nw += 1\nv: int\nimport v").assigns == \
        ("y", "w", "v")
    lm = "%%lm --temperature 0\n{q}{person}{gen a max_tokens=2}"
    _, p = export_notebook(notebook('question: str\nquestion = "What?"', "%%lm\n{question}{gen a max_tokens=2}"))
    assert (p.inputs, p.texts, p.notes) == (("question",), ("question",), [])  # (as `question: str = "What?"`)
    _, p = export_notebook(notebook('q = "x"\nperson: str', lm))
    assert p.inputs == ("q", "person")
    _, p = export_notebook(notebook('q = "x"\nperson: str', lm, 'person = "A"'))
    assert [n for n in p.notes if "later cell" in n] == [
        "cell 2: the %%lm cell reads person, which only a later cell, 3, sets: the script runs the cells in the "
        "notebook's order, so every row would fail with NameError (in Jupyter, running cell 3 first hides it); move "
        "the code that sets person above cell 2"]


@pytest.mark.parametrize("row, kind", [
    ("a()\nb()\nn = str(stats)", "is changed by the rows' calls"),
    ("stats['row'] = q\na()\nb()\nn = str(stats)", "is changed in place per row too"),
])
def test_a_setup_object_functions_of_two_cells_change_gets_one_note_naming_both(row, kind):
    # stats got two notes, "cell 1: stats, ..." and "cell 2: stats, ...", each naming one cell
    nb = notebook("import lmnb\nstats = {'calls': 0}\ndef a():\n    stats['calls'] += 1",
                  "def b():\n    stats['calls'] += 10", 'q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=2}", row,
                  "%%lm --temperature 0\n{n}{gen z max_tokens=1}")
    _, p = export_notebook(nb)
    notes = [n for n in p.notes if "stats" in n]
    assert len(notes) == 1 and notes[0].startswith(
        f"cells 1, 2: stats, which functions of these cells (run once) change in place, {kind}")


def test_a_global_functions_of_two_cells_set_gets_one_note_naming_both():
    nb = notebook("count = 0\ndef a():\n    global count\n    count += 1",
                  "def b():\n    global count\n    count += 10", 'q = "A"',
                  "%%lm --temperature 0\n{q}{gen x max_tokens=2}", "a()\nb()\nn = str(count)",
                  "%%lm --temperature 0\n{n}{gen z max_tokens=1}")
    _, p = export_notebook(nb)
    assert [n for n in p.notes if "count" in n] == [
        "cells 1, 2: count, which functions of these cells (run once) set by `global`, is set per row too (a cell that "
        "runs per row sets it, or calls a function that does): the job keeps one count, the script's global, as the "
        f"notebook does, which the rows share, {importlib.import_module('lmnb.export.notes_wording')._RACE}"]


@pytest.mark.parametrize("setup, noted", [
    ("import re\ncache = re.compile(r'a+')\ndef remember(k, v):\n    return cache.sub('a', v)", False),
    ("cache = {'A': 1}\ndef remember(k, v):\n    return cache.get(k, 0)", False),
    ("cache = {}\ndef remember(k, v):\n    return cache.setdefault(k, v)", True),
])
def test_a_setup_object_a_called_function_only_reads_by_a_method_is_not_noted_as_changed(setup, noted):
    # a method call may change its object (what a per-row copy must allow for), but the note says it
    # is changed: re's sub and dict's get change nothing, dict's setdefault does
    nb = notebook(f"import lmnb\n{setup}", 'q = "A"', "%%lm --temperature 0\n{q}{gen a max_tokens=2}",
                  "n = remember(q, a)", "%%lm --temperature 0\n{n}{gen z max_tokens=1}")
    _, p = export_notebook(nb)
    assert [n.startswith("cell 1: cache, which a function of this cell (run once) changes in place") for n in p.notes
            if "cache" in n] == ([True] if noted else [])


@pytest.mark.parametrize("cells, line", [
    (['q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", "%%timeit -n1 -r1\nx = 1\nfrom math import *"], 3),
    (["%%timeit x = 1\nfrom math import *", 'q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}"], 2),
])
def test_a_star_import_in_a_timeit_body_is_refused_naming_its_line(cells, line):
    # IPython runs a %%timeit body in a function, where `from math import *` is a SyntaxError; the
    # exporter's check of the names it declares global raised that SyntaxError bare, with no cell
    index = next(i for i, c in enumerate(cells, start=1) if c.startswith("%%timeit"))
    with pytest.raises(ExportError) as e:
        export_notebook(notebook(*cells))
    assert str(e.value) == (f"cell {index}, line {line}: invalid Python in a %%timeit body, which IPython runs in a "
                            "function: import * only allowed at module level; move that line out of the %%timeit cell")


def test_a_global_a_setup_function_sets_once_is_no_row_field_and_gets_no_note():
    nb = notebook("def f():\n    global g\n    g = 'G'\nf()", 'q = "A"', "%%lm --temperature 0\n{q} {g}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.inputs == ("q",) and [c.index for c in p.setup] == [1, 2] and p.notes == []

_SETG = "def setg():\n    global g\n    g = 5\n"


@pytest.mark.parametrize("setup, cells", [
    ("g = 1", [_SETG + "setg()\nr = str(g)"]),  # (g = 1 rebound by the row: it was a run_row copy)
    ("g = 1", [_SETG + "setg()", "r = str(g)"]),
    ("g = 1", ["%%timeit -n1 -r1\nglobal g\ng = 5", "r = str(g)"]),
    ("g = 1", ["from math import *\n" + _SETG + "setg()\nr = str(g)"]),
    ("", [_SETG + "setg()", "from math import *\nr = str(g)"]),  # (the import gave run_row's g job.UNBOUND)
    (_SETG, ["from math import *\nsetg()\nr = str(g)"]),  # (run_row read globals()["g"]: KeyError)
])
def test_a_global_a_function_sets_is_read_as_the_script_global_in_run_row(tmp_path, monkeypatch, setup, cells):
    # since `global g` in a function counts as binding g, run_row took g for a variable of its own
    # (a copy of the set-up's g, or one a per-row star import set), which hid the global the
    # function set: the row read 1, or failed with UnboundLocalError or KeyError
    from helpers_export import write_rows

    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{r} {g}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    notebook_ns = {}  # the Python cells in order, as the notebook runs them (%%timeit -n1 -r1: its body once)
    for code in [setup, *cells]:
        exec(code.replace("%%timeit -n1 -r1\n", ""), notebook_ns)
    assert (notebook_ns["r"], notebook_ns["g"]) == ("5", 5)
    results, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert prompts == ["B", f"{notebook_ns['r']} {notebook_ns['g']}"]



def _job_and_notebook(tmp_path, monkeypatch, setup: str, cells: list, rows=("B", "C"), run_setup=("",),
                      last="{r}"):
    """Export a notebook of ``setup`` (with ``q = "A"``), a ``%%lm`` cell on ``q``, ``cells`` and a
    ``%%lm`` cell of ``last`` then a gen, and run the job on ``rows`` (values of q) one at a time.
    Returns (the prompts the job sent, in order; ``r`` as the notebook's Python cells give it,
    ``setup`` then ``run_setup`` then ``cells`` run in order; the export's Plan; its source)."""
    from helpers_export import write_rows

    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  f"%%lm --temperature 0\n{last}{{gen z max_tokens=1}}")
    source, p = export_notebook(nb)
    notebook_ns = {}
    for code in [setup, *run_setup, *cells]:
        exec(code, notebook_ns)
    written = write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in rows])
    _, prompts = _run_job_rows(source, monkeypatch, written, 0, ["--num-threads", "1"])
    return prompts, notebook_ns["r"], p, source


@pytest.mark.parametrize("setup, cells", [
    (_SETG, ["g = 1\nsetg()\nr = str(g)"]),
    (_SETG, ["g = 1", "setg()\nr = str(g)"]),
    ("g = 0\n" + _SETG, ["r = str(g)\ng = 1\nsetg()\nr += str(g)"]),  # (each row starts from the set-up's 0)
    (_SETG, ["from math import *\ng = 1\nsetg()\nr = str(g)"]),
])
def test_a_global_a_setup_function_sets_is_the_one_the_row_cells_set_too(tmp_path, monkeypatch, setup, cells):
    # a per-row cell's `g = 1` made g run_row's own variable, while the set-up's setg() set the script's
    # global: the row read its own g (1) after setg(), where the notebook's read 5
    # (two rows, one at a time: each row starts where the cells run once left g, as each notebook pass does)
    prompts, r, p, _ = _job_and_notebook(tmp_path, monkeypatch, setup, cells, last="{r} {g}")
    assert r in ("5", "05")
    assert prompts == ["B", f"{r} 5", "C", f"{r} 5"]
    assert ("cell 1: g, which a function of this cell (run once) sets by `global`, is set per row too (a cell that "
            "runs per row sets it, or calls a function that does): the job keeps one g, the script's global, as the "
            "notebook does, which the rows share, so "
            "rows running at once (--num-threads above 1) may read each other's value; return the value from the "
            "function instead, or run the job with --num-threads 1") in p.notes


@pytest.mark.parametrize("setup, cells", [
    ("count = 0\n" + _BUMP, ["bump()\nr = str(count)"]),
    ("count = 0\n" + _BUMP + "def twice():\n    bump()\n    bump()", ["twice()", "r = str(count)"]),
    # (a row's items.append made items the row's copy, which add's `global items` did not set)
    ("items = []\ndef add(x):\n    global items\n    items = items + [x]", ["items.append(1)\nadd(2)\nr = str(items)"]),
])
def test_a_global_a_setup_function_sets_in_a_row_starts_each_row_from_the_setup_value(tmp_path, monkeypatch, setup,
                                                                                      cells):
    # bump() of the cells run once sets the script's global count, which the next row read on from:
    # the second row gave 2 where each notebook pass gave 1
    prompts, r, p, _ = _job_and_notebook(tmp_path, monkeypatch, setup, cells, rows="BCD")
    assert r in ("1", "2", "[1, 2]")
    assert prompts == ["B", r, "C", r, "D", r]
    name = "items" if "items" in setup else "count"
    assert any(n.startswith(f"cell 1: {name}, which a function of this cell (run once) sets by `global`") for n in p.notes)
    # a function the rows do not use: its global is the set-up's, with no restore per row, nor a note
    nb = notebook("def load():\n    global table\n    table = {'a': 1}\nload()\nq = 'A'",
                  "%%lm --temperature 0\n{q}{gen x max_tokens=1}", "r = str(table)")
    source, p = export_notebook(nb)
    assert "restore" not in source and p.notes == []


_COUNTING_F = "count = 0\ndef f(x):\n    global count\n    count += 1\n    return x\n"


@pytest.mark.parametrize("setup, noted", [
    ("ys = list(map(f, [1, 2]))", False),  # (ys holds f's results: the rows never call f)
    ("ys = sorted([2, 1], key=f)", False),
    ("ys = map(f, [1, 2])", True),  # (lazy: the row's list(ys) calls f)
    ("def mk(x):\n    def g():\n        global count\n        count += 1\n    return g\nys = list(map(mk, [1]))",
     True),  # (mk's results are functions that set count; the row calls one)
    # (a generator's or a coroutine's body runs where the row iterates or awaits it: found by the
    # break-it review, where no note said that count changes in each row)
    ("def gen(x):\n    global count\n    count += 1\n    yield x\nys = list(map(gen, [1, 2]))", True),
    ("async def co(x):\n    global count\n    count += 1\n    return x\nys = list(map(co, [1, 2]))", True),
])
def test_a_setup_value_that_holds_only_a_functions_results_does_not_count_it_as_called_by_the_rows(setup, noted):
    # list(map(f, xs)) was taken to hold f, so a row reading ys "called" f: its global count was set
    # back per row and noted as set per row too, though no row calls f
    cell = ("import asyncio, inspect\nfor y in ys:\n    if callable(y):\n        y()\n    elif inspect.isgenerator(y):\n"
            "        list(y)\n    elif inspect.iscoroutine(y):\n        asyncio.run(y)\nr = str(count)")
    nb = notebook(f"{_COUNTING_F}{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    ns: dict = {}  # (whether a row's pass changes count: the note says so exactly then)
    exec(f"{_COUNTING_F}{setup}\nq = 'A'", ns)
    before = ns["count"]
    exec(cell, ns)
    assert (ns["count"] != before) == noted
    assert bool(p.notes) == noted and ("job.restore(globals())" in source) == noted


def test_a_global_a_setup_function_sets_but_the_setup_never_called_starts_each_row_unbound(tmp_path, monkeypatch):
    # job.keep kept only the names the set-up had bound, so the g that row 1's setg() set was still
    # there for row 2, which read 5 where each pass of the notebook reads no g before its call
    prompts, r, _, source = _job_and_notebook(tmp_path, monkeypatch, _SETG, [
        "try:\n    r = str(g)\nexcept NameError:\n    r = 'none'\nsetg()"])
    assert r == "none" and "job.keep(globals(), 'g')" in source
    assert prompts == ["B", r, "C", r]


def _notebook_passes(setup: str, cells: list, rows: list) -> list:
    """``r`` as each pass of the notebook gives it, one for each of ``rows`` ({"q": ...}): ``setup``,
    then the row's q (set after cell 1), then the Python ``cells`` in order, in a namespace of its own."""
    out = []
    for row in rows:
        notebook_ns = {}
        exec(setup, notebook_ns)
        notebook_ns["q"] = row["q"]
        for code in cells:
            exec(code, notebook_ns)
        out.append(notebook_ns["r"])
    return out


_COUNTED = ("calls = 0\ndef counted(f):\n    def wrapper(*a):\n        global calls\n        calls += 1\n"
            "        return f(*a)\n    return wrapper\n")
_BUMPED = "count = 0\ndef f():\n    global count\n    count += 1\n"


@pytest.mark.parametrize("setup, cells", [
    (_COUNTED + "@counted\ndef ask(x):\n    return x", ["ask(q)\nr = str(calls)"]),  # (a decorator's wrapper)
    (_COUNTED + "def ask(x):\n    return x\nask = counted(ask)", ["ask(q)\nr = str(calls)"]),
    (_COUNTED.replace("def counted(f):", "def counted(n):\n  def deco(f):").replace("\n    ", "\n      ")
     .replace("calls += 1", "calls += n") + "  return deco\n@counted(2)\ndef ask(x):\n    return x",
     ["ask(q)\nr = str(calls)"]),  # (a decorator made by a call)
    (_BUMPED + "handlers = {'a': f}", ["handlers['a']()\nr = str(count)"]),  # (a dict of functions)
    (_BUMPED + "handlers = {}\nhandlers['a'] = f", ["handlers['a']()\nr = str(count)"]),
    (_BUMPED + "handlers = {'a': lambda: f()}", ["handlers['a']()\nr = str(count)"]),
    (_BUMPED + "hooks = []\nhooks.append(f)", ["for h in hooks:\n    h()\nr = str(count)"]),
    (_BUMPED + "g = f", ["g()\nr = str(count)"]),
    (_BUMPED + "class R:\n    handler = staticmethod(f)", ["R.handler()\nr = str(count)"]),  # (a class attribute)
    (_BUMPED + "def g(cb=f):\n    cb()", ["g()\nr = str(count)"]),  # (a function's default)
    (_BUMPED + "def g(cb=lambda: f()):\n    cb()", ["g()\nr = str(count)"]),
    (_COUNTED + "class A:\n    @counted\n    def ask(self, x):\n        return x\na = A()",  # (a method's decorator)
     ["a.ask(q)\nr = str(calls)"]),
])
def test_a_global_a_setup_function_sets_through_a_wrapper_or_a_dict_starts_each_row_from_the_setup_value(
        tmp_path, monkeypatch, setup, cells):
    # the row called the function through a name that is no function of the set-up (the decorator's
    # wrapper, handlers['a']), so its `global` counter was not restored per row: rows gave 1, 2, 3
    # where each pass of the notebook gives 1 (2 for counted(2))
    from helpers_export import write_rows

    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    rows = [{"q": q} for q in "BCD"]
    expected = [t for row, r in zip(rows, _notebook_passes(setup, cells, rows)) for t in (row["q"], r)]
    assert expected[1] in ("1", "2")
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", rows), 0,
                               ["--num-threads", "1"])
    assert prompts == expected


def test_a_setup_container_a_decorators_wrapper_changes_in_place_is_noted():
    # (the documented carry-over of a container the rows' calls change: it went without a note)
    setup = ("stats = {'n': 0}\ndef counted(f):\n    def wrapper(*a):\n        stats['n'] += 1\n        return f(*a)\n"
             "    return wrapper\n@counted\ndef ask(x):\n    return x")
    _, p = export_notebook(notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                                    "r = str(ask(q))", "%%lm --temperature 0\n{r}{gen z max_tokens=1}"))
    assert [n.split(":")[:2] for n in p.notes] == [["cell 1", " stats, which a function of this cell (run once) "
                                                   "changes in place, is changed by the rows' calls"]]


@pytest.mark.parametrize("setup, cells", [
    ("class C:\n    n = 0", ["C.n += 1\nr = str(C.n)"]),  # (by a row cell)
    ("class C:\n    n = 0\ndef bump():\n    C.n += 1", ["bump()\nr = str(C.n)"]),  # (by a set-up function)
    ("class C:\n    n = 0\n    def bump(self):\n        type(self).n += 1", ["C().bump()\nr = str(C.n)"]),
    ("class C:\n    n = 0\n    @classmethod\n    def bump(cls):\n        cls.n += 1", ["C.bump()\nr = str(C.n)"]),
    ("class C:\n    n = 0\n    def bump(self):\n        self.__class__.n += 1\nc = C()", ["c.bump()\nr = str(C.n)"]),
    ("class C:\n    seen = []", ["C.seen.append(q)\nr = str(C.seen)"]),  # (changed in place)
    ("class C:\n    pass", ["try:\n    r = str(C.n)\nexcept AttributeError:\n    r = 'none'\nC.n = 1"]),  # (made)
    ("class C:\n    n = 0", ["setattr(C, 'n', C.n + 1)\nr = str(C.n)"]),
    # (cls.n += 1 called as B.bump() sets B's own n, which was not set back: B.n read 1, 2, 3)
    ("class C:\n    n = 0\n    @classmethod\n    def bump(cls):\n        cls.n += 1\nclass B(C):\n    pass",
     ["B.bump()\nr = str((B.n, C.n))"]),
    # (C.seen is Base's list, which the rows' append changed: it was not set back)
    ("class Base:\n    seen = []\nclass C(Base):\n    pass", ["C.seen.append(q)\nr = str(C.seen)"]),
    # (the rows use C's method only through the subclass B, or an instance c: C's change went unseen)
    ("class C:\n    n = 0\n    @classmethod\n    def bump(cls):\n        cls.n += 1\nclass B(C):\n    pass",
     ["B.bump()\nr = str(B.n)"]),
    ("class C:\n    n = 0\n    def bump(self):\n        type(self).n += 1\nc = C()", ["c.bump()\nr = str(c.n)"]),
    # (a class decorator's instance: the job's keep failed on it, with a TypeError before any row ran)
    ("def one(cls):\n    return cls()\n@one\nclass C:\n    n = 0", ["C.n += 1\nr = str(C.n)"]),
    ("class Outer:\n    class C:\n        n = 0", ["Outer.C.n += 1\nr = str(Outer.C.n)"]),  # (a nested class's)
    # (a nested class's classmethod: its cls.n was taken for C.n, no class of the set-up, so rows gave 1, 2, 3)
    ("class Outer:\n    class C:\n        n = 0\n        @classmethod\n        def bump(cls):\n            cls.n += 1",
     ["Outer.C.bump()\nr = str(Outer.C.n)"]),
    # (a metaclass's method changes cls.n of its classes: its `cls` was taken for an instance)
    ("class Meta(type):\n    def __call__(cls, *a):\n        cls.n += 1\n        return super().__call__(*a)\n"
     "class C(metaclass=Meta):\n    n = 0", ["C()\nr = str(C.n)"]),
    # (a private name, which Python stores as _C__n: the job set back C.__n, which C does not have)
    ("class C:\n    __n = 0\n    @classmethod\n    def bump(cls):\n        cls.__n += 1\n        return cls.__n",
     ["r = str(C.bump())"]),
])
def test_a_class_attribute_the_rows_change_starts_each_row_from_the_setup_value(tmp_path, monkeypatch, setup, cells):
    # C.n += 1 changed the set-up's class, which the job's rows share: rows gave 1, 2, 3 where each
    # pass of the notebook gives 1, with no note (the class is no container a row can copy)
    from helpers_export import write_rows

    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    rows = [{"q": q} for q in "BCD"]
    expected = [t for row, r in zip(rows, _notebook_passes(setup, cells, rows)) for t in (row["q"], r)]
    assert expected[1::2] in (["1"] * 3, ["none"] * 3, ["['B']", "['C']", "['D']"], ["(1, 0)"] * 3)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", rows), 0,
                               ["--num-threads", "1"])
    assert prompts == expected
    attribute = "C.seen" if "seen" in setup else "C._C__n" if "__n" in setup else "C.n"
    attribute = "Outer." + attribute if "Outer" in setup else "Meta.n" if "Meta" in setup else attribute
    assert [n.split(":")[:2] for n in p.notes] == [["cell 1", f" {attribute}, a class attribute of this cell that the "
                                                   "rows change"]]
    assert 'row_copy(globals()["C"])' not in source  # (no row copy of the class: restored, it is the set-up's)
    assert f"""a change of a class attribute\n# 'C.n'): each row starts from the value the cells run once left
job.keep(globals(), '{attribute}')""" in source  # (the comment said only `global` and star imports set it)


@pytest.mark.parametrize("setup, cell", [
    ("class C:\n    n = 0", "name = 'n'\nsetattr(C, name, C.n + 1)\nr = str(C.n)"),
    ("class C:\n    n = 0\ndef bump(name):\n    setattr(C, name, C.n + 1)", "bump('n')\nr = str(C.n)"),  # (a call's)
])
def test_a_class_the_rows_change_by_a_computed_attribute_name_is_noted(setup, cell):
    # setattr(C, name, ...) names no attribute the job can set back: it carries over, and says so
    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    _, p = export_notebook(nb)
    assert [n.split(":")[:2] for n in p.notes] == [
        ["cell 1", " C, a class of this cell, is changed by the rows through setattr or delattr of a computed name, "
                   "which the export cannot follow"]]


_COUNTER = ("class Counter:\n    def __init__(self):\n        self.n = 0\n    def bump(self):\n        self.n += 1\n"
            "        return self.n\nc = Counter()")


@pytest.mark.parametrize("setup, cell, note", [
    # (a row cell's own call: the job's row copy of c is c itself, as Job.row_copy copies built-in containers only)
    (_COUNTER, "r = str(c.bump())",
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`c.bump()` in cell 3): what "
     "its calls change carries over from row to row"),
    ("def g():\n    yield from 'xyz'\nit = g()", "r = it.send(None)",
     "cell 1: it, an iterator (g()) that this cell makes once, is used by the rows (`it.send(None)` in cell 3)"),
    # (iterated: a for loop, or a builtin that runs through it; only next() and method calls were noted)
    ("it = iter('xyz')", "for r in it:\n    break",
     "cell 1: it, an iterator (iter()) that this cell makes once, is used by the rows (`for r in it` in cell 3)"),
    ("def g():\n    yield from 'xyz'\nit = g()", "r = str(list(it))",
     "cell 1: it, an iterator (g()) that this cell makes once, is used by the rows (`list(it)` in cell 3)"),
    ("def g():\n    yield from 'xyz'\nitems = [g()]", "r = ''.join(c for c in items[0] if c > 'x')[:1]",
     "cell 1: items, a list of iterators (g()) that this cell makes once, is used by the rows (`for c in items[0]` "
     "in cell 3)"),
    # (an item taken by a loop: only an item named by index was noted)
    (_COUNTER + "\nhs = [Counter(), Counter()]", "r = ''.join(str(h.bump()) for h in hs)",
     "cell 1: hs, a list of instances of Counter that this cell makes once, is used by the rows (`h.bump()` in cell "
     "3, an item of `hs`)"),
    # (a row cell's hs.items() makes the row's own copy of hs, with its instances: a set-up function's does not)
    (_COUNTER + "\nhs = {'a': Counter()}\ndef use():\n    r = ''\n    for k, h in hs.items():\n        r += k + str(h.bump())\n"
     "    return r", "r = use()",
     "cell 1: hs, a dict of instances of Counter that this cell makes once, is used by the rows (`h.bump()` in use(), "
     "a function of cell 1, an item of `hs.items()`)"),
    # (a seeded random number generator: each row draws on from the last row's draws)
    ("import random\nrng = random.Random(0)", "r = str(rng.random())",
     "cell 1: rng, a random number generator (random.Random()) that this cell makes once, is used by the rows "
     "(`rng.random()` in cell 3)"),
    # (held in a dict: "a dict of a random number generator" read as one)
    ("import random\nrngs = {'a': random.Random(0), 'b': random.Random(1)}", "r = str(rngs['a'].random())",
     "cell 1: rngs, a dict of random number generators (random.Random()) that this cell makes once, is used by "
     "the rows (`rngs['a'].random()` in cell 3)"),
    ("import numpy as np\nrng = np.random.default_rng(0)", "r = str(rng.integers(10**9))",
     "cell 1: rng, a random number generator (np.random.default_rng()) that this cell makes once, is used by the "
     "rows (`rng.integers(10 ** 9)` in cell 3)"),
    # (a module's global generator, seeded once by the set-up)
    ("import random\nrandom.seed(0)", "r = str(random.random())",
     "cell 1: random.seed(0) seeds random's generator once, and the rows draw from it (`random.random()` in cell 3): "
     "each row draws on from the last row's draws"),
    ("import numpy as np\nnp.random.seed(0)\ndef pick():\n    return str(np.random.randint(10**9))", "r = pick()",
     "cell 1: np.random.seed(0) seeds np.random's generator once, and the rows draw from it "
     "(`np.random.randint(10 ** 9)` in pick(), a function of cell 1)"),
    (_COUNTER + "\ndef use():\n    return c.bump()", "r = str(use())",
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`c.bump()` in use(), a "
     "function of cell 1): what its calls change carries over from row to row"),
    ("import itertools\nit = itertools.count()", "r = str(next(it))",
     "cell 1: it, an iterator (itertools.count()) that this cell makes once, is used by the rows (`next(it)` in "
     "cell 3): what its calls change carries over from row to row"),
    ("def g():\n    yield from 'xyz'\nit = g()", "r = next(it)",
     "cell 1: it, an iterator (g()) that this cell makes once, is used by the rows (`next(it)` in cell 3)"),
    # (held in a list or dict the set-up makes: next(items[0]) and handlers['a'].bump() went without a note)
    ("def g():\n    yield from 'xyz'\nitems = [g()]", "r = next(items[0])",
     "cell 1: items, a list of iterators (g()) that this cell makes once, is used by the rows (`next(items[0])` in "
     "cell 3): what its calls change carries over from row to row"),
    (_COUNTER + "\nhandlers = {'a': Counter(), 'b': Counter()}", "r = str(handlers['a'].bump())",
     "cell 1: handlers, a dict of instances of Counter that this cell makes once, is used by the rows "
     "(`handlers['a'].bump()` in cell 3)"),
    ("def counted(f):\n    n = 0\n    def w(*a):\n        nonlocal n\n        n += 1\n        return f(*a) + str(n)\n"
     "    return w\n@counted\ndef tag(x):\n    return x", "r = tag('t')",
     "cell 1: tag, which the rows call, is wrapped by counted, whose closure keeps state by `nonlocal`: it carries "
     "over from row to row"),
    # (a decorator factory: the closure of counted(), called, keeps n)
    ("def counted():\n    n = 0\n    def deco(f):\n        def w(*a):\n            nonlocal n\n            n += 1\n"
     "            return f(*a) + str(n)\n        return w\n    return deco\n@counted()\ndef tag(x):\n    return x",
     "r = tag('t')", "cell 1: tag, which the rows call, is wrapped by counted(), whose closure keeps state by "
     "`nonlocal`: it carries over from row to row"),
    # (passed on through a second function, and a third: no note before)
    (_COUNTER + "\ndef inner(y):\n    return y.bump()\ndef outer(x):\n    return inner(x)", "r = str(outer(c))",
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`y.bump()` in inner(), a "
     "function of cell 1, y being `c`)"),
    (_COUNTER + "\ndef bump(z):\n    return z.bump()\ndef inner(y):\n    return bump(y)\ndef outer(x):\n"
     "    return inner(x)", "r = str(outer(c))",
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`z.bump()` in bump(), a "
     "function of cell 1, z being `c`)"),
    # (a function a set-up dict or list holds, called through it: no note before)
    (_COUNTER + "\ndef use(x):\n    return x.bump()\nhandlers = {'a': use}", "r = str(handlers['a'](c))",
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in use(), a "
     "function of cell 1, x being `c`)"),
    (_COUNTER + "\ndef use(x):\n    return x.bump()\ndef outer(x):\n    return hs[1](x)\nhs = [len, use]",
     "r = str(outer(c))", "cell 1: c, an instance of Counter that this cell makes once, is used by the rows "
     "(`x.bump()` in use(), a function of cell 1, x being `c`)"),
    # (a decorator a set-up call makes: no note before)
    ("def make():\n    n = 0\n    def deco(f):\n        def w(*a):\n            nonlocal n\n            n += 1\n"
     "            return f(*a) + str(n)\n        return w\n    return deco\ncounted = make()\n@counted\ndef tag(x):\n"
     "    return x", "r = tag('t')", "cell 1: tag, which the rows call, is wrapped by counted, whose closure keeps state "
     "by `nonlocal`: it carries over from row to row"),
    # (in a function the row cell defines and calls)
    ("it = iter('xyz')", "def take():\n    return next(it)\nr = take()",
     "cell 1: it, an iterator (iter()) that this cell makes once, is used by the rows (`next(it)` in cell 3, in its "
     "take()): what its calls change carries over from row to row"),
    # (a method that calls one that changes the instance, or hands an attribute on, changes it)
    ("class Tok:\n    def __init__(self):\n        self.vocab = {}\n    def grow(self, x):\n        self.vocab[x] = 1\n"
     "    def encode(self, x):\n        self.grow(x)\n        return str(len(self.vocab))\ntok = Tok()\n"
     "def use(x):\n    return tok.encode(x)", "r = use(q + str(len(tok.vocab)))",
     "cell 1: tok, an instance of Tok that this cell makes once, is used by the rows (`tok.encode(x)` in use(), a "
     "function of cell 1): what its calls change carries over from row to row"),
    ("class Tok:\n    def __init__(self):\n        self.seen = []\n    def all(self):\n        return self.seen\n"
     "tok = Tok()\ndef use(x):\n    tok.all().append(x)\n    return str(len(tok.seen))", "r = use(q)",
     "cell 1: tok, an instance of Tok that this cell makes once, is used by the rows (`tok.all()` in use(), a "
     "function of cell 1): what its calls change carries over from row to row"),
    # (a method that changes an item of an attribute, consumes an iterator an attribute holds, or calls
    # `get` on an object that is no plain container: found by the break-it review, where such a method
    # named like a read method (get) was taken to read only and nothing was noted)
    *[(f"{cls}class T:\n    def __init__(self):\n        {init}\n    def get(self, x):\n        {body}\nt = T()\n"
       "def use(x):\n    return t.get(x)", "r = str(use(q))",
       "cell 1: t, an instance of T that this cell makes once, is used by the rows (`t.get(x)` in use(), a function "
       "of cell 1): what its calls change carries over from row to row")
      for cls, init, body in [
          ("", "self.rows = [[]]", "self.rows[0].append(x)\n        return len(self.rows[0])"),
          ("", "self.d = {'k': {}}", "self.d['k'][len(self.d['k'])] = x\n        return len(self.d['k'])"),
          ("", "self.d = {'k': []}", "self.d.get('k').append(x)\n        return len(self.d['k'])"),
          # (iterating a plain container reads it, not what the loop does to its items: 579bfee took both as reads)
          ("", "self.rows = [[]]", "for row in self.rows:\n            row.append(x)\n        return len(self.rows[0])"),
          ("", "self.rows = [{}]", "for row in self.rows:\n            row[len(row)] = x\n        return len(self.rows[0])"),
          ("", "self.rows = [[]]", "return [row.append(x) for row in self.rows] and len(self.rows[0])"),
          ("", "self.it = iter('abcdefgh')", "return 'c' in self.it"),
          ("", "self.it = iter('abcdefgh')", "for c in self.it:\n            return c + x"),
          ("", "self.it = iter('abcdefgh')", "return next(c for c in self.it if c > x)"),
          ("import queue\n", "self.q = queue.Queue()\n        self.q.put(1)\n        self.q.put(2)",
           "return self.q.get()"),
          ("class C:\n    def __init__(self):\n        self.n = 0\n    def get(self, k):\n        self.n += 1\n"
           "        return self.n\n", "self.c = C()", "return self.c.get(x)"),
      ]],
    # (a method's decorator factory, @counted(): wrapped once, where the class is defined; found by the
    # break-it review, where only a function's was noted)
    ("def counted():\n    n = 0\n    def deco(f):\n        def w(*a):\n            nonlocal n\n            n += 1\n"
     "            return f(*a) + str(n)\n        return w\n    return deco\nclass A:\n    @counted()\n"
     "    def ask(self, x):\n        return x\na = A()", "r = a.ask('a')",
     "cell 1: A.ask, which the rows call, is wrapped by counted(), whose closure keeps state by `nonlocal`"),
    # (and one an Enum's method sets on its member; found by the break-it review, where only a row's
    # `Color.RED.hits = ...` was noted)
    ("from enum import Enum\nclass Color(Enum):\n    RED = 1\n    def hit(self):\n"
     "        self.hits = getattr(self, 'hits', 0) + 1\n        return self.hits", "r = str(Color.RED.hit())",
     "cell 1: Color's members (an Enum's, which the class holds) have hits (hit()) set by its methods, and the rows "
     "use Color: the job does not set them back at each row's start, so what they set carries over from row to row"),
    # (an attribute set on an Enum's member, which the class holds: no class attribute the job sets back)
    ("from enum import Enum\nclass Color(Enum):\n    RED = 1",
     "Color.RED.hits = getattr(Color.RED, 'hits', 0) + 1\nr = str(Color.RED.hits)",
     "cell 1: Color.RED, an object that the class Color of this cell holds (an Enum's member, or a class attribute's "
     "value), has Color.RED.hits set by the rows: the job does not set it back at each row's start, so it carries "
     "over from row to row"),
])
def test_setup_state_the_rows_carry_on_is_noted(setup, cell, note):
    # the job runs the set-up once, so these go on from the last row's state (r: 1, 2, 3 for three
    # rows; 'x', 'y', 'z'), where each pass of the notebook makes them anew (r: 1 every row), and
    # nothing said so; the job's behaviour is unchanged: the note says it, and how to avoid it
    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    ns: dict = {}  # (the carry-over the note names: the cell's code run twice on one set-up)
    exec(f"{setup}\nq = 'A'", ns)
    exec(cell, ns)
    first = ns["r"]
    exec(cell, ns)
    assert ns["r"] != first
    _, p = export_notebook(nb)
    assert [n for n in p.notes if note in n] and len(p.notes) == 1, p.notes
    assert ("make it in a cell that runs per row" in p.notes[0] or "define it in a cell that runs per row" in p.notes[0]
            or "keep that state in a variable the row makes" in p.notes[0] or "seed it in a cell that runs per row"
            in p.notes[0])


@pytest.mark.parametrize("setup, cell", [
    ("import itertools", "it = itertools.count()\nr = str(next(it))"),  # (made per row)
    ("def g():\n    yield from 'xyz'", "it = g()\nr = next(it)"),
    ("it = iter('xyz')", "def take(it):\n    return next(it)\nr = take(iter('a'))"),  # (the function's own it)
    # (passed on to a function that only reads it, binds its parameter again, or is passed a new one)
    (_COUNTER + "\ndef inner(y):\n    return y.n + 1\ndef outer(x):\n    return inner(x)", "r = str(outer(c))"),
    (_COUNTER + "\ndef inner(y):\n    y = Counter()\n    return y.bump()\ndef outer(x):\n    return inner(x)",
     "r = str(outer(c))"),
    (_COUNTER + "\ndef inner(y):\n    return y.bump()\ndef outer(x):\n    return inner(Counter()) + x.n",
     "r = str(outer(c))"),
    (_COUNTER + "\ndef loop(x, k):\n    return x.n + 1 if k == 0 else loop(x, k - 1)", "r = str(loop(c, 3))"),
    # (called through a container, the function there only reads it, or the rows' own container, or one whose items
    # the set-up moves)
    (_COUNTER + "\ndef use(x):\n    return x.bump()\ndef peek(x):\n    return x.n + 1\nhs = {'a': use, 'b': peek}",
     "r = str(hs['b'](c))"),
    (_COUNTER + "\ndef use(x):\n    return x.bump()\ndef peek(x):\n    return x.n + 1\nhs = {'a': use}",
     "hs = {'a': peek}\nr = str(hs['a'](c))"),
    (_COUNTER + "\ndef use(x):\n    return x.bump()\ndef peek(x):\n    return x.n + 1\nhs = [peek, use]\nhs.reverse()",
     "r = str(hs[1](c))"),
    # (a decorator a set-up call makes whose closure keeps nothing, or a name bound again to another)
    ("def make():\n    def deco(f):\n        return lambda *a: f(*a) + '1'\n    return deco\ncounted = make()\n"
     "@counted\ndef tag(x):\n    return x", "r = tag('t')"),
    ("def make():\n    n = 0\n    def deco(f):\n        def w(*a):\n            nonlocal n\n            n += 1\n"
     "            return f(*a) + str(n)\n        return w\n    return deco\ncounted = make()\ncounted = lambda f: f\n"
     "@counted\ndef tag(x):\n    return x", "r = tag('t')"),
    (_COUNTER, "def f(x):\n    x = Counter()\n    return x.bump()\nr = str(f(c))"),  # (its x: a new one)
    # (a loop over a slice of a list of generators, or over a starred name's, runs through the list and consumes none
    # of them: it was noted as consuming them)
    ("def g():\n    yield from 'xyz'\nitems = [g(), g()]", "n = 0\nfor x in items[1:]:\n    n += 1\nr = str(n)"),
    ("def g():\n    yield from 'xyz'\nitems = [g(), g()]",
     "a, *m = items\nr = str(len(list(m)) + len([x for x in m]))"),
    # (a method that only reads its instance, itself or through another such method: nothing carries over)
    ("class Tok:\n    def __init__(self):\n        self.vocab = {'a': 1}\n    def encode(self, x):\n"
     "        return [self.vocab.get(ch, 0) for ch in x] + [self.size(), self.vocab['a']]\n    def size(self):\n"
     "        return len(self.vocab)\ntok = Tok()\ndef use(x):\n    return tok.encode(x)", "r = str(use(q))"),
    # (iterating a plain container an attribute holds reads it: `for k in self.vocab` was noted as a change)
    ("class Tok:\n    def __init__(self):\n        self.vocab = {'a': 1, 'b': 2}\n    def encode(self, x):\n"
     "        out = []\n        for k in self.vocab:\n            out.append(k in x)\n"
     "        return out + [k for k in self.vocab if k > x] + [v for _, v in self.vocab.items()]\n"
     "tok = Tok()\ndef use(x):\n    return tok.encode(x)", "r = str(use(q))"),
    # (a list or dict of objects: a read-only method of theirs, or an item that is no such object, changes nothing)
    ("class Tok:\n    def __init__(self):\n        self.vocab = {'a': 1}\n    def encode(self, x):\n"
     "        return self.vocab.get(x, 0)\ntoks = [Tok(), Tok()]", "r = str(toks[0].encode(q))"),
    ("def g():\n    yield from 'xyz'\nparts = [g(), 'ab']", "r = parts[1].upper()"),
    # (a loop that reads the items of a plain container, or hands them on, changes nothing of it)
    ("class Tok:\n    def __init__(self):\n        self.words = ['a', 'b']\n    def encode(self, x):\n        out = []\n"
     "        for w in self.words:\n            out.append(w.upper() + x)\n        return out + [w for w in self.words]\n"
     "tok = Tok()\ndef use(x):\n    return tok.encode(x)", "r = str(use(q))"),
    ("words = {'a': 'xy'}", "r = words['a'].upper()"),
    ("import random\nrandom.seed(0)", "random.seed(0)\nr = str(random.random())"),  # (seeded again per row)
    # (a loop over the keys of a dict of them, or over objects whose method only reads them)
    (_COUNTER + "\nhs = {'a': Counter()}", "r = ''.join(k.upper() for k in hs) + ''.join(k.upper() for k, h in hs.items())"),
    ("class Tok:\n    def __init__(self):\n        self.vocab = {'a': 1}\n    def encode(self, x):\n"
     "        return self.vocab.get(x, 0)\ntoks = [Tok(), Tok()]", "r = ''.join(str(t.encode(q)) for t in toks)"),
    # a generator of its own that the row makes draws nothing from the seeded global one (they were
    # noted as drawing from it: "the rows draw from it (`random.Random(1)` in cell 3)")
    ("import random\nrandom.seed(0)", "r = str(random.Random(1).random())"),
    ("import numpy as np\nnp.random.seed(0)", "r = str(np.random.default_rng(1).random())"),
    # (a row that sets the generator's state, as a seed does, or only reads it: it was noted as a draw)
    ("import random\nrandom.seed(0)\nst = random.getstate()", "random.setstate(st)\nr = str(random.random())"),
    ("import numpy as np\nnp.random.seed(0)\nst = np.random.get_state()", "np.random.set_state(st)\nr = str(np.random.rand())"),
    ("import random\nrandom.seed(0)", "r = str(random.getstate()[0])"),
])
def test_setup_state_each_row_makes_or_copies_is_not_noted(setup, cell):
    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    _, p = export_notebook(nb)
    assert p.notes == []



def _one_cell_job(tmp_path, monkeypatch, setup: str, cell: str) -> tuple[list, list, list]:
    """(the export's notes, r as each pass of the notebook gives it, r as the job's rows give it) for a
    notebook of ``setup``, a %%lm cell of q, the Python ``cell`` that sets r and a %%lm cell of r, run
    over the rows q = B, C, D."""
    from helpers_export import write_rows

    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    rows = [{"q": q} for q in "BCD"]
    passes = _notebook_passes(f"{setup}\nq = 'A'", [cell], rows)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", rows), 0,
                               ["--num-threads", "1"])
    return p.notes, passes, prompts[1::2]


@pytest.mark.parametrize("setup, cell, job, note", [
    (_COUNTER, "r = str(c.bump())", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`c.bump()` in cell 3)"),
    (_COUNTER + "\nhs = [Counter(), Counter()]", "r = ''.join(str(h.bump()) for h in hs)", ["11", "22", "33"],
     "cell 1: hs, a list of instances of Counter that this cell makes once, is used by the rows (`h.bump()` in cell 3, "
     "an item of `hs`)"),
    (_COUNTER + "\nhs = [Counter(), Counter()]", "xs = hs\nr = ''.join(str(h.bump()) for h in xs)", ["11", "22", "33"],
     "cell 1: hs, a list of instances of Counter that this cell makes once, is used by the rows (`h.bump()` in cell 3, "
     "an item of `xs`)"),
    ("def g():\n    yield from 'xyz'\nit = g()", "for r in it:\n    break", ["x", "y", "z"],
     "cell 1: it, an iterator (g()) that this cell makes once, is used by the rows (`for r in it` in cell 3)"),
    # (a generator expression, or the iterator of map(), zip(), ..., went without a note)
    (_COUNTER, "x = c\nr = str(x.bump())", ["1", "2", "3"],  # (by another name: no note before)
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in cell 3, x being "
     "`c`)"),
    (_COUNTER, "x = c\ny = x\nr = str(y.bump())", ["1", "2", "3"],  # (by a name for that name: no note before)
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`y.bump()` in cell 3, y being "
     "`c`)"),
    ("g = (c for c in 'xyz')", "r = next(g)", ["x", "y", "z"],
     "cell 1: g, an iterator (a generator expression) that this cell makes once, is used by the rows (`next(g)` in cell 3)"),
    ("m = map(str.upper, 'xyz')", "for r in m:\n    break", ["X", "Y", "Z"],
     "cell 1: m, an iterator (map()) that this cell makes once, is used by the rows (`for r in m` in cell 3)"),
    ("import random\nrng = random.Random(0)", "r = str(rng.random())",
     [str(x) for g in [__import__("random").Random(0)] for x in (g.random(), g.random(), g.random())],
     "cell 1: rng, a random number generator (random.Random()) that this cell makes once, is used by the rows"),
    ("import random\nrandom.seed(0)", "r = str(random.random())",
     [str(x) for g in [__import__("random").Random(0)] for x in (g.random(), g.random(), g.random())],
     "cell 1: random.seed(0) seeds random's generator once, and the rows draw from it"),
    # (a generator of a dict reached by get, and one a method runs through as an item of its attribute's list:
    # both went without a note)
    ("def g():\n    yield from 'xyz'\nitems = {'a': g()}", "r = next(items.get('a'))", ["x", "y", "z"],
     "cell 1: items, a dict of iterators (g()) that this cell makes once, is used by the rows "
     "(`next(items.get('a'))` in cell 3)"),
    ("def g():\n    yield from 'xyz'\nclass Src:\n    def __init__(self):\n        self.its = [g()]\n"
     "    def take(self):\n        for x in self.its[0]:\n            return x\nsrc = Src()", "r = src.take()",
     ["x", "y", "z"], "cell 1: src, an instance of Src that this cell makes once, is used by the rows "
     "(`src.take()` in cell 3)"),
    # (passed to a function of the row's, or of the set-up's, that changes its parameter: no note before)
    (_COUNTER, "def f(x):\n    return x.bump()\nr = str(f(c))", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in cell 3, in its "
     "f(), x being `c`)"),
    (_COUNTER + "\ndef use(x):\n    return x.bump()", "r = str(use(c))", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in use(), a "
     "function of cell 1, x being `c`)"),
    ("def g():\n    yield from 'xyz'\nitems = [g()]", "def take(it):\n    return next(it)\nxs = items\nr = take(xs[0])",
     ["x", "y", "z"], "cell 1: items, a list of iterators (g()) that this cell makes once, is used by the rows "
     "(`next(it)` in cell 3, in its take(), it being `items[0]`)"),
    # (passed through *args or **kwargs: no note before)
    (_COUNTER + "\ndef use(*xs):\n    return xs[-1].bump()", "r = str(use(1, c))", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`xs[-1].bump()` in use(), a "
     "function of cell 1, xs being `(1, c)`)"),
    (_COUNTER + "\ndef use(**kw):\n    return kw.get('a').bump()", "r = str(use(a=c))", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`kw.get('a').bump()` in use(), "
     "a function of cell 1, kw being `{'a': c}`)"),
    (_COUNTER, "def use(a, *xs):\n    return xs[0].bump()\nr = str(use(1, c))", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`xs[0].bump()` in cell 3, in its "
     "use(), xs being `(c,)`)"),
    # (by a name the function binds to its parameter, or to an item of its *args: no note before)
    (_COUNTER + "\ndef use(x):\n    first = x\n    return first.bump()", "r = str(use(c))", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`first.bump()` in use(), a "
     "function of cell 1, first being `c`)"),
    (_COUNTER, "def f(*xs):\n    first = xs[0]\n    return first.bump()\nr = str(f(c))", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`first.bump()` in cell 3, in its "
     "f(), first being `c`)"),
    # (a lambda a set-up cell binds by name, which the rows call: no note before)
    (_COUNTER + "\nuse = lambda x: x.bump()", "r = str(use(c))", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in use(), a "
     "function of cell 1, x being `c`)"),
    # (a row cell that binds the name to its own function below the call: the call is the set-up's)
    (_COUNTER + "\nuse = lambda x: x.bump()", "r = str(use(c))\nuse = lambda x: x.n + 1", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in use(), a "
     "function of cell 1, x being `c`)"),
    (_COUNTER + "\nbump = lambda: c.bump()", "r = str(bump())", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`c.bump()` in bump(), a "
     "function of cell 1)"),
    # (an item of a loop over *args: no note before)
    (_COUNTER + "\ndef use(*xs):\n    out = 0\n    for x in xs:\n        out += x.bump()\n    return out",
     "r = str(use(c))", ["1", "2", "3"], "cell 1: c, an instance of Counter that this cell makes once, is used by the "
     "rows (`x.bump()` in use(), a function of cell 1, an item of `xs`, xs being `(c,)`)"),
    (_COUNTER, "def use(*xs):\n    return sum(x.bump() for x in xs)\nr = str(use(c))", ["1", "2", "3"],
     "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in cell 3, in its "
     "use(), an item of `xs`, xs being `(c,)`)"),
    # (passed to a method of an instance of another set-up class: no note before)
    (_COUNTER + "\nclass User:\n    def use(self, x):\n        return x.bump()\nu = User()", "r = str(u.use(c))",
     ["1", "2", "3"], "cell 1: c, an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in "
     "User.use(), a method of cell 1, x being `c`)"),
    # (a staticmethod's: the note was on u instead, as if the method changed its instance)
    (_COUNTER + "\nclass User:\n    @staticmethod\n    def use(x):\n        return x.bump()\nu = User()",
     "r = str(u.use(c))", ["1", "2", "3"], "cell 1: c, an instance of Counter that this cell makes once, is used by the "
     "rows (`x.bump()` in User.use(), a method of cell 1, x being `c`)"),
])
def test_setup_objects_a_row_cell_changes_carry_over_in_the_job_as_noted(tmp_path, monkeypatch, setup, cell, job, note):
    """c.bump() in a row cell went without a note, taken to change the row's own copy of c (the
    job's row copy, Job.row_copy, is c itself), as did h.bump() of a loop over a set-up list of
    them and a loop over a set-up iterator: the job's rows go on from the last row's object, where
    each notebook pass starts from a new one."""
    notes, passes, rows = _one_cell_job(tmp_path, monkeypatch, setup, cell)
    assert passes == [job[0]] * 3  # (each pass of the notebook: the set-up, then the row cell)
    assert rows == job  # (what the note says: it carries over from row to row)
    assert len(notes) == 1 and notes[0].startswith(note), notes


@pytest.mark.parametrize("use, cell", [
    ("def use(c):\n    return c.bump()", "r = str(use(Counter()))"),
    ("def use(c: Counter):\n    return c.bump()", "r = str(use(Counter()))"),
    ("def use(*, c):\n    return c.bump()", "r = str(use(c=Counter()))"),
    ("def use(*c):\n    return c.count(1)", "r = str(use(1, 1))"),
    ("def use(**c):\n    return c.get('a')", "r = str(use(a=2))"),
    ("def use():\n    c = Counter()\n    return c.bump()", "r = str(use())"),
    ("def use():\n    c: Counter = Counter()\n    return c.bump()", "r = str(use())"),
    ("def use(a, *xs, **kw):\n    return xs[0].bit_length() + kw['b'].bump()", "r = str(use(c, 2, x=c, b=Counter()))"),
    # (a name the function binds to its parameter, then to another object, or to a copy of it)
    ("def use(x):\n    first = x\n    first = Counter()\n    return first.bump()", "r = str(use(c))"),
    ("import copy\ndef use(x):\n    first = copy.copy(x)\n    return first.bump()", "r = str(use(c))"),
    # (a lambda's parameter, or one that only reads the object)
    ("use = lambda c: c.bump()", "r = str(use(Counter()))"),
    ("use = lambda x: x.n + 1", "r = str(use(c))"),
    # (a loop over *args that only reads them, binds the item again, or is passed a new one)
    ("def use(*xs):\n    return sum(x.n + 1 for x in xs)", "r = str(use(c))"),
    ("def use(*xs):\n    out = 0\n    for x in xs:\n        x = Counter()\n        out += x.bump()\n    return out",
     "r = str(use(c))"),
    ("def use(*xs):\n    return sum(x.bump() for x in xs)", "r = str(use(Counter()))"),
    # (a method that only reads what it is passed, is passed a new object, or is another class's of that name)
    ("class User:\n    def use(self, x):\n        return x.n + 1\nu = User()", "r = str(u.use(c))"),
    ("class User:\n    @staticmethod\n    def use(x):\n        return x.n + 1\nu = User()", "r = str(u.use(c))"),
    ("class User:\n    def use(self, x):\n        return x.bump()\nu = User()", "r = str(u.use(Counter()))"),
    ("class User:\n    def use(self, x):\n        return x.bump()\nclass Reader:\n    def use(self, x):\n"
     "        return x.n + 1\nu = Reader()", "r = str(u.use(c))"),
    # (a row cell that binds the name to its own function before the call calls that one: the set-up's was
    # followed, and c noted as changed by `x.bump()` in use())
    *[(use, cell) for use in ("def use(x):\n    return x.bump()", "use = lambda x: x.bump()")
      for cell in ("use = lambda x: x.n + 1\nr = str(use(c))", "def use(x):\n    return x.n + 1\nr = str(use(c))")],
])
def test_a_setup_functions_own_variable_is_not_the_setup_object_of_its_name(tmp_path, monkeypatch, use, cell):
    """A set-up function's parameter (plain, annotated, keyword-only, *args, **kwargs) or local
    variable named like a set-up object (c, a Counter) was taken for that object where the rows
    called the function: the note said c carries over from row to row, though each row's c is its
    own, and the job's rows give what each pass of the notebook gives."""
    notes, passes, rows = _one_cell_job(tmp_path, monkeypatch, f"{_COUNTER}\n{use}", cell)
    assert rows == passes and notes == [], notes


_SEEN = "def seen(x, acc=[]):\n    acc.append(x)\n    return len(acc)"


@pytest.mark.parametrize("setup, cell, job", [
    (_SEEN, "r = str(seen(q))", "123"),
    ("def seen(x, *, acc={}):\n    acc[x] = 1\n    return len(acc)", "r = str(seen(q))", "123"),
    (_SEEN + "\ndef use(x):\n    return seen(x)", "r = str(use(q))", "123"),  # (through a set-up function)
    ("seen = lambda x, acc=[]: acc.append(x) or len(acc)", "r = str(seen(q))", "123"),  # (a lambda's)
    # (by another name, a set-up cell's or a row cell's: no note before)
    (_SEEN + "\ng = seen", "r = str(g(q))", "123"),
    (_SEEN, "g = seen\nr = str(g(q))", "123"),
    (_SEEN + "\ng = seen", "r = str(g(q, []))", "111"),
    (_SEEN + "\ng = seen\ng = len", "r = str(g(q) + seen(q, []) - 1)", "111"),
    (_SEEN + "\ng = seen", "g = len\nr = str(g(q) + seen(q, []) - 1)", "111"),
    # (not where each call passes its own, the default is made per call, bound again, or only read, nor for a
    # function of the row's, whose def runs per row)
    (_SEEN, "r = str(seen(q, []))", "111"),
    (_SEEN, "r = str(seen(q, acc=[]))", "111"),
    ("def seen(x, acc=None):\n    if acc is None:\n        acc = []\n    acc.append(x)\n    return len(acc)",
     "r = str(seen(q))", "111"),
    ("def seen(x, acc=[]):\n    acc = acc + [x]\n    return len(acc)", "r = str(seen(q))", "111"),
    ("def seen(x, acc=[]):\n    return len(acc) + 1", "r = str(seen(q))", "111"),
    ("", _SEEN + "\nr = str(seen(q))", "111"),
    # (a closure of it changes it: noted; a function or lambda in it whose own variable the name is, and a row cell
    # that binds the name to its own function, change another: no note, where one was)
    ("def seen(x, acc=[]):\n    def add():\n        acc.append(x)\n    add()\n    return len(acc)", "r = str(seen(q))",
     "123"),
    ("def seen(x, acc=[]):\n    def add(acc):\n        acc.append(x)\n        return len(acc)\n    return add([])",
     "r = str(seen(q))", "111"),
    ("def seen(x, acc=[]):\n    return (lambda acc: acc.append(x) or len(acc))([])", "r = str(seen(q))", "111"),
    (_SEEN, _SEEN + "\nr = str(seen(q))", "111"),
    (_SEEN, "r = str(seen(q))\nseen = lambda x: 0", "123"),  # (bound after the call: the call is the set-up one's)
    ("seen = lambda x, acc=[]: acc.append(x) or len(acc)", "seen = lambda x, acc=[]: acc.append(x) or len(acc)\n"
     "r = str(seen(q))", "111"),
])
def test_a_setup_functions_default_the_rows_change_carries_over_as_noted(tmp_path, monkeypatch, setup, cell, job):
    """def seen(x, acc=[]) in a set-up cell, seen(q) per row: the def makes the list once, so the job's
    rows gave 1, 2, 3, where each pass of the notebook, which runs the def anew, gives 1; that went
    without a note."""
    notes, passes, rows = _one_cell_job(tmp_path, monkeypatch, setup, cell)
    assert passes == ["1", "1", "1"] and rows == list(job)
    name = "acc" if job == "123" else None
    assert notes == ([] if name is None else [
        "cell 1: seen, which the rows call, changes in place its default acc, which the def makes once (a call that "
        "leaves it out gets that one): what one row changes, the next row sees, where each pass of the notebook runs "
        f"the def anew; default it to None and make a new one in the function (`if acc is None: acc = "
        f"{'{}' if 'acc={}' in setup else '[]'}`), and rows running at once (--num-threads above 1) share it"]), notes


def test_two_setup_functions_defaults_the_rows_change_are_each_noted(tmp_path, monkeypatch):
    """seen(q) and seen2(q) per row, each of a def with acc=[]: the job's rows go 1, 2, 3 for each, where
    each pass of the notebook gives 1, and each is noted."""
    setup = _SEEN + "\n" + _SEEN.replace("seen", "seen2")
    notes, passes, rows = _one_cell_job(tmp_path, monkeypatch, setup, "r = str(seen(q) + seen2(q) - 1)")
    assert passes == ["1", "1", "1"] and rows == ["1", "3", "5"]
    assert [n.split(",")[0] for n in notes] == ["cell 1: seen", "cell 1: seen2"], notes


_MAKE = "def make():\n    log = []\n    def add(x):\n        log.append(x)\n        return len(log)\n    return add"


@pytest.mark.parametrize("setup, cell, changed", [
    (_MAKE + "\nadd = make()", "r = str(add(q))", "log"),
    ("def make():\n    n = 0\n    def add(x):\n        nonlocal n\n        n += 1\n        return n\n    return add\n"
     "add = make()", "r = str(add(q))", "n"),
    ("def make():\n    log = []\n    return lambda x: log.append(x) or len(log)\nadd = make()", "r = str(add(q))", "log"),
    (_MAKE + "\nadd = make()\ndef use(x):\n    return add(x)", "r = str(use(q))", "log"),  # (through a set-up function)
    # (a closure the row makes, one whose function binds its own list, or makes it per call)
    (_MAKE, "add = make()\nr = str(add(q))", None),
    (_MAKE.replace("log.append(x)", "log = [x]") + "\nadd = make()", "r = str(add(q))", None),
    (_MAKE.replace("    log = []\n", "").replace("log.append(x)", "log = []\n        log.append(x)") + "\nadd = make()",
     "r = str(add(q))", None),
])
def test_a_closure_a_setup_cell_makes_that_the_rows_change_carries_over_as_noted(tmp_path, monkeypatch, setup, cell,
                                                                                  changed):
    """add = make() in a set-up cell, add(q) per row, where add appends to make()'s list: the job makes
    the closure once, so its rows gave 1, 2, 3, where each pass of the notebook gives 1, without a note."""
    notes, passes, rows = _one_cell_job(tmp_path, monkeypatch, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if changed is None else ["1", "2", "3"])
    assert notes == ([] if changed is None else [
        f"cell 1: add, which make() makes once here and the rows use, changes the variable {changed} of that call of "
        "make(), which it keeps: what one row changes, the next row sees, where each pass of the notebook makes it "
        "anew; call make() in a cell that runs per row (add = make(...) after the first %%lm cell), and rows running "
        "at once (--num-threads above 1) share it"]), notes


_GEN_XYZ = "def g():\n    yield from 'xyz'\n"


@pytest.mark.parametrize("setup, cell, job, held", [
    # (a set-up list or dict of plain values and objects: the objects carry over where the rows use them, as in a
    # list of objects alone, but went without a note, where the export took only containers of objects alone)
    (_COUNTER + "\nitems = [1, Counter()]", "r = str(items[1].bump())", ["1", "2", "3"],
     "a list holding an instance of Counter"),
    (_COUNTER + "\nitems = (1, Counter(), 2)", "r = str(items[-2].bump() + items[-1])", ["3", "4", "5"],
     "a tuple holding an instance of Counter"),
    (_COUNTER + "\nitems = {'a': Counter(), 'b': 3}", "r = str(items['a'].bump())", ["1", "2", "3"],
     "a dict holding an instance of Counter"),
    (_GEN_XYZ + "items = [1, g()]", "r = next(items[1])", ["x", "y", "z"], "a list holding an iterator (g())"),
    ("items = {'a': iter('xyz'), 'b': 3}", "for r in items['a']:\n    break", ["x", "y", "z"],
     "a dict holding an iterator (iter())"),
    ("import random\nitems = ['ab', random.Random(0)]", "r = str(items[1].randrange(1000))",
     (lambda rng: [str(rng.randrange(1000)) for _ in "BCD"])(__import__("random").Random(0)),
     "a list holding a random number generator (random.Random())"),
    (_COUNTER + "\nitems = [1, Counter()]", "r = ''\nfor h in items:\n    if isinstance(h, Counter):\n"
     "        r += str(h.bump())", ["1", "2", "3"], "a list holding an instance of Counter"),
    # (a set-up that moves or sets its items after the display: the index or key written no longer says which
    # item it is, and the Counter the rows use went without a note)
    # (the item by another name, taken out or unpacked: x.bump() went without a note, as a name no set-up binds)
    (_COUNTER + "\nitems = [1, Counter()]", "x = items[1]\nr = str(x.bump())", ["1", "2", "3"],
     "a list holding an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in cell 3, "
     "x being `items[1]`)"),
    (_COUNTER + "\nitems = [1, Counter()]", "xs = items\nr = str(xs[1].bump())", ["1", "2", "3"],
     "a list holding an instance of Counter that this cell makes once, is used by the rows (`xs[1].bump()` in cell 3, "
     "xs being `items`)"),
    # (or by a name for a name: xs = items, then x = xs[1] or max(xs, ...), went without a note)
    (_COUNTER + "\nitems = [1, Counter()]", "xs = items\nx = xs[1]\nr = str(x.bump())", ["1", "2", "3"],
     "a list holding an instance of Counter that this cell makes once, is used by the rows (`x.bump()` in cell 3, "
     "x being `items[1]`)"),
    (_COUNTER + "\nitems = [Counter(), Counter()]", "xs = items\nx = max(xs, key=id)\nr = str(x.bump())",
     ["1", "2", "3"], "a list of instances of Counter that this cell makes once, is used by the rows (`x.bump()` in "
     "cell 3, x being `max(items, key=id)`)"),
    (_COUNTER + "\nitems = [1, Counter()]", "xs = items\nys = xs\na, b = ys\nr = str(b.bump())", ["1", "2", "3"],
     "a list holding an instance of Counter that this cell makes once, is used by the rows (`b.bump()` in cell 3, "
     "b being `items[1]`)"),
    (_COUNTER + "\nitems = [1, Counter()]", "a, b = items\nr = str(b.bump())", ["1", "2", "3"],
     "a list holding an instance of Counter that this cell makes once, is used by the rows (`b.bump()` in cell 3, "
     "b being `items[1]`)"),
    (_COUNTER + "\nitems = [1, Counter()]\nitems.reverse()", "r = str(items[0].bump())", ["1", "2", "3"],
     "a list holding an instance of Counter"),
    # (or by a function: random.shuffle(items) or a set-up function's xs.reverse() went without a note; Random(1)
    # puts the Counter first)
    (_COUNTER + "\nitems = [1, Counter()]\nimport random\nrandom.Random(1).shuffle(items)", "r = str(items[0].bump())",
     ["1", "2", "3"], "a list holding an instance of Counter"),
    (_COUNTER + "\nitems = [1, Counter()]\ndef swap(xs):\n    xs.reverse()\nswap(items)", "r = str(items[0].bump())",
     ["1", "2", "3"], "a list holding an instance of Counter"),
    (_COUNTER + "\nitems = [1, Counter()]\nitems.sort(key=lambda v: isinstance(v, int))", "r = str(items[0].bump())",
     ["1", "2", "3"], "a list holding an instance of Counter"),
    (_COUNTER + "\nitems = {'a': 1, 'b': Counter()}\nitems['a'] = items.pop('b')", "r = str(items['a'].bump())",
     ["1", "2", "3"], "a dict holding an instance of Counter"),
    # (an object the set-up stores in a list or dict of plain values alone, by index, key, append or setdefault: the
    # export took it for plain, and the Counter the rows use went without a note)
    (_COUNTER + "\nitems = [1, 2]\nitems[0] = Counter()", "r = str(items[0].bump() + items[-1])", ["3", "4", "5"],
     "a list holding an instance of Counter"),
    (_COUNTER + "\nitems = {}\nitems['a'] = Counter()", "r = str(items['a'].bump())", ["1", "2", "3"],
     "a dict of instances of Counter"),
    (_COUNTER + "\nitems = [1, 2]\nitems.append(Counter())", "r = str(items[2].bump())", ["1", "2", "3"],
     "a list holding an instance of Counter"),
    (_COUNTER + "\nitems = {'b': 2}\nitems.setdefault('a', Counter())", "r = str(items['a'].bump())",
     ["1", "2", "3"], "a dict holding an instance of Counter"),
    # (or in a loop, where which index or key it takes is not known)
    (_COUNTER + "\nitems = {}\nfor k in 'ab':\n    items[k] = Counter()", "r = str(items['a'].bump())", ["1", "2", "3"],
     "a dict of instances of Counter"),
    (_COUNTER + "\nitems = [1, 2]\nfor _ in range(1):\n    items.append(Counter())", "r = str(items[2].bump())",
     ["1", "2", "3"], "a list holding an instance of Counter"),
    # (an item reached through a starred target, a slice, or a builtin that picks one: max(items, key=f), min,
    # next(iter(items)), sorted(items)[0]; all went without a note)
    (_COUNTER + "\nitems = [1, Counter()]", "a, *m = items\nr = str(m[0].bump())", ["1", "2", "3"],
     "a list holding an instance of Counter that this cell makes once, is used by the rows (`m[0].bump()` in cell 3, "
     "m being `items[1:]`)"),
    (_COUNTER + "\nitems = [Counter(), 1, 2]", "*m, b = items\nr = str(m[0].bump() + b)", ["3", "4", "5"],
     "a list holding an instance of Counter"),
    (_COUNTER + "\nitems = [1, Counter()]", "r = ''\nfor h in items[1:]:\n    r += str(h.bump())", ["1", "2", "3"],
     "a list holding an instance of Counter"),
    (_GEN_XYZ + "items = [1, g()]", "a, *m = items\nfor h in m:\n    r = next(h)", ["x", "y", "z"],
     "a list holding an iterator (g()) that this cell makes once, is used by the rows (`next(h)` in cell 3, an item of "
     "`m`)"),
    (_COUNTER + "\nitems = [Counter(), Counter()]", "r = str(max(items, key=lambda h: h.n).bump())", ["1", "2", "3"],
     "a list of instances of Counter that this cell makes once, is used by the rows (`max(items, key=lambda h: h.n)"
     ".bump()` in cell 3)"),
    (_COUNTER + "\nitems = (Counter(), 5)", "x = min(items[:1], key=id)\nr = str(x.bump())", ["1", "2", "3"],
     "a tuple holding an instance of Counter"),
    (_COUNTER + "\nitems = [Counter()]", "r = str(next(iter(items)).bump())", ["1", "2", "3"],
     "a list of instances of Counter"),
    (_COUNTER + "\nitems = [Counter(), Counter()]", "xs = sorted(items, key=id)\nr = str(xs[0].bump())",
     ["1", "2", "3"], "a list of instances of Counter"),
    # (an item passed to a function of the row's that changes it: no note before)
    (_COUNTER + "\nitems = [1, Counter()]", "def f(h):\n    return h.bump()\nr = str(f(items[1]))", ["1", "2", "3"],
     "a list holding an instance of Counter that this cell makes once, is used by the rows (`h.bump()` in cell 3, in "
     "its f(), h being `items[1]`)"),
    # (a list, dict or set made by its constructor, list(), dict(a=...), or a set display: the export took list() for
    # no container, and the Counter stored in it went without a note)
    (_COUNTER + "\nitems = list()\nitems.append(Counter())", "r = str(items[0].bump())", ["1", "2", "3"],
     "a list of instances of Counter"),
    (_COUNTER + "\nitems = dict()\nitems['a'] = Counter()", "r = str(items['a'].bump())", ["1", "2", "3"],
     "a dict of instances of Counter"),
    (_COUNTER + "\nitems = dict(a=Counter(), b=2)", "r = str(items['a'].bump() + items['b'])", ["3", "4", "5"],
     "a dict holding an instance of Counter"),
    (_COUNTER + "\nitems = set()\nitems.add(Counter())", "r = ''\nfor h in items:\n    r += str(h.bump())",
     ["1", "2", "3"], "a set of instances of Counter that this cell makes once, is used by the rows (`h.bump()` in "
     "cell 3, an item of `items`)"),
    (_COUNTER + "\nitems = {Counter()}", "r = str(next(iter(items)).bump())", ["1", "2", "3"],
     "a set of instances of Counter"),
    # (a row that changes it in place has its own copy of it, and so of the Counter, but shares the generator, which
    # deepcopy cannot copy)
    (_GEN_XYZ + "items = {'a': g(), 'b': 3}", "r = next(items.get('a'))", ["x", "y", "z"],
     "a dict holding an iterator (g())"),
    (_GEN_XYZ + "items = [1, g()]", "items.append(0)\nr = next(items[1])", ["x", "y", "z"],
     "a list holding an iterator (g())"),
    (_COUNTER + "\nitems = [1, Counter()]", "items.append(0)\nr = str(items[1].bump())", None, None),
    # (an item the rows use that is a plain value, or an object's method that only reads it: nothing carries over)
    (_GEN_XYZ + "items = ['ab', g()]", "r = items[0].upper()", None, None),
    (_COUNTER + "\nitems = [Counter(), 5]", "r = str(items[-1].bit_length())", None, None),
    (_COUNTER + "\nitems = [1, Counter()]", "x = items[0]\nr = str(x.bit_length())", None, None),
    (_COUNTER + "\nitems = [1, Counter()]", "xs = items\nr = str(xs[0].bit_length() + xs.count(1))", None, None),
    (_COUNTER + "\nitems = [1, 2]\nitems[0] = Counter()\nitems.append(Counter())", "r = str(items[1].bit_length())",
     None, None),
    (_COUNTER + "\nitems = {'b': 2}\nitems['a'] = Counter()", "r = str(items['b'].bit_length())", None, None),
    (_COUNTER + "\nitems = dict(a=Counter(), b=2)", "r = str(items['b'].bit_length())", None, None),
    (_COUNTER + "\nitems = [1, Counter()]", "def f(x):\n    return x.bit_length()\nr = str(f(items[0]))", None, None),
    (_COUNTER + "\nitems = [1, Counter()]\ndef show(xs):\n    print(len(xs), xs.index(1))\nshow(items)\nimport random\n"
     "print(random.Random(1).sample(items, 1), sorted(items, key=id))", "r = str(items[0].bit_length())", None, None),
    (_COUNTER + "\nitems = [1, Counter(), 2]", "a, *m, b = items\nr = str(a.bit_length() + b.bit_length())", None,
     None),
    (_COUNTER + "\nitems = [1, Counter()]", "x = items[1]\nx = items[0]\nr = str(x.bit_length())", None, None),
    (_COUNTER + "\nitems = [1, Counter()]", "xs = items\nx = xs[0]\nr = str(x.bit_length())", None, None),
    (_COUNTER + "\nitems = [1, Counter()]", "xs = items\nxs = [2, 3]\nx = xs[1]\nr = str(x.bit_length())", None,
     None),
    (_COUNTER + "\nitems = [Counter(), 1, 2]", "a, *m = items\nr = str(m[0].bit_length() + m[-1])", None, None),
    (_COUNTER + "\nitems = [1, 2, Counter()]", "*m, b = items\nr = str(m[-1].bit_length() + items[1:][0])", None, None),
    (_GEN_XYZ + "items = {'a': 'xy', 'b': g()}", "r = items.get('a').upper() + items['a'][0]", None, None),
    (_COUNTER + "\nitems = ['ab', Counter()]", "r = ''.join(w.upper() for w in items if isinstance(w, str))", None,
     None),
    ("class Tok:\n    def __init__(self):\n        self.vocab = {'A': 1}\n    def encode(self, x):\n"
     "        return self.vocab.get(x, 0)\nitems = [0, Tok()]", "r = str(items[1].encode(q) + items[0])", None, None),
])
def test_a_setup_container_of_plain_values_and_objects_is_noted_for_the_objects_the_rows_change(
        tmp_path, monkeypatch, setup, cell, job, held):
    notes, passes, rows = _one_cell_job(tmp_path, monkeypatch, setup, cell)
    if job is None:  # (each row gives what its pass of the notebook gives, and nothing is noted)
        assert rows == passes and notes == [], notes
        return
    assert passes == [job[0]] * 3  # (each pass of the notebook starts from new objects)
    assert rows == job  # (what the note says: the job's rows go on from the last row's)
    assert len(notes) == 1 and notes[0].startswith(f"cell 1: items, {held}"), notes
    assert notes[0].startswith(f"cell 1: items, {held.split(' that ')[0]} that this cell makes once, is used by the "
                               "rows"), notes


_WORDS = ("class Tok:\n    def __init__(self):\n        self.words = {init}\n{more}    def encode(self, x):\n"
          "        {loop}:\n            return ch + x\n        return x\ntok = Tok()\n{after}")


@pytest.mark.parametrize("init, more, loop, after, job", [
    # (iterating an item of an attribute the class sets to a literal of strings reads it, as iterating the
    # attribute itself does: the break-it review found `for ch in self.words[0]` noted as a change)
    ("['ab', 'cd']", "", "for ch in self.words[0]", "", None),
    ("{'a': ('x', 'y')}", "", "for ch in self.words['a']", "", None),
    ("[['ab', 'c'], 'd']", "", "for ch in self.words[0][0]", "", None),
    ("f'{1}ab'", "", "for ch in self.words[1:]", "", None),
    ("{'a': 'xy'}", "", "for ch in self.words.get('a', '')", "", None),
    # (an item that may be an iterator, which the loop consumes: still noted, and it carries over in the job)
    ("[iter('xyz')]", "", "for ch in self.words[0]", "", ["xB", "yC", "zD"]),
    ("['ab']", "    def add(self, it):\n        self.words.append(it)\n", "for ch in self.words[-1]",
     "tok.add(iter('xyz'))", ["xB", "yC", "zD"]),
    ("['ab']", "    def reset(self, it):\n        self.words = [it]\n", "for ch in self.words[0]",
     "tok.reset(iter('xyz'))", ["xB", "yC", "zD"]),
    # (or that set-up code outside the class sets there, or stores in it: read as the class's literal, no note)
    ("['ab']", "", "for ch in self.words[0]", "tok.words = [iter('xyz')]", ["xB", "yC", "zD"]),
    ("['ab']", "", "for ch in self.words[-1]", "tok.words.append(iter('xyz'))", ["xB", "yC", "zD"]),
    ("'ab'", "", "for ch in self.words", "tok.words = iter('xyz')", ["xB", "yC", "zD"]),
    # (but another class's method setting its own instance's words, which no Tok is: it was noted)
    ("['ab']", "", "for ch in self.words[0]", "class Other:\n    def __init__(self):\n        self.words = iter('xyz')\n"
     "o = Other()", None),
    # (nor set-up code setting words on a new object that is no Tok: it was noted)
    ("['ab']", "", "for ch in self.words[0]", "import types\nns = types.SimpleNamespace()\nns.words = iter('xyz')", None),
    ("['ab']", "", "for ch in self.words[0]", "from types import SimpleNamespace\nns = SimpleNamespace()\n"
     "ns.words = [iter('xyz')]", None),
    ("['ab']", "", "for ch in self.words[0]", "class Other:\n    pass\no = Other()\no.words = [iter('xyz')]", None),
    # (but on a name that may be a Tok: still noted, and it carries over)
    ("['ab']", "", "for ch in self.words[0]", "ns = tok\nns.words = [iter('xyz')]", ["xB", "yC", "zD"]),
    ("['ab']", "", "for ch in self.words[0]", "import random\nns = random.choice([tok])\nns.words = [iter('xyz')]",
     ["xB", "yC", "zD"]),
])
def test_a_method_iterating_an_item_of_a_literal_attribute_reads_it(tmp_path, monkeypatch, init, more, loop, after,
                                                                     job):
    setup = _WORDS.format(init=init, more=more, loop=loop, after=after)
    notes, passes, rows = _one_cell_job(tmp_path, monkeypatch, setup, "r = tok.encode(q)\nfor ch in r:\n    break")
    if job is None:  # (each row gives what its pass of the notebook gives, and nothing is noted)
        assert rows == passes and notes == [], notes
    else:  # (each pass of the notebook starts from a new iterator: x; the job's rows go on from the last row's)
        assert passes == [f"x{q}" for q in "BCD"] and rows == job
        assert [n.split(" (")[0] for n in notes] == ["cell 1: tok, an instance of Tok that this cell makes once, is "
                                                     "used by the rows"], notes


_FIRST = ("class Tok:\n    def __init__(self):\n        self.rows = [[]]\n        self.vocab = {'a': 'x'}\n"
          "    def first(self):\n        return self.rows[0]\n    def word(self, k):\n        return self.vocab.get(k)\n"
          "tok = Tok()")


@pytest.mark.parametrize("cell, noted", [
    # (a row that changes in place the item a read-only method passes out: the job's rows go on from the last's)
    ("tok.first().append(q)\nr = str(len(tok.rows[0]))", "tok.first().append(q)"),
    ("x = tok.first()\nx.append(q)\nr = str(len(tok.rows[0]))", "x = tok.first(); x.append(q)"),
    ("x = tok.first()\nif q:\n    x[:0] = [q]\nr = str(len(tok.rows[0]))", "x = tok.first(); x[:0] = [q]"),
    ("x = tok.first()\nx += [q]\nr = str(len(tok.rows[0]))", "x = tok.first(); x += [q]"),  # (a list's += extends it)
    # (rebound to a value that may be it, or under an if, or after the change: still noted)
    ("x = tok.first()\nx = x if q else []\nx.append(q)\nr = str(len(tok.rows[0]))", "x = tok.first(); x.append(q)"),
    ("x = tok.first()\nif q == 'Z':\n    x = []\nx.append(q)\nr = str(len(tok.rows[0]))",
     "x = tok.first(); x.append(q)"),
    ("x = tok.first()\nx.append(q)\nx = []\nr = str(len(tok.rows[0]))", "x = tok.first(); x.append(q)"),
    # (passed to a function of the row's, or of the set-up's, that changes its parameter in place: no note before)
    ("def f(x):\n    x.append(q)\nf(tok.first())\nr = str(len(tok.rows[0]))", "f(tok.first()); x.append(q)"),
    ("def f(n, x):\n    x += [n]\ny = tok.first()\nf(q, x=y)\nr = str(len(tok.rows[0]))",
     "y = tok.first(); f(q, x=y); x += [n]"),
    ("r = str(len(add(tok.first(), q)))", "r = str(len(add(tok.first(), q))); x.append(y)"),
    # (a row that only reads what is passed out, or changes its own copy, or a lookup's string: no note)
    ("r = str(len(tok.first()) + 1)", None),
    ("x = list(tok.first())\nx.append(q)\nr = str(len(x))", None),
    ("x = tok.word('a')\nx = x.upper()\nr = x", None),
    # (a name bound again to a new list before the change: it no longer names what tok.first() passed out; the
    # export noted x.append(q) as a change of tok's list)
    ("x = tok.first()\nx = []\nx.append(q)\nr = str(len(tok.rows[0]) + len(x))", None),
    ("x = tok.first()\nn = len(x)\nx, y = [], n\nx.append(q)\nr = str(len(tok.rows[0]) + y)", None),
    # (a function that only reads what it is passed, or changes its own copy: no note)
    ("def f(x):\n    return len(x)\nr = str(f(tok.first()) + 1)", None),
    ("def f(x):\n    x = list(x)\n    x.append(q)\n    return x\nr = str(len(f(tok.first())))", None),
    ("x = tok.first()\nx = list(x)\nx.append(q)\nr = str(len(x))", None),
])
def test_a_row_changing_in_place_an_item_a_setup_method_passes_out_is_noted(tmp_path, monkeypatch, cell, noted):
    # tok.first() returns self.rows[0], which export took for a read (such items are strings and numbers more
    # often than not), so a row's tok.first().append(q) got no note, though the job's rows went on from the last
    # row's list (1, 2, 3) where each pass of the notebook starts from a new Tok (1, 1, 1)
    setup = _FIRST + "\ndef add(x, y):\n    x.append(y)\n    return x"  # (a set-up function that changes x)
    notes, passes, rows = _one_cell_job(tmp_path, monkeypatch, setup, cell)
    if noted is None:  # (each row gives what its pass of the notebook gives, and nothing is noted)
        assert rows == passes and notes == [], notes
        return
    assert passes == ["1", "1", "1"] and rows == ["1", "2", "3"]  # (as the note says: it carries over)
    assert notes == [f"cell 1: tok, an instance of Tok that this cell makes once, is used by the rows (`{noted}` in "
                       "cell 3, changing what tok.first() passes out): what its calls change carries over from row to "
                       "row (what one row changes, the next row sees), where each pass of the notebook starts from a "
                       "new one; make it in a cell that runs per row (tok = ... after the first %%lm cell), and rows "
                       "running at once (--num-threads above 1) share it"], notes


def test_a_class_attribute_a_python_lm_cell_changes_starts_each_row_from_the_setup_value(tmp_path, monkeypatch):
    # a %%lm --python body runs on the notebook's globals (PythonCell.program), so its C.n += 1 changes the
    # set-up's class; the export looked for class changes in Python cells only: rows gave B1, C2, D3
    from helpers_export import write_rows

    setup, body = "class C:\n    n = 0", "C.n += 1\ns += q + str(C.n)\ns += lmnb.gen('x', max_tokens=1)"
    source, p = export_notebook(notebook(f"{setup}\nq = 'A'", f"%%lm --python --temperature 0\n{body}"))
    expected = []
    for q in "BCD":  # (each notebook pass: the set-up, then the body's Python on its globals)
        ns = {"q": q}
        exec(setup, ns)
        exec(body.replace("s += lmnb.gen('x', max_tokens=1)", "").replace("s += ", "r = "), ns)
        expected.append(ns["r"])
    assert expected == ["B1", "C1", "D1"]
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]), 0,
                               ["--num-threads", "1"])
    assert prompts == expected
    assert [n.split(":")[:2] for n in p.notes] == [["cell 1", " C.n, a class attribute of this cell that the rows change"]]


@pytest.mark.parametrize("cells", [
    ["total = 0\nfor ch in q:\n    total += 1\nr = str(total)"],
    ["items.append(q)\nr = str(items)"],
    ["from math import *\ntotal = 1\nr = str((total, e))"],
])
def test_a_global_of_a_setup_function_the_rows_do_not_call_stays_each_rows_own(tmp_path, monkeypatch, cells):
    # init() runs once: the row's total (or items) is its own variable (or copy), which rows running at
    # once do not share, as before; it was made the script's global, shared by the rows
    from helpers_export import write_rows

    setup = "def init():\n    global total, items\n    total = 0\n    items = []\ninit()"
    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.shared == p.restored == () and "\n    global " not in source.split("def run_row")[1]
    rows = [{"q": q} for q in ("B", "CC", "DDD")]
    expected = _notebook_passes(setup, cells, rows)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", rows), 0)
    assert sorted(prompts) == sorted([row["q"] for row in rows] + expected)


_EMBED = ("import itertools\nloads = itertools.count(1)\nmodel = None\ndef embed(text):\n    global model\n"
          "    if model is None:\n        model = next(loads)  # (loading a model: the how-many-th load this is)\n"
          "    return model\n")


@pytest.mark.parametrize("setup, cells", [
    (_EMBED, ["r = str(embed(q))"]),
    (_EMBED + "embed('warm')", ["r = str(embed(q))"]),  # (loaded by the set-up already)
    (_EMBED, ["def vector(text):\n    return embed(text)\nr = str(vector(q))"]),  # (called by a row's function)
    (_EMBED.replace("if model is None:", "if not model:"), ["r = str(embed(q))"]),
    # (a flag that says it is made: model is set under the test of loaded)
    (_EMBED.replace("model = None\n", "model = None\nloaded = False\n").replace("global model", "global model, loaded")
     .replace("if model is None:", "if not loaded:\n        loaded = True"), ["r = str(embed(q))"]),
])
def test_a_global_a_setup_function_makes_on_first_use_is_made_once_for_the_rows(tmp_path, monkeypatch, setup, cells):
    # model = None, and embed() loads it on first use: each row started from the set-up's None
    # (Job.restore), so every row loaded the model again (each pass of the notebook loads it once:
    # "1"), one more copy in memory for each row running at once
    prompts, r, p, _ = _job_and_notebook(tmp_path, monkeypatch, setup, cells, rows="BCD", run_setup=['q = "A"'])
    assert r == "1"
    assert prompts == ["B", "1", "C", "1", "D", "1"]
    assert p.notes == []  # (the rows share one model, as they share a set-up variable: nothing to warn of)


def test_a_global_made_with_a_value_made_on_first_use_is_kept_with_it(tmp_path, monkeypatch):
    # vocab, made in the same `if model is None:` block, was restored to the set-up's [] at each row's
    # start while model was kept: rows after the first read an empty vocab (the notebook's pass: 2)
    setup = _EMBED.replace("model = None\n", "model = None\nvocab = []\n").replace(
        "global model", "global model, vocab").replace("model = next(loads)", "vocab = ['a', 'b']\n        model = next(loads)")
    prompts, r, p, _ = _job_and_notebook(tmp_path, monkeypatch, setup, ["r = f'{embed(q)} {len(vocab)}'"], rows="BCD",
                                         run_setup=['q = "A"'])
    assert r == "1 2"
    assert prompts == ["B", r, "C", r, "D", r]
    assert p.notes == []


@pytest.mark.parametrize("setup, cells, expected", [
    ("best = None\ndef consider(n):\n    global best\n    if best is None or n > best:\n        best = n\n",
     ["for w in q.split():\n    consider(len(w))\nr = str(best)"], ["3", "1", "2"]),
    ("failed = False\ndef fail():\n    global failed\n    failed = True\n",
     ["if len(q) > 1:\n    fail()\nr = str(failed)"], ["True", "False", "True"]),
    # (set by a match capture, which the plan's reading of a binding missed: kept, as if made on first use)
    ("best = None\ndef consider(n):\n    global best\n    match n:\n        case int() as best:\n            pass\n",
     ["r = str(best)\nconsider(len(q))"], ["None", "None", "None"]),
])
def test_a_global_a_setup_function_sets_under_another_test_than_none_starts_each_row_from_none(
        tmp_path, monkeypatch, setup, cells, expected):
    # best = None, and consider() keeps the longest word: a value made on first use is not restored
    # per row (model = None), but this one, set under `best is None or ...`, changes on later calls:
    # each row starts from the set-up's None, as each pass of the notebook does (and a flag set
    # False, that a call sets True whatever it was)
    from helpers_export import write_rows

    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    rows = [{"q": q} for q in ("BBB", "C", "DD")]
    prompts = [text for row, r in zip(rows, _notebook_passes(setup, cells, rows)) for text in (row["q"], r)]
    assert prompts[1::2] == expected
    _, job_prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", rows), 0,
                                   ["--num-threads", "1"])
    assert job_prompts == prompts


_SETPI = "def setpi():\n    global pi\n    pi = 3\n"


@pytest.mark.parametrize("setup, cells", [
    ("", [_SETPI + "setpi()\nfrom math import *\nr = str(pi)"]),
    ("", [_SETPI + "setpi()", "from math import *\nr = str(pi)"]),
    (_SETPI, ["pi = 1\nsetpi()\nfrom math import *\nr = str(pi)"]),  # (a set-up function's, which the row sets too)
    ("", [_SETG + "setg()\nfrom math import *\nr = str(g)"]),  # (math has no g: the function's value stays)
    ("e = 0\n" + _BUMP.replace("count", "e"), ["bump()\nfrom math import *\nr = str(e)"]),  # (a set-up function's)
    (_SETG, ["from math import *\ntry:\n    r = str(g)\nexcept NameError:\n    r = 'none'"]),  # (setg() not called)
])
def test_a_per_row_star_import_sets_a_name_a_function_sets_by_global(tmp_path, monkeypatch, setup, cells):
    # run_row reads such a name as the script's global, which the row's `from math import *` left as
    # setpi() set it (3), where the notebook's import replaced it with math's pi
    import math

    prompts, r, _, _ = _job_and_notebook(tmp_path, monkeypatch, setup, cells)
    assert r in (str(math.pi), "5", str(math.e), "none")
    assert prompts == ["B", r, "C", r]


@pytest.mark.parametrize("cell, deleted", [
    ("bump()\nfrom math import *\nr = str(count)", False),
    ("bump()\ndel count\nfrom math import *\ntry:\n    r = str(count)\nexcept NameError:\n    r = 'none'", True),
])
def test_a_kept_global_is_deleted_after_a_per_row_star_import_only_where_the_row_deleted_it(tmp_path, monkeypatch,
                                                                                          cell, deleted):
    # job.restore binds the set-up's count at each row's start, so the script's `if count is
    # job.UNBOUND: del count` after the import could not apply, but after the row's own `del count`
    prompts, r, _, source = _job_and_notebook(tmp_path, monkeypatch, "count = 0\n" + _BUMP, [cell])
    assert ("if count is job.UNBOUND:" in source) == deleted
    assert prompts == ["B", r, "C", r] and r in ("1", "none")


@pytest.mark.parametrize("setup, cells", [
    ("", ["from math import *\ndel pow\nr = str(pow(2, 2))"]),
    ("", ["from math import *", "if True: del pow  # c\nr = str(pow(2, 2))"]),  # (after it on its line)
    ("pow = 5", ["from math import *\ndel pow\nr = str(pow(2, 2))"]),  # (the set-up's value is deleted too)
    ("from math import *", ["pi = 3\nlen = 3\ndel pi, len\nr = str(len('ab'))"]),  # (no star import per row)
    # (bound to the builtin itself first: job.deletable took that for no pow at all and raised NameError)
    ("import builtins", ["pow = builtins.pow\ndel pow\nr = str(pow(2, 2))"]),
    ("import builtins", ["pow = builtins.pow", "del pow\nr = str(pow(2, 2))"]),
    ("import builtins\npow = builtins.pow", ["del pow\nr = str(pow(2, 2))"]),
    ("import builtins", ["from math import *\npow = builtins.pow\ndel pow\nr = str(pow(2, 2))"]),
    # (bound so in the del's own block: the check raised NameError there too)
    ("import builtins", ["for i in range(2):\n    pow = builtins.pow\n    del pow\nr = str(pow(2, 2))"]),
    ("import builtins", ["try:\n    pow = builtins.pow\n    del pow\nexcept ValueError:\n    pass\nr = str(pow(2, 2))"]),
])
def test_a_del_of_a_builtins_name_in_a_row_cell_gives_the_builtin_back(tmp_path, monkeypatch, setup, cells):
    # the notebook's `del pow` removes its global, so that pow(2, 2) finds the builtin; run_row's
    # variable pow was left unbound, and every row failed with UnboundLocalError
    prompts, r, p, _ = _job_and_notebook(tmp_path, monkeypatch, setup, cells, rows="B")
    assert p.inputs == ("q",)
    assert r in ("4", "2")
    assert prompts == ["B", r]


_MAYBE_Y = "if len('a') == 2:\n    y = 1"
_DEL_POW = "try:\n    del pow\n    r = 'deleted'\nexcept NameError as e:\n    r = str(e)"


@pytest.mark.parametrize("cells", [
    ["from math import *\ndel pow\n" + _DEL_POW],  # (the first del gave the builtin back: a second one is a NameError)
    ["from math import *", "del pow", _DEL_POW],
    [_DEL_POW, "from math import *"],  # (no pow to delete before the import)
    ["from math import *\n" + _DEL_POW],  # (math's pow, deleted)
    ["from math import *", _DEL_POW],
])
def test_a_del_of_a_builtins_name_in_a_row_cell_deletes_as_the_notebooks_does(tmp_path, monkeypatch, cells):
    # run_row's pow held the builtin again after `del pow`, so a second `del pow` succeeded where the
    # notebook's raised NameError (its global was gone); a del of math's pow that no cell read failed
    # with UnboundLocalError (run_row's pow was never given math's value)
    prompts, r, _, _ = _job_and_notebook(tmp_path, monkeypatch, "", cells)
    assert r in ("deleted", "name 'pow' is not defined")
    assert prompts == ["B", r, "C", r]


@pytest.mark.parametrize("setup, cells", [
    ("y = 5", ["del y\nr = 'deleted'"]),
    ("y = 5", ["del y", "try:\n    del y\n    r = 'deleted'\nexcept NameError:\n    r = 'none'"]),
    ("import builtins\npow = builtins.pow", ["del pow", _DEL_POW]),
])
def test_a_del_of_a_setup_global_the_rows_do_not_read_deletes_as_the_notebooks_does(tmp_path, monkeypatch, setup,
                                                                                    cells):
    # run_row's `del y` made y its own variable, never bound: UnboundLocalError failed every row, where
    # the notebook's del removes its global (the setup's y was copied into run_row only where a row read it)
    prompts, r, _, _ = _job_and_notebook(tmp_path, monkeypatch, setup, cells)
    assert r in ("deleted", "none", "name 'pow' is not defined")
    assert prompts == ["B", r, "C", r]


@pytest.mark.parametrize("setup, cells", [
    (_MAYBE_Y, ["try:\n    del y\n    r = 'deleted'\nexcept NameError:\n    r = 'none'"]),
    (_MAYBE_Y, ["try:\n    r = str(y)\nexcept NameError:\n    r = 'none'\ny = 2"]),
    (_MAYBE_Y.replace("2", "1"), ["y += 1\nr = str(y)"]),  # (bound in the if after all)
    (_MAYBE_Y + "\nfrom math import *", ["from math import *\ntry:\n    r = str(y)\nexcept NameError:\n    r = 'none'\n"
                                          "y = 2"]),  # (a star import's star_values keep it unbound too)
])
def test_a_setup_global_the_cells_run_once_may_leave_unbound_is_unbound_in_each_row(tmp_path, monkeypatch, setup,
                                                                                    cells):
    # run_row bound its own y from globals()["y"]: a KeyError failed every row, where the notebook's row
    # cells read or delete an unbound y (NameError, which they catch) or the one the set-up's if bound
    prompts, r, _, source = _job_and_notebook(tmp_path, monkeypatch, setup, cells)
    assert r in ("none", "2")
    assert prompts == ["B", r, "C", r]


def test_a_timed_lm_cell_is_exported_as_the_lm_cell_it_times():
    """%%time over %%lm runs the %%lm cell in IPython; the exporter took the body for Python and
    dropped it as IPython syntax, so the job lacked that program (and its variable)."""
    from lmnb.export.cells import Dropped, LMCell, read_cells

    nb = notebook('q = "x"', "%%time\n%%lm\n{q}{gen a max_tokens=1}", "%%capture out\n%%bash\necho hi",
                  "%%time\nprint(a)")
    source, p = export_notebook(nb)
    cells = read_cells(nb)
    assert isinstance(cells[1], LMCell) and cells[1].captures == ("a",)
    assert isinstance(cells[2], Dropped) and cells[2].first_line == "%%bash"
    assert "def cell_2(s, q):" in source and 's += lmnb.gen("a", max_tokens=1)' in source
    assert p.inputs == ("q",) and not [n for n in p.notes if "IPython syntax" in n]


def test_a_named_capture_is_said_to_be_unset_in_the_job():
    """%%capture out binds out in the notebook; the job ran without it and each row failed with a
    NameError that the export had not mentioned."""
    nb = notebook('q = "x"', "%%capture --no-stderr out\n%%lm\n{q}{gen a max_tokens=1}", "%%capture\ny = 1",
                  "%%capture log\nprint(a)", "%%capture cap\n%%bash\necho hi")  # (over a dropped magic too)
    notes = [n for n in export_notebook(nb)[1].notes if "capture" in n]
    assert notes == [f"cell {i}: %%capture {opts}: the job does not set {v} (IPython's captured output), so a cell "
                     "that reads it fails there" for i, opts, v in ((2, "--no-stderr out", "out"), (4, "log", "log"),
                                                                    (5, "cap", "cap"))]


@pytest.mark.parametrize("source, where", [
    # lines were counted from the innermost cell magic, as if it opened the cell
    ("%%time\n%%lm\nQ: {q}\nA:{gen a max_token=3}", "cell 2 (%%lm): line 4, col 10: gen has no option"),
    ("\n\n%%lm\nQ: {q}\nA:{gen a max_token=3}", "cell 2 (%%lm): line 5, col 10: gen has no option"),
    ("%%time\n%%capture c\n%%lm --python\ns += 'a'\ns = 1", "cell 2 (%%lm): line 5, col 1: s is the program's"),
    ("%%time\nx = 1\ny = (", "cell 2, line 3: invalid Python: '(' was never closed"),
    ("%%time\nx = 1\n# ask\n%%lm\nQ: {q}{gen a}", "cell 2, line 4: %%lm is below the cell's first line, which the "
     "kernel refuses: a cell magic works only on a cell's first line"),
    # IPython's clean-up dropped the blank lines above the comment: the error's line was one short per blank
    # line (found by the last review)
    ("%%time\n\n# ask\n%%lm\nQ: {q}{gen a}", "cell 2, line 4: %%lm is below the cell's first line"),
    ("\n\n# ask\n%%lm\nQ: {q}{gen a}", "cell 2, line 4: %%lm is below the cell's first line"),
    # (an indented cell's: IPython drops the indentation; the line magic was not named)
    ("%%time\n  # ask\n  %%lm\n  Q: {q}{gen a}", "cell 2, line 3: %%lm is below the cell's first line"),
    # a cell magic below the first line over a body that is Python: the kernel refuses the cell (IPython
    # has no line magic "%%lm"), the export dropped the line with a note and ran the rest (found by the
    # break-it review)
    ("%%time\n# c\n%%lm\nprint(1)", "cell 2, line 3: %%lm is below the cell's first line, which the kernel "
     "refuses: a cell magic works only on a cell's first line"),
    ("x = 1\n\n%%time\nprint(x)", "cell 2, line 3: %%time is below the cell's first line"),
    # (below a line continued over two, which IPython's transform joins: the line numbers differed, and the
    # cell magic was dropped with a note, found by the second break-it review)
    ("x = 1\n!ls \\\n  -a\n%%time\nprint(x)", "cell 2, line 4: %%time is below the cell's first line, which the "
     "kernel refuses"),
    ("y = 2 + \\\n  3\n%%time\nprint(y)", "cell 2, line 3: %%time is below the cell's first line"),
    # what Python refuses past its parser (symtable) ended lmnb export on a SyntaxError traceback
    ("%%time\nx = 1\n\ndef f():\n    from math import *", "cell 2, line 5: invalid Python: import * only allowed at "
     "module level"),
    ("nonlocal q", "cell 2, line 1: invalid Python: nonlocal declaration not allowed at module level"),
])
def test_errors_below_a_cell_magic_give_the_notebook_cells_lines(source, where):
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "x"', source))
    assert str(e.value).startswith(where), str(e.value)


def test_a_moved_setup_cell_with_blank_lines_above_its_code_strips_its_example_line(tmp_path, monkeypatch):
    # the cell's source lost its blank lines above the code, and its example's line (counted with them)
    # then named the line below it: the job commented out `prompt = ...` and kept `q = "x"`, so every
    # row failed with a NameError (found while fixing the one-short line numbers)
    from helpers_export import write_rows

    nb = notebook('\n\nq = "x"\nprompt = q + "!"', "%%lm --temperature 0\n{prompt}{gen a max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.inputs == ("q",)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert prompts == ["B!"]


def test_an_lm_cell_magic_below_the_first_line_is_named_in_the_refusal():
    """A comment above %%lm made the prompt Python to IPython: the refusal said only "invalid
    syntax. Perhaps you forgot a comma?" about the prompt's line."""
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "x"', "# ask\n%%lm\nQ: {q}{gen a max_tokens=1}"))
    assert str(e.value) == ("cell 2, line 2: %%lm is below the cell's first line, which the kernel refuses: a cell "
                            "magic works only on a cell's first line; move it up, or split the cell there")


@pytest.mark.parametrize("indent", ["  ", "\t"])
def test_an_indented_lm_cell_exports_as_the_kernel_runs_it(indent):
    """IPython drops the indentation all of a cell's lines share, so the kernel runs an indented
    %%lm cell; the exporter read it as Python and refused it ("unexpected indent")."""
    cell = "%%lm\nQ: {q}\n\nA:{gen a max_tokens=1}"
    expected = export_notebook(notebook('q = "x"', cell))[0]
    indented = "\n".join(indent + line if line else line for line in cell.split("\n"))
    assert export_notebook(notebook('q = "x"', indented))[0] == expected
    assert export_notebook(notebook('q = "x"', f"\n{indent}\n{indented}"))[0] == expected  # (blank lines above)
    timed = export_notebook(notebook('q = "x"', f"%%time\n{cell}"))[0]
    assert export_notebook(notebook('q = "x"', textwrap.indent(f"%%time\n{cell}", indent)))[0] == timed
    # with a line less indented than %%lm, IPython does not see a cell magic: the kernel refuses it too
    with pytest.raises(ExportError, match=r"^cell 2, line 1: invalid Python: unexpected indent"):
        export_notebook(notebook('q = "x"', f"{indent}%%lm\nQ: {{q}}{{gen a max_tokens=1}}"))


@pytest.mark.parametrize("cell, where", [
    ("\t%%lm\n\tQ: {q}{gen a max_token=1}", "line 2, col 15"),  # the tab is a character: 'm' is the 15th
    ("%%time\n  %%lm\n  Q: {q}{gen a max_token=1}", "line 3, col 16"),  # IPython dedents the %%time body
    ("  %%time\n    %%lm\n    Q: {q}{gen a max_token=1}", "line 3, col 18"),  # ... after the cell
])
def test_an_indented_lm_cell_is_refused_at_its_column_as_typed(cell, where):
    """The columns of an indented %%lm cell were counted without the indentation its lines share
    (col 14 for each of these), left of the text they named; the kernel counts it too."""
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "x"', cell))
    assert str(e.value).startswith(f"cell 2 (%%lm): {where}: gen has no option 'max_token'"), str(e.value)


def test_every_cell_that_cannot_be_exported_is_listed_in_one_error(tmp_path, capsys):
    """Export stopped at the first bad cell, so a notebook with three took three runs to fix; it
    lists them all, as a compiler does, each as its lone error says it (exit status 2 still)."""
    from lmnb_kernel.cli import main

    nb = notebook('q = "x"', "def f(:\n    pass", "%%lm\n", ("md", "fine"), "y = (", "%%lm\nQ: {q}{gen a max_tokens=1}")
    with pytest.raises(ExportError) as e:
        export_notebook(nb)
    assert str(e.value) == (
        "3 cells cannot be exported; fix each, then try again:\n"
        "  - cell 2, line 1: invalid Python: invalid syntax\n"
        "  - cell 3: the %%lm cell body is empty; write the prompt below the %%lm line\n"
        "  - cell 5, line 1: invalid Python: '(' was never closed")
    nbformat.write(nb, tmp_path / "nb.ipynb")
    assert main(["export", str(tmp_path / "nb.ipynb"), "-o", str(tmp_path / "job.py")]) == 2
    assert capsys.readouterr().err == f"lmnb export: {tmp_path / 'nb.ipynb'}: {e.value}\n"
    assert not (tmp_path / "job.py").exists()
    # a cell's message of several lines (a caret under the column) stays whole, under its cell's dash
    with pytest.raises(ExportError) as e:
        export_notebook(notebook("y = (", "%%lm\nQ {gen a max_token=1}"))
    lines = str(e.value).split("\n")
    assert lines[1:3] == ["  - cell 1, line 1: invalid Python: '(' was never closed",
                          "  - cell 2 (%%lm): line 2, col 10: gen has no option 'max_token'; did you mean 'max_tokens'?"]
    assert lines[3:] and all(line.startswith("    ") for line in lines[3:]), lines


def test_a_pasted_session_in_a_python_lm_cell_exports_as_the_kernel_runs_it():
    """IPython takes the '>>> ' / '... ' prompts of a pasted session off a --python body, so the
    kernel runs it; the exporter parsed the body as typed: "invalid syntax"."""
    clean = '%%lm --python\nfor w in ["A", q]:\n    s += w\ns += lmnb.gen("a", max_tokens=1)'
    pasted = '%%lm --python\n>>> for w in ["A", q]:\n...     s += w\n>>> s += lmnb.gen("a", max_tokens=1)'
    expected = export_notebook(notebook('q = "x"', clean))[0]
    assert export_notebook(notebook('q = "x"', pasted))[0] == expected
    assert export_notebook(notebook('q = "x"', textwrap.indent(pasted, "    ")))[0] == expected
    # a prompt cell keeps its '>>> ' lines: they are text for the model
    assert 's += ">>> 1\\n"' in export_notebook(notebook("%%lm\n>>> 1\n{gen a max_tokens=1}"))[0]


def test_a_python_lm_cell_of_comments_only_exports_as_the_program_the_kernel_runs():
    """The kernel runs a --python body of comments only as a program that adds nothing; the
    exporter failed on it with a bare IndentationError traceback (reading the names it uses)."""
    from helpers_lang import ScriptedBackend

    source, p = export_notebook(notebook('q = "x"', "%%lm --python\n# to do: ask about {q}\n",
                                         "%%lm\nQ: {q}{gen a max_tokens=1}"))
    assert "    # to do: ask about {q}\n    pass\n" in source
    assert [c.reads for c in p.lm_cells] == [(), ("q",)]  # (the comment reads nothing)
    ns = {"__name__": "exported"}
    exec(compile(source, "job.py", "exec"), ns)
    assert ns["cell_2"].run(backend=ScriptedBackend()).text() == ""


def test_a_cell_magic_line_ends_at_a_lone_carriage_return_as_in_ipython():
    """IPython ends a cell's first line at a lone \\r (str.splitlines); the exporter read the whole
    cell as the %%lm line: "unrecognized arguments: {q}{gen a max_tokens=1}"."""
    expected = export_notebook(notebook('q = "x"', "%%lm\n{q}\r{gen a max_tokens=1}"))[0]
    assert export_notebook(notebook('q = "x"', "%%lm\r{q}\r{gen a max_tokens=1}"))[0] == expected
    # the \r inside the cell is a line break to the template, in the job as in the kernel (parse)
    assert 's += f"{q}\\n"' in expected and 's += f"{q}\\n"' in parse("{q}\r{gen a max_tokens=1}").to_python()


def test_a_notebook_with_a_byte_order_mark_is_read_and_one_not_in_utf8_is_named(tmp_path, capsys):
    """A notebook saved with a UTF-8 byte order mark (Notepad) was "not JSON" to lmnb export and
    lmnb run; a Latin-1 one was refused with the codec's bare message."""
    from lmnb.export import read_notebook
    from lmnb_kernel.cli import main

    plain = tmp_path / "qa.ipynb"
    nbformat.write(QA, plain)
    bom = tmp_path / "bom.ipynb"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert read_notebook(bom) == read_notebook(plain)
    assert main(["export", str(bom), "-o", str(tmp_path / "qa.py")]) == 0
    assert (tmp_path / "qa.py").read_text() == export_notebook(
        QA, "bom.ipynb", "qa.py", reexport="lmnb export bom.ipynb -o qa.py --inputs NAMES")[0]
    latin = tmp_path / "latin.ipynb"
    latin.write_bytes(plain.read_bytes().replace(b"Q: ", "Q\u00e9: ".encode("latin-1"), 1))
    capsys.readouterr()
    assert main(["export", str(latin), "-o", str(tmp_path / "l.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lmnb export: cannot read {latin}: not UTF-8 text (invalid continuation byte at byte ")
    assert err.endswith("a notebook is UTF-8 JSON: save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)\n")
    # after a byte order mark the byte is its offset in the file, as a hex editor shows it (it was
    # counted from after the mark, which the reading skips: 3 less); found by searching the file's bytes
    latin.write_bytes(b"\xef\xbb\xbf" + latin.read_bytes())
    offset = latin.read_bytes().index(b"\xe9")
    assert main(["export", str(latin), "-o", str(tmp_path / "l.py")]) == 2
    assert capsys.readouterr().err.startswith(f"lmnb export: cannot read {latin}: not UTF-8 text (invalid "
                                              f"continuation byte at byte {offset});")
    (tmp_path / "empty.ipynb").write_bytes(b"\n")
    assert main(["export", str(tmp_path / "empty.ipynb"), "-o", str(tmp_path / "e.py")]) == 2
    assert capsys.readouterr().err == (f"lmnb export: cannot read {tmp_path / 'empty.ipynb'}: the file is empty; "
                                       "save the notebook from Jupyter again (File > Save)\n")


def test_run_and_export_of_a_script_or_other_non_notebook_say_it_is_no_notebook(tmp_path, capsys, monkeypatch):
    """`lmnb run job.py` said "Notebook does not appear to be JSON: 'print(1)...'", and `lmnb export
    job.py` "the output job.py is a notebook"; `lmnb export .` ended in a ValueError traceback and
    `lmnb export missing.ipynb` said "[Errno 2] No such file or directory"."""
    from lmnb_kernel.cli import main

    monkeypatch.chdir(tmp_path)
    Path("my job.py").write_text("print(1)\n")
    Path("cut.ipynb").write_text('{"cells": \n')
    Path("notes.txt").write_text("notes\n")
    Path("runs").mkdir()
    not_json = ("not a notebook: a notebook (.ipynb) is JSON, and this text is not (line {}, column 1: Expecting "
                "value); give the .ipynb file, or, if this is one, save it from Jupyter again (an edit or a cut-short "
                "save broke it)")
    for given, said in [
        ("my job.py", "cannot read my job.py: not a notebook (.ipynb JSON) but a Python script; run it with python "
                      "'my job.py', or make a notebook of it first (e.g. jupytext --to notebook 'my job.py')"),
        ("cut.ipynb", "cannot read cut.ipynb: " + not_json.format(2)),
        ("notes.txt", "cannot read notes.txt: " + not_json.format(1)),
        ("missing.ipynb", "no such notebook: missing.ipynb"),
        ("runs", "runs is a folder, not a notebook; name the .ipynb file in it"),
        (".", ". is a folder, not a notebook; name the .ipynb file in it"),
    ]:
        for command in ("run", "export"):
            assert main([command, given]) == 2, (command, given)
            assert capsys.readouterr().err == f"lmnb {command}: {said}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.ipynb", "my job.py", "notes.txt", "runs"]


def test_a_notebook_holding_a_lone_surrogate_is_refused_at_its_cell_and_line(tmp_path, capsys):
    # JSON can escape half a UTF-16 pair ("\ud800"); lmnb export and lmnb run ended on a
    # UnicodeEncodeError traceback (ast.parse, and nbformat.write after every cell had run)
    from lmnb_kernel.cli import main

    data = json.loads(nbformat.writes(notebook("x = 1", "%%lm\nQ: {x}\nA: \ud800{gen a max_tokens=2}")))
    path = tmp_path / "half.ipynb"
    path.write_text(json.dumps(data))  # (ensure_ascii: the surrogate is written as the escape \ud800)
    why = ("cell 2, line 3: the lone surrogate '\\ud800' is half of a UTF-16 pair and no character, so Python "
           "cannot run code that holds it; delete it, or write the character it was part of\n")
    capsys.readouterr()
    assert main(["export", str(path), "-o", str(tmp_path / "half.py")]) == 2
    assert capsys.readouterr().err == f"lmnb export: {path}: {why}"
    assert main(["run", str(path)]) == 2
    assert capsys.readouterr().err == f"lmnb run: cannot read {path}: {why}"
    assert not (tmp_path / "half.py").exists() and not (tmp_path / "half.out.ipynb").exists()


def test_nbconvert_reads_a_notebook_with_a_byte_order_mark_and_names_one_not_in_utf8(tmp_path):
    """nbconvert reads the file itself: a byte order mark was "not JSON" to it (lmnb export read it),
    and a Latin-1 notebook ended nbconvert on a UnicodeDecodeError traceback."""
    from lmnb.export.exporter import LMScriptExporter

    plain = tmp_path / "qa.ipynb"
    nbformat.write(QA, plain)
    bom = tmp_path / "bom.ipynb"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", str(bom)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == nbconvert_script(QA, "bom.ipynb", "bom.py", to_stdout=True)
    with open(bom, "rb") as f:  # a binary stream, as a caller of the exporter may pass (which writes it: not stdout)
        assert LMScriptExporter().from_file(f, {"metadata": {"name": "bom"}, "unique_key": "bom"})[0] == nbconvert_script(
            QA, "bom.ipynb", "bom.py")
    latin = tmp_path / "latin.ipynb"
    latin.write_bytes(plain.read_bytes().replace(b"Q: ", "Q\u00e9: ".encode("latin-1"), 1))
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", str(latin)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and not (tmp_path / "latin.py").exists()
    assert out.stderr.rstrip().endswith("a notebook is UTF-8 JSON: save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)")
    assert f"Error while converting '{latin}': not UTF-8 text (invalid continuation byte at byte " in out.stderr


def test_a_notebook_without_cell_ids_is_read_without_nbformats_warning(tmp_path):
    """nbformat 4.5 cells without ids (a hand-made notebook) made lmnb export and lmnb run print
    nbformat's MissingIDFieldWarning, four lines advising normalize(); Jupyter adds ids silently."""
    import gc
    import warnings

    from lmnb.export import read_notebook

    data = json.loads(nbformat.writes(QA))
    for cell in data["cells"]:
        del cell["id"]
    (tmp_path / "noids.ipynb").write_text(json.dumps(data))
    gc.collect()  # (the earlier tests' garbage, collected before the warnings are recorded)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nb = read_notebook(tmp_path / "noids.ipynb")
    assert [str(w.message) for w in caught] == []
    assert len({c["id"] for c in nb.cells}) == len(QA.cells)  # (ids added, one per cell)
    assert [c.source for c in nb.cells] == [c.source for c in QA.cells]


def test_a_notebook_is_parsed_once_and_read_as_nbformat_reads_it(monkeypatch, caplog):
    """notebook_from_text parsed the file's JSON for its own checks, then nbformat.reads parsed the
    text again. Now once; the notebook is nbformat's own reading of the text (the reference), for a
    notebook of v4, one the schema refuses (logged as nbformat logs it), one without cell ids, and
    an old version (3, converted)."""
    import copy
    import warnings

    from nbformat.v3 import new_code_cell, new_notebook as new_v3, new_worksheet
    from nbformat.warnings import MissingIDFieldWarning

    from lmnb.export import notebook_from_text

    noids = json.loads(nbformat.writes(QA))
    for cell in noids["cells"]:
        del cell["id"]
    invalid = json.loads(nbformat.writes(QA))
    del next(c for c in invalid["cells"] if c["cell_type"] == "code")["outputs"]  # (the schema refuses it)
    v3 = nbformat.writes(new_v3(worksheets=[new_worksheet(cells=[new_code_cell(input="x = 1")])]), version=3)
    texts = [nbformat.writes(QA), json.dumps(noids), json.dumps(invalid), v3]
    loads, decoded = json.loads, []

    def counting_loads(text, *args, **kwargs):
        decoded.append(text)
        return loads(text, *args, **kwargs)

    logs = []
    def without_new_ids(nb, text):  # (nbformat makes random ids for cells that have none: v3 has none)
        nb = copy.deepcopy(nb)
        for cell in nb.cells if text in (texts[1], texts[3]) else ():
            assert len(cell.pop("id")) == 8
        return nb

    for text in texts:
        caplog.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MissingIDFieldWarning)
            expected = nbformat.reads(text, as_version=4)
        logs.append([r.getMessage() for r in caplog.records])
        caplog.clear()
        decoded.clear()
        with monkeypatch.context() as m:
            m.setattr(json, "loads", counting_loads)
            got = notebook_from_text(text, check_cells=False)
        assert decoded.count(text) == 1
        assert without_new_ids(got, text) == without_new_ids(expected, text)
        assert [r.getMessage() for r in caplog.records] == logs[-1]
    assert [bool(log) for log in logs] == [False, False, True, False]
    assert logs[2][0].startswith("Notebook JSON is invalid: ")


def test_every_cell_a_notebook_cannot_be_read_for_is_listed_in_one_error(tmp_path, capsys):
    """Reading a notebook stopped at its first cell holding a lone surrogate or no source; run and
    export list them all, each as its lone error says it."""
    from lmnb_kernel.cli import main

    data = json.loads(nbformat.writes(notebook("x = '\ud800'", "y = 1", "z = 1", "%%lm\nQ: {x}\n\udfff{gen a max_tokens=2}")))
    del data["cells"][2]["source"]
    path = tmp_path / "bad.ipynb"
    path.write_text(json.dumps(data))
    why = ("3 cells cannot be read; fix each, then try again:\n"
           "  - cell 1, line 1: the lone surrogate '\\ud800' is half of a UTF-16 pair and no character, so Python "
           "cannot run code that holds it; delete it, or write the character it was part of\n"
           "  - not a Jupyter notebook: cell 3 has no source (a cell has a cell_type such as \"code\" or "
           "\"markdown\", and a source: a string, or a list of strings, its lines); fix the cell in the file's "
           "JSON, or delete it\n"
           "  - cell 4, line 3: the lone surrogate '\\udfff' is half of a UTF-16 pair and no character, so Python "
           "cannot run code that holds it; delete it, or write the character it was part of\n")
    capsys.readouterr()
    assert main(["run", str(path)]) == 2
    assert capsys.readouterr().err == f"lmnb run: cannot read {path}: {why}"
    assert main(["export", str(path)]) == 2  # (with the cells it cannot export: none here)
    assert capsys.readouterr().err == f"lmnb export: {path}: {why.replace('be read', 'be exported')}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.ipynb"]


def test_export_lists_a_lone_surrogate_with_the_cells_it_cannot_export(tmp_path, capsys):
    """Reading the notebook stopped at its lone surrogate (cell 2), so lmnb export never named the
    bad %%lm cell 1 and the bad Python cell 3; and export_notebook, given such a notebook,
    raised a bare UnicodeEncodeError (ast.parse). Each cell's message is its lone error's."""
    from lmnb_kernel.cli import main

    cells = ("%%lm --nope\nQ{gen a}", "x = '\ud800'", "y = (")
    data = json.loads(nbformat.writes(notebook(*cells)))
    path = tmp_path / "bad.ipynb"
    path.write_text(json.dumps(data))
    alone = []
    for number, source in enumerate(cells, start=1):
        nb = notebook(*["z = 1"] * (number - 1), source)
        with pytest.raises(ExportError) as e:
            export_notebook(nb)
        alone.append(str(e.value))
    assert alone[1].startswith("cell 2, line 1: the lone surrogate '\\ud800' is half of a UTF-16 pair")
    why = "3 cells cannot be exported; fix each, then try again:\n" + "".join(f"  - {m}\n" for m in alone)
    with pytest.raises(ExportError) as e:
        export_notebook(notebook(*cells))
    assert f"{e.value}\n" == why
    capsys.readouterr()
    assert main(["export", str(path)]) == 2
    assert capsys.readouterr().err == f"lmnb export: {path}: {why}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.ipynb"]


def test_nbconvert_lists_a_lone_surrogate_and_a_cell_without_source_with_the_cells_it_cannot_export(tmp_path, capsys):
    """`jupyter nbconvert --to lmnb` read the file with its cells checked, so a lone surrogate
    (cell 1) stopped it before the bad %%lm cell 2 and the bad Python cell 3 were named, where lmnb
    export lists them all; and read unchecked, a cell without a source (cell 4) failed nbconvert's
    own check of the notebook on a NotebookValidationError. Its error is lmnb export's."""
    from lmnb.export.exporter import LMScriptExporter, NotebookExportError
    from lmnb_kernel.cli import main

    data = json.loads(nbformat.writes(notebook("x = '\ud800'", "%%lm --nope\nQ{gen a}", "y = (", "z = 1")))
    del data["cells"][3]["source"]
    path = tmp_path / "bad.ipynb"
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["export", str(path)]) == 2
    said = capsys.readouterr().err.removeprefix(f"lmnb export: {path}: ").rstrip("\n")
    assert said.startswith("4 cells cannot be exported; fix each, then try again:\n  - cell 1, line 1: the lone "
                           "surrogate '\\ud800'") and "\n  - not a Jupyter notebook: cell 4 has no source" in said
    with pytest.raises(NotebookExportError) as e:
        LMScriptExporter().from_filename(str(path))
    assert str(e.value) == said
    with pytest.raises(NotebookExportError) as e:  # (a node a caller read: the same)
        LMScriptExporter().from_notebook_node(nbformat.reads(json.dumps(data), as_version=4))
    assert str(e.value) == said
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "ValidationError" not in out.stderr
    assert out.stderr.rstrip().endswith(f"Error while converting '{path}': {said}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.ipynb"]


def test_a_cell_of_an_unknown_type_is_left_out_by_nbconvert_as_by_lmnb_export_and_lmnb_run(tmp_path, capsys):
    """A cell whose cell_type nbformat's schema does not know ("weird": hand-edited JSON) is run by
    no Jupyter frontend: lmnb run (nbclient) skips it and keeps it in the executed notebook, lmnb
    export leaves it out of the script, and `jupyter nbconvert --to lmnb` failed on nbconvert's own
    check of the notebook, a NotebookValidationError traceback. Both exports write the script of
    the notebook without the cell (it is the last, so the other cells keep their numbers)."""
    import argparse

    from lmnb_kernel.cli import main
    from lmnb_kernel.run import run

    data = json.loads(nbformat.writes(QA))
    data["cells"].append({"cell_type": "weird", "metadata": {}, "source": "print('never run')"})
    path = tmp_path / "qa.ipynb"
    path.write_text(json.dumps(data))
    assert main(["export", str(path)]) == 0
    assert (tmp_path / "qa.py").read_text() == export_notebook(QA, "qa.ipynb", "qa.py")[0]
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == nbconvert_script(QA, "qa.ipynb", "qa.py", to_stdout=True)
    assert "Traceback" not in out.stderr and "invalid" not in out.stderr.lower()

    small = json.loads(nbformat.writes(notebook("print(6 * 7)")))
    small["cells"].append({"cell_type": "weird", "metadata": {}, "source": "print('never run')"})
    path = tmp_path / "small.ipynb"
    path.write_text(json.dumps(small))
    capsys.readouterr()
    args = argparse.Namespace(notebook=str(path), output=str(tmp_path / "ran.ipynb"), parameter=[], timeout=120,
                              allow_errors=False)
    assert run(args) == 0, capsys.readouterr().err
    ran = nbformat.read(tmp_path / "ran.ipynb", as_version=4)
    assert [c.cell_type for c in ran.cells] == ["code", "weird"]
    assert [o.get("text") for o in ran.cells[0].outputs] == ["42\n"] and "outputs" not in ran.cells[1]


def _untagged(nb):
    """A copy of ``nb`` with no tags on any cell."""
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    for cell in nb.cells:
        cell.metadata.pop("tags", None)
    return nb


# (defect, the notebook whose script the defective one's is): notebooks lmnb export exports that
# nbformat's schema refuses (hand-edited JSON)
SCHEMA_DEFECTS = [
    (lambda nb: nb["cells"][2].pop("outputs"), QA),  # a code cell with no "outputs" key
    (lambda nb: nb["cells"][2]["metadata"].update(tags="x"), QA),  # tags, a string, not a list
    (lambda nb: nb["cells"][1]["metadata"].update(tags="parameters"), _untagged(QA)),  # (a string's letters: no tag)
    (lambda nb: nb["cells"][1]["metadata"].update(tags=5), _untagged(QA)),
    (lambda nb: nb["cells"][1]["metadata"].update(tags=None), _untagged(QA)),
    (lambda nb: nb["cells"][1]["metadata"].update(tags=["parameters", 5, "parameters"]), QA),
    (lambda nb: nb["cells"][2]["metadata"].update(collapsed="no", jupyter=3), QA),
    (lambda nb: nb["cells"][2].update(execution_count="1"), QA),
    (lambda nb: nb["cells"][2].update(outputs=[{"output_type": "stream"}]), QA),  # (no name, no text)
    (lambda nb: nb["cells"][2].update(id="bad id!"), QA),
    (lambda nb: nb["metadata"].update(kernelspec=3), QA),
]


def _with_defect(path: Path, defect) -> Path:
    """QA with ``defect`` done to its JSON, written to ``path``."""
    data = json.loads(nbformat.writes(QA))
    defect(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("defect, same_as", SCHEMA_DEFECTS)
def test_lmnb_export_exports_a_notebook_that_fails_nbformats_schema(tmp_path, defect, same_as):
    """Notebooks lmnb export exports that nbformat's schema refuses (hand-edited JSON): lmnb export
    ended on a TypeError for tags that are a number or null. It now writes the script of the
    notebook without the defect: the export reads no outputs, execution count, id or metadata but
    the tags, and tags that are no list are none (its tag of the parameters cell lost, where
    same_as is untagged). nbconvert: the test below."""
    from lmnb_kernel.cli import main

    assert export_notebook(_untagged(QA))[0] != export_notebook(QA)[0]  # (the tag matters)
    path = _with_defect(tmp_path / "qa.ipynb", defect)
    assert main(["export", str(path)]) == 0
    assert (tmp_path / "qa.py").read_text() == export_notebook(same_as, "qa.ipynb", "qa.py")[0]


def test_nbconvert_exports_notebooks_that_fail_nbformats_schema_as_lmnb_export_does(tmp_path):
    """jupyter nbconvert --to lmnb ended on nbformat's NotebookValidationError traceback for the
    notebooks of SCHEMA_DEFECTS; it now writes the script lmnb export writes (the test above), the
    notebook's without the defect. One nbconvert run converts them all (--stdout: the scripts one
    after another, in the order given), where a run each took 6 s of its 7."""
    paths = [_with_defect(tmp_path / str(i) / "qa.ipynb", defect) for i, (defect, _) in enumerate(SCHEMA_DEFECTS)]
    expected = [nbconvert_script(same_as, "qa.ipynb", "qa.py", to_stdout=True) for _, same_as in SCHEMA_DEFECTS]
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", *map(str, paths)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got, at = [], 0
    for script in expected:  # (cut where each expected script ends: a wrong one is named by its index)
        got.append(out.stdout[at:at + len(script)])
        at += len(script)
    assert [i for i, (g, e) in enumerate(zip(got, expected)) if g != e] == [] and at == len(out.stdout)
    assert "Traceback" not in out.stderr and "invalid" not in out.stderr.lower()


def test_the_copy_nbconvert_checks_repairs_every_cells_error_of_one_check_at_once(monkeypatch):
    """Each check of the copy (nbformat's schema) named one error a cell, and one error was repaired
    per check: 400 code cells without "outputs" and "execution_count" (a notebook JSON that a
    script wrote) took 801 checks of the whole notebook, minutes, before nbconvert exported it. Each
    cell's error is repaired at once now: one check finds no error left after as many checks as
    a cell has errors (here two, then the one that finds none), whatever the number of cells."""
    from lmnb.export import exporter

    data = json.loads(nbformat.writes(QA))
    for cell in data["cells"]:
        if cell["cell_type"] == "code":
            del cell["outputs"], cell["execution_count"]
    nb = nbformat.from_dict(data)
    checks = []
    schema_errors = exporter._schema_errors
    monkeypatch.setattr(exporter, "_schema_errors", lambda nb: checks.append(1) or schema_errors(nb))
    copy = exporter._schema_valid_copy(nb)
    assert len(checks) == 4  # (the first: whether to copy; then outputs, execution counts, none left)
    assert list(schema_errors(copy)) == [] and export_notebook(copy)[0] == export_notebook(QA)[0]


def test_nbconvert_refuses_a_notebook_its_schema_refuses_that_no_repair_makes_valid_naming_the_problem(tmp_path):
    """A notebook of a minor version nbformat has no schema for: lmnb export exports it, and the
    copy nbconvert checks cannot be repaired, so nbconvert refuses it in one message with the fix,
    where it ended on nbformat's own error."""
    data = json.loads(nbformat.writes(QA))
    data["nbformat_minor"] = -1
    path = tmp_path / "qa.ipynb"
    path.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.rstrip().endswith(
        f"Error while converting '{path}': not a Jupyter notebook: the notebook: No schema for validating v4.-1 notebooks "
        "(nbformat's schema); fix it in the file's JSON, or open the notebook in Jupyter and save it again")


def test_nbconvert_names_the_cell_whose_attachments_are_no_object_as_lmnb_export_does(tmp_path):
    """A markdown cell's "attachments": 5 (hand-edited JSON) stopped both exports with nbformat's
    "missing an expected key: 'int' object has no attribute 'values'", naming no cell, no field, no fix."""
    data = json.loads(nbformat.writes(QA))
    data["cells"].insert(1, {"cell_type": "markdown", "metadata": {}, "source": "# Judging", "attachments": 5})
    path = tmp_path / "qa.ipynb"
    path.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.rstrip().endswith(
        f"Error while converting '{path}': " 'not a Jupyter notebook: cell 2\'s "attachments" is a number, not an object of the images '
        'pasted into the cell ({"name.png": {"image/png": "<base64>"}}); write "attachments": {} (or remove the key) in '
        "the file's JSON; a notebook (.ipynb) is a JSON object of its cells, metadata and nbformat: give the .ipynb "
        "file, or save it from Jupyter again")


def test_a_cell_of_an_unknown_type_gets_a_note_from_both_exports(tmp_path):
    """A cell whose cell_type is a typo ("markdwon") was left out of the script without a word."""
    note = ('cell 11: left out, its cell_type "markdwon" is none Jupyter knows, so no Jupyter runs or shows it; '
            'write "code", "markdown" or "raw" in the file\'s JSON')
    data = json.loads(nbformat.writes(QA))
    data["cells"].append({"cell_type": "markdwon", "metadata": {}, "source": "# Judging"})
    assert export_notebook(nbformat.from_dict(data))[1].notes[-1] == note
    path = tmp_path / "qa.ipynb"
    path.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "-m", "lmnb_kernel.cli", "export", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"lmnb export: {path}: {note}\n" in out.stderr
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"[NbConvertApp] WARNING | {note}\n" in out.stderr
    data["cells"][-1]["cell_type"] = "x" * 5000  # (cut after 80 characters, the quote counted: it was shown whole)
    assert export_notebook(nbformat.from_dict(data))[1].notes[-1] == note.replace('"markdwon"', '"' + "x" * 79 + "…")


def test_lmnb_run_notes_a_cell_of_an_unknown_type_in_the_exports_words(tmp_path, capsys):
    """lmnb run said nothing of a cell whose cell_type is a typo ("markdwon"), which it keeps unrun,
    where both exports note it: it notes it on stderr in their words, saying what it did with the
    cell, numbered as in the notebook (before a -p parameters cell is put in), and the run goes on."""
    import argparse

    from lmnb_kernel.run import run

    data = json.loads(nbformat.writes(notebook(("parameters", "x = 0"), "print(6 * 7 + x)")))
    data["cells"].append({"cell_type": "markdwon", "metadata": {}, "source": "# Judging"})
    path = tmp_path / "small.ipynb"
    path.write_text(json.dumps(data))
    capsys.readouterr()
    args = argparse.Namespace(notebook=str(path), output=str(tmp_path / "ran.ipynb"), parameter=[("x", "1")],
                              timeout=120, allow_errors=False)
    assert run(args) == 0
    err = capsys.readouterr().err
    exported = export_notebook(nbformat.from_dict(data))[1].notes[-1]
    assert exported.startswith("cell 3: left out, its")
    said = exported.replace("left out", "not run, kept as it is in the executed notebook", 1)
    assert f"lmnb run: {path}: {said}\n" in err, err
    ran = nbformat.read(tmp_path / "ran.ipynb", as_version=4)
    assert [c.cell_type for c in ran.cells] == ["code", "code", "code", "markdwon"]  # (the -p cell put in second)
    assert [o.get("text") for o in ran.cells[2].outputs] == ["43\n"]


@pytest.mark.parametrize("text, shape", [
    ("[1, 2]", "the file's JSON is a list, not an object"),
    ('"notebook"', "the file's JSON is a string, not an object"),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": {"a": 1}}',
     'its "cells" is an object, not a list of cells'),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [1, "x", null]}',
     "cells 1 (a number), 2 (a string), 3 (null) are no JSON object"),
    # nbformat: "The notebook is invalid and is missing an expected key: metadata", for either
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code", "source": "", '
     '"metadata": {}, "outputs": []}, {"cell_type": "code", "source": "x", "outputs": []}]}',
     'cell 2 has no "metadata" (add "metadata": {})'),
    ('{"nbformat": 4, "nbformat_minor": 5, "cells": [{"cell_type": "markdown", "source": ""}]}',
     'the notebook, cell 1 have no "metadata" (add "metadata": {})'),
    # nbformat: "missing an expected key: 'NoneType' object has no attribute 'pop'", or a TypeError of its code
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": null, "cells": []}',
     'the notebook\'s "metadata" is null, not an object (write "metadata": {})'),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code", "source": "", '
     '"metadata": {}, "outputs": []}, {"cell_type": "code", "source": "x", "metadata": [], "outputs": []}]}',
     'cell 2\'s "metadata" is a list, not an object (write "metadata": {})'),
    # nbformat: "TypeError: 'NoneType' object is not iterable", "'int' object has no attribute 'get'"
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code", "source": "", '
     '"metadata": {}, "outputs": null}, {"cell_type": "code", "source": "x", "metadata": {}, "outputs": [5]}]}',
     'cells 1, 2 have "outputs" that are no list of objects (write "outputs": [], which a run fills)'),
    # nbformat: "missing an expected key: 'int' object has no attribute 'values'" (or 'items'), naming no cell
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code", "source": "", '
     '"metadata": {}, "outputs": []}, {"cell_type": "markdown", "source": "x", "metadata": {}, "attachments": 5}]}',
     'cell 2\'s "attachments" is a number, not an object of the images pasted into the cell ({"name.png": '
     '{"image/png": "<base64>"}}); write "attachments": {} (or remove the key) in the file\'s JSON'),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "markdown", "source": "x", '
     '"metadata": {}, "attachments": {"a.png": {"image/png": "AA=="}, "b.png": null}}]}',
     'cell 1\'s attachment "b.png" is null, not an object of its data by MIME type ({"image/png": "<base64>"}); '
     'remove it from "attachments" in the file\'s JSON'),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code", "source": "", '
     '"metadata": {}, "outputs": [{"output_type": "stream", "name": "stdout", "text": ""}, {"output_type": '
     '"display_data", "data": 5, "metadata": {}}]}]}',
     'cell 1\'s output 2 has "data" that is a number, not an object of its data by MIME type; write "outputs": [] '
     'for the cell in the file\'s JSON (a run fills it)'),
    # nbformat: "TypeError: unhashable type: 'list'" (or 'NotebookNode'), naming no cell
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code", "source": "", '
     '"metadata": {}, "outputs": [{"output_type": "stream", "name": "stdout", "text": ""}, {"output_type": []}]}, '
     '{"cell_type": "code", "source": "", "metadata": {}, "outputs": [{"output_type": {}}]}]}',
     'cell 1\'s output 2 has "output_type" that is a list, not a string naming its kind ("stream", "display_data", '
     '"execute_result" or "error"); write "outputs": [] for the cell in the file\'s JSON (a run fills it); cell 2\'s '
     'output 1 has "output_type" that is an object, not a string naming its kind ("stream", "display_data", '
     '"execute_result" or "error"); write "outputs": [] for the cell in the file\'s JSON (a run fills it)'),
])
def test_json_that_is_no_notebook_by_its_shape_is_named_so_with_the_fix(tmp_path, capsys, text, shape):
    """JSON whose shape is no notebook's (a list, "cells" that is no list, a cell that is no
    object, no "metadata") is said to be so, with the fix, by run and export alike: nbformat's reading failed
    with an error of its own code ("nbformat: AttributeError: 'list' object has no attribute
    'get'", "'str' object has no attribute 'get'"), which named neither, or named no cell."""
    from lmnb_kernel.cli import main

    path = tmp_path / "nb.ipynb"
    path.write_text(text)
    capsys.readouterr()
    for command in ("export", "run"):
        assert main([command, str(path)]) == 2
        assert capsys.readouterr().err == (
            f"lmnb {command}: cannot read {path}: not a Jupyter notebook: {shape}; a notebook (.ipynb) is a JSON "
            "object of its cells, metadata and nbformat: give the .ipynb file, or save it from Jupyter again\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nb.ipynb"]


AGAIN = "in the file's JSON, or save the notebook from Jupyter again"


@pytest.mark.parametrize("major, minor, said", [
    ('"4"', "5", f'its "nbformat" is "4" (a string), not the integer 4; write "nbformat": 4 (a number, no quotes) {AGAIN}'),
    ("4.0", "5", f'its "nbformat" is 4.0 (a number), not the integer 4; write "nbformat": 4 (a number, no quotes) {AGAIN}'),
    ("null", "5", f'its "nbformat" is null, not the integer 4; write "nbformat": 4 (a number, no quotes) {AGAIN}'),
    ("5", "0", 'its "nbformat" is 5, and the notebook format\'s versions are 1 to 4 (Jupyter writes 4); write '
               '"nbformat": 4 in the file\'s JSON if its cells are in "cells", or save the notebook from Jupyter again'),
    # nbformat: a bare AssertionError
    ("4", '"5"', f'its "nbformat_minor" is "5" (a string), not an integer; write it as a number (Jupyter writes '
                 f'"nbformat_minor": 5) {AGAIN}'),
    ("3", "0", 'The notebook is invalid and is missing an expected key: worksheets (its "nbformat" is 3, but it has '
               '"cells", as version 4 notebooks do: write "nbformat": 4 in the file\'s JSON; a version 3 notebook '
               'keeps its cells in "worksheets", and jupyter nbconvert --to notebook upgrades one)'),
])
def test_a_notebook_format_version_that_is_no_version_is_named_with_the_fix(tmp_path, capsys, major, minor, said):
    """nbformat said "Unsupported nbformat version 4" of the string "4" (as of 5), naming neither
    what was wrong nor the fix, and a string nbformat_minor failed with a bare AssertionError;
    run and export alike now say what is wrong and how to fix it."""
    from lmnb_kernel.cli import main

    path = tmp_path / "nb.ipynb"
    path.write_text(f'{{"nbformat": {major}, "nbformat_minor": {minor}, "metadata": {{}}, "cells": []}}')
    capsys.readouterr()
    for command in ("export", "run"):
        assert main([command, str(path)]) == 2
        assert capsys.readouterr().err == f"lmnb {command}: cannot read {path}: not a Jupyter notebook: {said}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nb.ipynb"]


def test_export_leaves_a_file_it_did_not_write_as_it_is(tmp_path, capsys):
    """`lmnb export nb.ipynb` wrote nb.py over any file of that name: a jupytext pairing's script
    or the user's own code was lost without a word. An earlier export is replaced, as before."""
    from lmnb_kernel.cli import main

    nb_path = tmp_path / "qa.ipynb"
    nbformat.write(QA, nb_path)
    mine = tmp_path / "qa.py"
    mine.write_text("# jupytext pairing\nprint('my code')\n")
    assert main(["export", str(nb_path)]) == 2
    assert mine.read_text() == "# jupytext pairing\nprint('my code')\n"
    said = (f"lmnb export: {mine} exists and was not written by lmnb export (a script of yours, or a jupytext "
            "pairing?); the script would replace it, so it is left as it is: give another -o, e.g. -o {}, or move "
            f"or delete {mine} first\n")
    assert capsys.readouterr().err == said.format(tmp_path / "qa_job.py")
    # the name suggested is one the export would write: qa_job.py was suggested where a file of the
    # user's was there too, to be refused in the same words; an earlier export there is replaced
    (tmp_path / "qa_job.py").write_text("# mine too\n")
    assert main(["export", str(nb_path)]) == 2
    assert capsys.readouterr().err == said.format(tmp_path / "qa_job2.py")
    (tmp_path / "qa_job2.py").write_text("# and this\n")
    assert main(["export", str(nb_path)]) == 2
    assert capsys.readouterr().err == said.format(tmp_path / "qa_job3.py")
    (tmp_path / "qa_job2.py").write_text(export_notebook(QA, "qa.ipynb", "qa_job2.py")[0])  # (an earlier export)
    assert main(["export", str(nb_path)]) == 2
    assert capsys.readouterr().err == said.format(tmp_path / "qa_job2.py")
    for name in ("qa_job.py", "qa_job2.py"):
        (tmp_path / name).unlink()
    expected = export_notebook(nbformat.read(nb_path, as_version=4), "qa.ipynb", "job.py",
                               reexport="lmnb export qa.ipynb -o job.py --inputs NAMES")[0]
    job = tmp_path / "job.py"
    job.write_text(expected + "# an edit of an earlier export\n")
    assert main(["export", str(nb_path), "-o", str(job)]) == 0  # an earlier export is replaced
    assert job.read_text() == expected


def test_nbconvert_leaves_a_file_it_did_not_write_as_it_is(tmp_path):
    """`jupyter nbconvert --to lmnb nb.ipynb` wrote nb.py over a jupytext pairing's script (lmnb
    export refused); it now fails as for a notebook it cannot export. An earlier export, by either
    tool, is replaced; the refusal names both (it said "not written by lmnb export" alone, where
    nbconvert was the tool run)."""
    nb_path = tmp_path / "qa.ipynb"
    nbformat.write(QA, nb_path)
    mine = "# jupytext pairing\nprint('my code')\n"
    (tmp_path / "qa.py").write_text(mine)
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "qa.py").write_text(mine)
    for extra, out in (([], tmp_path / "qa.py"), (["--output-dir", str(tmp_path / "dist")], tmp_path / "dist" / "qa.py")):
        run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", *extra, str(nb_path)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 1 and out.read_text() == mine
        assert run.stderr.rstrip().endswith(
            f"Error while converting '{nb_path}': {out} exists and was not written by jupyter nbconvert --to lmnb or lmnb "
            "export (a script of yours, or a jupytext pairing?); the script would replace it, so it is left as it is: "
            f"give another name with --output, e.g. --output qa_job, or run lmnb export with -o, or move or delete {out} "
            "first")
    (tmp_path / "qa.py").write_text(export_notebook(QA, "qa.ipynb", "qa.py")[0] + "# an earlier export\n")
    run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", str(nb_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "qa.py").read_text() == nbconvert_script(QA, "qa.ipynb", "qa.py")


def test_a_script_names_the_tool_that_exported_it_and_either_tools_replaces_it(tmp_path, capsys):
    """A script exported by `jupyter nbconvert --to lmnb` said "Batch job exported by `lmnb export`
    from ..." (its --help too). Its docstring now names the tool that exported it; either tool
    still takes the other's script, and an older one with lmnb export's words, for an earlier
    export, which it replaces (a file of the user's is still left as it is)."""
    from lmnb.export import not_an_export
    from lmnb_kernel.cli import main

    nbformat.write(QA, tmp_path / "qa.ipynb")
    nbformat.write(notebook("x = 6 * 7"), tmp_path / "plain.ipynb")
    job = tmp_path / "qa.py"
    job.write_text(export_notebook(QA, "qa.ipynb", "qa.py")[0] + "# an older export\n")
    assert '"""Batch job exported by `lmnb export` from qa.ipynb: its %%lm programs' in job.read_text()
    run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "qa.ipynb"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert job.read_text() == nbconvert_script(QA, "qa.ipynb", "qa.py")
    assert ('"""Batch job exported by `jupyter nbconvert --to lmnb` from qa.ipynb: its %%lm programs, run once per '
            "input row.\n") in job.read_text()
    assert main(["export", str(tmp_path / "qa.ipynb")]) == 0  # lmnb export replaces nbconvert's script
    assert job.read_text() == export_notebook(QA, "qa.ipynb", "qa.py")[0]
    run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", "plain.ipynb"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert '"""Script exported by `jupyter nbconvert --to lmnb` from plain.ipynb. The notebook has no' in run.stdout
    assert '"""Script exported by `lmnb export` from plain.ipynb.' in export_notebook(notebook("x = 1"), "plain.ipynb")[0]
    (tmp_path / "plain.py").write_text(run.stdout)
    (tmp_path / "mine.py").write_text('"""Batch job exported by `my tool` from qa.ipynb."""\n')
    assert [not_an_export(tmp_path / name) for name in ("qa.py", "plain.py", "mine.py")] == [False, False, True]


def test_nbconvert_says_in_a_line_why_it_cannot_write_the_script_and_makes_a_missing_folder(tmp_path):
    """`jupyter nbconvert --to lmnb` to a path it cannot write ended on nbconvert's writer's OSError
    traceback (NotADirectoryError, IsADirectoryError, FileNotFoundError): it now fails as for a
    notebook it cannot export, naming the path, why and the fix, as lmnb export does; a --output in
    a folder not there (FileNotFoundError too) has it made, as lmnb export makes it."""
    nbformat.write(QA, tmp_path / "qa.ipynb")
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "folder.py").mkdir()
    fix = "give a folder you can write to, e.g. --output-dir . --output"
    cases = [(["--output", "afile/x"], f"cannot write afile/x.py: afile is a file, not a folder; {fix} x"),
             (["--output", "folder"], f"cannot write folder.py: Is a directory; {fix} folder")]
    if Path("/proc/self").is_dir():  # (Linux: a folder that takes no new files)
        cases.append((["--output-dir", "/proc"], "cannot write /proc/qa.py: No such file or directory (its folder "
                                                 f"/proc is there, but takes no new files); {fix} qa"))
    for args, said in cases:
        run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", *args, "qa.ipynb"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 1, run.stderr
        assert run.stderr.rstrip().endswith(f"[NbConvertApp] ERROR | Error while converting 'qa.ipynb': {said}")
        assert "Traceback" not in run.stderr, run.stderr
    assert (tmp_path / "afile").read_text() == "mine\n" and list((tmp_path / "folder.py").iterdir()) == []
    run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--output", "jobs/new/qa", "qa.ipynb"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "created the folder jobs/new (it did not exist) for jobs/new/qa.py" in run.stderr
    assert (tmp_path / "jobs" / "new" / "qa.py").read_text() == nbconvert_script(QA, "qa.ipynb", "qa.py",
                                                                                output="--output=jobs/new/qa.py ")


def test_lmnb_export_cli_and_nbconvert_write_the_same_script(tmp_path, capsys):
    from lmnb_kernel.cli import main

    nb_path = tmp_path / "qa.ipynb"
    nbformat.write(QA, nb_path)
    assert main(["export", str(nb_path), "-o", str(tmp_path / "jobs" / "qa.py")]) == 0  # the folder is made
    expected = export_notebook(nbformat.read(nb_path, as_version=4), "qa.ipynb", "qa.py",
                               reexport="lmnb export qa.ipynb -o jobs/qa.py --inputs NAMES")[0]
    assert (tmp_path / "jobs" / "qa.py").read_text() == expected
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", str(nb_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == nbconvert_script(nbformat.read(nb_path, as_version=4), "qa.ipynb", "qa.py", to_stdout=True)
    # --output names the script, so its usage lines say the name it was written under
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--output", "jobs/renamed", str(nb_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    renamed = nbconvert_script(nbformat.read(nb_path, as_version=4), "qa.ipynb", "renamed.py",
                               output="--output=jobs/renamed.py ")
    assert (tmp_path / "jobs" / "renamed.py").read_text() == renamed and "python renamed.py --input" in renamed
    (tmp_path / "broken.ipynb").write_text("{not json")
    assert main(["export", str(tmp_path / "broken.ipynb")]) == 2
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    shown = capsys.readouterr().out  # argparse %-formats help, not descriptions: it showed %%%%lm and %lm
    assert "\nexport a %%lm notebook to a batch script\n" in shown and "notebook with %%lm cells" in shown
    (tmp_path / "not_nb.ipynb").write_text('{"foo": 1}')
    assert main(["export", str(tmp_path / "not_nb.ipynb")]) == 2
    assert "not a Jupyter notebook: " in capsys.readouterr().err
    nbformat.write(notebook("x = 1", "%%lm\n{gen a max_token=2}"), tmp_path / "bad.ipynb")
    assert main(["export", str(tmp_path / "bad.ipynb")]) == 2
    before = nb_path.read_bytes()
    for target in (nb_path, tmp_path / "other.ipynb", tmp_path / "QA.IPYNB"):  # a slip of -o must not replace a notebook
        capsys.readouterr()
        assert main(["export", str(nb_path), "-o", str(target)]) == 2
        assert f"the output {target} is a notebook" in capsys.readouterr().err
    assert nb_path.read_bytes() == before and not (tmp_path / "other.ipynb").exists()
    assert not (tmp_path / "QA.IPYNB").exists()


def test_nbconvert_takes_the_row_fields_as_its_command_line_spells_them_and_names_that_spelling(tmp_path):
    """`jupyter nbconvert --to lmnb` had no working way to name the row fields: nbconvert hands a lone
    --LMScriptExporter.inputs=person to the exporter as a string, which traitlets' List read as no
    fields ('["person"]' as one field named ["person"]), its --inputs person went nowhere, and the
    warning "no row fields ...; name the fields with --inputs" named that option. Each spelling now
    gives the script lmnb export writes with those fields, and the notes and errors say
    --LMScriptExporter.inputs."""
    nb_path = tmp_path / "chat.ipynb"
    nbformat.write(CHAT, nb_path)

    def nbconvert(*args, path=nb_path):
        return subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", *args, str(path)],
                              capture_output=True, text=True, timeout=120)

    def script(inputs):
        return nbconvert_script(CHAT, "chat.ipynb", "chat.py", inputs, to_stdout=True)

    assert script(["person"]) != script(None)  # (the default fields are topic and person)
    for args, fields in [(["--LMScriptExporter.inputs=person"], ["person"]),
                         (["--LMScriptExporter.inputs", "person"], ["person"]),
                         (['--LMScriptExporter.inputs=["person"]'], ["person"]),
                         (["--LMScriptExporter.inputs=person, topic"], ["person", "topic"]),
                         (["--LMScriptExporter.inputs=person", "--LMScriptExporter.inputs=topic"], ["person", "topic"])]:
        out = nbconvert(*args)
        assert out.returncode == 0, (args, out.stderr)
        assert out.stdout == script(fields), args
    out = nbconvert("--inputs", "person")
    assert out.returncode == 1 and out.stdout == ""
    assert ("Error while converting '" + str(nb_path) + "': --inputs is lmnb export's option, which nbconvert does not "
            "hand to the exporter; write --LMScriptExporter.inputs=person\n") in out.stderr
    out = nbconvert("--LMScriptExporter.inputs=person,nope")
    assert out.returncode == 1
    assert "': --LMScriptExporter.inputs nope: the cells that run per row never read it" in out.stderr
    nbformat.write(notebook("n = 3", "%%lm\nSay hi:{gen a max_tokens=2}"), tmp_path / "same.ipynb")
    out = nbconvert(path=tmp_path / "same.ipynb")
    assert out.returncode == 0, out.stderr
    assert ("WARNING | no row fields: every input row runs the same programs; name the fields with "
            "--LMScriptExporter.inputs (e.g. a parameter or a variable the %%lm cells read)\n") in out.stderr


def test_a_job_says_to_export_again_with_the_command_of_the_tool_that_exported_it(tmp_path, monkeypatch, capsys):
    """A job exported by `jupyter nbconvert --to lmnb` said to "export the notebook again with --inputs
    NAMES" (rows with fields it reads none of) or "with --inputs person" (rows that give a parameter):
    lmnb export's option, which nbconvert refuses. The export writes the command of the tool that
    made it into the job (quoted for a shell), which the job's messages give; the command given runs."""
    import shlex

    from helpers_export import write_rows
    from helpers_lang import ScriptedBackend
    from lmnb_kernel.cli import main

    nb = notebook(("parameters", 'person = "Arvel"'), "%%lm --temperature 0\nHi {person}{gen a max_tokens=1}")
    nbformat.write(nb, tmp_path / "my chat.ipynb")
    monkeypatch.chdir(tmp_path)
    nbconvert = [sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout"]
    out = subprocess.run([*nbconvert, "my chat.ipynb"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    exports = [(out.stdout, "jupyter nbconvert --to lmnb 'my chat.ipynb' --stdout --LMScriptExporter.inputs=", SAVE_OVER_JOB),
               (export_notebook(nb, "my chat.ipynb", "my chat.py")[0], "lmnb export 'my chat.ipynb' --inputs ", "")]
    for source, command, tail in exports:
        _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"x": 1}]), 0)
        assert capsys.readouterr().err.startswith(
            "lmnb batch: warning: this job reads no field of the input rows (its notebook's %%lm cells read none), so "
            "every row runs the same programs and the field 'x' is not used; to read it, export the notebook again "
            f"with {command}x{tail}\n")
        rows = write_rows(tmp_path / "rows.jsonl", [{"person": "Corin"}])
        ns = _load_job(source, monkeypatch, rows, tmp_path / "out.jsonl")
        assert ns["job"].run(ns["run_row"], backend=ScriptedBackend(lambda prompt, params: "!")) == 2
        assert capsys.readouterr().err == (
            "lmnb batch: the input rows have the field 'person' (--person 'Arvel'), but it is the notebook's "
            "parameter, set once for the whole job by its option, not read from each row; to read it from the rows, "
            f"export again with {command}person{tail}; to use the option, leave the field out of the input\n")
    # the commands said export the notebook with person a row field
    out = subprocess.run([*nbconvert[:-1], *shlex.split(exports[0][1] + "person")[4:]], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == nbconvert_script(nb, "my chat.ipynb", "my chat.py", ["person"], to_stdout=True)
    assert main(["export", *shlex.split(exports[1][1] + "person")[2:]]) == 0
    assert (tmp_path / "my chat.py").read_text() == export_notebook(nb, "my chat.ipynb", "my chat.py", ["person"])[0]
    assert "inputs=['person']" in out.stdout


def test_the_export_command_a_job_gives_rewrites_that_job_where_it_was_written(tmp_path, monkeypatch, capsys):
    """A job written elsewhere than beside its notebook (`lmnb export nb.ipynb -o jobs/x.py`, or
    nbconvert's --output-dir / --output) told its user to export again with a command that named the
    notebook alone, which wrote nb.py beside the notebook and left the job as it was. The command now
    names the job's file as its tool takes it, relative to the notebook's folder, where the command
    runs (it names the notebook so), quoted for a shell; run there, it rewrites the job itself."""
    import re
    import shlex

    from helpers_export import write_rows
    from helpers_lang import ScriptedBackend
    from lmnb_kernel.cli import main

    nb = notebook(("parameters", 'person = "Arvel"'), "%%lm --temperature 0\nHi {person}{gen a max_tokens=1}")
    (tmp_path / "nbs").mkdir()
    nbformat.write(nb, tmp_path / "nbs" / "my chat.ipynb")
    monkeypatch.chdir(tmp_path)
    assert main(["export", "nbs/my chat.ipynb", "-o", "jobs/x y.py"]) == 0
    run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "nbs/my chat.ipynb", "--output-dir",
                          "jobs", "--output=-z"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    jobs = [(tmp_path / "jobs" / "x y.py", "lmnb export 'my chat.ipynb' -o '../jobs/x y.py' --inputs person"),
            (tmp_path / "jobs" / "-z.py",
             "jupyter nbconvert --to lmnb 'my chat.ipynb' --output=../jobs/-z.py --LMScriptExporter.inputs=person")]
    rows = write_rows(tmp_path / "rows.jsonl", [{"person": "Corin"}])
    for job, command in jobs:
        ns = _load_job(job.read_text(), monkeypatch, rows, tmp_path / "out.jsonl")
        capsys.readouterr()
        assert ns["job"].run(ns["run_row"], backend=ScriptedBackend(lambda prompt, params: "!")) == 2
        said = re.search("export again with (.*); to use the option", capsys.readouterr().err)
        assert said and said[1] == command
        monkeypatch.chdir(tmp_path / "nbs")  # (the notebook's folder)
        words = shlex.split(said[1])
        if words[0] == "lmnb":
            assert main(words[1:]) == 0
        else:
            run = subprocess.run([sys.executable, "-m", "nbconvert", *words[2:]], capture_output=True, text=True,
                                 timeout=120)
            assert run.returncode == 0, run.stderr
        monkeypatch.chdir(tmp_path)
        assert "inputs=['person']" in job.read_text()  # this job, rewritten with the field
        assert sorted(p.name for p in (tmp_path / "nbs").iterdir()) == ["my chat.ipynb"]  # and no nb.py
    assert (tmp_path / "jobs" / "x y.py").read_text() == export_notebook(
        nb, "my chat.ipynb", "x y.py", ["person"], reexport="lmnb export 'my chat.ipynb' -o '../jobs/x y.py' --inputs NAMES")[0]
    # the notebook's own default (nb.py beside it), however -o spells it, is left out, as before
    assert main(["export", "nbs/my chat.ipynb", "-o", "nbs/../nbs/my chat.py"]) == 0
    assert "reexport=\"lmnb export 'my chat.ipynb' --inputs NAMES\")" in (tmp_path / "nbs" / "my chat.py").read_text()


def test_a_job_exported_to_stdout_says_to_export_it_to_stdout_again_and_save_that_over_it(tmp_path, monkeypatch,
                                                                                          capsys):
    """A job exported to stdout (`lmnb export nb.ipynb -o -`, `jupyter nbconvert --to lmnb --stdout`)
    told its user to export again with the command that writes the notebook's default, nb.py beside
    it: the job, saved under a name the export never knew, stayed as it was. The command now sends
    the job to stdout again, as it was exported, and says to save that over the job's file; done so
    in the notebook's folder, it rewrites the job with the field, and writes no nb.py."""
    import re
    import shlex

    from helpers_export import write_rows
    from helpers_lang import ScriptedBackend
    from lmnb_kernel.cli import main

    nb = notebook(("parameters", 'person = "Arvel"'), "%%lm --temperature 0\nHi {person}{gen a max_tokens=1}")
    (tmp_path / "nbs").mkdir()
    (tmp_path / "jobs").mkdir()
    nbformat.write(nb, tmp_path / "nbs" / "my chat.ipynb")
    monkeypatch.chdir(tmp_path / "nbs")
    assert main(["export", "my chat.ipynb", "-o", "-"]) == 0
    (tmp_path / "jobs" / "a.py").write_text(capsys.readouterr().out)
    run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", "--stdout", "my chat.ipynb"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    (tmp_path / "jobs" / "b.py").write_text(run.stdout)
    rows = write_rows(tmp_path / "rows.jsonl", [{"person": "Corin"}])
    commands = {"a.py": "lmnb export 'my chat.ipynb' -o - --inputs person",
                "b.py": "jupyter nbconvert --to lmnb 'my chat.ipynb' --stdout --LMScriptExporter.inputs=person"}
    for name, command in commands.items():
        job = tmp_path / "jobs" / name
        monkeypatch.chdir(tmp_path)
        ns = _load_job(job.read_text(), monkeypatch, rows, tmp_path / "out.jsonl")
        capsys.readouterr()
        assert ns["job"].run(ns["run_row"], backend=ScriptedBackend(lambda prompt, params: "!")) == 2
        said = re.search("export again with (.*); to use the option", capsys.readouterr().err)
        assert said and said[1] == f"{command} and save its output over this job's file"
        monkeypatch.chdir(tmp_path / "nbs")  # (the notebook's folder, where the command runs)
        words = shlex.split(command)
        if words[0] == "lmnb":
            assert main(words[1:]) == 0
            job.write_text(capsys.readouterr().out)
        else:
            run = subprocess.run([sys.executable, "-m", "nbconvert", *words[2:]], capture_output=True, text=True,
                                 timeout=120)
            assert run.returncode == 0, run.stderr
            job.write_text(run.stdout)
        assert "inputs=['person']" in job.read_text()  # this job, rewritten with the field
    assert sorted(p.name for p in (tmp_path / "nbs").iterdir()) == ["my chat.ipynb"]  # and no nb.py


def test_nbconvert_reports_a_notebook_it_cannot_export_as_its_own_conversion_error(tmp_path):
    """The ExportError escaped nbconvert: the process ended on a traceback through nbconvert and
    every frame of the export (and the chained SyntaxError) before the message. It is now said in
    nbconvert's "Error while converting" line, without a traceback."""
    from nbconvert.utils.exceptions import ConversionException

    from lmnb.export.exporter import LMScriptExporter

    why = "cell 1: 'x = !ls' assigns what IPython syntax computes, which a plain script cannot"
    nb = notebook("x = !ls", "%%lm\n{gen a max_tokens=2}")
    with pytest.raises(ExportError) as e:
        LMScriptExporter().from_notebook_node(nb)
    assert isinstance(e.value, ConversionException) and str(e.value).startswith(why)
    assert e.value.__cause__ is None and e.value.__suppress_context__
    nbformat.write(nb, tmp_path / "bang.ipynb")
    out = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "lmnb", str(tmp_path / "bang.ipynb")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and not (tmp_path / "bang.py").exists()
    # nbconvert logs a ConversionException with its traceback, through its own frames and our raise: the
    # message says it all, so it is said in nbconvert's line, without the traceback, as lmnb export says it
    assert out.stderr.rstrip().endswith(f"[NbConvertApp] ERROR | Error while converting '{tmp_path / 'bang.ipynb'}': "
                                        f"{why}; write it in Python (e.g. subprocess.run(..., capture_output=True, "
                                        "text=True).stdout for !cmd)")
    assert "Traceback" not in out.stderr and "SyntaxError" not in out.stderr


def test_row_code_can_rebind_setup_names_and_each_row_starts_from_the_setup_value(monkeypatch):
    from helpers_lang import ScriptedBackend

    import lmnb

    nb = notebook(("parameters", "limit = 2"), 'count = 10\nquestion = "Why?"',
                  "%%lm --temperature 0\n{question}{gen a max_tokens=2}",
                  "count = count + limit", "%%lm --temperature 0\n{a} {count}{gen b max_tokens=2}")
    source, p = export_notebook(nb)
    assert p.copied == ("count",) and p.parameters == ("limit",) and p.inputs == ("question",)
    assert "--param-limit" in source  # --limit is the job's own option
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", "x.jsonl", "--output", "y.jsonl", "--param-limit", "5"])
    ns = {"__name__": "exported"}
    exec(compile(source, "job.py", "exec"), ns)
    backend = ScriptedBackend(lambda prompt, params: "!")
    monkeypatch.setattr(lmnb.api, "_default_backend", backend)
    for question in ("x", "y"):
        ns["run_row"](question)
    prompts = [c[1][0].text for c in backend.calls if c[0] == "generate"]
    assert prompts == ["x", "! 15", "y", "! 15"]  # count = 10 + 5 in every row
    assert ns["count"] == 10


def test_globals_named_like_the_generated_code_are_passed_as_arguments(monkeypatch):
    from helpers_lang import ScriptedBackend

    import lmnb

    nb = notebook('items = ["a", "b"]\nf = "!"', "%%lm --temperature 0\n{fork x in items}{x}{f}{gen y max_tokens=1}{join}")
    source, p = export_notebook(nb)
    assert p.inputs == ("f",) and p.lm_params == {2: ("items", "f")}
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", "x.jsonl", "--output", "y.jsonl"])
    ns = {"__name__": "exported"}
    exec(compile(source, "job.py", "exec"), ns)
    backend = ScriptedBackend(lambda prompt, params: prompt.text[-2:])
    monkeypatch.setattr(lmnb.api, "_default_backend", backend)
    ns["run_row"]("?")
    assert sorted(c[1][0].text for c in backend.calls if c[0] == "generate") == ["a?", "b?"]


def row_prompts(nb, monkeypatch, row: str = "x") -> tuple[list, object]:
    """The prompts the exported job of ``nb`` (one row field) sends for ``row``, every gen answered
    "!", and the export's plan."""
    from helpers_lang import ScriptedBackend

    import lmnb

    source, p = export_notebook(nb)
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", "x.jsonl", "--output", "y.jsonl"])
    ns = {"__name__": "exported"}
    exec(compile(source, "job.py", "exec"), ns)
    backend = ScriptedBackend(lambda prompt, params: "!")
    monkeypatch.setattr(lmnb.api, "_default_backend", backend)
    ns["run_row"](row)
    return [c[1][0].text for c in backend.calls if c[0] == "generate"], p

def test_prompts_states_and_line_breaks_are_the_kernels(monkeypatch):
    """As the kernel runs the notebook: a %%lm cell's final line break is not part of its prompt,
    `%lm reset NAME` makes the next cell with that --state start a new state, and a lone \\r
    ends a line (a code cell 'k = 1\\rw = ...' ran at module level, where `a` is undefined)."""
    nb = notebook('q = "x"', "%%lm --state n --temperature 0\n{q}{gen a max_tokens=1}\n", 'k = 1\rw = a + "?"',
                  "%lm reset n", "%%lm --state n --temperature 0\nB{gen b max_tokens=1}\n",
                  "%%lm --state n --temperature 0\nC{gen c max_tokens=1}", "%%lm --temperature 0\n{w}{gen d max_tokens=1}",
                  "%lm load", "%%lm --state n --temperature 0\nD{gen e max_tokens=1}")  # load drops states too
    prompts, p = row_prompts(nb, monkeypatch)
    assert p.inputs == ("q",)
    assert prompts == ["x", "B", "B!C", "!?", "D"]


@pytest.mark.parametrize("lines, backend, note", [
    # read with the magic's own arguments, not by word position
    (["%lm connect http://127.0.0.1:9", "%lm load"], Backend(), None),  # the way back from a server
    (["%lm load --dtype float32 /ckpt"], Backend(model="/ckpt"), "--dtype not carried into the job"),
    # a completion model and the server's timeout are the job's defaults too (select needs a completion
    # model: the job ran it as a chat model); an API key is never written into the script
    (["%lm connect --openai m http://h/v1 --completion --timeout 30 --api-key sk-1"],
     Backend(url="http://h/v1", openai_model="m", completion=True, timeout=30.0), "--api-key not carried"),
    # a chat model whose server continues a partial reply: the job's default too (its rows' gens
    # inside a reply were refused)
    (["%lm connect http://h/v1 --openai m --continue-final-message"],
     Backend(url="http://h/v1", openai_model="m", continue_final_message=True), None),
])
def test_load_and_connect_lines_set_the_jobs_default_backend(lines, backend, note):
    source, p = export_notebook(notebook(*lines, 'q = "x"', "%%lm\n{q}{gen a max_tokens=1}"))
    assert p.backend == backend
    assert (note is None and not p.notes) or any(note in n for n in p.notes), p.notes
    assert "sk-1" not in source
    if backend.completion:
        from lmnb.batch import Job
        from lmnb.batch.options import make_backend

        assert "completion=True, timeout=30.0, options_first=True,\n" in source
        job = Job("j", ["q"], backend=backend.url, openai_model="m", completion=True, timeout=30.0,
                  argv=["--input", "in.jsonl", "--output", "out.jsonl"])
        args = job._parser().parse_args(job.argv)
        client = make_backend(args, None)
        assert client.is_chat_model is False and client.client.timeout == 30.0 and job.args is None
    if backend.continue_final_message:
        from lmnb.batch import Job
        from lmnb.batch.options import make_backend

        assert "openai_model='m', continue_final_message=True, options_first=True,\n" in source
        for argv, continues in ([], True), (["--backend", "http://h/v1", "--openai", "m"], False):
            job = Job("j", ["q"], backend=backend.url, openai_model="m", continue_final_message=True,
                      argv=["--input", "in.jsonl", "--output", "out.jsonl", *argv])
            client = make_backend(job._parser().parse_args(job.argv), None)
            assert client.continue_final_message is continues and client.is_chat_model  # (--backend: none of the notebook's)
            client.shutdown()
    with pytest.raises(ExportError, match="cell 1: %lm connect: the following arguments are required: url"):
        export_notebook(notebook("%lm connect", 'q = "x"', "%%lm\n{q}{gen a max_tokens=1}"))


def test_an_explicit_backend_leaves_out_the_notebooks_openai_model_completion_and_timeout():
    """A job exported from a notebook that ran `%lm connect URL --openai m --completion --timeout 30`
    kept --openai m under `--backend engine`, so the rows went to the official OpenAI API (model m)
    instead of the in-process engine; another --backend URL got the notebook's model name too."""
    from lmnb.batch import Job

    def args(*argv):
        job = Job("j", ["q"], backend="http://h/v1", openai_model="m", completion=True, timeout=30.0,
                  argv=["--input", "in.jsonl", "--output", "out.jsonl", *argv])
        a = job._parser().parse_args(job.argv)
        return a.backend, a.openai, a.completion, a.timeout

    assert args() == ("http://h/v1", "m", True, 30.0)  # the notebook's backend, as it ran there
    assert args("--timeout", "5") == ("http://h/v1", "m", True, 5.0)
    assert args("--openai", "chat-model") == ("http://h/v1", "chat-model", False, 30.0)  # m's kind is not its
    assert args("--backend", "engine") == ("engine", None, False, None)
    assert args("--backend", "http://other:30000") == ("http://other:30000", None, False, None)
    assert args("--backend", "http://other/v1", "--openai", "n") == ("http://other/v1", "n", False, None)
    help_text = Job("j", ["q"], backend="http://h/v1", openai_model="m", completion=True,
                    timeout=30.0)._parser().format_help()
    assert "http://h/v1, the notebook's" in " ".join(help_text.split())


def test_objects_the_row_cells_change_in_place_start_from_the_setup_value_in_each_row(monkeypatch):
    """`seen.append(q)` ran once in the notebook; in the script each row appended to one shared
    list, so the third row saw 3 (and threads raced on it)."""
    from helpers_lang import ScriptedBackend

    import lmnb

    nb = notebook('import os\nseen = []\ncounts = {"n": 0}\nq = "x"', "%%lm --temperature 0\n{q}{gen a max_tokens=1}",
                  'seen.append(q)\ncounts["n"] += 1\nsep = os.sep', "%%lm --temperature 0\n{len(seen)}{counts['n']}{gen b max_tokens=1}")
    source, p = export_notebook(nb)
    assert set(p.copied) == {"seen", "counts"} and p.inputs == ("q",)  # (os.sep only reads os)
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", "x.jsonl", "--output", "y.jsonl"])
    ns = {"__name__": "exported"}
    exec(compile(source, "job.py", "exec"), ns)
    backend = ScriptedBackend(lambda prompt, params: "!")
    monkeypatch.setattr(lmnb.api, "_default_backend", backend)
    for q in ("x", "y", "z"):
        ns["run_row"](q)
    prompts = [c[1][0].text for c in backend.calls if c[0] == "generate"]
    assert prompts == ["x", "11", "y", "11", "z", "11"]
    assert ns["seen"] == [] and ns["counts"] == {"n": 0}


def test_objects_a_python_lm_cell_changes_in_place_start_from_the_setup_value_in_each_row(monkeypatch, tmp_path):
    """`counter["n"] += 1` in a `%%lm --python` body changed the module's dict: every row (and
    the prefix hint's trace before them) added to it, so rows saw 2, 3, 4 where the notebook's one
    pass sees 1."""
    from helpers_export import read_results, write_rows
    from helpers_lang import ScriptedBackend

    nb = notebook('counter = {"n": 0}\ntopic = "cats"',
                  '%%lm --python --temperature 0\ncounter["n"] += 1\ns += f"{topic} {counter[\'n\']}:"\n'
                  's += lmnb.gen("x", max_tokens=1)',
                  "%%lm --temperature 0\n{counter['n']}{gen y max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.copied == ("counter",) and p.inputs == ("topic",)
    rows = write_rows(tmp_path / "rows.jsonl", [{"topic": t} for t in ("a", "b", "c")])
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                      "--num-threads", "1", "--no-progress"])
    ns = {"__name__": "exported"}
    exec(compile(source, "job.py", "exec"), ns)
    backend = ScriptedBackend(lambda prompt, params: "!")
    assert ns["job"].run(ns["run_row"], programs=[ns["cell_2"], ns["cell_3"]], backend=backend) == 0
    prompts = [c[1][0].text for c in backend.calls if c[0] == "generate"]
    assert prompts == ["a 1:", "1", "b 1:", "1", "c 1:", "1"]
    assert [r["variables"] for r in read_results(tmp_path / "out.jsonl")] == [{"x": "!", "y": "!"}] * 3
    assert ns["counter"] == {"n": 0}


def test_python_lm_cells_are_not_traced_for_prefix_hints(monkeypatch, tmp_path):
    """The job traces its programs once before the rows to cache their constant prefixes; a
    --python body ran then too, with placeholders for the row's values: its log got a line
    'PROMPT FOR ' before the rows' own."""
    from helpers_export import write_rows
    from helpers_lang import ScriptedBackend

    log = tmp_path / "side.log"
    nb = notebook(f'topic = "cats"\nlog = open({str(log)!r}, "a")',
                  '%%lm --python --temperature 0\nprint("PROMPT FOR", topic, file=log, flush=True)\n'
                  's += "About " + topic + ":"\ns += lmnb.gen("x", max_tokens=1)',
                  "%%lm --temperature 0\nSay {x}:{gen y max_tokens=1}")
    source, p = export_notebook(nb)
    rows = write_rows(tmp_path / "rows.jsonl", [{"topic": t} for t in ("a", "b")])
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                      "--num-threads", "1", "--no-progress"])
    ns = {"__name__": "exported"}
    exec(compile(source, "job.py", "exec"), ns)
    backend = ScriptedBackend(lambda prompt, params: "!")
    programs = eval(source.split("programs=")[-1].split("]")[0] + "]", ns)  # the script's own list
    assert ns["job"].run(ns["run_row"], programs=programs, backend=backend) == 0
    ns["log"].close()
    assert log.read_text() == "PROMPT FOR a\nPROMPT FOR b\n"


def test_a_failing_row_names_the_script_line_and_notebook_cell(monkeypatch, tmp_path):
    """A row whose Python cell raised was recorded as 'ZeroDivisionError: division by zero', with
    no word of which of the notebook's cells (or the script's lines) failed."""
    import runpy

    from helpers_export import read_results, write_rows
    from helpers_lang import ScriptedBackend

    nb = notebook('q = "x"', "%%lm --temperature 0\n{q}{gen a max_tokens=1}", "n = len(a)\nratio = 1 / (n - 1)",
                  "%%lm --temperature 0\n{ratio}{gen b max_tokens=1}")
    source, p = export_notebook(nb)
    script = tmp_path / "myjob.py"
    script.write_text(source)
    lineno = source.split("\n").index("    ratio = 1 / (n - 1)") + 1
    rows = write_rows(tmp_path / "rows.jsonl", [{"q": "x"}])
    monkeypatch.setattr(sys, "argv", ["myjob.py", "--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                      "--no-progress"])
    ns = runpy.run_path(str(script), run_name="exported")
    backend = ScriptedBackend(lambda prompt, params: "!")  # a = "!": n - 1 == 0
    assert ns["job"].run(ns["run_row"], backend=backend) == 1
    assert read_results(tmp_path / "out.jsonl")[0]["error"] == (
        f"ZeroDivisionError: division by zero (myjob.py line {lineno}, notebook cell 3)")


def test_an_error_before_the_first_cell_of_run_row_names_no_cell(monkeypatch, tmp_path):
    """A line of run_row above its first '# -- cell' mark (the row's copy of a module value) was
    credited to the cell written last above run_row (the last %%lm program's)."""
    import runpy

    from helpers_export import read_results, write_rows
    from helpers_lang import ScriptedBackend

    nb = notebook('class Uncopyable(dict):  # not even its containers can be copied\n    __reduce_ex__ = __reduce__ = None\n'
                  'q = "x"\nshared = Uncopyable()',
                  "%%lm --temperature 0\n{q}{gen a max_tokens=1}", 'shared["a"] = a')
    source, p = export_notebook(nb)
    script = tmp_path / "myjob.py"
    script.write_text(source)
    lineno = next(i for i, line in enumerate(source.split("\n"), 1) if "row_copy(globals()" in line)
    rows = write_rows(tmp_path / "rows.jsonl", [{"q": "x"}])
    monkeypatch.setattr(sys, "argv", ["myjob.py", "--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                      "--no-progress"])
    ns = runpy.run_path(str(script), run_name="exported")
    assert ns["job"].run(ns["run_row"], backend=ScriptedBackend(lambda prompt, params: "!")) == 1
    error = read_results(tmp_path / "out.jsonl")[0]["error"]
    assert error.startswith("Error: un(shallow)copyable object of type") and error.endswith(
        f" (myjob.py line {lineno})")


def test_the_printed_command_runs_a_script_whose_path_has_a_space(tmp_path, capsys):
    """`lmnb export "my nb.ipynb"` printed `python my dir/my nb.py --input ...`: copied into a
    shell, that is the script `my` with stray words."""
    import shlex

    from lmnb_kernel.cli import main

    nb_path = tmp_path / "my dir" / "my nb.ipynb"
    nb_path.parent.mkdir()
    nbformat.write(QA, nb_path)
    assert main(["export", str(nb_path)]) == 0
    command = capsys.readouterr().err.splitlines()[-1]
    assert shlex.split(command) == ["python", str(tmp_path / "my dir" / "my nb.py"), "--input", "rows.jsonl",
                                    "--output", "results.jsonl"]
    nbformat.write(notebook("x = 1"), nb_path)  # no %%lm cell: the script runs once, without options
    assert main(["export", str(nb_path)]) == 0
    assert shlex.split(capsys.readouterr().err.splitlines()[-1]) == ["python", str(tmp_path / "my dir" / "my nb.py")]


def test_export_output_dot_slash_dash_is_a_file_named_dash(tmp_path, capsys, monkeypatch):
    """Only a bare -o - is stdout, as for lmnb run (and Unix tools); ./- is a file named -, and the
    command printed to run it says ./- (python - reads a script from stdin)."""
    import shlex

    from lmnb_kernel.cli import main

    monkeypatch.chdir(tmp_path)
    nbformat.write(QA, tmp_path / "qa.ipynb")
    assert main(["export", "qa.ipynb", "-o", "./-"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and (tmp_path / "-").read_text(encoding="utf-8") == export_notebook(
        QA, "qa.ipynb", "-", reexport="lmnb export qa.ipynb -o ./- --inputs NAMES")[0]
    assert shlex.split(err.splitlines()[-1]) == ["python", "./-", "--input", "rows.jsonl", "--output", "results.jsonl"]
    assert main(["export", "qa.ipynb", "-o", "-"]) == 0
    assert capsys.readouterr().out == export_notebook(
        QA, "qa.ipynb", "job.py", reexport="lmnb export qa.ipynb -o - --inputs NAMES" + SAVE_OVER_JOB)[0]


def test_folders_made_for_the_output_are_named(tmp_path, capsys, monkeypatch):
    """`-o jbos/job.py` made the folder jbos without a word (export and run): a typo went unseen."""
    import argparse

    from lmnb_kernel.cli import main
    from lmnb_kernel.run import run

    monkeypatch.chdir(tmp_path)
    nbformat.write(QA, tmp_path / "qa.ipynb")
    assert main(["export", "qa.ipynb", "-o", "jobs/new/job.py"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "lmnb export: created the folder jobs/new (it did not exist) for jobs/new/job.py"
    assert err[1].startswith("wrote jobs/new/job.py ") and (tmp_path / "jobs" / "new" / "job.py").is_file()
    assert main(["export", "qa.ipynb", "-o", "jobs/new/job.py"]) == 0  # the folder is there now: no word of it
    assert capsys.readouterr().err.startswith("wrote jobs/new/job.py ")
    assert main(["export", "qa.ipynb", "-o", "jobs/other/job.py"]) == 0  # only the folder made is named
    assert capsys.readouterr().err.splitlines()[0] == ("lmnb export: created the folder jobs/other (it did not exist) "
                                                       "for jobs/other/job.py")
    for out in ("jobs", "jobs/more/", "jobs/more/."):  # a folder (-o jobs/more/ wrote a script file named more)
        assert main(["export", "qa.ipynb", "-o", out]) == 2
        assert capsys.readouterr().err == f"lmnb export: {out} is a folder; give a file name, e.g. -o {Path(out)}/qa.py\n"
    assert not (tmp_path / "jobs" / "more").exists()
    (tmp_path / "notes.txt").write_text("mine")  # a file written as a folder: -o notes.txt/qa.py was suggested
    for out in ("notes.txt/", "notes.txt/."):
        assert main(["export", "qa.ipynb", "-o", out]) == 2
        assert capsys.readouterr().err == (f"lmnb export: {out} names a folder, and notes.txt is a file; give the file "
                                           "name to write, e.g. -o qa.py\n")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    target = tmp_path / "runs" / "out.ipynb"
    args = argparse.Namespace(notebook="qa.ipynb", output=str(target), parameter=[], timeout=60, allow_errors=False)

    def no_kernel():  # (the folder is made before the kernel starts: the run stops there)
        raise KeyboardInterrupt

    monkeypatch.setattr("lmnb_kernel.run.kernel_manager", no_kernel)
    with pytest.raises(KeyboardInterrupt):
        run(args)
    assert capsys.readouterr().err.splitlines()[0] == (f"lmnb run: created the folder {tmp_path / 'runs'} (it did "
                                                       f"not exist) for {target}")


def test_lmnb_run_does_not_replace_a_file_that_is_not_a_notebook(tmp_path, capsys, monkeypatch):
    """`lmnb run nb.ipynb -o job.py` (a slip for lmnb export) or `-o rows.jsonl` replaced the
    user's file with notebook JSON, exit 0; an earlier run's output notebook is replaced as before."""
    import argparse

    from lmnb_kernel.run import run

    monkeypatch.chdir(tmp_path)
    nbformat.write(QA, tmp_path / "qa.ipynb")
    precious = tmp_path / "job.py"
    precious.write_text("print(1)\n")
    args = argparse.Namespace(notebook="qa.ipynb", output="job.py", parameter=[], timeout=60, allow_errors=False)
    assert run(args) == 2
    assert capsys.readouterr().err == ("lmnb run: job.py exists and is not a notebook, which the executed notebook "
                                       "would replace; name a .ipynb file with -o (e.g. -o qa.out.ipynb), or move "
                                       "job.py away first\n")
    assert precious.read_text() == "print(1)\n"

    def no_kernel():  # (past the checks, the kernel starts: the run stops there)
        raise KeyboardInterrupt

    monkeypatch.setattr("lmnb_kernel.run.kernel_manager", no_kernel)
    nbformat.write(QA, tmp_path / "earlier.out.ipynb")
    (tmp_path / "cut.out.ipynb").write_text('{"cells": [')  # (a save that failed partway left it so)
    for output in ("earlier.out.ipynb", "cut.out.ipynb"):
        with pytest.raises(KeyboardInterrupt):
            run(argparse.Namespace(**{**vars(args), "output": output}))


def test_lmnb_run_refuses_a_second_run_writing_the_same_output_before_its_kernel_starts(tmp_path, capsys, monkeypatch):
    """Two `lmnb run nb.ipynb -o same.ipynb` at once both ran, and the last to save replaced the
    other's notebook (with other -p values, one run's work was lost); the second is now refused
    before its kernel starts, as a batch job's second writer is, while the first holds its output
    (with -o -, stdout, there is no file to hold). A run stopped before its kernel started leaves
    no output file it made, and one there before as it was."""
    import argparse
    import os

    from lmnb.output_paths import OutputInUse, lock_output
    from lmnb_kernel.run import run

    monkeypatch.chdir(tmp_path)
    nbformat.write(QA, tmp_path / "qa.ipynb")
    started = []

    def kernel_starts():  # (the first run's kernel: a second run meanwhile is refused)
        with pytest.raises(OutputInUse):
            os.close(lock_output(tmp_path / "same.ipynb"))
        started.append(True)
        raise KeyboardInterrupt

    monkeypatch.setattr("lmnb_kernel.run.kernel_manager", kernel_starts)
    args = argparse.Namespace(notebook="qa.ipynb", output="same.ipynb", parameter=[], timeout=60, allow_errors=False)
    with pytest.raises(KeyboardInterrupt):
        run(args)
    assert started and not (tmp_path / "same.ipynb").exists()  # (no kernel ran: nothing saved, nothing left)
    nbformat.write(QA, tmp_path / "same.ipynb")
    before = (tmp_path / "same.ipynb").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        run(args)
    assert (tmp_path / "same.ipynb").read_bytes() == before

    def no_kernel():
        started.append(False)
        raise KeyboardInterrupt

    monkeypatch.setattr("lmnb_kernel.run.kernel_manager", no_kernel)
    capsys.readouterr()
    first = lock_output(tmp_path / "same.ipynb")  # another run is writing it
    try:
        assert run(args) == 2
        assert capsys.readouterr().err == ("lmnb run: another run is writing same.ipynb; wait for it to finish (or "
                                           "stop it) before running again\n")
        assert (tmp_path / "same.ipynb").read_bytes() == before and started == [True, True]
        with pytest.raises(KeyboardInterrupt):  # -o -: no file, no lock, so the kernel starts
            run(argparse.Namespace(**{**vars(args), "output": "-"}))
        assert started == [True, True, False]
    finally:
        os.close(first)


def test_a_second_run_writing_a_file_that_is_no_notebook_is_told_another_run_writes_it(tmp_path, capsys, monkeypatch):
    """A second `lmnb run nb.ipynb -o x.txt` while a first one ran was refused with "x.txt exists and
    is not a notebook": the first had made x.txt, empty, as it took its lock. It is now told that
    another run is writing the file, as for -o x.ipynb, and its kernel does not start; the first run
    is unharmed (stopped before its kernel started, it removes the file it made). A file that is
    no notebook is still refused as such where no run holds it, or where it is not empty (a batch
    job's results, whose job holds them)."""
    import argparse
    import os

    from lmnb.output_paths import lock_output
    from lmnb_kernel.run import run

    monkeypatch.chdir(tmp_path)
    nbformat.write(QA, tmp_path / "qa.ipynb")
    args = argparse.Namespace(notebook="qa.ipynb", output="x.txt", parameter=[], timeout=60, allow_errors=False)
    started, second = [], []

    def kernel_starts():  # (the first run's kernel: the second run is started meanwhile)
        started.append(True)
        if len(started) == 1:
            second.append(run(args))
        raise KeyboardInterrupt

    monkeypatch.setattr("lmnb_kernel.run.kernel_manager", kernel_starts)
    with pytest.raises(KeyboardInterrupt):
        run(args)
    assert second == [2] and started == [True]  # (the second run's kernel did not start)
    assert capsys.readouterr().err == ("lmnb run: another run is writing x.txt; wait for it to finish (or stop it) "
                                       "before running again\n")
    assert not (tmp_path / "x.txt").exists()
    not_a_notebook = ("lmnb run: x.txt exists and is not a notebook, which the executed notebook would replace; name "
                      "a .ipynb file with -o (e.g. -o qa.out.ipynb), or move x.txt away first\n")
    (tmp_path / "x.txt").write_text("")  # no run holds it
    assert run(args) == 2 and capsys.readouterr().err == not_a_notebook
    (tmp_path / "x.txt").write_text('{"row": 0}\n')
    held = lock_output(tmp_path / "x.txt")
    try:
        assert run(args) == 2 and capsys.readouterr().err == not_a_notebook
    finally:
        os.close(held)
    assert (tmp_path / "x.txt").read_text() == '{"row": 0}\n' and started == [True]


@pytest.mark.parametrize("looked_at", ["lmnb_kernel.run._is_notebook", "lmnb.output_paths.held_by_another"])
def test_a_run_whose_output_the_other_run_removes_as_it_looks_runs_as_with_no_file(tmp_path, capsys, monkeypatch,
                                                                                     looked_at):
    """A second `lmnb run nb.ipynb -o x.txt` found x.txt, the empty file of a first run that held it,
    and the first run, stopped before its kernel started, removed it while the second looked at it:
    between is_file() and the stat() of its size, a FileNotFoundError traceback; between the size and
    the look for the first run's lock, "x.txt exists and is not a notebook". A file gone is no file:
    the second run goes on (its kernel starts) and says nothing of it."""
    import argparse
    import importlib
    import os

    import lmnb_kernel.run as run_module
    from lmnb.output_paths import lock_output

    monkeypatch.chdir(tmp_path)
    nbformat.write(QA, tmp_path / "qa.ipynb")
    first = lock_output(tmp_path / "x.txt")  # the first run's file, empty, and its lock on it
    looks = []
    module, name = looked_at.rsplit(".", 1)
    original = getattr(importlib.import_module(module), name)

    def first_run_stops(path):  # (as its _unlock does: lets go of the lock and removes the file it made)
        looks.append(path)
        os.close(first)
        (tmp_path / "x.txt").unlink()
        return original(path)

    def kernel_starts():
        looks.append("kernel")
        raise KeyboardInterrupt

    monkeypatch.setattr(looked_at, first_run_stops)
    monkeypatch.setattr(run_module, "kernel_manager", kernel_starts)
    args = argparse.Namespace(notebook="qa.ipynb", output="x.txt", parameter=[], timeout=60, allow_errors=False)
    with pytest.raises(KeyboardInterrupt):
        run_module.run(args)
    assert looks == [Path("x.txt"), "kernel"]
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "x.txt").exists()  # (the second run's own file, removed as its kernel did not start)


def test_an_empty_output_name_is_refused_not_read_as_the_default(tmp_path, capsys, monkeypatch):
    # -o "$OUT" with OUT unset wrote the default file without a word
    import argparse

    from lmnb_kernel.cli import main
    from lmnb_kernel.run import run

    monkeypatch.chdir(tmp_path)
    nbformat.write(QA, tmp_path / "qa.ipynb")
    assert main(["export", "qa.ipynb", "-o", ""]) == 2
    assert capsys.readouterr().err == "lmnb export: -o is empty; give a file name, or leave -o out for qa.py\n"
    args = argparse.Namespace(notebook="qa.ipynb", output="", parameter=[], timeout=60, allow_errors=False)
    assert run(args) == 2
    assert capsys.readouterr().err == "lmnb run: -o is empty; give a file name, or leave -o out for qa.out.ipynb\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qa.ipynb"]
    # a blank one wrote a file named " " (the job's --output ' ' is refused as blank) (found by the break-it review)
    assert main(["export", "qa.ipynb", "-o", " "]) == 2
    assert capsys.readouterr().err == "lmnb export: -o ' ' is blank; give a file name, or leave -o out for qa.py\n"
    assert run(argparse.Namespace(**{**vars(args), "output": "\t"})) == 2
    assert capsys.readouterr().err == ("lmnb run: -o '\\t' is blank; give a file name, or leave -o out for "
                                       "qa.out.ipynb\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qa.ipynb"]


def test_lmnb_run_refuses_a_notebook_of_another_language(tmp_path, capsys):
    """An R notebook's cells ran as Python on the lmnb kernel: one NameError after another."""
    import argparse

    from lmnb_kernel.run import run

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x <- 1")])
    nb.metadata["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    nbformat.write(nb, tmp_path / "r.ipynb")
    args = argparse.Namespace(notebook=str(tmp_path / "r.ipynb"), output=None, parameter=[], timeout=60,
                              allow_errors=False)
    assert run(args) == 2
    assert capsys.readouterr().err == (f"lmnb run: the kernel of {tmp_path / 'r.ipynb'} is for R, and lmnb run "
                                       "executes Python cells on the lmnb kernel; run it with its own kernel "
                                       "(jupyter nbconvert --execute)\n")
    assert not (tmp_path / "r.out.ipynb").exists()


@pytest.mark.parametrize("metadata", [{"kernelspec": None}, {"language_info": None}, {"kernelspec": "python3"},
                                      {"kernelspec": {"name": "py", "language": "python3"}}])
def test_lmnb_run_takes_a_notebook_whose_kernel_metadata_is_null_or_names_python3(tmp_path, monkeypatch, metadata):
    # a null kernelspec was an AttributeError traceback, and language "python3" was refused as another language
    import argparse

    from lmnb_kernel.run import run

    def no_kernel():  # (past the checks, the kernel starts: the run stops there)
        raise KeyboardInterrupt

    monkeypatch.setattr("lmnb_kernel.run.kernel_manager", no_kernel)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nb.metadata.update(metadata)
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    with pytest.raises(KeyboardInterrupt):
        run(argparse.Namespace(notebook=str(tmp_path / "nb.ipynb"), output=None, parameter=[], timeout=60,
                               allow_errors=False))


def test_a_file_where_the_outputs_folder_goes_is_named(tmp_path, capsys):
    """`-o notes.txt/job.py` (notes.txt a file) said "[Errno 17] File exists: 'notes.txt'" for
    export and run, and the job "[Errno 20] Not a directory: 'notes.txt/out.jsonl'"; then each
    named the file in the way but no fix."""
    import argparse

    from lmnb.batch import Job
    from lmnb_kernel.cli import main
    from lmnb_kernel.run import run

    blocker = tmp_path / "notes.txt"
    blocker.write_text("")
    nb_path = tmp_path / "qa.ipynb"
    nbformat.write(QA, nb_path)
    for target in (blocker / "job.py", blocker / "sub" / "job.py"):
        assert main(["export", str(nb_path), "-o", str(target)]) == 2
        assert capsys.readouterr().err == (f"lmnb export: cannot write {target}: {blocker} is a file, not a folder; "
                                           "give -o a path in a folder you can write to (e.g. -o qa.py)\n")
    target = blocker / "sub" / "out.ipynb"
    args = argparse.Namespace(notebook=str(nb_path), output=str(target), parameter=[], timeout=60, allow_errors=False)
    assert run(args) == 2
    assert capsys.readouterr().err == (f"lmnb run: cannot write {target}: {blocker} is a file, not a folder; give -o a "
                                       "path in a folder you can write to (e.g. -o qa.out.ipynb)\n")
    (tmp_path / "rows.jsonl").write_text('{"question": "q"}\n')
    job = Job("", ["question"], argv=["--input", str(tmp_path / "rows.jsonl"), "--output", str(blocker / "out.jsonl")])
    assert job.run(lambda question: None) == 2
    # (it said "the folder of the output file P is a file, B, not a folder", in other words than the two above)
    assert capsys.readouterr().err == (f"lmnb batch: cannot open the output file {blocker / 'out.jsonl'} to append the "
                                       f"results to and read them back: {blocker} is a file, not a folder; give "
                                       "--output a path in a folder this job can write to (e.g. --output "
                                       "results.jsonl)\n")


@pytest.mark.parametrize("failing, code, why", [
    ("mkdir", "EPERM", "its folder {folder} cannot be made: Operation not permitted"),  # (-o /sys/a/job.py)
    ("open", "EACCES", "Permission denied"),  # (a read-only folder)
    ("open", "ENOENT", "No such file or directory (its folder {parent} is there, but takes no new files)"),  # (/proc)
])
def test_an_output_that_cannot_be_written_is_named_with_the_problem_and_the_fix(tmp_path, capsys, monkeypatch,
                                                                               failing, code, why):
    """-o /sys/a/job.py said "[Errno 1] Operation not permitted: '/sys/a'" and -o /proc/job.py "[Errno 2] No
    such file or directory: '/proc/job.py'", naming no fix, in lmnb export and lmnb run alike."""
    import argparse
    import errno
    import os
    import pathlib

    from lmnb_kernel.cli import main
    from lmnb_kernel.run import run

    nb_path = tmp_path / "qa.ipynb"
    nbformat.write(QA, nb_path)
    folder = tmp_path / "out"
    if failing == "open":
        folder.mkdir()
    for name, command in [("job.py", "export"), ("x.ipynb", "run")]:
        target = folder / name
        real = getattr(pathlib.Path, failing) if failing == "mkdir" else open
        failing_path = folder if failing == "mkdir" else target

        def refuse(*args, real=real, failing_path=failing_path, **kwargs):  # (root passes any permission)
            path = args[0]
            if os.fspath(path) == str(failing_path):
                raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), os.fspath(path))
            return real(*args, **kwargs)

        if failing == "mkdir":
            monkeypatch.setattr(pathlib.Path, "mkdir", refuse)
        else:
            monkeypatch.setattr("builtins.open", refuse)
            monkeypatch.setattr(pathlib.Path, "write_text", lambda self, *a, **k: refuse(self))
            # (lmnb run's lock on its output opens it so)
            monkeypatch.setattr(os, "open", lambda path, *a, real=os.open, **k: refuse(path, *a, real=real, **k))
        if command == "export":
            status, example = main(["export", str(nb_path), "-o", str(target)]), "qa.py"
        else:
            status, example = run(argparse.Namespace(notebook=str(nb_path), output=str(target), parameter=[],
                                                     timeout=60, allow_errors=False)), "qa.out.ipynb"
        monkeypatch.undo()
        assert status == 2
        assert capsys.readouterr().err == (f"lmnb {command}: cannot write {target}: "
                                           f"{why.format(folder=folder, parent=folder)}; give -o a path in a folder "
                                           f"you can write to (e.g. -o {example})\n")


def test_an_out_state_keeps_its_text_when_a_later_cell_continues_the_named_state(monkeypatch):
    """The kernel continues a --state on a copy, so `--out st` keeps the state as its cell left it;
    the job extended the same object, and st.text() read the later cells' text too (found by a
    review helper)."""
    nb = notebook('q = "x"', "%%lm --state a --out st --temperature 0\nQ{q}{gen a max_tokens=1}",
                  "%%lm --state a --temperature 0\nL{gen b max_tokens=1}", "%%lm --temperature 0\n[{st.text()}]{gen c}")
    assert row_prompts(nb, monkeypatch)[0] == ["Qx", "Qx!L", "[Qx!]"]


def test_computed_gen_names_in_a_python_cell_are_warned_about():
    # the kernel bound g0 and g1; the job bound neither and every row failed on `print(g0, g1)`
    # with a NameError, though the export said nothing (found by a review helper)
    nb = notebook('q = "x"', '%%lm --python\nfor i in range(2):\n    s += q + lmnb.gen(f"g{i}", max_tokens=1)\n'
                  's += lmnb.gen("h", max_tokens=1)')
    _, p = export_notebook(nb)
    assert ("cell 2: gen/select name f'g{i}' is computed, so the job does not bind it as a variable (the "
            "kernel does); name it with a string literal, or read it from the cell's --out state") in p.notes
    # two names: the plural (one name was "names ... are", two alike)
    _, p = export_notebook(notebook('q = "x"', '%%lm --python\nfor i in range(2):\n    s += lmnb.gen(f"g{i}") + '
                                    'lmnb.select(f"k{i}", choices=["a"])'))
    assert ("cell 2: gen/select names f'g{i}', f'k{i}' are computed, so the job does not bind them as variables (the "
            "kernel does); name them with string literals, or read them from the cell's --out state") in p.notes
    for body in ('lmnb.gen("h", max_tokens=1)', "lmnb.gen(None, max_tokens=1)", "lmnb.gen(name=None)"):
        assert not any("computed" in n for n in export_notebook(notebook('q = "x"', f"%%lm --python\ns += q + {body}"))[1].notes)


COMPUTED = ("gen/select name {} is computed, so the job does not bind it as a variable (the kernel does); "
            "name it with a string literal, or read it from the cell's --out state")


@pytest.mark.parametrize("setup, body, captures, computed", [
    # another library's select is no lmnb primitive: the export warned of f'g{i}' and c{q} and took
    # np.select("x") for a captured variable
    ("import numpy as np", 'for i in range(2):\n    s += str(np.select([True], [f"g{i}"]))\ns += np.select("x")',
     (), None),
    ("class D:\n    def select(self, name): return name\ndf = D()", 's += df.select(f"c{q}") + lmnb.gen("h")',
     ("h",), None),
    ("x = 1", 'def gen(name): return name\ns += gen(f"x{q}")', (), None),  # the body's own gen
    # lmnb's primitives by other names: an alias of the module, an import, a partial of one (it was missed)
    ("import lmnb as sgl", 's += sgl.select(f"v{q}", choices=["a"]) + sgl.gen("w")', ("w",), "f'v{q}'"),
    ("from lmnb import gen as g", 's += g(name=f"n{q}") + g("m")', ("m",), "f'n{q}'"),
    ("from functools import partial", 'for i in range(2):\n    s += partial(lmnb.gen, f"g{i}", max_tokens=1)()',
     (), "f'g{i}'"),
    ("import functools\nfrom lmnb import gen", 'ask = functools.partial(gen, max_tokens=1)\n'
     'for i in range(2):\n    s += ask(f"a{i}")\ns += ask("lit") + functools.partial(gen, name="p")()',
     ("lit", "p"), "f'a{i}'"),
    # ... and by names the export did not follow: a star import, the api module, partial renamed
    ("from lmnb import *", 's += gen(f"s{q}") + select("t", choices=["a"])', ("t",), "f's{q}'"),
    ("import lmnb.api as A", 's += A.gen(f"u{q}") + A.gen("v")', ("v",), "f'u{q}'"),
    ("from lmnb import api", 's += api.gen(f"u{q}")', (), "f'u{q}'"),
    ("from functools import partial as p", 's += p(lmnb.gen, f"w{q}")() + p(lmnb.select, "y", choices=["a"])()',
     ("y",), "f'w{q}'"),
    ("import lmnb\ng = lmnb.gen", 's += g(f"z{q}")', (), "f'z{q}'"),
    ("L = lmnb", 's += L.gen("a2") + L.gen(f"b{q}")', ("a2",), "f'b{q}'"),  # (found by a review helper)
    # lmnb's gen bound to another function afterwards (in the cell above, in the body) is no primitive
    ("from lmnb import gen\ndef mine(name): return name\ngen = mine", 's += gen(f"x{q}") + gen("lit")', (), None),
    ("from lmnb import gen", 'gen = str\ns += gen(f"x{q}") + lmnb.gen("k")', ("k",), None),
    ("from lmnb import gen\nclass gen: pass", 's += gen(f"x{q}")', (), None),
    # a gen bound inside a function is that function's own: the cell's gen is still lmnb's
    ("from lmnb import gen\ndef f():\n    gen = 1\n    return gen", 's += gen(f"x{q}")', (), "f'x{q}'"),
    # ... and so is one a lambda's := binds; but a for or with target, a := (a comprehension's too)
    # and a function's `global gen` rebind the cell's gen, which the export kept as lmnb's (found by a review)
    ("from lmnb import gen\nf = lambda: (gen := 1)", 's += gen(f"x{q}")', (), "f'x{q}'"),
    ("from lmnb import gen", 'for gen in [str]:\n    s += gen(f"x{q}") + gen("lit")', (), None),
    ("from lmnb import gen\nfor i, (gen, _) in enumerate([(str, 1)]): pass", 's += gen(f"x{q}") + lmnb.gen("k")',
     ("k",), None),
    ("import contextlib\nfrom lmnb import gen\nwith contextlib.nullcontext(str) as gen: pass", 's += gen(f"x{q}")',
     (), None),
    ("from lmnb import gen\nif (gen := str): pass", 's += gen(f"x{q}") + gen("lit")', (), None),
    ("from lmnb import gen\n[(gen := str) for _ in [1]]", 's += gen(f"x{q}")', (), None),
    ("from lmnb import gen\ndef f():\n    global gen\n    gen = str", 's += gen(f"x{q}") + gen("lit")', (), None),
    ("import lmnb\nif (g := lmnb.gen): pass", 's += g(f"z{q}") + g("w")', ("w",), "f'z{q}'"),  # still lmnb's
    # ... as do an except or case clause's name, del and an augmented assignment, which the export
    # also kept as lmnb's (found by a review)
    ("from lmnb import gen\ntry:\n    1 / 0\nexcept ZeroDivisionError as gen:\n    pass", 's += gen(f"x{q}")',
     (), None),
    ("from lmnb import gen", 'try:\n    pass\nexcept OSError as gen:\n    pass\ns += gen(f"x{q}") + lmnb.gen("k")',
     ("k",), None),
    ("from lmnb import gen\nmatch str:\n    case type() as gen: pass", 's += gen(f"x{q}") + gen("lit")', (), None),
    ("from lmnb import gen\nmatch [str]:\n    case [*gen]: pass", 's += gen(f"x{q}")', (), None),
    ("from lmnb import gen\ndel gen", 's += gen(f"x{q}") + gen("lit")', (), None),
    ("import lmnb as sgl", 'del sgl\ns += sgl.gen(f"x{q}") + lmnb.gen("k")', ("k",), None),
    ("from lmnb import gen\ngen += 1", 's += gen(f"x{q}") + gen("lit")', (), None),
    ("from lmnb import select", 'select += ""\ns += select("y", choices=["a"])', (), None),
])
def test_only_lmnbs_gen_and_select_name_a_python_cells_variables(setup, body, captures, computed):
    _, p = export_notebook(notebook('q = "x"', setup, "%%lm --python\n" + body))
    assert p.lm_cells[0].captures == captures
    assert [n for n in p.notes if "computed" in n] == ([f"cell 3: {COMPUTED.format(computed)}"] if computed else [])


def test_the_scripts_doc_names_every_exit_status_its_help_lists(capsys):
    """The script's docstring, --help's description, gave 130 for Ctrl-C alone and no 141, where
    the list at the end of the same --help gives 130 for SIGTERM too, and 141 for a closed pipe."""
    import re

    from lmnb.batch import runner

    nb = notebook('question = "What?"', "%%lm\nQ: {question}{gen a max_tokens=1}")
    doc = ast.get_docstring(ast.parse(export_notebook(nb)[0]))
    said = doc.split("Exit status:", 1)[1]
    codes = [int(n) for n in re.findall(r"(?<![\w.])(\d+)\s(?:every|some|the|stopped|by)", said)]
    assert codes == [runner.EXIT_OK, runner.EXIT_ROW_ERRORS, runner.EXIT_FATAL, runner.EXIT_INTERRUPTED,
                     runner.EXIT_BROKEN_PIPE] == [0, 1, 2, 130, 141]
    assert "SIGTERM" in said


def test_row_fields_whose_example_is_text_must_be_text_in_the_job(tmp_path, monkeypatch):
    """{"question": 7} ran as a row: a prompt written for text got 7 (here question.strip() failed
    the row with an AttributeError that said nothing of the input)."""
    from helpers_export import read_results, write_rows
    from helpers_lang import ScriptedBackend

    nb = notebook(("parameters", 'style = "terse"\nn = 2'), 'question = "What?"', 'prompt = f"Q: {question}"',
                  "%%lm --temperature 0\n{prompt.strip()} {topic}{style}{n}{gen a max_tokens=1}")
    source, p = export_notebook(nb)
    # topic: read and never set, so its type is unknown; style is a parameter, not a row field
    assert (p.inputs, p.texts) == (("question", "topic"), ("question",))
    assert ("job = lmnb.batch.Job(__doc__, inputs=['question', 'topic'], texts=['question'], parameters={'style': "
            "'terse', 'n': 2}, options_first=True,\n"
            "                     reexport='lmnb export notebook.ipynb --inputs NAMES')\n") in source
    assert "Text, as the notebook's examples are (a JSON string, not a number or a list): question." in source
    assert "also on a rerun that\nleaves it so" in source  # the exit status, in --help
    assert export_notebook(nb, inputs=["question", "n"])[1].texts == ("question",)  # n's example is a number
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": 7, "topic": 1}, {"question": "Why?", "topic": [3]}])
    out = tmp_path / "out.jsonl"
    ns = _load_job(source, monkeypatch, rows, out)
    backend = ScriptedBackend(lambda prompt, params: "!")
    assert ns["job"].run(ns["run_row"], backend=backend) == 1
    results = {r["row"]: r for r in read_results(out)}
    assert (results[0]["status"], results[1]["status"]) == ("bad_input", "ok")
    assert results[0]["error"].startswith("line 1: field 'question' is a number, 7; the notebook's example of it is text")
    assert [c[1][0].text for c in backend.calls if c[0] == "generate"] == ["Q: Why? [3]terse2"]


def test_a_python_cell_reading_a_variable_named_seed_with_its_seed_option_is_refused_at_export():
    # the job's cell.run(seed, seed=1) gave the program's seed two values, failing every row: the
    # kernel runs the body with seed as a global, where the job passes it as a parameter (found by a
    # review helper); a template cell's parameter is renamed, and without --seed the value passes
    cell = "%%lm --python{}\ns += seed + lmnb.gen('x', max_tokens=2)"
    with pytest.raises(ExportError, match=re.escape(
            "cell 2 (%%lm --python): the body reads a variable named 'seed', which the job's run() also takes "
            "for the cell's --seed; rename the variable (e.g. seed_) in the notebook")):
        export_notebook(notebook('seed = "abc"', cell.format(" --seed 1")), "nb.ipynb", "job.py")
    source, _ = export_notebook(notebook('seed = "abc"', cell.format("")), "nb.ipynb", "job.py")
    assert ".run(seed)" in source
    source, _ = export_notebook(notebook('seed = "abc"', "%%lm --seed 1\n{seed}{gen x max_tokens=2}"), "nb.ipynb",
                                "job.py")
    assert "seed=1)" in source


def test_names_a_star_import_of_lmnb_binds_are_no_row_fields():
    # symtable lists no name that `from lmnb import *` binds: the --python cell's gen was taken for
    # a row field, and every row was bad_input "missing field 'gen'" (found by a review helper)
    nb = notebook("from lmnb import *", 'q = "x"', '%%lm --python\ns += q + gen("star", max_tokens=2)', "print(star)")
    _, p = export_notebook(nb)
    assert p.inputs == ("q",) and p.lm_cells[0].captures == ("star",)



def test_names_a_star_import_of_another_module_binds_are_no_row_fields(tmp_path, monkeypatch):
    # `from math import *` binds pi, which symtable does not list: pi became a row field, and every
    # row without a "pi" was bad_input (found by a review)
    from helpers_export import read_results, write_rows
    from helpers_lang import ScriptedBackend

    nb = notebook('from math import *\nquestion = "What?"', "%%lm --temperature 0\n{question} {pi:.2f}{gen a max_tokens=1}",
                  '%%lm --python --temperature 0\ns += str(floor(e)) + lmnb.gen("b", max_tokens=1)')
    source, p = export_notebook(nb)
    assert p.inputs == ("question",)
    assert ("pi, floor, e: read by the %%lm cells and set by no cell, so taken to come from `from math import *` "
            "(cell 1), not to be row fields; name the row fields with --inputs if one is") in p.notes
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "Why?"}])
    out = tmp_path / "out.jsonl"
    ns = _load_job(source, monkeypatch, rows, out)
    backend = ScriptedBackend(lambda prompt, params: "!")
    assert ns["job"].run(ns["run_row"], backend=backend) == 0
    assert [r["status"] for r in read_results(out)] == ["ok"]
    assert [c[1][0].text for c in backend.calls if c[0] == "generate"] == ["Why? 3.14", "2"]


def test_a_notebook_calling_jupyters_display_runs_as_a_job(tmp_path, monkeypatch, capsys):
    # display is a Jupyter built-in: the job failed every row on "NameError: name 'display' is not
    # defined", and the export said nothing (found by a review helper)
    from helpers_export import read_results, write_rows
    from helpers_lang import ScriptedBackend

    nb = notebook('person = "A"', "%%lm --temperature 0\n{person}{gen x max_tokens=2}", "display(x + '?')")
    source, p = export_notebook(nb)
    assert p.inputs == ("person",) and p.notes == []
    rows = write_rows(tmp_path / "rows.jsonl", [{"person": "B"}])
    out = tmp_path / "out.jsonl"
    ns = _load_job(source, monkeypatch, rows, out)
    assert ns["job"].run(ns["run_row"], backend=ScriptedBackend(lambda prompt, params: "!")) == 0
    assert [r["status"] for r in read_results(out)] == ["ok"]
    assert "!?\n" in capsys.readouterr().out
    # a notebook with a display of its own keeps it (and imports nothing)
    own = export_notebook(notebook("def display(v):\n    print('mine', v)", *[c.source for c in nb.cells[1:]]))[0]
    assert "IPython" not in own
    # nor is it a row field when a --python cell's body calls it
    assert export_notebook(notebook('person = "A"', "%%lm --python\ns += person\ndisplay(s)"))[1].inputs == ("person",)


def test_jupyters_display_is_imported_when_a_cell_calls_it_before_a_later_cell_defines_its_own(tmp_path, monkeypatch,
                                                                                                 capsys):
    # a cell defining display anywhere left the import out, so a cell calling Jupyter's display
    # before that definition failed every row with a NameError (found by a review helper)
    from helpers_export import read_results, write_rows
    from helpers_lang import ScriptedBackend

    nb = notebook('person = "A"', "%%lm --temperature 0\n{person}{gen x max_tokens=2}", "display(x + '?')",
                  "def display(v):\n    print('mine', v)", "display(x)")
    source, p = export_notebook(nb)
    assert "from IPython.display import display" in source
    rows = write_rows(tmp_path / "rows.jsonl", [{"person": "B"}])
    out = tmp_path / "out.jsonl"
    ns = _load_job(source, monkeypatch, rows, out)
    assert ns["job"].run(ns["run_row"], backend=ScriptedBackend(lambda prompt, params: "!")) == 0
    assert [r["status"] for r in read_results(out)] == ["ok"]
    # as in the notebook: Jupyter's display first, then the notebook's own
    assert capsys.readouterr().out.endswith("!?\nmine !\n")
    # defined before any use: the notebook's own, no import
    assert "IPython" not in export_notebook(notebook(*[c.source for c in nb.cells[:2]], *[c.source for c in nb.cells[3:]]))[0]


def test_a_parameter_named_in_inputs_reads_each_rows_value_as_its_defaults_type(tmp_path, monkeypatch):
    # --inputs n for `n = 3`: a CSV row's "4" ran as the text "4" (n * 2 was "44"), "0x20" too, and the
    # job's --n option went away without a word (found by a review helper)
    nb = notebook(("parameters", "n = 3"), "m = n * 2", "%%lm --temperature 0\n{m}{gen x max_tokens=1}")
    source, p = export_notebook(nb, inputs=["n"])
    assert p.types == {"n": int}
    assert ("n: a parameter of cell 1, read from each input row (--inputs), so the job has no --n option; a row's n "
            "is read as its default's type, int") in p.notes
    rows = tmp_path / "rows.csv"
    rows.write_text("n\n4\n0x20\nmany\n4.5\n", encoding="utf-8")
    results, prompts = _run_job_rows(source, monkeypatch, rows)
    assert [r["status"] for r in results] == ["ok", "ok", "bad_input", "bad_input"]
    assert results[2]["error"] == ('line 4: field \'n\': expected an integer (e.g. 3, 1_000 or 0x20), got "many"; '
                                   "it is the notebook's parameter n, whose default is of type int")
    assert sorted(prompts) == ["64", "8"]  # 4 * 2, 0x20 * 2
    # JSON rows: a number as it is, a string read as the option reads it, a boolean refused
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"n": 5}\n{"n": "6"}\n{"n": true}\n', encoding="utf-8")
    results, prompts = _run_job_rows(source, monkeypatch, rows)
    assert [r["status"] for r in results] == ["ok", "ok", "bad_input"]
    assert sorted(prompts) == ["10", "12"]
    # the value as the row holds it, in JSON (it said "got 'True'")
    assert results[2]["error"] == ("line 3: field 'n': expected an integer (e.g. 3, 1_000 or 0x20), got true; it is "
                                   "the notebook's parameter n, whose default is of type int")


def test_a_rows_field_of_the_wrong_type_is_shown_as_json_without_the_shells_quotes(tmp_path, monkeypatch):
    # a row's error said "(in quotes for the shell: '[1, 2]')", which means nothing in a row, and
    # showed JSON's true as Python's 'True' (found by the final review helper)
    nb = notebook(("parameters", "tags = ['a']\nlimits = {'low': 0}"), "m = f'{tags} {limits}'",
                  "%%lm --temperature 0\n{m}{gen x max_tokens=1}")
    source, _ = export_notebook(nb, inputs=["tags", "limits"])
    rows = tmp_path / "rows.jsonl"
    long = "b" * 50
    rows.write_text(f'{{"tags": "b", "limits": {{}}}}\n{{"tags": [], "limits": true}}\n'
                    f'{{"tags": "{long}", "limits": {{}}}}\n{{"tags": [true, null], "limits": {{"a": null}}}}\n',
                    encoding="utf-8")
    results, prompts = _run_job_rows(source, monkeypatch, rows)
    assert [r["status"] for r in results] == ["bad_input", "bad_input", "bad_input", "ok"]
    why = "it is the notebook's parameter"
    assert [r["error"] for r in results[:3]] == [
        f'line 1: field \'tags\': expected a list as a Python literal or JSON, e.g. [1, 2], got "b"; {why} tags, '
        "whose default is of type list",
        f"line 2: field 'limits': expected a dict as a Python literal or JSON, e.g. {{\"a\": 1}}, got true; {why} "
        "limits, whose default is of type dict",
        f'line 3: field \'tags\': expected a list as a Python literal or JSON, e.g. [1, 2], got "{"b" * 39}…; {why} '
        "tags, whose default is of type list"]
    assert prompts == ["[True, None] {'a': None}"]


def test_a_rows_list_or_dict_parameter_keeps_its_characters_outside_the_basic_plane(tmp_path, monkeypatch):
    # a JSON row's list / dict value was written out as JSON with \\ud83d\\ude00 escapes and read back
    # as a Python literal, where that is two lone surrogates: "😀" became half characters that no
    # tokenizer encodes (found by the break-it review)
    nb = notebook(("parameters", "tags = ['a']\nlimits = {'low': 0}"), "m = f'{tags[0]} {limits[\"k\"]}'",
                  "%%lm --temperature 0\n{m}{gen x max_tokens=1}")
    source, _ = export_notebook(nb, inputs=["tags", "limits"])
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"tags": ["\U0001F600 ok"], "limits": {"k": "\U00020000"}}) + "\n", encoding="utf-8")
    results, prompts = _run_job_rows(source, monkeypatch, rows, 0)
    assert [r["status"] for r in results] == ["ok"] and prompts == ["\U0001F600 ok \U00020000"]


def test_a_parameter_of_another_default_named_in_inputs_keeps_its_rows_values(tmp_path, monkeypatch):
    # `x = ...` (or b"", None) has no type its option reads text as: the script said types={'x': ellipsis},
    # a NameError before any row ran (found by a review helper)
    nb = notebook(("parameters", "x = ...\ny = b''\nn = 1"), "%%lm --temperature 0\n{x} {y} {n}{gen z max_tokens=1}")
    source, p = export_notebook(nb, inputs=["x", "y", "n"])
    assert p.types == {"n": int}
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"x": "a", "y": "b", "n": "2"}\n{"x": "a", "y": "b", "n": "two"}\n', encoding="utf-8")
    results, prompts = _run_job_rows(source, monkeypatch, rows)
    assert [r["status"] for r in results] == ["ok", "bad_input"] and prompts == ["a b 2"]


def test_a_json_list_is_a_tuple_or_set_parameters_value(tmp_path, monkeypatch):
    # JSON has no tuple or set: a row's list for `pair = (1, 2)` was refused as "expected a tuple"
    nb = notebook(("parameters", "pair = (1, 2)\ntags = {'a'}"), "m = f'{type(pair).__name__}{pair} {sorted(tags)}'",
                  "%%lm --temperature 0\n{m}{gen x max_tokens=1}")
    source, _ = export_notebook(nb, inputs=["pair", "tags"])
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"pair": [3, 4], "tags": ["b", "c", "b"]}\n{"pair": [], "tags": []}\n'
                    '{"pair": "(5,)", "tags": [[1]]}\n', encoding="utf-8")
    results, prompts = _run_job_rows(source, monkeypatch, rows)
    assert [r["status"] for r in results] == ["ok", "ok", "bad_input"]
    assert results[2]["error"] == ("line 3: field 'tags': expected a set or a list as a Python literal or JSON, e.g. "
                                   "{1, 2}, got [[1]]; it is the notebook's parameter tags, whose default is of type "
                                   "set")
    assert sorted(prompts) == ["tuple() []", "tuple(3, 4) ['b', 'c']"]


def test_a_json_array_or_object_holding_nan_or_infinity_is_a_container_parameters_value(tmp_path, monkeypatch):
    # json reads NaN and Infinity as nan and inf, whose repr is no literal: `[NaN]` for `weights = [0.5]`
    # was bad input, "expected a list as a Python literal ..., got '[nan]'"
    from helpers_export import read_results
    from helpers_lang import ScriptedBackend

    nb = notebook(("parameters", "weights = [0.5]\npair = (1.0, 2.0)\nlimits = {'low': 0.0}"),
                  "m = f'{weights} {type(pair).__name__}{pair} {limits}'", "%%lm --temperature 0\n{m}{gen x max_tokens=1}")
    source, _ = export_notebook(nb, inputs=["weights", "pair", "limits"])
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"weights": [NaN, 1], "pair": [Infinity, 2], "limits": {"low": -Infinity}}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    ns = _load_job(source, monkeypatch, rows, out)
    backend = ScriptedBackend(lambda prompt, params: "!")
    assert ns["job"].run(ns["run_row"], backend=backend) == 0
    assert [r["status"] for r in read_results(out)] == ["ok"]
    assert [c[1][0].text for c in backend.calls if c[0] == "generate"] == ["[nan, 1] tuple(inf, 2) {'low': -inf}"]


def test_star_imports_of_cells_that_run_per_row_are_made_at_module_level(tmp_path, monkeypatch, capsys):
    # run_row is a function, where `from math import *` is a SyntaxError: the export failed with "the
    # exported script does not compile ... simplify expressions in their {...} holes" (found by a review helper)
    from helpers_export import read_results, write_rows
    from helpers_lang import ScriptedBackend

    lm = "%%lm --temperature 0\n{q}{gen city max_tokens=3}"
    later = notebook('q = "Arvel"', lm, "x = 1\nfrom math import *\nprint(sqrt(4), city)\nprint(x / 0)")
    moved = notebook('from math import *\nperson = "Arvel"\nq = person.upper() + str(floor(e))', lm)
    for nb, row, printed in ((later, {"q": "B"}, "2.0 !\n"), (moved, {"person": "b"}, "")):
        source, p = export_notebook(nb)
        assert re.search(r"\njob.star_import\(globals\(\), 'math'\)\n+def run_row\(", source)
        rows = write_rows(tmp_path / "rows.jsonl", [row])
        out = tmp_path / "out.jsonl"
        out.unlink(missing_ok=True)
        monkeypatch.setattr(sys, "argv", ["job.py", "--input", str(rows), "--output", str(out), "--no-progress"])
        ns = {"__name__": "exported"}
        (tmp_path / "job.py").write_text(source)  # (the error names the cell from the file's comments)
        exec(compile(source, str(tmp_path / "job.py"), "exec"), ns)
        backend = ScriptedBackend(lambda prompt, params: "!")
        ns["job"].run(ns["run_row"], backend=backend)
        assert printed in capsys.readouterr().out
        results = read_results(out)
        if nb is moved:
            assert [r["status"] for r in results] == ["ok"]
            assert [c[1][0].text for c in backend.calls if c[0] == "generate"] == ["B2"]
        else:  # the cell keeps its lines: the error is on the cell's line 4
            assert results[0]["status"] == "error"
            # x, bound above it, takes math's x if it has one, as in the notebook; print and sqrt, which no cell
            # binds and the row reads only below the import, are the script's globals, as job.star_import set them
            assert ("    q, city, x = job.star_values('math', locals(), 'q', 'city', 'x')"
                    "  # from math import *: here its values of run_row's variables\n    print(sqrt(4), city)") in source
            line = int(re.search(r"job.py line (\d+)", results[0]["error"]).group(1))
            assert source.split("\n")[line - 1] == "    print(x / 0)" and "notebook cell 3" in results[0]["error"]
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "A"', lm, "if True:\n    from math import *"))
    assert str(e.value) == ("cell 3, line 2: `from math import *` in a block of a cell that runs per input row, where "
                            "the script cannot make it (a function cannot star-import); move it to a cell of its own "
                            "before the first %%lm cell")


def test_a_star_import_of_a_per_row_cell_sets_the_names_the_row_bound_before_it(tmp_path, monkeypatch):
    # the import is made at module level, so a row variable bound above it (pi = 3) kept its own
    # value, where the notebook's import replaced it with math's (found by a review helper)
    from helpers_export import write_rows

    code = "pi = 3\nx = 1\nfrom math import *\ny = 2"
    nb = notebook('q = "A"', "%%lm --temperature 0\n{q}{gen e max_tokens=1}", code,
                  "%%lm --temperature 0\n{pi} {x} {y} {e}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    notebook_ns = {"e": "!"}  # (cell 2's gen) then cell 3 as the notebook runs it
    exec(code, notebook_ns)
    assert notebook_ns["pi"] != 3 and notebook_ns["e"] != "!"  # math's pi and e replaced them
    results, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert [r["status"] for r in results] == ["ok"]
    assert prompts == ["B", " ".join(str(notebook_ns[n]) for n in ("pi", "x", "y", "e"))]
    # the cell keeps its lines: the import's line is where the row takes the module's values
    assert "    y = 2\n" in source.split("    pi = 3\n    x = 1\n", 1)[1].split("\n", 1)[1]
    # a row field whose example comes after the import keeps the row's value (the notebook's row sets
    # it there), as in the notebook: math's e does not replace it
    nb = notebook('from math import *\ne = "x"\nprompt = e + str(floor(pi))', "%%lm --temperature 0\n{prompt}{gen z}")
    source, p = export_notebook(nb)
    assert p.inputs == ("e",)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows2.jsonl", [{"e": "B"}]), 0)
    assert prompts == ["B3"]


def test_a_star_import_of_a_per_row_cell_sets_parameters_and_setup_variables_from_where_it_stands(tmp_path,
                                                                                                    monkeypatch):
    # the import was made at module level, before run_row: a parameter e = 2 read above the import
    # was math's e in every row (the notebook's was 2), and --e 5 had no effect (found by the last review)
    import math

    from helpers_export import write_rows
    from helpers_lang import ScriptedBackend

    nb = notebook(("parameters", "e = 2"), 'q = "A"\nk = 7', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  "b = (e, k)\nfrom math import *\nk = floor(k / 2)",
                  "%%lm --temperature 0\n{b} {e} {k}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.star_locals == ("e",)  # (k, rebound by the cell, is a row copy already)
    rows = write_rows(tmp_path / "rows.jsonl", [{"q": "B"}, {"q": "C"}])
    for options, e in (([], 2), (["--e", "5"], 5)):
        out = tmp_path / f"out{e}.jsonl"
        monkeypatch.setattr(sys, "argv", ["job.py", "--input", str(rows), "--output", str(out), "--no-progress",
                                          *options])
        ns = {"__name__": "exported"}
        exec(compile(source, "job.py", "exec"), ns)
        backend = ScriptedBackend(lambda prompt, params: "!")
        assert ns["job"].run(ns["run_row"], backend=backend) == 0
        prompts = [c[1][0].text for c in backend.calls if c[0] == "generate"]
        # each row: e as the parameter sets it above the import, math's e below it; k = 7 halved once per row
        assert sorted(prompts) == sorted(["B", "C"] + [f"({e}, 7) {math.e} 3"] * 2)


def test_a_per_row_star_import_sets_a_variable_the_cell_binds_below_it(tmp_path, monkeypatch):
    # `from math import *; print(pi); pi = 3` in a per-row cell was an UnboundLocalError in the
    # script (pi is run_row's variable, bound only below); the notebook printed math's pi (found by the
    # last review). A variable the module does not set stays unbound, as in the notebook.
    import math

    from helpers_export import write_rows

    code = ("if q == 'never':\n    y = 1\nfrom math import *\nc = str(pi)\npi = 3\n"
            "try:\n    w = y\nexcept NameError:\n    w = 'unbound'")
    nb = notebook('q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", code,
                  "%%lm --temperature 0\n{c} {pi} {w}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    results, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert prompts == ["B", f"{math.pi} 3 unbound"]


@pytest.mark.parametrize("setup, cells", [
    ("", ["from math import *\na = str(sqrt(4))\nfrom cmath import *\nb = str(sqrt(4))"]),
    ("", ["from math import *", "a = str(sqrt(4))", "from cmath import *\nb = str(sqrt(4))"]),
    ("from math import *", ["a = str(sqrt(4))", "from cmath import *\nb = str(sqrt(4))"]),  # (a: the setup's sqrt)
    # a builtin that a star import replaces: the builtin above the import, a function reading it after it
    ("", ["def f():\n    return str(pow(2, 3))\na = f()", "from math import *\nb = f() + ' ' + str(pow(2, 3))"]),
])
def test_each_per_row_star_import_sets_the_names_no_cell_binds_from_its_own_line_on(tmp_path, monkeypatch, setup,
                                                                                     cells):
    # the script made the row's star imports at module level, before run_row, so the last module's
    # names held for the whole row: the notebook's `2.0 (2+0j)` for str(sqrt(4)) after `from math
    # import *` and after `from cmath import *` was `(2+0j) (2+0j)` in the job, and pow above
    # `from math import *` was math's (8.0) where the notebook's was the builtin (8)
    from helpers_export import write_rows

    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{a} {b}{gen z max_tokens=1}",
                  '%%lm --python --temperature 0\ns += str(pow(2, 3)) + lmnb.gen("y", max_tokens=1)')
    source, _ = export_notebook(nb)
    notebook_ns = {"x": "!"}  # (cells 1-2 as the row runs them) then the Python cells in order
    for code in [setup, *cells]:
        exec(code, notebook_ns)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert prompts == ["B", f"{notebook_ns['a']} {notebook_ns['b']}", str(notebook_ns["pow"](2, 3))]
    assert prompts[1] in ("2.0 (2+0j)", "8 8.0 8.0") and prompts[2] == "8.0"


@pytest.mark.parametrize("cells", [
    ["r = str(len(q))", "len = 3"],
    ["from math import *\nr = str(len(q))", "len = 3"],  # (the import gave run_row's len job.UNBOUND)
    ["r = str(pow)\nfrom math import *\npow = 'P'\nr += pow"],
])
def test_a_builtin_a_row_cell_binds_is_the_builtin_where_a_row_cell_reads_it_before(tmp_path, monkeypatch, cells):
    # a per-row cell that binds len makes it run_row's variable, so a row cell that read the
    # builtin above it failed every row with UnboundLocalError; the notebook read the builtin there
    from helpers_export import write_rows

    nb = notebook('q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    notebook_ns = {"q": "BB", "x": "!"}  # (cells 1-2 as the row runs them) then the row's cells in order
    for code in cells:  # (a %%lm cell binds none: a result named like a builtin is refused)
        exec(code, notebook_ns)
    results, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "BB"}]), 0)
    assert prompts[-1] == notebook_ns["r"] and prompts[-1] in ("2", "<built-in function pow>P")


def test_a_setup_function_reading_a_variable_the_row_cells_set_is_noted_at_export(tmp_path, monkeypatch):
    # a function of a cell that runs once reads the script's globals, not run_row's variables: f()
    # failed every row with NameError: name 'x' is not defined (the notebook's gave "!?"), and the
    # export said nothing
    from helpers_export import write_rows

    define, lm = 'def f():\n    return x + "?"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}"
    nb = notebook(f'{define}\nq = "A"', lm, "r = f()", "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.notes == ["cell 1: f, defined in a cell that runs once, reads x, which the cells that run per row set: "
                       "in the job it reads the script's globals, not the row's variables (a NameError, or the value "
                       "the cells run once set); pass it as an argument to f, or move f into a cell below the first "
                       "%%lm cell"]
    results, _ = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]))
    assert results[0]["error"].startswith("NameError: name 'x' is not defined")
    # as the note says: defined below the first %%lm cell, f reads the row's x, as in the notebook
    notebook_ns = {"q": "B", "x": "!"}  # (cells 1-2 as the row runs them)
    exec(f"{define}\nr = f()", notebook_ns)
    source, p = export_notebook(notebook('q = "A"', lm, define, "r = f()", "%%lm --temperature 0\n{r}{gen z max_tokens=1}"))
    assert p.notes == []
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows2.jsonl", [{"q": "B"}]), 0)
    assert prompts == ["B", notebook_ns["r"]] == ["B", "!?"]
    # a comprehension runs where the cell defines it (Python 3.11 gives it a function's symbol table)
    nb = notebook('n = 1\nns = [n for _ in range(2)]\nq = "A"', lm, "n = 2")
    assert export_notebook(nb)[1].notes == []
    # so does a %%timeit body (or %timeit line), in the function the script wraps it in: the note named
    # that function, _timeit_body, which the notebook does not have
    for timed in ("%%timeit -n1 -r1\nm = n * 2", "%timeit m = n * 2"):
        assert export_notebook(notebook('n = 1\nq = "A"', timed, lm, "n = 2"))[1].notes == []


def test_a_setup_function_reading_a_global_a_per_row_function_sets_gets_no_note(tmp_path, monkeypatch):
    # show() reads the script's global g, which setg() of the per-row cell sets by `global`, as in the
    # notebook; the export noted that show read the set-up's value or failed with a NameError
    from helpers_export import write_rows

    setup, cell = 'def show():\n    return str(g)\nq = "A"', "def setg():\n    global g\n    g = q + '!'\nsetg()\nr = show()"
    nb = notebook(setup, "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    assert not [n for n in p.notes if "show" in n]
    notebook_ns = {}  # the Python cells in order, the row's q set after cell 1
    exec(setup, notebook_ns)
    notebook_ns["q"] = "B"
    exec(cell, notebook_ns)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert prompts == ["B", notebook_ns["r"]] == ["B", "B!"]


def test_a_setup_function_reading_a_variable_a_per_row_star_import_sets_is_warned_of(tmp_path, monkeypatch, capsys):
    # a function of a cell run once reads the script's globals, which the row's `from math import *`
    # leaves (it sets run_row's own variables): f() gave (2, 3) in every row where the notebook's
    # gave math's e and pi after the import, without a word
    import math

    from helpers_export import write_rows

    setup = ("pi = 3\nk = 1\ndef f():\n    return (e, pi, k)\nclass C:\n    v = pi  # (run where it is defined)\n"
             "    def m(self):\n        return pi\ndef g():\n    return k")
    nb = notebook(("parameters", "e = 2"), setup, 'q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  "from math import *\nr = str(f())", "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    notebook_ns = {"e": 2}  # (the parameters cell) then the Python cells in order
    for code in [setup, "from math import *\nr = str(f())"]:
        exec(code, notebook_ns)
    assert notebook_ns["r"] == str((math.e, math.pi, 1))
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert prompts[1] == "(2, 3, 1)"  # (the job cannot set a global per row: its rows run at once)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [f"lmnb batch: warning: {where} reads {n}, which the per-row `from math import *` sets: in the "
                        f"notebook it read the module's {n} after that import, in this job it reads the value the "
                        f"cells run once set, in every row; pass {n} to it as an argument"
                        for where, n in (("f (cell 2)", "e"), ("f (cell 2)", "pi"), ("C (cell 2)", "pi"))]


@pytest.mark.parametrize("module, noted", [("math", True), ("cmath", False), ("numpy", False), ("nosuchmodule", False),
                                           ("this", False)])
def test_a_builtin_a_setup_function_reads_is_noted_where_a_standard_module_sets_it(capsys, module, noted):
    """Only a module of Python's standard library is imported at export to learn what its star
    import sets (math sets pow, cmath does not); another, numpy, which sets pow too, is left to the
    job's run-time warning, as one that does not exist is, and a standard one that acts on import
    (this prints the Zen of Python) is not imported."""
    import cmath
    import math

    assert hasattr(math, "pow") and not hasattr(cmath, "pow")
    nb = notebook('def f():\n    return str(pow(2, 3))\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  f"a = f()\nfrom {module} import *\nr = a + f()", "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    _, p = export_notebook(nb)
    assert [n.split(",")[0] for n in p.notes if "a builtin" in n] == (["cell 1: pow"] if noted else [])
    assert capsys.readouterr().out == ""


def test_the_warning_comes_also_when_the_row_reads_nothing_else_the_star_import_sets(tmp_path, monkeypatch, capsys):
    # the job warned only when the row's cells also read a name no cell binds (str, sqrt): with
    # r = f() alone, f() gave 3 in every row where the notebook's gave math's pi, without a word
    import math

    from helpers_export import write_rows

    setup, cell = 'pi = 3\ndef f():\n    return pi\nq = "A"', "from math import *\nr = f()"
    nb = notebook(setup, "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell, "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    notebook_ns = {}
    for code in (setup, cell):
        exec(code, notebook_ns)
    assert notebook_ns["r"] == math.pi
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert prompts[1] == "3"
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert warnings == ["lmnb batch: warning: f (cell 1) reads pi, which the per-row `from math import *` sets: in the "
                        "notebook it read the module's pi after that import, in this job it reads the value the cells "
                        "run once set, in every row; pass pi to it as an argument"]


@pytest.mark.parametrize("setup, cells, function, name", [
    ("", ["a = f()\nfrom math import *\nr = a + ' ' + f()"], "f", "pow"),
    ("", ["a = g()", "from math import *\nr = a + ' ' + f()"], "f", "pow"),  # (g calls f)
    # (the set-up's star import gave h cmath's sqrt, which the row's replaces)
    ("from cmath import *", ["a = h()", "from math import *\nr = a + ' ' + h()"], "h", "sqrt"),
    # (a name only the import sets: a NameError above it, in the notebook; the job's read math's pi)
    ("", ["try:\n    a = k()\nexcept NameError as e:\n    a = str(e)", "from math import *\nr = a + ' ' + k()"],
     "k", "pi"),
    ("l = lambda: str(pi)", ["try:\n    a = l()\nexcept NameError as e:\n    a = str(e)",
                             "from math import *\nr = a + ' ' + l()"], "l", "pi"),  # (a lambda, known by its name)
])
def test_a_setup_function_a_row_uses_above_a_per_row_star_import_reads_what_the_notebooks_does(
        tmp_path, monkeypatch, capsys, setup, cells, function, name):
    # the script makes the row's star import at module level, so the set-up's f read math's pow from
    # the start of each row, where the notebook's read the builtin (or cmath's) above the import: the
    # job gave "8.0 8.0" for the notebook's "8 8.0" (and warned). Now such a name is the script's global,
    # which each row starts without (Job.restore) and run_row sets at the import, as the notebook has it
    define = ("def f():\n    return str(pow(2, 3))\ndef g():\n    return f()\ndef h():\n    return str(sqrt(4))\n"
              "def k():\n    return str(pi)")
    prompts, r, p, source = _job_and_notebook(tmp_path, monkeypatch, f"{setup}\n{define}", cells, run_setup=[])
    assert r in ("8 8.0", "(2+0j) 2.0", f"name 'pi' is not defined {__import__('math').pi}")
    assert prompts == ["B", r, "C", r]  # (two rows, one at a time: each starts without math's value)
    assert not [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    # (a builtin, pow, str, is not listed: the job finds at run time whether the import sets it; math sets pow,
    # which the export notes, as a module of Python's own, which it may import to see: there was no note)
    if name == "pow":
        assert p.star_globals == () and "job.keep(" not in source and "'str'" not in source.split("def run_row")[1]
        assert "pow" in vars(importlib.import_module("math")) and hasattr(builtins, "pow")
        assert [n for n in p.notes if n.startswith("cell 1:")] == [
            "cell 1: pow, a builtin that a function of this cell (run once) reads and the rows use above a per-row "
            "star import, is set by that import (`from math import *`): the job sets the script's global pow there, "
            "as the notebook does, and each row starts from the builtin, "
            f"{importlib.import_module('lmnb.export.notes_wording')._RACE}"]
    else:
        assert p.star_globals == (name,) and f"job.keep(globals(), {name!r})\n" in source
        assert [n for n in p.notes if n.startswith("cell 1:")] == [
            f"cell 1: {name}, which a function of this cell (run once) reads and the rows use above a per-row star "
            f"import, may be set by that import: the job sets the script's global {name} there, as the notebook "
            f"does, and each row starts from what the cells run once left, "
            f"{importlib.import_module('lmnb.export.notes_wording')._RACE}"]
    import math

    from helpers_export import write_rows

    # used below the import only, f reads math's pow there in the job too: no warning
    nb = notebook(f'{define}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  "a = str(pow(2, 3))\nfrom math import *\nr = a + ' ' + f()", "%%lm --temperature 0\n{r}{gen z}")
    source, _ = export_notebook(nb)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows2.jsonl", [{"q": "B"}]), 0)
    assert prompts[1] == f"8 {math.pow(2, 3)}"
    assert not [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    # nor where the import gives the name the value f read before it (the builtin itself)
    nb = notebook(f'{define}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  "a = f()\nfrom builtins import *\nr = a + ' ' + f()", "%%lm --temperature 0\n{r}{gen z}")
    source, p = export_notebook(nb)
    assert not [n for n in p.notes if "builtin" in n]  # (nor noted: the builtin is not replaced)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows3.jsonl", [{"q": "B"}]), 0)
    assert prompts[1] == "8 8"
    assert not [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]


def test_the_export_runs_no_standard_library_script_a_row_star_imports(tmp_path, monkeypatch):
    # to note the builtins a row's star import replaces (math's pow), the export imports a module of
    # Python's own; venv.__main__ is the script of `python -m venv`, which ran on the export's own
    # argv: it made a virtual environment of tmp_path/env and exited (SystemExit, not an Exception)
    env = tmp_path / "env"
    monkeypatch.setattr(sys, "argv", ["lmnb", "--without-pip", str(env)])
    nb = notebook('def f():\n    return str(pow(2, 3))\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  "a = f()\nfrom venv.__main__ import *\nr = a", "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    _, p = export_notebook(nb)
    assert not env.exists()
    assert not [n for n in p.notes if "builtin" in n]  # (the script sets no builtin: nothing to note)
    # a module that exits when `import *` reads its names is passed over, as one that raises is
    exits = type(sys)("json.exits")
    exits.__getattr__ = lambda name: sys.exit(3)
    monkeypatch.setitem(sys.modules, "json.exits", exits)
    assert importlib.import_module("lmnb.export.star_builtins")._builtins_set_by(["json.exits", "math"], ("pow",)) == {
        "pow": ["math"]}


_STAR_ROW_SETUP = "def show(x):\n    return str(len(x))"
_STAR_ROW_CELLS = ["e = 'mine'\na = show(q) + e\nfrom math import *\n"
                   "r = ' '.join([a, str(floor(pi)), show(q), str(len(q)), str(e)[:4]])\nprint(r)"]


@pytest.mark.parametrize("threads", ["1", "4"])
def test_a_row_cells_star_import_gives_the_notebooks_results(tmp_path, monkeypatch, threads):
    # the row reads builtins (str, len, print) and math's names (floor, pi) only below its import, a
    # set-up function reading builtins above it, and its own e, which the import replaces: each row
    # gives what a pass of the notebook gives, also with rows run at once
    from helpers_export import write_rows

    nb = notebook(f'{_STAR_ROW_SETUP}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *_STAR_ROW_CELLS,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    rows = [{"q": q} for q in ("B", "CC", "DDD", "EEEE")]
    passes = _notebook_passes(_STAR_ROW_SETUP, _STAR_ROW_CELLS, rows)
    assert passes[1] == "2mine 3 2 2 2.71"  # (by hand: show("CC"), floor(pi), len("CC"), math's e)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", rows), 0,
                               ["--num-threads", threads])
    assert sorted(prompts) == sorted([row["q"] for row in rows] + passes)
    assert p.notes == []


def test_a_name_a_setup_function_reads_above_the_import_stays_the_rows_own_where_the_row_reads_it(tmp_path,
                                                                                                  monkeypatch):
    # k() reads pi above the import, so each row sets the script's pi back and sets it at the import; the
    # row's own str(pi) below the import read that global too, which rows running at once set back under it
    from helpers_export import write_rows

    setup = "def k():\n    return str(pi)[:4]"
    cells = ["try:\n    a = k()\nexcept NameError as e:\n    a = str(e)\nfrom math import *\nr = a + ' ' + str(pi)[:4]"]
    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.star_globals == ("pi",) and "pi" in p.star_names  # (run_row's own pi, besides the global)
    rows = [{"q": q} for q in "BC"]
    passes = _notebook_passes(setup, cells, rows)
    assert passes[0] == "name 'pi' is not defined 3.14"
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", rows), 0,
                               ["--num-threads", "1"])
    assert prompts == ["B", passes[0], "C", passes[1]]



@pytest.mark.parametrize("cell", [
    "from math import *\nmatch q:\n    case 'B':\n        pass\n    case e:\n        pass\nr = str(e)[:4]",
    "from math import *\nmatch [q]:\n    case ['B']:\n        pass\n    case [*e]:\n        pass\nr = str(e)[:4]",
    "from math import *\nmatch {'k': q}:\n    case {'k': 'B'}:\n        pass\n    case {**e}:\n        pass\nr = str(e)[:4]",
])
def test_a_name_a_match_pattern_binds_below_a_per_row_star_import_keeps_the_imports_value(tmp_path, monkeypatch,
                                                                                       cell):
    # a capture pattern (`case e:`) binds e below the import only where it matches; the export did not
    # take it for a binding, so run_row's e was not given math's e at the import: the row whose case
    # 'B' matched failed with UnboundLocalError where the notebook read math's e (found by the break-it review)
    from helpers_export import write_rows

    nb = notebook('q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    rows = [{"q": q} for q in ("B", "CC")]
    passes = _notebook_passes("", [cell], rows)
    assert passes[0] == "2.71"  # (by hand: math's e, where case 'B' matched)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", rows), 0,
                               ["--num-threads", "1"])
    assert prompts == ["B", passes[0], "CC", passes[1]]

def test_a_row_cells_star_import_makes_a_short_script():
    # the script listed every name the row reads (str, len, print, floor, pi) in one long star_start and
    # star_values, with an `if X is job.UNBOUND: del X` block for each but the builtins, and kept the
    # builtins the set-up function reads (job.keep(globals(), 'len', 'str')) though math sets neither
    nb = notebook(f'{_STAR_ROW_SETUP}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *_STAR_ROW_CELLS,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    row = source.split("def run_row")[1]
    assert "UNBOUND" not in source and "star_start" not in source and "job.keep(" not in source
    assert ("    q, show, x, e, a = job.star_values('math', locals(), 'q', 'show', 'x', 'e', 'a')  # from math import *: "
            "here its values of run_row's variables\n    job.star_globals('math', globals())  # from math import *: "
            "here for the functions of the cells run once\n    r = ' '.join(") in row
    assert not re.search(r"'(str|len|print|floor|pi)'", row)


@pytest.mark.parametrize("cells", [
    ["y = 1\ndel y", "from math import *"],
    ["y = 1", "del y\nfrom math import *"],
    ["y = 1\nif q != 'never':\n    del y", "from math import *"],
])
def test_a_variable_deleted_above_a_per_row_star_import_stays_unbound(tmp_path, monkeypatch, cells):
    # a name bound (whatever ran) and then deleted above the import was taken for bound there, so
    # the import gave it job.UNBOUND, which the next cells read as a value ("<unbound>") where the
    # notebook raised NameError
    from helpers_export import write_rows

    probe = "try:\n    w = repr(y)\nexcept NameError as e:\n    w = str(e)"
    nb = notebook('q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells, probe,
                  "%%lm --temperature 0\n{w}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    notebook_ns = {"q": "B", "x": "!"}  # (cells 1-2 as the row runs them) then the Python cells in order
    for code in [*cells, probe]:
        exec(code, notebook_ns)
    assert notebook_ns["w"] == "name 'y' is not defined"
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    # (run_row's y is a local: Python says so in its own words, naming y)
    assert prompts[1] == "cannot access local variable 'y' where it is not associated with a value"


def test_a_per_row_star_import_replaces_the_names_of_a_setup_cells_star_import(tmp_path, monkeypatch):
    # from math import * in a setup cell, then from cmath import * in a per-row cell: the notebook's
    # sqrt is cmath's below it, but job.star_import kept math's (the script's globals held sqrt
    # already), so sqrt(-1) failed every row with "math domain error" (found by the break-it review)
    from helpers_export import write_rows

    nb = notebook("from math import *\ne = 2", 'q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  "from cmath import *\nr = str(sqrt(-1))", "%%lm --temperature 0\n{r} {e}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    results, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    import cmath

    assert prompts == ["B", f"{str(cmath.sqrt(-1))} {cmath.e}"]


def test_two_star_imports_in_a_per_row_cell_export_and_the_later_one_wins(tmp_path, monkeypatch):
    # the second import's line listed "*" among the names bound above it: the script did not compile
    # (found while fixing the per-row star imports)
    import cmath

    from helpers_export import write_rows

    nb = notebook('q = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  "from math import *\nfrom cmath import *\nr = str(sqrt(-1))",
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]), 0)
    assert prompts == ["B", str(cmath.sqrt(-1))]  # cmath's sqrt, as in the notebook (math's raises)


@pytest.mark.parametrize("setup, body, where, called", [
    ("x = 1", 's += lmnb.select("v", ["a", "b", "a"])', "line 3, col 23", "lmnb.select"),
    ("from lmnb import gen as g", 'if True:\n    s += g("v", choices=("a", "a"))', "line 4, col 25", "g"),
    ("import lmnb as sgl", 's += sgl.select(choices=["a", "a"], name="v")', "line 3, col 25", "sgl.select"),
])
def test_a_python_cells_literal_choices_listed_twice_are_refused_at_export(setup, body, where, called):
    # a template cell's {select v choices=["a", "a"]} is refused at export; a --python cell's
    # lmnb.select failed only when the job ran, in every row (found by a review)
    with pytest.raises(ExportError) as e:
        export_notebook(notebook(setup, '%%lm --python\ns += "Q"\n' + body))
    assert str(e.value).startswith(f"cell 2 (%%lm): {where}: {called}() choices must differ; 'a' is listed more "
                                   "than once: drop the repeats\n"), str(e.value)


@pytest.mark.parametrize("body", [
    's += lmnb.select("v", ["a", "b"])',  # no repeat
    'c = ["a"]\ns += lmnb.select("v", c + c)',  # computed: found as it runs, as in the kernel
    's += str(np.select([1, 1], ["a", "a"]))',  # not lmnb's select
    's += lmnb.gen("v", 3, choices=None)',
])
def test_a_python_cells_choices_that_are_no_literal_repeats_export(body):
    export_notebook(notebook("import numpy as np", "%%lm --python\n" + body))


def _load_job(source: str, monkeypatch, rows, out, options=()) -> dict:
    """The exported script ``source`` run as a module (not as __main__), its command line set to
    ``--input rows --output out --no-progress`` and ``options``; returns its namespace (``job``, ``run_row``, ...).
    Until the test ends the process's IPython shell, if another test module started one, is
    hidden, as it is from ``python job.py``: Jupyter's ``display`` prints ``str(value)`` without a
    shell and publishes ``repr(value)`` with one, so the jobs' output depended on test order."""
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setattr(InteractiveShell, "_instance", None)
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", str(rows), "--output", str(out), "--no-progress",
                                      *options])
    ns = {"__name__": "exported"}
    exec(compile(source, "job.py", "exec"), ns)
    return ns


def _run_job_rows(source: str, monkeypatch, rows, exit_code: int = 1, options=()) -> tuple[list, list]:
    """(the results by row, the prompts sent, in order) of the exported script ``source`` run on
    the input file ``rows`` (with the job's ``options``) with a backend that answers "!"; the job
    must exit ``exit_code``."""
    from helpers_export import read_results
    from helpers_lang import ScriptedBackend

    out = rows.parent / f"{rows.name}.out.jsonl"
    ns = _load_job(source, monkeypatch, rows, out, options)
    backend = ScriptedBackend(lambda prompt, params: "!")
    assert ns["job"].run(ns["run_row"], backend=backend) == exit_code
    prompts = [c[1][0].text for c in backend.calls if c[0] == "generate"]
    return sorted(read_results(out), key=lambda r: r["row"]), prompts


def test_a_load_after_the_first_lm_cell_is_said_not_to_be_followed_and_not_called_the_default():
    # its comment in the script called it "the job's default --model", which the export's note contradicted
    nb = notebook("%lm load first-model", "%%lm --temperature 0\nQ: {gen a max_tokens=1}", "%lm load other-model",
                  "%%lm --temperature 0\nQ: {gen b max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.backend.model == "first-model"
    assert any(n.startswith("cell 3: %lm load/connect after the first %%lm cell is not followed") for n in p.notes)
    for model in ("first-model", "other-model"):
        assert (f"# %lm load {model}: the job's default --model if before the first %%lm cell (the job loads one "
                "model, once)") in source



def test_a_row_cell_that_only_calls_a_setup_class_function_or_module_does_not_copy_it(tmp_path, monkeypatch):
    # Person.parse(q) (a method call) made Person a row copy, written
    # 'Person = job_.row_copy(globals()["Person"])  # changed below' though nothing changes it; a set-up
    # container the row changes (log.append) and a class whose attribute it sets are still changed
    from helpers_export import write_rows

    setup = ("import json\nfrom collections import OrderedDict\nclass Person:\n    @classmethod\n"
             "    def parse(cls, text):\n        return text.upper()\ndef helper(x):\n    return x\nlog = []\n"
             "seen = OrderedDict()")
    cells = ["r = Person.parse(q) + json.dumps(q) + helper.__call__(q)\nlog.append(q)\nseen.update({q: 1})\n"
             "r += str(len(log)) + str(len(seen))"]
    nb = notebook(f'{setup}\nq = "a"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}", *cells,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.copied == ("log", "seen")  # (the set-up containers that the row changes by a method call)
    assert "row_copy(globals()[\"Person\"])" not in source and "row_copy(globals()[\"json\"])" not in source
    rows = [{"q": q} for q in "bc"]
    expected = [t for row, r in zip(rows, _notebook_passes(setup, cells, rows)) for t in (row["q"], r)]
    assert expected[1::2] == ['B"b"b11', 'C"c"c11']
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", rows), 0,
                               ["--num-threads", "1"])
    assert prompts == expected


def test_a_job_whose_rows_start_from_kept_state_warns_when_rows_run_at_once(tmp_path, monkeypatch, capsys):
    # each row starts from the set-up's values (Job.restore) only one row at a time; with the default
    # 16 threads the rows shared the counter (calls 2, 4, 6 where each notebook pass gives 2) and only
    # the export's note, read once at export if at all, said so
    from helpers_export import write_rows

    setup = ("calls = 0\ndef counted(f):\n    def wrapper(*a):\n        global calls\n        calls += 1\n"
             "        return f(*a)\n    return wrapper\n@counted\ndef ask(x):\n    return x\n"
             "class Tally:\n    n = 0\n    @classmethod\n    def bump(cls):\n        cls.n += 1")
    nb = notebook(f'{setup}\nq = "A"', "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  "ask(q)\nTally.bump()\nfrom math import *\nr = str(calls)",
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, _ = export_notebook(nb)
    rows = write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in ("B", "C", "D")])
    _run_job_rows(source, monkeypatch, rows, 0, ["--num-threads", "4"])
    warned = [line for line in capsys.readouterr().err.splitlines() if "rows run at once" in line]
    # (3 rows: 3 at once, not the 4 threads; it said "4", and "16" for 2 rows at the default)
    assert warned == ["lmnb batch: warning: 3 rows run at once share calls, Tally.n, which each pass of the notebook "
                      "starts from the cells run once: each row starts from those values only with --num-threads 1"]
    # one row left by --limit runs alone: no warning (it warned, counting the rows before the limit)
    limited = tmp_path / "limited"
    limited.mkdir()
    _run_job_rows(source, monkeypatch, write_rows(limited / "rows.jsonl", [{"q": "B"}, {"q": "C"}]), 0,
                  ["--num-threads", "4", "--limit", "1"])
    assert "rows run at once" not in capsys.readouterr().err
    # a rerun counts only the rows left to run: with 2 of 3 done, the one left runs alone (it warned of 3)
    rerun = tmp_path / "rerun"
    rerun.mkdir()
    three = write_rows(rerun / "rows.jsonl", [{"q": q} for q in ("B", "C", "D")])
    _run_job_rows(source, monkeypatch, write_rows(rerun / "two.jsonl", [{"q": "B"}, {"q": "C"}]), 0,
                  ["--num-threads", "1"])
    (rerun / "rows.jsonl.out.jsonl").write_bytes((rerun / "two.jsonl.out.jsonl").read_bytes())
    capsys.readouterr()
    results, _ = _run_job_rows(source, monkeypatch, three, 0, ["--num-threads", "4"])
    assert len(results) == 3 and "rows run at once" not in capsys.readouterr().err
    # one at a time: no warning, and each row read the set-up's counter plus its own call, as the notebook
    out = tmp_path / "one"
    out.mkdir()
    results, prompts = _run_job_rows(source, monkeypatch, write_rows(out / "rows.jsonl", [{"q": "B"}, {"q": "C"}]),
                                     0, ["--num-threads", "1"])
    assert "rows run at once" not in capsys.readouterr().err
    assert [p for p in prompts if p.startswith("1")] == ["1", "1"]


def test_a_row_field_spelt_like_a_set_variable_is_noted_as_a_typo():
    """{persn} beside `person = "..."` fails the notebook's cell with a NameError; the export made
    persn a row field every row had to give, and said only 'row fields: persn'."""
    nb = notebook('person = "Arvel"', "%%lm --temperature 0\nQ: Where does {persn} live?{gen x max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.inputs == ("persn",)
    assert p.notes == ["persn: read by a %%lm cell and set by no cell, so a row field; did you mean 'person', which a "
                       "cell sets? (fix the cell, or name the row fields with --inputs)"]
    _, p = export_notebook(notebook('person = "Arvel"', "%%lm\n{person}{gen x max_tokens=1}"))
    assert p.inputs == ("person",) and p.notes == []  # (a field the notebook sets to an example is no typo)


def test_a_called_name_no_cell_sets_is_refused_as_a_row_field_with_the_cells_hint():
    """{gen("a", max_tokens=3)} (lmnb's Python call, where the cell writes {gen a max_tokens=3}) fails
    the notebook's cell with "name 'gen' is not defined" and a hint; the export said "row fields: q, gen",
    and every row of the job was bad_input ("missing field 'gen'"): a row's value, JSON, cannot be called."""
    from lmnb.template.errors import TemplateRuntimeError

    cell = 'Q: {q}\nA: {gen("a", max_tokens=3)}'
    with pytest.raises(TemplateRuntimeError) as run:  # (the notebook's words: Template.bind, as the kernel runs it)
        parse(cell, first_line=2).bind({"q": "hi"})
    hint = ("a hole holds Python, where gen(...) calls a variable gen; the cell language writes it "
            "{gen a max_tokens=3}: write that, or define gen in a Python cell first")
    assert run.value.hint == hint
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "hi"', f"%%lm\n{cell}"))
    assert str(e.value) == ("cell 2 (%%lm): line 3, col 5: name 'gen' is not defined, and it cannot be a row field: the "
                            "cell calls it, and a row's values are JSON data; did you mean {gen a max_tokens=3}?\n"
                            '    A: {gen("a", max_tokens=3)}\n'
                            "        ^\n"
                            f"  hint: {hint}")
    # a function no cell defines; at its call, not its first use ({f!r}, which a row could give)
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "hi"', "%%lm\n{q} {f!r}\n{f(q)}{gen a}"))
    assert str(e.value).startswith("cell 2 (%%lm): line 3, col 2: name 'f' is not defined, and it cannot be a row "
                                   "field: the cell calls it, and a row's values are JSON data\n")
    assert str(e.value).endswith("hint: define f in a Python cell first, or write {{ }} for literal braces")
    # --inputs naming it: the name may be the cell's, so the fix is to leave it out
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "hi"', f"%%lm\n{cell}"), inputs=["q", "gen"])
    assert str(e.value) == ("--inputs gen: %%lm cell 2 calls gen (line 3, col 5), and a row field is JSON data, which "
                            "cannot be called; leave gen out of --inputs")
    # a --python body: the kernel's hint for it (lmnb_kernel.magics._describe)
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "hi"', '%%lm --python\ns += "Q: " + q\ns += gen("a", max_tokens=3)'))
    assert str(e.value) == ("cell 2 (%%lm), line 3: name 'gen' is not defined, and it cannot be a row field: the cell "
                            "calls it, and a row's values are JSON data; in a --python cell, write lmnb.gen (or run "
                            "`from lmnb import gen` in a cell above)")
    with pytest.raises(ExportError) as e:
        export_notebook(notebook('q = "hi"', "%%lm --python\ns += 'Q: ' + q\nif q:\n    s += f(q)"))
    assert str(e.value).endswith("line 4: name 'f' is not defined, and it cannot be a row field: the cell calls it, and "
                                 "a row's values are JSON data; define f in a Python cell first")


@pytest.mark.parametrize("setup, cell, fields", [
    ('q = "hi"', '{d["k"]} {obj.attr} {q.upper()}', ("d", "obj", "q")),  # (JSON can give d, and obj a dict or text)
    ('q = "hi"\nfs = [str]', "{fork g in fs}{g(q)}{join}", ("q",)),  # (a fork target)
    ('q = "hi"', "{(lambda f: f(q))(str)}", ("q",)),  # (a lambda's parameter)
    ('q = "hi"\nfrom math import *', "{sqrt(len(q))}", ("q",)),  # (the star import may set it)
    ('q = "hi"\nf = str.upper', "{f(q)}", ("q",)),
])
def test_a_name_a_hole_calls_or_reads_into_is_refused_only_where_a_row_field_would_be_called(setup, cell, fields):
    _, p = export_notebook(notebook(setup, f"%%lm\n{cell}{{gen a max_tokens=1}}"))
    assert p.inputs == fields


def test_a_function_an_earlier_cell_defines_is_still_called_by_a_hole(tmp_path, monkeypatch):
    prompts, _, p, _ = _job_and_notebook(tmp_path, monkeypatch, "def f(x):\n    return x.lower() + '!'", ["r = 1"],
                                         last="{f(q)}")
    assert p.inputs == ("q",) and prompts == ["B", "b!", "C", "c!"]


@pytest.mark.parametrize("cell, field, tag", [("a {Join} b", "Join", "{join}"), ("{SYSTEM}x", "SYSTEM", "{system}"),
                                             ("{fork 2}x{Join}{join}", "Join", "{join}")])
def test_a_row_field_that_is_a_tag_in_another_case_is_noted_with_the_tag(cell, field, tag):
    """{Join} fails the notebook's cell with "name 'Join' is not defined; did you mean {join}?"
    (Template.bind); the export made Join a row field every row had to give, without a word."""
    from lmnb.template.errors import TemplateRuntimeError

    with pytest.raises(TemplateRuntimeError, match=f"did you mean {tag}"):  # (the cell's words in the notebook)
        parse(f"{{q}}{cell}").bind({"q": "A"})
    _, p = export_notebook(notebook("q = 'A'", f"%%lm\n{{q}}{cell}{{gen x max_tokens=1}}"))
    assert p.inputs == ("q", field)
    assert p.notes == [f"{field}: {{{field}}} in %%lm cell 2 is read as a Python variable, not the tag, and no cell "
                       f"sets it, so a row field; did you mean {tag}? (write it lowercase, or name the row fields "
                       "with --inputs)"]
    _, p = export_notebook(notebook("q = 'A'", "%%lm\n{q}{Join + 1}{gen x max_tokens=1}"))
    assert p.notes == []  # (no bare hole: Python's, as the notebook reads it)


@pytest.mark.parametrize("setup, field", [("qs = ['a', 'b']", "q"), ("names = ['Ann']", "name"),
                                          ("q = 'x'", "qs"), ("boxes = []", "box"), ("name_2 = 'B'", "name"),
                                          ("q1 = 1", "q"), ("entries = []", "entry"), ("entry = 'e'", "entries")])
def test_a_row_field_named_as_a_form_of_a_set_variable_is_no_typo(setup, field):
    """A row field {q} beside a list `qs = [...]` (or {name} beside `names`) was noted 'did you mean
    'qs'?': a plural, or a suffix after _ or a digit, names another thing on purpose."""
    _, p = export_notebook(notebook(setup, f"%%lm\n{{{field}}}{{gen x max_tokens=1}}"))
    assert p.inputs == (field,) and p.notes == []


@pytest.mark.parametrize("setup, field", [("texts = ['a']\nnext = 1", "text"), ("names = ['Ann']\ngame = 1", "name")])
def test_a_row_field_named_as_a_form_of_a_set_variable_is_no_typo_of_another(setup, field):
    """{text} beside `texts = [...]` and `next = 1` was noted 'did you mean 'next'?': the word form
    `texts` was left out of the close names, and the next closest, another word, was offered."""
    _, p = export_notebook(notebook(setup, f"%%lm\n{{{field}}}{{gen x max_tokens=1}}"))
    assert p.inputs == (field,) and p.notes == []


def test_a_row_field_named_as_the_plural_of_a_gen_is_no_typo():
    """{answers} beside an earlier cell's {gen answer} was noted 'did you mean 'answer'?'."""
    _, p = export_notebook(notebook("%%lm\nQ: {gen answer max_tokens=1}", "%%lm\n{answers}{gen x max_tokens=1}"))
    assert p.inputs == ("answers",) and p.notes == []


def test_a_row_field_a_digit_longer_than_a_numbered_variable_is_noted():
    """{q1} beside `q12 = 1` (or {q12} beside `q1`) is one digit slipped into or out of a number, no
    new numbered name as {q1} beside `q` is: it was taken for a word form and not noted."""
    for setup, field, meant in [("q12 = 1", "q1", "q12"), ("q1 = 1", "q12", "q1")]:
        _, p = export_notebook(notebook(setup, f"%%lm\n{{{field}}}{{gen x max_tokens=1}}"))
        assert p.inputs == (field,) and len(p.notes) == 1 and f"did you mean {meant!r}" in p.notes[0]


@pytest.mark.parametrize("field", ["persn", "perso", "preson", "Person"])
def test_a_row_field_one_slip_from_a_set_variable_is_still_noted(field):
    """A letter left out (in the middle or at the end: `perso` is a prefix of `person`, yet no word
    form of it), two letters swapped, a wrong case: a typo of `person`, noted."""
    _, p = export_notebook(notebook('person = "Arvel"', f"%%lm\n{{{field}}}{{gen x max_tokens=1}}"))
    assert p.inputs == (field,) and len(p.notes) == 1 and "did you mean 'person'" in p.notes[0]


@pytest.mark.parametrize("setup, field", [("import re", "ref"), ("import json", "json_text"),
                                          ("def ask(q):\n    return q", "task")])
def test_a_row_field_spelt_like_a_module_or_function_is_no_typo(setup, field):
    """The typo note took any name a cell binds: a row field {ref} beside `import re` was 'did you
    mean 're'?', though a template reads a value, and a row field is a documented way to name one."""
    _, p = export_notebook(notebook(setup, f"%%lm\n{{{field}}}{{gen x max_tokens=1}}"))
    assert p.inputs == (field,) and p.notes == []


def test_a_help_line_of_lm_is_display_only_in_the_export():
    """`%lm load --help` prints load's options in the kernel and loads nothing; the export read it as
    a load line and refused the notebook ('unrecognized arguments: --help'). `%lm help` and
    `%lm --help` were noted as unknown commands."""
    from lmnb.export.cells import Backend

    nb = notebook("%lm load --help\n%lm connect -h\n%lm help load\n%lm help\n%lm --help",
                  "%%lm\nQ: {gen x max_tokens=1}")
    source, p = export_notebook(nb)
    assert p.backend == Backend() and p.notes == [
        "no row fields: every input row runs the same programs; name the fields with --inputs (e.g. a parameter "
        "or a variable the %%lm cells read)"]
    assert "# %lm load --help: help, display only, dropped" in source


@pytest.mark.parametrize("line, close", [("HELP", "help"), ("Stats", "stats"), ("stat", "stats"), ("zzz", None)])
def test_a_misspelt_lm_command_is_noted_with_the_kernels_did_you_mean(line, close):
    """`%lm HELP` is refused by the kernel with "did you mean: %lm help?"; the export noted only
    "dropped unknown command", with no word of the command meant."""
    _, p = export_notebook(notebook(f"q = 'A'\n%lm {line}", "%%lm\n{q}{gen x max_tokens=1}"))
    hint = f" (the kernel refuses it: did you mean %lm {close}?)" if close else ""
    assert p.notes == [f"cell 1: dropped unknown command '%lm {line}'{hint}"]


def test_the_exports_lm_commands_are_the_kernels_subcommands():
    """The export (lmnb, which may not import the kernel) names the %lm commands it reads, drops or
    offers as "did you mean" in a list of its own; a subcommand the kernel gains must be added there
    too, or the export would drop it as unknown and offer what the kernel does not."""
    from lmnb.export.cells import DISPLAY_COMMANDS, SESSION_COMMANDS
    from lmnb_kernel.magics import _subcommands, line_parser

    assert sorted(("help", "load", "connect", *DISPLAY_COMMANDS, *SESSION_COMMANDS)) == sorted(_subcommands(line_parser()))




_BRACES = " (the braces inside the hole make a set of {0}; write {0} without them)"


@pytest.mark.parametrize("setup, fork, error", [
    ('items = ["a", "b"]', "{fork x in {items}}", "TypeError: unhashable type: 'list'" + _BRACES.format("items")),
    ('items = ("a", "b")', "{fork x in {items}}", "TypeError: {fork ... in {items}}: {items} is a set, as braces "
     "inside a hole make one; write the items without them ({fork ... in items}, not {fork ... in {items}})"),
    ("n = [2]", "{fork {n}}", "TypeError: unhashable type: 'list'" + _BRACES.format("n")),
    ("n = 2", "{fork {n}}", "ValueError: fork count must be an integer >= 1, got {2}: a set, as braces inside a "
     "hole make one; write the count without them ({fork n}, not {fork {n}})"),
    ("k = 2", "{fork {k}}", "ValueError: fork count must be an integer >= 1, got {2}: a set, as braces inside a "
     "hole make one; write the count without them ({fork k}, not {fork {k}})"),
    # (a set the variable holds: the script passed no source, and the fix said {fork n}, not the user's s)
    ("s = {2}", "{fork s}", "ValueError: fork count must be an integer >= 1, got {2}: a set; {fork s} takes the "
     "count itself: make s an integer (2, not {2})"),
])
def test_a_fork_over_braces_inside_the_hole_fails_the_job_with_the_kernels_hint(tmp_path, monkeypatch, setup,
                                                                                  fork, error):
    """{fork x in {items}} (a hole in a hole) got the kernel's hint that the braces made a set of the
    list (test_template); the exported job's row failed with a bare "unhashable type: 'list'"."""
    from helpers_export import write_rows

    source, _ = export_notebook(notebook(f"{setup}\nq = 'A'", f"%%lm\n{{q}}{fork}{{gen y max_tokens=1}}{{join}}"))
    results, _ = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]))
    assert results[0]["status"] == "error"
    assert re.fullmatch(re.escape(error) + r" \(job\.py line \d+\)", results[0]["error"])


def _lmnb_modules(source: str) -> tuple[set, set]:
    """(the lmnb modules ``source`` imports, those it reads an attribute of): ``lmnb.x.f`` reads
    lmnb.x where lmnb.x is a module, not an attribute of lmnb's own (``lmnb.gen``)."""
    tree = ast.parse(source)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    used = {"lmnb"} | {f"lmnb.{n.value.attr}" for n in ast.walk(tree)
                       if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
                       and isinstance(n.value.value, ast.Name) and n.value.value.id == "lmnb"
                       and importlib.util.find_spec(f"lmnb.{n.value.attr}") is not None}
    return {m for m in imported if m.split(".")[0] == "lmnb"}, used


@pytest.mark.parametrize("fork", ["{fork x in items}", "{fork {n}}", "{fork n}", ""])
def test_the_script_imports_each_lmnb_module_it_calls(fork):
    """The script called lmnb.template.fork_items (fork_count, braced_set) and imported only lmnb and
    lmnb.batch: it ran only because lmnb.batch happens to import lmnb.template."""
    join = "{join}" if fork else ""
    source, _ = export_notebook(notebook("items = ['a']\nn = 2\nq = 'A'",
                                         f"%%lm\n{{q}}{fork}{{gen y max_tokens=1}}{join}"))
    imported, used = _lmnb_modules(source)
    assert imported == used and ("lmnb.template" in used) == (fork != "")


@pytest.mark.parametrize("items", [["b", "a"], []])
def test_a_fork_over_a_starred_set_fails_the_job_as_the_kernel_says(tmp_path, monkeypatch, items):
    """{fork x in {*items}} unpacks items into a set; the export passed *items to braced_set as its
    arguments (braced_set(*items, "{*items}")), so the job's row failed with "braced_set() takes 2
    positional arguments" or a missing argument, where the kernel refuses the set's order."""
    from helpers_export import write_rows
    from lmnb.template import fork_items

    with pytest.raises(TypeError) as kernel:  # what the kernel's interpreter raises for the set
        fork_items({*items}, "{*items}")
    source, _ = export_notebook(notebook(f"items = {items!r}\nq = 'A'",
                                         "%%lm\n{q}{fork x in {*items}}{gen y max_tokens=1}{join}"))
    results, _ = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": "B"}]))
    assert results[0]["status"] == "error"
    assert re.fullmatch(re.escape(f"TypeError: {kernel.value}") + r" \(job\.py line \d+\)", results[0]["error"])


@pytest.mark.parametrize("setup, cell", [
    ("from enum import Enum\nclass Color(Enum):\n    RED = 1",
     "Color.RED.hits = getattr(Color.RED, 'hits', 0) + 1\nr = str(Color.RED.hits)"),
    ("from enum import Enum\nclass Color(Enum):\n    RED = 1\n    def hit(self):\n"
     "        self.hits = getattr(self, 'hits', 0) + 1\n        return self.hits", "r = str(Color.RED.hit())"),
])
def test_an_enum_members_attribute_the_rows_set_carries_over_as_its_note_says(tmp_path, monkeypatch, setup, cell):
    """The job does not set an Enum member's attribute back at each row's start (a member is made
    once, with its class, and no copy of it can stand in for it: Color.RED is Color(1)); the note
    says so in those words, where it said only that the state carries over."""
    from helpers_export import write_rows

    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    ns: dict = {}  # (each pass of the notebook: the set-up, then the row's cell)
    exec(setup, ns)
    exec(cell, ns)
    assert ns["r"] == "1"
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]), 0,
                               ["--num-threads", "1"])
    assert prompts[1::2] == ["1", "2", "3"]  # (what the note says: row 2 sees row 1's)
    assert len(p.notes) == 1 and re.search("the job does not set (it|them) back at each row's start, so .*carries "
                                           r"over from row to row .*, and rows running at once \(--num-threads "
                                           r"above 1\) share (it|them); keep that state in a variable the row makes",
                                           p.notes[0]), p.notes


@pytest.mark.parametrize("setup, cell, note", [
    ("def g():\n    yield from 'xyz'\nitems = [g()]", "r = next(items[0])", "cell 1: items, a list of iterators (g())"),
    ("items = [(c for c in 'xyz')]", "r = next(items[0])", "cell 1: items, a list of iterators (generator expressions)"),
    ("items = {'a': (c for c in 'xyz')}", "r = next(items['a'])",
     "cell 1: items, a dict of iterators (generator expressions)")])
def test_a_setup_generator_held_in_a_list_or_dict_carries_over_in_the_job_as_its_note_says(
        tmp_path, monkeypatch, setup, cell, note):
    """A list or dict of generators made once (`items = [g()]`, or of generator expressions),
    `next(items[0])` per row: the job's rows go on through the one generator (x, y, z), where each
    pass of the notebook starts a new one (x); the export notes it. A generator expression's entry
    failed the export with an IndexError (it lacked the flag that says it is a generator, which a
    list of g() calls has). A generator cannot be deep-copied, so the row's copy shares it."""
    from helpers_export import write_rows

    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb)
    ns: dict = {}  # (a pass of the notebook: the set-up, then the row's cell)
    exec(setup, ns)
    exec(cell, ns)
    assert ns["r"] == "x"
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]), 0,
                               ["--num-threads", "1"])
    assert prompts[1::2] == ["x", "y", "z"]
    assert [n.split(" that ")[0] for n in p.notes] == [note]


_HELPERS = "seen = []\ncalls = 0\n\ndef remember(x):\n    global calls\n    calls += 1\n    seen.append(x)\n    return len(seen)\n\n" \
           "def shout(x):\n    words = []\n    words.append(x)\n    return x.upper()\n"


@pytest.mark.parametrize("helpers, cell, noted", [
    (_HELPERS, "r = str(remember(q))", "calls, seen"),
    (_HELPERS, "r = shout(q)", None),  # (its list is its own, made per call)
    (_HELPERS.replace("seen = []", "__all__ = ['shout']\nseen = []"), "r = str(remember(q))", None),  # (not given)
    (_HELPERS, "def remember(x):\n    return x\nr = remember(q)", None),  # (a cell's own remember)
    # (through a function of the module that it calls, a private one too: it went without a note)
    ("_seen = []\n\ndef _keep(x):\n    _seen.append(x)\n    return len(_seen)\n\ndef remember(x):\n    return _keep(x)\n",
     "r = str(remember(q))", "_seen"),
])
def test_a_function_of_the_users_star_imported_module_that_keeps_state_is_noted(tmp_path, monkeypatch, capsys, caplog,
                                                                               helpers, cell, noted):
    """helpers.py beside the notebook, `from helpers import *` once, `remember(q)` per row: the job
    imports the module once, so its seen and calls go on from row to row (1, 2, 3), where each pass
    of the notebook imports it anew (1); that went without a note."""
    from helpers_export import write_rows

    (tmp_path / "helpers.py").write_text(helpers, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    nb = notebook("from helpers import *\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    _, p = export_notebook(nb, folder=tmp_path)
    assert [n for n in p.notes if "helpers" in n] == ([] if noted is None else [
        f"cell 1: remember, which `from helpers import *` gives (helpers.py, beside the notebook) and the rows call, "
        f"changes the module's own globals {noted}: the job imports the module once, so that carries over from row to row (what "
        "one row changes, the next row sees), where each pass of the notebook imports it anew, and rows running at "
        "once (--num-threads above 1) share it; keep that state in a variable the row makes (after the first %%lm "
        "cell) instead"])
    if noted:  # (lmnb export and nbconvert give the notebook's folder; what the note says, in the job)
        from lmnb.export.exporter import LMScriptExporter
        from lmnb_kernel.cli import main

        nbformat.write(nb, tmp_path / "nb.ipynb")
        capsys.readouterr()
        assert main(["export", str(tmp_path / "nb.ipynb"), "-o", str(tmp_path / "nb.py")]) == 0
        assert "and the rows call, changes the module's own globals" in capsys.readouterr().err
        resources = {"metadata": {"name": "nb", "path": str(tmp_path)}, "unique_key": "nb"}
        with open(tmp_path / "nb.ipynb", "rb") as f, caplog.at_level("WARNING"):
            LMScriptExporter().from_file(f, resources)
        assert "and the rows call, changes the module's own globals" in caplog.text
        monkeypatch.delitem(sys.modules, "helpers", raising=False)
        source, _ = export_notebook(nb, folder=tmp_path)
        _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]),
                                   0, ["--num-threads", "1"])
        assert prompts[1::2] == ["1", "2", "3"]


def test_a_star_imported_module_too_deep_to_parse_is_left_unread(tmp_path):
    """A module beside the notebook that Python's parser cannot read for its depth (a sum of 10**5
    terms) ended lmnb export on a RecursionError traceback from the look for its state; it is left
    unread, as a module that does not parse is, and the notebook exports without a note on it."""
    (tmp_path / "helpers.py").write_text("TABLE = 1" + " + 1" * 10**5 + "\n\ndef remember(x):\n    return x\n",
                                         encoding="utf-8")
    nb = notebook("from helpers import *\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                  "r = str(remember(q))", "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    _, p = export_notebook(nb, folder=tmp_path)
    assert [n for n in p.notes if "helpers" in n] == []


def test_a_function_of_the_users_star_imported_module_that_a_setup_function_calls_is_noted(tmp_path, monkeypatch):
    """The rows call use(q), a set-up function that calls helpers.py's remember: the job's rows
    gave 1, 2, 3, where each pass of the notebook gives 1, without a note (only the names the row
    cells use were looked up in the module)."""
    from helpers_export import write_rows

    (tmp_path / "helpers.py").write_text(_HELPERS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "helpers", raising=False)
    nb = notebook("from helpers import *\ndef use(x):\n    return remember(x)\nq = 'A'",
                  "%%lm --temperature 0\n{q}{gen x max_tokens=1}", "r = str(use(q))",
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb, folder=tmp_path)
    assert [n.split(":")[:2] for n in p.notes] == [["cell 1", " remember, which `from helpers import *` gives "
                                                    "(helpers.py, beside the notebook) and the rows call, changes the "
                                                    "module's own globals calls, seen"]]
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]), 0,
                               ["--num-threads", "1"])
    assert prompts[1::2] == ["1", "2", "3"]  # (what the note says: it carries over from row to row)


@pytest.mark.parametrize("setup, cell, noted", [
    ("import helpers", "r = str(helpers.remember(q))",
     "cell 1: helpers.remember, of `import helpers` (helpers.py, beside the notebook), which the rows call, changes "
     "the module's own globals calls, seen"),
    ("import helpers as h", "r = str(h.remember(q))",
     "cell 1: h.remember, of `import helpers as h` (helpers.py, beside the notebook), which the rows call, changes "
     "the module's own globals calls, seen"),
    # (through a set-up function that the rows call)
    ("import helpers\ndef use(x):\n    return helpers.remember(x)", "r = str(use(q))",
     "cell 1: helpers.remember, of `import helpers` (helpers.py, beside the notebook), which the rows call, changes "
     "the module's own globals calls, seen"),
    ("import helpers", "r = helpers.shout(q)", None),  # (its list is its own, made per call)
    # (a from-import's function, by its name or another: no note before)
    ("from helpers import remember", "r = str(remember(q))",
     "cell 1: remember, which `from helpers import remember` gives (helpers.py, beside the notebook) and the rows "
     "call, changes the module's own globals calls, seen"),
    ("from helpers import shout as yell, remember as rem", "r = str(rem(q))",
     "cell 1: rem, which `from helpers import remember as rem` gives (helpers.py, beside the notebook) and the rows "
     "call, changes the module's own globals calls, seen"),
    ("from helpers import remember\ndef use(x):\n    return remember(x)", "r = str(use(q))",
     "cell 1: remember, which `from helpers import remember` gives (helpers.py, beside the notebook) and the rows "
     "call, changes the module's own globals calls, seen"),
    ("from helpers import shout", "r = shout(q)", None),
    ("from helpers import remember\ndef remember(x):\n    return x", "r = remember(q)", None),  # (the cell's own)
])
def test_a_function_of_the_users_imported_module_that_keeps_state_is_noted(tmp_path, monkeypatch, setup, cell, noted):
    """`import helpers` once, `helpers.remember(q)` per row: the job imports the module once, so its
    seen and calls go on from row to row (1, 2, 3), where each pass of the notebook imports it anew
    (1); only a star import's functions were followed, and this went without a note."""
    from helpers_export import write_rows

    (tmp_path / "helpers.py").write_text(_HELPERS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb, folder=tmp_path)
    assert [n for n in p.notes if "helpers" in n] == ([] if noted is None else [
        f"{noted}: the job imports the module once, so that carries over from row to row (what one row changes, the "
        "next row sees), where each pass of the notebook imports it anew, and rows running at once (--num-threads "
        "above 1) share it; keep that state in a variable the row makes (after the first %%lm cell) instead"])
    if noted:
        passes = []
        for q in "BCD":  # (each pass of the notebook: a new kernel imports the module anew)
            monkeypatch.delitem(sys.modules, "helpers", raising=False)
            ns: dict = {}
            exec(f"{setup}\nq = {q!r}", ns)
            exec(cell, ns)
            passes.append(ns["r"])
        assert passes == ["1", "1", "1"]
        monkeypatch.delitem(sys.modules, "helpers", raising=False)
        _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]),
                                   0, ["--num-threads", "1"])
        assert prompts[1::2] == ["1", "2", "3"]  # (what the note says: it carries over from row to row)


_CACHE = ("class Cache:\n    store = []\n    count = 0\n\n    def __init__(self):\n        self.items = []\n\n"
          "    @classmethod\n    def add(cls, x):\n        cls.store.append(x)\n        return len(cls.store)\n\n"
          "    @staticmethod\n    def bump():\n        Cache.count += 1\n        return Cache.count\n\n"
          "    def put(self, x):\n        self.items.append(x)\n        return len(self.items)\n")


@pytest.mark.parametrize("setup, cell, noted", [
    ("from helpers import Cache", "r = str(Cache.add(q))",
     "Cache.add, of `from helpers import Cache` (helpers.py, beside the notebook), which the rows call, changes the "
     "module's own class attribute Cache.store"),
    ("from helpers import Cache as C", "r = str(C.bump())",
     "C.bump, of `from helpers import Cache as C` (helpers.py, beside the notebook), which the rows call, changes the "
     "module's own class attribute Cache.count"),
    ("import helpers", "r = str(helpers.Cache.add(q))",
     "helpers.Cache.add, of `import helpers` (helpers.py, beside the notebook), which the rows call, changes the "
     "module's own class attribute Cache.store"),
    ("from helpers import *", "r = str(Cache.add(q))",
     "Cache.add, of `from helpers import *` (helpers.py, beside the notebook), which the rows call, changes the "
     "module's own class attribute Cache.store"),
    ("from helpers import Cache", "r = str(Cache().put(q))", None),  # (an instance's own list, made per row)
    ("from helpers import Cache\nclass Cache:\n    @classmethod\n    def add(cls, x):\n        return 1",
     "r = str(Cache.add(q))", None),  # (the cell's own Cache)
])
def test_a_class_of_the_users_module_whose_methods_change_its_attributes_is_noted(tmp_path, monkeypatch, setup, cell,
                                                                                  noted):
    """`from helpers import Cache` once, `Cache.add(q)` per row, where add appends to the class's own
    list: the job imports the module once, so the list goes on from row to row (1, 2, 3), where each
    pass of the notebook imports it anew (1); only the module's functions were followed, and this
    went without a note."""
    from helpers_export import write_rows

    (tmp_path / "helpers.py").write_text(_CACHE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb, folder=tmp_path)
    assert [n for n in p.notes if "helpers" in n] == ([] if noted is None else [
        f"cell 1: {noted}: the job imports the module once, so that carries over from row to row (what one row "
        "changes, the next row sees), where each pass of the notebook imports it anew, and rows running at once "
        "(--num-threads above 1) share it; keep that state in a variable the row makes (after the first %%lm cell) "
        "instead"])
    monkeypatch.delitem(sys.modules, "helpers", raising=False)
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]), 0,
                               ["--num-threads", "1"])
    assert prompts[1::2] == (["1", "1", "1"] if noted is None else ["1", "2", "3"])


@pytest.mark.parametrize("setup, shown", [("from pkg.helpers import remember", "remember"),
                                          ("from pkg.helpers import *", "*")])
def test_a_function_of_the_users_package_module_that_keeps_state_is_noted(tmp_path, monkeypatch, setup, shown):
    """pkg/helpers.py beside the notebook: its from-imported remember went without a note, and the
    star import's note named the file helpers.py; the job's rows go 1, 2, 3 as the note says."""
    from helpers_export import write_rows

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "helpers.py").write_text(_HELPERS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("pkg", "pkg.helpers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", "r = str(remember(q))",
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb, folder=tmp_path)
    assert [n.split(": the job")[0] for n in p.notes if "helpers" in n] == [
        f"cell 1: remember, which `from pkg.helpers import {shown}` gives (pkg/helpers.py, beside the notebook) and the "
        "rows call, changes the module's own globals calls, seen"]
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]), 0,
                               ["--num-threads", "1"])
    assert prompts[1::2] == ["1", "2", "3"]

@pytest.mark.parametrize("setup, call, shown", [
    ("import pkg.helpers", "pkg.helpers.remember(q)", "pkg.helpers.remember, of `import pkg.helpers`"),
    ("import pkg.helpers as h", "h.remember(q)", "h.remember, of `import pkg.helpers as h`"),
    ("import pkg.helpers\ndef use(x):\n    return pkg.helpers.remember(x)", "use(q)",
     "pkg.helpers.remember, of `import pkg.helpers`"),
])
def test_a_function_of_the_users_package_module_imported_by_its_dotted_name_that_keeps_state_is_noted(
        tmp_path, monkeypatch, setup, call, shown):
    """import pkg.helpers and pkg.helpers.remember(q) per row (or as h, h.remember(q); or through a
    set-up function) got no note, though the job's rows go 1, 2, 3 where each notebook pass gives 1:
    only an import of a plain module's name was followed."""
    from helpers_export import write_rows

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "helpers.py").write_text(_HELPERS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("pkg", "pkg.helpers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", f"r = str({call})",
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb, folder=tmp_path)
    assert [n.split(": the job")[0] for n in p.notes if "helpers" in n] == [
        f"cell 1: {shown} (pkg/helpers.py, beside the notebook), which the rows call, changes the module's own globals "
        "calls, seen"]
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]), 0,
                               ["--num-threads", "1"])
    assert prompts[1::2] == ["1", "2", "3"]


def _module_job(tmp_path, monkeypatch, files: dict, setup: str, cell: str) -> tuple[list, list, list]:
    """(the export's notes on modules beside the notebook and objects made once, r as each pass of the notebook gives it, r
    as the job's rows give it) for ``files`` (path → source) beside a notebook of ``setup``, a %%lm
    cell of q, the Python ``cell`` that sets r and a %%lm cell of r, run over the rows q = B, C, D;
    each pass of the notebook, as a new kernel, and the job import the modules anew."""
    from helpers_export import write_rows

    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = {p.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for p in files}

    def fresh():
        for name in modules:
            monkeypatch.delitem(sys.modules, name, raising=False)

    passes = []
    for q in "BCD":
        fresh()
        ns: dict = {}
        exec(f"{setup}\nq = {q!r}", ns)
        exec(cell, ns)
        passes.append(ns["r"])
    nb = notebook(f"{setup}\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}", cell,
                  "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    source, p = export_notebook(nb, folder=tmp_path)
    fresh()
    _, prompts = _run_job_rows(source, monkeypatch, write_rows(tmp_path / "rows.jsonl", [{"q": q} for q in "BCD"]), 0,
                               ["--num-threads", "1"])
    return [n.split(": the job")[0] for n in p.notes if "beside the notebook" in n or "makes once" in n], passes, \
        prompts[1::2]


@pytest.mark.parametrize("setup, cell, noted, job", [
    ("import importlib\nimport helpers", "importlib.reload(helpers)\nr = str(helpers.remember(q))", None, "111"),
    ("import importlib\nimport helpers", "r = str(helpers.remember(q))\nimportlib.reload(helpers)", None, "111"),
    # (a from-imported function reads the module's globals, which the reload sets back)
    ("from importlib import reload\nimport helpers as h\nfrom helpers import remember",
     "h = reload(h)\nr = str(remember(q))", None, "111"),
    ("import importlib\nimport helpers", "importlib.reload(helpers)\nr = str(helpers.Cache.add(q))", None, "111"),
    # (not a reload in every row, one of another module, or one that leaves what the rows use: noted, as before)
    ("import importlib\nimport helpers", "if q == 'B':\n    importlib.reload(helpers)\nr = str(helpers.remember(q))",
     "helpers.remember, of `import helpers` (helpers.py, beside the notebook), which the rows call, changes the "
     "module's own globals calls, seen", "123"),
    ("import importlib\nimport helpers, other", "importlib.reload(other)\nr = str(helpers.remember(q))",
     "helpers.remember, of `import helpers` (helpers.py, beside the notebook), which the rows call, changes the "
     "module's own globals calls, seen", "123"),
    # (a from-imported class is the one made first: the reload makes a new one, which the row does not use)
    ("import importlib\nimport helpers\nfrom helpers import Cache", "importlib.reload(helpers)\nr = str(Cache.add(q))",
     "Cache.add, of `from helpers import Cache` (helpers.py, beside the notebook), which the rows call, changes the "
     "module's own class attribute Cache.store", "123"),
])
def test_a_users_module_that_each_row_reloads_is_not_noted_as_carrying_over(tmp_path, monkeypatch, setup, cell, noted,
                                                                            job):
    """A row cell's importlib.reload(helpers) runs the module again in its own globals each row: the
    job's rows give 1, 1, 1, as each pass of the notebook does, but the export noted that helpers'
    seen carries over from row to row."""
    files = {"helpers.py": _HELPERS + "\n" + _CACHE, "other.py": ""}
    notes, passes, rows = _module_job(tmp_path, monkeypatch, files, setup, cell)
    assert passes == ["1", "1", "1"] and rows == list(job)
    assert notes == ([] if noted is None else [f"cell 1: {noted}"])



@pytest.mark.parametrize("setup, cell", [
    ("import importlib\nimport counter, helpers",
     "counter.n = q\nimportlib.reload(helpers)\nfrom helpers import *\nr = str(v)"),
    ("import helpers", "helpers.v = q\nfrom helpers import *\nr = str(v)"),
    ("import helpers", "helpers.put(q)\nfrom helpers import *\nr = str(v)"),
])
def test_a_per_row_star_import_of_a_users_module_reads_what_the_module_holds_at_the_import(tmp_path, monkeypatch,
                                                                                             setup, cell):
    """A name the row reads only below its `from helpers import *` was the script's global, which the job
    set once at its start: after a reload (or a change of helpers' globals) above the import, the job's
    rows gave helpers' v at load (0, 0, 0) where each pass of the notebook gives the row's q, and nothing
    was noted."""
    files = {"counter.py": "n = 0\n", "helpers.py": "import counter\nv = counter.n\ndef put(x):\n    global v\n"
             "    v = x\n"}
    _, passes, rows = _module_job(tmp_path, monkeypatch, files, setup, cell)
    assert passes == ["B", "C", "D"] and rows == passes



_RELOAD_ROW = "importlib.reload(helpers)\nr = str(helpers.v)"
_BUMPS = "import counter\ncounter.n += 1\nv = counter.n\n"
_N_BUMPED = "counter.n (line 2, `counter.n += 1`)"


@pytest.mark.parametrize("helpers, setup, cell, noted, passes, job", [
    (_BUMPS, "import importlib\nimport helpers", _RELOAD_ROW, _N_BUMPED, "222", "234"),
    ("import counter as c\nc.n = c.n + 1\nv = c.n\n", "import importlib\nimport helpers", _RELOAD_ROW,
     "counter.n (line 2, `c.n = c.n + 1`)", "222", "234"),
    ("import counter\nfor x in 'ab':\n    counter.seen.append(x)\nv = len(counter.seen)\n",
     "import importlib\nimport helpers", _RELOAD_ROW, "counter.seen (line 3, `counter.seen.append(x)`)", "444", "468"),
    ("from counter import seen\nseen += ['a']\nv = len(seen)\n", "import importlib\nimport helpers", _RELOAD_ROW,
     "counter.seen (line 2, `seen += ['a']`)", "222", "234"),
    # (set from such a value: it goes on too)
    ("import counter\ncounter.n += 1\ncounter.m = counter.n\nv = counter.m\n", "import importlib\nimport helpers",
     _RELOAD_ROW, _N_BUMPED + " and counter.m (line 3, `counter.m = counter.n`)", "222", "234"),
    # (counter reloaded below helpers' reload: the next row's reload of helpers still starts from what it left)
    (_BUMPS, "import importlib\nimport counter, helpers", "importlib.reload(helpers)\nimportlib.reload(counter)\n"
     "r = str(helpers.v)", _N_BUMPED, "222", "211"),
    # (not where it only reads counter, sets it to the same each run, or is not reloaded)
    ("import counter\nv = counter.n + 1\n", "import importlib\nimport helpers", _RELOAD_ROW, None, "111", "111"),
    ("import counter\ncounter.n = 5\ncounter.seen = []\ncounter.seen.append(1)\ncounter.n += 1\n"
     "v = counter.n + len(counter.seen)\n", "import importlib\nimport helpers", _RELOAD_ROW, None, "777", "777"),
    ("import counter\ncounter.seen.clear()\ncounter.m = counter.n + 1\nv = counter.m\n",
     "import importlib\nimport helpers", _RELOAD_ROW, None, "111", "111"),
    (_BUMPS, "import helpers", "r = str(helpers.v)", None, "111", "111"),
    # (nor where the row sets it back, or reloads counter, above the reload)
    (_BUMPS, "import importlib\nimport counter, helpers", "counter.n = 0\n" + _RELOAD_ROW, None, "111", "111"),
    # (but a value the row makes from counter's sets nothing back)
    (_BUMPS, "import importlib\nimport counter, helpers", "counter.n = counter.n * 1\n" + _RELOAD_ROW, _N_BUMPED, "222",
     "234"),
    (_BUMPS, "import importlib\nimport counter, helpers", "importlib.reload(counter)\n" + _RELOAD_ROW, None, "111",
     "111"),
])
def test_a_reloaded_modules_top_level_change_of_another_users_module_is_noted(tmp_path, monkeypatch, helpers, setup,
                                                                               cell, noted, passes, job):
    """counter.py's n = 0, helpers.py's `import counter; counter.n += 1; v = counter.n`, and a row that
    reloads helpers and reads helpers.v: each pass of the notebook imports counter anew (2, 2, 2), the
    job once, so each row's reload bumps it again (2, 3, 4), and nothing was noted."""
    files = {"counter.py": "n = 0\nseen = []\n", "helpers.py": helpers}
    notes, got, rows = _module_job(tmp_path, monkeypatch, files, setup, cell)
    assert got == list(passes) and rows == list(job)
    assert notes == ([] if noted is None else [
        "cell 3: `importlib.reload(helpers)` runs the top level of helpers (helpers.py, beside the notebook) again each row, which "
        f"changes {noted} of counter.py"]), notes


_REMEMBER = "def remember(x, acc=[]):\n    acc.append(x)\n    return len(acc)\n"


@pytest.mark.parametrize("setup, cell, noted, job", [
    ("from helpers import remember", "r = str(remember(q))",
     "remember, which `from helpers import remember` gives (helpers.py, beside the notebook) and", "123"),
    ("import helpers", "r = str(helpers.remember(q))",
     "helpers.remember, of `import helpers` (helpers.py, beside the notebook), which", "123"),
    ("from helpers import *", "r = str(remember(q))",
     "remember, which `from helpers import *` gives (helpers.py, beside the notebook) and", "123"),
    # (a reload runs the def again, but a from-import's function is still the first, with the first default)
    ("import importlib\nimport helpers\nfrom helpers import remember as rem", "importlib.reload(helpers)\nr = str(rem(q))",
     "rem, which `from helpers import remember as rem` gives (helpers.py, beside the notebook) and", "123"),
    # (not where each call passes its own, nor where each row reloads the module and uses the new function)
    ("import helpers", "r = str(helpers.remember(q, []))", None, "111"),
    ("from helpers import remember as rem", "r = str(rem(q, acc=[]))", None, "111"),
    ("import importlib\nimport helpers", "importlib.reload(helpers)\nr = str(helpers.remember(q))", None, "111"),
    ("import importlib\nimport helpers\nfrom helpers import remember",
     "importlib.reload(helpers)\nfrom helpers import remember\nr = str(remember(q))", None, "111"),
])
def test_a_default_a_users_module_function_changes_carries_over_as_noted(tmp_path, monkeypatch, setup, cell, noted, job):
    """def remember(x, acc=[]) in helpers.py beside the notebook, remember(q) per row: the job imports
    the module once, so the def's list goes on from row to row (1, 2, 3), where each pass of the
    notebook imports it anew (1); only a set-up cell's own function was followed for its defaults."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _REMEMBER}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == list(job)
    assert notes == ([] if noted is None else [
        f"cell 1: {noted} the rows call, changes in place its default acc, which the def makes once (a call that leaves "
        "it out gets that one)"]), notes


_SEEN_LIST = "seen = []\n"
_USES_STORE = "from store import seen\n\ndef remember(x):\n    seen.append(x)\n    return len(seen)\n"


@pytest.mark.parametrize("helpers, setup, cell, noted, job", [
    (_USES_STORE, "from helpers import remember", "r = str(remember(q))",
     "remember, which `from helpers import remember` gives (helpers.py, beside the notebook) and", "123"),
    (_USES_STORE, "import helpers", "r = str(helpers.remember(q))",
     "helpers.remember, of `import helpers` (helpers.py, beside the notebook), which", "123"),
    # (a reload of helpers imports store's list again as it is: it went without a note, as helpers' own globals do)
    (_USES_STORE, "import importlib\nimport helpers", "importlib.reload(helpers)\nr = str(helpers.remember(q))",
     "helpers.remember, of `import helpers` (helpers.py, beside the notebook), which", "123"),
    # (not where the function binds its own list by that name, or only reads store's)
    (_USES_STORE.replace("seen.append(x)", "seen = [x]"), "import helpers", "r = str(helpers.remember(q))", None, "111"),
    (_USES_STORE.replace("    seen.append(x)\n", "").replace("len(seen)", "len(seen) + 1"), "import helpers",
     "r = str(helpers.remember(q))", None, "111"),
    # (store's list reached as its attribute, `import store`: no note before; not where the function binds its own
    # store, or only reads the list)
    (_USES_STORE.replace("from store import seen", "import store").replace("seen", "store.seen"), "import helpers",
     "r = str(helpers.remember(q))", "helpers.remember, of `import helpers` (helpers.py, beside the notebook), which",
     "123"),
    (_USES_STORE.replace("from store import seen", "import store as s").replace("seen", "s.seen"),
     "from helpers import remember", "r = str(remember(q))",
     "remember, which `from helpers import remember` gives (helpers.py, beside the notebook) and", "123"),
    (_USES_STORE.replace("from store import seen", "import store").replace("seen", "store.seen").replace(
        "(x):\n", "(x):\n    store = type('S', (), {'seen': []})\n"), "import helpers", "r = str(helpers.remember(q))",
     None, "111"),
    (_USES_STORE.replace("from store import seen", "import store").replace("    seen.append(x)\n", "").replace(
        "len(seen)", "len(store.seen) + 1"), "import helpers", "r = str(helpers.remember(q))", None, "111"),
])
def test_a_list_a_users_module_imports_from_another_that_its_function_changes_is_noted(tmp_path, monkeypatch, helpers,
                                                                                    setup, cell, noted, job):
    """seen = [] in store.py, `from store import seen` in helpers.py, whose remember() appends to it, and
    remember(q) per row: the job imports both modules once, so the rows go 1, 2, 3, where each pass of
    the notebook gives 1; only a list the module itself makes was followed."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"store.py": _SEEN_LIST, "helpers.py": helpers}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == list(job)
    assert notes == ([] if noted is None else [
        f"cell 1: {noted} the rows call, changes the module's own globals seen (store.py)"]), notes


_BUMPS = ("class C:\n    def __init__(self):\n        self.n = 0\n\n    def bump(self):\n        self.n += 1\n        return self.n\n\n"
          "    def peek(self):\n        return self.n + 1\n\n_c = C()\n")


@pytest.mark.parametrize("setup, cell, noted, job", [
    ("from helpers import _c", "r = str(_c.bump())",
     "_c, which `from helpers import _c` gives (helpers.py, beside the notebook), an instance of C that the module makes "
     "once at its top level, is changed by the rows (`_c.bump()` in cell 3)", "123"),
    ("import helpers", "r = str(helpers._c.bump())",
     "helpers._c, of `import helpers` (helpers.py, beside the notebook), an instance of C that the module makes once at "
     "its top level, is changed by the rows (`helpers._c.bump()` in cell 3)", "123"),
    ("from helpers import _c as k", "k.n += 1\nr = str(k.n)",
     "k, which `from helpers import _c as k` gives (helpers.py, beside the notebook), an instance of C that the module "
     "makes once at its top level, is changed by the rows (`k.n` in cell 3)", "123"),
    ("from helpers import _c\ndef use():\n    return _c.bump()", "r = str(use())",
     "_c, which `from helpers import _c` gives (helpers.py, beside the notebook), an instance of C that the module makes "
     "once at its top level, is changed by the rows (`_c.bump()` in use(), a function of cell 1)", "123"),
    # (a reload makes helpers._c anew, but a from-import's _c is still the first)
    ("import importlib\nimport helpers\nfrom helpers import _c", "importlib.reload(helpers)\nr = str(_c.bump())",
     "_c, which `from helpers import _c` gives (helpers.py, beside the notebook), an instance of C that the module makes "
     "once at its top level, is changed by the rows (`_c.bump()` in cell 3)", "123"),
    # (not where the rows only read it, by a method or an attribute, nor use the new one each reload makes)
    ("from helpers import _c", "r = str(_c.peek())", None, "111"),
    ("import helpers", "r = str(helpers._c.n + 1)", None, "111"),
    ("import importlib\nimport helpers", "importlib.reload(helpers)\nr = str(helpers._c.bump())", None, "111"),
])
def test_an_instance_a_users_module_makes_that_the_rows_change_is_noted(tmp_path, monkeypatch, setup, cell, noted, job):
    """_c = C() in helpers.py beside the notebook, `from helpers import _c` once and _c.bump() per row:
    the job imports the module once, so the rows go 1, 2, 3, where each pass of the notebook gives 1;
    only the module's functions that change _c were followed, not the rows' own use of it."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _BUMPS}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == list(job)
    assert notes == ([] if noted is None else [f"cell 1: {noted}"]), notes


_HOLDS = _BUMPS.replace("self.n = 0\n", "self.n = 0\n        self.items = []\n        self.seen = {}\n")
_INSTANCE_NOTE = ("(helpers.py, beside the notebook), an instance of C that the module makes once at its top level, is "
                  "changed by the rows")


@pytest.mark.parametrize("setup, cell, noted", [
    # (a name bound to the instance, by a row or by the set-up, or to its method; the method called on the class)
    ("import helpers", "c = helpers._c\nr = str(c.bump())",
     "helpers._c, of `import helpers` {} (`c.bump()` in cell 3, c being `helpers._c`)"),
    ("from helpers import _c\nk = _c", "r = str(k.bump())",
     "_c, which `from helpers import _c` gives {} (`k.bump()` in cell 3, k being `_c`)"),
    ("from helpers import _c\ndef use():\n    return k.bump()\nk = _c", "r = str(use())",
     "_c, which `from helpers import _c` gives {} (`k.bump()` in use(), a function of cell 1, k being `_c`)"),
    ("from helpers import C, _c", "r = str(C.bump(_c))",
     "_c, which `from helpers import _c` gives {} (`C.bump(_c)` in cell 3)"),
    ("import helpers as h", "r = str(h.C.bump(h._c))",
     "h._c, of `import helpers as h` {} (`h.C.bump(h._c)` in cell 3)"),
    ("from helpers import _c", "f = _c.bump\nr = str(f())",
     "_c, which `from helpers import _c` gives {} (`f()` in cell 3, f being `_c.bump`)"),
    ("import helpers\nf = helpers._c.bump", "r = str(f())",
     "helpers._c, of `import helpers` {} (`f()` in cell 3, f being `helpers._c.bump`)"),
    # (an attribute of it changed in place, by a name bound to it too)
    ("from helpers import _c", "_c.items.append(q)\nr = str(len(_c.items))",
     "_c, which `from helpers import _c` gives {} (`_c.items.append(q)` in cell 3)"),
    ("import helpers", "helpers._c.seen[q] = 1\nr = str(len(helpers._c.seen))",
     "helpers._c, of `import helpers` {} (`helpers._c.seen[q]` in cell 3)"),
    ("import helpers", "items = helpers._c.items\nitems.append(q)\nr = str(len(items))",
     "helpers._c, of `import helpers` {} (`items.append(q)` in cell 3, items being `helpers._c.items`)"),
    # (passed to a function of the set-up's or a row cell's that changes it)
    ("from helpers import _c\ndef use(x):\n    return x.bump()", "r = str(use(_c))",
     "_c, which `from helpers import _c` gives {} (`x.bump()` in use(), a function of cell 1, x being `_c`, passed by "
     "`use(_c)` in cell 3)"),
    ("import helpers", "def use(n, x):\n    x.items.append(n)\n    return len(x.items)\nc = helpers._c\nr = str(use(q, x=c))",
     "helpers._c, of `import helpers` {} (`x.items.append(n)` in cell 3, in its use(), x being `helpers._c`, passed by "
     "`use(q, x=c)` in cell 3)"),
    # (not where the rows only read it by such a name, nor change a copy or an instance of their own, nor bind the
    # name again)
    ("import helpers", "c = helpers._c\nr = str(c.peek())", None),
    ("from helpers import _c\ndef use(x):\n    return x.peek()", "r = str(use(_c))", None),
    ("from helpers import _c, C\ndef use(x):\n    x = C()\n    return x.bump()", "r = str(use(_c))", None),
    ("from helpers import _c\ndef use(x):\n    return x.bump()", "use = lambda x: x.peek()\nr = str(use(_c))", None),
    ("from helpers import _c", "f = _c.peek\nr = str(f())", None),
    ("from helpers import C, _c", "r = str(C.peek(_c))", None),
    ("from helpers import C, _c", "r = str(C.bump(C()))", None),
    ("import helpers\nk = helpers._c", "k = helpers.C()\nr = str(k.bump())", None),
    ("import helpers\nk = helpers._c\ndef use():\n    k = helpers.C()\n    return k.bump()", "r = str(use())", None),
    # (a set-up name bound to a list it holds is the row's copy in the job, Job.row_copy's)
    ("from helpers import _c\nitems = _c.items", "items.append(q)\nr = str(len(items))", None),
    ("import helpers", "c = helpers._c\nc = helpers.C()\nr = str(c.bump())", None),
    ("from helpers import _c", "r = str(_c.items.count(q) + 1)", None),
    ("from helpers import _c", "items = list(_c.items)\nitems.append(q)\nr = str(len(items))", None),
    ("from helpers import _c", "items = _c.items[:]\nitems.append(q)\nr = str(len(items))", None),
])
def test_a_users_module_instance_changed_by_another_name_or_in_an_attribute_is_noted(tmp_path, monkeypatch, setup, cell,
                                                                                     noted):
    """_c = C() in helpers.py, changed by the rows through a name bound to it (`c = helpers._c;
    c.bump()`, a set-up `k = _c`, `f = _c.bump; f()`), by its class's method (`C.bump(_c)`) or in an
    attribute (`_c.items.append(q)`): the job imports the module once, so the rows go 1, 2, 3, where
    each pass of the notebook gives 1; only `_c.bump()` and `_c.n = ...` themselves were followed."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _HOLDS}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert notes == ([] if noted is None else [f"cell 1: {noted.format(_INSTANCE_NOTE)}"]), notes


@pytest.mark.parametrize("helpers, setup, cell, noted", [
    (_HOLDS.replace("_c = C()", "c = C()"), "from helpers import *", "r = str(c.bump())",
     "c, which `from helpers import *` gives {} (`c.bump()` in cell 3)"),
    (_HOLDS.replace("_c = C()", "c = C()"), "from helpers import *", "r = str(C.bump(c))",
     "c, which `from helpers import *` gives {} (`C.bump(c)` in cell 3)"),
    (_HOLDS.replace("_c = C()", "__all__ = ['C', '_box']\n_box = C()"), "from helpers import *",
     "_box.items.append(q)\nr = str(len(_box.items))", "_box, which `from helpers import *` gives {} "
     "(`_box.items.append(q)` in cell 3)"),
    # (a reload leaves it the first, as a from-import's)
    (_HOLDS.replace("_c = C()", "c = C()"), "import importlib\nimport helpers\nfrom helpers import *",
     "importlib.reload(helpers)\nr = str(c.bump())", "c, which `from helpers import *` gives {} (`c.bump()` in cell 3)"),
    # (not where the rows only read it, or use their own)
    (_HOLDS.replace("_c = C()", "c = C()"), "from helpers import *", "r = str(c.peek())", None),
    (_HOLDS.replace("_c = C()", "c = C()"), "from helpers import *", "c = C()\nr = str(c.bump())", None),
])
def test_an_instance_a_star_import_of_a_users_module_gives_that_the_rows_change_is_noted(tmp_path, monkeypatch, helpers,
                                                                                       setup, cell, noted):
    """c = C() in helpers.py, `from helpers import *` once and c.bump() per row: the job imports the
    module once, so the rows go 1, 2, 3, where each pass of the notebook gives 1, without a note
    (only a from-import's or an import's instance was followed)."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": helpers}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert notes == ([] if noted is None else [f"cell 1: {noted.format(_INSTANCE_NOTE)}"]), notes


@pytest.mark.parametrize("setup, cell, noted", [
    ("import helpers", "helpers.seen.append(q)\nr = str(len(helpers.seen))",
     "helpers.seen, of `import helpers` (helpers.py, beside the notebook), a list that the module makes once at its top "
     "level, is changed by the rows (`helpers.seen.append(q)` in cell 3)"),
    ("import helpers as h", "s = h.seen\ns[:0] = [q]\nr = str(len(s))",
     "h.seen, of `import helpers as h` (helpers.py, beside the notebook), a list that the module makes once at its top "
     "level, is changed by the rows (`s[:0]` in cell 3, s being `h.seen`)"),
    ("import helpers\ndef add(x):\n    helpers.seen.append(x)\n    return len(helpers.seen)", "r = str(add(q))",
     "helpers.seen, of `import helpers` (helpers.py, beside the notebook), a list that the module makes once at its top "
     "level, is changed by the rows (`helpers.seen.append(x)` in add(), a function of cell 1)"),
    ("from helpers import *", "seen.append(q)\nr = str(len(seen))",
     "seen, which `from helpers import *` gives (helpers.py, beside the notebook), a list that the module makes once at "
     "its top level, is changed by the rows (`seen.append(q)` in cell 3)"),
    ("import helpers\ndef add(s, x):\n    s.append(x)\n    return len(s)", "r = str(add(helpers.seen, q))",
     "helpers.seen, of `import helpers` (helpers.py, beside the notebook), a list that the module makes once at its top "
     "level, is changed by the rows (`s.append(x)` in add(), a function of cell 1, s being `helpers.seen`, passed by "
     "`add(helpers.seen, q)` in cell 3)"),
    ("import helpers\ndef add(s, x):\n    return s.count(x) + 1", "r = str(add(helpers.seen, q))", None),
    # (not where the rows only read it, change a copy, reload the module, or change the set-up's from-import, which the
    # job copies per row)
    ("import helpers", "r = str(helpers.seen.count(q) + 1)", None),
    ("import helpers", "s = list(helpers.seen)\ns.append(q)\nr = str(len(s))", None),
    ("import importlib\nimport helpers", "importlib.reload(helpers)\nhelpers.seen.append(q)\nr = str(len(helpers.seen))",
     None),
    ("from helpers import seen", "seen.append(q)\nr = str(len(seen))", None),
])
def test_a_list_a_users_module_makes_that_the_rows_change_as_its_attribute_is_noted(tmp_path, monkeypatch, setup, cell,
                                                                                   noted):
    """seen = [] in helpers.py, `import helpers` once and helpers.seen.append(q) per row (or seen.append(q)
    of a star import): the job imports the module once, so the rows go 1, 2, 3, where each pass of
    the notebook gives 1, without a note (only the module's own functions that change it were followed)."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _SEEN_LIST}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert notes == ([] if noted is None else [f"cell 1: {noted}"]), notes


_ITERATES = "_it = iter(range(1, 9))\n"


@pytest.mark.parametrize("setup, cell, noted", [
    ("import helpers", "r = str(next(helpers._it))", "helpers._it, of `import helpers`"),
    ("from helpers import _it", "for n in _it:\n    break\nr = str(n)", "_it, which `from helpers import _it` gives"),
    ("from helpers import _it as it\nk = it", "r = str(next(k))", "it, which `from helpers import _it as it` gives"),
    # (not where each row reloads the module and runs through the new one, nor through one of its own)
    ("import importlib\nimport helpers", "importlib.reload(helpers)\nr = str(next(helpers._it))", None),
    ("import helpers", "r = str(next(iter(range(1, 9))))", None),
])
def test_an_iterator_a_users_module_makes_that_the_rows_run_through_is_noted(tmp_path, monkeypatch, setup, cell, noted):
    """_it = iter(range(1, 9)) in helpers.py, next(helpers._it) per row: the job imports the module
    once, so the rows go 1, 2, 3, where each pass of the notebook gives 1, without a note (only the
    module's own functions that run through it were followed)."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _ITERATES}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert [n.split(" (helpers.py")[0] for n in notes] == ([] if noted is None else [f"cell 1: {noted}"]), notes
    assert all("an iterator that the module makes once at its top level, is changed by the rows" in n for n in notes)


_PKG = {"pkg/__init__.py": "", "pkg/helpers.py": _HELPERS + "\n" + _CACHE}


@pytest.mark.parametrize("files, setup, cell, noted", [
    # (a package's module by `from pkg import helpers`, read as pkg/__init__.py's name: no note before)
    ({}, "from pkg import helpers", "r = str(helpers.remember(q))",
     "helpers.remember, of `from pkg import helpers` (pkg/helpers.py, beside the notebook), which the rows call, "
     "changes the module's own globals calls, seen"),
    ({}, "from pkg import helpers as h", "r = str(h.Cache.add(q))",
     "h.Cache.add, of `from pkg import helpers as h` (pkg/helpers.py, beside the notebook), which the rows call, "
     "changes the module's own class attribute Cache.store"),
    # (a name a module of the user's imports from another, and so gives as its own: no note before)
    ({"pkg/api.py": "from .helpers import remember\n"}, "from pkg.api import remember", "r = str(remember(q))",
     "remember, which `from pkg.api import remember` gives (pkg/api.py, beside the notebook) and the rows call, "
     "changes the module's own globals calls (pkg/helpers.py), seen (pkg/helpers.py)"),
    ({"pkg/__init__.py": "from pkg.helpers import remember as rem\n"}, "from pkg import rem", "r = str(rem(q))",
     "rem, which `from pkg import rem` gives (pkg/__init__.py, beside the notebook) and the rows call, changes the "
     "module's own globals calls (pkg/helpers.py), seen (pkg/helpers.py)"),
    # (given on through two modules: the state was shown with both files, "seen (pkg/helpers.py) (pkg/api.py)")
    ({"pkg/__init__.py": "from pkg.api import remember\n", "pkg/api.py": "from .helpers import remember\n"},
     "from pkg import remember", "r = str(remember(q))",
     "remember, which `from pkg import remember` gives (pkg/__init__.py, beside the notebook) and the rows call, changes "
     "the module's own globals calls (pkg/helpers.py), seen (pkg/helpers.py)"),
    ({"pkg/api.py": "from .helpers import Cache\n"}, "from pkg.api import *", "r = str(Cache.add(q))",
     "Cache.add, of `from pkg.api import *` (pkg/api.py, beside the notebook), which the rows call, changes the "
     "module's own class attribute Cache.store (pkg/helpers.py)"),
    # (a function that keeps no state; one the module defines again below the import; the package's own name)
    ({}, "from pkg import helpers", "r = str(len(helpers.shout(q)))", None),
    ({"pkg/api.py": "from .helpers import shout\n"}, "from pkg.api import shout", "r = str(len(shout(q)))", None),
    ({"pkg/api.py": "from .helpers import remember\n\ndef remember(x):\n    return 1\n"}, "from pkg.api import remember",
     "r = str(remember(q))", None),
    ({"pkg/__init__.py": "class helpers:\n    @staticmethod\n    def remember(x):\n        return 1\n"},
     "from pkg import helpers", "r = str(helpers.remember(q))", None),
])
def test_a_function_a_users_package_gives_by_its_module_or_an_import_that_keeps_state_is_noted(
        tmp_path, monkeypatch, files, setup, cell, noted):
    """`from pkg import helpers` then helpers.remember(q), and remember that pkg/api.py gives by `from
    .helpers import remember`: the job's rows go 1, 2, 3, where each notebook pass gives 1, without a
    note (only a module's own functions, imported by its dotted name, were followed)."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {**_PKG, **files}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert notes == ([] if noted is None else [f"cell 1: {noted}"])


_OBJECT = ("class C:\n    def __init__(self):\n        self.n = 0\n        self.items = []\n\n    def bump(self):\n        self.n += 1\n"
           "        return self.n\n\n    def peek(self):\n        return self.n + 1\n\n_c = C()\n\n"
           "def remember(x):\n    return _c.bump()\n\ndef mark(x):\n    _c.n += 1\n    return _c.n\n\n"
           "def look(x):\n    return _c.peek()\n\ndef fresh(x):\n    _c = C()\n    return _c.bump()\n\n"
           "def keep(x):\n    _c.items.append(x)\n    return len(_c.items)\n\n"
           "def alias(x):\n    c = _c\n    return C.bump(c)\n\ndef count(x):\n    return _c.items.count(x) + 1\n\n"
           "_it = iter(range(1, 9))\n\ndef take(x):\n    return next(_it)\n\ndef _gen():\n    n = 0\n    while True:\n"
           "        n += 1\n        yield n\n\n_g = _gen()\n\ndef tick(x):\n    for n in _g:\n        return n\n\n"
           "def fresh_it(x):\n    _it = iter(range(1, 9))\n    return next(_it)\n")


@pytest.mark.parametrize("setup, cell, noted", [
    ("from helpers import remember", "r = str(remember(q))",
     "remember, which `from helpers import remember` gives (helpers.py, beside the notebook) and the rows call, "
     "changes the module's own globals _c"),
    ("import helpers", "r = str(helpers.mark(q))",
     "helpers.mark, of `import helpers` (helpers.py, beside the notebook), which the rows call, changes the module's "
     "own globals _c"),
    # (in what an attribute of it holds, or through a name bound to it and its class's method: no note before)
    ("from helpers import keep", "r = str(keep(q))",
     "keep, which `from helpers import keep` gives (helpers.py, beside the notebook) and the rows call, changes the "
     "module's own globals _c"),
    ("import helpers", "r = str(helpers.alias(q))",
     "helpers.alias, of `import helpers` (helpers.py, beside the notebook), which the rows call, changes the module's "
     "own globals _c"),
    # (an iterator or a generator it makes at its top level, which its function runs through: no note before)
    ("from helpers import take", "r = str(take(q))",
     "take, which `from helpers import take` gives (helpers.py, beside the notebook) and the rows call, changes the "
     "module's own globals _it"),
    ("import helpers", "r = str(helpers.tick(q))",
     "helpers.tick, of `import helpers` (helpers.py, beside the notebook), which the rows call, changes the module's "
     "own globals _g"),
    ("from helpers import fresh_it", "r = str(fresh_it(q))", None),
    # (a method that only reads it, or an instance of the function's own, or an attribute's read method)
    ("from helpers import look", "r = str(look(q))", None),
    ("from helpers import fresh", "r = str(fresh(q))", None),
    ("from helpers import count", "r = str(count(q))", None),
])
def test_an_object_the_users_module_makes_at_top_level_that_its_functions_change_is_noted(tmp_path, monkeypatch, setup,
                                                                                         cell, noted):
    """helpers.py makes `_c = C()` at its top level and remember() bumps it: the job imports the
    module once, so its rows gave 1, 2, 3, where each pass of the notebook gives 1, without a note
    (only a dict, list or set the module makes was followed)."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _OBJECT}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert notes == ([] if noted is None else [f"cell 1: {noted}"])


_PEEK = ("class C:\n    def __init__(self):\n        self.n = 0\n        self.rows = []\n\n    def bump(self):\n"
         "        self.n += 1\n        return self.n\n\n    def peek(self):\n        return self.n\n\n"
         "    def all(self):\n        return self.rows\n\n\n_c = C()\n")


@pytest.mark.parametrize("setup, cell, noted", [
    ("from helpers import _c", "r = str(_c.peek() + 1)", None),
    ("import helpers", "r = str(helpers._c.peek() + 1)", None),
    ("from helpers import C\nc = C()", "r = str(c.peek() + 1)", None),
    # (a method that hands on a list its instance holds, which the row changes, still changes it)
    ("from helpers import _c", "_c.all().append(q)\nr = str(len(_c.rows))",
     "cell 1: _c, which `from helpers import _c` gives (helpers.py, beside the notebook), an instance of C that the "
     "module makes once at its top level, is changed by the rows (`_c.all()` in cell 3)"),
])
def test_a_method_that_returns_an_attribute_holding_only_numbers_reads_its_instance(tmp_path, monkeypatch, setup,
                                                                                   cell, noted):
    """`_c.peek()` of `def peek(self): return self.n`, n only ever 0 or n += 1, was taken to change
    _c (what a method returns of its instance may be changed where it goes), so a row that only read
    it was told _c "is changed by the rows"; each pass and the job's rows give 1, 1, 1."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _PEEK}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert [n.split(": the job")[0].split(": what")[0] for n in notes] == ([] if noted is None else [noted])


_NAMED = ("class C:\n    def __init__(self):\n        self.n = 0\n        self.items = []\n\n\n_c = C()\nseen = []\n"
          "counts = {}\n")


def _made_once(what: str, kind: str, change: str) -> str:
    return (f"cell 1: {what} (helpers.py, beside the notebook), {kind} that the module makes once at its top level, "
            f"is changed by the rows (`{change}` in cell 3)")


@pytest.mark.parametrize("setup, cell, noted", [
    ("import helpers", "setattr(helpers._c, 'n', helpers._c.n + 1)\nr = str(helpers._c.n)",
     _made_once("helpers._c, of `import helpers`", "an instance of C", "setattr(helpers._c, 'n', helpers._c.n + 1)")),
    ("import helpers", "getattr(helpers, 'seen').append(q)\nr = str(len(helpers.seen))",
     _made_once("helpers.seen, of `import helpers`", "a list", "getattr(helpers, 'seen').append(q)")),
    ("import helpers", "vars(helpers)['counts'][q] = 1\nr = str(len(helpers.counts))",
     _made_once("helpers.counts, of `import helpers`", "a dict", "vars(helpers)['counts'][q]")),
    ("from helpers import _c", "getattr(_c, 'items').append(q)\nr = str(len(_c.items))",
     _made_once("_c, which `from helpers import _c` gives", "an instance of C", "getattr(_c, 'items').append(q)")),
    # (what only reads them, or binds the module's name anew, changes nothing the next row sees)
    ("import helpers", "r = str(len(getattr(helpers, 'seen')) + getattr(helpers._c, 'n') + len(vars(helpers)['counts'])"
     " + 1)", None),
    ("import helpers", "setattr(helpers, 'seen', [q])\nr = str(len(helpers.seen))", None),
])
def test_a_change_through_setattr_getattr_or_vars_with_a_constant_name_is_noted(tmp_path, monkeypatch, setup, cell,
                                                                              noted):
    """`setattr(helpers._c, 'n', helpers._c.n + 1)`, `getattr(helpers, 'seen').append(x)` and
    `vars(helpers)['counts'][x] = 1` per row: the job's rows gave 1, 2, 3, where each pass of the
    notebook gives 1, without a note (only `helpers._c.n = ...` and the like were read as changes)."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _NAMED}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert [n.split(": the job")[0] for n in notes] == ([] if noted is None else [noted])


_STORE = ("class Store:\n    def __init__(self):\n        self.items = []\n\n    def add(self, x):\n"
          "        self.items.append(x)\n        return len(self.items)\n\n    def size(self):\n"
          "        return len(self.items)\n\n\nclass Deque(list):\n    def size(self):\n        return len(self)\n")


@pytest.mark.parametrize("setup, cell, noted", [
    ("from helpers import Store\nc = Store()", "r = str(c.add(q))",
     "cell 1: c, an instance of Store that this cell makes once, is used by the rows (`c.add(q)` in cell 3)"),
    ("import helpers as h\nc = h.Store()", "r = str(c.add(q))",
     "cell 1: c, an instance of h.Store that this cell makes once, is used by the rows (`c.add(q)` in cell 3)"),
    # (a class that a star import gives: no note before)
    ("from helpers import *\nc = Store()", "r = str(c.add(q))",
     "cell 1: c, an instance of Store that this cell makes once, is used by the rows (`c.add(q)` in cell 3)"),
    ("from helpers import *\nc = Store()", "r = str(c.size() + 1)", None),
    ("from helpers import *\nc = Deque()", "r = str(c.size() + 1)", None),
    # (a method that only reads it, an instance the row makes, or one of a class with a base, whose methods are not
    # all known here)
    ("from helpers import Store\nc = Store()", "r = str(c.size() + 1)", None),
    ("from helpers import Store", "c = Store()\nr = str(c.add(q))", None),
    ("from helpers import Deque\nc = Deque()", "r = str(c.size() + 1)", None),
])
def test_an_instance_of_a_users_module_class_that_the_rows_change_is_noted(tmp_path, monkeypatch, setup, cell, noted):
    """`from helpers import Store` and `c = Store()` once, `c.add(q)` per row: the job's rows gave 1,
    2, 3, where each pass of the notebook gives 1, without a note (only the set-up cells' own classes
    were followed)."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _STORE}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert [n.split(": what")[0] for n in notes] == ([] if noted is None else [noted])


_SET_UP_C = "class C:\n    def __init__(self):\n        self.n = 0\n        self.items = []\n\n\nc = C()"
_SET_UP_C_USED = "cell 1: c, an instance of C that this cell makes once, is used by the rows ("


@pytest.mark.parametrize("setup, cell, noted", [
    (_SET_UP_C, "c.n = c.n + 1\nr = str(c.n)", "`c.n = c.n + 1` in cell 3)"),
    (_SET_UP_C, "c.n += 1\nr = str(c.n)", "`c.n += 1` in cell 3)"),
    (_SET_UP_C, "c.items.append(q)\nr = str(len(c.items))", "`c.items.append(q)` in cell 3)"),
    (_SET_UP_C, "x = c\nx.n += 1\nr = str(c.n)", "`x.n += 1` in cell 3, x being `c`)"),
    (_SET_UP_C + "\n\n\ndef bump():\n    c.items.append(1)\n    return len(c.items)", "r = str(bump())",
     "`c.items.append(1)` in bump(), a function of cell 1)"),
    # (reads only; and an instance the row makes)
    (_SET_UP_C, "r = str(c.n + 1)", None),
    (_SET_UP_C, "c = C()\nc.n += 1\nr = str(c.n)", None),
])
def test_an_attribute_change_of_a_setup_instance_is_noted(tmp_path, monkeypatch, setup, cell, noted):
    """`c = C()` once, `c.n = c.n + 1` (or `c.n += 1`, `c.items.append(q)`) per row: the job's rows
    gave 1, 2, 3, where each pass of the notebook gives 1, without a note (only a method call of
    it was taken for a change)."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert [n.split(": what")[0] for n in notes] == ([] if noted is None else [_SET_UP_C_USED + noted])


def test_a_setup_instance_a_row_sets_back_before_changing_is_still_noted(tmp_path, monkeypatch):
    """`c.n = 0; c.n += 1` per row gives each row what the notebook's pass gives; the export does
    not follow that the row sets back all it changes, so it notes the change as any other."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {}, _SET_UP_C, "c.n = 0\nc.n += 1\nr = str(c.n)")
    assert passes == rows == ["1", "1", "1"]
    assert [n.split(": what")[0] for n in notes] == [_SET_UP_C_USED + "`c.n = 0` in cell 3)"]


_PASSES_OUT = ("class C:\n    def __init__(self):\n        self.rows = [[]]\n\n    def first(self):\n"
               "        return self.rows[0]\n\n\n_c = C()\n")


@pytest.mark.parametrize("setup, cell, noted", [
    ("from helpers import _c", "_c.first().append(q)\nr = str(len(_c.first()))",
     "cell 1: _c, which `from helpers import _c` gives (helpers.py, beside the notebook), an instance of C that the "
     "module makes once at its top level, is changed by the rows (`_c.first().append(q)` in cell 3, changing what "
     "_c.first() passes out)"),
    ("import helpers", "helpers._c.first().append(q)\nr = str(len(helpers._c.first()))",
     "cell 1: helpers._c, of `import helpers` (helpers.py, beside the notebook), an instance of C that the module "
     "makes once at its top level, is changed by the rows (`helpers._c.first().append(q)` in cell 3, changing what "
     "helpers._c.first() passes out)"),
    ("from helpers import _c", "x = _c.first()\nx.append(q)\nr = str(len(x))",
     "cell 1: _c, which `from helpers import _c` gives (helpers.py, beside the notebook), an instance of C that the "
     "module makes once at its top level, is changed by the rows (`x = _c.first(); x.append(q)` in cell 3, changing "
     "what _c.first() passes out)"),
    # (a read of what it passes out; a copy of it changed)
    ("from helpers import _c", "r = str(len(_c.first()) + 1)", None),
    ("from helpers import _c", "x = list(_c.first())\nx.append(q)\nr = str(len(x))", None),
])
def test_what_a_module_instances_method_passes_out_changed_by_the_rows_is_noted(tmp_path, monkeypatch, setup, cell,
                                                                                noted):
    """`_c.first().append(q)` per row of `from helpers import _c`, `first` returning
    `self.rows[0]`: the job's rows gave 1, 2, 3, where each pass of the notebook gives 1, without a
    note (a set-up instance's was noted; a module's was read as a read)."""
    notes, passes, rows = _module_job(tmp_path, monkeypatch, {"helpers.py": _PASSES_OUT}, setup, cell)
    assert passes == ["1", "1", "1"] and rows == (["1", "1", "1"] if noted is None else ["1", "2", "3"])
    assert [n.split(": the job")[0] for n in notes] == ([] if noted is None else [noted])


def test_a_users_module_that_several_cells_star_import_is_read_once(tmp_path, monkeypatch):
    """Each cell's `from helpers import *` read and parsed helpers.py again; now once an export,
    with a note for each cell as before."""
    from pathlib import Path as PathType

    (tmp_path / "helpers.py").write_text(_HELPERS, encoding="utf-8")
    nb = notebook("from helpers import *\nq = 'A'", "from helpers import *",
                  "%%lm --temperature 0\n{q}{gen x max_tokens=1}", "from helpers import *\nr = str(remember(q))", "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
    reads, read_text = [], PathType.read_text

    def counting_read_text(self, *args, **kwargs):
        reads.append(self.name)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(PathType, "read_text", counting_read_text)
    _, p = export_notebook(nb, folder=tmp_path)
    assert reads.count("helpers.py") == 1
    assert [n.split(":")[0] for n in p.notes if "helpers.py" in n] == ["cell 1", "cell 2", "cell 4"]


@pytest.mark.parametrize("setup, hole, called, construct", [
    ('import lmnb\nq = "hi"', 'lmnb.gen("a", max_tokens=3)', "lmnb.gen(...)", "{gen a max_tokens=3}"),
    ('q = "hi"', 'lmnb.gen("a", max_tokens=3)', "lmnb.gen(...)", "{gen a max_tokens=3}"),  # (the kernel sets lmnb)
    ('from lmnb import gen\nq = "hi"', 'gen("a", max_tokens=3)', "gen(...)", "{gen a max_tokens=3}"),
    ('import lmnb as L\nq = "hi"', '"x" + L.select("v", choices=["y", "n"])', "L.select(...)",
     None),  # (added to text: no construct is the whole hole)
    ('from lmnb import *\nq = "hi"', "image(q)", "image(...)", "{image q}"),
    ('from lmnb import user as u\nq = "hi"', "u(q)", "u(...)", "{user}...{/user}"),
    ('import lmnb\nq = "hi"\ng = lmnb.gen("a") + "!"', "g", "lmnb.gen(...) (cell 1)", None),  # (set by a cell)
])
def test_a_hole_calling_an_lmnb_primitive_is_refused_by_the_export(setup, hole, called, construct):
    """{lmnb.gen("a", max_tokens=3)} was exported quietly, and the job's f-string sent the text
    "Gen('a')" in every row, generating nothing: the export now refuses it as the notebook's cell does."""
    with pytest.raises(ExportError) as e:
        export_notebook(notebook(setup, f"%%lm\nQ: {{q}}\nA: {{{hole}}}"))
    meant = f"; did you mean {construct}?" if construct else ""
    fix = construct or "the construct ({gen NAME ...}, {select NAME choices=[...]}, {image SRC}, ...)"
    assert str(e.value) == (f"cell 2 (%%lm): line 3, col 4: {{{hole}}} is {called}, an lmnb primitive, not text: "
                            f"a hole's value becomes prompt text (its repr), and the primitive would not run{meant}\n"
                            f"    A: {{{hole}}}\n"
                            "       ^\n"
                            f"  hint: write {fix} in place of the hole, or add it in a %%lm --python cell: s += {hole}")


@pytest.mark.parametrize("setup, hole, called, where, container", [
    ('q = "hi"', '[lmnb.gen("a")]', "lmnb.gen(...)", "at [0]", "list"),
    ('from lmnb import gen\nq = "hi"', '(q, gen("a"))', "gen(...)", "at [1]", "tuple"),
    ('q = "hi"', '{"k": [q, "A: " + lmnb.select("v", choices=["y"])]}', "lmnb.select(...)", "at ['k'][1]", "dict"),
    ('q = "hi"', '{lmnb.gen("a")}', "lmnb.gen(...)", "as an item of the set", "set"),
    ('import lmnb\ng = lmnb.gen("a")\nq = "hi"', "[q, g]", "lmnb.gen(...) (cell 1)", "at [1]", "list"),
    ('import lmnb\ng = {"a": lmnb.gen("a")}\nq = "hi"', "g", "lmnb.gen(...) (cell 1)", "at ['a']", "dict"),
    ('import lmnb\ng = [lmnb.gen("a")]\nq = "hi"', "(g,)", "lmnb.gen(...) (cell 1)", "at [0][0]", "tuple"),
])
def test_a_list_tuple_dict_or_set_holding_an_lmnb_primitive_in_a_hole_is_refused_by_the_export(
        setup, hole, called, where, container):
    """{[lmnb.gen("a")]} was exported quietly, and the job's f-string sent the text "[Gen('a')]" in
    every row, generating nothing: the export refuses it as the notebook's cell does."""
    with pytest.raises(ExportError) as e:
        export_notebook(notebook(setup, f"%%lm\nQ: {{q}}\nA: {{ {hole} }}"))
    shown = f"{{ {hole} }}" if hole.startswith("{") else f"{{{hole}}}"  # (as written where a brace begins it, not "{{")
    assert str(e.value) == (f"cell 2 (%%lm): line 3, col 4: {shown} holds {called}, an lmnb primitive, {where}, not "
                            f"text: a hole's value becomes prompt text, a {container}'s text is its items' repr, and "
                            "the primitive would not run\n"
                            f"    A: {{ {hole} }}\n"
                            "       ^\n"
                            "  hint: write the construct ({gen NAME ...}, {select NAME choices=[...]}, {image SRC}, ...) "
                            "in place of the hole, or add the primitive in a %%lm --python cell: s += lmnb.gen(...)")


@pytest.mark.parametrize("setup, hole", [
    ('import lmnb\nq = "hi"', "lmnb.__version__"),  # (no call)
    ('from lmnb import gen\ngen = str.upper\nq = "hi"', "gen(q)"),  # (bound again after the import)
    ('import lmnb\nq = "hi"', "len(str(lmnb.gen))"),  # (the hole's value is a number)
    ('import lmnb\nlmnb = None\nimport json as lmnb\nq = "hi"', 'lmnb.dumps("a")'),
    ('q = "hi"', "{fork lmnb in [str]}{lmnb.upper(q)}{join}"),  # (a fork target)
    ('import lmnb\ng = lmnb.gen("a")\ng = "text"\nq = "hi"', "g"),  # (set again)
    ('import lmnb\nq = "hi"', '[*[q], lmnb.__version__, len([lmnb.gen("a")])]'),  # (a number in the list)
])
def test_a_hole_reading_lmnb_without_a_primitive_value_is_exported(setup, hole):
    cell = hole if hole.startswith("{fork") else f"{{{hole}}}"
    _, p = export_notebook(notebook(setup, f"%%lm\nQ: {{q}}\nA: {cell}{{gen a max_tokens=1}}"))
    assert "q" in p.inputs
