"""The batch runtime of exported scripts (``lmnb.batch``) on a scripted backend: inputs with line
numbers, per-row errors, resuming without writing a row twice, torn lines, ids, the lock."""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import sys
import warnings
from pathlib import Path

import pytest

import lmnb
from helpers_export import read_results, write_rows
from helpers_lang import ScriptedBackend, keyed_server, serve_http
from lmnb.batch import InputError, Job, ResultStore, StoreError, read_rows
from lmnb.batch.options import engine_model


@lmnb.function
def echo(s, question):
    s += "Q: " + question + "\nA:"
    s += lmnb.gen("answer", max_tokens=4)


def reply(prompt, params):
    """The scripted model: the question, upper-cased (fails for questions containing 'boom')."""
    question = prompt.text.split("Q: ")[-1].split("\n")[0]
    if "boom" in question:
        raise RuntimeError("model exploded")
    return question.upper()


def run_row(question):
    state = echo.run(question, temperature=0)
    state.sync()


def run_job(tmp_path, *options, backend=None, inputs=("question",)) -> int:
    job = Job("test job", inputs, argv=["--output", str(tmp_path / "out.jsonl"), "--no-progress", *map(str, options)])
    return job.run(run_row, programs=[echo], backend=backend or ScriptedBackend(reply))


def by_row(results) -> dict:
    return {r["row"]: r for r in results}


def test_each_row_gets_its_variables_finish_reason_and_tokens(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}", "extra": i} for i in range(5)])
    assert run_job(tmp_path, "--input", rows, "--num-threads", 3) == 0
    results = read_results(tmp_path / "out.jsonl")
    assert sorted(r["row"] for r in results) == list(range(5))
    for r in results:
        assert r["status"] == "ok" and r["line"] == r["row"] + 1
        assert r["variables"] == {"answer": f"Q{r['row']}"}
        assert r["finish_reasons"] == {"answer": "stop"}
        assert set(r["tokens"]) == {"prompt", "cached", "completion"}


@pytest.mark.parametrize("name, text", [("rows.jsonl", ""), ("rows.jsonl", "\n\n"), ("rows.csv", "question\n")])
def test_an_input_without_rows_is_warned_about_and_exits_0(tmp_path, capsys, name, text):
    """It said "0 rows" and exited 0 without a word: a wrong or unwritten input file went unnoticed."""
    rows = tmp_path / name
    rows.write_text(text)
    assert run_job(tmp_path, "--input", rows) == 0
    err = capsys.readouterr().err
    assert f"lmnb batch: warning: {rows} has no input rows (an empty file?); nothing to run\n" in err
    assert read_results(tmp_path / "out.jsonl") == []


def test_rerun_after_a_partial_run_runs_only_the_missing_rows(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(6)])
    backend = ScriptedBackend(reply)
    assert run_job(tmp_path, "--input", rows, "--limit", 2, backend=backend) == 0
    assert run_job(tmp_path, "--input", rows, backend=backend) == 0
    results = read_results(tmp_path / "out.jsonl")
    assert sorted(r["row"] for r in results) == list(range(6))  # each row exactly once
    generated = [c for c in backend.calls if c[0] == "generate"]
    assert len(generated) == 6  # the two done rows did not run again


_TORN = "  the output's last line was incomplete (a run was killed while writing it) and was removed; "


def test_a_torn_last_line_is_cut_off_and_its_row_runs_again(tmp_path, capsys):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(4)])
    out = tmp_path / "out.jsonl"
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 0
    whole = out.read_bytes()
    out.write_bytes(whole + b'{"row": 2, "line": 3, "status": "ok", "varia')  # killed mid-write
    capsys.readouterr()
    assert run_job(tmp_path, "--input", rows) == 0
    assert out.read_bytes().startswith(whole)
    assert sorted(r["row"] for r in read_results(out)) == [0, 1, 2, 3]
    assert _TORN + "its row, row 2, ran again\n" in capsys.readouterr().err


@pytest.mark.parametrize("torn, options, note", [
    # it said "so its row ran again" of each, where no row ran, or none could be told
    (b'{"row": 2, "line": 3, "sta', ["--limit", 2], "its row, row 2, is past --limit, so it did not run: a run that "
                                                   "reaches it runs it"),
    (b'{"row": 7, "line": 8, "sta', [], "the input has no row 7 now"),
    (b'{"ro', [], "too little of it was written to tell its row, which counts as not done"),
    (b'{"row": 1', [], "too little of it was written to tell its row, which counts as not done"),  # (1 of 12?)
])
def test_the_note_of_a_torn_last_line_says_what_became_of_its_row(tmp_path, capsys, torn, options, note):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    out = tmp_path / "out.jsonl"
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 0
    whole = out.read_bytes()
    out.write_bytes(whole + torn)
    capsys.readouterr()
    assert run_job(tmp_path, "--input", rows, *options) == 0
    assert out.read_bytes().startswith(whole)
    assert _TORN + note + "\n" in capsys.readouterr().err


def test_the_note_of_a_torn_last_line_says_its_row_did_not_run_when_the_job_stopped_first(tmp_path, capsys):
    import signal

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(6)])
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"row": 5, "line": 6, "sta')

    def ctrl_c_at_the_first_row(question):  # (the job stops after the rows in flight: not row 5)
        if question == "q0":
            os.kill(os.getpid(), signal.SIGINT)

    argv = ["--input", str(rows), "--output", str(out), "--no-progress", "--num-threads", "1"]
    assert Job("t", ["question"], argv=argv).run(ctrl_c_at_the_first_row, backend=ScriptedBackend(reply)) == 130
    assert 5 not in {r["row"] for r in read_results(out)}
    assert _TORN + "its row, row 5, did not run before the job stopped: a rerun runs it\n" in capsys.readouterr().err


def test_the_note_of_a_torn_bad_input_line_says_it_was_written_again(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "q0"}\n{"q": "no question"}\n')
    out = tmp_path / "out.jsonl"
    assert run_job(tmp_path, "--input", rows, "--limit", 1) == 0
    out.write_bytes(out.read_bytes() + b'{"row": 1, "line": 2, "status": "bad_in')
    capsys.readouterr()
    assert run_job(tmp_path, "--input", rows) == 1
    assert _TORN + "its row, row 1, was written again as bad input\n" in capsys.readouterr().err


def test_a_changed_line_in_the_middle_is_refused_not_guessed(tmp_path, capsys):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}] * 3)
    out = tmp_path / "out.jsonl"
    out.write_text('{"row": 0, "status": "ok"}\nnot json\n{"row": 1, "status": "ok"}\n')
    before = out.read_text()
    assert run_job(tmp_path, "--input", rows) == 2
    assert "line 2 is not a result record" in capsys.readouterr().err
    assert out.read_text() == before


@pytest.mark.parametrize("content", [
    b'{"person": "Arvel"}\n{"person": "Bexa"}\n{"person": "Corin"}',  # --input and --output swapped
    b"notes\nmore notes", b"no line break at all",
])
def test_a_file_that_is_not_a_results_file_is_refused_and_left_as_it_was(tmp_path, capsys, content):
    """Its last line has no line break, like a torn record: it was cut off before the other lines
    were checked, so the refusal came after the file had lost its last line."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    out = tmp_path / "out.jsonl"
    out.write_bytes(content)
    assert run_job(tmp_path, "--input", rows) == 2
    assert "is not a result record of this job" in capsys.readouterr().err
    assert out.read_bytes() == content


def test_bad_lines_and_missing_fields_are_rows_with_errors_and_the_run_goes_on(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "a"}\n\n{"question": \n[1, 2]\n{"q": "x"}\n{"question": "boom"}\n{"question": "b"}\n'
                    '{"question": "\\ud800 lone"}\nnull\n')
    assert run_job(tmp_path, "--input", rows) == 1
    results = by_row(read_results(tmp_path / "out.jsonl"))
    assert [results[i]["status"] for i in range(8)] == ["ok", "bad_input", "bad_input", "bad_input", "error", "ok",
                                                        "bad_input", "bad_input"]
    # (it failed in the tokenizer: "TypeError: TextEncodeInput must be Union[...]")
    assert results[6]["error"].startswith("line 8: field 'question' holds a lone surrogate")
    assert results[1]["error"].startswith("line 3: invalid JSON")
    assert results[2]["error"] == 'line 4: a row must be a JSON object {"field": value, ...}, got [1, 2]'
    assert results[7]["error"].endswith("got null")  # (it said "got NoneType")
    assert results[3]["error"] == "line 5: missing field 'question' (the row has q)"
    assert "model exploded" in results[4]["error"] and results[4]["line"] == 6
    assert results[5]["variables"] == {"answer": "B"}
    err = capsys.readouterr().err
    assert "rows.jsonl line 3: invalid JSON" in err and "rows.jsonl line 5: missing field" in err


@pytest.mark.parametrize("name, lines", [
    ("rows.jsonl", [b'{"question": ', b'{"question": "a",', b"\xff not UTF-8", b"[1, 2]", b"null"]),
    # (one column: "question" is the header again; a quoted value over two lines is one record)
    ("rows.csv", [b'"open, quote"x', b"a,b", b"c,d,e", b"question", b'"two\r\nlines",z']),
    # (bytes that are no UTF-8: a record's, on its one line or inside a quoted value of two)
    ("rows.csv", [b"\xff not UTF-8", b'"caf\xe9\r\nau lait"', b"caf\xc3"]),
])
def test_each_row_that_cannot_be_read_has_its_own_input_hash(tmp_path, name, lines):
    """Their fields, None, were hashed: every bad_input record had one input_hash, whatever the
    line held. Each is the sha256 of the record as written (its line, or lines), without its line break."""
    import hashlib

    rows = tmp_path / name
    rows.write_bytes(b"question\n" * name.endswith(".csv") + b"\r\n".join(lines) + b"\n")
    assert run_job(tmp_path, "--input", rows) == 1
    results = read_results(tmp_path / "out.jsonl")
    assert [r["status"] for r in results] == ["bad_input"] * len(lines)
    assert [r["input_hash"] for r in results] == [hashlib.sha256(line).hexdigest()[:16] for line in lines]


def test_a_byte_that_is_no_utf8_in_line_1_after_a_byte_order_mark_is_told_at_its_offset_in_the_file(tmp_path):
    """A UTF-8 byte order mark (EF BB BF, which some editors write first) is taken off line 1 before it
    is read, and "at byte B" was counted from after it: 3 less than a hex editor shows. Line 1's
    byte is now its offset in the file (found here by searching the file's bytes); a later line's
    is still counted from its line's start (the byte after the line break before it)."""
    rows = tmp_path / "rows.csv"
    data = b"\xef\xbb\xbfquesti\xf3n\nq1\n"  # (a Latin-1 header after the mark)
    rows.write_bytes(data)
    with pytest.raises(InputError) as refused:
        list(read_rows(rows))
    offset = data.index(b"\xf3")
    assert offset == 9  # (by hand too: 3 bytes of the mark, 6 of "questi")
    assert str(refused.value) == (f"{rows} line 1: not UTF-8 text (invalid continuation byte at byte {offset}); save "
                                  "the file as UTF-8")
    rows = tmp_path / "rows.jsonl"
    data = b'\xef\xbb\xbf{"q": "caf\xe9"}\n{"q": "x\xe9"}\n'
    rows.write_bytes(data)
    second = data.index(b"\n") + 1
    first_bad, second_bad = data.index(b"\xe9"), data.index(b"\xe9", second) - second
    assert [r.error for r in read_rows(rows)] == [
        f"line 1: not UTF-8 text (invalid continuation byte at byte {first_bad})",
        f"line 2: not UTF-8 text (invalid continuation byte at byte {second_bad})"]


def test_a_csv_row_that_is_no_utf8_is_bad_input_and_the_rows_after_it_run(tmp_path, capsys):
    """A CSV file with one row that is no UTF-8 (a Latin-1 "café") stopped the whole job (exit 2,
    "rows.csv line 3: not UTF-8 text ...; save the file as UTF-8"), none of its rows run, where
    a JSON line's is a bad_input record of its own. Now it is that row's record, told as a JSON
    line's is (the byte counted from 0 in its line: "caf" is bytes 0-2, so E9 is byte 3; inside
    a quoted value, its own line), and the other rows run; a header that is no UTF-8 still stops it."""
    rows = tmp_path / "rows.csv"
    rows.write_bytes(b'question\nq1\ncaf\xe9\n"two\nlines \xff"\nq2\n')
    assert run_job(tmp_path, "--input", rows) == 1
    results = by_row(read_results(tmp_path / "out.jsonl"))
    assert [results[i]["status"] for i in range(4)] == ["ok", "bad_input", "bad_input", "ok"]
    assert results[1]["error"] == "line 3: not UTF-8 text (invalid continuation byte at byte 3)"
    assert (results[2]["line"], results[2]["error"]) == (4, "line 5: not UTF-8 text (invalid start byte at byte 6)")
    assert [results[i]["variables"]["answer"] for i in (0, 3)] == ["Q1", "Q2"]
    assert "rows.csv line 3: not UTF-8 text (invalid continuation byte at byte 3)" in capsys.readouterr().err
    rows.write_bytes(b"questi\xf3n\nq1\n")
    with pytest.raises(InputError) as refused:
        list(read_rows(rows))
    assert str(refused.value) == f"{rows} line 1: not UTF-8 text (invalid continuation byte at byte 6); save the file as UTF-8"
    rows.write_bytes(b'"question\nq1\n')  # (a header csv cannot read is told so, as before: it raised TypeError)
    with pytest.raises(InputError) as refused:
        list(read_rows(rows))
    assert str(refused.value) == (f"{rows} line 1: cannot read the CSV header: a quote opened in this row is never "
                                  'closed: lines 1-2, to the end of the file, are inside it; close the quoted value, '
                                  'or write a quote inside it as ""')


def test_a_missing_field_that_a_field_of_the_row_misspells_is_offered(tmp_path):
    """{"qestion": "a"} said only "missing field 'question' (the row has qestion)"; the field
    the row misspells is offered (suggest.close_match: difflib's ratio 0.6 or more; 'q' is not)."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"qestion": "a"}, {"q": "b"}, {"Question": "c"}])
    assert run_job(tmp_path, "--input", rows) == 1
    results = by_row(read_results(tmp_path / "out.jsonl"))
    assert [results[i]["error"] for i in range(3)] == [
        "line 1: missing field 'question' (the row has qestion); did you mean 'question' for the row's 'qestion'? "
        "rename it in the input",
        "line 2: missing field 'question' (the row has q)",
        "line 3: missing field 'question' (the row has Question); did you mean 'question' for the row's 'Question'? "
        "rename it in the input"]
    from lmnb.batch.runner import _misspelt  # (a job of two fields: each offered, after its misspelling)

    assert _misspelt({"persn": 1, "qestion": 2, "x": 3}, ["person", "question"], ["person", "question"]) == (
        "; did you mean 'persn' → 'person', 'qestion' → 'question'? rename them in the input")
    # (one field near two missing names is offered for one, the closest: it said "did you mean 'name' → 'name1',
    # 'name' → 'name2'? rename them", one field renamed twice)
    assert _misspelt({"name": 1}, ["name1", "name2"], ["name1", "name2"]) == (
        "; did you mean 'name1' for the row's 'name'? rename it in the input")
    assert _misspelt({"nam": 1}, ["names", "name"], ["names", "name"]) == (
        "; did you mean 'name' for the row's 'nam'? rename it in the input")


def test_a_null_field_is_bad_input_not_the_text_none(tmp_path, capsys):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": None}, {"question": "b"}])
    assert run_job(tmp_path, "--input", rows) == 1
    results = by_row(read_results(tmp_path / "out.jsonl"))
    assert (results[0]["status"], results[0]["error"]) == (
        "bad_input", "line 1: field 'question' is null; give a value, or leave the row out")
    assert results[1]["status"] == "ok"
    assert capsys.readouterr().err.rstrip().endswith(
        'rows with "status": "bad_input" say why in "error"; fix the input and run again: rows whose input '
        "changed run again")


def test_a_rerun_counts_rows_still_bad_input_as_bad_input_not_as_done(tmp_path, capsys):
    """A rerun said "0 bad input, 3 already done" of a row still bad input, and did not name it."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"other": 1}, {"question": "c"}])
    assert run_job(tmp_path, "--input", rows) == 1
    capsys.readouterr()
    written = (tmp_path / "out.jsonl").read_bytes()
    assert run_job(tmp_path, "--input", rows) == 1
    err = capsys.readouterr().err
    assert f"lmnb batch: {rows} line 2: missing field 'question' (the row has other)\n" in err
    assert "  this run: 0 rows ran (0 ok, 0 failed), 1 bad input, 2 already done\n" in err
    assert (tmp_path / "out.jsonl").read_bytes() == written  # (its record stands)


def test_retry_errors_reruns_failed_rows_once(tmp_path, capsys):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "boom"}, {"question": "fine"}])
    assert run_job(tmp_path, "--input", rows) == 1
    # a backend error is not the input's fault: the hint names --retry-errors (a bad_input one does not)
    assert capsys.readouterr().err.rstrip().endswith(
        'rows with "status": "error" say why in "error"; fix the input and run again: rows whose input changed '
        "run again; --retry-errors also reruns failed rows on the same input (after a backend error)")
    assert run_job(tmp_path, "--input", rows) == 1  # errors count as done: nothing is rerun
    assert len(read_results(tmp_path / "out.jsonl")) == 2
    fixed = ScriptedBackend(lambda prompt, params: "OK")
    assert run_job(tmp_path, "--input", rows, "--retry-errors", backend=fixed) == 0
    results = by_row(read_results(tmp_path / "out.jsonl"))
    assert len(read_results(tmp_path / "out.jsonl")) == 2
    assert results[0]["variables"] == {"answer": "OK"} and results[1]["variables"] == {"answer": "FINE"}


def test_rows_that_could_not_reach_the_backend_are_not_blamed_on_the_input(tmp_path, capsys):
    """An exported job whose --openai server does not answer wrote an error for every row and ended
    with "fix the input and run again", though the input was fine."""
    import socket

    from helpers_export import notebook, run_script
    from lmnb.export import export_notebook

    source, _ = export_notebook(notebook('question = "Why?"', "%%lm --temperature 0\nQ: {question}\nA:{gen answer "
                                         "max_tokens=4}"), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    # a port nothing listens on, held by this socket (bound, never listening) so that no other process
    # takes it meanwhile
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"question": "b"}])
        command = [tmp_path / "job.py", "--input", rows, "--output", tmp_path / "out.jsonl", "--backend", gone, "--openai",
                   "m", "--completion", "--api-key", "k", "--no-progress"]
        code, err, _ = run_script(*command, model="unused")
        assert code == 1
        assert [r["status"] for r in read_results(tmp_path / "out.jsonl")] == ["error", "error"]
        # (the connection's error, "ConnectError: All connection attempts failed", is httpx's words)
        assert re.search(re.escape(f"  2 rows failed because the backend could not be reached ({gone}/completions: nothing "
                                   "answers there (ConnectError: ") + "[^;]+" + re.escape(
            "; 3 tries); is the server running, and are the host and port right?); once it answers, run the same "
            "command again with --retry-errors to rerun the failed rows (rows already done are kept)\n") + r"\Z",
            err), err
        assert "fix the input" not in err
        code, err, _ = run_script(*command, "--retry-errors", model="unused")  # (as it says: the same options take it)
        assert code == 1 and "this run: 2 rows ran (0 ok, 2 failed), 0 bad input, 0 already done" in err, err


