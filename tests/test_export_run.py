"""Exported scripts run for real (tiny checkpoint, in-process engine and ``lmnb serve``): the same
greedy outputs as the notebook's cells, nothing lost or doubled after SIGKILL, per-row errors.

Scripts run as ``__main__`` in the test process (``run_script``) except the one that is killed,
which is a ``python job.py`` process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers_export import (
    NotebookRunner, example_values, jsonable, notebook, notebooks, read_results, run_script, script_env, write_rows,
)
from helpers_lang import served_url
from lmnb.export import export_notebook

NOTEBOOKS = notebooks()


@pytest.fixture(scope="module")
def runner(tiny_llama):
    """The notebooks' reference: an IPython shell with the %%lm magic on the tiny checkpoint."""
    import lmnb.api

    saved = {k: os.environ.get(k) for k in ("LMNB_MODEL", "LMNB_VIEW")}
    default_backend = lmnb.api._default_backend  # loading the extension replaces it
    os.environ.update(LMNB_MODEL=str(tiny_llama), LMNB_VIEW="static")
    r = NotebookRunner()
    r.run_cell(f"%lm load {tiny_llama}")
    yield r
    r.close()
    lmnb.api._default_backend = default_backend
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def export(tmp_path, nb, **kw):
    source, plan = export_notebook(nb, "nb.ipynb", "job.py", **kw)
    script = tmp_path / "job.py"
    script.write_text(source)
    return script, plan


def rows_and_references(runner, nb, plan) -> tuple[list, list]:
    """Input rows from the notebook's examples, and the notebook's captured variables for each:
    the example itself, and (when the example sits in a setup cell) a variant of it."""
    from lmnb.export.cells import Code

    example = example_values(plan)
    rows = [example]
    injectable = all(any(f in c.string_assignments for c in plan.setup if isinstance(c, Code)) for f in plan.inputs)
    if plan.inputs and injectable:
        rows.append({k: f"{v} Tell me more." for k, v in example.items()})
    refs = []
    for i, row in enumerate(rows):
        ns = runner.run(nb, plan, None if i == 0 else row)
        refs.append({name: jsonable(ns[name]) for name in plan.captures if name in ns})
    return rows, refs


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_exported_script_gives_the_notebooks_greedy_outputs(name, runner, tiny_llama, tmp_path):
    nb = NOTEBOOKS[name]
    script, plan = export(tmp_path, nb)
    # (an indented %%lm cell, which IPython runs, was exported as a comment: the job ran no program)
    assert plan.row or not any("%%lm" in c.source for c in nb.cells if c.cell_type == "code"), "a %%lm cell was dropped"
    if not plan.row:  # no %%lm cell: the script runs the cells once, like the notebook
        expected = runner.run(nb, plan)
        code, err, namespace = run_script(script, model=tiny_llama)
        assert code == 0, err
        compared = [k for k in plan_names(plan) if is_json(expected.get(k))]
        assert compared, "nothing to compare"
        assert {k: jsonable(namespace[k]) for k in compared} == {k: jsonable(expected[k]) for k in compared}
        return
    rows, refs = rows_and_references(runner, nb, plan)
    code, err, _ = run_script(script, "--input", write_rows(tmp_path / "rows.jsonl", rows), "--output",
                              tmp_path / "out.jsonl", "--num-threads", 4, "--no-progress", model=tiny_llama)
    assert code == 0, err
    results = sorted(read_results(tmp_path / "out.jsonl"), key=lambda r: r["row"])
    assert [r["status"] for r in results] == ["ok"] * len(rows)
    for result, ref in zip(results, refs):
        assert set(ref) <= set(result["variables"])
        assert {k: result["variables"][k] for k in ref} == ref


def plan_names(plan) -> list:
    from lmnb.export.cells import Code

    return [n for c in plan.cells if isinstance(c, Code) for n in c.assigns]