def test_a_run_whose_rows_all_failed_shows_no_speed(tmp_path, capsys):
    """Rows that all failed at once ended with "0.0 s: 677.26 rows/s": a speed of nothing done."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "boom"}, {"question": "boom 2"}])
    assert run_job(tmp_path, "--input", rows) == 1
    err = capsys.readouterr().err
    assert "this run: 2 rows ran (0 ok, 2 failed)" in err and "rows/s" not in err, err
    assert "  tokens: prompt 0, cached 0 (cache hit rate n/a), generated 0\n" in err  # (the tokens are still said)
    write_rows(tmp_path / "rows.jsonl", [{"question": "boom"}, {"question": "boom 2"}, {"question": "ok"}])
    assert run_job(tmp_path, "--input", rows) == 1
    assert re.search(r"\n  [0-9.]+ s: [0-9.]+ rows/s, [0-9.]+ generated tokens/s\n", capsys.readouterr().err)


def test_rows_whose_code_reads_a_name_nothing_set_are_not_blamed_on_the_input(tmp_path, capsys):
    """A notebook whose %%lm cell read a variable only a later cell set (run first in Jupyter) failed
    every row with NameError, and the summary said to fix the input and run again."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"question": "b"}, {"question": "c"}])

    def run_row(question):
        if question != "c":
            return person  # noqa: F821 - the notebook's read of a name only a later cell sets
        raise ValueError("another failure")

    job = Job("t", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress"])
    assert job.run(run_row, backend=ScriptedBackend(reply)) == 1
    err = capsys.readouterr().err
    [said] = [line for line in err.splitlines() if "nothing set" in line]
    assert said.startswith("  2 rows failed because the notebook's code reads a name that nothing set (NameError: "
                           "name 'person' is not defined")
    assert said.endswith("), which no input row can fix; in the notebook, set it in a cell above the one that reads it "
                         "(lmnb export notes a cell that reads one only a later cell sets) and export it again; "
                         "then run with --retry-errors to rerun the failed rows (rows already done are kept)")
    assert '  other rows with "status": "error" or "bad_input" say why in "error"' in err  # (the ValueError's row)
    assert "fix the input" not in err


SETUP_FAILS = [
    # (the notebook's cells, the failing line as the script has it, where it failed, the error and the fix)
    (['person = open("data.txt").read().strip(); q = "x"',
      "%%lm --temperature 0\n{q} Q: Where does {person} live? A:{gen city max_tokens=5}"],
     'person = open("data.txt").read().strip(); q = "x"', "the notebook's set-up failed in cell 1, before any row ran",
     "FileNotFoundError: [Errno 2] No such file or directory: 'data.txt'; the path 'data.txt' is read from the "
     "folder the job runs in, {cwd}, where lmnb run and Jupyter read it from the notebook's folder; the script's "
     "folder has it: run the job from there (cd {sub}, with --input and --output given from there), or open it by "
     "its full path in the notebook and export it again"),
    (["def load():\n    return 1 / 0", "n = load()", '%%lm\n{q} {n}{gen a max_tokens=2}'],
     "return 1 / 0", "the notebook's set-up failed in cell 2, before any row ran",
     "ZeroDivisionError: division by zero; fix the notebook and export it again"),
    # no %%lm cell: no rows (the backend starts after the parameters cell, so none is needed to get there)
    (['open("gone.txt")', ("parameters", "n = 1")], 'open("gone.txt")', "the notebook failed in cell 1",
     "FileNotFoundError: [Errno 2] No such file or directory: 'gone.txt'; the path 'gone.txt' is read from the "
     "folder the job runs in, {cwd}, where lmnb run and Jupyter read it from the notebook's folder; run the job "
     "from the folder that has it, or open it by its full path in the notebook and export it again"),
]


@pytest.mark.parametrize("cells, line, failed, end", SETUP_FAILS,
                         ids=["relative path", "set-up function", "no %%lm cell"])
def test_a_set_up_cell_that_raises_ends_the_job_with_one_message_and_exit_2(tmp_path, cells, line, failed, end):
    """A set-up cell that opened a file by a relative path worked under lmnb run (which runs the
    notebook in its folder) but the exported job, run from another folder, ended with Python's
    traceback and exit 1, which the docs give to failed rows; any set-up error did."""
    import subprocess

    from helpers_export import notebook
    from lmnb.export import export_notebook

    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "data.txt").write_text("Arvel\n")
    source, _ = export_notebook(notebook(*cells), "rel.ipynb", "rel.py")
    (sub / "rel.py").write_text(source)
    lineno = next(i for i, text in enumerate(source.splitlines(), 1) if text.strip().startswith(line))
    rows = write_rows(tmp_path / "rows.jsonl", [{"q": "x"}])
    options = ["--input", "rows.jsonl", "--output", "out.jsonl", "--no-progress"] if "%%lm" in cells[-1] else []
    done = subprocess.run([sys.executable, "sub/rel.py", *options, "--backend", "http://127.0.0.1:9"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    here = os.path.realpath(tmp_path)  # (the job says the folder as os.getcwd() gives it)
    assert done.stderr == (f"lmnb batch: {failed} (rel.py line {lineno}: {line}): "
                           f"{end.format(cwd=here, sub=os.path.join(here, 'sub'))}\n"), done.stderr
    assert not (tmp_path / "out.jsonl").exists() and rows.exists()


def test_a_job_run_in_process_whose_set_up_fails_leaves_sys_excepthook_as_it_was(tmp_path, monkeypatch):
    """A job run as __main__ inside another program (runpy.run_path, IPython's %run) whose set-up
    raised left its own sys.excepthook set after the caller had got the error: only a job that is
    the program (python job.py, python -m) sets it."""
    import runpy

    from helpers_export import notebook
    from lmnb.export import export_notebook

    source, _ = export_notebook(notebook('n = 1 / 0\nq = "x"', "%%lm\n{q}{gen a max_tokens=1}"), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", "rows.jsonl", "--output", "out.jsonl"])
    before = sys.excepthook
    with pytest.raises(ZeroDivisionError):
        runpy.run_path(str(tmp_path / "job.py"), run_name="__main__")
    assert sys.excepthook is before


@pytest.mark.parametrize("tool, script", [(["-m", "cProfile"], ["job.py"]),
                                          (["-m", "coverage", "run", "--data-file", "cov.data"], ["job.py"]),
                                          (["-m", "cProfile"], ["-m", "pkg.job"])],
                         ids=["cProfile", "coverage", "cProfile -m"])
def test_a_set_up_error_under_a_tool_that_runs_the_job_as_the_program_is_still_one_message(tmp_path, tool, script):
    """Run under a profiler or coverage (``python -m cProfile job.py``, ``coverage run job.py``, or
    ``-m pkg.job``), whose frames are above the script's, a set-up error ended in Python's traceback
    and exit 1: the job took the tool for another program running it in its process (as
    ``runpy.run_path`` does), where the tool hands the error on to ``sys.excepthook`` as Python does."""
    import subprocess

    from helpers_export import notebook
    from lmnb.export import export_notebook

    source, _ = export_notebook(notebook('n = 1 / 0\nq = "x"', "%%lm\n{q}{gen a max_tokens=1}"), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text(source)
    lineno = source.splitlines().index("n = 1 / 0") + 1
    write_rows(tmp_path / "rows.jsonl", [{"q": "x"}])
    done = subprocess.run([sys.executable, *tool, *script, "--input", "rows.jsonl", "--output", "out.jsonl",
                           "--no-progress", "--backend", "http://127.0.0.1:9"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stderr) == (
        2, f"lmnb batch: the notebook's set-up failed in cell 1, before any row ran (job.py line {lineno}: n = 1 / 0): "
           "ZeroDivisionError: division by zero; fix the notebook and export it again\n")


@pytest.mark.parametrize("options", [["--help"], ["--input", "rows.jsonl", "--output", "out.jsonl", "--limt", "3"]])
def test_the_command_line_is_read_before_the_set_up_cells_run(tmp_path, options):
    """Without a parameters cell, the job read its options only when its rows started, so --help
    and a misspelt option ran every set-up cell first (a slow one, or one that failed and hid the
    help). A set-up cell that writes a file shows whether it ran."""
    import subprocess

    from helpers_export import notebook
    from lmnb.export import export_notebook

    source, _ = export_notebook(notebook('open("ran.txt", "w").close()\nq = "x"', "%%lm\n{q}{gen a max_tokens=1}"),
                                "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    done = subprocess.run([sys.executable, "job.py", *options], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    if options == ["--help"]:
        assert (done.returncode, done.stdout.startswith("usage: job.py")) == (0, True), done.stderr
    else:
        # it said "unrecognized arguments: --limt 3" and no more
        assert (done.returncode, done.stderr.splitlines()[-1]) == (
            2, "job.py: error: unrecognized arguments: --limt 3 (did you mean: --limt → --limit?)")
    assert not (tmp_path / "ran.txt").exists()


PARAMETERS_BELOW_SET_UP = ['open("ran.txt", "w").close()', ("parameters", 'temperature = 0.5\nn = len("ab")')]


@pytest.mark.parametrize("per_row", [True, False], ids=["rows", "no %%lm cell"])
@pytest.mark.parametrize("options", [["--help"], ["--temperature", "warm"]])
def test_a_parameters_options_are_read_before_the_cells_above_the_parameters_cell_run(tmp_path, per_row, options):
    """With a parameters cell the job read its command line only where that cell ran, so --help
    and a bad value ran the cells above it first (a model load, a generation); the options come
    from the cell's literals, read at export. A default the cell computes is said so in --help."""
    import subprocess

    from helpers_export import notebook
    from lmnb.export import export_notebook

    cells = PARAMETERS_BELOW_SET_UP + (['q = "x"', "%%lm\n{q}{gen a max_tokens=1}"] if per_row else [])
    source, _ = export_notebook(notebook(*cells), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    rows = ["--input", "rows.jsonl", "--output", "out.jsonl"] if per_row else []
    done = subprocess.run([sys.executable, "job.py", *rows, *options], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    if options == ["--help"]:
        assert done.returncode == 0, done.stderr
        helped = " ".join(done.stdout.split())
        assert "--temperature VALUE (default: 0.5) --n VALUE (default: computed by the parameters cell when the job runs)" in helped
    else:
        assert (done.returncode, done.stderr.splitlines()[-1]) == (
            2, "job.py: error: argument --temperature: expected a number (e.g. 0.5, 2 or 1e-3), got 'warm'")
    assert not (tmp_path / "ran.txt").exists()


@pytest.mark.parametrize("model, options, said", [
    ("missing", [], "FileNotFoundError: no checkpoint directory at '{tmp}/missing'; check the path"),
    (None, ["--model", "./missing"], "FileNotFoundError: no checkpoint directory at './missing' (none at {tmp}/missing); "
                                     "check the path"),
    (None, ["--model", "job.py"], "FileNotFoundError: job.py is a file, not a Hugging Face checkpoint directory"),
    (None, ["--timeout", "5"], "ValueError: --timeout is for a server backend (--backend URL); the in-process engine "
                               "has none"),
    (None, ["--backend", "ftp://x"], "ValueError: --backend 'ftp://x' is neither 'engine' nor an http(s) URL"),
    (None, ["--device", "cdua"], "ValueError: unknown device 'cdua'; use 'cuda', 'cuda:N' or 'cpu'; did you mean 'cuda'?"),
    (None, ["--device", "mps"], "ValueError: device 'mps' is not supported: lmnb_engine runs on 'cuda', 'cuda:N' or 'cpu'"),
    (None, ["--device", "cuda:99999999999999999999"], "ValueError: device 'cuda:99999999999999999999': its number is "
     "past 127, the largest torch reads as itself (it reads cuda:256 as cuda:0); give the device's number, 0, 1, ... "
     "(nvidia-smi lists the CUDA devices)"),
    (None, ["--device", "cpu:256"], "ValueError: device 'cpu:256': its number is past 127, the largest torch reads as "
     "itself (it reads cpu:256 as cpu:0); give 'cpu': a cpu device's number selects nothing (torch puts cpu:N's "
     "tensors on 'cpu')"),
    (None, ["--dtype", "flaot16"], "ValueError: unsupported dtype 'flaot16'; use float32, bfloat16 or float16; did you "
                                   "mean 'float16'?")])
def test_a_backend_that_cannot_start_is_refused_before_any_cell_runs(tmp_path, model, options, said):
    """The notebook's %lm load /nonexistent/model (or --model ./missing), backend options that
    do not fit (--timeout for the engine, a --backend that is no URL), and a --device or --dtype
    the engine does not take (with a did-you-mean: lmnb_engine.device_names, torch-free) were found only when the
    backend started, after every set-up cell ran (a slow one, one that fails and hides it); the job
    now says so as it did then (exit 2) before any cell runs. (A script without a
    %%lm cell starts its backend before its cells already.)"""
    import subprocess

    from helpers_export import notebook
    from lmnb.export import export_notebook

    load = [f"%lm load {tmp_path / model}"] if model else []
    cells = load + ['open("ran.txt", "w").close()', 'q = "x"', "%%lm\n{q}{gen a max_tokens=1}"]
    source, _ = export_notebook(notebook(*cells), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    done = subprocess.run([sys.executable, "job.py", "--input", "rows.jsonl", "--output", "out.jsonl", *options],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.splitlines()[-1]) == (
        2, f"lmnb batch: could not start the backend ({'ftp://x' if 'ftp' in said else 'engine'}): "
           + said.format(tmp=tmp_path))
    assert not (tmp_path / "ran.txt").exists()


@pytest.mark.parametrize("build, driver", [(None, None), ("12.4", "no-such-libcuda.so.1")])
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_cuda_device_on_a_machine_without_cuda_is_refused_before_any_cell_runs(tmp_path, build, driver, device):
    """--device cuda on a machine without CUDA (a CPU build of torch, or a CUDA build without the
    NVIDIA driver) was found only as the engine started, after every set-up cell ran; the job now
    says why before any cell runs (exit 2), told without starting CUDA, which a set-up cell's
    CUDA_VISIBLE_DEVICES still chooses. The job runs under a wrapper that makes torch such a build,
    whatever this machine's is."""
    import subprocess

    import torch

    from helpers_export import notebook
    from lmnb.export import export_notebook

    cells = ['open("ran.txt", "w").close()', 'q = "x"', "%%lm\n{q}{gen a max_tokens=1}"]
    (tmp_path / "job.py").write_text(export_notebook(notebook(*cells), "nb.ipynb", "job.py")[0])
    (tmp_path / "rows.jsonl").write_text('{"q": "x"}\n')
    wrapper = ("import runpy, sys, torch, lmnb_engine.cuda_presence as p\n"
               f"torch.version.cuda, torch.version.hip, p.DRIVER_LIBRARY = {build!r}, None, {driver!r}\n"
               "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", wrapper, "job.py", "--input", "rows.jsonl", "--output", "out.jsonl",
                           "--device", device], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    why = (f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)" if build is None
           else f"no NVIDIA driver is installed ({driver} is not found)")
    fix = "run on a machine with an NVIDIA GPU" + (" and a CUDA build of torch" if build is None else "")
    assert (done.returncode, done.stderr.splitlines()[-1]) == (
        2, f"lmnb batch: could not start the backend (engine): ValueError: device {device!r} asked for, but {why}; "
           f"use --device cpu, or {fix}")
    assert not (tmp_path / "ran.txt").exists()


@pytest.mark.parametrize("before", [None, ""])
def test_a_job_whose_backend_fails_after_the_cells_leaves_no_results_file_it_made(tmp_path, before):
    """A backend that fails only as it loads (a checkpoint whose config.json is no JSON: the
    checks before the cells find the directory) failed the job with exit 2 and left an empty
    --output behind, which reads as a run of no rows; the file is removed again where the job made
    it, and kept where it was there before (an empty file the user made)."""
    import subprocess

    from helpers_export import notebook
    from lmnb.export import export_notebook

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    (tmp_path / "rows.jsonl").write_text('{"q": "x"}\n')
    if before is not None:
        (tmp_path / "out.jsonl").write_text(before)
    source, _ = export_notebook(notebook('q = "x"', "%%lm\n{q}{gen a max_tokens=1}"), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    done = subprocess.run([sys.executable, "job.py", "--input", "rows.jsonl", "--output", "out.jsonl", "--model",
                           "broken"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "could not start the backend (engine)" in done.stderr.splitlines()[-1]
    assert (tmp_path / "out.jsonl").exists() == (before is not None)


@pytest.mark.parametrize("options, values", [([], {"temperature": 0.5, "n": 2}),
                                             (["--n", "0x7", "--temperature", "1"], {"temperature": 1.0, "n": 7})])
def test_parameters_read_before_the_cells_run_take_the_cells_values_and_types(options, values):
    """The options read as the job is made (the exported line) still give the parameters cell's
    values where no option is given (n, which the cell computes, as 2), and an option's text is
    read as the cell's value's type (0x7 for the int n: 7; 1 for the float temperature: 1.0)."""
    ns = {"__name__": "__main__"}  # (a job made at a script's module level: it reads its command line then)
    argv = ["--input", "rows.jsonl", "--output", "out.jsonl", *options]
    exec("import lmnb.batch\n"
         f"job = lmnb.batch.Job('', inputs=['q'], argv={argv!r}, parameters={{'temperature': 0.5, 'n': None}}, "
         "computed=['n'], options_first=True)\n"
         "read = job.args is not None\n"
         "temperature = 0.5\nn = len('ab')\n"
         "got = job.parameters(temperature=temperature, n=n)", ns)
    assert ns["read"] and vars(ns["got"]) == values and ns["job"].parameter_values == values
    assert [type(v) for v in vars(ns["got"]).values()] == [float, int]


def test_a_parameter_default_that_no_literal_writes_back_is_read_where_the_cell_runs():
    """1e999 is inf, whose repr is no literal: the job line would fail with a NameError; such a
    default is taken as computed by the cell, as one the cell computes is."""
    from helpers_export import notebook
    from lmnb.export import export_notebook

    source, _ = export_notebook(notebook(("parameters", "big = 1e999\nys = [1, 2]\nm = max(ys)"), 'q = "x"',
                                         "%%lm\n{q}{gen a max_tokens=1}"), "nb.ipynb", "job.py")
    assert ("parameters={'big': None, 'ys': [1, 2], 'm': None}, computed=['big', 'm'], options_first=True,\n"
            in source)
    compile(source, "job.py", "exec")


def test_a_misspelt_option_of_a_job_is_offered_the_closest_the_parameters_included(tmp_path):
    """A job named each unknown option with no guess; a notebook parameter's option (papermill's
    --temperature) is among those offered, and a word that is no option (junk) is offered none."""
    import subprocess

    from helpers_export import notebook
    from lmnb.export import export_notebook

    source, _ = export_notebook(notebook(("parameters", "temperature = 0.5"), 'q = "x"', "%%lm\n{q}{gen a max_tokens=1}"),
                                "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    done = subprocess.run([sys.executable, "job.py", "--input", "rows.jsonl", "--output", "out.jsonl",
                           "--temprature=0.2", "--limt", "3", "junk"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stderr.splitlines()[-1]) == (
        2, "job.py: error: unrecognized arguments: --temprature=0.2 --limt 3 junk (did you mean: --temprature → "
           "--temperature, --limt → --limit?)")


def test_a_misspelt_required_option_is_offered_its_option_not_only_said_missing(tmp_path, capsys):
    """argparse says a required option is missing before the words it did not recognize, so a job's
    --inp rows.jsonl (a prefix, which the job refuses) was told only "the following arguments are
    required: --input", where lmnb run offers the option; the words come first now, with their
    offers, and a required option that none of them names after them."""
    import subprocess

    from helpers_export import notebook
    from lmnb.batch.options import add_parameters, job_parser
    from lmnb.export import export_notebook

    source, _ = export_notebook(notebook('q = "x"', "%%lm\n{q}{gen a max_tokens=1}"), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    done = subprocess.run([sys.executable, "job.py", "--inp", "rows.jsonl", "--output", "out.jsonl"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.splitlines()[-1]) == (
        2, "job.py: error: unrecognized arguments: --inp rows.jsonl (--inp begins --input and --input-format; write "
           "the option in full)")
    parser = job_parser()
    parser.prog = "job.py"
    add_parameters(parser, {"temperature": 0.5})
    cases = {
        ("--inpt=rows.jsonl", "--outpt", "o.jsonl"):
            "unrecognized arguments: --inpt=rows.jsonl --outpt o.jsonl (did you mean: --inpt → --input, --outpt → "
            "--output?)",
        ("--output", "o.jsonl", "--temprature", "0.2"):  # (offered --temperature: --input is still missing)
            "unrecognized arguments: --temprature 0.2 (did you mean: --temprature → --temperature?); the following "
            "arguments are required: --input",
        ("--output", "o.jsonl", "junk"): "unrecognized arguments: junk; the following arguments are required: --input",
        ("--output", "o.jsonl"): "the following arguments are required: --input",
    }
    for argv, said in cases.items():
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(list(argv))
        assert (exited.value.code, capsys.readouterr().err.splitlines()[-1]) == (2, f"job.py: error: {said}"), argv
    # the parser's required options are as they were: a whole command line still parses
    args = parser.parse_args(["--input", "rows.jsonl", "--output", "o.jsonl"])
    assert (str(args.input), [a.dest for a in parser._actions if a.required]) == ("rows.jsonl", ["input", "output"])


def test_rows_whose_program_the_backend_cannot_run_are_not_blamed_on_the_input(tmp_path):
    """An exported job whose %%lm cell writes text before its gen, run on an OpenAI chat model
    (--openai m, no --completion), failed every row with the backend's refusal and ended with "fix
    the input and run again", though no input could run: the program is at fault."""
    import http.server

    from helpers_export import notebook, run_script
    from lmnb.export import export_notebook

    posts = []

    class Chat(http.server.BaseHTTPRequestHandler):  # an OpenAI-compatible server that serves model m
        def do_GET(self):
            body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "created": 0,
                                                           "owned_by": "t"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            posts.append(self.path)
            self.send_response(500)
            self.end_headers()

        def log_message(self, *args):
            pass

    source, _ = export_notebook(notebook('question = "Why?"', "%%lm --temperature 0\nQ: {question}\nA:{gen answer "
                                         "max_tokens=4}"), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"question": "b"}])
    with serve_http(Chat) as base:
        code, err, _ = run_script(tmp_path / "job.py", "--input", rows, "--output", tmp_path / "out.jsonl",
                                  "--backend", base + "/v1", "--openai", "m", "--api-key", "k", "--no-progress",
                                  model="unused")
    assert code == 1 and posts == []  # (refused before any request: the server is not at fault either)
    assert [r["status"] for r in read_results(tmp_path / "out.jsonl")] == ["error", "error"]
    assert err.endswith(
        "  2 rows failed because the program cannot run on this backend, whatever the input (an OpenAI chat model "
        "can only generate at the start of an assistant message (s += assistant(gen(...)); in a %%lm cell "
        "{assistant}{gen x}{/assistant}); to fill text and several gens inside one reply use "
        "@function(num_api_spec_tokens=N), run without stream=True (a %%lm cell cannot: write the program in a "
        "Python cell as an @lmnb.function(num_api_spec_tokens=N) and call its .run()), or use a completion model "
        "(OpenAI(..., is_chat_model=False); in a notebook %lm connect URL --openai MODEL --completion)); change the notebook as that says and export it "
        "again, or change the backend (the job's --backend, --openai MODEL, --completion, --continue-final-message); "
        "then run with --retry-errors to rerun the failed rows (rows already done are kept)\n"), err
    assert "fix the input" not in err


def test_rows_the_backend_cannot_run_are_named_beside_rows_that_failed_otherwise(tmp_path, capsys):
    from lmnb.backend.base import BackendCannotRun

    def picky(prompt, params):
        if "chat" in prompt.text:
            raise BackendCannotRun("select() needs prompt logprobs")
        return reply(prompt, params)

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "chat"}, {"question": "boom"}, {"question": "ok"}])
    assert run_job(tmp_path, "--input", rows, backend=ScriptedBackend(picky)) == 1
    assert capsys.readouterr().err.endswith(
        "  1 row failed because the program cannot run on this backend, whatever the input (select() needs prompt "
        "logprobs); change the notebook as that says and export it again, or change the backend (the job's "
        "--backend, --openai MODEL, --completion, --continue-final-message); then run with --retry-errors to rerun the "
        'failed rows (rows already done are kept)\n  other rows with "status": "error" or "bad_input" say why in "error"\n')


def test_rows_that_failed_otherwise_are_named_beside_the_unreachable_ones(tmp_path, capsys):
    from lmnb.backend.base import BackendUnreachable

    def flaky(prompt, params):
        if "down" in prompt.text:
            raise BackendUnreachable("POST http://h:1/generate: nothing answers at http://h:1")
        return reply(prompt, params)

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "down"}, {"question": "boom"}, {"question": "ok"},
                                                {"other": 1}])
    assert run_job(tmp_path, "--input", rows, backend=ScriptedBackend(flaky)) == 1
    assert capsys.readouterr().err.endswith(
        "  1 row failed because the backend could not be reached (POST http://h:1/generate: nothing answers at "
        "http://h:1); once it answers, run the same command again with --retry-errors to rerun the failed rows (rows "
        'already done are kept)\n  other rows with "status": "error" or "bad_input" say why in "error"\n')


def test_a_json_line_cut_short_names_the_column_where_it_ends(tmp_path):
    """A line cut off after a comma, the usual broken row, was reported "at column 1": its line
    break made JSON's error fall on a second line. '{"question": "a",' is 17 characters, so the
    property name JSON expects is missing at column 18; the same with a CRLF line break."""
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b'{"question": "a",\n{"question": "a",\r\n{"question": x}\n')
    expected = "invalid JSON: Expecting property name enclosed in double quotes at column 18"
    assert [r.error for r in read_rows(rows)] == [
        f"line 1: {expected}", f"line 2: {expected}", "line 3: invalid JSON: Expecting value at column 14"]


def test_csv_rows_with_wrong_column_counts_are_reported_with_line_numbers(tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text('question,id\n"multi\nline",1\nonly-one\nc,3,extra\n\nd,4\n')
    got = [(r.index, r.line, r.fields, r.error) for r in read_rows(rows)]
    assert got == [
        (0, 2, {"question": "multi\nline", "id": "1"}, None),
        (1, 4, None, "line 4: 1 values for 2 columns (question, id)"),
        (2, 5, None, "line 5: 3 values for 2 columns (question, id)"),
        (3, 7, {"question": "d", "id": "4"}, None),
    ]
    with pytest.raises(InputError, match="header"):
        list(read_rows(write_rows(tmp_path / "empty.csv", [])))
    (tmp_path / "rows.txt").write_text("question\nq\n")  # (a file there: a missing one is named as missing first)
    with pytest.raises(InputError, match="--input-format"):
        list(read_rows(tmp_path / "rows.txt"))


def test_id_field_keys_rows_so_reordered_input_is_still_skipped(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [{"id": "a", "question": "x"}, {"id": "b", "question": "y"},
                                                {"id": "a", "question": "z"}, {"question": "w"}])
    assert run_job(tmp_path, "--input", rows, "--id-field", "id") == 1
    results = read_results(tmp_path / "out.jsonl")
    assert {r["id"]: r["variables"]["answer"] for r in results if r["status"] == "ok"} == {"a": "X", "b": "Y"}
    bad = {r["row"]: r["error"] for r in results if r["status"] == "bad_input"}
    assert bad == {2: "line 3: id 'a' appears again (first on line 1); ids must be unique",
                   3: "line 4: no 'id' field (--id-field id)"}
    write_rows(rows, [{"id": "c", "question": "v"}, {"id": "b", "question": "y"}, {"id": "a", "question": "x"}])
    backend = ScriptedBackend(reply)
    run_job(tmp_path, "--input", rows, "--id-field", "id", backend=backend)
    assert [c for c in backend.calls if c[0] == "generate"][0][1][0].text.endswith("Q: v\nA:")
    assert len([c for c in backend.calls if c[0] == "generate"]) == 1
    with pytest.raises(StoreError, match="--id-field"):
        ResultStore(tmp_path / "out.jsonl").open()


def test_an_id_field_that_no_row_has_is_refused_before_any_row_runs(tmp_path, capsys):
    """A misspelt --id-field made every row a bad_input record, with a stderr line per row (1003
    lines for 1000 rows), and exit 1, as if the input were wrong."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"key": i, "question": f"q{i}"} for i in range(50)] + [[1]])
    assert run_job(tmp_path, "--input", rows, "--id-field", "kye") == 2
    assert capsys.readouterr().err == (
        "lmnb batch: --id-field kye: no input row has a field 'kye' (did you mean 'key'?); the rows' fields: 'key', "
        "'question'. Give the field that holds each row's id, or leave --id-field out to key rows by their "
        "position\n")
    assert not (tmp_path / "out.jsonl").exists()
    rows = write_rows(tmp_path / "rows.jsonl", [{"key": "a", "question": "x"}, {"question": "y"}])
    assert run_job(tmp_path, "--input", rows, "--id-field", "key") == 1  # one row has it: the other is bad input
    assert [r["status"] for r in sorted(read_results(tmp_path / "out.jsonl"), key=lambda r: r["row"])] == [
        "ok", "bad_input"]


def test_a_second_run_on_the_same_output_is_refused_while_one_is_writing(tmp_path):
    first = ResultStore(tmp_path / "out.jsonl")
    first.open()
    try:
        with pytest.raises(StoreError, match="another run is writing"):
            ResultStore(tmp_path / "out.jsonl").open()
    finally:
        first.close()
    second = ResultStore(tmp_path / "out.jsonl")
    second.open()
    second.write({"row": 0, "status": "ok"})
    with pytest.raises(StoreError, match="not written twice"):
        second.write({"row": 0, "status": "ok"})
    second.close()
    assert json.loads((tmp_path / "out.jsonl").read_text()) == {"row": 0, "status": "ok"}


def test_two_runs_writing_to_a_device_are_not_refused_as_writing_one_file():
    """A lock on /dev/null is one lock for every process that opens it: two `lmnb run -o /dev/null`
    (or jobs with --output /dev/null) at once, run for their exit status, had the second refused
    with "another run is writing /dev/null"; no run takes a lock on a file that is no regular file."""
    from lmnb.output_paths import lock_output

    first = lock_output(Path(os.devnull))
    try:
        os.close(lock_output(Path(os.devnull)))
    finally:
        os.close(first)


def test_parameters_are_options_typed_like_their_defaults():
    job = Job("", ["q"], argv=["--input", "x.jsonl", "--output", "y.jsonl", "--max-len", "3", "--greedy", "false",
                               "--labels", "['a', 'b']", "--param-limit", "7"])
    values = job.parameters(max_len=8, greedy=True, labels=None, style="terse", limit=1)
    assert vars(values) == {"max_len": 3, "greedy": False, "labels": ["a", "b"], "style": "terse", "limit": 7}
    assert job.args.limit is None  # a parameter named like a job option gets --param-NAME


@pytest.mark.parametrize("option, text, message", [
    ("--limit", "abc", "argument --limit: expected a whole number, got 'abc'"),
    ("--num-threads", "1.5", "argument --num-threads: expected a whole number, got '1.5'"),
    ("--num-threads", "0", "argument --num-threads: must be at least 1, got 0"),
    # int() took these as 4 and 10 (U+FF14 is a fullwidth 4, U+0661 U+0660 Arabic-Indic 1 and 0)
    ("--num-threads", "\uff14", "argument --num-threads: expected a whole number, got '\uff14'; write it with the "
                                "digits 0-9 alone (no _, no other script's digits): 4"),
    ("--limit", "\u0661\u0660", "argument --limit: expected a whole number, got '\u0661\u0660'; write it with the "
                                 "digits 0-9 alone (no _, no other script's digits): 10"),
    ("--max-total-tokens", "4_096", "argument --max-total-tokens: must be the KV pool's size as a whole number of "
                                    "tokens (e.g. 4096), got '4_096'; write it with the digits 0-9 alone (no _, no other "
                                    "script's digits): 4096"),
    # (argparse's "invalid int value: 'abc'", as lmnb serve's and %lm load's: test_server_cli, test_export)
    ("--max-total-tokens", "abc",
     "argument --max-total-tokens: must be the KV pool's size as a whole number of tokens (e.g. 4096), got 'abc'"),
])
def test_a_count_option_that_is_no_whole_number_is_named_in_words(capsys, option, text, message):
    """argparse named the type function instead: "invalid _count value: 'abc'"."""
    job = Job("", ["q"], argv=["--input", "x.jsonl", "--output", "y.jsonl", option, text])
    with pytest.raises(SystemExit) as e:
        job.parameters()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(message) and "_count" not in err and "_positive_int" not in err


@pytest.mark.parametrize("words, option", [
    # the same value as the default twice: the namespace already held 16 before either was read
    (["--num-threads", "16", "--num-threads", "2"], "--num-threads"),
    (["--retry-errors", "--limit", "3", "--retry-errors"], "--retry-errors"),
    (["--completion", "--completion"], "--completion"),
    (["--backend", "engine", "--backend", "http://h:9"], "--backend"),
    (["--style", "terse", "--style", "long"], "--style"),  # a notebook parameter's option
])
def test_a_job_option_given_twice_is_refused(capsys, words, option):
    """An exported job kept the last of a repeated option silently (``--num-threads 16 --num-threads 2``
    ran 2 threads); a notebook's ``%%lm`` line already refused a repeat."""
    job = Job("", ["q"], argv=["--input", "x.jsonl", "--output", "y.jsonl", *words])
    with pytest.raises(SystemExit) as e:
        job.parameters(style="plain")
    assert e.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"error: {option} is given twice; give it once")


def test_a_job_parser_reads_an_option_once_on_each_command_line():
    """The repeat is counted per command line: a parser that read ``--num-threads`` reads it again."""
    from lmnb.batch.options import job_parser

    parser = job_parser()
    for threads in ("2", "3"):
        args = parser.parse_args(["--input", "x", "--output", "y.jsonl", "--num-threads", threads, "--retry-errors"])
        assert (args.num_threads, args.retry_errors) == (int(threads), True)


def test_a_rerun_with_other_parameters_or_backend_is_refused_not_mixed_into_the_file(tmp_path, capsys):
    """Rows 0-1 were answered for one --style, the rerun would have answered rows 2-3 for another
    and reported '2 already done'; each record now says what it was run with."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(4)])

    def job_with(*options) -> int:
        job = Job("t", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                           "--no-progress", *options])
        job.parameters(style="terse")
        return job.run(run_row, programs=[echo], backend=ScriptedBackend(reply))

    assert job_with("--style", "long", "--limit", "2") == 0
    before = (tmp_path / "out.jsonl").read_bytes()
    assert job_with("--style", "short") == 2
    assert "parameter style: 'long' there, 'short' now" in capsys.readouterr().err
    assert job_with("--style", "long", "--model", "/other") == 2
    assert "--model: None there, '/other' now" in capsys.readouterr().err
    assert (tmp_path / "out.jsonl").read_bytes() == before
    assert job_with("--style", "long") == 0  # the same settings resume
    results = read_results(tmp_path / "out.jsonl")
    assert sorted(r["row"] for r in results) == [0, 1, 2, 3]
    assert all(r["settings"]["parameter style"] == "long" and r["settings"]["--backend"] == "engine" for r in results)


def test_a_setting_one_run_has_and_the_other_has_not_is_said_not_set_not_none(tmp_path, capsys):
    """A parameter the notebook gained after the first run (its records have no such setting), or
    lost since, was said as "parameter style: None there, 'terse' now", as if it had been None."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])

    def job_with(**parameters) -> int:
        job = Job("t", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                           "--no-progress", "--limit", "1"])
        job.parameters(**parameters)
        return job.run(run_row, programs=[echo], backend=ScriptedBackend(reply))

    assert job_with(seed=3) == 0
    assert job_with(style="terse") == 2
    assert ("holds rows run with other settings (parameter seed: 3 there, not set now; parameter style: not set "
            "there, 'terse' now); rerun with the same options") in capsys.readouterr().err


def test_an_input_field_that_is_a_parameter_is_refused_before_any_row_runs(tmp_path, capsys):
    """The export of 01-quickstart makes `person` an option (--person), not a row field: rows
    {"person": "Corin"} all ran with the default "Arvel" and were written as ok, without a word."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q0", "style": "long"}, {"question": "q1"}])
    out = tmp_path / "out.jsonl"
    job = Job("t", ["question"], argv=["--input", str(rows), "--output", str(out), "--no-progress"])
    job.parameters(style="terse", limit=3)
    assert job.run(run_row, programs=[echo], backend=ScriptedBackend(reply)) == 2
    assert capsys.readouterr().err == (
        "lmnb batch: the input rows have the field 'style' (--style 'terse'), but it is the notebook's parameter, "
        "set once for the whole job by its option, not read from each row; to read it from the rows, export again "
        "with --inputs question,style; to use the option, leave the field out of the input\n")
    assert not out.exists()
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q0", "style": "long", "limit": 1}])
    job = Job("t", ["question"], argv=["--input", str(rows), "--output", str(out), "--no-progress"])
    job.parameters(style="terse", limit=3)  # (--limit is the job's own option: the parameter's is --param-limit)
    assert job.run(run_row, programs=[echo], backend=ScriptedBackend(reply)) == 2
    assert "have the fields 'style' (--style 'terse'), 'limit' (--param-limit 3), but they are" in capsys.readouterr().err
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q0", "other": 1}])  # other fields are no parameter
    job = Job("t", ["question"], argv=["--input", str(rows), "--output", str(out), "--no-progress"])
    job.parameters(style="terse")
    assert job.run(run_row, programs=[echo], backend=ScriptedBackend(reply)) == 0
    assert [r["variables"]["answer"] for r in read_results(out)] == ["Q0"]


def test_output_that_is_the_input_file_is_refused(tmp_path, capsys):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(rows), "--no-progress"])
    assert job.run(run_row, backend=ScriptedBackend(reply)) == 2
    assert "is the input file" in capsys.readouterr().err
    assert read_results(rows) == [{"question": "q"}]


PIPED_JOB = '''
import sys
sys.path.insert(0, {tests!r})
import lmnb
from helpers_lang import ScriptedBackend
from lmnb.batch import Job

@lmnb.function
def echo(s, question):
    s += "Q: " + question + "\\nA:" + lmnb.gen("answer", max_tokens=4)

def run_row(question):
    state = echo.run(question, temperature=0)
    print(question + ":" + "x" * 100_000 + state["answer"])  # more than a pipe holds: the reader paces it

raise SystemExit(Job("piped", ["question"]).run(run_row, programs=[echo], backend=ScriptedBackend()))
'''


def test_a_closed_output_pipe_stops_the_job_without_recording_rows_as_failed(tmp_path):
    # `job.py | head -1` recorded every row as "BrokenPipeError: [Errno 32] Broken pipe" and ran them all
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "job.py"
    script.write_text(PIPED_JOB.format(tests=str(Path(__file__).parent)), encoding="utf-8")
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(40)])
    argv = [sys.executable, str(script), "--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
            "--no-progress", "--num-threads", "1"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:  # (closes stderr)
        assert proc.stdout.readline().startswith(b"q0:")  # head -1
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err and "pipe that closed" in err, err
    done = read_results(tmp_path / "out.jsonl")
    assert 1 <= len(done) < 40 and all(r["status"] == "ok" for r in done), done
    # the rest on a rerun, each row once
    rerun = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    assert rerun.returncode == 0, rerun.stderr.decode()
    results = read_results(tmp_path / "out.jsonl")
    assert sorted(r["row"] for r in results) == list(range(40)) and all(r["status"] == "ok" for r in results)


def test_with_several_threads_each_rows_printed_lines_come_out_together(tmp_path, capfd):
    # rows running together printed into each other's lines ("q0 startq1 start\n\n...")
    import threading
    import time

    started = threading.Barrier(4, timeout=30)  # four rows are inside run_row at once

    def printing_row(question):
        print(question, "start")
        started.wait()
        time.sleep(0.01)
        print(question, "end")

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(8)])
    job = Job("printing", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                              "--no-progress", "--num-threads", "4"])
    assert job.run(printing_row, programs=[], backend=ScriptedBackend(reply)) == 0
    lines = capfd.readouterr().out.splitlines()
    assert sorted(lines) == sorted(f"q{i} {w}" for i in range(8) for w in ("start", "end"))
    assert all(lines[k].split()[0] == lines[k + 1].split()[0] for k in range(0, 16, 2)), lines


def test_with_several_threads_each_rows_stderr_comes_out_together_and_a_rows_last_line_is_ended(tmp_path, capfd):
    # stderr was not grouped (warnings and logs of rows running together interleaved), and a row
    # whose last print had no newline ran into the next row's first line ("q0 endq1 start")
    import sys
    import threading
    import time

    started = threading.Barrier(4, timeout=30)

    def printing_row(question):
        print(question, "start", file=sys.stderr)
        print(question, "start")
        started.wait()
        time.sleep(0.01)
        print(question, "end", file=sys.stderr)
        print(question, "end", end="")

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(8)])
    job = Job("printing", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                              "--no-progress", "--num-threads", "4"])
    assert job.run(printing_row, programs=[], backend=ScriptedBackend(reply)) == 0
    captured = capfd.readouterr()
    want = sorted(f"q{i} {w}" for i in range(8) for w in ("start", "end"))
    out = captured.out.splitlines()
    err = [line for line in captured.err.splitlines() if line.startswith("q")]  # (not the summary)
    for lines in (out, err):
        assert sorted(lines) == want
        assert all(lines[k].split()[0] == lines[k + 1].split()[0] for k in range(0, 16, 2)), lines


def terminal_lines(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: a carriage return goes back to the line's start,
    and what is written then overwrites what was there (trailing spaces left out)."""
    lines = []
    for raw in text.split("\n"):
        line = ""
        for part in raw.split("\r"):
            line = part + line[len(part):]
        lines.append(line.rstrip())
    return lines


def test_with_one_thread_the_output_has_the_inputs_order(tmp_path, monkeypatch):
    """With two rows in flight per thread, the rows one wait found done were written in the order of
    a set of futures: `--num-threads 1` wrote row 1 above row 0 at times (CI saw it). Here each wait
    returns only once every row in flight is done, as on a busy machine."""
    import concurrent.futures

    import lmnb.batch.runner as runner

    monkeypatch.setattr(runner, "wait", lambda futures, timeout, return_when: concurrent.futures.wait(futures))
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(40)])
    assert run_job(tmp_path, "--input", rows, "--num-threads", 1) == 0
    assert [r["row"] for r in read_results(tmp_path / "out.jsonl")] == list(range(40))


@pytest.mark.parametrize("threads", ["1", "3"])
def test_a_rows_printed_lines_are_on_lines_of_their_own_above_the_progress_bar(tmp_path, monkeypatch, threads):
    """On a terminal (stdout and stderr one tty), a row's print ran into the progress bar's line:
    "out.jsonl:   0%|...| 0/3 [00:00<?, ?row/s]row says q0". Each printed line is now on a line of
    its own (the bar cleared and drawn again below, as tqdm.write does), a line printed in two
    pieces is one line, and one left unended is ended with its row."""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def printing_row(question):
        print("row says", question)
        print("then", end="")
        print(" more", question)
        print("unended", question, end="")

    tty = Terminal()
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setattr(sys, "stderr", tty)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    job = Job("printing", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                              "--num-threads", threads])
    assert job.run(printing_row, programs=[], backend=ScriptedBackend(reply)) == 0
    lines = terminal_lines(tty.getvalue())
    for i in range(3):
        assert {f"row says q{i}", f"then more q{i}", f"unended q{i}"} <= set(lines), lines
    bars = [line for line in lines if line.startswith("out.jsonl: ")]
    assert bars and bars[-1].startswith("out.jsonl: 100%|") and bars[-1].endswith("row/s]"), lines  # (the bar stays)


def test_a_progress_bar_into_a_log_file_is_whole_lines_ending_with_the_row_count(tmp_path, monkeypatch):
    """`job.py ... > job.log 2>&1` (nohup, CI) got the terminal's bar: a frame per draw after a
    carriage return, and the bar cleared and drawn again around every line a row printed, all
    kept in the file. Into a file the bar is whole lines now: the first, at most one every 30 s,
    and the last, which counts the rows the input holds; the rows' lines stay whole."""
    def printing_row(question):
        print("row says", question)
        print("then", end="")
        print(" more", question)

    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    rows = [{"question": f"q{i}"} for i in range(4)]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    with open(tmp_path / "job.log", "w", encoding="utf-8") as log:
        monkeypatch.setattr(sys, "stdout", log)
        monkeypatch.setattr(sys, "stderr", log)
        job = Job("printing", ["question"], argv=["--input", str(path), "--output", str(tmp_path / "out.jsonl"),
                                                  "--num-threads", "1"])
        assert job.run(printing_row, programs=[], backend=ScriptedBackend(reply)) == 0
    monkeypatch.undo()
    text = (tmp_path / "job.log").read_text(encoding="utf-8")
    assert "\r" not in text, text
    lines = text.splitlines()
    for row in rows:
        assert {f"row says {row['question']}", f"then more {row['question']}"} <= set(lines), lines
    bars = [line for line in lines if line.startswith("out.jsonl: ")]
    assert bars[0].startswith(f"out.jsonl:   0%|          | 0/{len(rows)} ["), lines
    assert re.match(rf"out\.jsonl: 100%\|#{{10}}\| {len(rows)}/{len(rows)} \[.*row/s\]$", bars[-1]), lines
    assert lines[lines.index(bars[-1]) + 1].startswith(f"lmnb batch: {tmp_path / 'out.jsonl'}: {len(rows)} rows"), lines


def test_a_log_bars_interval_is_tqdm_mininterval_set_after_tqdm_was_imported(monkeypatch):
    """TQDM_MININTERVAL set in the process (a notebook's %env, a set-up cell) after tqdm was
    imported, which tqdm reads only then: the log's bar kept tqdm's 0.1 s, a line every 0.1 s,
    where the value set was meant (and LOG_INTERVAL's 30 s where none is set)."""
    import tqdm  # noqa: F401  (imported before the variable is set)

    from lmnb import bar_stream

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv("TQDM_MININTERVAL", "45")
    bar = bar_stream.progress_bar(3, live=False)
    assert bar.mininterval == 45.0
    bar.close()
    monkeypatch.delenv("TQDM_MININTERVAL")
    bar = bar_stream.progress_bar(3, live=False)
    assert bar.mininterval == bar_stream.LOG_INTERVAL
    bar.close()


@pytest.mark.parametrize("failing", [None, "q1", "q3"])
def test_a_progress_bar_into_a_log_file_drawn_at_each_row_writes_its_last_line_once(tmp_path, monkeypatch, failing):
    """With TQDM_MININTERVAL=0 (a line at each row), the log had the last line twice: once from the
    last row's update, once from close(), its rate alone different ("4/4 [00:00<00:00, 949.70it/s]",
    then "4/4 [00:00<00:00, 669.94it/s]"). Now a line per count, 0 to the rows the input holds; a
    line that says more than the last (the errors, set after the last row's update) is still written."""
    # (as TQDM_MININTERVAL=0 does, which tqdm reads as it is imported, maybe before this test)
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    monkeypatch.setattr("lmnb.bar_stream.LOG_INTERVAL", 0.0)
    rows = [{"question": f"q{i}"} for i in range(4)]
    path = write_rows(tmp_path / "rows.jsonl", rows)

    def row(question):
        if question == failing:
            raise ValueError("no answer")

    with open(tmp_path / "job.log", "w", encoding="utf-8") as log:
        monkeypatch.setattr(sys, "stderr", log)
        job = Job("bar", ["question"], argv=["--input", str(path), "--output", str(tmp_path / "out.jsonl"),
                                             "--num-threads", "1"])
        assert job.run(row, programs=[], backend=ScriptedBackend(reply)) == (failing is not None)
    monkeypatch.undo()
    bars = [line for line in (tmp_path / "job.log").read_text(encoding="utf-8").splitlines()
            if line.startswith("out.jsonl: ")]
    assert all(a != b for a, b in zip(bars, bars[1:])), bars
    counts = [re.search(r"\| (\d+)/4 \[", line).group(1) for line in bars]
    # the errors set after the last update (a bar shows them from its next line: the last row's own,
    # or one written in the same wait as a later row, as the pool returns them in any order) are
    # close()'s line of its own
    late = failing is not None and "errors=1" not in bars[4]
    assert counts == list("01234") + ["4"] * late, bars
    assert bars[-1].endswith("]") and ("errors=1" in bars[-1]) == (failing is not None), bars


@pytest.mark.parametrize("lines, columns", [(24, 80), (0, 80), (0, 0)], ids=["24x80", "0 lines", "0x0"])
def test_a_progress_bar_on_a_terminal_is_drawn_in_place(tmp_path, lines, columns):
    """A job's stderr a terminal (a pty here) still gets tqdm's bar drawn in place, frame over
    frame after a carriage return, and ends on the row count. A terminal that gives its size as 0
    (does not know it: ``stty rows 0``, a new pty) got no bar at all (tqdm took 0 lines for -1):
    its size is taken for 80 columns and 24 lines, as shutil.get_terminal_size and rich take it,
    so the bar is as wide as on an 80-column terminal, 79 characters (tqdm leaves the last one)."""
    import fcntl
    import pty
    import struct
    import subprocess
    import termios

    script = tmp_path / "job.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from helpers_lang import ScriptedBackend
from lmnb.batch import Job

raise SystemExit(Job("tty", ["question"]).run(lambda question: None, backend=ScriptedBackend()))
""", encoding="utf-8")
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))  # (a new pty's is 0 by 0)
    environment = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, str(script), "--input", str(rows), "--output", str(tmp_path / "out.jsonl")],
                            stdout=subprocess.DEVNULL, stderr=follower, env=environment)
    os.close(follower)  # (so that the reads below end, with EIO, once the job's end closed the terminal)
    shown = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # (EIO: no process holds the terminal any more)
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
        assert proc.wait(timeout=120) == 0, shown
    text = shown.decode("utf-8", "replace")
    assert "\rout.jsonl:   0%|" in text and "\rout.jsonl: 100%|" in text and "| 3/3 [" in text, text
    frames = [frame for frame in text.split("\r") if frame.startswith("out.jsonl:")]
    assert {len(frame) for frame in frames} == {79}, frames


@pytest.mark.parametrize("environment, shape", [({}, (79, 23)), ({"COLUMNS": "50", "LINES": "0"}, (49, 23)),
                                                ({"COLUMNS": "x", "LINES": "30"}, (79, 29))])
def test_a_terminal_of_unknown_size_is_taken_for_columns_and_lines_else_80_by_24(monkeypatch, environment, shape):
    """A pty sized 0 by 0 (a size it does not know) gives the bar $COLUMNS and $LINES where they
    hold a positive number, else 80 and 24, as shutil.get_terminal_size takes them; tqdm's width
    and height are one less."""
    import pty

    from lmnb.bar_stream import screen_shape

    for name in ("COLUMNS", "LINES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    leader, follower = pty.openpty()
    with open(follower, "w") as tty:
        assert os.get_terminal_size(tty.fileno()) == (0, 0)
        assert screen_shape(tty) == shape
    os.close(leader)


def test_a_bar_in_a_kernel_takes_no_size_from_the_servers_terminal(monkeypatch):
    """A Jupyter kernel's stderr (ipykernel's OutStream: drawn in place, isatty() False) has a
    fileno() that is the terminal the server was started from: run_batch's bar, and a job's sized
    to its terminal, took that terminal's width (199 columns here) for the notebook's. They take
    $COLUMNS and $LINES, else 80 by 24, as for a terminal that does not know its size; a bar on a
    real terminal still takes that terminal's."""
    import fcntl
    import pty
    import struct
    import termios

    from lmnb.bar_stream import progress_bar

    for name in ("COLUMNS", "LINES"):
        monkeypatch.delenv(name, raising=False)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))

    class KernelStream(io.StringIO):  # (as OutStream: no terminal, but the server's terminal's fileno)
        def fileno(self):
            return follower

    try:
        for stream, shape in ((KernelStream(), (79, 23)), (open(follower, "w", closefd=False), (199, 49))):
            monkeypatch.setattr(sys, "stderr", stream)
            for dynamic in (False, True):
                bar = progress_bar(3, True, dynamic_ncols=dynamic)
                assert (bar.ncols, bar.nrows) == shape, (stream, dynamic)
                bar.close()
    finally:
        os.close(follower)
        os.close(leader)


def test_the_bar_is_drawn_in_place_on_a_terminal_and_as_lines_into_a_file_or_a_pipe(tmp_path):
    """The decision between the bar drawn in place and its lines (bar_stream.is_live): a terminal
    draws in place; a file, a pipe, a stream without isatty and a closed one get lines. (A
    notebook's stream draws in place: test_notebooks' run_batch bar is saved with its frames.)"""
    import pty

    from lmnb.bar_stream import is_live

    leader, follower = pty.openpty()
    read, write = os.pipe()
    with open(follower, "w") as tty, open(write, "w") as pipe, open(tmp_path / "log", "w") as log:
        assert is_live(tty) and not is_live(pipe) and not is_live(log)
        assert not is_live(io.StringIO()) and not is_live(object())
    assert not is_live(log)  # (closed: its isatty raises ValueError)
    os.close(leader)
    os.close(read)


def test_a_line_a_rows_thread_left_unended_before_the_row_comes_before_the_rows_lines():
    """With the bar shown and rows grouped, a thread's line left unended outside a row (kept to be
    ended) was dropped at that thread's next row end, where the row's kept text replaced it."""
    from tqdm import tqdm

    from lmnb.batch.runner import RowOutput

    out, err = io.StringIO(), io.StringIO()
    output = RowOutput(out, tqdm(total=1, file=err), group=True)
    output.write("before")
    output.begin()
    output.write("in row\n")
    output.end()
    output.close()
    assert out.getvalue() == "beforein row\n"  # (as without the bar: the row's text follows on that line)


def test_an_output_that_is_no_regular_file_is_refused_with_the_fix(tmp_path, capsys):
    """`--output /dev/stdout | jq` waited forever reading the pipe back; /dev/null took every row
    and kept none; a folder was a bare '[Errno 21] Is a directory'."""
    import os

    with pytest.raises(StoreError, match=r"^the output /dev/null is not a regular file \(a pipe, a terminal or a "
                                         r"device\); .* give a file's path \(follow it with tail -f FILE\)$"):
        ResultStore(os.devnull).open()
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    (tmp_path / "out.jsonl").mkdir()
    assert run_job(tmp_path, "--input", rows) == 2
    assert f"lmnb batch: the output {tmp_path / 'out.jsonl'} is a folder;" in capsys.readouterr().err