def is_json(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return value is not None


# (a row of "Question i?" from the number in the file $ROWS_HELD_FROM names on waits while it names
# one no greater: the run is stopped with rows running, however fast this machine runs the rest)
SLOW = notebook(
    'question = "What is blue?"',
    "%%lm --temperature 0\nQ: {question}\nA:{gen answer max_tokens=6}",
    "import os, time\nfrom pathlib import Path\ntime.sleep(0.1)  # a per-row step slow enough to be killed in the middle\n"
    "held = Path(os.environ.get('ROWS_HELD_FROM', '/nonexistent'))\n"
    "while held.exists() and question.startswith('Question ') and int(question[9:-1]) >= int(held.read_text()):\n"
    "    time.sleep(0.01)",
)


def hold_rows_from(path, first: int) -> None:
    """Make the rows from ``first`` on wait (``SLOW``): ``path`` (``$ROWS_HELD_FROM``) replaced at once."""
    path.with_suffix(".new").write_text(str(first))
    path.with_suffix(".new").replace(path)


def start_and_wait_for_lines(script, rows, out, env, lines: int) -> subprocess.Popen:
    """``python job.py`` writing ``out``, returned once ``out`` holds ``lines`` complete lines."""
    args = [sys.executable, str(script), "--input", str(rows), "--output", str(out), "--num-threads", "2", "--no-progress"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= lines:
            break
        time.sleep(0.01)
    return proc


def test_ctrl_c_then_sigkill_mid_run_then_rerun_writes_every_row_exactly_once(tiny_llama, tmp_path):
    script, _ = export(tmp_path, SLOW)
    n = 24
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"Question {i}?"} for i in range(n)])
    code, err, _ = run_script(script, "--input", rows, "--output", tmp_path / "full.jsonl", "--num-threads", 2,
                              "--no-progress", model=tiny_llama)
    assert code == 0, err
    out, held = tmp_path / "out.jsonl", tmp_path / "held"
    env = {**script_env(tiny_llama), "ROWS_HELD_FROM": str(held)}

    # Ctrl-C: the rows already running finish and are written, then the run stops
    hold_rows_from(held, 3)
    proc = start_and_wait_for_lines(script, rows, out, env, 3)
    proc.send_signal(signal.SIGINT)
    said = [proc.stderr.readline()]
    while said[-1] and "lmnb batch: stopping" not in said[-1]:  # (the Ctrl-C is counted: no row starts now)
        said.append(proc.stderr.readline())
    hold_rows_from(held, n)  # the rows running go on
    assert proc.wait(60) == 130
    assert "stopped early" in "".join(said) + proc.stderr.read()
    after_ctrl_c = out.read_bytes()
    assert after_ctrl_c.endswith(b"\n") and 3 <= after_ctrl_c.count(b"\n") < n

    # SIGKILL: no chance to finish anything; as if it had cut the line it was writing
    hold_rows_from(held, after_ctrl_c.count(b"\n") + 3)
    proc = start_and_wait_for_lines(script, rows, out, env, after_ctrl_c.count(b"\n") + 3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    written = out.read_bytes()
    assert written.startswith(after_ctrl_c)
    assert after_ctrl_c.count(b"\n") + 3 <= written.count(b"\n") < n, "the run was not killed in the middle"
    out.write_bytes(written[: written.rfind(b"\n") + 1] + b'{"row": 23, "line": 24, "status": "ok", "vari')

    code, err, _ = run_script(script, "--input", rows, "--output", out, "--num-threads", 2, "--no-progress",
                              model=tiny_llama)
    assert code == 0, err
    assert "last line was incomplete" in err
    results = read_results(out)
    assert sorted(r["row"] for r in results) == list(range(n))
    expected = {r["row"]: r["variables"] for r in read_results(tmp_path / "full.jsonl")}
    assert {r["row"]: r["variables"] for r in results} == expected


CHECKED = notebook(
    'question = "Write a number"\npattern = "[0-9]+"',
    "%%lm --temperature 0\n{question}:{gen number regex=pattern max_tokens=4}",
)


def test_bad_rows_and_a_missing_field_are_per_row_errors(tiny_llama, tmp_path):
    script, plan = export(tmp_path, CHECKED)
    assert plan.inputs == ("question", "pattern")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "One", "pattern": "[0-9]+"}\n'
                    '{"question": "Two"}\n'  # no pattern
                    '{"question": "Three", "pattern": "[0-9"}\n'  # a regex that does not compile
                    '{"question": "Four",\n'
                    '{"question": "Five", "pattern": "[a-z]+"}\n')
    code, err, _ = run_script(script, "--input", rows, "--output", tmp_path / "out.jsonl", "--no-progress",
                              model=tiny_llama)
    assert code == 1, err
    results = {r["row"]: r for r in read_results(tmp_path / "out.jsonl")}
    assert [results[i]["status"] for i in range(5)] == ["ok", "bad_input", "error", "bad_input", "ok"]
    assert results[1]["error"] == "line 2: missing field 'pattern' (the row has question)"
    assert "regex" in results[2]["error"].lower() and results[2]["line"] == 3
    assert results[3]["error"].startswith("line 4: invalid JSON")
    assert results[0]["variables"]["number"].isdigit() and results[4]["variables"]["number"].isalpha()
    assert "rows.jsonl line 2: missing field 'pattern'" in err