def test_a_json_array_file_is_refused_as_a_whole_with_the_conversion(tmp_path, capsys):
    """A rows.json holding one JSON array (json.dump(rows, f, indent=2)) became a bad_input record
    per line (10 here), and those rows were then 'done' for a rerun without --retry-errors."""
    rows = tmp_path / "rows.json"
    rows.write_text("\ufeff\n " + json.dumps([{"question": "q1"}, {"question": "q2"}], indent=2), encoding="utf-8")
    with pytest.raises(InputError, match=r"^.*rows\.json is a JSON array; the input is JSON lines, one object per "
                                         r"line: convert it with  jq -c '\.\[\]' .*rows\.json > rows\.jsonl"):
        list(read_rows(rows))
    assert run_job(tmp_path, "--input", rows) == 2
    assert "is a JSON array" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()  # no bad_input records
    assert [r.fields for r in read_rows(write_rows(tmp_path / "ok.json", [{"question": "[x"}]))] == [{"question": "[x"}]


def test_a_rerun_on_another_lmnb_model_is_refused_not_mixed_into_the_file(tmp_path, capsys, monkeypatch):
    """$LMNB_MODEL picks the engine's model when neither --model nor the notebook's %lm load does;
    the records said "--model": null whatever it was, so a rerun in a shell with another (or no)
    $LMNB_MODEL added that model's answers to the file as if they were the first run's."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(4)])
    monkeypatch.setenv("LMNB_MODEL", "/models/a")
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 0
    before = (tmp_path / "out.jsonl").read_bytes()
    assert [r["settings"]["--model"] for r in read_results(tmp_path / "out.jsonl")] == ["/models/a"] * 2
    monkeypatch.setenv("LMNB_MODEL", "/models/b")
    assert run_job(tmp_path, "--input", rows) == 2
    assert "--model: '/models/a' there, '/models/b' now" in capsys.readouterr().err
    monkeypatch.delenv("LMNB_MODEL")
    assert run_job(tmp_path, "--input", rows) == 2
    assert "--model: '/models/a' there, None now" in capsys.readouterr().err
    assert (tmp_path / "out.jsonl").read_bytes() == before
    assert run_job(tmp_path, "--input", rows, "--model", "/models/a") == 0  # the same model, named


BAR_INTO_CLOSED_PIPE_JOB = '''
import sys, threading
sys.path.insert(0, {tests!r})
import tqdm
import lmnb
from helpers_lang import ScriptedBackend
from lmnb.batch import Job

class Pipe:  # stderr, the progress bar's, into `| head`: its reader leaves once row 0 has printed
    closed = False

    def write(self, text):
        if Pipe.closed:
            raise BrokenPipeError(32, "Broken pipe")
        return len(text)

    def flush(self):
        if Pipe.closed:
            raise BrokenPipeError(32, "Broken pipe")

sys.stderr = Pipe()

@lmnb.function
def echo(s, question):
    s += "Q: " + question + "\\nA:" + lmnb.gen("answer", max_tokens=4)

def run_row(question):
    print(question + ":" + echo.run(question, temperature=0)["answer"])
    Pipe.closed = True

status = Job("piped", ["question"]).run(run_row, programs=[echo], backend=ScriptedBackend())
# what a row's thread does when it prints above the bar (and tqdm's monitor thread, and a bar's
# __del__ on a pool thread at exit): take tqdm's lock, which the main thread had kept
# (into a file: the job pointed stdout at /dev/null when the pipe closed)
with open(__file__ + ".after", "w") as after:
    writer = threading.Thread(target=tqdm.tqdm.write, args=("the bar's lock is free",), kwargs={{"file": after}})
    writer.start()
    writer.join()
raise SystemExit(status)
'''


def test_a_progress_bar_drawn_into_a_closed_pipe_leaves_no_lock_held(tmp_path):
    """`job.py ... 2>&1 | head -3` hung for good at times (rc 124 under `timeout`, no CPU): the bar
    drawn after a row was written met the closed pipe inside tqdm's refresh, which holds tqdm's
    lock and does not release it when the write raises, so a row's print above the bar (and, at
    exit, a bar's __del__ on a pool thread the interpreter joins) waited for that lock forever.
    TQDM_MININTERVAL=0 has the bar drawn at each row, so the write that fails is that one."""
    import subprocess
    from pathlib import Path

    script = tmp_path / "job.py"
    script.write_text(BAR_INTO_CLOSED_PIPE_JOB.format(tests=str(Path(__file__).parent)), encoding="utf-8")
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(5)])
    argv = [sys.executable, str(script), "--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
            "--num-threads", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TQDM_MININTERVAL": "0"})
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 141, err.decode()
    # rows 0 and 1 were in flight (two per thread) when the pipe closed; they finish, no other starts
    assert out.decode().splitlines() == ["q0:ok", "q1:ok"], err.decode()
    assert (tmp_path / "job.py.after").read_text() == "the bar's lock is free\n"
    assert [(r["row"], r["status"]) for r in read_results(tmp_path / "out.jsonl")] == [(0, "ok"), (1, "ok")]


class _ClosedPipe:
    """A stderr whose reader left after its first line (`job.py ... 2>&1 | head -1`)."""

    def __init__(self):
        self.lines = 0

    def write(self, text: str) -> int:
        if self.lines:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines += text.count("\n")
        return len(text)

    def flush(self) -> None:
        pass


def test_stderr_into_a_pipe_that_closes_stops_the_job_as_sigpipe_does(tmp_path, monkeypatch):
    """The job's own stderr lines (a bad row's message, the summary) met the closed pipe: the
    BrokenPipeError escaped Job.run as a traceback and the job exited 1, 'some rows failed'."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"other": 1}, {"other": 2}, {"question": "q"}])
    monkeypatch.setattr(sys, "stderr", _ClosedPipe())
    assert run_job(tmp_path, "--input", rows) == 141
    monkeypatch.undo()
    # the first bad row's message got through and its record was written; the rest wait for a rerun
    assert [(r["row"], r["status"]) for r in read_results(tmp_path / "out.jsonl")] == [(0, "bad_input")]
    assert run_job(tmp_path, "--input", rows) == 1
    assert sorted((r["row"], r["status"]) for r in read_results(tmp_path / "out.jsonl")) == [
        (0, "bad_input"), (1, "bad_input"), (2, "ok")]


class _FullDisk:
    """A stderr whose every write fails as a file on a full disk does (`job.py ... 2> log`)."""

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        pass


def test_a_progress_bar_that_cannot_be_written_leaves_the_rows_to_run(tmp_path, monkeypatch):
    """`2> log` on a full disk (or /dev/full) stopped the job at the progress bar's first draw,
    before any row ran, where --no-progress ran them all: the bar only shows the work, so its
    failed writes are dropped (as run_batch's are) and every row runs and is written."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    monkeypatch.setattr(sys, "stderr", _FullDisk())
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                      "--num-threads", "1"])
    assert job.run(run_row, programs=[echo], backend=ScriptedBackend(reply)) == 0
    monkeypatch.undo()
    assert sorted((r["row"], r["status"], r["variables"]) for r in read_results(tmp_path / "out.jsonl")) == [
        (i, "ok", {"answer": f"Q{i}"}) for i in range(3)]


@pytest.mark.parametrize("progress", [[], ["--no-progress"]])
def test_the_jobs_own_messages_into_a_stderr_that_cannot_be_written_neither_stop_nor_fail_it(tmp_path, monkeypatch,
                                                                                              progress):
    """`2> job.log` on a full disk (`2>/dev/full`): the summary's write raised as the job ended, so
    a job whose rows all ran ok exited 1, "rows failed" (the error printed as Job.run's message met
    the full disk again: a traceback no one saw); a job whose notebook reads no row field stopped at
    that warning, before its output was opened: no row ran. The rows and their output file are the
    work, the job's messages only tell of it: they are dropped, and the exit status is the rows'."""
    def same():
        echo.run("fixed", temperature=0).sync()

    def job(inputs, output, *options):
        return Job("", inputs, argv=["--input", str(rows), "--output", str(tmp_path / output), *progress, *options])

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q0"}, {"question": "q1"}, {"other": 2}])
    monkeypatch.setattr(sys, "stderr", _FullDisk())
    assert job([], "same.jsonl").run(same, programs=[echo], backend=ScriptedBackend(reply)) == 0  # (warning, summary)
    assert sorted((r["row"], r["status"]) for r in read_results(tmp_path / "same.jsonl")) == [
        (0, "ok"), (1, "ok"), (2, "ok")]
    # a bad row's line too; the exit status still says the bad row (1), and a refusal is still one (2)
    assert job(["question"], "out.jsonl").run(run_row, programs=[echo], backend=ScriptedBackend(reply)) == 1
    assert sorted((r["row"], r["status"]) for r in read_results(tmp_path / "out.jsonl")) == [
        (0, "ok"), (1, "ok"), (2, "bad_input")]
    assert job(["question"], "out.jsonl", "--model", "/other").run(run_row, backend=ScriptedBackend(reply)) == 2


def test_a_line_a_rows_thread_left_unended_on_a_full_stderr_does_not_fail_the_job(tmp_path, monkeypatch):
    """A thread a row started wrote a line without its line break to stderr (kept to the rows' end,
    above the progress bar); written into a full stderr then, its OSError ended a job whose rows
    were all written ok with exit 2, "could not start"."""
    import threading

    def row_with_a_thread(question):
        run_row(question)
        thread = threading.Thread(target=lambda: sys.stderr.write("partial"))
        thread.start()
        thread.join()

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(2)])
    monkeypatch.setattr(sys, "stderr", _FullDisk())
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                      "--num-threads", "1"])
    assert job.run(row_with_a_thread, programs=[echo], backend=ScriptedBackend(reply)) == 0
    monkeypatch.undo()
    assert sorted((r["row"], r["status"]) for r in read_results(tmp_path / "out.jsonl")) == [(0, "ok"), (1, "ok")]


def test_a_job_whose_stderr_is_dev_full_exits_with_its_rows_status(tmp_path):
    """The same for the script's process (`python job.py ... 2>/dev/full`): it exited 1 after
    writing every row ok, as Python does for an exception it cannot print."""
    import subprocess

    script = tmp_path / "job.py"
    script.write_text(f"""import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from helpers_lang import ScriptedBackend
from lmnb.batch import Job
from test_export_batch import echo, run_row

raise SystemExit(Job("", ["question"]).run(run_row, programs=[echo], backend=ScriptedBackend()))
""", encoding="utf-8")
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, str(script), "--input", str(rows), "--output",
                               str(tmp_path / "out.jsonl")], stderr=full, timeout=120)
    assert done.returncode == 0
    assert [r["status"] for r in read_results(tmp_path / "out.jsonl")] == ["ok"] * 3


def test_a_job_run_with_stderr_closed_writes_none_of_its_messages_to_stdout(tmp_path):
    """`python job.py ... 2>&-` (or pythonw): Python starts with sys.stderr None, and print(...,
    file=None) prints to stdout, so the job's summary (and a warning, a bad row's line) went to
    stdout, into whatever reads the rows' printed output there; they are dropped, as into a
    stderr that cannot be written, and the exit status is the rows'."""
    import os
    import subprocess

    script = tmp_path / "job.py"
    script.write_text(f"""import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from helpers_lang import ScriptedBackend
from lmnb.batch import Job
from test_export_batch import echo, run_row

raise SystemExit(Job("", ["question"]).run(run_row, programs=[echo], backend=ScriptedBackend()))
""", encoding="utf-8")
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q0"}, {"question": "q1"}, {"other": 2}])
    done = subprocess.run([sys.executable, str(script), "--input", str(rows), "--output", str(tmp_path / "out.jsonl")],
                          stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2), timeout=120)
    assert (done.returncode, done.stdout) == (1, b"")  # (the bad row: 1)
    assert sorted((r["row"], r["status"]) for r in read_results(tmp_path / "out.jsonl")) == [
        (0, "ok"), (1, "ok"), (2, "bad_input")]


def test_retry_errors_with_other_settings_is_refused_before_it_removes_the_error_records(tmp_path, capsys):
    """--retry-errors removed the failed rows' records, then the settings check refused the run:
    the file had lost its error records (and their messages) to a run that never happened."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}, {"question": "boom"}])
    assert run_job(tmp_path, "--input", rows) == 1
    before = (tmp_path / "out.jsonl").read_bytes()
    assert run_job(tmp_path, "--input", rows, "--retry-errors", "--model", "/other") == 2
    assert "--model: None there, '/other' now" in capsys.readouterr().err
    assert (tmp_path / "out.jsonl").read_bytes() == before
    assert run_job(tmp_path, "--input", rows, "--retry-errors", "--id-field", "question") == 2
    assert "holds rows written without --id-field" in capsys.readouterr().err
    assert (tmp_path / "out.jsonl").read_bytes() == before


def test_a_column_name_with_spaces_around_it_is_named_in_the_missing_field_error(tmp_path):
    """A CSV header 'id, question' names the column ' question'; the error said "missing field
    'question' (the row has id,  question)", where the space that is the whole problem hides."""
    rows = tmp_path / "rows.csv"
    rows.write_text("id, question\n1,q\n", encoding="utf-8")
    assert run_job(tmp_path, "--input", rows) == 1
    assert read_results(tmp_path / "out.jsonl")[0]["error"] == (
        "line 2: missing field 'question' (the row has id,  question); ' question' has spaces around the "
        "name: remove them from the input's column names")


def test_a_csv_field_over_128_kib_is_one_value_not_thousands_of_rows(tmp_path):
    """csv's default field limit (131072 characters) made a long document a 'malformed CSV' row,
    then read each later line of the quoted text as a row of its own: 3000 rows here, each run."""
    import csv

    text = 'line "q", more\n' * 12000  # 180000 characters, quotes and commas inside
    with open(tmp_path / "rows.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["question", "n"])
        w.writerows([["short", "1"], [text, "2"], ["after", "3"]])
    rows = list(read_rows(tmp_path / "rows.csv"))
    assert [(r.index, r.line, r.error) for r in rows] == [(0, 2, None), (1, 3, None), (2, 12004, None)]  # (the field holds 12000 line breaks)
    assert rows[1].fields == {"question": text, "n": "2"} and rows[2].fields == {"question": "after", "n": "3"}


def test_rows_from_a_pipe_are_read_and_a_folder_is_named(tmp_path):
    """`jq -c ... | job.py --input /dev/stdin --input-format jsonl` (or <(jq ...)) said 'input file
    /dev/stdin does not exist'; a folder given as --input said the same."""
    import os
    import threading

    fifo = tmp_path / "rows.pipe"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "w", encoding="utf-8") as f:
            f.write('{"question": "q0"}\n\n{"question": "q1"}\n')

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        rows = list(read_rows(fifo, "jsonl"))
    finally:  # (a reader that never opened the pipe leaves the writer waiting: open it here)
        unblock = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer.join()
        os.close(unblock)
    assert [(r.index, r.line, r.fields) for r in rows] == [(0, 1, {"question": "q0"}), (1, 3, {"question": "q1"})]
    with pytest.raises(InputError, match=r"^the input .* is a folder; give the file of the rows$"):
        read_rows(tmp_path, "jsonl")
    # (with no format given, a folder or a missing file without a suffix was told to name its format)
    with pytest.raises(InputError, match=r"^the input .* is a folder; give the file of the rows$"):
        read_rows(tmp_path)
    with pytest.raises(InputError, match=r"^input file .*/rows does not exist$"):
        read_rows(tmp_path / "rows")


def test_ctrl_c_lets_the_running_rows_finish_and_starts_no_queued_one(tmp_path, monkeypatch):
    """Ctrl-C said 'finishing the 4 rows already running' with two threads, and ran all 4 (with
    16 threads, 32): the rows queued for the pool started after it."""
    import os
    import signal
    import threading

    import lmnb.batch.runner

    stopping = threading.Event()

    class Stderr:  # the job's stderr: the stop notice releases the rows
        def write(self, text):
            if "stopping" in text:
                stopping.set()
            return len(text)

        def flush(self):
            pass

    def ctrl_c_then_wait(*args, **kwargs):  # Ctrl-C once the pool holds its window of rows
        if not stopping.is_set():
            os.kill(os.getpid(), signal.SIGINT)
        return wait(*args, **kwargs)

    from concurrent.futures import wait

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(10)])
    argv = ["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress", "--num-threads", "2"]
    monkeypatch.setattr(sys, "stderr", Stderr())
    monkeypatch.setattr(lmnb.batch.runner, "wait", ctrl_c_then_wait)
    row = lambda question: stopping.wait(30)  # noqa: E731
    assert Job("t", ["question"], argv=argv).run(row, backend=ScriptedBackend(reply)) == 130
    done = {r["row"] for r in read_results(tmp_path / "out.jsonl")}
    assert done <= {0, 1}  # the two running rows; rows 2-3 were queued
    assert Job("t", ["question"], argv=argv).run(row, backend=ScriptedBackend(reply)) == 0
    assert sorted(r["row"] for r in read_results(tmp_path / "out.jsonl")) == list(range(10))


@pytest.mark.parametrize("threads, running", [(1, "the row"), (2, "the 2 rows")])
def test_a_second_ctrl_c_stops_at_once_without_the_running_rows_and_says_so(tmp_path, monkeypatch, threads,
                                                                           running):
    """The second Ctrl-C, while rows ran Python code, ended the job with no word of it but the
    summary's "stopped early", and one row running was "the 1 rows". It now says that the job
    stops without the rows still running: they are not written, and a rerun does them."""
    import signal
    import threading

    notices, stopping, release = [], threading.Event(), threading.Event()
    everyone = threading.Barrier(threads)

    class Stderr:  # the job's stderr: the first stop notice lets the row press Ctrl-C again
        def write(self, text):
            notices.append(text)
            if "stopping;" in text:
                stopping.set()
            return len(text)

        def flush(self):
            pass

    def row(question):  # a row's Python code, still running at the second Ctrl-C
        if everyone.wait(30) == 0:
            os.kill(os.getpid(), signal.SIGINT)
            stopping.wait(30)
            os.kill(os.getpid(), signal.SIGINT)
        release.wait(30)

    def exit_(status):
        raise SystemExit(status)

    monkeypatch.setattr(sys, "stderr", Stderr())
    monkeypatch.setattr(os, "_exit", exit_)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(6)])
    argv = ["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress", "--num-threads",
            str(threads)]
    try:
        with pytest.raises(SystemExit) as stopped:
            Job("t", ["question"], argv=argv).run(row, backend=ScriptedBackend(reply))
    finally:
        release.set()
    assert stopped.value.code == 130
    err = "".join(notices)
    assert f"lmnb batch: stopping; finishing {running} already running (Ctrl-C again to stop now)\n" in err
    it = "it" if threads == 1 else "them"
    assert f"lmnb batch: stopping now, without {running} still running (a rerun does {it})\n" in err, err
    assert read_results(tmp_path / "out.jsonl") == []


@pytest.mark.parametrize("threads", [1, 2])
def test_a_ctrl_c_that_leaves_no_row_undone_ends_the_job_as_usual_and_says_so(tmp_path, capsys, threads):
    """A Ctrl-C while the last row finished ended the job with 130 and 'run the same command again
    to do the remaining rows', though every row was written and there were none left."""
    import os
    import signal

    def row(question):
        run_row(question)
        if question == "q2":  # the last row: the Ctrl-C comes while it finishes
            os.kill(os.getpid(), signal.SIGINT)

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    argv = ["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress", "--num-threads", threads]
    assert Job("t", ["question"], argv=list(map(str, argv))).run(row, backend=ScriptedBackend(reply)) == 0
    err = capsys.readouterr().err
    assert "  Ctrl-C came, but every row is written: the job is complete\n" in err and "stopped early" not in err
    assert sorted((r["row"], r["status"]) for r in read_results(tmp_path / "out.jsonl")) == [(i, "ok") for i in range(3)]


def test_a_rerun_whose_input_changed_under_done_rows_is_refused_and_writes_nothing(tmp_path, capsys):
    """Rows are keyed by position: a rerun on an edited or re-sorted input used to skip the rows at
    done positions, keeping results of other questions under them."""
    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}", "n": i} for i in range(4)])
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 0
    before = out.read_bytes()
    write_rows(rows, [{"question": "q0", "n": 0}, {"question": "changed", "n": 1}, "not an object", {"question": "q3"}])
    assert run_job(tmp_path, "--input", rows) == 2
    err = capsys.readouterr().err
    assert f"{out} holds results for other input than {rows} has now under the same keys" in err
    assert "1 row, on line 2; write to a new output file, or remove those rows' records" in err
    assert out.read_bytes() == before  # not even the new bad_input row was written
    # the same rows with their keys in another order, and a row added: the done rows are skipped
    write_rows(rows, [{"n": 0, "question": "q0"}, {"n": 1, "question": "q1"}, {"question": "q2"}])
    backend = ScriptedBackend(reply)
    assert run_job(tmp_path, "--input", rows, backend=backend) == 0
    assert [c[1][0].text for c in backend.calls if c[0] == "generate"] == ["Q: q2\nA:"]
    assert {r["row"]: r["variables"]["answer"] for r in read_results(out)} == {0: "Q0", 1: "Q1", 2: "Q2"}


def test_a_column_the_program_does_not_read_does_not_change_a_done_rows_input(tmp_path):
    """input_hash covered every column: adding one the program never reads (a gold answer for
    scoring) made every done row "other input" and the rerun was refused."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(2)])
    assert run_job(tmp_path, "--input", rows, "--limit", 1) == 0
    write_rows(rows, [{"question": "q0", "gold": "Q0"}, {"question": "q1", "gold": "Q1"}])
    backend = ScriptedBackend(reply)
    assert run_job(tmp_path, "--input", rows, backend=backend) == 0
    assert [c[1][0].text for c in backend.calls if c[0] == "generate"] == ["Q: q1\nA:"]
    write_rows(rows, [{"question": "other", "gold": "Q0"}, {"question": "q1", "gold": "Q1"}])
    assert run_job(tmp_path, "--input", rows) == 2  # the field it reads changed: refused


def test_blank_lines_in_the_results_file_are_ignored(tmp_path):
    """An editor that saved the file with an empty last line made every rerun refuse it."""
    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 0
    out.write_bytes(out.read_bytes().replace(b"\n", b"\n\n", 1) + b"\n  \n")
    backend = ScriptedBackend(reply)
    assert run_job(tmp_path, "--input", rows, backend=backend) == 0
    assert len([c for c in backend.calls if c[0] == "generate"]) == 1
    assert sorted(json.loads(line)["row"] for line in out.read_text().splitlines() if line.strip()) == [0, 1, 2]


def test_the_code_fingerprint_ignores_comments_layout_and_docstrings_but_not_code(tmp_path):
    import importlib.util

    from lmnb.batch.job import code_fingerprint

    def load(name, source):
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.run_row

    base = code_fingerprint(load("a", '"""A job."""\ndef run_row(q):\n    return q + "!"\n'))
    same = code_fingerprint(load("b", '"""Another text."""\n# a comment\n\ndef run_row( q ):\n    """Doc."""\n'
                                      '    return (q\n            + "!")  # why\n'))
    other = code_fingerprint(load("c", '"""A job."""\ndef run_row(q):\n    return q + "?"\n'))
    assert base == same and base != other and len(base) == 16
    assert code_fingerprint(eval("lambda: 0")) is None  # no file to read
    # the script is read and closed: it was left open for the garbage collector, a ResourceWarning
    # (the ones of this file only: another test's object may be collected meanwhile)
    run_row_a = load("a", '"""A job."""\ndef run_row(q):\n    return q + "!"\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        assert code_fingerprint(run_row_a) == base
    assert [str(w.message) for w in caught if str(tmp_path / "a.py") in str(w.message)] == []


def test_rows_run_by_an_edited_script_are_kept_and_counted(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "boom"}, {"question": "fine"}, {"question": "x"}])
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 1
    records = read_results(out)
    assert {r["script"] for r in records} == {code_fingerprint_of_this_file()}
    out.write_text("".join(json.dumps({**r, "script": "0123456789abcdef"}) + "\n" for r in records))
    capsys.readouterr()
    fixed = ScriptedBackend(lambda prompt, params: "OK")
    assert run_job(tmp_path, "--input", rows, "--retry-errors", backend=fixed) == 0
    assert ("lmnb batch: 1 row in " f"{out} was run by another version of this script (its code changed since) "
            "and is kept; to run every row on this version, write to a new output file") in capsys.readouterr().err  # the failed row was removed before counting
    results = by_row(read_results(out))
    assert results[0]["variables"] == {"answer": "OK"} and results[1]["variables"] == {"answer": "FINE"}
    assert results[2]["script"] == results[0]["script"] == code_fingerprint_of_this_file()
    assert results[1]["script"] == "0123456789abcdef"


def code_fingerprint_of_this_file() -> str:
    from lmnb.batch.job import code_fingerprint

    return code_fingerprint(run_row)


def test_row_copy_copies_the_containers_around_a_value_that_cannot_be_copied():
    """A module dict that a row's cells change and that holds a lock: deepcopy raised, so every row
    failed at its first line."""
    import collections
    import threading

    from lmnb.batch import row_copy

    lock, shared = threading.Lock(), [1]
    value = {"lock": lock, "items": [shared, shared], "counts": collections.defaultdict(int, a=1), "t": ([2],),
             "tags": {"x"}}
    value["self"] = value
    copied = row_copy(value)
    assert copied["lock"] is lock  # shared: it cannot be copied
    assert copied["self"] is copied and copied["items"][0] is copied["items"][1]  # cycles and sharing kept
    copied["items"][0].append(2)
    copied["counts"]["b"] += 1
    copied["t"][0].append(3)
    copied["tags"].add("y")
    assert shared == [1] and value["counts"] == {"a": 1} and value["t"] == ([2],) and value["tags"] == {"x"}
    assert copied["items"] == [[1, 2], [1, 2]] and type(copied["counts"]) is collections.defaultdict
    assert copied["counts"] == {"a": 1, "b": 1} and copied["t"] == ([2, 3],) and copied["tags"] == {"x", "y"}
    plain = {"a": [1]}
    assert row_copy(plain) == plain and row_copy(plain)["a"] is not plain["a"]


def test_a_row_with_a_huge_integer_or_deep_nesting_is_bad_input_not_a_crash(tmp_path):
    """json.loads raises ValueError (not JSONDecodeError) for an integer of over 4300 digits and
    RecursionError for arrays nested too deep: the job stopped with a traceback. The integer was
    then named in Python's words ("JSON this reader cannot hold: Exceeds the limit (4300 digits) for
    integer string conversion: value has 5000 digits"), neither its field nor its number: it is
    named as every message shows such a number (5000 ones: 1.111e+4999; 4400 twos: 2.222e+4399)."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "a", "n": ' + "1" * 5000 + '}\n{"question": "b", "n": ' + "[" * 100000
                    + "]" * 100000 + '}\n{"question": "c"}\n{"question": "d", "meta": {"ids": [1, -' + "2" * 4400
                    + ']}}\n' + "3" * 4301 + "\n")
    assert run_job(tmp_path, "--input", rows) == 1
    results = by_row(read_results(tmp_path / "out.jsonl"))
    assert [results[i]["status"] for i in range(5)] == ["bad_input", "bad_input", "ok", "bad_input", "bad_input"]
    fix = "more digits than Python reads as an integer (at most 4300); write a smaller number, or the digits as a string"
    assert results[0]["error"] == f"line 1: field 'n' holds 1.111e+4999 (an integer of 5000 digits), {fix}"
    assert results[1]["error"].startswith("line 2: JSON this reader cannot hold: maximum recursion depth exceeded")
    assert results[2]["variables"] == {"answer": "C"}
    assert results[3]["error"] == f"line 4: field 'meta' holds -2.222e+4399 (an integer of 4400 digits), {fix}"
    assert results[4]["error"] == f"line 5: the row holds 3.333e+4300 (an integer of 4301 digits), {fix}"


def test_an_id_read_from_csv_is_the_row_a_jsonl_input_gave_as_a_number(tmp_path, capsys):
    """With --id-field, JSON lines ids 1, 2 and the same table as CSV ("1", "2") were other keys:
    the rerun ran every row again and the results file held each row twice."""
    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"id": 1, "question": "a"}, {"id": 2, "question": "b"}])
    assert run_job(tmp_path, "--input", rows, "--id-field", "id") == 0
    before = out.read_bytes()
    table = tmp_path / "rows.csv"
    table.write_text("id,question\n1,a\n2,b\n3,c\n")
    backend = ScriptedBackend(reply)
    # the same rows: only the new one runs (the ids are keyed as text; the question, which the
    # program reads, is the same string either way)
    assert run_job(tmp_path, "--input", table, "--id-field", "id", backend=backend) == 0
    assert out.read_bytes().startswith(before)
    assert [c[1][0].text for c in backend.calls if c[0] == "generate"] == ["Q: c\nA:"]
    assert sorted(str(r["id"]) for r in read_results(out)) == ["1", "2", "3"]
    out.write_bytes(before)
    write_rows(rows, [{"id": 7, "question": "a"}, {"id": "7", "question": "b"}])
    assert run_job(tmp_path, "--input", rows, "--id-field", "id") == 1  # 7 and "7" in one input: one id twice
    results = read_results(out)
    assert [r["error"] for r in results if r["status"] == "bad_input"] == [
        "line 2: id '7' appears again (first on line 1); ids must be unique"]


def test_a_failed_row_whose_input_was_fixed_runs_again_without_retry_errors(tmp_path, capsys):
    """The summary says "fix the input and run again"; a rerun on the fixed input was refused
    until --retry-errors was given. A failed row whose input is the same still needs it."""
    out = tmp_path / "out.jsonl"
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "a"}\n{"question": \n{"question": "boom"}\n{"question": "boom!"}\n')
    assert run_job(tmp_path, "--input", rows) == 1
    write_rows(rows, [{"question": "a"}, {"question": "b"}, {"question": "c"}, {"question": "boom!"}])
    backend = ScriptedBackend(reply)
    assert run_job(tmp_path, "--input", rows, backend=backend) == 1
    assert sorted(c[1][0].text for c in backend.calls if c[0] == "generate") == ["Q: b\nA:", "Q: c\nA:"]
    results = by_row(read_results(out))
    assert len(read_results(out)) == 4
    assert {r: results[r].get("variables") for r in range(3)} == {0: {"answer": "A"}, 1: {"answer": "B"},
                                                                  2: {"answer": "C"}}
    assert results[3]["status"] == "error"  # (the same input: only --retry-errors runs it again)
    assert run_job(tmp_path, "--input", rows, "--retry-errors", backend=ScriptedBackend(lambda p, q: "OK")) == 0


def test_a_run_with_limit_keeps_the_bad_input_records_of_rows_it_does_not_read(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"q": 1}, {"question": "c"}, {"q": 3}])
    assert run_job(tmp_path, "--input", rows) == 1
    before = (tmp_path / "out.jsonl").read_bytes()
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 1
    assert (tmp_path / "out.jsonl").read_bytes() == before  # (row 3's record was dropped, the file rewritten)


def test_the_bad_input_record_of_a_deleted_last_line_goes_also_when_limit_equals_the_rows_left(tmp_path):
    # --limit 2 over 2 rows was taken for "rows past the limit were not read": row 2's record stayed
    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"question": "b"}, {"q": 3}])
    assert run_job(tmp_path, "--input", rows) == 1
    assert sorted((r["row"], r["status"]) for r in read_results(out)) == [(0, "ok"), (1, "ok"), (2, "bad_input")]
    write_rows(rows, [{"question": "a"}, {"question": "b"}])
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 0
    assert sorted((r["row"], r["status"]) for r in read_results(out)) == [(0, "ok"), (1, "ok")]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_that_prints_a_lone_surrogate_runs_and_prints_a_replacement_character(tmp_path, capsys, threads):
    # the stream's UTF-8 encoder raised, and the row failed with UnicodeEncodeError; in the notebook
    # (the lmnb kernel) the same print shows U+FFFD
    def printing_row(question):
        run_row(question)
        print(question + "\ud800!\ud83d\ude00")
        print("err\udc80", file=sys.stderr)

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"question": "b"}])
    job = Job("test job", ("question",), argv=["--output", str(tmp_path / "out.jsonl"), "--no-progress", "--input",
                                               str(rows), "--num-threads", str(threads)])
    assert job.run(printing_row, programs=[echo], backend=ScriptedBackend(reply)) == 0
    assert [r["status"] for r in read_results(tmp_path / "out.jsonl")] == ["ok", "ok"]
    out = capsys.readouterr()
    assert sorted(out.out.splitlines()) == ["a\ufffd!\U0001f600", "b\ufffd!\U0001f600"]
    assert out.err.count("err\ufffd\n") == 2


def test_a_bad_row_without_an_id_is_replaced_once_fixed(tmp_path):
    """With --id-field, a bad row without an id is keyed by its position; fixed, it has an id, so
    it ran, but its old bad_input record stayed beside the new one and the job exited 1 forever."""
    out = tmp_path / "out.jsonl"
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "question": "x"}\n{"question": "y"}\n{"id": "c", "question": \n'
                    '{"id": "d", "question": "w"}\n{"id": "e"}\n')
    assert run_job(tmp_path, "--input", rows, "--id-field", "id") == 1
    assert sorted(r["row"] for r in read_results(out) if r["status"] == "bad_input") == [1, 2, 4]
    before = out.read_bytes()
    assert run_job(tmp_path, "--input", rows, "--id-field", "id") == 1
    assert out.read_bytes() == before  # the same bad rows: their records stand, the file is not rewritten
    write_rows(rows, [{"id": "a", "question": "x"}, {"id": "b", "question": "y"}, {"id": "c", "question": "z"},
                      {"id": "d", "question": "w"}, {"id": "e", "question": "v"}])
    backend = ScriptedBackend(reply)
    assert run_job(tmp_path, "--input", rows, "--id-field", "id", backend=backend) == 0
    assert sorted(c[1][0].text for c in backend.calls if c[0] == "generate") == ["Q: v\nA:", "Q: y\nA:", "Q: z\nA:"]
    assert sorted((r["id"], r["status"], r["variables"]["answer"]) for r in read_results(out)) == [
        ("a", "ok", "X"), ("b", "ok", "Y"), ("c", "ok", "Z"), ("d", "ok", "W"), ("e", "ok", "V")]


def test_a_run_that_opened_the_file_just_before_a_retry_errors_run_replaced_it_writes_to_the_new_file(
        tmp_path, monkeypatch):
    """--retry-errors renames a rewritten file over the output, then drops its lock on the old one:
    a run that had opened the old file just before took that lock and appended its rows to a
    deleted file (they were lost)."""
    import os

    from lmnb.batch import store as store_module

    out = tmp_path / "out.jsonl"
    out.write_text('{"row": 0, "status": "ok"}\n{"row": 1, "status": "error"}\n')
    real_open, opened = os.open, []

    def open_then_replaced(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        # The other run's os.replace lands between this open and the lock. (os.open is module-wide:
        # only the results file's open counts, not a stray thread's.)
        if not opened and os.path.abspath(path) == str(out):
            opened.append(fd)
            (tmp_path / "new").write_text('{"row": 0, "status": "ok"}\n')
            os.replace(tmp_path / "new", out)
        return fd

    monkeypatch.setattr(store_module.os, "open", open_then_replaced)
    store = ResultStore(out)
    store.open()
    store.write({"row": 2, "status": "ok"})
    store.close()
    assert [json.loads(line)["row"] for line in out.read_text().splitlines()] == [0, 2]
    assert store.keys == {("row", 0), ("row", 2)}  # (row 1's error record was removed by the other run)


def test_retry_errors_with_changed_input_is_refused_before_it_removes_the_error_records(tmp_path, capsys):
    """The refusal of a rerun whose input changed under a done row came after --retry-errors had
    already rewritten the file without its error records."""
    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"question": "boom"}])
    assert run_job(tmp_path, "--input", rows) == 1
    before = out.read_bytes()
    write_rows(rows, [{"question": "changed"}, {"question": "fixed"}])
    assert run_job(tmp_path, "--input", rows, "--retry-errors") == 2
    assert "holds results for other input than" in capsys.readouterr().err
    assert out.read_bytes() == before
    write_rows(rows, [{"question": "a"}, {"question": "fixed"}])
    assert run_job(tmp_path, "--input", rows, "--retry-errors") == 0
    assert {r["row"]: r["variables"]["answer"] for r in read_results(out)} == {0: "A", 1: "FIXED"}


def test_the_code_fingerprint_is_the_same_under_every_python_version(tmp_path):
    """It hashed ast.dump, whose text changes between Python versions (3.12 adds type_params=[],
    3.13 leaves out empty fields): a job rerun under another Python counted every row as run by
    another version of the script. The value below came out the same under Python 3.10, 3.11,
    3.12 and 3.13."""
    import importlib.util

    from lmnb.batch.job import code_fingerprint

    path = tmp_path / "fpjob.py"
    path.write_text('"""A job."""\nclass C:\n    """Only a docstring."""\n\n\ndef run_row(q: str, *, n=2) -> str:\n'
                    '    """Doc."""\n    return f"{q!r:>{n}}" + "!"\n')
    spec = importlib.util.spec_from_file_location("fpjob", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert code_fingerprint(module.run_row) == "88aa9da6967ce1cd"


def test_a_full_disk_stops_the_job_naming_the_file_and_a_rerun_continues(tmp_path, capsys, monkeypatch):
    """The job stopped with only "lmnb batch: [Errno 28] No space left on device"."""
    import errno
    import os

    from lmnb.batch import store as store_module

    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    real_write, calls = os.write, []

    def write_until_full(fd, data):
        # os.write is the module-wide function: a thread left by another test may write to its own
        # descriptor meanwhile, so only writes to the results file count.
        if not os.path.exists(out) or not os.path.samestat(os.fstat(fd), os.stat(out)):
            return real_write(fd, data)
        calls.append(fd)
        if len(calls) < 2:
            return real_write(fd, data)
        real_write(fd, bytes(data[:10]))  # part of the line fits
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module.os, "write", write_until_full)
    assert run_job(tmp_path, "--input", rows, "--num-threads", 1) == 2
    # (rows 0 and 1 may both finish before the job writes either, and then go in either order)
    err = capsys.readouterr().err
    [failed] = re.findall(f"lmnb batch: could not write row ([01]) to {re.escape(str(out))}: No space left on "
                          "device; the rows written before it are kept: make room, then run the same command "
                          "again", err)
    written, torn = out.read_text(encoding="utf-8").splitlines()  # (the next run repairs the torn line)
    assert json.loads(written)["row"] == 1 - int(failed) and len(torn) == 10
    monkeypatch.setattr(store_module.os, "write", real_write)
    assert run_job(tmp_path, "--input", rows) == 0
    assert sorted(r["row"] for r in read_results(out)) == [0, 1, 2]


@pytest.mark.parametrize("code, reason", [
    ("ENOENT", " (its folder {folder} is there, but takes no new files)"),  # (--output /proc/o.jsonl)
    ("EACCES", ""), ("EROFS", ""),
])
def test_an_output_file_that_cannot_be_opened_is_named_with_the_fix(tmp_path, capsys, monkeypatch, code, reason):
    """--output /proc/o.jsonl (or a file where the job may not write) stopped the job with only
    "lmnb batch: [Errno 2] No such file or directory: '/proc/o.jsonl'", naming no option and no fix."""
    import errno

    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    real_open = os.open

    def refuse(path, *args, **kwargs):  # (the test may run as root, whom no permission stops)
        if os.fspath(path) == str(out):
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    assert run_job(tmp_path, "--input", rows) == 2
    why = os.strerror(getattr(errno, code)) + reason.format(folder=tmp_path)
    assert capsys.readouterr().err == (
        f"lmnb batch: cannot open the output file {out} to append the results to and read them back: {why}; give "
        "--output a path in a folder this job can write to (e.g. --output results.jsonl)\n")


@pytest.mark.parametrize("code", ["EACCES", "EIO"])
def test_an_input_file_that_cannot_be_read_is_named_with_the_fix(tmp_path, capsys, monkeypatch, code):
    """An --input the job may not read (or a read that fails) ended the job with "[Errno 13]
    Permission denied" or a traceback of OSError, naming no option and no fix."""
    import errno

    from lmnb.batch import inputs

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])

    def refuse(path, *args, **kwargs):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), os.fspath(path))

    monkeypatch.setattr(inputs, "open", refuse, raising=False)  # (the module's open, not the builtin)
    assert run_job(tmp_path, "--input", rows) == 2
    assert capsys.readouterr().err == (f"lmnb batch: cannot read the input file {rows}: "
                                       f"{os.strerror(getattr(errno, code))}; give --input a file this job can read\n")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_retry_that_cannot_write_the_output_anew_says_so_and_keeps_the_file(tmp_path, capsys, monkeypatch):
    """--retry-errors writes the file anew beside it (FILE.tmp): in a folder that takes no new
    file, the job stopped with "[Errno 13] Permission denied: '.../out.jsonl.tmp'"."""
    import builtins
    import errno

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "boom"}, {"question": "b"}])
    out = tmp_path / "out.jsonl"
    assert run_job(tmp_path, "--input", rows) == 1
    before = out.read_bytes()
    real_open = builtins.open

    def refuse(path, *args, **kwargs):
        if os.fspath(path).endswith(".tmp"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refuse)
    capsys.readouterr()
    assert run_job(tmp_path, "--input", rows, "--retry-errors") == 2
    assert capsys.readouterr().err == (
        f"lmnb batch: could not write the output file {out} anew without the records of the rows to run again "
        f"(--retry-errors, or rows whose input changed): Permission denied ({out}.tmp); the file is as it was: "
        "give --output a file in a folder this job can write to, or make room\n")
    assert out.read_bytes() == before


def test_a_whole_last_record_without_its_line_break_is_kept_not_run_again(tmp_path, capsys):
    """An editor (or "\\n".join) left out the file's last line break: the whole record on that line
    was cut off as one a killed run was writing, and its row ran again."""
    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 0
    edited = out.read_bytes().rstrip(b"\n")
    out.write_bytes(edited)
    capsys.readouterr()
    backend = ScriptedBackend(reply)
    assert run_job(tmp_path, "--input", rows, backend=backend) == 0
    assert [c[1][0].text for c in backend.calls if c[0] == "generate"] == ["Q: q2\nA:"]
    assert "incomplete" not in capsys.readouterr().err
    assert out.read_bytes().startswith(edited + b"\n")
    assert sorted(r["row"] for r in read_results(out)) == [0, 1, 2]
    out.write_bytes(out.read_bytes() + b"  ")  # (spaces after the last line break: blank, like a blank line)
    assert run_job(tmp_path, "--input", rows) == 0
    assert sorted(r["row"] for r in read_results(out)) == [0, 1, 2]


def test_row_copy_copies_the_list_in_a_namedtuple_beside_a_value_that_cannot_be_copied():
    """A namedtuple (a tuple subclass) was shared whole when deepcopy failed: a row that appended
    to its list changed the next row's starting value."""
    import collections
    import threading

    from lmnb.batch import row_copy

    Setup = collections.namedtuple("Setup", "examples lock")
    lock = threading.Lock()
    value = {"setup": Setup(["a"], lock)}
    copied = row_copy(value)
    copied["setup"].examples.append("b")
    assert value == {"setup": Setup(["a"], lock)}
    assert type(copied["setup"]) is Setup and copied["setup"] == Setup(["a", "b"], lock)


def test_a_csv_appended_with_its_header_does_not_run_the_header_as_a_row(tmp_path):
    """cat more.csv >> rows.csv: the second header ran as a row whose question was "question"."""
    rows = tmp_path / "rows.csv"
    rows.write_text("question,n\na,1\nquestion,n\nb,2\n")
    assert run_job(tmp_path, "--input", rows) == 1
    results = by_row(read_results(tmp_path / "out.jsonl"))
    assert results[1] == {**results[1], "status": "bad_input",
                          "error": "line 3: the header again (a file appended with its header?); remove the line"}
    assert results[0]["variables"] == {"answer": "A"} and results[2]["variables"] == {"answer": "B"}


def test_retry_errors_on_an_output_that_is_a_symbolic_link_rewrites_the_file_it_points_to(tmp_path):
    """The rewritten file replaced the link itself: the file it pointed to (on a shared disk, say)
    kept the old error records and never got the rerun's rows."""
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "results.jsonl"
    (tmp_path / "out.jsonl").symlink_to(target)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"question": "boom"}, {"question": "c"}])
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 1
    fixed = ScriptedBackend(lambda prompt, params: "OK")
    assert run_job(tmp_path, "--input", rows, "--retry-errors", backend=fixed) == 0
    assert (tmp_path / "out.jsonl").is_symlink()
    assert {r["row"]: r["variables"]["answer"] for r in read_results(target)} == {0: "A", 1: "OK", 2: "OK"}
    assert sorted(p.name for p in shared.iterdir()) == ["results.jsonl"]


def test_a_results_file_holding_a_row_twice_is_refused_not_counted_twice(tmp_path, capsys):
    """Two results files joined (cat a.jsonl b.jsonl > out.jsonl): a row in both was counted twice
    ("4 rows" for 3) and the rerun went on as if the file were one run's results."""
    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 0
    first = out.read_bytes()
    out.write_bytes(first + first.splitlines(keepends=True)[0])
    joined = out.read_bytes()
    capsys.readouterr()
    assert run_job(tmp_path, "--input", rows) == 2
    assert capsys.readouterr().err == (
        f"lmnb batch: {out} holds two records of row {json.loads(first.splitlines()[0])['row']}, so it is not one "
        "run's results (two files joined?); keep one record of each row, or write to a new output file\n")
    assert out.read_bytes() == joined


def test_retry_errors_keeps_the_results_files_permissions(tmp_path):
    """The rewritten file was created with the default mode: a results file made private (0600)
    became readable by everyone."""
    import os
    import stat

    out = tmp_path / "out.jsonl"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "a"}, {"question": "boom"}])
    assert run_job(tmp_path, "--input", rows) == 1
    os.chmod(out, 0o600)
    fixed = ScriptedBackend(lambda prompt, params: "OK")
    assert run_job(tmp_path, "--input", rows, "--retry-errors", backend=fixed) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert {r["row"]: r["status"] for r in read_results(out)} == {0: "ok", 1: "ok"}


def test_a_done_row_the_input_cannot_read_now_is_named_with_its_error(tmp_path, capsys):
    """A row appended to an input without a last line break glued itself to the done last row: the
    refusal said only "other input" and to write to a new output file."""
    out = tmp_path / "out.jsonl"
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "a"}\n{"question": "b"}')
    assert run_job(tmp_path, "--input", rows) == 0
    before = out.read_bytes()
    with open(rows, "a") as f:
        f.write('{"question": "c"}\n')
    capsys.readouterr()
    assert run_job(tmp_path, "--input", rows) == 2
    assert capsys.readouterr().err.endswith(
        "1 row, on line 2; the input cannot be read there now: line 2: invalid JSON: Extra data at column 18; "
        "fix the input and run again\n")
    assert out.read_bytes() == before