def test_a_python_cell_reading_a_variable_named_like_its_cell_option_runs_in_the_job(tiny_llama, tmp_path):
    # the job calls cell.run(temperature, temperature=0.0): the program's parameter has its value
    # positionally, and the option is the cell's; refusing it failed every row (found by a review helper)
    nb = notebook('temperature = "21 degrees"',
                  "%%lm --python --temperature 0\ns += 'Today: ' + temperature\ns += lmnb.gen('c4', max_tokens=3)")
    script, plan = export(tmp_path, nb)
    assert plan.inputs == ("temperature",)
    write_rows(tmp_path / "rows.jsonl", [{"temperature": "cold"}])
    code, err, _ = run_script(script, "--input", tmp_path / "rows.jsonl", "--output", tmp_path / "out.jsonl",
                              "--no-progress", model=tiny_llama)
    [result] = read_results(tmp_path / "out.jsonl")
    assert code == 0 and result["status"] == "ok", err
    from lmnb_engine import Engine, SamplingParams

    with Engine(str(tiny_llama), max_total_tokens=1024) as engine:  # the row's value reached the prompt, greedily
        want = engine.generate("Today: cold", SamplingParams(max_new_tokens=3, temperature=0)).text
    assert result["variables"] == {"c4": want}


def test_a_hole_whose_value_a_function_makes_a_primitive_fails_the_row_not_sent_as_text(tiny_llama, tmp_path):
    # the export refuses {lmnb.gen(...)} where it can read it; a function's result it cannot, and the
    # job's f-string sent "Q: hi\nA: Gen('a')" in every row, status ok, with no variable a
    nb = notebook('import lmnb\nq = "hi"\ndef make_gen():\n    return lmnb.gen("a", max_tokens=3)',
                  "%%lm --temperature 0\nQ: {q}\nA: {make_gen()}")
    script, plan = export(tmp_path, nb)
    assert plan.inputs == ("q",)
    write_rows(tmp_path / "rows.jsonl", [{"q": "one"}])
    code, err, _ = run_script(script, "--input", tmp_path / "rows.jsonl", "--output", tmp_path / "out.jsonl",
                              "--no-progress", model=tiny_llama)
    [result] = read_results(tmp_path / "out.jsonl")
    assert code == 1 and result["status"] == "error", err
    assert result["error"].startswith(
        "TypeError: Gen('a') is an lmnb primitive: in an f-string or format() it becomes its repr as text and never "
        'runs; add it to the state instead: s += "A: " + lmnb.gen(...) (or s += "A: ", then s += lmnb.gen(...)), '
        'not s += f"A: {lmnb.gen(...)}"; for the repr itself (debugging), write {x!r} or repr(x) (job.py line ')
    assert result["error"].endswith(", notebook cell 2)") and result["variables"] == {}
    assert result["tokens"]["completion"] == 0


def test_script_against_lmnb_serve_gives_the_same_results(runner, tiny_llama, tmp_path):
    """The same scripts on a server: SGLang's native protocol, and the OpenAI-compatible API."""
    server = subprocess.Popen([sys.executable, "-m", "lmnb_kernel.cli", "serve", "--model", str(tiny_llama),
                               "--port", "0", "--served-model-name", "tiny", "--log-level", "warning"],
                              env=script_env(tiny_llama), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = served_url(server)
        for name, backend in (("builtin:qa", [url]), ("builtin:chat", [url + "/v1", "--openai", "tiny"])):
            nb = NOTEBOOKS[name]
            script, plan = export(tmp_path, nb)
            rows, refs = rows_and_references(runner, nb, plan)
            out = tmp_path / f"{name.split(':')[1]}.jsonl"
            code, err, _ = run_script(script, "--input", write_rows(tmp_path / "rows.jsonl", rows), "--output",
                                      out, "--backend", *backend, "--no-progress", model=tiny_llama)
            assert code == 0, err
            results = sorted(read_results(out), key=lambda r: r["row"])
            assert [{k: r["variables"][k] for k in ref} for r, ref in zip(results, refs)] == refs, name
    finally:
        server.terminate()
        server.wait(30)