def test_a_results_line_json_cannot_hold_is_refused_with_its_line_number(tmp_path, capsys):
    """A hand-edited line with an integer of over 4300 digits stopped the job with a ValueError traceback."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    out = tmp_path / "out.jsonl"
    content = '{"row": 0, "status": "ok"}\n{"row": 1, "n": ' + "1" * 5000 + "}\n"
    out.write_text(content)
    assert run_job(tmp_path, "--input", rows) == 2
    assert f"{out} line 2 is not a result record of this job" in capsys.readouterr().err
    assert out.read_text() == content


@pytest.mark.parametrize("fields, said", [
    ('"status": "ok", "settings": "x"', 'its "settings" is "x", not an object'),
    ('"status": "ok", "settings": [1]', 'its "settings" is [1], not an object'),
    ('"status": "ok", "settings": 0', 'its "settings" is 0, not an object'),
    ('"status": ["ok"]', 'its "status" is ["ok"], not "ok", "error" or "bad_input"'),
    ('"status": {"ok": 1}', 'its "status" is {"ok": 1}, not "ok", "error" or "bad_input"'),
    ('"status": "ok", "input_hash": 5', 'its "input_hash" is 5, not a string'),
    ('"status": "ok", "input_hash": null', 'its "input_hash" is null, not a string'),
    ('"status": "bad_input"', 'it is a "bad_input" record with no "error"'),
    ('"status": "bad_input", "error": ["x"]', 'its "error" is ["x"], not a string'),
])
@pytest.mark.parametrize("last", [False, True])
def test_a_results_line_whose_fields_are_not_the_jobs_types_is_refused_with_its_line_number(tmp_path, capsys,
                                                                                            fields, said, last):
    """A hand-edited record whose "settings" is no object, or whose "status" is no string, stopped
    the job with a traceback (AttributeError: 'str' object has no attribute 'get'; TypeError:
    unhashable type), before the set-up cells ran too (the early settings check, which now leaves
    the line to open's refusal). A bad_input record without its "error" was said as "lmnb batch:
    rows.jsonl None" and counted bad input again, and an "input_hash" that is no string let a row
    whose input changed count as done. As the last line without its line break, it is refused and
    left, not cut off as a record a killed run was writing (no cut-off record is JSON)."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    out = tmp_path / "out.jsonl"
    content = '{"row": 0, "status": "ok"}\n{"row": 1, ' + fields + "}" + ("" if last else "\n")
    out.write_text(content)
    ResultStore(out, None, {"--model": None}).check_before_setup()  # (raises nothing: left to open)
    assert run_job(tmp_path, "--input", rows) == 2
    assert (f"lmnb batch: {out} line 2 is not a result record of this job ({said}: it was changed by something "
            "else, or is another file); move the file away or fix that line, then run again\n") in capsys.readouterr().err
    assert out.read_text() == content


@pytest.mark.parametrize("row, said", [("true", 'its "row" is true, not an integer row index'),
                                       ('"1"', 'its "row" is "1", not an integer row index')])
def test_a_results_line_whose_row_is_no_integer_is_refused_naming_it(tmp_path, capsys, row, said):
    """`"row": true` was taken for row 1 (True == 1), a row the input may not have; a row that
    is no number was refused with no word of which field was wrong."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}] * 3)
    out = tmp_path / "out.jsonl"
    out.write_text('{"row": 0, "status": "ok"}\n{"row": ' + row + ', "status": "ok"}\n')
    assert run_job(tmp_path, "--input", rows) == 2
    assert f"{out} line 2 is not a result record of this job ({said}: " in capsys.readouterr().err


def test_a_csv_rerun_of_a_number_the_program_read_names_csvs_strings(tmp_path, capsys):
    """The program read 7 from JSON lines; the CSV copy gives "7": other input, and the refusal
    says why the same table differs."""
    def job(rows) -> int:
        argv = ["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress"]
        return Job("t", ["question"], argv=argv).run(lambda question: run_row(str(question)),
                                                     backend=ScriptedBackend(reply))

    assert job(write_rows(tmp_path / "rows.jsonl", [{"question": 7}])) == 0
    table = tmp_path / "rows.csv"
    table.write_text("question\n7\n")
    capsys.readouterr()
    assert job(table) == 2
    assert capsys.readouterr().err.endswith(
        "1 row, on line 2; write to a new output file, or remove those rows' records to run them again; if the "
        "first run read these rows as JSON lines: CSV values are strings, so a number there (7) is other input "
        "than the same digits here (\"7\")\n")


def test_a_lone_surrogate_in_a_field_name_or_deep_in_a_field_is_named(tmp_path):
    from lmnb.batch.inputs import read_rows

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"q\\udc00": "x"}\n{"question": "ok", "meta": {"tags": ["a", "\\udfff"]}}\n"\\ud800"\n'
                    '{"question": "\\ud83d\\ude00"}\n')
    errors = [row.error for row in read_rows(rows)]
    assert [e.split(" holds")[0] if e else e for e in errors] == [
        "line 1: a field name", "line 2: field 'meta'", "line 3: the row", None]


def test_a_local_model_directory_is_one_model_however_it_is_spelled(tmp_path, monkeypatch):
    """`--model ckpt` then `--model ./ckpt/` (or its absolute path, or a link to it) was refused as
    a rerun with other settings; another directory still is."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(4)])
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    assert run_job(tmp_path, "--input", rows, "--limit", 1, "--model", "ckpt") == 0
    assert read_results(tmp_path / "out.jsonl")[0]["settings"]["--model"] == str((tmp_path / "ckpt").resolve())
    for n, spelling in enumerate(["./ckpt/", tmp_path / "ckpt", "link"], start=2):
        assert run_job(tmp_path, "--input", rows, "--limit", n, "--model", spelling) == 0
    assert sorted(r["row"] for r in read_results(tmp_path / "out.jsonl")) == [0, 1, 2, 3]
    assert run_job(tmp_path, "--input", rows, "--retry-errors", "--model", "other") == 2
    assert run_job(tmp_path, "--input", rows, "--model", "/models/not-a-directory") == 2  # (a hub id: as given)


def test_a_set_parameter_is_recorded_in_one_order_whatever_the_process(tmp_path):
    """A set parameter was recorded as its repr, whose order for strings changes from one process
    to the next (hash randomization): about one rerun in five with the same --tags was refused as a
    run with other settings."""
    job = Job("", ["q"], argv=["--input", "x", "--output", "y.jsonl", "--tags", "{'pear', 'apple', 'fig', 'kiwi', 'plum'}",
                               "--ids", "{10, 9, 'x'}"])
    job.parameters(tags={"a"}, ids={1})
    settings = job.settings()
    assert settings["parameter tags"] == ["apple", "fig", "kiwi", "pear", "plum"]
    assert settings["parameter ids"] == ["x", 10, 9]  # (no order of their own: by their reprs "'x'", "10", "9")


@lmnb.function
def number(s, question):
    s += "Q: " + question + "\nA:"
    s += lmnb.gen("answer", dtype=float, max_tokens=8)


def test_a_float_json_cannot_hold_is_written_as_its_repr_so_that_every_line_is_json(tmp_path, capsys):
    """A float parameter given nan or inf (--ratio nan), and a gen(dtype=float) reading "1e999" (inf),
    were written as NaN and Infinity, which Python's json writes and reads but JSON has not: jq and
    JavaScript's JSON.parse refused the results file. They are written as their repr, "nan" and
    "inf", and a rerun with the same --ratio nan takes the file's rows as done."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q0"}])

    def job_with(ratio) -> int:
        job = Job("t", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                           "--no-progress", "--ratio", ratio])
        job.parameters(ratio=0.5)
        return job.run(lambda question: number.run(question).sync(), programs=[number],
                       backend=ScriptedBackend(lambda prompt, params: "1e999"))

    def strict(constant):
        raise ValueError(f"{constant} is not JSON")

    assert job_with("nan") == 0
    [record] = [json.loads(line, parse_constant=strict) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert (record["settings"]["parameter ratio"], record["variables"]["answer"]) == ("nan", "inf")
    write_rows(rows, [{"question": "q0"}, {"question": "q1"}])
    assert job_with("nan") == 0
    assert "1 already done" in capsys.readouterr().err
    assert job_with("-inf") == 2
    assert "parameter ratio: 'nan' there, '-inf' now" in capsys.readouterr().err


def test_a_float_json_cannot_hold_inside_a_set_or_a_pydantic_model_is_written_as_its_repr(tmp_path):
    """ResultStore.write writes a value JSON cannot hold as its repr, a float nan or inf too; but one
    inside a set or a pydantic model, which json hands to ``default`` (a list, model_dump()), was
    written as NaN or Infinity, as json wrote what ``default`` gave back as it is. Read back strictly
    (no NaN or Infinity constant), the line holds "nan" and "inf", as for a float of the record."""
    import pydantic

    class Reading(pydantic.BaseModel):
        x: float

    store = ResultStore(tmp_path / "out.jsonl")
    store.open()
    store.write({"row": 0, "variables": {"seen": {float("nan")}, "reading": Reading(x=float("-inf")),
                                         "pair": (float("inf"), frozenset([float("nan")]))}})

    def strict(constant):
        raise ValueError(f"{constant} is not JSON")

    record = json.loads((tmp_path / "out.jsonl").read_text(), parse_constant=strict)
    assert record["variables"] == {"seen": ["nan"], "reading": {"x": "-inf"}, "pair": ["inf", ["nan"]]}


def test_a_server_url_with_or_without_its_trailing_slash_is_one_backend(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    assert run_job(tmp_path, "--input", rows, "--limit", 1, "--backend", "http://127.0.0.1:30000/") == 0
    assert read_results(tmp_path / "out.jsonl")[0]["settings"]["--backend"] == "http://127.0.0.1:30000"
    assert run_job(tmp_path, "--input", rows, "--limit", 2, "--backend", "http://127.0.0.1:30000") == 0
    assert run_job(tmp_path, "--input", rows, "--backend", "http://127.0.0.1:30001/") == 2
    assert sorted(r["row"] for r in read_results(tmp_path / "out.jsonl")) == [0, 1]


def test_openai_without_an_api_key_is_a_one_line_error_that_names_the_key(tmp_path, capsys, monkeypatch):
    """`job.py --openai MODEL` (the official API: no --backend URL) with no key anywhere ended in the
    openai client's OpenAIError traceback, which the job did not catch; now it is exit 2 and a line
    that says where the key goes. Nothing is written for the rows."""
    for name in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                      "--openai", "gpt-4o-mini", "--no-progress"])
    assert job.run(run_row, programs=[echo]) == 2
    err = capsys.readouterr().err
    # (it said "the backend (engine)": --openai without --backend URL is the official API)
    assert ("lmnb batch: could not start the backend (--openai gpt-4o-mini at the official OpenAI API): "
            "ValueError: the openai client did not start: ") in err
    assert "Traceback" not in err
    assert "--api-key KEY" in err and "$OPENAI_API_KEY" in err
    assert not (tmp_path / "out.jsonl").exists() or read_results(tmp_path / "out.jsonl") == []


def test_the_jobs_help_lists_its_exit_statuses(capsys):
    """A job's --help said nothing of its exit statuses (the README names only 141)."""
    import re

    from lmnb.batch import runner

    job = Job("a job", ["q"], argv=["--help"])
    with pytest.raises(SystemExit):
        job.parameters()
    shown = capsys.readouterr().out.split("exit status:\n", 1)[1]
    listed = [int(n) for n in re.findall(r"^  (\d+) ", shown, re.M)]
    assert listed == [runner.EXIT_OK, runner.EXIT_ROW_ERRORS, runner.EXIT_FATAL, runner.EXIT_INTERRUPTED,
                      runner.EXIT_BROKEN_PIPE] == [0, 1, 2, 130, 141]
    assert "run the same command again to continue" in shown and "--retry-errors" in shown


def test_a_semicolon_separated_table_is_named_in_the_missing_field_error(tmp_path):
    """A spreadsheet's CSV with ';' between columns reads as one column 'id;question'; the error
    said only "missing field 'question' (the row has id;question)"."""
    rows = tmp_path / "rows.csv"
    rows.write_text("id;question\n1;q\n", encoding="utf-8")
    assert run_job(tmp_path, "--input", rows) == 1
    assert read_results(tmp_path / "out.jsonl")[0]["error"] == (
        "line 2: missing field 'question' (the row has id;question); the column name 'id;question' looks like "
        "several separated by ';': the input must be comma-separated (CSV), or tab-separated (.tsv, "
        "--input-format tsv); save it so")
    tabs = tmp_path / "tabs.csv"  # a tab-separated file named .csv: its fields are read as one column too
    tabs.write_text("question\tid\nq\t1\n", encoding="utf-8")
    (tmp_path / "out.jsonl").unlink()
    assert run_job(tmp_path, "--input", tabs) == 1
    assert "separated by '\\t'" in read_results(tmp_path / "out.jsonl")[0]["error"]


def test_ctrl_c_twice_stops_a_backend_shutdown_that_hangs(tmp_path, capsys, monkeypatch):
    """During the backend's shutdown a Ctrl-C is counted, as while rows ran; a shutdown that hung
    then left the job wedged whatever was pressed."""
    import os
    import signal
    import threading

    from lmnb.batch import runner as runner_module

    finished = threading.Event()

    class HangingShutdown(ScriptedBackend):
        def shutdown(self):
            for _ in range(2):  # the user presses Ctrl-C twice while the shutdown hangs
                os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(5)  # (interrupted by the second press with the fix)
            finished.set()

    monkeypatch.setattr(runner_module, "make_backend", lambda *a: HangingShutdown(reply))
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(2)])
    job = Job("t", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress"])
    assert job.run(run_row) == 0  # every row was written before the shutdown
    assert not finished.is_set()
    assert "the backend's shutdown was stopped (Ctrl-C twice)" in capsys.readouterr().err
    assert sorted(r["row"] for r in read_results(tmp_path / "out.jsonl")) == [0, 1]


def test_the_demo_model_named_is_the_default_model_not_other_settings(tmp_path, monkeypatch):
    """A run without --model (the built-in demo model) then `--model <the demo model's directory>`
    (or $LMNB_MODEL naming it) was refused as a rerun with other settings ("--model: None there,
    '/.../demo_model' now"), though both run the same checkpoint; another directory still is."""
    import lmnb_engine

    demo = os.path.join(os.path.dirname(lmnb_engine.__file__), "demo_model")
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(5)])
    assert run_job(tmp_path, "--input", rows, "--limit", 1) == 0
    assert run_job(tmp_path, "--input", rows, "--limit", 2, "--model", demo + os.sep) == 0
    monkeypatch.setenv("LMNB_MODEL", demo)
    assert run_job(tmp_path, "--input", rows, "--limit", 3) == 0
    monkeypatch.setenv("LMNB_MODEL", "demo")  # the demo model by its name (the hub was asked for "demo")
    assert run_job(tmp_path, "--input", rows, "--limit", 4) == 0
    monkeypatch.delenv("LMNB_MODEL")
    assert run_job(tmp_path, "--input", rows, "--model", "demo") == 0
    results = read_results(tmp_path / "out.jsonl")
    assert sorted(r["row"] for r in results) == [0, 1, 2, 3, 4]
    assert [r["settings"]["--model"] for r in results] == [None] * 5
    (tmp_path / "other").mkdir()
    assert run_job(tmp_path, "--input", rows, "--retry-errors", "--model", tmp_path / "other") == 2


@pytest.mark.parametrize("named", ["demo", "dir"])
def test_the_demo_model_beside_a_notebooks_own_model_is_other_settings(tmp_path, capsys, monkeypatch, named):
    """A notebook that loads a model of its own, run with `--model demo` (or the demo model's
    directory), recorded --model as None, as a run without --model, which runs the notebook's model:
    a rerun without --model took the demo model's rows as done, one file holding two models' rows.
    Now the demo model is recorded by its name there, and the rerun is refused as other settings."""
    import lmnb_engine

    monkeypatch.chdir(tmp_path)  # (no folder "demo" here, which --model demo would name)
    demo = "demo" if named == "demo" else os.path.join(os.path.dirname(lmnb_engine.__file__), "demo_model")
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])

    def job(*options) -> int:
        argv = ["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress", *options]
        return Job("t", ["question"], model=str(tmp_path / "nb_model"), argv=argv).run(
            run_row, programs=[echo], backend=ScriptedBackend(reply))

    assert job("--model", demo, "--limit", "2") == 0
    assert job() == 2
    assert ("holds rows run with other settings (--model: 'demo' there, None now)"
            in capsys.readouterr().err)
    assert [r["settings"]["--model"] for r in read_results(tmp_path / "out.jsonl")] == ["demo", "demo"]


def test_an_openai_model_the_server_does_not_serve_stops_the_job_before_any_row(tmp_path, capsys):
    """`job.py --backend URL/v1 --openai MODEL` with a name the server does not serve wrote an error
    record for every row (HTTP 404), and the rerun with the right name was refused as other settings;
    the job now asks the server's GET /models first, as %lm connect does: exit 2, nothing written.
    A name the list lacks but GET /models/NAME answers for (lmnb serve's and SGLang's "default") is
    served: it was refused as "does not serve model 'default'"."""
    import http.server

    from lmnb.batch.options import make_backend

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            card = {"id": "served-m", "object": "model", "created": 0, "owned_by": "t"}
            path = self.path.rstrip("/")
            known = path in ("/v1/models", "/v1/models/served-m", "/v1/models/default")  # (as lmnb serve answers)
            body = json.dumps(({"object": "list", "data": [card]} if path == "/v1/models" else card) if known
                              else {}).encode()
            self.send_response(200 if known else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    with serve_http(Models) as base:
        url = f"{base}/v1"

        def job(model):
            return Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                               "--backend", url, "--openai", model, "--completion",
                                               "--api-key", "k", "--no-progress"])

        assert job("typo-m").run(run_row, programs=[echo]) == 2
        err = capsys.readouterr().err
        assert f"{url} does not serve model 'typo-m' (it serves: served-m); pass one of those to --openai" in err
        assert not (tmp_path / "out.jsonl").exists() or read_results(tmp_path / "out.jsonl") == []
        for name in ("served-m", "default"):
            right = job(name)
            assert make_backend(right._parser().parse_args(right.argv)).model_name == name


def test_a_model_from_lmnb_model_that_cannot_load_is_named_as_coming_from_it(tmp_path, capsys, monkeypatch):
    """With $LMNB_MODEL pointing nowhere, the job said "could not start the backend (engine):
    ... no checkpoint directory at '/nowhere'", naming a path no option of the job holds."""
    monkeypatch.setenv("LMNB_MODEL", str(tmp_path / "nowhere"))
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress"])
    assert job.run(run_row, programs=[echo]) == 2
    assert capsys.readouterr().err.startswith(
        f"lmnb batch: could not start the backend (engine, model {tmp_path / 'nowhere'} from $LMNB_MODEL; --model "
        f"names another): FileNotFoundError: no checkpoint directory at '{tmp_path / 'nowhere'}'")
    job = Job("", ["question"], model=str(tmp_path / "nb_model"),  # the notebook's own model wins over the variable
              argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress"])
    assert job.run(run_row, programs=[echo]) == 2
    assert capsys.readouterr().err.startswith("lmnb batch: could not start the backend (engine): FileNotFoundError: "
                                              f"no checkpoint directory at '{tmp_path / 'nb_model'}'")


def test_a_device_that_is_not_there_names_the_jobs_option_to_give(tmp_path, capsys, monkeypatch):
    """A job run with --device cuda without CUDA said "use device='cpu'", the Python API's words."""
    from helpers_model import no_gpu

    no_gpu(monkeypatch)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress",
                                      "--device", "cuda"])
    assert job.run(run_row, programs=[echo]) == 2
    assert capsys.readouterr().err.endswith(
        "ValueError: device 'cuda' asked for, but torch sees no CUDA device; use --device cpu, or run on a machine "
        "with an NVIDIA GPU\n")


def _job_failure(tmp_path, capsys, *options) -> str:
    """The last line a job on the engine backend with ``options`` prints when its model fails to load (exit 2)."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress",
                                      "--device", "cpu", *map(str, options)])
    assert job.run(run_row, programs=[echo]) == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_load_errors_name_the_jobs_options_not_the_python_apis(tmp_path, capsys, tiny_llama, monkeypatch):
    """They said 'pass max_total_tokens=2 or more', 'pass random_weights=True', 'raise mem_fraction
    or pass max_total_tokens': keyword arguments, and options (--random-weights, --mem-fraction)
    a job does not have. It takes --max-total-tokens, as lmnb serve and %lm load do."""
    import shutil

    import lmnb_engine.model_runner as model_runner

    assert _job_failure(tmp_path, capsys, "--model", tiny_llama, "--max-total-tokens", 1).endswith(
        "ValueError: a KV pool of 1 token cannot hold one gen of lmnb's default max_tokens (128) after a "
        "one-character prompt (1 token); pass --max-total-tokens 128 or more")  # (not the engine's own floor, 2)
    assert _job_failure(tmp_path, capsys, "--model", "llama-3-8b").endswith(
        "ValueError: 'llama-3-8b' is a shape preset without weights; give a checkpoint directory or hub id")
    pt_only = shutil.copytree(tiny_llama, tmp_path / "pt_only", ignore=shutil.ignore_patterns("*.safetensors"))
    assert _job_failure(tmp_path, capsys, "--model", pt_only).endswith(
        "(PyTorch .bin checkpoints are not supported); re-save it with save_pretrained(safe_serialization=True)")
    awq = shutil.copytree(tiny_llama, tmp_path / "awq")
    (awq / "config.json").write_text(json.dumps({**json.loads((awq / "config.json").read_text()),
                                                 "quantization_config": {"quant_method": "awq"}}))
    assert _job_failure(tmp_path, capsys, "--model", awq).endswith(
        "lmnb_engine loads unquantized float32/bfloat16/float16 weights; use the original model's checkpoint")
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 10**6)  # (1953 slots of 512 bytes)
    assert _job_failure(tmp_path, capsys, "--model", tiny_llama, "--max-total-tokens", 10**10).endswith(
        "ValueError: a KV pool of 10000000000 tokens needs 5120000000512 bytes (4768.4 GiB): 512 bytes a token (2 layers x 2 KV "
        "heads x 16 dims x 4-byte float32, K and V), one padding token included; cpu has 1000000 bytes (976.6 KiB) "
        "free; pass --max-total-tokens 1952 or less, or leave --max-total-tokens unset to size the pool from free "
        "memory")
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 1000)
    assert _job_failure(tmp_path, capsys, "--model", tiny_llama).endswith(
        "ValueError: the KV pool's share of free memory on cpu (0.1) leaves room for only 0 KV tokens (512 bytes "
        "each); pass --max-total-tokens, or free some memory")


def test_a_row_too_large_for_the_kv_pool_names_the_jobs_option(tmp_path, tiny_llama):
    """A row's gen that did not fit the engine's KV pool was told to "raise max_total_tokens", the
    Python API's keyword, in its error record: the job's pool is sized by its --max-total-tokens."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q" * 200}])
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress",
                                      "--model", str(tiny_llama), "--device", "cpu", "--max-total-tokens", "160"])
    assert job.run(run_row, programs=[echo]) == 1
    [record] = read_results(tmp_path / "out.jsonl")
    assert record["status"] == "error"
    # (206 + 3 = 209 slots, 49 too many, or 45 + N beside N new tokens: 206 - 161)
    assert ("Gen('answer') failed: ValueError: prompt of 206 tokens does not fit the KV pool of 160 tokens; raise "
            "--max-total-tokens to at least 209, or shorten the prompt by at least 45 + max_tokens tokens (49 with "
            "max_tokens=4)") in record["error"]


def test_max_total_tokens_sizes_the_jobs_engine_and_is_refused_for_a_server(tmp_path, tiny_llama, monkeypatch):
    from lmnb.batch.options import job_parser, make_backend

    monkeypatch.delenv("LMNB_MODEL", raising=False)
    args = job_parser(per_row=False).parse_args(["--model", str(tiny_llama), "--device", "cpu",
                                                 "--max-total-tokens", "160"])
    backend = make_backend(args)
    try:
        assert backend.engine.model_info()["max_total_tokens"] == 160
    finally:
        backend.shutdown()
    args = job_parser(per_row=False).parse_args(["--backend", "http://127.0.0.1:1", "--max-total-tokens", "64"])
    with pytest.raises(ValueError, match=r"^--model/--device/--dtype/--max-total-tokens choose the in-process engine"):
        make_backend(args)


def test_a_job_without_row_fields_warns_that_the_rows_fields_are_not_used(tmp_path, capsys):
    """An export whose %%lm cells read no variable (02-few-shot-select) ran rows {"person": ...}
    as the same program each time, without a word that the field went unused."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"person": "Corin"}, {"person": "Hesta", "x": 1}])

    def same(**fields):
        echo.run("fixed", temperature=0).sync()

    job = Job("", [], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress"])
    assert job.run(same, programs=[echo], backend=ScriptedBackend(reply)) == 0
    err = capsys.readouterr().err
    assert ("lmnb batch: warning: this job reads no field of the input rows (its notebook's %%lm cells read none), "
            "so every row runs the same programs and the fields 'person', 'x' are not used; to read them, export the "
            "notebook again with --inputs person,x\n") in err
    assert [r["variables"]["answer"] for r in read_results(tmp_path / "out.jsonl")] == ["FIXED", "FIXED"]
    write_rows(rows, [{"person": "Corin"}])
    job = Job("", [], argv=["--input", str(rows), "--output", str(tmp_path / "out1.jsonl"), "--no-progress"])
    assert job.run(same, programs=[echo], backend=ScriptedBackend(reply)) == 0
    assert "same programs and the field 'person' is not used; to read it, export the notebook again with --inputs " \
           "person\n" in capsys.readouterr().err
    write_rows(rows, [{f"f{i}": i for i in range(6)}, {"my field": 1}])  # (too many to list: NAMES; a space quoted)
    job = Job("", [], argv=["--input", str(rows), "--output", str(tmp_path / "out3.jsonl"), "--no-progress"])
    assert job.run(same, programs=[echo], backend=ScriptedBackend(reply)) == 0
    assert "'f0', 'f1', 'f2', 'f3', 'f4', ... are not used; to read them, export the notebook again with --inputs NAMES\n" \
        in capsys.readouterr().err
    write_rows(rows, [{"my field": 1}])
    job = Job("", [], argv=["--input", str(rows), "--output", str(tmp_path / "out4.jsonl"), "--no-progress"])
    assert job.run(same, programs=[echo], backend=ScriptedBackend(reply)) == 0
    assert "with --inputs 'my field'\n" in capsys.readouterr().err
    write_rows(rows, [{}, {}])
    job = Job("", [], argv=["--input", str(rows), "--output", str(tmp_path / "out2.jsonl"), "--no-progress"])
    assert job.run(same, programs=[echo], backend=ScriptedBackend(reply)) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("key, advice", [([], "; the server asks for an API key: pass --api-key KEY or set "
                                              "$LMNB_API_KEY"),
                                         (["--api-key", "wrong"], "; the server refused the --api-key given")])
def test_a_server_that_wants_a_key_is_named_with_the_option_that_gives_it(tmp_path, capsys, monkeypatch, key, advice):
    """A job whose --backend (or notebook's %lm connect URL) is ``lmnb serve --api-key K`` said only
    the server's words for an HTTP client, "send Authorization: Bearer <key>", not the job's
    --api-key option."""
    monkeypatch.delenv("LMNB_API_KEY", raising=False)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    with keyed_server() as url:
        job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                          "--backend", url, "--no-progress", *key])
        assert job.run(run_row, programs=[echo]) == 2
    err = capsys.readouterr().err
    assert (f"lmnb batch: could not start the backend ({url}): BackendAuthError: GET {url}/get_model_info: HTTP 401: "
            f"missing or wrong API key (send Authorization: Bearer <key>){advice}\n") in err, err


@pytest.mark.parametrize("key, env, advice", [
    ([], None, "; the server asks for an API key: pass --api-key KEY or set $OPENAI_API_KEY"),
    ([], "wrong", "; the server refused the key in $OPENAI_API_KEY"),
    (["--api-key", "wrong"], None, "; the server refused the --api-key given")])
def test_an_openai_server_that_refuses_the_key_stops_the_job_before_any_row(tmp_path, capsys, monkeypatch, key, env,
                                                                           advice):
    """--openai against ``lmnb serve --api-key K`` without the key (or $LMNB_API_KEY set, which the
    openai path does not read): the job's GET /models check passed the 401 over, every row then
    failed on it (exit 1), and the summary said to fix the input; %lm connect --openai stops there."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    if env:
        monkeypatch.setenv("OPENAI_API_KEY", env)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    with keyed_server() as base:
        url = f"{base}/v1"
        job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                          "--backend", url, "--openai", "m", "--completion", "--no-progress", *key])
        assert job.run(run_row, programs=[echo]) == 2
    err = capsys.readouterr().err
    assert (f"lmnb batch: could not start the backend (--openai m at {url}): BackendAuthError: GET {url}/models: "
            "HTTP 401 (") in err, err
    assert f"missing or wrong API key (send Authorization: Bearer <key>)){advice}\n" in err, err
    assert not (tmp_path / "out.jsonl").exists() or read_results(tmp_path / "out.jsonl") == []


@pytest.mark.parametrize("key, env, advice, summary", [
    ([], None, "; the server asks for an API key: pass --api-key KEY or set $OPENAI_API_KEY",
     "the server asks for an API key ({words}); pass --api-key KEY or set $OPENAI_API_KEY"),
    ([], "wrong", "; the server refused the key in $OPENAI_API_KEY",
     "the server refused the key in $OPENAI_API_KEY ({words}); check it and set the right one in $OPENAI_API_KEY "
     "(or pass --api-key KEY)"),
    (["--api-key", "wrong"], None, "; the server refused the --api-key given",
     "the server refused the --api-key given ({words}); check it and pass the right one with --api-key KEY")])
def test_a_rows_gen_refused_for_the_key_says_the_jobs_option_once(tmp_path, capsys, monkeypatch, key, env, advice,
                                                                   summary):
    """--openai against a server that lists its models without the key (a proxy) but refuses gens
    without it (HTTP 401): each row's error was a plain BackendError in the server's words for an
    HTTP client; it names the job's --api-key (not lmnb.OpenAI's api_key=), once. The summary said
    "fix the input and run again", which no input fixes; it says how to give the key and resume,
    as it does for a backend that could not be reached."""
    import http.server as hs

    from helpers_lang import send

    class Handler(hs.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            send(self, 200, b'{"object": "list", "data": [{"id": "m", "object": "model"}]}')

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            send(self, 401, b'{"error": {"message": "missing or wrong API key (send Authorization: Bearer <key>)", '
                            b'"code": 401}}')

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    if env:
        monkeypatch.setenv("OPENAI_API_KEY", env)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    with serve_http(Handler) as base:
        url = f"{base}/v1"
        job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                          "--backend", url, "--openai", "m", "--completion", "--no-progress", *key])
        assert job.run(run_row, programs=[echo]) == 1
    [record] = read_results(tmp_path / "out.jsonl")
    words = f"{url}/completions: HTTP 401: missing or wrong API key (send Authorization: Bearer <key>)"
    assert record["error"].startswith(f"ProgramError: Gen('answer') failed: BackendAuthError: {words}{advice} ("), record
    assert capsys.readouterr().err.endswith(
        f"  1 row failed because {summary.format(words=words)}, then run the same command again with --retry-errors "
        "to rerun the failed rows (rows already done are kept)\n")


@pytest.mark.parametrize("argv, sent", [([], "Bearer from-env"), (["--api-key", "given"], "Bearer given")])
def test_the_key_of_an_sglang_protocol_server_may_come_from_lmnb_api_key(tmp_path, capsys, monkeypatch, argv, sent):
    """--api-key was the only way to give the key (it shows in ps and the shell's history), where the
    OpenAI path reads $OPENAI_API_KEY; $LMNB_API_KEY gives it now, and --api-key still wins."""
    import http.server as hs

    from helpers_lang import send, serve_http

    seen = []

    class Handler(hs.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):  # (lmnb serve's answer to a wrong key)
            seen.append(self.headers.get("Authorization"))
            send(self, 401, b'{"error": {"message": "missing or wrong API key", "code": 401}}')

    monkeypatch.setenv("LMNB_API_KEY", "from-env")
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    with serve_http(Handler) as url:
        job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                          "--backend", url, "--no-progress", *argv])
        assert job.run(run_row, programs=[echo]) == 2
    assert seen and set(seen) == {sent}
    refused = "the --api-key given" if argv else "the key in $LMNB_API_KEY"
    assert f"missing or wrong API key; the server refused {refused}\n" in capsys.readouterr().err


@pytest.mark.parametrize("key, advice, summary", [
    ([], "; the server asks for an API key: pass --api-key KEY or set $LMNB_API_KEY",
     "the server asks for an API key ({words}); pass --api-key KEY or set $LMNB_API_KEY"),
    (["--api-key", "old"], "; the server refused the --api-key given",
     "the server refused the --api-key given ({words}); check it and pass the right one with --api-key KEY")])
def test_a_rows_gen_refused_for_the_key_after_an_sglang_server_connected_says_the_jobs_option(
        tmp_path, capsys, monkeypatch, key, advice, summary):
    """An SGLang-protocol server that takes the model-info request but refuses the gens for the key
    (restarted with another key, or a proxy guarding /generate alone): each row's error was the
    server's bare words; it names the job's --api-key (not lmnb.RuntimeEndpoint's api_key=), once,
    and the summary says how to give it and resume."""
    import http.server as hs

    from helpers_lang import send, serve_http

    class Handler(hs.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            send(self, 200, b'{"model_path": "m"}')

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            send(self, 401, b'{"error": {"message": "missing or wrong API key", "code": 401}}')

    monkeypatch.delenv("LMNB_API_KEY", raising=False)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    with serve_http(Handler) as url:
        job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                          "--backend", url, "--chat-template", "chatml", "--no-progress", *key])
        assert job.run(run_row, programs=[echo]) == 1
    [record] = read_results(tmp_path / "out.jsonl")
    words = f"POST {url}/generate: HTTP 401: missing or wrong API key"
    assert record["error"].startswith(f"ProgramError: Gen('answer') failed: BackendAuthError: {words}{advice} ("), record
    assert capsys.readouterr().err.endswith(
        f"  1 row failed because {summary.format(words=words)}, then run the same command again with --retry-errors "
        "to rerun the failed rows (rows already done are kept)\n")


def test_a_text_field_given_another_json_value_is_bad_input_and_the_good_rows_run(tmp_path, capsys):
    """A row field whose notebook example is text, given as 7 or [1, 2]: the job ran the row on
    it (a prompt of "7", or an AttributeError from code written for text) as though it were fine."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": 7}, {"question": "b"}, {"question": [1, 2]},
                                                {"question": True}, {"question": {"k": "v"}}])
    out = tmp_path / "out.jsonl"
    job = lambda: Job("", ["question"], texts=["question"],  # noqa: E731
                      argv=["--input", str(rows), "--output", str(out), "--no-progress"])
    backend = ScriptedBackend(reply)
    assert job().run(run_row, programs=[echo], backend=backend) == 1
    results = by_row(read_results(out))
    assert [results[i]["status"] for i in range(5)] == ["bad_input", "ok", "bad_input", "bad_input", "bad_input"]
    assert results[0]["error"] == ("line 1: field 'question' is a number, 7; the notebook's example of it is text, "
                                   'which its code was written for: give a string (in quotes, e.g. "7")')
    assert results[2]["error"].startswith("line 3: field 'question' is a list, [1, 2]; ")
    assert results[2]["error"].endswith('(in quotes, e.g. "[1, 2]")')
    assert results[3]["error"].startswith("line 4: field 'question' is a boolean, true; ")
    assert results[4]["error"].startswith('line 5: field \'question\' is an object, {"k": "v"}; ')
    assert results[1]["variables"] == {"answer": "B"}
    assert [c[1][0].text for c in backend.calls if c[0] == "generate"] == ["Q: b\nA:"]  # the bad rows never ran
    assert f"lmnb batch: {rows} line 1: field 'question' is a number, 7;" in capsys.readouterr().err
    # A rerun on the same input: nothing runs, the file stands, and the status is still 1, as the
    # output still lacks those rows' results (a pipeline's next step must not take it as complete).
    before = out.read_bytes()
    assert job().run(run_row, programs=[echo], backend=backend) == 1
    assert out.read_bytes() == before and len([c for c in backend.calls if c[0] == "generate"]) == 1
    assert "(1 ok, 0 failed, 4 bad input)" in capsys.readouterr().err
    write_rows(rows, [{"question": "7"}, {"question": "b"}, {"question": "[1, 2]"}, {"question": "true"},
                      {"question": "v"}])  # fixed: those rows run, and the job is complete
    assert job().run(run_row, programs=[echo], backend=backend) == 0
    assert sorted(r["variables"]["answer"] for r in read_results(out)) == ["7", "B", "TRUE", "V", "[1, 2]"]


def test_a_rerun_on_a_shorter_input_warns_of_the_records_of_rows_it_no_longer_has(tmp_path, capsys):
    # the output still held rows 3-6 of the longer input and counted them as done, without a word
    out, rows = tmp_path / "out.jsonl", tmp_path / "rows.jsonl"
    write_rows(rows, [{"question": f"q{i}"} for i in range(7)])
    assert run_job(tmp_path, "--input", rows) == 0
    write_rows(rows, [{"question": f"q{i}"} for i in range(3)])
    capsys.readouterr()
    assert run_job(tmp_path, "--input", rows) == 0
    err = capsys.readouterr().err
    assert (f"lmnb batch: warning: {out} holds 4 records of rows this input does not have (row 3, row 4, row 5, "
            "row 6); they are kept and counted below; write to another --output to have this input's rows alone\n"
            ) in err
    assert len(read_results(out)) == 7
    assert run_job(tmp_path, "--input", rows, "--limit", 2) == 0  # rows past --limit are unread, not gone
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["res.csv", "res.tsv", "results", ".jsonl"])
def test_an_output_not_named_jsonl_is_refused_before_anything_runs(tmp_path, capsys, name):
    """`--output res.csv` wrote JSON lines into a file named as CSV, without a word (and exited 0)."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    out = tmp_path / name
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(out), "--no-progress"])
    with pytest.raises(SystemExit) as stopped:
        job.run(run_row, backend=ScriptedBackend(reply))
    assert stopped.value.code == 2
    assert (f"argument --output: {str(out)!r}: the results are JSON lines (one record per row, read back to continue "
            f"a stopped run), so the file is named .jsonl; use e.g. --output {tmp_path / 'res.jsonl'}"
            if name.startswith("res.") else f"use e.g. --output {tmp_path / 'results.jsonl'}") in capsys.readouterr().err
    assert not out.exists()


def test_an_option_is_not_taken_for_the_longer_one_it_begins(tmp_path, capsys):
    """With a row field named num (a parameter read from the rows, so no --num option), argparse
    took --num 5 for --num-threads 5 without a word: abbreviations are off."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"num": "1"}])
    job = Job("", ["num"], argv=["--input", str(rows), "--output", str(tmp_path / "o.jsonl"), "--num", "5"])
    with pytest.raises(SystemExit) as stopped:
        job.run(run_row, backend=ScriptedBackend(reply))
    assert stopped.value.code == 2
    assert "error: unrecognized arguments: --num 5" in capsys.readouterr().err


@pytest.mark.parametrize("output, where", [("-", "to stdout"), ("/dev/null", "to a device or pipe")])
def test_an_output_of_a_dash_or_a_device_is_refused_as_such(tmp_path, capsys, output, where):
    """`--output -` was refused with "use e.g. --output -.jsonl", as if '-' were a file name, and
    `--output /dev/null` (or /dev/stdout on a terminal) with "use e.g. --output /dev/null.jsonl"."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    job = Job("", ["question"], argv=["--input", str(rows), "--output", output, "--no-progress"])
    with pytest.raises(SystemExit) as stopped:
        job.run(run_row, backend=ScriptedBackend(reply))
    assert stopped.value.code == 2
    assert (f"argument --output: '{output}': the results go to a file, which a rerun reads back to continue a stopped "
            f"run, not {where}; use e.g. --output results.jsonl") in capsys.readouterr().err


def test_an_output_folder_that_does_not_exist_is_made_and_named(tmp_path, capsys):
    """`--output nodir/out.jsonl` was refused ("does not exist") where lmnb run and lmnb export make the folder."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q1"}, {"question": "q2"}])
    out = tmp_path / "runs" / "today" / "out.jsonl"
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(out), "--no-progress"])
    assert job.run(run_row, programs=[echo], backend=ScriptedBackend(reply)) == 0
    assert f"lmnb batch: created the folder {out.parent} (it did not exist) for {out}\n" in capsys.readouterr().err
    assert sorted(r["variables"]["answer"] for r in read_results(out)) == ["Q1", "Q2"]


@pytest.mark.parametrize("encoding, bom, named", [
    ("utf-16-le", b"\xff\xfe", "UTF-16"), ("utf-16-be", b"\xfe\xff", "UTF-16"),
    ("utf-32-le", b"\xff\xfe\x00\x00", "UTF-32"), ("utf-32-be", b"\x00\x00\xfe\xff", "UTF-32"),
    ("utf-16-le", b"", None), ("utf-16-be", b"", None), ("utf-32-le", b"", None), ("utf-32-be", b"", None)])
@pytest.mark.parametrize("name, text", [("rows.jsonl", '{"question": "q1"}\n{"question": "q2"}\n'),
                                        ("rows.csv", "question\nq1\nq2\n")])
def test_utf16_or_utf32_input_is_refused_as_a_whole_naming_the_encoding(tmp_path, capsys, encoding, bom, named,
                                                                        name, text):
    """A UTF-16 file (Notepad's "Unicode", PowerShell's >) was a "not UTF-8" or "invalid JSON"
    bad_input record per line, with no word of the encoding."""
    rows = tmp_path / name
    rows.write_bytes(bom + text.encode(encoding))
    if named:
        message = (f"{rows} is {named} text, not UTF-8; save it again as UTF-8 (e.g. iconv -f {named} -t UTF-8 "
                   f"{rows} > {tmp_path / ('rows-utf8' + rows.suffix)})")
    else:
        message = (f"{rows} is not UTF-8 text: its first line holds 0 bytes, as UTF-16 or UTF-32 text does; save it "
                   "again as UTF-8")
        if encoding.startswith("utf-16"):  # (iconv reads UTF-16 without an order mark as big-endian: named)
            order = encoding[-2:].upper()
            message += (f" (it looks like UTF-16{order}, without a byte order mark: e.g. iconv -f UTF-16{order} -t "
                        f"UTF-8 {rows} > {tmp_path / ('rows-utf8' + rows.suffix)})")
    with pytest.raises(InputError) as refused:
        list(read_rows(rows))
    assert str(refused.value) == message
    assert run_job(tmp_path, "--input", rows) == 2
    assert capsys.readouterr().err == f"lmnb batch: {message}\n"
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("bom, encoding", [(b"\xff\xfe", "UTF-16"), (b"", "UTF-16LE")])
def test_the_iconv_command_for_a_name_starting_with_a_dash_keeps_its_dot_slash(tmp_path, monkeypatch, bom, encoding):
    """`--input ./-rows.csv` (Path drops the ./) was told `iconv -f UTF-16 -t UTF-8 -rows.csv > -rows-utf8.csv`,
    which iconv reads as options (found by the final review helper); the command given now works.
    So does the jq command for a JSON array."""
    import shutil
    import subprocess

    monkeypatch.chdir(tmp_path)
    rows = Path("./-rows.csv")
    rows.write_bytes(bom + "question\nq1\n".encode("utf-16-le"))
    with pytest.raises(InputError) as refused:
        list(read_rows(rows))
    command = f"iconv -f {encoding} -t UTF-8 ./-rows.csv > ./-rows-utf8.csv"
    assert str(refused.value).endswith(f"e.g. {command})")
    if shutil.which("iconv"):
        subprocess.run(command, shell=True, check=True)
        assert [r.fields for r in read_rows(Path("./-rows-utf8.csv"))] == [{"question": "q1"}]
    array = Path("./-my rows.jsonl")
    array.write_text('[{"question": "q1"}]\n', encoding="utf-8")
    with pytest.raises(InputError) as refused:
        list(read_rows(array))
    assert "convert it with  jq -c '.[]' './-my rows.jsonl' > rows.jsonl" in str(refused.value)


@pytest.mark.parametrize("output, said", [(" ", "blank"), ("", "empty")])
def test_a_blank_output_name_is_refused_as_such(tmp_path, capsys, output, said):
    """`--output ' '` was refused with "use e.g. --output ' .jsonl'" (found by the final review helper),
    and `--output ''` as the folder '.'."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q"}])
    job = Job("", ["question"], argv=["--input", str(rows), "--output", output, "--no-progress"])
    with pytest.raises(SystemExit) as stopped:
        job.run(run_row, backend=ScriptedBackend(reply))
    assert stopped.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: argument --output: {output!r}: the results file's name is {said}; "
                                            "give one, e.g. --output results.jsonl\n")


def test_the_iconv_command_for_a_utf16_file_quotes_a_name_with_spaces(tmp_path):
    """The command was `iconv -f UTF-16 -t UTF-8 My Rows.csv > My Rows-utf8.csv`, which the shell
    runs on files named My and Rows.csv, writing to My; Notepad's files often have spaces in their names."""
    rows = tmp_path / "My Rows.csv"
    rows.write_bytes(b"\xff\xfe" + "question\nq1\n".encode("utf-16-le"))
    with pytest.raises(InputError) as refused:
        list(read_rows(rows))
    assert str(refused.value) == (f"{rows} is UTF-16 text, not UTF-8; save it again as UTF-8 (e.g. iconv -f UTF-16 "
                                  f"-t UTF-8 '{tmp_path}/My Rows.csv' > '{tmp_path}/My Rows-utf8.csv')")


def test_a_csv_quote_never_closed_is_a_bad_row_not_the_rest_of_the_file_in_one_value(tmp_path):
    """A stray opening quote read every later line into that row's value (the rows there never ran,
    without a word), and text after a closing quote ('"Cira, Jr" x') was kept without its quotes."""
    rows = tmp_path / "rows.csv"
    rows.write_text('question\nfirst\n"Cira, Jr" x\nok\n"stray\nsecond\nthird\n', encoding="utf-8")
    got = [(r.index, r.line, r.fields, r.error) for r in read_rows(rows)]
    assert got == [
        (0, 2, {"question": "first"}, None),
        (1, 3, None, "line 3: malformed CSV: text after a closing quote, where ',' or the line's end must follow "
                     '(a space there too): quote the whole value, writing a quote inside it as "", or remove what '
                     "follows the quote"),
        (2, 4, {"question": "ok"}, None),
        (3, 5, None, "line 5: malformed CSV: a quote opened in this row is never closed: lines 5-7, to the end of "
                     'the file, are inside it; close the quoted value, or write a quote inside it as ""'),
    ]


def test_bad_input_records_do_not_pin_the_settings_of_a_rerun(tmp_path, capsys):
    """A job whose --backend could not start (a wrong port) still wrote its bad_input records,
    which carry that run's settings: the rerun with the right backend was refused as 'other
    settings', though no row had run on any backend. Rows that ran still pin them."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"other": 1}, {"question": "q"}])
    bad_only = write_rows(tmp_path / "bad.jsonl", [{"other": 1}])
    assert run_job(tmp_path, "--input", bad_only, "--model", "/wrong") == 1
    assert [r["status"] for r in read_results(tmp_path / "out.jsonl")] == ["bad_input"]
    assert run_job(tmp_path, "--input", rows) == 1  # (row 0 is still bad input)
    assert sorted((r["row"], r["status"]) for r in read_results(tmp_path / "out.jsonl")) == [
        (0, "bad_input"), (1, "ok")]
    capsys.readouterr()
    assert run_job(tmp_path, "--input", rows, "--model", "/wrong") == 2  # row 1 ran without --model
    assert "--model: None there, '/wrong' now" in capsys.readouterr().err


@pytest.mark.parametrize("early", [False, True], ids=["open", "before the set-up"])
def test_a_record_whose_settings_are_empty_is_read_as_one_without_settings(tmp_path, capsys, early):
    """A record with ``"settings": {}`` (another writer's, or a hand edit that emptied them), which
    records no setting, was refused as run with other settings ("--backend: not set there, 'engine'
    now"), where one without "settings" (written before settings were) is taken: both are rows
    done, and the rerun runs only the row not in the file."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(3)])
    out = tmp_path / "out.jsonl"
    out.write_text('{"row": 0, "status": "ok"}\n{"row": 1, "status": "ok", "settings": {}}\n')
    if early:
        ResultStore(out, None, {"--backend": "engine", "--model": None}).check_before_setup()  # (raises nothing)
    assert run_job(tmp_path, "--input", rows) == 0, capsys.readouterr().err
    assert sorted(r["row"] for r in read_results(out)) == [0, 1, 2]
    assert by_row(read_results(out))[2]["settings"]["--backend"] == "engine"


def test_a_malformed_csv_record_is_one_bad_row_over_all_its_lines_then_reading_goes_on_after_it(tmp_path):
    """A strict reader went on at the line after its error, inside the record: the rest of a quoted
    value ran as a row of its own (q='line"'), and a closing quote alone on its line opened a quote
    that took every later row into one 'never closed' error. The record ends where Python's lenient
    csv reader ends it (lines 2-3 here), and the rows after it run."""
    rows = tmp_path / "rows.csv"
    text = 'q,a\n"x" y,"multi\nline",z\nok,w\n"x" y,"two\n"\nlast,v\n'
    rows.write_text(text, encoding="utf-8")
    lenient = list(csv.reader(io.StringIO(text, newline="")))
    assert lenient[2] == ["ok", "w"] and lenient[4] == ["last", "v"]  # (the lines 4 and 6 the job must run)
    got = [(r.index, r.line, r.fields, r.error is None) for r in read_rows(rows)]
    assert got == [(0, 2, None, False), (1, 4, {"q": "ok", "a": "w"}, True),
                   (2, 5, None, False), (3, 7, {"q": "last", "a": "v"}, True)]


def test_text_after_a_closing_quote_in_a_tsv_file_names_the_tab_in_words(tmp_path):
    """csv's words for it, "'<tab>' expected after '\"'", showed the tab as a blank between quotes."""
    rows = tmp_path / "rows.tsv"
    rows.write_text('question\textra\n"x" \ty\n', encoding="utf-8")
    assert [r.error for r in read_rows(rows)] == [
        "line 2: malformed CSV: text after a closing quote, where a tab or the line's end must follow (a space there "
        'too): quote the whole value, writing a quote inside it as "", or remove what follows the quote']


def test_a_csv_file_whose_lines_end_in_a_cr_alone_is_read_as_pythons_csv_reads_it(tmp_path):
    """Excel for Mac's "CSV (Macintosh)" ends lines with a CR alone: the whole file was one line, and
    the job refused it: "cannot read the CSV header: new-line character seen in unquoted field - do
    you need to open the file in universal-newline mode?". Expected: the rows csv reads from the
    file opened with newline='', as its documentation says to open one, a CR inside a quoted value kept."""
    rows = tmp_path / "rows.csv"
    rows.write_bytes(b'question,extra\rq1,a\r"multi\rline",b\r\rlast,c')
    with open(rows, newline="", encoding="utf-8") as f:
        header, *records = list(csv.reader(f))
    assert records == [["q1", "a"], ["multi\rline", "b"], [], ["last", "c"]]
    assert [(r.line, r.fields) for r in read_rows(rows)] == [
        (2, dict(zip(header, records[0]))), (3, dict(zip(header, records[1]))), (6, dict(zip(header, records[3])))]


def test_the_malformed_rows_of_a_semicolon_csv_name_the_separator(tmp_path):
    """A spreadsheet's semicolon CSV reads as one column 'question;extra': a row that quotes a value
    holding ';' ("q;2";b) was 'text after a closing quote', and one with a decimal comma (3,5;c) '2
    values for 1 columns', each with no word of the separator, which a row read whole named."""
    rows = tmp_path / "rows.csv"
    rows.write_text('question;extra\n"q;2";b\n3,5;c\n', encoding="utf-8")
    hint = ("; the header 'question;extra' looks like several columns separated by ';': the input must be "
            "comma-separated (CSV), or tab-separated (.tsv, --input-format tsv); save it so")
    errors = [r.error for r in read_rows(rows)]
    assert errors[0].startswith("line 2: malformed CSV: text after a closing quote") and errors[0].endswith(hint)
    assert errors[1] == "line 3: 2 values for 1 columns (question;extra)" + hint
    rows.write_text('question\n"q" x\n', encoding="utf-8")  # (one column with no other separator in its name)
    assert [r.error for r in read_rows(rows)][0].endswith("or remove what follows the quote")


def _rows_as_pythons_csv_reads_them(text: str, delimiter: str) -> list:
    """The reference for the job's CSV rows, from Python's csv alone: records delimited by its
    lenient reader over the text's lines (split as a file opened with newline='' is), each bad
    when csv's strict reader refuses its lines; (line, fields or None) per record after the header.
    A record of one line of spaces (and tabs, where a tab is no separator) is a blank line, which
    pandas' read_csv skips."""
    lines = io.StringIO(text, newline="").readlines()
    blank = " \r\n" if delimiter == "\t" else " \t\r\n"
    lenient = csv.reader(iter(lines), delimiter=delimiter)
    header, end, rows = next(lenient), lenient.line_num, []
    for record in lenient:
        start, end = end + 1, lenient.line_num
        try:
            list(csv.reader(lines[start - 1:end], delimiter=delimiter, strict=True))
        except csv.Error:
            rows.append((start, None))
            continue
        if record and not (end == start and not lines[start - 1].strip(blank)):
            good = len(record) == len(header) and record != header
            rows.append((start, dict(zip(header, record)) if good else None))
    return rows


@pytest.mark.parametrize("delimiter, suffix", [(",", "csv"), ("\t", "tsv")])
def test_csv_rows_are_those_pythons_csv_reads_on_random_text(tmp_path, delimiter, suffix):
    """Random text of quotes, separators, spaces and line ends of each kind (LF, CRLF, a CR alone)
    after a header: each row's line and fields, or that it is bad, as Python's csv reads them."""
    rng = random.Random(5)
    pieces = ["a", "bc", "é", " ", '"', '""', delimiter, "\n", "\r\n", "\r", '"x"', "\n\n"]
    rows = tmp_path / f"rows.{suffix}"
    for _ in range(400):
        text = f"q{delimiter}a\n" + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        rows.write_bytes(text.encode("utf-8"))
        assert [(r.line, r.fields) for r in read_rows(rows)] == _rows_as_pythons_csv_reads_them(text, delimiter), text


def _written_rows_among_blank_lines(rng: random.Random, delimiter: str) -> tuple:
    """A CSV (or TSV) text that Python's csv writes of random rows, with blank lines of random
    blanks before its header and between its rows: (text, [(line, fields)] of the rows written).
    A blank line is empty or of spaces, or of tabs too where a tab is no separator: pandas'
    read_csv (its C parser) skips each such line as blank. A row of one value of blanks alone is
    quoted, where csv would write it as such a line."""
    blanks = ["", " ", "   "] + (["\t", " \t "] if delimiter != "\t" else [])
    values = ["", "a", " ", "  x ", "b c", "\t", "a\nb", " \n  \n ", '"', "d" + delimiter + "e"]
    header = [f"c{i}" for i in range(rng.randint(1, 3))]
    text, rows = "", []

    def write(record: list, end: str) -> None:
        nonlocal text
        lone_blank = len(record) == 1 and not record[0].strip(" \t")
        quoting = csv.QUOTE_ALL if lone_blank or rng.random() < 0.3 else csv.QUOTE_MINIMAL
        out = io.StringIO()
        csv.writer(out, delimiter=delimiter, quoting=quoting, lineterminator=end).writerow(record)
        text += out.getvalue()

    def blank_lines() -> None:
        nonlocal text
        for _ in range(rng.choice([0, 0, 1, 2])):
            text += rng.choice(blanks) + rng.choice(["\n", "\r\n"])

    blank_lines()
    write(header, "\n")
    for _ in range(rng.randint(0, 5)):
        blank_lines()
        record = [rng.choice(values) for _ in header]
        rows.append((text.count("\n") + 1, dict(zip(header, record))))
        write(record, rng.choice(["\n", "\r\n"]))
    blank_lines()
    return text, rows


@pytest.mark.parametrize("delimiter, suffix", [(",", "csv"), ("\t", "tsv")])
def test_lines_of_blanks_in_a_csv_are_skipped_as_pandas_skips_them(tmp_path, delimiter, suffix):
    """A line of spaces before the header was refused ('the first line must name every column'),
    and one between rows was a row of one value (a bad row, or a row of blanks in a file of one
    column), where pandas' read_csv skips them as blank lines (skip_blank_lines; the same
    generator's files read by pandas 3.1's C parser give these rows). Random files written by
    Python's csv with blank lines among them: the rows written, on their lines."""
    rng = random.Random(27)
    rows = tmp_path / f"rows.{suffix}"
    for _ in range(300):
        text, written = _written_rows_among_blank_lines(rng, delimiter)
        rows.write_bytes(text.encode("utf-8"))
        assert [(r.line, r.fields) for r in read_rows(rows)] == written, text


def test_blank_lines_before_a_csv_header_are_skipped(tmp_path):
    """They were refused as 'the first line must name every column'; pandas' read_csv skips them
    (header=0 is the first line that is not blank). csv.DictReader takes the blank line for the
    header instead, and each row for the values of one nameless column: no reading to copy."""
    rows = tmp_path / "rows.csv"
    rows.write_bytes(b"\n\r\n\rquestion,id\nq1,1\n\nq2,2\n")
    assert [(r.index, r.line, r.fields) for r in read_rows(rows)] == [
        (0, 5, {"question": "q1", "id": "1"}), (1, 7, {"question": "q2", "id": "2"})]
    rows.write_bytes(b"\n\n,id\nq1,1\n")
    with pytest.raises(InputError) as refused:
        list(read_rows(rows))
    assert str(refused.value) == f"{rows} line 3: the first line that is not blank must name every column (a CSV header)"
    rows.write_bytes(b"\n\r\n\n")
    with pytest.raises(InputError) as refused:
        list(read_rows(rows))
    assert str(refused.value) == (f"{rows} has no CSV header: it holds no line but blank ones; its first line must "
                                  "name every column")


@pytest.fixture(scope="module")
def base_model(tiny_llama, tmp_path_factory):
    """``tiny_llama`` without a chat template (a base model): neither its chat_template.jinja nor
    tokenizer_config.json's ``chat_template``."""
    import shutil

    model = shutil.copytree(tiny_llama, tmp_path_factory.mktemp("base") / "base")
    (model / "chat_template.jinja").unlink()
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)  # (the transformers version may keep it in the .jinja alone)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


@lmnb.function
def chat_echo(s, question):
    s += lmnb.user(question)
    s += lmnb.assistant(lmnb.gen("answer", max_tokens=1, temperature=0))


def _chat_job(tmp_path, model, *options, progress=False) -> list:
    """Run ``chat_echo`` over the rows q0, q1 on the engine with ``model`` as a job with
    ``options`` (and its progress bar, where ``progress``); returns each row's text (the prompt the
    model got, and its one token)."""
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q0"}, {"question": "q1"}])
    texts = []

    def run_chat_row(question):
        texts.append(chat_echo.run(question).text())

    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                                      "--model", str(model), "--device", "cpu", "--num-threads", "2",
                                      *([] if progress else ["--no-progress"]), *map(str, options)])
    assert job.run(run_chat_row, programs=[chat_echo]) == 0
    return sorted(texts)


def test_a_jobs_chat_template_option_formats_a_base_models_roles(tmp_path, capsys, base_model):
    """A job on a model with no chat template sent its rows' roles in SGLang's generic 'default'
    format and warned with the Python API's fixes (Engine(MODEL, chat_template_name=...)), which a
    job cannot follow, as a Python warning in the progress bar's line. --chat-template NAME gives
    the format (chatml: "<|im_start|>ROLE\\n...<|im_end|>\\n", as SGLang's chatml writes it), is
    recorded in the rows' settings, and the warning is one job line that names it, above the bar."""
    (tmp_path / "plain").mkdir()
    texts = _chat_job(tmp_path / "plain", base_model, progress=True)
    assert [t.split("ASSISTANT:")[0] for t in texts] == ["USER:q0\n", "USER:q1\n"]  # ('default')
    err = capsys.readouterr().err
    assert re.search("[\r\n]lmnb batch: warning: the model", err), err  # (on a line of its own, not the bar's)
    assert [line for line in err.splitlines() if "warning" in line.lower()] == [
        f"lmnb batch: warning: the model '{base_model}' has no chat template, so the program's roles go out in the "
        "generic 'default' format ('SYSTEM:', 'USER:' and 'ASSISTANT:' lines), which the model may not be trained "
        "on; give its format with --chat-template NAME (e.g. --chat-template chatml, a name in SGLang's registry)"]

    texts = _chat_job(tmp_path, base_model, "--chat-template", "chatml")
    for text, question in zip(texts, ("q0", "q1")):  # (then the token and the assistant's "<|im_end|>\n")
        assert text.startswith(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"), text
        assert text.endswith("<|im_end|>\n"), text
    assert "warning" not in capsys.readouterr().err
    assert {r["settings"]["--chat-template"] for r in read_results(tmp_path / "out.jsonl")} == {"chatml"}
    rows = tmp_path / "rows.jsonl"
    job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress",
                                      "--model", str(base_model), "--device", "cpu", "--chat-template",
                                      "llama-3-instruct"])
    assert job.run(lambda question: None) == 2  # (a resume with another format is other settings)
    assert " holds rows run with other settings (--chat-template: 'chatml' there, 'llama-3-instruct' now); " in (
        capsys.readouterr().err)


@pytest.mark.parametrize("options, said", [
    (["--chat-template", "chatlm"], "(engine): ValueError: unknown chat template 'chatlm'; known: ["),
    (["--openai", "gpt-4o", "--chat-template", "chatml"],
     "(--openai gpt-4o at the official OpenAI API): ValueError: --chat-template goes with --openai MODEL only for a "
     "completion model (add --completion); the server applies a chat model's own template")])
def test_a_chat_template_a_job_cannot_use_is_refused_before_any_cell_runs(tmp_path, options, said):
    """A misspelt --chat-template is offered the closest name, and one for an OpenAI chat model
    (whose server formats its messages) refused, before the set-up cells run, as --device is."""
    import subprocess

    from helpers_export import notebook
    from lmnb.export import export_notebook

    cells = ['open("ran.txt", "w").close()', 'q = "x"', "%%lm\n{user}{q}{/user}{assistant}{gen a max_tokens=1}{/assistant}"]
    source, _ = export_notebook(notebook(*cells), "nb.ipynb", "job.py")
    (tmp_path / "job.py").write_text(source)
    done = subprocess.run([sys.executable, "job.py", "--input", "rows.jsonl", "--output", "out.jsonl", *options],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    last = done.stderr.splitlines()[-1]
    assert done.returncode == 2 and last.startswith("lmnb batch: could not start the backend " + said), last
    assert last.endswith("; did you mean 'chatml'?") == ("chatlm" in options)
    assert not (tmp_path / "ran.txt").exists()


def test_a_resume_with_other_settings_is_refused_before_the_set_up_cells_run(tmp_path, monkeypatch, capsys):
    """A rerun into an output whose rows ran with another parameter value, or keyed otherwise
    (--id-field), or the input file as --output, was refused only by Job.run, after the set-up cells had run (a model load:
    minutes on a GPU box): the set-up cell's file was written, then the job refused. It is refused
    as the job is made now, in the same words, exit 2. A parameter the cell computes (m) is known
    only once the cell ran: a resume that changes it alone is refused by Job.run, as before."""
    from helpers_export import notebook
    from lmnb.export import export_notebook

    cells = [("parameters", "n = 1\nm = len('ab')"), 'with open("setup-ran.txt", "a") as f: f.write("x")', 'q = "x"',
             "%%lm\n{q}{n}{m}{gen a max_tokens=1}"]
    source, _ = export_notebook(notebook(*cells), "nb.ipynb", "job.py")
    monkeypatch.chdir(tmp_path)
    rows = write_rows(tmp_path / "rows.jsonl", [{"q": "a"}, {"q": "b"}])
    out = tmp_path / "out.jsonl"

    def run_script(*options, name="__main__"):  # (as __main__, the job reads its options as it is made)
        monkeypatch.setattr(sys, "argv", ["job.py", "--input", str(rows), "--output", str(out), "--no-progress",
                                          *options])
        ns = {"__name__": name}
        exec(compile(source, "job.py", "exec"), ns)  # (as __main__ it goes on to Job.run: refused before the engine)
        return ns

    first = run_script("--limit", "1", name="first")  # (not __main__: its run is given a scripted backend)
    assert first["job"].run(first["run_row"], backend=ScriptedBackend(lambda p, q: "!")) == 0
    before = out.read_bytes()
    os.remove("setup-ran.txt")
    capsys.readouterr()
    for options, said in [(["--n", "2"], "(parameter n: 1 there, 2 now)"),
                          (["--id-field", "q"], "holds rows written without --id-field")]:
        with pytest.raises(SystemExit) as e:
            run_script(*options)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"lmnb batch: {out} holds rows ") and said in err, err
        assert not os.path.exists("setup-ran.txt")
        assert out.read_bytes() == before
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", str(rows), "--output", str(rows)])
    with pytest.raises(SystemExit) as e:  # (the input file as --output: refused before the set-up too)
        exec(compile(source, "job.py", "exec"), {"__name__": "__main__"})
    assert e.value.code == 2
    assert capsys.readouterr().err == f"lmnb batch: --output {rows} is the input file; write the results to another file\n"
    assert not os.path.exists("setup-ran.txt")
    with pytest.raises(SystemExit) as e:
        run_script("--m", "5")
    assert e.value.code == 2
    assert "(parameter m: 2 there, 5 now)" in capsys.readouterr().err
    assert os.path.exists("setup-ran.txt")  # (the cell that computes m ran first)
    assert out.read_bytes() == before


# what a job's first run and its rerun with the same settings say of their one row
_RAN_THEN_DONE = ("this run: 1 row ran (1 ok, 0 failed), 0 bad input, 0 already done",
                  "this run: 0 rows ran (0 ok, 0 failed), 0 bad input, 1 already done")


def _run_twice_changing_folder(tmp_path, monkeypatch, capsys, model=None) -> tuple[dict, list[str]]:
    """Run, from ``tmp_path``, a job script whose set-up cell changes folder (``os.chdir("sub")``)
    on ``sys.argv``, twice (the second a rerun), as ``__main__`` (so it reads its options and checks
    --output as it is made), each on a scripted backend; the last run's namespace and each run's
    stderr. ``model``: the notebook's ``%lm load`` model (``Job``'s ``model``)."""
    source = ('import os\nfrom lmnb.batch import Job\n'
              f'job = Job("", ["question"], model={model!r}, options_first=True)\nos.chdir("sub")\n')
    said = []
    for _ in range(2):
        monkeypatch.chdir(tmp_path)
        ns = {"__name__": "__main__"}
        exec(compile(source, "job.py", "exec"), ns)
        assert os.getcwd() == str(tmp_path / "sub")
        assert ns["job"].run(run_row, programs=[echo], backend=ScriptedBackend(reply)) == 0
        said.append(capsys.readouterr().err)
    return ns, said


def test_the_command_lines_paths_are_read_from_the_folder_it_ran_in_after_a_set_up_cells_chdir(tmp_path, monkeypatch,
                                                                                                 capsys):
    """A set-up cell's os.chdir("sub") had the job read --input and write --output (relative
    paths) in sub/, and a --model directory looked for there (recorded as the text "ckpt", not its
    path), while the check of --output before the set-up cells, and the user, meant the folder
    the command ran in."""
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "rows.jsonl", [{"question": "top"}])
    (tmp_path / "sub").mkdir()
    write_rows(tmp_path / "sub" / "rows.jsonl", [{"question": "sub"}])  # (what the job read, before)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", "rows.jsonl", "--output", "out.jsonl", "--model", "ckpt",
                                      "--no-progress"])
    _, said = _run_twice_changing_folder(tmp_path, monkeypatch, capsys)
    for err, run in zip(said, _RAN_THEN_DONE):
        assert f"lmnb batch: {tmp_path / 'out.jsonl'}: 1 row (1 ok, 0 failed, 0 bad input)\n  {run}\n" in err
    assert not (tmp_path / "sub" / "out.jsonl").exists()
    [record] = read_results(tmp_path / "out.jsonl")
    assert record["variables"] == {"answer": "TOP"}
    assert record["settings"]["--model"] == os.path.realpath(tmp_path / "ckpt")


def test_a_relative_lmnb_model_is_read_from_the_folder_the_job_ran_in_after_a_set_up_cells_chdir(tmp_path,
                                                                                                  monkeypatch, capsys):
    """As --model: with LMNB_MODEL=ckpt and no --model, a set-up cell's os.chdir("sub") had the
    engine load sub/ckpt, and the records name it, where the check of --output before the set-up
    cells, and the user, meant ckpt in the folder the command ran in."""
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "rows.jsonl", [{"question": "top"}])
    for folder in (tmp_path, tmp_path / "sub"):  # (sub/ckpt: the one the job read, before)
        (folder / "ckpt").mkdir(parents=True)
        (folder / "ckpt" / "config.json").write_text("{}")
    monkeypatch.setenv("LMNB_MODEL", "ckpt")
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", str(tmp_path / "rows.jsonl"), "--output",
                                      str(tmp_path / "out.jsonl"), "--no-progress"])
    ns, said = _run_twice_changing_folder(tmp_path, monkeypatch, capsys)
    for err, run in zip(said, _RAN_THEN_DONE):
        assert run in err
    [record] = read_results(tmp_path / "out.jsonl")
    assert record["settings"]["--model"] == os.path.realpath(tmp_path / "ckpt")
    assert engine_model(ns["job"].args) == str(tmp_path / "ckpt")  # (what make_backend loads)


def test_the_notebooks_relative_lm_load_is_read_from_the_folder_the_job_ran_in_after_a_set_up_cells_chdir(
        tmp_path, monkeypatch, capsys):
    """As --model: a notebook's %lm load ./ckpt (the job's default --model), with a set-up cell's
    os.chdir("sub"), was checked before the set-up cells in the folder the command ran in, and
    loaded after them from sub/, so that the job could not start wherever the checkpoint was (one
    place or the other: "no checkpoint directory at './ckpt'")."""
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "rows.jsonl", [{"question": "top"}])
    (tmp_path / "sub").mkdir()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    monkeypatch.delenv("LMNB_MODEL", raising=False)
    monkeypatch.setattr(sys, "argv", ["job.py", "--input", "rows.jsonl", "--output", "out.jsonl", "--no-progress"])
    ns, said = _run_twice_changing_folder(tmp_path, monkeypatch, capsys, model="./ckpt")
    for err, run in zip(said, _RAN_THEN_DONE):
        assert run in err
    job = ns["job"]
    loaded = engine_model(job.args, job.default_model)  # (what make_backend loads, here in sub/)
    assert os.path.realpath(loaded) == os.path.realpath(tmp_path / "ckpt"), loaded
    assert read_results(tmp_path / "out.jsonl")[0]["settings"]["--model"] is None  # (the notebook's own, as before)


def test_a_jobs_chat_template_option_formats_a_served_base_models_roles(tmp_path, capsys):
    """The same on --backend URL (an lmnb serve of a model with no chat template): the job's
    warning line names --chat-template, and --chat-template chatml is the format the server gets."""
    from helpers_lang import RecordingEngine, live_server

    engine = RecordingEngine(lambda text, params: "ok")
    engine.chat_template, engine.model_path = None, "base-model"
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": "q0"}])
    with live_server(engine) as url:
        for out, options in (("plain.jsonl", []), ("chatml.jsonl", ["--chat-template", "chatml"])):
            job = Job("", ["question"], argv=["--input", str(rows), "--output", str(tmp_path / out), "--no-progress",
                                              "--backend", url, *options])
            assert job.run(lambda question: chat_echo.run(question).sync()) == 0
            warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
            if not options:
                assert engine.prompts[-1] == "USER:q0\nASSISTANT:"
                assert warned == [
                    "lmnb batch: warning: the model 'base-model' has no chat template, so the program's roles go out "
                    "in the generic 'default' format ('SYSTEM:', 'USER:' and 'ASSISTANT:' lines), which the model may "
                    "not be trained on; give its format with --chat-template NAME (e.g. --chat-template chatml, a "
                    "name in SGLang's registry)"]
            else:
                assert engine.prompts[-1] == "<|im_start|>user\nq0<|im_end|>\n<|im_start|>assistant\n"
                assert warned == []


def test_a_ctrl_c_before_the_rows_start_removes_the_results_file_it_made_and_keeps_one_there_before(
        tmp_path, capsys, monkeypatch):
    """A Ctrl-C while the backend started ("interrupted before the rows started") left the empty
    --output the job had made, which reads as a run of no rows, where a backend that fails to
    start removes it; a results file there before (a resume) is left byte for byte."""
    from lmnb.batch import runner as runner_module

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner_module, "make_backend", interrupted)
    rows = write_rows(tmp_path / "rows.jsonl", [{"question": f"q{i}"} for i in range(2)])
    out = tmp_path / "out.jsonl"
    argv = ["--input", str(rows), "--output", str(out), "--no-progress"]
    assert Job("t", ["question"], argv=argv).run(run_row) == 130
    assert capsys.readouterr().err == "lmnb batch: interrupted before the rows started\n"
    assert not out.exists()
    write_rows(rows, [{"question": "q0"}])  # a run of the first row, then a resume with a second
    assert run_job(tmp_path, "--input", rows) == 0
    before = out.read_bytes()
    write_rows(rows, [{"question": f"q{i}"} for i in range(2)])
    capsys.readouterr()
    assert Job("t", ["question"], argv=argv).run(run_row) == 130
    assert capsys.readouterr().err == "lmnb batch: interrupted before the rows started\n"
    assert out.read_bytes() == before and [r["row"] for r in read_results(out)] == [0]


def test_a_results_file_made_through_a_users_link_is_removed_and_the_link_kept(tmp_path):
    """--output out.jsonl, a link the user made to real.jsonl, which is not there yet: a job whose
    backend cannot start removed the link (the user's) and left the empty real.jsonl it made; now
    it removes real.jsonl and keeps the link, as it was before the run. A file that replaced the
    one the store holds (another name's file at the path) is not removed."""
    os.symlink(tmp_path / "real.jsonl", tmp_path / "out.jsonl")
    store = ResultStore(tmp_path / "out.jsonl")
    store.open()
    store.drop_if_unwritten()
    store.close()
    assert os.path.islink(tmp_path / "out.jsonl") and not (tmp_path / "real.jsonl").exists()
    store = ResultStore(tmp_path / "made.jsonl")
    store.open()
    os.replace(tmp_path / "made.jsonl", tmp_path / "moved.jsonl")
    (tmp_path / "made.jsonl").write_text("")  # (a file of the user's now at the path)
    store.drop_if_unwritten()
    store.close()
    assert (tmp_path / "made.jsonl").exists()


@pytest.mark.parametrize("argv", [["--continue-final-message"],
                                  ["--openai", "m", "--completion", "--continue-final-message"]],
                         ids=["no-openai", "completion"])
def test_a_jobs_continue_final_message_goes_with_an_openai_chat_model(argv):
    """A job's --continue-final-message (the notebook's %lm connect flag) is for an OpenAI chat
    model: without --openai, or with --completion, it is refused before any backend starts."""
    from lmnb.batch.options import check_backend_options, job_parser

    args = job_parser(per_row=False).parse_args(argv)
    with pytest.raises(ValueError) as e:
        check_backend_options(args)
    assert str(e.value) == ("--continue-final-message goes with --openai MODEL, a chat model (not with --completion, "
                            "whose gens go anywhere in the text already)")


def test_a_jobs_continue_final_message_where_it_cannot_apply_is_refused_in_the_jobs_words():
    """--continue-final-message with OpenAI's own API (--openai and no --backend URL), or a model
    name lmnb.OpenAI takes for a completion model, was refused in the Python API's words, "lmnb.OpenAI
    continue_final_message=True: ...; leave it out, and ... use @function(num_api_spec_tokens=N)",
    which the job's notebook has no way to use. The refusal names the job's option and the
    notebook's fix; no request is sent (the URL is never reached)."""
    from lmnb.batch.options import job_parser, make_backend

    cases = {
        ("--openai", "gpt-4o"): (
            "--continue-final-message: OpenAI's API has no continue_final_message field (vLLM, SGLang and lmnb serve "
            "servers take it); leave it out, and have the notebook's gens start their assistant messages "
            "({assistant}{gen x}{/assistant})"),
        ("--backend", "http://127.0.0.1:9/v1", "--openai", "gpt-3.5-turbo-instruct"): (
            "--continue-final-message: 'gpt-3.5-turbo-instruct' is used as a completion model, whose gens go "
            "anywhere in the text already; leave it out"),
    }
    for words, message in cases.items():
        args = job_parser(per_row=False).parse_args([*words, "--api-key", "k", "--continue-final-message"])
        with pytest.raises(ValueError) as e:
            make_backend(args)
        assert str(e.value) == message
