"""``%%lm`` and ``%lm`` in an in-process IPython shell (no kernel, no ZMQ), on a tiny checkpoint.

Expected values come from the engine itself, asked directly with the prompt the cell should build
(greedy decoding is deterministic), or from a recording backend that shows what reached it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import contextmanager

import pytest
from helpers_shell import lm_shell
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import lmnb
from lmnb.backend.base import BaseBackend, Completion
from lmnb_engine import SamplingParams
from lmnb_kernel.session import EngineConfig, Session, SessionBackend, get_session


@pytest.fixture(scope="module")
def ip(tiny_llama):
    with lm_shell(tiny_llama) as shell:
        yield shell


@pytest.fixture(autouse=True)
def _session_defaults_put_back(monkeypatch):
    # (a test that unloads and loads the extension leaves a new, equivalent session backend and
    # unset default as lmnb's: each test's are put back, as conftest's guard would, without its warning)
    import lmnb.api

    monkeypatch.setattr(lmnb.api, "_default_backend", lmnb.api._default_backend)
    monkeypatch.setattr(lmnb.api, "_unset_default", lmnb.api._unset_default)


def run(ip, code: str):
    """(ExecutionResult, captured outputs and stdout) of one cell."""
    with capture_output() as out:
        result = ip.run_cell(code)
    return result, out


def summaries(out) -> list[dict]:
    """The lmnb metadata of the cell summaries a run displayed."""
    return [o.metadata["lmnb"] for o in out.outputs if "tokens" in (o.metadata or {}).get("lmnb", {})]


def greedy_result(prompt: str, max_new_tokens: int):
    """The engine's ``GenerateResult`` for ``prompt`` asked directly (with the chat template's
    stops, which lmnb adds to every gen as SGLang does)."""
    backend = get_session().backend()
    stop = list(backend.get_chat_template().stop_str) or None
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0, stop=stop)
    return backend.engine.generate(prompt, params)


def greedy(ip, prompt: str, max_new_tokens: int) -> str:
    return greedy_result(prompt, max_new_tokens).text


def test_cell_captures_what_the_engine_generates_for_the_built_prompt(ip):
    ip.user_ns["topic"] = "the red cat"
    result, out = run(ip, "%%lm --static --temperature 0 --out st\nTell me about {topic}.\nAnswer:{gen answer max_tokens=12}")
    assert result.success, out.stdout
    reference = greedy_result("Tell me about the red cat.\nAnswer:", 12)
    expected = reference.text
    assert ip.user_ns["answer"] == expected
    assert ip.user_ns["st"].text() == "Tell me about the red cat.\nAnswer:" + expected
    [meta] = summaries(out)
    assert meta["captured"] == ["answer"] and meta["status"] == "done"
    assert meta["tokens"]["completion_tokens"] == reference.meta.completion_tokens
    assert meta["tokens"]["prompt_tokens"] == reference.meta.prompt_tokens
    assert f"answer = {expected!r}" in out.outputs[-1].data["text/plain"]


def test_state_continues_from_cache_and_a_failed_cell_leaves_it_unchanged(ip):
    run(ip, "%lm reset")
    first, out1 = run(ip, "%%lm --static --temperature 0 --state chat\nUser: hello there\nBot:{gen r1 max_tokens=6}")
    assert first.success, out1.stdout
    before = get_session().states["chat"].state.text()
    second, out2 = run(ip, "%%lm --static --temperature 0 --state chat --out st2\n\nUser: and you\nBot:{gen r2 max_tokens=6}")
    assert second.success, out2.stdout
    [m1], [m2] = summaries(out1), summaries(out2)
    assert m2["tokens"]["cached_tokens"] >= m1["tokens"]["prompt_tokens"] > 0
    assert ip.user_ns["st2"].text() == before + "\nUser: and you\nBot:" + ip.user_ns["r2"]
    kept = get_session().states["chat"].state.text()
    failed, out3 = run(ip, "%%lm --static --temperature 0 --state chat\n\nmore{gen r3 max_tokens=3}{1 / 0}")
    assert not failed.success and "ZeroDivisionError" in out3.stdout and "line 3, col 27" in out3.stdout
    assert get_session().states["chat"].state.text() == kept  # the copy failed, not the state
    assert "r3" in ip.user_ns  # a variable finished before the failure is still delivered
    failed, out4 = run(ip, "%%lm --static --state chat\n\nlong{gen r4 max_tokens=10000000}")
    assert not failed.success and "max_tokens=10000000 exceeds the model's context length" in out4.stdout
    assert "branch" not in out4.stdout  # the cell ran on a copy of the state, not on a fork branch of it
    failed, out5 = run(ip, "%%lm --static\nQ:{fork 5}{gen r5 max_tokens=10000000}{join}")
    assert not failed.success and out5.stdout.count("exceeds the model's context length") == 1  # it was 5 times
    # (the first failed branch ends the join and aborts those still running: others may have failed alike by then)
    told = re.search(r"\d of 5 fork branches failed: (branch(es)? [0-4][-, 0-4]*): Gen\('r5'\) failed: ValueError: "
                     r"prompt of", out5.stdout)
    assert told, out5.stdout
    view = "".join(o.data.get("text/html", "") for o in out5.outputs)  # the cell's view says it alike, once
    assert f"{told[1]}: Gen('r5') failed" in view and view.count("exceeds the model's context") == 1
    assert get_session().states["chat"].state.text() == kept
    assert "%lm reset" not in out4.stdout  # lowering max_tokens is the fix there
    run(ip, "%lm reset")
    # a state grown past the context: the engine's "shorten the prompt" alone left the user guessing
    context_len = get_session().engine("test").context_len
    grown, out6 = run(ip, "%%lm --static --temperature 0 --state long\n" + "word " * context_len)
    assert grown.success, out6.stdout
    failed, out7 = run(ip, "%%lm --static --state long\nmore{select c choices=[' a', ' b']}")
    assert not failed.success and "exceeds the model's context length" in out7.stdout
    assert "the state 'long' has grown past the model's context; `%lm reset long` starts it afresh" in out7.stdout
    # a short state and a cell whose own text is too long: "the state has grown past the context" misled
    small, out8 = run(ip, "%%lm --static --temperature 0 --state small\nHello there.")
    assert small.success, out8.stdout
    held = len(get_session().engine("test").encode(get_session().states["small"].state.text()))
    failed, out9 = run(ip, "%%lm --static --state small\n" + "word " * context_len + "{gen w max_tokens=1}")
    assert not failed.success and "has grown past" not in out9.stdout
    assert (f"the state 'small' holds {held} of those tokens (the model's context is {context_len}): shorten this "
            "cell's text, or `%lm reset small` starts it afresh") in out9.stdout
    # a state that fills most of the context, and a cell whose gen fits without it: the engine's "shorten the
    # prompt or lower max_tokens" alone named the cell's one word, not the state that holds the tokens
    encode = get_session().engine("test").encode
    words = next(n for n in range(1, context_len) if len(encode("word " * n)) >= context_len // 2)
    half, out10 = run(ip, "%%lm --static --temperature 0 --state half\n" + "word " * words)
    assert half.success, out10.stdout
    held = len(encode(get_session().states["half"].state.text()))
    failed, out11 = run(ip, f"%%lm --static --state half\nmore{{gen w max_tokens={context_len // 2}}}")
    prompt = len(encode(get_session().states["half"].state.text() + "more"))
    assert not failed.success and f"prompt of {prompt} tokens + max_tokens={context_len // 2} exceeds" in out11.stdout
    assert (f"the state 'half' holds {held} of those {prompt} tokens: `%lm reset half` starts it afresh, or continue "
            "in a new --state") in out11.stdout


def _refused_for_max_tokens(ip, options: str, limit: int):
    """(The refusal's expected start, the cell's outputs) of a ``{gen w}`` cell with ``options`` whose text
    fits the context but not with ``limit`` new tokens."""
    context_len = get_session().engine("test").context_len
    text = "x " * ((context_len - limit + 10) // 2)
    n = len(get_session().engine("test").encode(text))
    assert n + limit > context_len > n  # the text fits; the text and the limit's new tokens do not
    failed, out = run(ip, f"%%lm --static {options}\n" + text + "{gen w}")
    assert not failed.success
    return (f"prompt of {n} tokens + max_tokens={limit} exceeds the model's context length of {context_len} tokens; "
            f"shorten the prompt by at least {n + limit - context_len} tokens or lower max_tokens to at most "
            f"{context_len - n}"), out


def _view_text(out) -> str:
    """The cell's view as it was left (its static text), with its error line."""
    return next(o.data["text/plain"] for o in out.outputs if "── main ──" in o.data.get("text/plain", "")
                and "error" in o.data["text/plain"])


def test_a_gen_without_max_tokens_refused_for_the_default_says_so(ip):
    """{gen x} on a long prompt failed for "max_tokens=128", which the cell never wrote."""
    refusal, out = _refused_for_max_tokens(ip, "", 128)
    assert (f"{refusal} (the gen has no max_tokens of its own and took lmnb's default of 128: give it its own "
            "max_tokens=N, or set the cell's --max-tokens N)") in out.stdout


def test_a_gen_refused_for_the_cells_max_tokens_names_the_option(ip):
    """--max-tokens 30 made the refusal say "max_tokens=30 (the default of a gen without
    max_tokens)", as if 30 were lmnb's own default; it names the cell's option now, in the cell's
    error and in its view, which said "the run's max_new_tokens=30"."""
    refusal, out = _refused_for_max_tokens(ip, "--max-tokens 30", 30)
    said = (f"{refusal} (the gen has no max_tokens of its own and took the cell's --max-tokens 30: give it its own "
            "max_tokens=N, or lower that)")
    assert said in out.stdout
    assert said in _view_text(out)


def test_a_cells_max_tokens_of_128_is_named_as_the_cells_not_as_lmnbs_default(ip):
    """--max-tokens 128 is lmnb's default number, but the cell set it: the refusal said it was the
    default of a gen without max_tokens."""
    refusal, out = _refused_for_max_tokens(ip, "--max-tokens 128", 128)
    assert (f"{refusal} (the gen has no max_tokens of its own and took the cell's --max-tokens 128: give it its own "
            "max_tokens=N, or lower that)") in out.stdout


def test_a_gen_the_engine_refuses_as_it_runs_points_at_its_hole(ip):
    """{gen w max_tokens=N} past the context failed with "ProgramError: Gen('w') failed: ..." and no
    line or column, where a hole's own failure ({1/0}) points at the hole; the engine's refusal is
    now placed as those are: the cell's line 3 (line 1 is %%lm), column 8 (the "{" after "  there")."""
    context_len = get_session().engine("test").context_len
    failed, out = run(ip, "%%lm --static\nHello\n  there{gen w max_tokens=" + f"{context_len * 2}" + "}")
    assert not failed.success
    n = len(get_session().engine("test").encode("Hello\n  there"))
    assert (f"line 3, col 8: Gen('w') failed: ValueError: prompt of {n} tokens + max_tokens={context_len * 2} exceeds "
            f"the model's context length of {context_len} tokens; lower max_tokens to at most {context_len - n}\n"
            "      there{gen w max_tokens=" + f"{context_len * 2}" + "}\n           ^") in out.stdout


def test_a_failed_cells_view_says_its_error_as_the_cell_error_does(ip):
    """The view's error line said a hole's failure in lmnb's inner words ("ProgramError: the body of
    program 'cell' failed: TemplateRuntimeError: line 2, ..."), above the CellError saying it plainly."""
    ip.user_ns["lab"] = "ab"
    failed, out = run(ip, "%%lm --static\n{select x choices=lab}")
    assert not failed.success and str(failed.error_in_exec).startswith(
        "line 2, col 19: choices must be a non-empty list of strings, not a str ('ab'); list the choices, e.g. "
        "['yes', 'no']\n")
    [text] = [o.data["text/plain"] for o in out.outputs if "lmnb cell" in o.data.get("text/plain", "")][-1:]
    assert f"\nerror: {failed.error_in_exec}\n" in text and "body of program" not in text, text


def test_a_gen_the_engine_refuses_in_fork_branches_points_at_its_hole(ip):
    """In a fork the same refusal was 'ForkError: 2 of 2 fork branches failed: ...' with no place,
    though every failed branch failed at one hole: that hole is pointed at (line 4 of the cell, with
    %%lm as line 1; column 4: the "{" after "  x"), nested forks and forks over items too. The first
    failed branch ends the join and the branches still running are aborted (so a branch that would
    have failed alike may be told aborted: both readings are taken)."""
    context_len = get_session().engine("test").context_len
    over = context_len * 2
    told = r"(2 of 2 fork branches failed: branches 0-1|1 of 2 fork branches failed: branch [01]): Gen\('w'\) failed"
    for body, branches in ((f"{{fork 2}}\n  x{{gen w max_tokens={over}}}\n{{join}}", told),
                           (f"{{fork 2}}\n  x{{gen w max_tokens={over}}}\n{{join}}".replace("{fork 2}", "{fork 2}\n{fork 1}")
                            .replace("{join}", "{join}\n{join}"), None),
                           (f"{{fork n in [1, {over}]}}\n  x{{gen w max_tokens=n}}\n{{join}}", "1 of 2 fork branches")):
        failed, out = run(ip, "%%lm --static\nHi\n" + body)
        assert not failed.success
        line = body.splitlines()[1 if branches else 2]
        assert f"CellError\x1b[0m: line {4 if branches else 5}, col 4: " in out.stdout, out.stdout
        assert f"exceeds the model's context length of {context_len} tokens" in out.stdout
        assert out.stdout.rstrip().endswith(f"    {line}\n       ^"), out.stdout
        if branches:
            assert re.search(branches, out.stdout), out.stdout
    # both branches' first gen asks for more than the 512-token context, which the engine refuses:
    # when the first refusal (either branch's: they run at once) ends the join, the other branch has
    # been refused already (both failed at the hole of gen a) or not yet (it is aborted); either
    # way its second gen, which the engine would refuse at another hole, never runs, and the hole
    # of gen a is told
    failed, out = run(ip, f"%%lm --static\nHi\n{{fork n in [{over}, 4000]}}\n{{gen a max_tokens=n ignore_eos=True}}"
                          f"{{gen b max_tokens={over + 4000} - n}}\n{{join}}")
    assert not failed.success
    assert re.search(r"CellError\x1b\[0m: line 4, col 1: (1 of 2 fork branches failed: branch ([01]): Gen\('a'\) "
                     r"failed: .*; the branch still running \((?!\2)[01]\) was aborted\n|2 of 2 fork branches failed: branch 0: "
                     r"Gen\('a'\) failed: .*; branch 1: Gen\('a'\) failed: )", out.stdout), out.stdout


def test_a_python_cells_own_run_names_run_not_the_cells_option(ip):
    """A --python cell's body that calls run(max_new_tokens=...) itself: that run's limit is the
    Python call's, not the cell's --max-tokens (which only the cell's own program takes)."""
    context_len = get_session().engine("test").context_len
    ip.user_ns["long_text"] = "x " * ((context_len - 20) // 2)
    ip.user_ns["errors"] = errors = []
    failed, out = run(ip, "%%lm --python --static --max-tokens 5\n"
                          "@lmnb.function\ndef inner(t):\n    t += long_text + lmnb.gen('w')\n"
                          "errors.append(str(inner.run(max_new_tokens=30).error()))")
    assert failed.success, out.stdout
    assert errors[0].endswith("took run(max_new_tokens=30): give it its own max_tokens=N, or lower that)")


def test_a_cell_that_raises_as_its_program_starts_ends_its_view_as_an_error(ip, monkeypatch):
    """Only Ctrl-C ended the view when the program could not start (its thread, here): the view was
    left saying "running", as if the cell still ran, though the cell had raised."""
    import lmnb_kernel.magics

    def no_thread(*args, **kwargs):
        raise RuntimeError("run(stream=True) could not start the thread for the program body")

    monkeypatch.setattr(lmnb_kernel.magics, "start_run", no_thread)
    failed, out = run(ip, "%%lm --static\nHello{gen w max_tokens=2}")
    assert isinstance(failed.error_in_exec, RuntimeError)
    views = [o for o in out.outputs if (o.metadata or {}).get("lmnb", {}).get("view") == "run"]
    assert views[-1].metadata["lmnb"]["status"] == "error"
    assert "RuntimeError: run(stream=True) could not start the thread" in views[-1].data["text/plain"]


def test_fork_join_gathers_branch_values_and_select_picks_a_choice(ip):
    ip.user_ns["colors"] = ["red", "blue"]
    cell = ("%%lm --static --temperature 0\nPick:\n{fork c in colors}\nThe {c} one is{gen why max_tokens=4}\n{join}\n"
            'Best:{select best choices=[" cat", " dog"]}')
    result, out = run(ip, cell)
    assert result.success, out.stdout
    why = ip.user_ns["why"]
    assert why == [greedy(ip, f"Pick:\nThe {c} one is", 4) for c in ["red", "blue"]]
    assert ip.user_ns["best"] in (" cat", " dog")
    view = [o.data for o in out.outputs if "application/vnd.lmnb.view+json" in o.data][-1]
    lanes = view["application/vnd.lmnb.view+json"]["lanes"]
    assert [ln["parent"] for ln in lanes] == [None, "main", "main"]


def test_a_result_named_get_ipython_is_refused_before_the_cell_runs(ip):
    """{gen get_ipython} set the kernel variable IPython calls to run every magic: each later %%lm
    or %lm cell failed with "TypeError: 'str' object is not callable"."""
    try:
        for cell in ("%%lm --quiet --temperature 0\nSay:{gen get_ipython max_tokens=1}",
                     "%%lm --quiet --out get_ipython\nSay:{gen ok max_tokens=1}",
                     # a --python body's literal name (it set the variable, as the template's was refused)
                     "%%lm --quiet --python\ns += 'Say:' + lmnb.gen('get_ipython', max_tokens=1)"):
            result, out = run(ip, cell)
            assert not result.success and type(result.error_in_exec).__name__ == "UsageError"
            assert "'get_ipython' would replace IPython's get_ipython" in str(result.error_in_exec)
            assert "e.g. get_ipython_" in str(result.error_in_exec)
            assert ip.user_ns["get_ipython"] == ip.get_ipython  # still IPython's
    finally:  # (the module's other tests share this shell)
        ip.user_ns["get_ipython"] = ip.get_ipython
    result, out = run(ip, "%%lm --quiet --temperature 0\nSay:{gen after max_tokens=1}")
    assert result.success and ip.user_ns["after"] == greedy(ip, "Say:", 1)


def test_python_mode_runs_a_program_body_with_state_s(ip):
    assert ip.user_ns["lmnb"] is lmnb  # defined by the extension, as docs/CELL_LANGUAGE.md says
    ip.user_ns["who"] = "Bo"
    result, out = run(ip, '%%lm --python --static --temperature 0\ns += "Hi " + who + ":"\ns += lmnb.gen("hi", max_tokens=5)')
    assert result.success, out.stdout
    assert ip.user_ns["hi"] == greedy(ip, "Hi Bo:", 5)
    bad, out = run(ip, "%%lm --python --static\ns += 'x'\ny = missing_name")
    assert not bad.success and "line 3: NameError" in out.stdout and "lmnb." not in out.stdout
    # a bare NameError named no fix for a primitive written as SGLang's examples do (a new user's find)
    bad, out = run(ip, '%%lm --python --static\ns += "hi" + gen("x", max_tokens=3)')
    assert not bad.success and out.stdout.rpartition("CellError\x1b[0m: ")[2].strip() == (
        "line 2: NameError: name 'gen' is not defined; in a --python cell, write lmnb.gen (or run "
        "`from lmnb import gen` in a cell above)")
    del ip.user_ns["lmnb"]  # as %reset -f does
    again, out = run(ip, '%%lm --python --static --temperature 0\ns += "Hi:" + lmnb.gen("hi2", max_tokens=2)')
    assert again.success, out.stdout


def test_a_hole_whose_value_is_lmnb_gen_is_refused_not_sent_as_text(ip):
    """{lmnb.gen("a", max_tokens=3)} (SGLang's s += "A:" + sgl.gen("a") in a hole) ran as done, with the
    prompt "Q: hi\nA: Gen('a')", 0 generated tokens and no variable a."""
    ip.user_ns["q"] = "hi"
    ip.user_ns.pop("a", None)  # (the shell is the module's: an earlier test's cell may have set a)
    bad, out = run(ip, '%%lm --static\nQ: {q}\nA: {lmnb.gen("a", max_tokens=3)}')
    assert type(bad.error_in_exec).__name__ == "CellError" and "a" not in ip.user_ns
    assert str(bad.error_in_exec).startswith(
        "line 3, col 4: {lmnb.gen(\"a\", max_tokens=3)} is an lmnb primitive, Gen('a'), not text: a hole's value "
        "becomes prompt text (its repr), and the primitive would not run; did you mean {gen a max_tokens=3}?\n")
    # in a list (or a tuple, dict, set) it was still sent, as "[Gen('a')]"
    bad, out = run(ip, '%%lm --static\nQ: {q}\nA: {[lmnb.gen("a", max_tokens=3)]}')
    assert type(bad.error_in_exec).__name__ == "CellError" and "a" not in ip.user_ns
    assert str(bad.error_in_exec).startswith(
        "line 3, col 4: {[lmnb.gen(\"a\", max_tokens=3)]} holds an lmnb primitive, Gen('a'), at [0], not text: a "
        "hole's value becomes prompt text, a list's text is its items' repr, and the primitive would not run\n")


def test_a_python_cell_formatting_a_primitive_into_an_f_string_is_refused_not_sent_as_text(ip):
    """s += f"A: {lmnb.gen('a', max_tokens=3)}" in a --python cell ran as done, with the prompt
    "A: Gen('a')", no gen and no variable a; so did a primitive a user's function returned."""
    ip.user_ns["make_gen"] = lambda: lmnb.gen("a", max_tokens=3)
    ip.user_ns.pop("a", None)  # (the shell is the module's: an earlier test's cell may have set a)
    for line in ("s += f\"A: {lmnb.gen('a', max_tokens=3)}\"", 's += f"A: {make_gen()}"'):
        bad, out = run(ip, f"%%lm --python --static\ns += 'Q: hi\\n'\n{line}")
        assert not bad.success and "a" not in ip.user_ns
        assert out.stdout.rpartition("CellError\x1b[0m: ")[2].strip() == (
            "line 3: TypeError: Gen('a') is an lmnb primitive: in an f-string or format() it becomes its repr as "
            'text and never runs; add it to the state instead: s += "A: " + lmnb.gen(...) (or s += "A: ", then '
            's += lmnb.gen(...)), not s += f"A: {lmnb.gen(...)}"; for the repr itself (debugging), write {x!r} or '
            "repr(x)")


def test_a_python_cells_result_that_no_variable_can_hold_is_refused_or_kept_in_the_state(ip):
    """gen("my answer") in a --python body put a kernel variable 'my answer' in the namespace,
    which no code can read, without a word. A literal name is refused at it before anything runs;
    a name computed as the body runs keeps its result in the state only, said on stderr."""
    result, out = run(ip, '%%lm --python --static --temperature 0\ns += "Q:"\ns += lmnb.gen("my answer", max_tokens=3)')
    assert type(result.error_in_exec).__name__ == "CellError"
    assert str(result.error_in_exec).startswith("line 3, col 15: lmnb.gen('my answer') names the kernel variable its "
                                                "result goes in, but 'my answer' is no Python name, so no code could "
                                                "read the variable; name it 'my_answer'")
    assert "my answer" not in ip.user_ns and summaries(out) == []  # (nothing ran)
    result, out = run(ip, '%%lm --python --static --temperature 0 --out st\nname = "my " + "answer"\ns += "Q:"\n'
                          's += lmnb.gen(name, max_tokens=3)\ns += lmnb.gen("fine", max_tokens=2)')
    assert result.success, out.stdout
    assert "my answer" not in ip.user_ns and ip.user_ns["st"]["my answer"] == greedy(ip, "Q:", 3)
    assert ip.user_ns["fine"] == ip.user_ns["st"]["fine"]  # (the other result is a variable as before)
    # the summary lists the variables the cell set: 'my answer = ...' named one that is not there
    [summary] = [o for o in out.outputs if "tokens" in (o.metadata or {}).get("lmnb", {})]
    assert summary.metadata["lmnb"]["captured"] == ["fine"] and "my answer" not in summary.data["text/plain"]
    # (it said "st['my answer'] reads it after %%lm --out st", whatever the cell's --out and --state)
    assert out.stderr == ("lmnb: the result 'my answer' is in no kernel variable: 'my answer' is no Python name (the "
                          "result is kept in the cell's state only, st['my answer'] reads it); name it 'my_answer' to "
                          "have the variable\n")
    computed = 'name = "my " + "answer"\ns += "Q:"\ns += lmnb.gen(name, max_tokens=3)'
    result, out = run(ip, "%%lm --python --static --temperature 0\n" + computed)
    assert result.success and out.stderr == (
        "lmnb: the result 'my answer' is in no kernel variable: 'my answer' is no Python name (the result was kept "
        "nowhere: run the cell again with --out st, and st['my answer'] reads it); name it 'my_answer' to have the "
        "variable\n")
    result, out = run(ip, "%%lm --python --static --temperature 0 --state talk\n" + computed)
    assert result.success and out.stderr == (
        "lmnb: the result 'my answer' is in no kernel variable: 'my answer' is no Python name (the result is kept in "
        "state 'talk' only, which a later %%lm --state talk --out st cell reads as st['my answer']); name it "
        "'my_answer' to have the variable\n")
    run(ip, "%lm reset talk")
    del ip.user_ns["st"], ip.user_ns["fine"]


def test_a_python_cells_fork_branch_result_named_with_a_space_runs(ip):
    # b += lmnb.gen("idea text") in fork branches the body reads back itself (b["idea text"]) was
    # refused before the cell ran, though no branch's result becomes a kernel variable unjoined;
    # joined, the result is kept in the state only, said on stderr, as a computed name's is
    body = ('f = s.fork(2)\nfor b in f:\n    b += "Q:" + lmnb.gen("idea text", max_tokens=2)\n'
            's += "|".join(b["idea text"] for b in f)\n')
    result, out = run(ip, "%%lm --python --static --temperature 0 --out st\n" + body)
    assert result.success, out.stdout
    assert "idea text" not in ip.user_ns and out.stderr == ""
    assert ip.user_ns["st"].text() == "|".join([greedy(ip, "Q:", 2)] * 2)
    result, out = run(ip, "%%lm --python --static --temperature 0\n" + body + "f.join()\n")
    assert result.success and "idea text" not in ip.user_ns
    assert out.stderr.startswith("lmnb: the result 'idea text' is in no kernel variable: 'idea text' is no Python name")
    del ip.user_ns["st"]


def test_a_python_cells_out_naming_its_literal_gen_is_refused_before_the_cell_runs(ip):
    # --out o overwrote gen("o")'s variable with the state; a literal name is known before the cell
    # runs now, so --out is checked against it as against a template's {gen o}
    result, out = run(ip, '%%lm --python --static --out o\ns += "Q:" + lmnb.gen("o", max_tokens=3)')
    assert type(result.error_in_exec).__name__ == "UsageError" and "o" not in ip.user_ns
    assert str(result.error_in_exec).startswith("--out o is also a variable the cell captures")


@pytest.mark.parametrize("cell, what, name", [
    ("%%lm --quiet --temperature 0\nSay:{gen print max_tokens=2}", "the result", "print"),
    ("%%lm --quiet --temperature 0\nSay:{select list choices=['a', 'b']}", "the result", "list"),
    ("%%lm --quiet --python\ns += 'Say:' + lmnb.gen('len', max_tokens=1)", "the result", "len"),
    ("%%lm --quiet --out vars --python\ns += 'x'", "--out", "vars")])
def test_a_result_named_like_a_builtin_is_refused_before_the_cell_runs(ip, cell, what, name):
    """{gen print} made print a kernel variable, which hid print() from every later cell (print(...)
    called the text); a warning on stderr said so once, and the cell ran. It is refused before it
    runs now, with the fix, and the builtin stays."""
    result, out = run(ip, cell)
    assert not result.success and type(result.error_in_exec).__name__ == "UsageError"
    # (a --python body has no holes: it said "a later hole of this cell calling len(...)" there too)
    holes = (f", and a later hole of this cell calling {name}(...) would call the result"
             if what == "the result" and "--python" not in cell else "")
    assert str(result.error_in_exec) == (f"{what} {name!r} would hide Python's builtin {name}: it becomes a kernel "
                                         f"variable, which every later cell reads instead{holes}; rename it, "
                                         f"e.g. {name}_")
    assert name not in ip.user_ns


@pytest.mark.parametrize("name, refusal", [
    # (it said "and a later hole of this cell calling print(...) would call the result": a Python body has no holes)
    ("print", "the result 'print' would hide Python's builtin print: it becomes a kernel variable, which every later "
              "cell reads instead; rename it, e.g. print_"),
    ("lmnb", "the result 'lmnb' would replace the lmnb module, which %%lm --python bodies call (lmnb.gen, "
             "lmnb.select), so every later --python cell would fail; rename it, e.g. lmnb_")])
def test_a_python_cells_result_named_like_a_builtin_as_it_runs_is_refused_and_its_other_results_kept(ip, name,
                                                                                                     refusal):
    """A --python body's result named as the body ran (gen(name), name = "pri" + "nt") is known only
    then, so the check before the cell runs passed it, and it became a kernel variable that hid
    print() from every later cell (or replaced the lmnb module), without a word. It is refused as
    the results go in the namespace, in the words of that check, and the cell's other results go in
    as before; the refusal names them, and where the refused one is kept: without --out, the state
    that held it is gone (it said "st['print'] reads it after %%lm --out st"), so a re-run with
    --out reads it; with --state, the named state holds it."""
    body = (f'name = "{name[:2]}" + "{name[2:]}"\ns += "Q:" + lmnb.gen("fine", max_tokens=2)\n'
            's += lmnb.gen(name, max_tokens=3)')
    try:
        result, out = run(ip, "%%lm --python --static --temperature 0\n" + body)
        assert type(result.error_in_exec).__name__ == "UsageError"
        fine = greedy(ip, "Q:", 2)
        assert ip.user_ns["fine"] == fine and ip.user_ns.get("print", print) is print and ip.user_ns["lmnb"] is lmnb
        assert str(result.error_in_exec) == (
            f"{refusal} (its name was computed as the body ran: the result was kept nowhere: run the cell again with "
            f"--out st, and st[{name!r}] reads it)\nthe cell's other results are set: fine")
        [summary] = summaries(out)
        assert summary["captured"] == ["fine"]
        result, out = run(ip, "%%lm --python --static --temperature 0 --out st\n" + body)
        assert str(result.error_in_exec) == (
            f"{refusal} (its name was computed as the body ran: the result is kept in the cell's state only, "
            f"st[{name!r}] reads it)\nthe cell's other results are set: fine, st (--out)")
        assert ip.user_ns["st"][name] == greedy(ip, "Q:" + fine, 3) and ip.user_ns["lmnb"] is lmnb
        result, out = run(ip, "%%lm --python --static --temperature 0 --state conv\n" + body)
        assert str(result.error_in_exec) == (
            f"{refusal} (its name was computed as the body ran: the result is kept in state 'conv' only, which a "
            f"later %%lm --state conv --out st cell reads as st[{name!r}])\nthe cell's other results are set: fine")
        result, out = run(ip, "%%lm --python --static --state conv --out st\ns += '!'")  # (what the hint says)
        assert result.success and ip.user_ns["st"][name] == greedy(ip, "Q:" + fine, 3)
    finally:  # (the module's other tests share this shell)
        ip.user_ns["lmnb"] = lmnb
        run(ip, "%lm reset conv")
        for key in ("print", "fine", "st"):
            ip.user_ns.pop(key, None)


_IPYTHONS = ("would replace IPython's {name}, one of the names it defines for itself (In, Out, _ih, _oh, _dh, exit, "
             "quit), which IPython and later cells read ({{gen Out}} made every cell that shows a value fail); "
             "rename it, e.g. {free}")
_DUNDER = ("is a dunder name (__...__), which Python and IPython keep for themselves: as a kernel variable it could "
           "break every later cell (__builtins__ made each one fail); rename it, e.g. {free}")
_HISTORY = ("is one of IPython's history names (_, __, ___, _i, _ii, _iii, _iN, _N), which IPython sets itself as "
            "cells run: it would overwrite the result, or the result its history; rename it, e.g. {free}")


@pytest.mark.parametrize("cell, what, name, refusal, free", [
    ("\nSay:{gen __builtins__ max_tokens=1}", "the result", "__builtins__", _DUNDER, "builtins"),
    ("\nSay:{gen Out max_tokens=1}", "the result", "Out", _IPYTHONS, "Out_"),
    ("\nSay:{gen _oh max_tokens=1}", "the result", "_oh", _IPYTHONS, "oh"),
    ("\nSay:{select In choices=['a', 'b']}", "the result", "In", _IPYTHONS, "In_"),
    ("\nSay:{gen _ih max_tokens=1}", "the result", "_ih", _IPYTHONS, "ih"),
    ("\nSay:{gen quit max_tokens=1}", "the result", "quit", _IPYTHONS, "quit_"),
    ("\nSay:{gen exit max_tokens=1}", "the result", "exit", _IPYTHONS, "exit_"),
    ("\nSay:{gen _i1 max_tokens=1}", "the result", "_i1", _HISTORY, "i1"),
    ("\nSay:{gen _ii max_tokens=1}", "the result", "_ii", _HISTORY, "ii"),
    ("\nSay:{gen _ max_tokens=1}", "the result", "_", _HISTORY, "value"),
    ("\nSay:{gen _7 max_tokens=1}", "the result", "_7", _HISTORY, "value7"),
    ("\nSay:{gen __import__ max_tokens=1}", "the result", "__import__", _DUNDER, "import_"),  # ("import": a keyword)
    ("--out __name__\nSay:{gen ok max_tokens=1}", "--out", "__name__", _DUNDER, "name"),
    ("--python\ns += 'Say:' + lmnb.gen('Out', max_tokens=1)", "the result", "Out", _IPYTHONS, "Out_"),
])
def test_a_result_named_as_ipythons_own_is_refused_before_the_cell_runs(ip, cell, what, name, refusal, free):
    """{gen __builtins__} made every later Python cell fail (TypeError: string indices must be
    integers), {gen Out} / {gen _oh} every cell that shows a value; In, _ih, quit, exit, dunder and
    history names (_i1, which IPython overwrites as cells run) were taken without a word. Each is
    refused before the cell runs now, with a name that is free, and Python cells still run."""
    before = ip.user_ns.get(name, "unset")
    result, out = run(ip, f"%%lm --quiet --temperature 0 {cell}")
    assert type(result.error_in_exec).__name__ == "UsageError"
    assert str(result.error_in_exec) == f"{what} {name!r} " + refusal.format(name=name, free=free)
    assert ip.user_ns.get(name, "unset") is before and summaries(out) == []  # (nothing ran)
    shown, out = run(ip, "1 + 1")
    assert shown.success and ip.user_ns["Out"][ip.execution_count - 1] == 2


def test_the_name_a_refusal_offers_is_none_of_the_cells_other_results(ip):
    # it offered Out_ for a result the cell (a name computed as the --python body ran) also named
    # Out_, so the fix made one result overwrite the other
    body = 'name = "O" + "ut"\ns += "Q:" + lmnb.gen("Out_", max_tokens=1)\ns += lmnb.gen(name, max_tokens=1)'
    try:
        result, out = run(ip, "%%lm --python --static --temperature 0\n" + body)
        assert type(result.error_in_exec).__name__ == "UsageError"
        first = str(result.error_in_exec).splitlines()[0]
        assert first.startswith("the result 'Out' would replace IPython's Out") and "; rename it, e.g. Out__ (" in first
        assert ip.user_ns["Out_"] == greedy(ip, "Q:", 1)  # (the other result, kept)
    finally:
        ip.user_ns.pop("Out_", None)


def test_the_name_a_refusal_offers_is_no_kernel_variable_already(ip):
    # the check could not see the namespace: it offered print_ where print_ held the user's value,
    # so following the fix overwrote it (as --out a_state, and a --python body's computed name)
    mine = {"print_": "mine", "a_state": "mine too", "Out_": "mine three", "if_": "mine four"}
    ip.user_ns.update(mine)
    try:
        result, _ = run(ip, "%%lm --quiet --temperature 0\nSay:{gen print max_tokens=1}")
        assert str(result.error_in_exec).endswith("; rename it, e.g. print__")
        result, _ = run(ip, "%%lm --quiet --out a\nX:{gen a max_tokens=1}")
        assert str(result.error_in_exec).endswith("; give --out another name, e.g. --out a_state_")
        result, _ = run(ip, "%%lm --quiet --out if\nX:{gen a max_tokens=1}")
        assert str(result.error_in_exec).endswith("; pick another name, e.g. --out if__")
        body = 'name = "O" + "ut"\ns += "Q:" + lmnb.gen(name, max_tokens=1)'
        result, _ = run(ip, "%%lm --python --static --quiet --temperature 0\n" + body)
        assert "; rename it, e.g. Out__ (" in str(result.error_in_exec)
        assert {name: ip.user_ns[name] for name in mine} == mine
    finally:
        for name in mine:
            ip.user_ns.pop(name, None)


def test_a_result_may_replace_a_name_the_start_up_hid_from_who_as_a_python_cell_may(ip):
    # IPython's user_ns_hidden also holds what the kernel's start-up or an extension set (here pushed
    # as an extension does, as a start-up file's `import numpy as np` is): the user's to replace,
    # as `plot = 1` in a Python cell does; only IPython's own names are refused
    ip.push({"plot": print}, interactive=False)
    try:
        result, out = run(ip, "%%lm --quiet --temperature 0\nSay:{gen plot max_tokens=1}")
        assert result.success, out.stdout
        assert ip.user_ns["plot"] == greedy(ip, "Say:", 1)
    finally:
        ip.user_ns.pop("plot", None)
        ip.user_ns_hidden.pop("plot", None)


def test_a_result_the_cell_set_is_the_users_variable_and_its_rerun_runs(ip):
    # its results went in the namespace hidden from %who (IPython's user_ns_hidden), unlike a Python
    # cell's assignments
    for _ in range(2):
        result, out = run(ip, "%%lm --quiet --temperature 0 --out mine_st\nSay:{gen mine max_tokens=1}")
        assert result.success, out.stdout
    assert ip.user_ns["mine"] == greedy(ip, "Say:", 1)
    assert {"mine", "mine_st"} <= set(ip.run_line_magic("who_ls", ""))
    del ip.user_ns["mine"], ip.user_ns["mine_st"]


def test_a_python_cells_result_named_as_ipythons_own_as_it_runs_is_refused_and_its_other_results_kept(ip):
    """A name computed as the body ran (name = "__built" + "ins__") passed the check before the cell
    ran, and the result replaced __builtins__: every later Python cell failed."""
    body = ('name = "__built" + "ins__"\ns += "Q:" + lmnb.gen("fine", max_tokens=2)\n'
            's += lmnb.gen(name, max_tokens=3)')
    result, out = run(ip, "%%lm --python --static --temperature 0 --out st\n" + body)
    assert str(result.error_in_exec) == (
        "the result '__builtins__' " + _DUNDER.format(free="builtins") + " (its name was computed as the body ran: "
        "the result is kept in the cell's state only, st['__builtins__'] reads it)\nthe cell's other results are set: "
        "fine, st (--out)")
    assert ip.user_ns["st"]["__builtins__"] == greedy(ip, "Q:" + ip.user_ns["fine"], 3)
    shown, out = run(ip, "len('abc')")
    assert shown.success and ip.user_ns["Out"][ip.execution_count - 1] == 3
    del ip.user_ns["st"], ip.user_ns["fine"]


def test_a_hole_calling_ipythons_display_says_whose_it_is(ip):
    # "'display' is a Python builtin that a hole does not provide": IPython adds it to the builtins
    ip.user_ns["x"] = 1
    result, out = run(ip, "%%lm --quiet\nSay:{display(x)}")
    assert type(result.error_in_exec).__name__ == "CellError"
    assert str(result.error_in_exec).startswith(
        "line 2, col 6: 'display' is IPython's display, which a kernel adds to the builtins and a hole does not "
        "provide\n")


@pytest.mark.parametrize("cell, what", [("%%lm --quiet --temperature 0\nSay:{gen lmnb max_tokens=1}", "the result"),
                                        ("%%lm --quiet --out lmnb\nSay:{gen ok max_tokens=1}", "--out"),
                                        # (a --python body's gen("lmnb") replaced the module, without a word)
                                        ("%%lm --quiet --python\ns += 'Say:'\ns += lmnb.gen('lmnb', max_tokens=1)",
                                         "the result")])
def test_a_result_named_lmnb_is_refused_before_the_cell_runs(ip, cell, what):
    """{gen lmnb} / --out lmnb replaced the lmnb module in the kernel (with a warning only): every
    later --python cell failed with "'str' object has no attribute 'gen'"."""
    try:
        result, out = run(ip, cell)
        assert not result.success and type(result.error_in_exec).__name__ == "UsageError"
        assert str(result.error_in_exec) == (f"{what} 'lmnb' would replace the lmnb module, which %%lm --python "
                                             "bodies call (lmnb.gen, lmnb.select), so every later --python cell "
                                             "would fail; rename it, e.g. lmnb_")
        assert ip.user_ns["lmnb"] is lmnb
    finally:  # (the module's other tests share this shell)
        ip.user_ns["lmnb"] = lmnb
    result, out = run(ip, '%%lm --quiet --python --temperature 0\ns += "Say:" + lmnb.gen("later", max_tokens=1)')
    assert result.success and ip.user_ns["later"] == greedy(ip, "Say:", 1)


def test_quiet_shows_nothing_and_python_cells_share_the_engine(ip):
    result, out = run(ip, "%%lm --quiet --temperature 0\nQuiet:{gen q max_tokens=3}")
    assert result.success and out.outputs == []
    assert ip.user_ns["q"] == greedy(ip, "Quiet:", 3)
    # lmnb's default backend is the session's: a plain program reuses the cells' engine and cache.
    result, out = run(ip, '@lmnb.function\ndef p(s):\n    s += "Quiet:" + lmnb.gen("q2", max_tokens=3)\nz = p.run(temperature=0)')
    assert result.success, out.stdout
    assert ip.user_ns["z"]["q2"] == ip.user_ns["q"]
    assert ip.user_ns["z"].get_meta_info("q2")["cached_tokens"] > 0


def test_a_load_error_other_than_a_missing_checkpoint_gives_the_engines_own_fix(ip, tiny_llama):
    result, out = run(ip, f"%lm load {tiny_llama} --dtype float64")
    text = out.stdout + out.stderr
    assert not result.success and "Traceback" not in text
    assert "unsupported dtype 'float64'; use float32, bfloat16 or float16" in text
    assert "PATH_OR_HF_ID" not in text  # the model was found: no hint to load another
    result, out = run(ip, "%lm load /no/such/checkpoint")
    assert "fix: %lm load PATH_OR_HF_ID" in out.stdout + out.stderr


@pytest.mark.parametrize("path", ["''", '" "'])
def test_an_empty_model_path_is_refused_and_keeps_the_engine_and_its_states(ip, path):
    """%lm load '' read the empty path as no MODEL: it loaded $LMNB_MODEL or the demo model in place
    of the kernel's engine and dropped the named states, without a word of why."""
    run(ip, "%%lm --quiet --temperature 0 --state kept\nKeep:{gen k max_tokens=1}")
    session = ip._lmnb_magics.session
    engine = session.backend().engine
    result, out = run(ip, f"%lm load {path}")
    assert not result.success and type(result.error_in_exec).__name__ == "CellError"
    assert str(result.error_in_exec) == (f"%lm load got an empty model path {path[1:-1]!r}; give a checkpoint folder "
                                         "or hub id, or plain %lm load for $LMNB_MODEL or the built-in demo model\n"
                                         f"cells still run on the in-process engine on {session.config.describe()}")
    assert session.backend().engine is engine and "kept" in session.states
    run(ip, "%lm reset kept")


def test_a_load_on_a_device_that_is_not_there_names_the_option_to_give(ip, tiny_llama, monkeypatch):
    """%lm load --device cuda without CUDA said "use device='cpu'", the Python API's words."""
    from helpers_model import no_gpu

    no_gpu(monkeypatch)
    result, out = run(ip, f"%lm load {tiny_llama} --device cuda")
    assert not result.success
    assert ("device 'cuda' asked for, but torch sees no CUDA device; use --device cpu, or run on a machine with an "
            "NVIDIA GPU\n") in out.stdout + out.stderr


def test_load_errors_name_the_load_options_not_the_python_apis(ip, tiny_llama, tmp_path, monkeypatch):
    """They said 'pass max_total_tokens=2 or more', 'pass random_weights=True', 'raise mem_fraction
    or pass max_total_tokens': keyword arguments, and an option (--mem-fraction) %lm load does not have."""
    import shutil

    import lmnb_engine.model_runner as model_runner

    def load_failure(line: str) -> str:
        result, out = run(ip, line)
        assert not result.success
        return out.stdout + out.stderr

    assert ("a KV pool of 1 token cannot hold one gen of lmnb's default max_tokens (128) after a one-character "
            "prompt (1 token); pass --max-total-tokens 128 or more\n") in load_failure(
        f"%lm load {tiny_llama} --device cpu --max-total-tokens 1")
    assert ("'llama-3-8b' is a shape preset without weights; pass --random-weights, or give a checkpoint directory "
            "or hub id\n") in load_failure("%lm load llama-3-8b --device cpu")
    pt_only = shutil.copytree(tiny_llama, tmp_path / "pt_only", ignore=shutil.ignore_patterns("*.safetensors"))
    assert ("(PyTorch .bin checkpoints are not supported); re-save it with save_pretrained(safe_serialization=True), "
            "or pass --random-weights") in load_failure(f"%lm load {pt_only} --device cpu")
    awq = shutil.copytree(tiny_llama, tmp_path / "awq")
    (awq / "config.json").write_text(json.dumps({**json.loads((awq / "config.json").read_text()),
                                                 "quantization_config": {"quant_method": "awq"}}))
    assert ("weights; use the original model's checkpoint, or pass --random-weights for its shapes\n"
            in load_failure(f"%lm load {awq} --device cpu"))
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 10**6)  # (1953 slots of 512 bytes)
    assert ("a KV pool of 10000000000 tokens needs 5120000000512 bytes (4768.4 GiB): 512 bytes a token (2 layers x 2 KV "
            "heads x 16 dims x 4-byte float32, K and V), one padding token included; cpu has 1000000 bytes (976.6 KiB) "
            "free; pass --max-total-tokens 1952 or less, or leave --max-total-tokens unset to size the pool from free "
            "memory\n") in load_failure(f"%lm load {tiny_llama} --device cpu --max-total-tokens 10000000000")
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 1000)
    assert ("the KV pool's share of free memory on cpu (0.1) leaves room for only 0 KV tokens (512 bytes each); "
            "pass --max-total-tokens, or free some memory\n") in load_failure(f"%lm load {tiny_llama} --device cpu")


@pytest.mark.parametrize("line", ["%lm load --device cpu", "%lm load demo --device cpu"])
def test_a_load_without_a_model_or_the_demo_checkpoint_names_the_positional_argument(ip, tmp_path, monkeypatch, line):
    """It said to pass a checkpoint "as `model`", the Python API's argument: %lm load takes it as
    its positional argument, which its own fix line names. `%lm load demo` is the demo model by
    its name (it asked the model hub for a repo "demo", and failed with the hub client's words)."""
    import lmnb_engine.model_loader as model_loader

    monkeypatch.delenv("LMNB_MODEL", raising=False)
    monkeypatch.setattr(model_loader, "DEMO_MODEL_PATH", tmp_path / "demo_model")
    result, out = run(ip, line)
    assert not result.success
    assert (f"could not load the built-in demo model: FileNotFoundError: the demo checkpoint is not built yet "
            f"({tmp_path / 'demo_model'} has no config.json)\nfix: %lm load PATH_OR_HF_ID (a local Hugging Face "
            "checkpoint directory or hub id)\n") in out.stdout + out.stderr


def test_a_kv_pool_too_small_for_a_default_gen_is_refused_at_load(ip, tiny_llama):
    """%lm load --max-total-tokens 10 was taken, and then every cell's gen without a small max_tokens
    of its own failed on the pool. Expected: the load refused, naming the least pool that holds one
    gen of lmnb's default 128 tokens after a one-character prompt: 1 + 128 - 1 = 128 (the tiny
    checkpoint's tokenizer writes a character as one token, no BOS; the last sampled token takes no KV
    slot); 128 is taken, and runs that gen (it said 129, one more than the gen holds)."""
    result, out = run(ip, f"%lm load {tiny_llama} --max-total-tokens 10")
    assert not result.success
    assert ("could not load " + str(tiny_llama) + ": ValueError: a KV pool of 10 tokens cannot hold one gen of "
            "lmnb's default max_tokens (128) after a one-character prompt (1 token); pass --max-total-tokens 128 or "
            "more\n") in out.stdout + out.stderr
    assert run(ip, f"%lm load {tiny_llama} --max-total-tokens 128")[0].success
    try:
        result, out = run(ip, "%%lm --temperature 0 --out st\na{gen x ignore_eos=True}")
        assert result.success, out.stdout + out.stderr
        assert ip.user_ns["st"].get_meta_info("x")["completion_tokens"] == 128
    finally:
        get_session().load(EngineConfig(model=str(tiny_llama)))  # (the module's engine, as lm_shell loaded it)


def test_a_cells_request_too_large_for_the_kv_pool_names_lm_loads_option(ip, tiny_llama):
    """A cell's gen or select that did not fit the KV pool was told to "raise max_total_tokens", the
    Python API's keyword: the kernel's pool is sized by %lm load's --max-total-tokens (a cell has
    options of its own, so it is named as %lm load's)."""
    def cell_failure(cell: str) -> str:
        result, out = run(ip, cell)
        assert not result.success
        return out.stdout + out.stderr

    assert run(ip, f"%lm load {tiny_llama} --max-total-tokens 160")[0].success
    try:
        # (each fix with its number: 170 + 3 = 173 slots, 13 too many, or 9 + N beside N new tokens (170 - 161);
        # 10 + 159 = 169, 9 too many, and 160 - 10 + 1 = 151 new tokens fit)
        assert ("prompt of 170 tokens does not fit the KV pool of 160 tokens; raise %lm load's --max-total-tokens to at "
                "least 173, or shorten the prompt by at least 9 + max_tokens tokens (13 with max_tokens=4)\n") in cell_failure("%%lm\n" + "w" * 170 + "{gen x max_tokens=4}")
        assert ("prompt of 10 tokens + max_tokens=160 does not fit the KV pool of 160 tokens; raise %lm load's "
                "--max-total-tokens to at least 169, or shorten the prompt by at least 9 tokens or lower max_tokens to at "
                "most 151\n") in cell_failure("%%lm\n" + "w" * 10 + "{gen x max_tokens=160}")
        assert ("makes the prompt 170 tokens (10 without it), more than the KV pool of 160 tokens; shorten the prompt or "
                "the choice, by at least 10 tokens between them, or raise %lm load's --max-total-tokens to at least 170\n"
                ) in cell_failure(
                    "%%lm\n" + "w" * 10 + "{select x choices=['a', '" + "b" * 160 + "']}")
        # (the scheduler's abort, when pinned prefixes keep a request out: a message, not a raise; as the
        # request arrives where its prompt does not fit, 11 slots with 10 not pinned, for a gen EOS may end)
        assert run(ip, "%%lm --state pool_pinned\n" + "w" * 150)[0].success and run(ip, "%lm pin pool_pinned")[0].success
        # (which names the kernel's unpin, %lm unpin NAME: the cell has no Engine.unpin to call)
        assert ("request needs 11 KV slots for its prompt but only 10 of 160 can be freed (150 are pinned); unpin a "
                "state with %lm unpin NAME (%lm states shows which are pinned), or raise %lm load's --max-total-tokens\n"
                in cell_failure("%%lm\n" + "v" * 11 + "{gen x max_tokens=10}"))
        # (a gen that fits only its prompt is refused as it arrives too: under ignore_eos the chat template's end
        # of message is no stop of it, so nothing but its length ends it: 10 + 10 - 1 slots, told the max_tokens
        # that finishes in gen()'s name: 10 + 1 - 1 = 10 slots)
        assert ("request needs 19 KV slots to finish but only 10 of 160 can be freed (150 are "
                "pinned); unpin a state with %lm unpin NAME (%lm states shows which are pinned), or raise %lm load's "
                "--max-total-tokens, or lower max_tokens to 1\n" in cell_failure("%%lm\n" + "v" * 10 + "{gen x max_tokens=10 ignore_eos=True}"))
    finally:
        run(ip, "%lm reset pool_pinned")
        get_session().load(EngineConfig(model=str(tiny_llama)))  # (the module's engine, as lm_shell loaded it)


def test_ctrl_c_in_a_python_cells_run_batch_shows_the_cells_line_and_what_became_of_the_batch(ip):
    """Stopping a Python cell's run_batch showed a traceback through lmnb/api.py, lmnb/interpreter.py,
    concurrent/futures and threading ending in a bare "KeyboardInterrupt:", where a stopped %%lm cell
    says what it kept. The traceback now ends at the cell's call, and the message says which items
    finished and that the others' requests were aborted. One thread: items 0 and 1 finish, item 2's
    request sends the SIGINT (as the stop button does), item 3 never starts."""
    import signal

    from helpers_lang import InterruptingBackend

    ip.user_ns["be"] = be = InterruptingBackend("2: ")
    assert run(ip, "@lmnb.function\ndef prog(s, n):\n    s += f'{n}: ' + lmnb.gen('a')")[0].success
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result, out = run(ip, "x = 1\nprog.run_batch([(i,) for i in range(4)], num_threads=1, backend=be)")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    shown = out.stdout + out.stderr
    assert ("\nKeyboardInterrupt: run_batch was stopped: items 0-1 had finished (2 of 4); the requests of the "
            "other 2 were aborted or never sent, and the backend is free for the next call; it returned no states: run "
            "it again (generator_style=True hands on each state as it comes)") in shown
    assert "----> 2 prog.run_batch([(i,) for i in range(4)], num_threads=1, backend=be)\n\nKeyboardInterrupt" in shown
    for internal in ("api.py", "interpreter.py", "concurrent", "threading", "During handling"):
        assert internal not in shown
    assert len(be.aborted) == 1


def test_ctrl_c_in_a_cell_awaiting_text_async_iter_shows_the_cells_line_and_that_the_program_was_aborted(ip):
    """IPython's autoawait runs a cell that awaits in run_until_complete; a Ctrl-C while it awaited
    text_async_iter cancelled the cell's task (lmnb.interrupt.ReadInterrupts), which IPython showed
    as a bare "CancelledError:" after asyncio's and lmnb's frames. The reader now raises lmnb's
    KeyboardInterrupt in place of that cancel, ending at the cell's line, saying that the
    program's requests were aborted. The gen sends nothing until aborted (else after 20 s: late);
    the SIGINT comes once the read waits for it."""
    import signal

    from helpers_lang import ScriptedBackend, interrupt_main_when

    from lmnb import executor

    class Held(ScriptedBackend):
        late = False

        def generate_stream(self, prompt, params, rid):
            if self._abort_events.setdefault(rid, threading.Event()).wait(20):
                yield "", {"id": rid, "finish_reason": {"type": "abort", "message": "aborted"}}
                return
            self.late = True
            yield "late", {"id": rid, "completion_tokens": 1, "finish_reason": {"type": "length"}}

    def reading() -> bool:  # (a step of text_async_iter waits in iter_text on a worker thread)
        from lmnb.thread_waits import as_dumped, stacks

        return any((as_dumped(executor.__file__), "iter_text") == (file, function)
                   for stack in stacks().values() for file, function, _ in stack)

    ip.user_ns["be"] = be = Held()
    assert run(ip, "@lmnb.function\ndef ask(s):\n    s += 'Q: ' + lmnb.gen('a', max_tokens=8)\n"
                   "st = ask.run(backend=be, stream=True)")[0].success
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupt_main_when(reading):
            result, out = run(ip, "x = 1\nasync for c in st.text_async_iter('a'):\n    print(c)")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    shown = out.stdout + out.stderr
    assert shown.endswith("\nKeyboardInterrupt: the program was stopped while its state was read: its requests were "
                          "aborted and the backend is free for the next call; the text it had written is in "
                          "state.error().partial_text\n")
    assert "----> 2 async for c in st.text_async_iter('a'):\n      3     print(c)\n\nKeyboardInterrupt" in shown
    for internal in ("CancelledError", "interpreter.py", "asyncio", "threading"):
        assert internal not in shown
    assert len(be.aborted) == 1 and not be.late
    assert isinstance(ip.user_ns["st"].error(), lmnb.ProgramAborted)


def test_ctrl_c_while_lm_pin_waits_for_the_pin_leaves_no_pin_behind(ip, monkeypatch):
    """Ctrl-C while %lm pin waited for the engine to lock the prefilled prefix (a call run between
    the scheduler's steps) said "the state's pin is as it was", but the engine made the pin all the
    same, and no one held its handle: a prefix never evictable again. Now a pin made after the
    interrupt is released as it is made. The pin call sends the SIGINT, and makes the pin once the
    interrupt has taken %lm pin out of its wait."""
    import signal
    import time

    from helpers_lang import main_thread_waits_on_a_future

    engine = get_session().backend().engine
    scheduler, real_pin = engine.scheduler, engine.scheduler.pin

    def main_thread_in_pin_prefix() -> bool:
        from lmnb.thread_waits import stacks

        return any(function == "pin_prefix" for _, function, _ in stacks().get(threading.main_thread().ident, []))

    def pin_after_ctrl_c(key):  # (on the scheduler thread)
        deadline = time.monotonic() + 10
        while not main_thread_waits_on_a_future() and time.monotonic() < deadline:
            pass  # (sent on its way into the wait, the SIGINT took effect only once the pin was made)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        deadline = time.monotonic() + 10
        while main_thread_in_pin_prefix() and time.monotonic() < deadline:
            time.sleep(0.001)
        return real_pin(key)

    assert run(ip, "%%lm --state to_pin\nThe quick brown fox")[0].success
    before = engine.cache_stats()["pinned_prefixes"]
    monkeypatch.setattr(scheduler, "pin", pin_after_ctrl_c)
    magics = ip.magics_manager.registry["LMMagics"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            magics.run_command("pin to_pin")
        monkeypatch.setattr(scheduler, "pin", real_pin)
        assert e.value._render_traceback_() == [
            "\x1b[0;31mKeyboardInterrupt\x1b[0m: %lm pin was stopped; the state's pin is as it was"]
        assert engine.cache_stats()["pinned_prefixes"] == before and get_session().states["to_pin"].pin is None
    finally:
        signal.signal(signal.SIGINT, previous)
        run(ip, "%lm reset to_pin")


def test_ctrl_c_in_a_python_cells_run_shows_the_cells_line_and_what_became_of_the_run(ip):
    """Stopping a Python cell's plain prog.run() showed a traceback through lmnb/api.py,
    lmnb/interpreter.py, lmnb/executor.py and threading ending in a bare "KeyboardInterrupt:". It
    now ends at the cell's call and says the request was aborted. The gen's request sends the
    SIGINT (as the stop button does) and waits until it is aborted, so it lands inside run()."""
    import signal

    from helpers_lang import InterruptingBackend

    ip.user_ns["be"] = be = InterruptingBackend("Q: ")
    assert run(ip, "@lmnb.function\ndef ask(s):\n    s += 'Q: ' + lmnb.gen('a')")[0].success
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result, out = run(ip, "x = 1\nst = ask.run(backend=be)")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    shown = out.stdout + out.stderr
    assert ("\nKeyboardInterrupt: run was stopped: its requests were aborted and the backend is free for the next "
            "call; it returned no state (run(stream=True) returns the state at once, and a stopped one keeps its "
            "text in state.error().partial_text)") in shown
    assert "----> 2 st = ask.run(backend=be)\n\nKeyboardInterrupt" in shown
    for internal in ("api.py", "interpreter.py", "executor.py", "threading", "During handling"):
        assert internal not in shown
    assert be.aborted == sorted(be._marked) and len(be.aborted) == 1


def test_ctrl_c_while_lm_unpin_waits_still_releases_the_pin_and_says_so(ip, monkeypatch):
    """Ctrl-C while %lm unpin waited for the engine to release the pin (a call run between the
    scheduler's steps) said "%lm unpin was stopped", but the engine released it all the same while
    the state kept the handle: the next %lm unpin failed with "unknown pin handle". Now the release
    ends first and the stop says so. The release sends the SIGINT itself, once %lm unpin is blocked
    waiting for it: sent at once, it could land while the release was posted, with Ctrl-C held, or
    just after (test_a_ctrl_c_just_outside_the_hold_of_lm_pin_and_unpin_is_told_as_what_it_stopped),
    not in the wait this test is about."""
    import signal

    from helpers_lang import main_thread_waits_on_a_future

    engine = get_session().backend().engine
    release = engine._release_pin

    def release_after_ctrl_c(handle):  # (on the scheduler thread)
        deadline = time.monotonic() + 10
        while not main_thread_waits_on_a_future() and time.monotonic() < deadline:
            pass
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        release(handle)

    assert run(ip, "%%lm --state to_unpin\nThe quick brown fox")[0].success
    before = engine.cache_stats()["pinned_prefixes"]
    assert run(ip, "%lm pin to_unpin")[0].success and engine.cache_stats()["pinned_prefixes"] == before + 1
    monkeypatch.setattr(engine, "_release_pin", release_after_ctrl_c)
    magics = ip.magics_manager.registry["LMMagics"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            magics.run_command("unpin to_unpin")
        monkeypatch.setattr(engine, "_release_pin", release)
        assert e.value._render_traceback_() == [
            "\x1b[0;31mKeyboardInterrupt\x1b[0m: %lm unpin was stopped; state 'to_unpin''s pin is released all the "
            "same, between the engine's steps"]
        assert get_session().states["to_unpin"].pin is None and engine.cache_stats()["pinned_prefixes"] == before
    finally:
        signal.signal(signal.SIGINT, previous)
        run(ip, "%lm reset to_unpin")


@pytest.mark.parametrize("press", ["in_the_wait", "as_posted"])
@pytest.mark.parametrize("command", ["unpin", "pin"])
def test_ctrl_c_stops_lm_pin_and_unpin_while_the_engine_is_in_a_long_step(ip, monkeypatch, command, press):
    """%lm unpin (and %lm pin over an old pin) waited for the engine's release with Ctrl-C held, so
    while the scheduler ran a long step (a long prefill, a first kernel compile) every press was
    swallowed until the step ended, forever for a wedged one. The release is now posted with Ctrl-C
    held and waited for after: the stop ends the wait at once, the release still happens, and the
    state does not keep the handle. A press held while the release was posted was then looked at
    only after the wait for it: it now stops at once too. Here the release itself is the long step,
    which waits until the main thread has raised (10 s at most); the press comes once the main
    thread is blocked waiting for it (``in_the_wait``: sent at once, it could land while the
    release was being posted, and the test failed on an idle machine), or as it is posted
    (``as_posted``, Ctrl-C held)."""
    import signal

    from helpers_lang import main_thread_waits_on_a_future

    engine = get_session().backend().engine
    release, queue_unpin = engine._release_pin, engine.queue_unpin
    returned, released = threading.Event(), threading.Event()

    def long_release(handle):  # (on the scheduler thread)
        if press == "in_the_wait":
            deadline = time.monotonic() + 10
            while not main_thread_waits_on_a_future() and time.monotonic() < deadline:
                pass
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        returned.wait(10)
        release(handle)
        released.set()

    def queue_then_ctrl_c(handle):  # (on the main thread, Ctrl-C held)
        future = queue_unpin(handle)
        signal.raise_signal(signal.SIGINT)
        return future

    assert run(ip, "%%lm --state to_hold\nThe quick brown fox")[0].success
    before = engine.cache_stats()["pinned_prefixes"]
    assert run(ip, "%lm pin to_hold")[0].success
    old = get_session().states["to_hold"].pin
    monkeypatch.setattr(engine, "_release_pin", long_release)
    if press == "as_posted":
        monkeypatch.setattr(engine, "queue_unpin", queue_then_ctrl_c)
    magics = ip.magics_manager.registry["LMMagics"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            magics.run_command(f"{command} to_hold")
        stopped_before_the_release = not released.is_set()
        returned.set()
        assert released.wait(10)
        monkeypatch.setattr(engine, "_release_pin", release)
        monkeypatch.setattr(engine, "queue_unpin", queue_unpin)
        assert stopped_before_the_release
        pin = get_session().states["to_hold"].pin
        assert (pin is None) if command == "unpin" else (pin is not None and pin != old)
        assert engine.cache_stats()["pinned_prefixes"] == before + (command == "pin")
    finally:
        returned.set()
        signal.signal(signal.SIGINT, previous)
        run(ip, "%lm reset to_hold")


@pytest.mark.parametrize("command, when", [("pin", "before"), ("pin", "after"), ("unpin", "after")])
def test_a_ctrl_c_just_outside_the_hold_of_lm_pin_and_unpin_is_told_as_what_it_stopped(ip, monkeypatch, command,
                                                                                        when):
    """%lm pin and unpin change the state's pin, and post the release of the old one, with Ctrl-C
    held. A press that came just after the hold ended, before the wait for the release began, was
    raised bare: %lm pin then said "the state's pin is as it was" of a state pinned anew, and %lm
    unpin left out that the pin is released all the same. One that came just before the hold began
    left the new pin made with no state holding its handle: a prefix never evictable again. Each
    press is raised here as the hold begins or ends (as a signal landing there is)."""
    from lmnb_kernel import session as session_module

    engine = get_session().backend().engine
    real_hold = session_module.held_interrupts

    @contextmanager
    def ctrl_c_next_to_the_hold():
        if when == "before":
            raise KeyboardInterrupt
        with real_hold() as held:
            yield held
        raise KeyboardInterrupt

    assert run(ip, "%%lm --state to_stop\nThe quick brown fox")[0].success
    before = engine.cache_stats()["pinned_prefixes"]
    assert run(ip, "%lm pin to_stop")[0].success
    old = get_session().states["to_stop"].pin
    monkeypatch.setattr(session_module, "held_interrupts", ctrl_c_next_to_the_hold)
    magics = ip.magics_manager.registry["LMMagics"]
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            magics.run_command(f"{command} to_stop")
        monkeypatch.undo()
        pin = get_session().states["to_stop"].pin
        said = {("pin", "before"): "%lm pin was stopped; the state's pin is as it was",
                ("pin", "after"): "%lm pin was stopped once state 'to_stop' was pinned",
                ("unpin", "after"): "%lm unpin was stopped; state 'to_stop''s pin is released all the same, between "
                                    "the engine's steps"}[command, when]
        assert e.value._render_traceback_() == [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {said}"]
        engine.scheduler.call(lambda: None).result(10)  # (the engine's steps in between: the releases posted ran)
        if command == "unpin":
            assert pin is None and engine.cache_stats()["pinned_prefixes"] == before
        else:  # one pin either way: the old one kept (before), or the new one made in its place (after)
            assert (pin == old) == (when == "before") and pin is not None
            assert engine.cache_stats()["pinned_prefixes"] == before + 1
    finally:
        monkeypatch.undo()
        run(ip, "%lm reset to_stop")


def test_a_state_too_large_to_pin_names_lm_loads_option(ip, tiny_llama):
    """%lm pin of a state that did not fit the KV pool was told to "raise max_total_tokens", the Python
    API's keyword, where a cell's request says "raise %lm load's --max-total-tokens" (the kernel's pool is
    sized by %lm load's option); so was one that the pinned states kept out ("unpin prefixes": a cell
    says %lm unpin NAME)."""
    def pin_failure(name: str) -> str:
        result, out = run(ip, f"%lm pin {name}")
        assert not result.success
        return out.stdout + out.stderr

    assert run(ip, f"%lm load {tiny_llama} --max-total-tokens 160")[0].success
    try:
        assert run(ip, "%%lm --state too_big\n" + "w" * 170)[0].success
        assert ("could not pin state 'too_big': prompt of 170 tokens does not fit the KV pool of 160 tokens; raise %lm "
                "load's --max-total-tokens to at least 170, or shorten the prompt by at least 10 tokens\n"
                ) in pin_failure("too_big")
        # (150 pinned leave 10 slots, fewer than the 20 tokens of the next state's prefill)
        assert run(ip, "%%lm --state pinned\n" + "w" * 150)[0].success and run(ip, "%lm pin pinned")[0].success
        assert run(ip, "%%lm --state kept_out\n" + "v" * 20)[0].success
        assert ("could not pin state 'kept_out': could not compute the prefix to pin: request needs 20 KV slots for "
                "its prompt but only 10 of 160 can be freed (150 are pinned); unpin a state with %lm unpin NAME (%lm states "
                "shows which are pinned), or raise %lm load's --max-total-tokens\n") in pin_failure("kept_out")
    finally:
        run(ip, "%lm reset")
        get_session().load(EngineConfig(model=str(tiny_llama)))  # (the module's engine, as lm_shell loaded it)


def test_help_options_show_the_help(ip):
    # the parsers have no -h of their own: "%%lm --help" was "unrecognized arguments: --help"
    for cell, words in [("%%lm --help\nx", "--temperature"), ("%%lm -h\nx", "--max-tokens"),
                        ("%lm load --help", "--max-total-tokens"), ("%lm -h", "SUBCOMMAND"),
                        # a subcommand without options showed only its usage line, "%lm stats"
                        ("%lm stats --help", "cache hit rate, KV pool usage, evictions"),
                        ("%lm flush -h", "evict every unpinned prefix")]:
        result, out = run(ip, cell)
        assert result.success and words in out.stdout, (cell, out.stdout, out.stderr)


@pytest.mark.parametrize(
    "cell, words",
    [
        ("%%lm --bogus\nx", "unrecognized arguments: --bogus (%%lm --help lists the options)"),
        ("%%lm --temprature 0\nx", "unrecognized arguments: --temprature 0 (did you mean: --temprature → --temperature?)"),
        ("%%lm --temperature -1\nx", "argument --temperature: must be a finite number >= 0 (0 is greedy), got '-1'"),
        ("%%lm --max-tokens -5\nx", "argument --max-tokens: must be an integer >= 0, got '-5'"),
        # int() reads Python's digit separator and any script's digits: taken as 10 (U+FF11 U+FF10 is
        # fullwidth 1 and 0), where a typo or a CJK input method wrote them
        ("%%lm --max-tokens 1_0\nx", "argument --max-tokens: must be an integer >= 0, got '1_0'; write it with the "
                                      "digits 0-9 alone (no _, no other script's digits): 10"),
        ("%%lm --max-tokens \uff11\uff10\nx", "argument --max-tokens: must be an integer >= 0, got '\uff11\uff10'; "
                                                "write it with the digits 0-9 alone (no _, no other script's digits): 10"),
        ("%%lm --seed \uff17\nx", "argument --seed: must be an integer that fits in 64 bits, got '\uff17'; write it "
                                   "with the digits 0-9 alone (no _, no other script's digits): 7"),
        # float() reads them too: fullwidth 0.5 (U+FF10 U+FF0E U+FF15) was taken as 0.5, "0_5" as 5.0
        ("%%lm --temperature \uff10.\uff15\nx", "argument --temperature: must be a finite number >= 0 (0 is greedy), "
                                                  "got '\uff10.\uff15'; write it with the digits 0-9 alone (no _, no "
                                                  "other script's digits): 0.5"),
        ("%%lm --temperature 0_5\nx", "argument --temperature: must be a finite number >= 0 (0 is greedy), got '0_5'; "
                                        "write it with the digits 0-9 alone (no _, no other script's digits): 5.0"),
        # the engine refused it when the first gen ran (a gen in a fork derived a seed from it and ran)
        ("%%lm --seed 99999999999999999999\nx", "argument --seed: must be an integer that fits in 64 bits, got "
                                                "'99999999999999999999'"),
        ("%%lm --seed 1.5\nx", "argument --seed: must be an integer that fits in 64 bits, got '1.5'"),
        # Python's words for an integer it will not read ("Exceeds the limit (4300 digits) ... Consider
        # hexadecimal"), and "must be an integer >= 0" of one with all its 5001 digits echoed: "12" and
        # 4999 fives is 1.256e+5000 to 4 digits (by hand)
        ("%%lm --max-tokens 12" + "5" * 4999 + "\nx", "argument --max-tokens: got 1.256e+5000 (an integer of 5001 "
         "digits), more digits than Python reads as an integer (at most 4300); give at most the model's context length"),
        ("%%lm\nQ: {gen q max_tokens=12" + "5" * 4999 + "}", "line 2, col 22: invalid Python expression: 1.256e+5000 "
         "(an integer of 5001 digits) has more digits than Python reads as an integer (at most 4300); write a smaller "
         "number"),
        # 5000 zeros and a 3 were named "0 (written with 4999 leading zeros) has more digits than Python reads":
        # Python's tokenizer reads the zeros as one literal, the 3 as another; Python's own error is the zeros
        ("%%lm\nQ: {gen q max_tokens=" + "0" * 5000 + "3}", "line 2, col 22: invalid Python expression: leading zeros "
         "in decimal integer literals are not permitted; use an 0o prefix for octal integers"),
        # an option %%lm has not: argparse echoed all 5001 digits (and 4301 threes) in its refusal
        ("%%lm --n 12" + "5" * 4999 + " " + "3" * 4301 + "\nx", "unrecognized arguments: --n 1.256e+5000 (an integer "
         "of 5001 digits) 3.333e+4300 (an integer of 4301 digits) (%%lm --help lists the options)"),
        ("%%lm --temperature warm\nx", "argument --temperature: must be a finite number >= 0 (0 is greedy), got 'warm'"),
        ("%%lm --state 'a b'\nx", "--state 'a b' is not a valid name"),
        ("%%lm --out 1x\nx", "--out '1x' is not a valid name: --out takes a Python variable name"),
        # it ran and stored the state under a name no Python code can read
        ("%%lm --out ｉｆ\nx", "--out 'ｉｆ' is reserved in Python, so the variable could never be read; pick another "
                              "name, e.g. --out if_"),
        # the summary said a = '...' while the kernel's a was the ProgramState
        ("%%lm --out a\nX:{gen a max_tokens=1}", "--out a is also a variable the cell captures"),
        # it said only "is not a valid name", though '3bad' is all letters and digits
        ("%%lm --state 3bad\nx", "--state '3bad' is not a valid name: a state name starts with a letter or _"),
        ("%%lm --append\nx", "--append only applies to a --state cell; add --state NAME, or remove --append"),
        ("%%lm --state s --apend\nx", "unrecognized arguments: --apend (did you mean: --apend → --append?)"),
        ("%lm reset 3bad", "'3bad' is not a valid state name: a state name starts with a letter or _"),
        ("%%lm\n   ", "the cell body is empty"),
        ("%%lm\nline two\n  {gen a max_token=3}", "line 3, col 10: gen has no option 'max_token'"),
        ("%%lm\nHi {nobody_defined_this}", "line 2, col 5: name 'nobody_defined_this' is not defined"),
        # below another cell magic, or blank lines, lines were counted from the %%lm line
        ("%%time\n%%lm\nline three\n  {gen a max_token=3}", "line 4, col 10: gen has no option 'max_token'"),
        ("\n\n%%lm\nHi {nobody_defined_this}", "line 4, col 5: name 'nobody_defined_this' is not defined"),
        # Python's parser raised UnicodeEncodeError from inside the magic
        ("%%lm --python\ns += 'a\ud800'", "line 2, col 8: the lone surrogate '\\ud800' is half of a UTF-16 pair"),
        ("%lm", "needs a subcommand"),
        ("%lm frobnicate", "invalid choice: 'frobnicate'"),
        # a misspelt subcommand or option of one was named with no guess, as %%lm options get
        ("%lm stat", "invalid choice: 'stat' (choose from 'load', 'connect', 'stats', 'tree', 'states', 'reset', "
                     "'flush', 'pin', 'unpin', 'help') (did you mean: %lm stats?)"),
        ("%lm connect http://127.0.0.1:9 --api_key k", "unrecognized arguments: --api_key k (did you mean: "
                                                       "--api_key → --api-key?)"),
        ("%lm connect http://127.0.0.1:9 --bogus", "unrecognized arguments: --bogus (%lm connect --help lists the "
                                                   "options)"),
        # argparse took a prefix of one option for it: --dtyp loaded with --dtype, --temp 0 ran greedy
        ("%lm load /no/such/checkpoint --dtyp bfloat16", "unrecognized arguments: --dtyp bfloat16 (did you mean: "
                                                         "--dtyp → --dtype?)"),
        ("%lm connect http://127.0.0.1:9 --time 5", "unrecognized arguments: --time 5 (did you mean: --time → "
                                                    "--timeout?)"),
        ("%%lm --temp 0\nx", "unrecognized arguments: --temp 0 (did you mean: --temp → --temperature?)"),
        # a prefix of two options: it was offered nothing (--st), or --state alone (--sta, difflib's pick)
        ("%%lm --st x\nx", "unrecognized arguments: --st x (--st begins --state and --static; write the option in "
                           "full)"),
        ("%%lm --sta x\nx", "unrecognized arguments: --sta x (--sta begins --state and --static; write the option "
                            "in full)"),
        ("%lm pin nosuchstate", "no state named 'nosuchstate'"),
        ("%lm connect http://127.0.0.1:9", "could not connect to http://127.0.0.1:9"),
        # httpx's "UnsupportedProtocol: Request URL is missing an 'http://' or 'https://' protocol."
        ("%lm connect 127.0.0.1:9", "%lm connect takes an http(s) URL, e.g. http://127.0.0.1:9; got '127.0.0.1:9'"),
        ("%lm connect localhost:9 --openai m", "%lm connect takes an http(s) URL, e.g. http://localhost:9; got"),
        ("%lm connect ftp://h:9", "%lm connect takes an http(s) URL, e.g. http://HOST:PORT; got 'ftp://h:9'"),
        ("%lm load /no/such/checkpoint", "could not load /no/such/checkpoint"),
        # argparse kept the last silently, where a %%lm option given twice is refused
        ("%lm load /no/such/checkpoint --device cpu --device cuda", "--device is given twice; give it once"),
        ("%lm connect http://127.0.0.1:9 --api-key a --api-key b", "--api-key is given twice; give it once"),
    ],
)
def test_bad_usage_gets_one_clear_message(ip, cell, words):
    result, out = run(ip, cell)
    assert not result.success
    assert words in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_capture_above_lm_holds_the_view_and_summary_and_errors_count_the_cells_lines(ip):
    result, out = run(ip, "%%capture c\n%%lm --static --temperature 0\nHi{gen cap_a max_tokens=2}")
    assert result.success and out.outputs == [] and out.stdout == ""  # all of it went to c, as any output
    captured = ip.user_ns["c"].outputs
    assert [o.metadata["lmnb"]["captured"] for o in captured if "tokens" in o.metadata["lmnb"]] == [["cap_a"]]
    views = [o for o in captured if o.metadata["lmnb"].get("view") == "run"]
    assert views[-1].metadata["lmnb"]["status"] == "done" and views[-1].update  # c.show() redraws it in place
    # a live cell's widget sent its comm messages past the capture to a frontend that showed it nowhere
    # (test_kernel checks the messages): captured, its view is static, shown as it starts and replaced
    # as it ends, with no frame kept between
    for option in ("", "--static "):
        run(ip, f"%%capture c\n%%lm {option}--temperature 0\nHi{{gen cap_b max_tokens=8 ignore_eos=True}}")
        views = [o for o in ip.user_ns["c"].outputs if o.metadata["lmnb"].get("view") == "run"]
        assert [(o.update, sorted(o.data)) for o in views] == [
            (False, ["application/vnd.lmnb.view+json", "text/html", "text/plain"]),
            (True, ["application/vnd.lmnb.view+json", "text/html", "text/plain"])]
        assert views[0].metadata["lmnb"]["status"] == "running" and views[1].metadata["lmnb"]["status"] == "done"
    # %%capture runs its body as a cell of its own: the error said line 3 for the cell's line 4
    run(ip, "%%capture c\n%%lm --python\ns += 'a'\ns = 'b'")
    assert "line 4, col 1: s is the program's state" in ip.user_ns["c"].stdout


@pytest.mark.parametrize("above", ["", "%%time\n"])
def test_the_prompt_is_the_cell_as_typed_not_ipythons_python_clean_up(ip, above):
    # IPython cleans a cell up as Python before the magic gets it: a second line starting with
    # ">>> " stripped every line's ">>> " / "... ", and whitespace-only lines lost their spaces,
    # so the model saw another prompt than the one written (and than the exported job sends)
    prompt = ">>> 2 + 2\n4\n... \n   \n>>> 3 * 3\n"
    result, out = run(ip, f"{above}%%lm --static --temperature 0 --out typed_st\n{prompt}{{gen typed_a max_tokens=2}}")
    assert result.success, out.stdout
    assert ip.user_ns["typed_st"].text() == prompt + ip.user_ns["typed_a"]
    _, out = run(ip, f"{above}%%lm\n>>> 1\n{{gen a max_token=3}}")  # (and its lines are the cell's)
    assert f"line {3 + bool(above)}, col 8: gen has no option 'max_token'" in out.stdout
    result, out = run(ip, f"{above}%%lm --python --static\n>>> s += 'a'\n... \n")  # Python: pasted prompts go
    assert result.success, out.stdout


@pytest.mark.parametrize("above", ["", "%%time\n"])
def test_an_indented_cell_is_read_as_typed_less_the_indentation_its_lines_share(ip, above):
    # IPython drops the shared indentation, so the magic ran; but its first line "  %%lm" was not
    # found in the cell as typed, so the prompt was IPython's clean-up of it as Python ('>>> '
    # taken off, a whitespace-only line emptied), another prompt than the exported job's
    def indented(*lines):
        return "\n".join("  " + line for line in [*above.split("\n")[:-1], *lines])

    result, out = run(ip, indented("%%lm --static --temperature 0 --out ind_st", ">>> 2 + 2", "4", "   ",
                                   "{gen ind_a max_tokens=2}"))
    assert result.success, out.stdout
    assert ip.user_ns["ind_st"].text() == ">>> 2 + 2\n4\n   \n" + ip.user_ns["ind_a"]
    _, out = run(ip, indented("%%lm", ">>> 1", "{gen a max_token=3}"))  # (and its lines are the cell's)
    # and its columns: 'max_token' is the 10th character of "  {gen a max_token=3}" (it said col 8)
    assert f"line {3 + bool(above)}, col 10: gen has no option 'max_token'" in out.stdout
    assert "\n      {gen a max_token=3}\n             ^" in out.stdout  # the line as typed, the caret under 'm'
    _, out = run(ip, indented("%%lm", "Hi {nobody_defined_this}"))  # a run-time error: as typed too
    assert f"line {2 + bool(above)}, col 7: name 'nobody_defined_this' is not defined" in out.stdout
    _, out = run(ip, indented("%%lm --python", "s += 'a'", "if False:", "    yield 1"))  # yield: 7th as typed
    assert f"line {4 + bool(above)}, col 7: a --python body cannot use yield" in out.stdout


def test_a_cell_cancelled_without_a_result_does_not_leave_its_text_behind(ip):
    # ipykernel fires post_run_cell with None for a cell it cancelled: its text stayed the
    # outermost cell, so later cells below %%time counted their lines from the %%lm line again
    from types import SimpleNamespace

    ip.events.trigger("pre_run_cell", SimpleNamespace(raw_cell="%%lm\nstopped"))
    ip.events.trigger("post_run_cell", None)
    _, out = run(ip, "%%time\n%%lm\nline three\n  {gen a max_token=3}")
    assert "line 4, col 10: gen has no option 'max_token'" in out.stdout


def test_usage_lines_name_the_magics_as_typed(ip):
    _, out = run(ip, "%lm")
    assert "\nusage: %lm SUBCOMMAND ...\n" in out.stdout + out.stderr  # IPython prefixes its own "%"; it was %%lm
    from lmnb_kernel.magics import cell_parser

    assert cell_parser().format_usage().startswith("::\n\n  %%lm [--python]")


class Recorder(BaseBackend):
    """A backend that answers "ok" and records the prompt and resolved parameters of each gen."""

    def __init__(self):
        self.calls = []

    def get_chat_template(self):
        return lmnb.get_chat_template("default")

    def generate(self, prompt, params, rid):
        self.calls.append((prompt.text, params))
        return [Completion("ok", {"prompt_tokens": 3, "cached_tokens": 1, "completion_tokens": 1,
                                  "finish_reason": {"type": "stop"}})]

    def generate_stream(self, prompt, params, rid):
        [c] = self.generate(prompt, params, rid)
        yield c.text, c.meta_info


@contextmanager
def recording(ip):
    magics = ip._lmnb_magics
    real, fake, backend = magics.session, Session(), Recorder()
    fake.connect(backend, "recorder")
    magics.session = fake
    try:
        yield backend
    finally:
        magics.session = real


def test_cell_options_become_program_defaults_and_gen_options_win(ip):
    with recording(ip) as backend:
        result, out = run(ip, "%%lm --static --temperature 0.5 --max-tokens 7 --seed 3\nA{gen a}B{gen b temperature=0.9 max_tokens=2}")
        assert result.success, out.stdout
    (p1, a), (p2, b) = backend.calls
    assert (p1, p2) == ("A", "AokB")
    assert (a.temperature, a.max_new_tokens, a.seed) == (0.5, 7, 3)
    assert (b.temperature, b.max_new_tokens, b.seed) == (0.9, 2, 3)


def test_pinned_state_survives_a_flush_and_unpinned_does_not(ip):
    engine = get_session().backend().engine
    run(ip, "%lm reset")
    run(ip, "%%lm --static --temperature 0 --state keep\nThe first part of a long prompt.{gen k max_tokens=4}")
    text = get_session().states["keep"].state.text()
    result, out = run(ip, "%lm pin keep")
    assert result.success, out.stdout
    pinned = len(engine.encode(text))
    assert engine.cache_stats()["pinned_prefixes"] == 1
    assert engine.cache_stats()["protected_tokens"] >= pinned
    run(ip, "%lm flush")
    _, out = run(ip, "%%lm --static --temperature 0 --state keep\n\nNext{gen k2 max_tokens=2}")
    [meta] = summaries(out)
    assert meta["tokens"]["cached_tokens"] >= pinned - 1  # the pinned prefix outlived the flush
    states_out = run(ip, "%lm states")[1].outputs[0].data["text/plain"]
    assert "keep" in states_out and "yes" in states_out
    run(ip, "%lm unpin keep")
    assert engine.cache_stats()["pinned_prefixes"] == 0
    result, out = run(ip, "%lm unpin keep")  # it said only "state 'keep' is not pinned": no next step
    assert not result.success
    assert ("state 'keep' is not pinned, so there is nothing to unpin; %lm states shows which states are pinned"
            in out.stdout + out.stderr)
    run(ip, "%lm flush")
    _, out = run(ip, "%%lm --static --temperature 0 --state keep\n\nAgain{gen k3 max_tokens=2}")
    assert summaries(out)[0]["tokens"]["cached_tokens"] == 0


def test_stats_count_the_cells_requests_not_the_prefill_of_a_pin(ip):
    """%lm pin prefills the state's prefix: a cache action, which %lm stats counted as prompt tokens
    of user traffic (lowering the hit rate by the pinned prefix's length)."""
    def counts() -> tuple:
        s = run(ip, "%lm stats")[1].outputs[0].metadata["lmnb"]["stats"]
        return s["prompt_tokens"], s["cached_tokens"]

    run(ip, "%lm reset")
    run(ip, "%%lm --static --temperature 0 --state counted\nA prompt about stats and pins.{gen c max_tokens=3}")
    run(ip, "%lm flush")  # (the pin must compute the prefix again)
    before = counts()
    assert run(ip, "%lm pin counted")[0].success
    assert counts() == before
    _, out = run(ip, "%%lm --static --temperature 0 --state counted\n\nMore{gen c2 max_tokens=2}")
    [meta] = summaries(out)
    assert counts() == (before[0] + meta["tokens"]["prompt_tokens"], before[1] + meta["tokens"]["cached_tokens"])
    assert meta["tokens"]["cached_tokens"] > 0  # (the pinned prefix)
    run(ip, "%lm unpin counted")


def test_stats_count_the_cells_that_failed_or_were_stopped_apart(ip):
    """"%%lm cells run" counted a failed cell as run, as a done one: the row now counts the cells by
    how they ended (their tokens are in the token totals alike: their requests ran)."""
    def cells() -> list[int]:
        [row] = [line for line in run(ip, "%lm stats")[1].outputs[0].data["text/plain"].splitlines()
                 if line.startswith("%%lm cells run")]
        counts = re.fullmatch(r"%%lm cells run: done / failed / stopped +(\d+) / (\d+) / (\d+)", row)
        assert counts, row
        return [int(n) for n in counts.groups()]

    done, failed, stopped = cells()
    assert run(ip, "%%lm --quiet --temperature 0\nCounted.{gen x max_tokens=1}")[0].success
    ip.user_ns["lab"] = "ab"
    assert not run(ip, "%%lm --quiet\n{select x choices=lab}")[0].success
    assert cells() == [done + 1, failed + 1, stopped]


def test_stats_and_tree_show_the_engine(ip):
    result, out = run(ip, "%lm stats")
    assert result.success
    stats = out.outputs[0].metadata["lmnb"]["stats"]
    assert stats == {**stats, "running_requests": 0, "waiting_requests": 0}
    result, out = run(ip, "%lm tree")
    assert result.success and "radix tree" in out.outputs[0].data["text/plain"]


def _tree_paths(ip) -> tuple[dict, dict]:
    """(label -> node id of the paths, node id -> node) that ``%lm tree`` shows now."""
    from lmnb_kernel.widgets import VIEW_MIME

    result, out = run(ip, "%lm tree")
    assert result.success
    tree = [o.data for o in out.outputs if VIEW_MIME in o.data][-1][VIEW_MIME]
    return tree["paths"], {n["id"]: n for n in tree["nodes"]}


def _common(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("gen", ["named", "unnamed"])
def test_tree_says_a_state_ending_in_a_gen_has_its_last_token_not_run_not_evicted(ip, gen):
    """A state ending in a gen's text read "23/24 tok cached", as if a token had been evicted: the
    last sampled token is never run through the model (a finished request caches its prompt and
    output less that one), so no KV of it exists until the state goes on. A real eviction of part
    of the path still reads as before, with no such note. An unnamed gen's (lmnb.gen(max_tokens=6)
    in a --python cell) read so after a named gen's was mended: it kept no record of where its text
    ends."""
    run(ip, "%lm flush")
    prompt = "User: keep this\nBot:"
    reference = greedy_result(prompt, 6)
    engine = get_session().backend().engine
    ids = engine.prompt_ids(prompt + reference.text)
    assert ids == engine.prompt_ids(prompt) + reference.token_ids  # (the case: the text encodes back alike)
    cell = {"named": f"%%lm --quiet --temperature 0 --state unrun\n{prompt}{{gen r max_tokens=6}}",
            "unnamed": f"%%lm --quiet --temperature 0 --python --state unrun\ns += {prompt!r} + lmnb.gen(max_tokens=6)"}
    assert run(ip, cell[gen])[0].success
    assert get_session().states["unrun"].state.text() == prompt + reference.text
    [label] = [k for k in _tree_paths(ip)[0] if k.startswith("unrun ")]
    assert label.endswith(f" · {len(ids) - 1}/{len(ids)} tok cached (last token not run yet)"), label
    engine._call(lambda: engine.scheduler.cache.evict(1))  # (the least recently used leaf: the gen's tokens)
    paths, nodes = _tree_paths(ip)
    [label] = [k for k in paths if k.startswith("unrun ")]
    depth, node = 0, nodes[paths[label]]
    while node["parent"] is not None:  # the tokens from the root to the end of the node the path ends at
        depth, node = depth + node["num_tokens"], nodes[node["parent"]]
    assert depth < len(ids) - 1 and label.endswith(f" · {depth}/{len(ids)} tok cached"), label
    run(ip, "%lm reset unrun")


def test_tree_badges_and_states_name_a_cell_as_its_view_does(ip):
    """%lm tree's badge read "NAME (cell 3)" for a state and "cell [3]" for a recent cell, and %lm
    states listed a state's cells as "[3]": one style now, the run view's title's, "cell [N]"."""
    run(ip, "%lm reset")
    assert run(ip, "%%lm --quiet --temperature 0 --state badge\nOne{gen b1 max_tokens=2}")[0].success
    assert run(ip, "%%lm --quiet --temperature 0 --state badge\nTwo{gen b2 max_tokens=2}")[0].success
    first, last = get_session().states["badge"].cells  # (the In [N] numbers the session kept)
    result, out = run(ip, "%%lm --static --temperature 0\nThree{gen b3 max_tokens=2}")
    assert result.success
    from lmnb_kernel.widgets import VIEW_MIME

    # (the cell's run view; a tree an earlier test showed is redrawn after the cell too)
    title = [o.data[VIEW_MIME]["title"] for o in out.outputs if o.data.get(VIEW_MIME, {}).get("kind") == "run"][-1]
    assert re.fullmatch(r"cell \[\d+\]", title), title
    labels = list(_tree_paths(ip)[0])
    assert [k for k in labels if k.startswith("badge ")][0].startswith(f"badge (cell [{last}])")
    assert any(k.startswith(title) for k in labels), labels  # (the recent cell's badge: its view's title)
    shown = run(ip, "%lm states")[1].outputs[0].data["text/plain"]
    assert f"cell [{first}], cell [{last}]" in shown, shown
    run(ip, "%lm reset badge")


def test_tree_says_a_gen_whose_text_encodes_to_other_ids_is_no_eviction(ip):
    """The tiny model's output holds bytes that are no valid UTF-8, decoded as U+FFFD, so the
    state's text encodes to other ids than the model generated: its path read "6/13 tok cached",
    as if evicted. The path is matched with the ids the text encodes to (the ids a request
    continuing the state runs as, so the count is that request's cache hit), and the label says
    the cache goes on with other tokens."""
    run(ip, "%lm flush")
    prompt = "Hello"
    reference = greedy_result(prompt, 8)
    engine = get_session().backend().engine
    generated = engine.prompt_ids(prompt) + reference.token_ids
    ids = engine.prompt_ids(prompt + reference.text)
    cached = _common(ids, generated[:-1])  # (the request cached its ids less the last)
    assert cached < min(len(ids), len(generated)) - 1  # (the case: they part before the last token)
    assert run(ip, f"%%lm --quiet --temperature 0 --state reencoded\n{prompt}{{gen r max_tokens=8}}")[0].success
    [label] = [k for k in _tree_paths(ip)[0] if k.startswith("reencoded ")]
    assert label.endswith(f" · {cached}/{len(ids)} tok cached (the rest encodes to other tokens than the cache "
                          "holds)"), label
    # the count is the cache hit of the request that continues the state
    result, out = run(ip, "%%lm --temperature 0 --state reencoded\n.{gen more max_tokens=1}")
    assert result.success and summaries(out)[-1]["tokens"]["cached_tokens"] == cached
    run(ip, "%lm reset reencoded")


def test_stats_name_the_model_cells_run_on(ip, tiny_llama, monkeypatch):
    # the title said "lmnb engine" alone: after a few %lm load and %lm connect lines nothing said which
    # model cells ran on (a server was named), nor which one the first cell would load
    monkeypatch.setenv("LMNB_MODEL", str(tiny_llama))
    with separate_session(ip):
        result, out = run(ip, "%lm stats")
        assert result.success and out.outputs[0].data["text/plain"].splitlines()[0] == (
            f"lmnb engine: not started yet; the first %%lm cell starts it on {tiny_llama} (from $LMNB_MODEL) "
            "(or %lm load MODEL)")
        assert run(ip, f"%lm load {tiny_llama} --max-total-tokens 4096 --random-weights")[0].success
        result, out = run(ip, "%lm stats")
        assert result.success
        assert out.outputs[0].data["text/plain"].splitlines()[0] == (
            f"lmnb engine on {tiny_llama}, with random weights (--random-weights)")


def test_stats_say_the_hit_rate_counts_since_the_last_flush(ip):
    """%lm flush resets the engine's counters (Engine.flush_cache), but %lm stats labelled the hit
    rate "cumulative": after a flush it read n/a, as if nothing had run."""
    run(ip, "%%lm --quiet --temperature 0\nA prompt before the flush.{gen f max_tokens=2}")
    result, out = run(ip, "%lm flush")
    assert result.success and "hit-rate counters start again" in out.outputs[0].data["text/plain"]
    result, out = run(ip, "%lm stats")
    text = out.outputs[0].data["text/plain"]
    assert out.outputs[0].metadata["lmnb"]["stats"]["prompt_tokens"] == 0
    assert "hit rate (engine, since load or %lm flush)" in text and "cumulative" not in text


def test_the_default_backend_warning_and_stats_name_the_backend_readably(ip):
    """The set_default_backend warning and the %lm stats row showed the backend as
    <lmnb.backend.engine.Engine object at 0x7ff2...>; they name it as it was made: the in-process
    engine by its model (the demo model by name), an OpenAI backend by its model and URL."""
    from types import SimpleNamespace

    from lmnb_engine.checkpoint_path import DEMO_MODEL_PATH

    kernels = lmnb.global_config.default_backend
    cases = [
        (lmnb.Engine(engine=SimpleNamespace(model_path="/models/llama", model_info=dict)), "lmnb.Engine (model /models/llama)"),
        (lmnb.Engine(engine=SimpleNamespace(model_path=str(DEMO_MODEL_PATH), model_info=dict)), "lmnb.Engine (demo model)"),
        (lmnb.OpenAI("m", base_url="http://127.0.0.1:9/v1", api_key="k"),
         "lmnb.OpenAI('m', base_url='http://127.0.0.1:9/v1')"),
    ]
    try:
        for backend, name in cases:
            lmnb.set_default_backend(kernels)
            ip.user_ns["backend"] = backend
            result, out = run(ip, "lmnb.set_default_backend(backend)")
            assert result.success and out.stderr.startswith(f"lmnb: warning: Python programs now run on {name}"), out.stderr
            text = run(ip, "%lm stats")[1].outputs[0].data["text/plain"]
            assert f" {name} (lmnb.set_default_backend), not counted here" in text, text
    finally:
        lmnb.set_default_backend(kernels)


def test_replacing_the_kernels_default_backend_warns_and_stats_say_where_python_programs_run(ip):
    """The README's sgl.set_default_backend(sgl.Engine()), pasted into the kernel, loaded a second
    copy of the model with its own radix cache, silently: %lm stats then said the engine had not
    started though programs ran. Replacing the kernel's default backend now warns (a second copy of
    the model for an in-process Engine of its own), and %lm stats names the backend Python programs
    use. The kernel's own engine, or None (as the extension's unload sets), is not warned of."""
    from types import SimpleNamespace

    from lmnb_kernel.session import SessionBackend

    kernels = lmnb.global_config.default_backend
    assert isinstance(kernels, SessionBackend)
    # (an engine of its own, not loaded: lmnb.Engine takes an engine= with a model_info method)
    ip.user_ns["second"] = second = lmnb.Engine(engine=SimpleNamespace(model_info=dict))
    ip.user_ns["same"] = lmnb.Engine(engine=get_session().engine("a test"))
    warning = ("lmnb: warning: Python programs now run on {}{}, not on the kernel's engine that %%lm cells use (%lm stats "
               "counts only that one); in the lmnb kernel leave the default backend unset and choose the model with %lm "
               "load (a server with %lm connect), or pass backend= to run() for one program; "
               "lmnb.set_default_backend(None) goes back to the kernel's engine\n")
    try:
        result, out = run(ip, "lmnb.set_default_backend(second)")
        assert result.success and out.stderr == warning.format(
            repr(second), ", a second copy of the model in memory with a radix cache of its own")
        text = run(ip, "%lm stats")[1].outputs[0].data["text/plain"]
        assert "\nPython programs run on " in text and f" {second!r} (lmnb.set_default_backend), not counted here" in text
        assert run(ip, "lmnb.set_default_backend(same)")[1].stderr == ""  # (the default was second's, not the kernel's)
        lmnb.set_default_backend(kernels)
        assert run(ip, "lmnb.set_default_backend(same)")[1].stderr == warning.format(repr(ip.user_ns["same"]), "")
        lmnb.set_default_backend(kernels)
        assert run(ip, "lmnb.set_default_backend(None)")[1].stderr == ""
        assert "Python programs run on" not in run(ip, "%lm stats")[1].outputs[0].data["text/plain"]
        # the way back the warning gives: from another default, None goes back to the kernel's engine
        lmnb.set_default_backend(second)
        assert run(ip, "lmnb.set_default_backend(None)")[1].stderr == ""
        back = lmnb.get_default_backend()
        assert isinstance(back, SessionBackend) and back._session is get_session()
        assert "Python programs run on" not in run(ip, "%lm stats")[1].outputs[0].data["text/plain"]
    finally:
        lmnb.set_default_backend(kernels)
    assert "Python programs run on" not in run(ip, "%lm stats")[1].outputs[0].data["text/plain"]


@contextmanager
def separate_session(ip):
    """Run the magics on a fresh session (so the module's in-process engine stays loaded)."""
    magics = ip._lmnb_magics
    real, magics.session = magics.session, Session()
    try:
        yield magics.session
    finally:
        magics.session.close()
        magics.session = real


def test_connect_to_a_served_engine_gives_the_in_process_result(ip, tiny_llama):
    import socket
    import subprocess
    import sys

    from helpers_lang import served_url

    # --port 0: the system picks a free port, which the "serving" line names (a port found free by
    # the test, closed and bound by the server later could be taken meanwhile)
    server = subprocess.Popen([sys.executable, "-m", "lmnb_kernel.cli", "serve", "--model", str(tiny_llama),
                               "--port", "0", "--log-level", "warning"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = served_url(server)
        expected = greedy(ip, "Q: where\nA:", 5)
        with socket.socket() as other, separate_session(ip):
            # a port nothing listens on, held by this socket (bound, never listening) so that no other
            # process takes it meanwhile; bound once the server holds its port: never the server's
            other.bind(("127.0.0.1", 0))
            closed = other.getsockname()[1]
            # ("default": the name docs/cli.md gives lmnb serve's model, which GET /v1/models does not list)
            for connect in (f"%lm connect {url}", f"%lm connect {url}/v1 --openai {tiny_llama} --completion",
                            f"%lm connect {url}/v1 --openai default --completion"):
                result, out = run(ip, connect)
                assert result.success, out.stdout
                ip.user_ns.pop("remote", None)
                result, out = run(ip, "%%lm --static --temperature 0\nQ: where\nA:{gen remote max_tokens=5}")
                assert result.success, out.stdout
                assert ip.user_ns["remote"] == expected
            result, out = run(ip, "%lm stats")  # informational: it must not stop a Run-All
            assert result.success, out.stdout
            assert "whose cache figures are not shown here" in out.outputs[0].data["text/plain"]
            # a wrong URL or model is named at connect time, not by the first cell
            for connect, words in [(f"%lm connect {url} --openai {tiny_llama} --completion", f"e.g. {url}/v1"),
                                   (f"%lm connect {url}/v1 --openai nope --completion", "does not serve model 'nope'"),
                                   (f"%lm connect {url}/v1", "looks like an OpenAI API root: add --openai MODEL"),
                                   (f"%lm connect http://127.0.0.1:{closed}/v1 --openai m", "nothing answers there")]:
                result, out = run(ip, connect)
                assert not result.success and words in out.stdout, out.stdout
            with socket.socket() as silent:  # accepts connections, never answers: a /v1 root is kept
                silent.bind(("127.0.0.1", 0))
                silent.listen()
                result, out = run(ip, f"%lm connect http://127.0.0.1:{silent.getsockname()[1]}/v1 --openai m")
                assert result.success and "could not list its models (APITimeoutError)" in out.outputs[0].data["text/plain"]
    finally:
        server.terminate()
        server.wait(30)


def test_connect_says_which_named_states_it_drops(ip, monkeypatch):
    # %lm load named the states it dropped; %lm connect dropped them (and their pins) without a word
    class Server:
        def shutdown(self):
            pass

    monkeypatch.setattr(lmnb, "RuntimeEndpoint", lambda *args, **kwargs: Server())
    with separate_session(ip) as session:
        session.states["chat"] = object()
        session.states["a.v2"] = object()
        result, out = run(ip, "%lm connect http://127.0.0.1:1")
        assert result.success and session.states == {}
        assert out.outputs[0].data["text/plain"] == (
            "connected: SGLang-protocol server http://127.0.0.1:1; named states dropped: a.v2, chat")
        result, out = run(ip, "%lm connect http://127.0.0.1:2")  # none left: nothing to say
        assert out.outputs[0].data["text/plain"] == "connected: SGLang-protocol server http://127.0.0.1:2"


def test_a_closed_session_no_longer_names_the_server_it_was_connected_to(ip, monkeypatch):
    # close() shut the server's client down but kept its description: current() and %lm stats said cells
    # ran on the server, though the next %%lm cell would start the in-process engine
    class Server:
        def __init__(self, url, **kwargs):
            self.closed = False

        def shutdown(self):
            self.closed = True

    monkeypatch.setattr(lmnb, "RuntimeEndpoint", Server)
    monkeypatch.delenv("LMNB_MODEL", raising=False)
    with separate_session(ip) as session:
        assert run(ip, "%lm connect http://127.0.0.1:1")[0].success
        server = session.backend()
        session.close()
        assert server.closed and not session.started and session.remote is None
        assert session.current() == "the in-process engine on the built-in demo model (it starts with the first %%lm cell)"
        result, out = run(ip, "%lm stats")
        assert result.success and out.outputs[0].data["text/plain"].startswith(
            "lmnb engine: not started yet; the first %%lm cell starts it on the built-in demo model (or %lm load MODEL)")
        assert not session.started  # (nothing was loaded by asking)


def test_connected_the_way_back_named_is_the_load_of_the_engine_the_session_had(ip, tiny_llama, monkeypatch):
    # "use %lm load to go back" loaded $LMNB_MODEL or the demo model, not the engine the notebook had
    class Server:
        def __init__(self, url, **kwargs):
            pass

        def shutdown(self):
            pass

    monkeypatch.setattr(lmnb, "RuntimeEndpoint", Server)
    with separate_session(ip) as session:
        assert run(ip, f"%lm load {tiny_llama} --max-total-tokens 4096")[0].success
        assert run(ip, "%lm connect http://127.0.0.1:1")[0].success
        result, out = run(ip, "%lm tree")
        back = f"%lm load {tiny_llama} --max-total-tokens 4096"
        assert not result.success and f"(use {back} to go back to an in-process engine)" in out.stdout
        result, out = run(ip, back)
        assert result.success and session.remote is None
        assert session.backend().engine.model_info()["max_total_tokens"] == 4096


@pytest.mark.parametrize("config", [EngineConfig(), EngineConfig(model="/my models/x", dtype="bfloat16"),
                                    EngineConfig(model="tiny", device="cuda:1", max_total_tokens=512, random_weights=True)])
def test_an_engine_configs_load_line_loads_that_configuration(config):
    import shlex

    from lmnb_kernel.magics import line_parser

    line = config.load_line()
    args = line_parser().parse_args(shlex.split(line.removeprefix("%lm ")))
    assert EngineConfig(model=args.model, device=args.device, dtype=args.dtype, max_total_tokens=args.max_total_tokens,
                        random_weights=args.random_weights) == config
    assert line == {"": "%lm load", "/my models/x": "%lm load '/my models/x' --dtype bfloat16",
                    "tiny": "%lm load tiny --device cuda:1 --max-total-tokens 512 --random-weights"}[config.model or ""]


@pytest.mark.parametrize("marked", [False, True])
def test_a_ctrl_c_as_connect_waits_for_the_old_backend_to_shut_down_leaves_the_new_one_in_place(ip, monkeypatch,
                                                                                              marked):
    """%lm connect shut the old backend down first, waiting for it (a server's client waits for an
    abort in flight): a Ctrl-C in that wait left the session with no backend at all, the new
    server's client dropped unclosed, and the next %%lm cell silently loaded an in-process engine.
    Now the new backend is put in place first, with Ctrl-C held, and a press in the wait that
    follows only stops the wait: cells run on the new server, and the stop and the connected line
    say so. ``marked``: the press landed as the wait began (Python only marks it)."""
    import signal

    from helpers_lang import called_from, in_a_threading_wait, interrupt_main_when, main_thread_blocked_in

    from lmnb_kernel import session as session_module

    gate, closed = threading.Event(), []

    class Server:
        def __init__(self, url, **kwargs):
            self.url = url

        def shutdown(self):
            closed.append(self.url)
            if self.url.endswith(":1"):  # (the old one: its shutdown waits, as for a wedged server's abort)
                gate.wait(30)

    monkeypatch.setattr(lmnb, "RuntimeEndpoint", Server)
    magics = ip.magics_manager.registry["LMMagics"]
    connecting = lambda: main_thread_blocked_in(  # noqa: E731
        lambda stack: in_a_threading_wait(stack) and called_from(stack, "connect", session_module.__file__))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with separate_session(ip) as session:
            assert run(ip, "%lm connect http://127.0.0.1:1")[0].success
            session.states["chat"] = object()
            # (as an in-process engine's would be: the stop was raised before run_command forgot them)
            monkeypatch.setattr(magics, "recent_cells", {"cell [1]": object()})
            monkeypatch.setattr(magics, "tree_view", object())
            with capture_output() as out, interrupt_main_when(connecting, marked_only=marked):
                with pytest.raises(KeyboardInterrupt) as e:
                    magics.run_command("connect http://127.0.0.1:2")
            assert not gate.is_set()  # (stopped while the old one still shut down)
            assert session.remote == "SGLang-protocol server http://127.0.0.1:2" and session.states == {}
            assert session.backend().url == "http://127.0.0.1:2"  # the server's, no in-process engine started
            assert closed == ["http://127.0.0.1:1"]  # the old one only
            assert magics.recent_cells == {} and magics.tree_view is None  # the old backend's paths, gone with it
            assert e.value._render_traceback_() == [
                "\x1b[0;31mKeyboardInterrupt\x1b[0m: %lm connect was stopped as the old backend shut down; cells run "
                "on SGLang-protocol server http://127.0.0.1:2 now (the old backend's shutdown goes on in the background)"]
            assert out.outputs[0].data["text/plain"] == (
                "connected: SGLang-protocol server http://127.0.0.1:2; named states dropped: chat")
    finally:
        signal.signal(signal.SIGINT, previous)
        gate.set()


def test_a_ctrl_c_as_connect_waits_for_the_openai_servers_models_keeps_the_old_backend(ip, monkeypatch):
    """%lm connect --openai asks the server for its models before it connects; a Ctrl-C in that
    wait said only "%lm connect was stopped", and the new backend was dropped with its client open
    (left to the garbage collector). Now that client is closed, and the stop says the cells still
    run on the old backend, which is kept with its named states."""
    import signal
    import types

    from helpers_lang import called_from, in_a_threading_wait, interrupt_main_when, main_thread_blocked_in

    from lmnb_kernel import commands

    gate, closed = threading.Event(), []

    class Server:
        def __init__(self, url, **kwargs):
            self.url = url

        def shutdown(self):
            closed.append(self.url)

    class OpenAI(Server):  # its model list waits for the server (here until the test ends)
        def __init__(self, model, base_url, **kwargs):
            super().__init__(base_url)
            models = types.SimpleNamespace(list=lambda: gate.wait(30) and [])
            self.client = types.SimpleNamespace(with_options=lambda **kw: types.SimpleNamespace(models=models))

    monkeypatch.setattr(lmnb, "RuntimeEndpoint", Server)
    monkeypatch.setattr(lmnb, "OpenAI", OpenAI)
    magics = ip.magics_manager.registry["LMMagics"]
    listing = lambda: main_thread_blocked_in(  # noqa: E731
        lambda stack: in_a_threading_wait(stack) and called_from(stack, "_served_models_note", commands.__file__))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with separate_session(ip) as session:
            assert run(ip, "%lm connect http://127.0.0.1:1")[0].success
            session.states["chat"] = kept = object()
            with capture_output() as out, interrupt_main_when(listing):
                with pytest.raises(KeyboardInterrupt) as e:
                    magics.run_command("connect http://127.0.0.1:2/v1 --openai m")
            assert not gate.is_set()
            assert session.backend().url == "http://127.0.0.1:1" and session.states == {"chat": kept}
            assert closed == ["http://127.0.0.1:2/v1"]  # the new one's client, closed
            assert e.value._render_traceback_() == [
                "\x1b[0;31mKeyboardInterrupt\x1b[0m: %lm connect was stopped before it connected; cells still run on "
                "SGLang-protocol server http://127.0.0.1:1"]
            assert out.outputs == []  # (no "connected" line)
    finally:
        signal.signal(signal.SIGINT, previous)
        gate.set()


@pytest.mark.parametrize("cause, refused", [("ConnectTimeout", True), ("ReadTimeout", False)])
def test_connect_tells_a_host_that_never_answers_from_a_server_that_is_slow_to(ip, monkeypatch, cause, refused):
    """A connect timeout (a firewalled host) is refused at connect time; a read timeout (a server
    that took the connection) keeps the /v1 root. openai raises both as APITimeoutError, from
    httpx's error (as a real connect to a full accept queue showed), or from httpx2's in openai 3,
    whose connect timeout a check of httpx's class missed. Here every transport of both raises it."""
    import importlib

    for name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue

        def timed_out(self, request, *, module=module):
            raise getattr(module, cause)("timed out", request=request)

        monkeypatch.setattr(module.HTTPTransport, "handle_request", timed_out)
    with separate_session(ip):
        result, out = run(ip, "%lm connect http://10.0.0.1:8000/v1 --openai m")
    if refused:
        assert not result.success and "could not connect to http://10.0.0.1:8000/v1: nothing answers there" in out.stdout
    else:
        assert result.success and "could not list its models (APITimeoutError)" in out.outputs[0].data["text/plain"]


def test_load_starts_an_engine_now_and_a_failed_load_keeps_the_old_one(ip, tiny_llama):
    engine = get_session().backend().engine
    _, out = run(ip, "%lm load /no/such/checkpoint")
    assert get_session().backend().engine is engine  # still serving the next cell, which the error says
    assert f"cells still run on the in-process engine on {tiny_llama}" in out.stdout + out.stderr
    with separate_session(ip) as session:
        result, out = run(ip, "%lm stats")  # before any engine: the totals, and no error
        assert result.success and "not started yet" in out.outputs[0].data["text/plain"]
        result, out = run(ip, f"%lm load {tiny_llama} --max-total-tokens 4096")
        assert result.success, out.stdout
        assert session.started and session.backend().engine.model_info()["max_total_tokens"] == 4096
        assert str(tiny_llama) in out.outputs[0].data["text/plain"]
        assert run(ip, "%%lm --static --quiet --state kept\nhi{gen k max_tokens=1}")[0].success
        assert run(ip, "%lm tree")[0].success
        result, out = run(ip, f"%lm load {tiny_llama} --max-total-tokens 4096")
        assert "named states dropped: kept" in out.outputs[0].data["text/plain"] and not session.states
        _, out = run(ip, "%%lm --static --quiet\nhi{gen k max_tokens=1}")
        assert out.outputs == []  # the tree of the old engine is not redrawn with the new one's nodes
        with pytest.MonkeyPatch.context() as mp:  # no MODEL: $LMNB_MODEL (else the demo model)
            mp.setenv("LMNB_MODEL", str(tiny_llama))
            result, out = run(ip, "%lm load")
            assert result.success and session.backend().engine.model_info()["model_path"] == str(tiny_llama)


class _RecordedEngine:
    """An in-process engine's stand-in on a device (``runner.device``) that records, in ``order``,
    when it is shut down and when its memory is released."""

    def __init__(self, order: list, name: str, device: str = "cuda:0") -> None:
        import torch

        self.order, self.name = order, name
        self.engine = self  # (lmnb's backend and the lmnb_engine engine at once)
        self.runner = type("Runner", (), {"device": torch.device(device)})()

    def shutdown(self):
        self.order.append(f"shut down {self.name}")

    def release_memory(self):
        self.order.append(f"free {self.name}")


@pytest.mark.parametrize("shared, expected", [
    # the GPU the new engine loads on holds the old one: freed first, once the new checkpoint is found
    ("cuda:0", ["check new", "free old", "start new"]),
    (None, ["start new", "shut down old"]),  # CPU, another GPU: the new one loads first, the old one is kept till then
])
def test_a_load_onto_the_old_engines_gpu_frees_it_first(monkeypatch, shared, expected):
    """On CUDA the old engine held its weights and a KV pool of 0.8 of the GPU's free memory while
    the new one loaded, so a second %lm load on the same GPU was refused ("free the GPU") or got a
    tiny KV pool, and only a kernel restart helped."""
    from lmnb_kernel import session as session_module

    order = []

    def engine(*args, **kwargs):
        order.append("start new")
        return _RecordedEngine(order, "new")

    monkeypatch.setattr(lmnb, "Engine", engine)
    monkeypatch.setattr(session_module, "shared_accelerator", lambda backend, config: shared)
    monkeypatch.setattr("lmnb_engine.model_loader.check_model", lambda *args: order.append("check new"))
    session = Session()
    session._backend = _RecordedEngine(order, "old")
    session.states["chat"] = object()
    session.load(EngineConfig(model="/models/new", device="cuda:0"))
    assert order == expected and session.made_backend.name == "new" and session.states == {}
    assert session.config.model == "/models/new"


def test_shared_accelerator_is_the_gpu_of_an_in_process_engine_that_the_new_config_loads_on(monkeypatch):
    import torch

    from lmnb_kernel.session import shared_accelerator

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (as where an engine runs on CUDA)
    on = {name: _RecordedEngine([], name, name) for name in ("cuda", "cuda:0", "cuda:1", "cpu")}
    assert shared_accelerator(on["cuda:1"], EngineConfig(device="cuda:1")) == "cuda:1"
    assert shared_accelerator(on["cuda"], EngineConfig(device="cuda:1")) == "cuda:1"  # (bare: the current one)
    assert shared_accelerator(on["cuda:0"], EngineConfig(device="cuda")) is None
    assert shared_accelerator(on["cuda:0"], EngineConfig(device="cuda:1")) is None
    assert shared_accelerator(on["cuda:0"], EngineConfig(device="cpu")) is None
    assert shared_accelerator(on["cpu"], EngineConfig(device="cpu")) is None  # (host RAM: the old one is kept)
    assert shared_accelerator(on["cuda:0"], EngineConfig(device="gpu")) is None  # refused before it takes memory
    assert shared_accelerator(None, EngineConfig(device="cuda:0")) is None
    assert shared_accelerator(object(), EngineConfig(device="cuda:0")) is None  # a server's client
    for available, expected in ((True, "cuda:1"), (False, None)):  # no --device: the engine's default
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        assert shared_accelerator(on["cuda:1"], EngineConfig()) == expected


def test_a_failed_load_after_freeing_the_gpu_says_so_and_how_to_load_the_old_engine_again(ip, tiny_llama, monkeypatch,
                                                                                          tmp_path):
    import shutil

    from lmnb_kernel import session as session_module

    # a checkpoint that passes the checks made before the old engine is closed (its config.json is
    # a supported one) and fails as its weights load: it has none
    weightless = tmp_path / "weightless"
    shutil.copytree(tiny_llama, weightless, ignore=shutil.ignore_patterns("*.safetensors"))
    with separate_session(ip) as session:
        assert run(ip, f"%lm load {tiny_llama} --max-total-tokens 4096")[0].success
        assert run(ip, "%%lm --static --quiet --state kept\nhi{gen k max_tokens=1}")[0].success
        old = session.made_backend.engine
        # (this machine's CPU engine stands for one on the GPU that the next load asks for)
        monkeypatch.setattr(session_module, "shared_accelerator", lambda backend, config: "cuda:0")
        # a path that is no checkpoint is told before the old engine is closed: it stays, with its states
        result, out = run(ip, "%lm load /no/such/checkpoint")
        text = out.stdout + out.stderr
        assert not result.success and "Traceback" not in text and "closed first" not in text
        assert "CellError\x1b[0m: could not load /no/such/checkpoint: FileNotFoundError" in text
        assert session.made_backend.engine is old and set(session.states) == {"kept"}
        # so is a --max-total-tokens below lmnb's least pool, read from the new checkpoint's tokenizer
        # (it was told only once the new engine had loaded, after the old one was closed): 1 + 128 - 1
        result, out = run(ip, f"%lm load {tiny_llama} --max-total-tokens 10")
        text = out.stdout + out.stderr
        assert not result.success and "Traceback" not in text and "closed first" not in text
        assert (f"CellError\x1b[0m: could not load {tiny_llama}: ValueError: a KV pool of 10 tokens cannot hold one "
                "gen of lmnb's default max_tokens (128) after a one-character prompt (1 token); pass --max-total-tokens "
                "128 or more\n") in text
        assert session.made_backend.engine is old and set(session.states) == {"kept"}
        assert old.runner.max_total_tokens == 4096 and any(p.numel() for p in old.runner.model.parameters())
        result, out = run(ip, f"%lm load {weightless}")
        text = out.stdout + out.stderr
        assert not result.success and "Traceback" not in text
        assert f"CellError\x1b[0m: could not load {weightless}: FileNotFoundError" in text
        assert text.endswith(
            f"\nthe engine on {tiny_llama} was closed first, to free cuda:0 for the new model; named states dropped: "
            f"kept; %lm load {tiny_llama} --max-total-tokens 4096 loads it again\n"
            f"cells run on the in-process engine on {tiny_llama} (it starts with the first %%lm cell)\n")
        assert not session.started and session.states == {}
        assert all(p.numel() == 0 for p in old.runner.model.parameters())  # its memory is freed
        monkeypatch.setattr(session_module, "shared_accelerator", lambda backend, config: None)
        assert run(ip, f"%lm load {tiny_llama} --max-total-tokens 4096")[0].success  # the line it gave
        assert session.backend().engine.model_info()["max_total_tokens"] == 4096
        assert run(ip, "%%lm --static --quiet\nhi{gen k max_tokens=1}")[0].success


def test_a_load_with_random_weights_says_so(ip, tiny_llama):
    # it said "loaded <model>" as for the checkpoint's own weights, so its nonsense output read as the model's
    with separate_session(ip) as session:
        result, out = run(ip, f"%lm load {tiny_llama} --random-weights --max-total-tokens 256")
        assert result.success and session.backend().engine.model_info()["max_total_tokens"] == 256
        title = out.outputs[0].data["text/plain"].splitlines()[0]
        assert title == f"loaded {tiny_llama}, with random weights (--random-weights)"
        result, out = run(ip, f"%lm load {tiny_llama} --max-total-tokens 256")  # its own weights again
        assert out.outputs[0].data["text/plain"].splitlines()[0] == f"loaded {tiny_llama}"


def test_an_interrupt_while_the_engine_loads_waits_for_the_load_and_keeps_the_engine(monkeypatch, capsys):
    """Cut short, one of the ~1000 imports of an engine start left torch half-initialised, and
    every later load failed until the kernel restarted."""
    import os
    import signal

    class Backend:
        def shutdown(self):
            pass

    loaded = []

    def engine(*args, **kwargs):
        # the kernel's interrupt, arriving mid-load: sent by this very thread, its handler runs as
        # the call returns, while the load goes on
        os.kill(os.getpid(), signal.SIGINT)
        loaded.append(True)
        return Backend()

    monkeypatch.setattr(lmnb, "Engine", engine)
    session, handler = Session(), signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        session.backend()
    assert loaded == [True] and session.started  # the cell stops, but the load finished and is kept
    assert "the interrupt takes effect once it is loaded" in capsys.readouterr().err
    backend = session.backend()
    assert isinstance(backend, Backend) and loaded == [True]  # no second load
    assert signal.getsignal(signal.SIGINT) is handler  # restored
    session.close()


def test_a_model_from_the_environment_is_named_as_such(monkeypatch):
    from lmnb_kernel.errors import CellError

    monkeypatch.setenv("LMNB_MODEL", "/no/such/model")
    session = Session()
    with pytest.raises(CellError) as e:
        session.backend()
    assert str(e.value).startswith("could not load /no/such/model (from $LMNB_MODEL): FileNotFoundError")
    # the fix named only %lm load, though the variable is what names the model (every cell reads it again)
    assert str(e.value).endswith("\nfix: %lm load PATH_OR_HF_ID (a local Hugging Face checkpoint directory or hub id); "
                                 "or point $LMNB_MODEL at a checkpoint (%env LMNB_MODEL=PATH), or remove it for the "
                                 "demo model (del os.environ['LMNB_MODEL'])")
    assert session.current() == "the in-process engine on /no/such/model (from $LMNB_MODEL) (it starts with the first %%lm cell)"
    monkeypatch.delenv("LMNB_MODEL")
    assert session.config.describe() == "the built-in demo model"


def test_a_load_error_in_the_first_lm_cell_names_lm_loads_option(tiny_llama, monkeypatch):
    """The first %%lm cell, which starts the engine, said "pass --max-total-tokens" when the KV
    pool did not fit: %%lm has no such option (it is %lm load's), as its request errors say."""
    import lmnb_engine.model_runner as model_runner
    from lmnb_kernel.errors import CellError

    monkeypatch.setenv("LMNB_MODEL", str(tiny_llama))
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 1000)
    session = Session()
    session.config = EngineConfig(device="cpu")
    with pytest.raises(CellError) as e:
        session.backend()
    assert str(e.value).endswith("the KV pool's share of free memory on cpu (0.1) leaves room for only 0 KV tokens "
                                 "(512 bytes each); pass %lm load's --max-total-tokens, or free some memory")


def test_ctrl_c_while_a_cell_is_read_stops_it_in_one_line(ip, monkeypatch):
    # the first json_schema= cell spends a second importing jsonschema; Ctrl-C there showed 40 frames
    import lmnb.template

    def parse(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lmnb.template, "parse", parse)
    magics = ip.magics_manager.registry["LMMagics"]
    with pytest.raises(KeyboardInterrupt) as e:
        magics.run_program("--static", "x{gen a max_tokens=1}\n")
    assert e.value.__cause__ is None and e.value.__suppress_context__
    assert e.value._render_traceback_() == [
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: the cell was stopped while it was being read; nothing ran"]


def test_ctrl_c_while_lm_flush_waits_says_the_cache_is_whole_and_the_flush_runs_all_the_same(ip, monkeypatch):
    """Ctrl-C while %lm flush waited for the engine (the flush is a call run between the
    scheduler's steps) said "%lm flush was stopped" alone: whether the cache was flushed, half
    flushed or broken was not said. The engine runs a flush it was handed all the same, so the
    stop says the cache is whole and the flush can be run again; here the flush sends the SIGINT
    itself, while %lm flush waits, and the cache is then flushed and consistent."""
    import signal

    engine = get_session().backend().engine
    cache = engine.scheduler.cache
    evict = cache.evict

    def evict_after_ctrl_c(n):  # (on the scheduler thread, inside the flush)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return evict(n)

    assert run(ip, "%%lm --temperature 0\nThe quick brown fox{gen to_flush max_tokens=2}")[0].success
    assert engine.cache_stats()["evictable_tokens"] > 0  # (the cell's prefix is cached)
    monkeypatch.setattr(cache, "evict", evict_after_ctrl_c)
    magics = ip.magics_manager.registry["LMMagics"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            magics.run_command("flush")
        monkeypatch.setattr(cache, "evict", evict)
        assert e.value._render_traceback_() == [
            "\x1b[0;31mKeyboardInterrupt\x1b[0m: %lm flush was stopped; the radix cache is whole: a flush the engine "
            "was handed still runs between its steps, else the cache is as it was (pinned prefixes stay either way); "
            "%lm flush can be run again"]
        assert engine.cache_stats()["evictable_tokens"] == 0  # (the flush ran; the stats call comes after it)
        engine.check_invariants()
        assert run(ip, "%lm flush")[0].success
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_lm_stats_waits_says_nothing_changed(ip, monkeypatch):
    """Ctrl-C while %lm stats waited for the engine's figures said "%lm stats was stopped" alone;
    it now says that stats only reads, so nothing changed, and it can be run again (it does). The
    figures' call sends the SIGINT itself, while %lm stats waits."""
    import signal

    scheduler = get_session().backend().engine.scheduler
    stats = scheduler.stats

    def stats_after_ctrl_c():  # (on the scheduler thread)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return stats()

    assert run(ip, "%%lm --temperature 0\nThe quick brown fox{gen x max_tokens=2}")[0].success  # (the engine is started)
    monkeypatch.setattr(scheduler, "stats", stats_after_ctrl_c)
    magics = ip.magics_manager.registry["LMMagics"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            magics.run_command("stats")
        monkeypatch.setattr(scheduler, "stats", stats)
        assert e.value._render_traceback_() == [
            "\x1b[0;31mKeyboardInterrupt\x1b[0m: %lm stats was stopped; it only reads figures, so nothing changed; "
            "%lm stats can be run again"]
        result, out = run(ip, "%lm stats")
        assert result.success and "hit rate" in out.outputs[0].data["text/plain"]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_a_line_magic_is_one_line(ip, monkeypatch):
    # %lm pin of a long state waits for its prefill; Ctrl-C there showed the engine's and threading's frames
    from lmnb_kernel import commands
    from lmnb_kernel.errors import cell_interrupt

    def stopped(args, session):
        raise KeyboardInterrupt

    def held(args, session):
        raise cell_interrupt("stopped once the model had loaded")

    monkeypatch.setattr(commands, "pin", stopped)
    monkeypatch.setattr(commands, "load", held)
    magics = ip.magics_manager.registry["LMMagics"]
    with pytest.raises(KeyboardInterrupt) as e:
        magics.run_command("pin chat")
    assert e.value._render_traceback_() == [
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: %lm pin was stopped; the state's pin is as it was"]
    with pytest.raises(KeyboardInterrupt) as e:  # the load's own message is kept
        magics.run_command("load")
    assert e.value._render_traceback_() == ["\x1b[0;31mKeyboardInterrupt\x1b[0m: stopped once the model had loaded"]
    monkeypatch.setattr(magics, "show_tree", lambda: stopped(None, None))  # (drawing a large tree)
    with pytest.raises(KeyboardInterrupt) as e:
        magics.run_command("tree")
    assert e.value._render_traceback_() == ["\x1b[0;31mKeyboardInterrupt\x1b[0m: %lm tree was stopped"]


def test_a_gen_with_n_samples_counts_every_sample_in_the_summary(ip):
    result, out = run(ip, "%%lm --static --temperature 0\nQ: name a colour\nA:{gen a n=2 max_tokens=3}")
    assert result.success, out.stdout
    backend = get_session().backend()
    stop = list(backend.get_chat_template().stop_str) or None
    samples = backend.engine.generate("Q: name a colour\nA:", SamplingParams(n=2, max_new_tokens=3, temperature=0, stop=stop))
    assert ip.user_ns["a"] == [r.text for r in samples]
    [meta] = summaries(out)  # it counted 0: the n metas arrive as one list
    assert meta["tokens"]["completion_tokens"] == sum(r.meta.completion_tokens for r in samples) > 0


def test_unloading_the_extension_removes_the_magics_and_loading_brings_them_back(ip):
    # %unload_ext lmnb_kernel left %%lm and %lm registered: cells kept running
    ip.extension_manager.unload_extension("lmnb_kernel")
    try:
        result, _ = run(ip, "%%lm --static\nhello")
        assert isinstance(result.error_in_exec, Exception) and "Cell magic `%%lm` not found" in str(result.error_in_exec)
        result, _ = run(ip, "%lm stats")
        assert "Line magic function `%lm` not found" in str(result.error_in_exec)
        # nor does an unset default come back to the kernel's engine (a program would get the demo engine)
        assert lmnb.global_config.default_backend is None and lmnb.api._unset_default is None
    finally:
        ip.extension_manager.load_extension("lmnb_kernel")
    result, out = run(ip, "%%lm --static --temperature 0\nhello{gen x max_tokens=2}")
    assert result.success, out.stdout


def test_unloading_the_extension_keeps_a_default_backend_the_user_set(ip):
    # %unload_ext lmnb_kernel set lmnb's default to None even when a cell had set its own backend:
    # the user's next program went to the demo engine instead of theirs
    theirs = BaseBackend()
    with capture_output():  # (the kernel's note that Python programs leave its engine)
        lmnb.set_default_backend(theirs)
    ip.extension_manager.unload_extension("lmnb_kernel")
    try:
        assert lmnb.global_config.default_backend is theirs
    finally:
        lmnb.set_default_backend(None)
        ip.extension_manager.load_extension("lmnb_kernel")
    assert type(lmnb.global_config.default_backend).__name__ == "SessionBackend"


def test_unloading_the_extension_removes_its_own_lmnb_name_but_not_one_the_user_imported(ip):
    # %unload_ext lmnb_kernel removed a user's own `import lmnb` (run after the load): it binds the
    # same module object the extension had put there, and the unload took the name whenever it was
    # still that module; the user's next `lmnb.gen(...)` was a NameError
    extensions = ip.extension_manager
    extensions.unload_extension("lmnb_kernel")
    try:
        ip.user_ns.pop("lmnb", None)  # (a fresh namespace: the extension puts the name there)
        extensions.load_extension("lmnb_kernel")
        assert ip.user_ns["lmnb"] is lmnb
        result, _ = run(ip, "from lmnb import gen as lmnb_gen\nlmnb_gen_name = lmnb.gen.__name__")
        assert result.success and ip.user_ns["lmnb_gen_name"] == "gen"  # uses the name, binds it not
        extensions.unload_extension("lmnb_kernel")
        assert "lmnb" not in ip.user_ns  # the extension's own: removed

        extensions.load_extension("lmnb_kernel")
        result, _ = run(ip, "import lmnb")
        assert result.success and ip.user_ns["lmnb"] is lmnb
        extensions.unload_extension("lmnb_kernel")
        assert ip.user_ns["lmnb"] is lmnb  # the user's: kept
        extensions.load_extension("lmnb_kernel")  # the name is taken now: never the extension's
        extensions.unload_extension("lmnb_kernel")
        assert ip.user_ns["lmnb"] is lmnb

        del ip.user_ns["lmnb"]  # imported in the very cell that loads the extension, below the magic
        result, _ = run(ip, "%load_ext lmnb_kernel\nimport lmnb")
        assert result.success and "lmnb_kernel" in extensions.loaded
        extensions.unload_extension("lmnb_kernel")
        assert ip.user_ns["lmnb"] is lmnb
    finally:
        for name in ("lmnb_gen", "lmnb_gen_name"):
            ip.user_ns.pop(name, None)
        if "lmnb_kernel" not in extensions.loaded:
            extensions.load_extension("lmnb_kernel")
        ip.user_ns["lmnb"] = lmnb  # (as the module's other tests find it)


def test_unloading_the_extension_keeps_an_lmnb_name_bound_by_code_no_cell_shows(ip, tmp_path):
    # %unload_ext lmnb_kernel removed an `import lmnb` run by `%run -i script.py` or by exec(...):
    # the watch reads only the cells' own code, and the name was still the module, so it was taken
    # as the extension's; the user's next lmnb.gen(...) was a NameError
    extensions = ip.extension_manager
    script = tmp_path / "imports_lmnb.py"
    script.write_text("import lmnb\n")
    try:
        for code in (f"%run -i {script}", f"%run {script}", "exec('import lmnb')",
                     "globals()['lmnb'] = __import__('lmnb')"):
            extensions.unload_extension("lmnb_kernel")
            ip.user_ns.pop("lmnb", None)
            extensions.load_extension("lmnb_kernel")  # (the name is the extension's now)
            result, _ = run(ip, code)
            assert result.success and ip.user_ns["lmnb"] is lmnb, code
            extensions.unload_extension("lmnb_kernel")
            assert ip.user_ns.get("lmnb") is lmnb, code  # the user's: kept
            extensions.load_extension("lmnb_kernel")
    finally:
        if "lmnb_kernel" not in extensions.loaded:
            extensions.load_extension("lmnb_kernel")
        ip.user_ns["lmnb"] = lmnb


@pytest.mark.parametrize("line", ["--python --static", '"--python" --static'])  # (the magic reads it with shlex)
def test_unloading_the_extension_keeps_an_lmnb_name_a_python_cells_body_bound(ip, line):
    # %unload_ext lmnb_kernel removed an lmnb a %%lm --python body bound with `global lmnb`: the
    # body runs with the namespace as its globals but not through IPython's AST transformers, and
    # the watch read only the cell's own code, a run_cell_magic call; lmnb.gen(...) was then a NameError
    extensions = ip.extension_manager
    try:
        extensions.unload_extension("lmnb_kernel")
        ip.user_ns.pop("lmnb", None)
        extensions.load_extension("lmnb_kernel")  # (the name is the extension's now)
        result, _ = run(ip, f"%%lm {line}\nglobal lmnb\nimport lmnb\ns += 'x'")
        assert result.success and ip.user_ns["lmnb"] is lmnb
        extensions.unload_extension("lmnb_kernel")
        assert ip.user_ns.get("lmnb") is lmnb  # the user's: kept
    finally:
        if "lmnb_kernel" not in extensions.loaded:
            extensions.load_extension("lmnb_kernel")
        ip.user_ns["lmnb"] = lmnb


@pytest.mark.parametrize("code, taken", [
    ("%%lm --python\nglobal lmnb\nlmnb = 1\ns += 'x'", True),
    ("%%lm --python --static\ndef f():\n    import lmnb\ns += 'x'", True),  # (any scope, as binds reads it)
    ("%%lm --python\nexec('import lmnb')", True),  # (code it cannot read, in the body)
    # (the line read as the magic reads it, shlex: a quoted --python makes the body Python too)
    ("%%lm \"--python\"\nglobal lmnb\nlmnb = 1\ns += 'x'", True),
    ("%%lm --out s2 '--python'\nimport lmnb\ns += 'x'", True),
    ("%%lm --python 'x\nlmnb = 1\ns += 'x'", True),  # (an unclosed quote: read by its spaces)
    ("get_ipython().run_cell_magic('lm', '--python', body)", True),  # (a body computed: unreadable)
    ("get_ipython().run_cell_magic('lm', options, 'x')", True),
    ("%%lm --python\nlmnb.gen('x')", False), ("%%lm --python\ns += 'lmnb = 1'", False),
    ("%%lm\nlmnb = {gen x}", False),  # (a template: its text binds nothing)
    ("%%lm --python\nlmnb = (", False),  # (no Python: the magic refuses it, nothing runs)
    ("%%capture\nlmnb = 1", False),  # (another cell magic's Python: read when IPython runs it, as a cell)
])
def test_the_lmnb_name_watch_reads_the_body_of_a_python_cell(ip, code, taken):
    import ast

    from lmnb_kernel.lmnb_name import takes_the_name

    assert takes_the_name(ast.parse(ip.transform_cell(code))) is taken


def test_reset_puts_the_lmnb_name_back_as_ipython_puts_back_its_own(ip):
    # %reset -f removed lmnb until the next %load_ext: a Python cell's lmnb.gen(...) was a NameError
    # (IPython's own names, get_ipython, In, come back at once); a %%lm --python cell put it back alone
    extensions = ip.extension_manager
    try:
        result, _ = run(ip, "%reset -f")
        assert result.success and ip.user_ns["lmnb"] is lmnb and "lmnb" not in ip.run_line_magic("who_ls", "")
        result, _ = run(ip, "lmnb_reset_name = lmnb.__name__")
        assert result.success and ip.user_ns["lmnb_reset_name"] == "lmnb"
        result, _ = run(ip, "get_ipython().reset()")
        assert result.success and ip.user_ns["lmnb"] is lmnb
        # the extension's again, even where the user had bound it before the reset: taken at unload
        run(ip, "import lmnb")
        run(ip, "%reset -f")
        extensions.unload_extension("lmnb_kernel")
        assert "lmnb" not in ip.user_ns
        extensions.load_extension("lmnb_kernel")
        # a name the cell binds after its reset is the user's: kept
        result, _ = run(ip, "%reset -f\nlmnb = 'mine'")
        assert result.success and ip.user_ns["lmnb"] == "mine"
        run(ip, "import lmnb\n%reset -f\nimport lmnb")
        extensions.unload_extension("lmnb_kernel")
        assert ip.user_ns["lmnb"] is lmnb
    finally:
        if "lmnb_kernel" not in extensions.loaded:
            extensions.load_extension("lmnb_kernel")
        ip.user_ns["lmnb"] = lmnb


@pytest.mark.parametrize("code, unseen", [
    ("%run -i s.py", True), ("%run s.py", True), ("exec('import lmnb')", True), ("eval('1')", True),
    ("globals()['lmnb'] = 1", True), ("vars().update(lmnb=1)", True), ("get_ipython().push({'x': 1})", True),
    ("get_ipython().user_ns['lmnb'] = 1", True), ("%xdel lmnb", True), ("%reset_selective -f lm", True),
    ("%store -r", True),
    ("%reset -f", False), ("%who", False), ("%time x = 1", False), ("lmnb.gen('x')", False), ("x = run", False),
])
def test_the_lmnb_name_watch_sees_code_that_may_set_names_it_cannot_read(ip, code, unseen):
    import ast

    from lmnb_kernel.lmnb_name import takes_the_name

    # (none of these binds the name itself: what takes it is the code it cannot read)
    assert takes_the_name(ast.parse(ip.transform_cell(code))) is unseen


@pytest.mark.parametrize("code, bound", [
    ("import lmnb", True), ("import lmnb.api", True), ("import numpy as lmnb", True),
    ("from lmnb import gen as lmnb", True), ("lmnb = 1", True), ("lmnb, x = 1, 2", True),
    ("for lmnb in []: pass", True), ("with open('f') as lmnb: pass", True), ("(lmnb := 1)", True),
    ("del lmnb", True), ("def lmnb(): pass", True), ("class lmnb: pass", True),
    ("try: pass\nexcept E as lmnb: pass", True), ("match x:\n    case {**lmnb}: pass", True),
    ("def f():\n    global lmnb\n    lmnb = 1", True),
    ("lmnb.gen('x')", False), ("from lmnb import gen", False), ("import lmnb_kernel", False),
    ("from lmnb import *", False), ("x = lmnb", False), ("lmnb.x = 1", False), ("lmnbx = 1", False),
])
def test_the_lmnb_name_watch_sees_every_way_code_binds_the_name(code, bound):
    import ast

    from lmnb_kernel.lmnb_name import takes_the_name

    # (none of these runs code the watch cannot read: what takes the name is the binding)
    assert takes_the_name(ast.parse(code)) is bound


def test_a_comment_above_the_lm_line_is_named_and_code_above_it_is_left_to_ipython(ip):
    # IPython read the cell as Python ("%lm" line magic, then the prompt) and said only
    # "invalid syntax. Perhaps you forgot a comma?" for the prompt's text
    # (a name no other test of this shell binds: `c` was, so the check failed when the whole file ran)
    # (no line number: IPython drops leading blank lines before the transform sees the cell)
    result, out = run(ip, "\n# ask about the capital\n\n%%lm --temperature 0\nThe capital of France is {gen late_c}")
    assert isinstance(result.error_before_exec, UsageError) and "late_c" not in ip.user_ns
    assert out.stderr.strip() == ("UsageError: %%lm below a comment: a cell magic works only on a cell's "
                                  "first line; move it up, or split the cell there; a comment above the %%lm line "
                                  "makes IPython read the cell as Python")
    # %%time over the %%lm line got "invalid syntax" for the prompt as well
    result, out = run(ip, "# timed\n%%time\n%%lm --temperature 0\nThe capital of France is {gen timed_c}")
    assert isinstance(result.error_before_exec, UsageError) and "timed_c" not in ip.user_ns
    assert out.stderr.strip() == ("UsageError: %%time below a comment: a cell magic works only on a cell's "
                                  "first line; move it up, or split the cell there; a comment above the %%time line "
                                  "makes IPython read the cell as Python")
    # with code above, "%%lm" may be text in a string: IPython's reading stands
    result, _ = run(ip, 'lm_text = """\n%%lm --static\n"""')
    assert result.success and ip.user_ns["lm_text"] == "\n%%lm --static\n"
    result, _ = run(ip, "# only comments\n# here")
    assert result.success
    # a console's Enter (the completeness check) runs cleanup transforms expecting only SyntaxError
    assert ip.input_transformer_manager.check_complete("# c\n%%lm\nhi\n\n")[0] in ("complete", "invalid")
    ip.extension_manager.unload_extension("lmnb_kernel")
    try:  # unloaded, IPython's own reading is back
        result, _ = run(ip, "# c\n%%lm\nthe capital of France is")
        assert isinstance(result.error_before_exec, SyntaxError)
    finally:
        ip.extension_manager.load_extension("lmnb_kernel")


def test_in_a_kernel_the_extension_makes_the_session_surrogate_safe_until_it_is_unloaded(ip, monkeypatch):
    # a plain ipykernel's session (shell.kernel.session) kept its packer, which raised on a lone
    # surrogate; the extension now wraps it, and gives the kernel its own packer back at unload
    from types import SimpleNamespace

    from lmnb_kernel.surrogates import surrogate_safe

    def pack(obj):
        return obj.encode("utf-8")

    session = SimpleNamespace(pack=pack)
    monkeypatch.setattr(ip, "kernel", SimpleNamespace(session=session), raising=False)
    ip.extension_manager.unload_extension("lmnb_kernel")
    try:
        ip.extension_manager.load_extension("lmnb_kernel")
        assert session.pack("a\ud800b") == "a\ufffdb".encode("utf-8")
        ip.extension_manager.unload_extension("lmnb_kernel")
        assert session.pack is pack
        session.pack = safe = surrogate_safe(pack)  # the lmnb kernel's session: wrapped for good
        ip.extension_manager.load_extension("lmnb_kernel")
        assert session.pack is safe
        ip.extension_manager.unload_extension("lmnb_kernel")
        assert session.pack is safe
    finally:
        if "lmnb_kernel" not in ip.extension_manager.loaded:
            ip.extension_manager.load_extension("lmnb_kernel")


def test_the_first_cell_shows_its_view_while_the_model_loads(ip, tiny_llama, monkeypatch):
    # the first cell of a kernel showed nothing while its model loaded (seconds, minutes for a big one)
    shown_while_loading = []
    start_engine = Session._start_engine

    def start_and_look(self, config, command=""):
        shown_while_loading.append(ip.display_pub.outputs[-1]["data"]["text/plain"])  # (capture_output's)
        return start_engine(self, config, command)

    monkeypatch.setattr(Session, "_start_engine", start_and_look)
    monkeypatch.setenv("LMNB_MODEL", str(tiny_llama))
    with separate_session(ip):
        result, out = run(ip, "%%lm --static --temperature 0\nQ:{gen a max_tokens=2}")
        assert result.success
        [loading] = shown_while_loading
        assert loading.startswith("[lmnb cell [") and ": loading, " in loading.splitlines()[0]
        final = [o for o in out.outputs if "view" in (o.metadata or {}).get("lmnb", {})][-1]
        assert final.metadata["lmnb"]["status"] == "done" and ip.user_ns["a"] == greedy(ip, "Q:", 2)
        result, out = run(ip, "%%lm --static --temperature 0\nQ:{gen a max_tokens=2}")
        assert len(shown_while_loading) == 1  # loaded once
        first = out.outputs[0].data["text/plain"].splitlines()[0]
        assert ": running, " in first or ": done, " in first
    monkeypatch.setenv("LMNB_MODEL", "/no/such/checkpoint")
    with separate_session(ip):  # a model that cannot load: the view says so, then the cell's error
        result, out = run(ip, "%%lm --static\nQ:{gen a max_tokens=2}")
        assert not result.success and "could not load /no/such/checkpoint" in out.stdout + out.stderr
        final = [o for o in out.outputs if "view" in (o.metadata or {}).get("lmnb", {})][-1]
        assert final.metadata["lmnb"]["status"] == "error"


def test_a_gen_with_n_samples_stopped_by_ctrl_c_still_counts_its_requests(ip, tiny_llama, monkeypatch):
    # gen(n=2) is not streamed: stopped by Ctrl-C, its aborted requests came back as one unnamed var
    # event with a list of metas and no text before it, which the view dropped (prompt 0, cached 0)
    from transformers import AutoTokenizer

    from lmnb_kernel.widgets import RunView

    engine = get_session().backend().engine
    tick = RunView.tick

    def ctrl_c_once_both_samples_run(self):
        if engine.cache_stats()["running_requests"] == 2 and not getattr(self, "_pressed", False):
            self._pressed = True
            raise KeyboardInterrupt
        tick(self)

    monkeypatch.setattr(RunView, "tick", ctrl_c_once_both_samples_run)
    before = engine.cache_stats()
    result, out = run(ip, "%%lm --static --temperature 0\nCount to ten:{gen a n=2 max_tokens=500 ignore_eos=True}")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    after = engine.cache_stats()
    [meta] = summaries(out)
    prompt = len(AutoTokenizer.from_pretrained(str(tiny_llama))("Count to ten:")["input_ids"])
    assert meta["status"] == "interrupted"
    assert meta["tokens"]["prompt_tokens"] == 2 * prompt == after["prompt_tokens"] - before["prompt_tokens"]
    assert meta["tokens"]["cached_tokens"] == after["cached_tokens"] - before["cached_tokens"]
    assert meta["tokens"]["completion_tokens"] > 0


def test_a_second_ctrl_c_while_a_cell_aborts_its_requests_still_aborts_them_all(ip, monkeypatch):
    """A second Ctrl-C while the first one's clean-up sent the aborts (a double press on the stop
    button) cut it short: the other fork branch's request generated on for no one, and the cell
    ended without its summary. Now every request is sent its abort and the cell ends as after one
    Ctrl-C. The first Ctrl-C comes once both branches stream (raised in the view's on_delta, where
    the pump takes their text); the second is sent from inside the first abort."""
    import signal

    from lmnb_kernel.widgets import RunView

    backend = get_session().backend()
    on_delta, abort = RunView.on_delta, backend.abort
    aborted = []

    def ctrl_c_once_both_branches_stream(self, lane, text, **kw):
        on_delta(self, lane, text, **kw)
        streaming = [ln for ln in self.model.lanes.values() if ln.id != "main" and ln.segments]
        if len(streaming) == 2 and not getattr(self, "_pressed", False):
            self._pressed = True
            raise KeyboardInterrupt

    def pressed_again(rid):
        if not pressed:
            pressed.append(rid)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        abort(rid)
        aborted.append(rid)

    pressed = []
    monkeypatch.setattr(RunView, "on_delta", ctrl_c_once_both_branches_stream)
    monkeypatch.setattr(backend, "abort", pressed_again)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result, out = run(ip, "%%lm --static --temperature 0\nStory:{fork 2}{gen s max_tokens=500 ignore_eos=True}{join}")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert result.error_in_exec._render_traceback_() == [
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: the cell was stopped; its output so far and the variables it finished "
        "are kept"]
    assert len(pressed) == 1 and len(set(aborted)) == 2  # both branches' requests
    [meta] = summaries(out)
    assert meta["status"] == "interrupted"


def test_the_stop_button_ends_a_fork_cell_as_ctrl_c_does_and_counts_every_branch_request(ip, monkeypatch):
    # The Stop button (JupyterLab >= 4.4 delivers its click while the cell runs): the cell ended "ok",
    # so a Run-All ran the next cells against the variables it never set, where Ctrl-C ends it with a
    # KeyboardInterrupt that stops the Run-All; and its summary said "prompt 7 + unknown (4 gens
    # stopped before the backend reported their prompt)" where Ctrl-C counted every branch's prompt.
    from lmnb_kernel.widgets import RunView

    engine = get_session().backend().engine
    on_delta = RunView.on_delta

    def stop_once_every_branch_streams(self, lane, text, **kw):
        on_delta(self, lane, text, **kw)
        streaming = [ln for ln in self.model.lanes.values() if ln.id != "main" and ln.segments]
        if len(streaming) == 3:
            self._request_stop()  # what the widget's comm handler calls on {"action": "stop"}

    monkeypatch.setattr(RunView, "on_delta", stop_once_every_branch_streams)
    ip.user_ns.pop("s", None)
    before = engine.cache_stats()
    result, out = run(ip, "%%lm --static --temperature 0 --out st\n"
                          "Story:{fork 3}{gen s max_tokens=500 ignore_eos=True}{join}")
    after = engine.cache_stats()
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert result.error_in_exec._render_traceback_() == [
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: the cell was stopped by its Stop button; its output so far and the "
        "variables it finished are kept"]
    [meta] = summaries(out)
    assert meta["status"] == "interrupted" and meta["captured"] == []
    # every request the engine ran (the fork's prefill of "Story:", the 3 branches'), counted as the engine did
    assert meta["tokens"]["prompt_tokens"] == after["prompt_tokens"] - before["prompt_tokens"]
    assert meta["tokens"]["cached_tokens"] == after["cached_tokens"] - before["cached_tokens"]
    assert "unreported_prompts" not in meta["tokens"]
    error = ip.user_ns["st"].error()  # the partial text is kept, as after Ctrl-C
    assert isinstance(error, lmnb.ProgramAborted) and len(error.branches) == 3
    assert all(0 < len(b.partial_text) for b in error.branches)
    assert "s" not in ip.user_ns


def test_ctrl_c_during_a_load_still_shows_what_loaded_and_the_states_it_dropped(ip, monkeypatch):
    # the interrupt, held until the engine had loaded, replaced the table naming the dropped states
    import os
    import signal

    from lmnb_kernel import session as session_module

    class Backend:
        engine = None

        def model_info(self):
            return {"model_path": "/models/x", "num_layers": 2}

        def shutdown(self):
            pass

    def load_with_an_interrupt(self, config):
        with session_module.interrupt_after():
            os.kill(os.getpid(), signal.SIGINT)  # the kernel's interrupt, arriving mid-load
            os.kill(os.getpid(), signal.SIGINT)  # pressed again: said once
            self.close()
            self.config, self._backend, self.remote = config, Backend(), None

    monkeypatch.setattr(Session, "load", load_with_an_interrupt)
    monkeypatch.setattr(Session, "engine", lambda self, what: self._backend)
    magics = ip.magics_manager.registry["LMMagics"]
    with separate_session(ip) as session:
        session.states["chat"] = object()
        with capture_output() as out, pytest.raises(KeyboardInterrupt) as e:
            magics.run_command("load /models/x")
        assert "once the model had loaded" in e.value._render_traceback_()[0]
        assert out.stderr == "lmnb: the model is loading; the interrupt takes effect once it is loaded\n"
        shown = out.outputs[0].data["text/plain"]
        assert "named states dropped: chat" in shown and "/models/x" in shown
        assert session.states == {}


def test_a_load_stopped_once_the_new_engine_loaded_forgets_the_old_engines_cells_and_tree(ip, tiny_llama,
                                                                                          monkeypatch):
    """A Ctrl-C during %lm load is held until the engine has loaded, then raised in one line; that
    line was raised before run_command forgot the old engine's recent cells and its tree view, so the
    next cell redrew the old view over the new engine, with paths labelled by the old engine's cells."""
    import os
    import signal

    magics = ip._lmnb_magics
    monkeypatch.setattr(magics, "recent_cells", {})
    monkeypatch.setattr(magics, "tree_view", None)
    real_engine = lmnb.Engine

    def engine_with_an_interrupt(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the kernel's interrupt, arriving mid-load
        return real_engine(*args, **kwargs)

    with separate_session(ip) as session:
        assert run(ip, f"%lm load {tiny_llama} --max-total-tokens 4096")[0].success
        assert run(ip, "%%lm --static --quiet\nhi{gen k max_tokens=1}")[0].success
        assert list(magics.recent_cells) and run(ip, "%lm tree")[0].success and magics.tree_view is not None
        old = session.made_backend
        monkeypatch.setattr(lmnb, "Engine", engine_with_an_interrupt)
        result, out = run(ip, f"%lm load {tiny_llama} --max-total-tokens 4096")
        monkeypatch.setattr(lmnb, "Engine", real_engine)
        assert isinstance(result.error_in_exec, KeyboardInterrupt) and "once the model had loaded" in out.stdout
        assert session.made_backend is not old  # the new engine is in place
        assert magics.recent_cells == {} and magics.tree_view is None
        _, out = run(ip, "%%lm --static --quiet\nhi{gen k max_tokens=1}")
        assert out.outputs == []  # no tree of the old engine redrawn


@pytest.mark.parametrize("where, said", [
    ("Session.load", "%lm load was stopped before it loaded; cells still run on SGLang-protocol server http://127.0.0.1:1"),
    ("_show_loaded", "%lm load was stopped once it had loaded; cells run on the in-process engine on {ckpt} now"),
    ("_show_connected", "%lm connect was stopped once it had connected; cells run on SGLang-protocol server "
                        "http://127.0.0.1:2 now")])
def test_a_ctrl_c_outside_the_hold_of_load_or_connect_says_where_cells_run(ip, tiny_llama, monkeypatch, where, said):
    """A Ctrl-C that %lm load does not hold (before its engine starts, or as it shows what it loaded)
    said "%lm load was stopped" alone; one as %lm connect showed the connected line said "before it
    connected; cells still run on" the new server, though it had connected."""
    from lmnb_kernel import commands

    class Server:
        def __init__(self, url, **kwargs):
            pass

        def shutdown(self):
            pass

    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lmnb, "RuntimeEndpoint", Server)
    with separate_session(ip):
        assert run(ip, "%lm connect http://127.0.0.1:1")[0].success
        monkeypatch.setattr(*(Session, "load") if where == "Session.load" else (commands, where), pressed)
        line = f"%lm load {tiny_llama}" if "load" in where.lower() else "%lm connect http://127.0.0.1:2"
        result, out = run(ip, line)
        assert isinstance(result.error_in_exec, KeyboardInterrupt)
        assert result.error_in_exec._render_traceback_() == [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: "
                                                             f"{said.format(ckpt=tiny_llama)}"]


def test_ctrl_c_while_the_view_is_drawn_keeps_the_results_and_is_one_line(ip, monkeypatch):
    # the view was drawn before the results were pushed: a Ctrl-C there lost the cell's variables
    # and showed the widget's frames
    magics = ip.magics_manager.registry["LMMagics"]
    make_view = magics.make_view

    def view_stopped_while_drawn(args, count):
        view = make_view(args, count)

        def finish(*a, **k):
            raise KeyboardInterrupt

        view.finish = finish
        return view

    ip.user_ns.pop("drawn", None)
    monkeypatch.setattr(magics, "make_view", view_stopped_while_drawn)
    with pytest.raises(KeyboardInterrupt) as e:
        magics.run_program("--static --temperature 0 --state drawing", "Q: hi\nA:{gen drawn max_tokens=3}\n")
    assert e.value._render_traceback_() == [
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: the cell was stopped while its view was drawn; its results are kept"]
    assert ip.user_ns["drawn"] == greedy(ip, "Q: hi\nA:", 3)
    assert get_session().states["drawing"].state.text() == "Q: hi\nA:" + ip.user_ns["drawn"]


def test_ctrl_c_as_the_cell_starts_stops_its_program_in_one_line(ip, monkeypatch):
    # a Ctrl-C landing in start_run, after the body began, left its program generating for no one
    from lmnb_kernel import magics as magics_module

    started = []

    def start_then_interrupted(*args, **kwargs):
        started.append(real_start(*args, **kwargs))
        raise KeyboardInterrupt

    real_start = magics_module.start_run
    monkeypatch.setattr(magics_module, "start_run", start_then_interrupted)
    magics = ip.magics_manager.registry["LMMagics"]
    with pytest.raises(KeyboardInterrupt) as e:
        magics.run_program("--static --state starting", "Q: hi\nA:{gen never max_tokens=200}\n")
    assert e.value._render_traceback_() == [
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: the cell was stopped as it started; the named state is as it was"]
    assert isinstance(started[0].error(), lmnb.ProgramAborted)
    assert "starting" not in get_session().states


class UsageAtTheEnd(Recorder):
    """Streams as an OpenAI-compatible API does: token counts come only with the stream's last
    chunk; after Ctrl-C (``abort``) the stream goes on until it is dropped, and never reports them."""

    def __init__(self):
        super().__init__()
        self.aborted = threading.Event()

    def generate_stream(self, prompt, params, rid):
        yield "Hel", {"id": rid}
        self.aborted.wait(30)
        yield "lo", {"id": rid}

    def abort(self, rid):
        self.aborted.set()


def test_a_gen_stopped_before_the_backend_reported_its_usage_shows_prompt_unknown_not_0(ip, monkeypatch):
    """The summary said "prompt 0, cached 0 (n/a hit)" for an interrupted cell over an OpenAI
    backend, whose usage comes only at the stream's end."""
    from lmnb_kernel.widgets import RunView

    tick = RunView.tick

    def ctrl_c_once_text_came(self):
        if self.model.lane("main").completion_tokens and not getattr(self, "_pressed", False):
            self._pressed = True
            raise KeyboardInterrupt
        tick(self)

    monkeypatch.setattr(RunView, "tick", ctrl_c_once_text_came)
    magics = ip._lmnb_magics
    real, fake = magics.session, Session()
    fake.connect(UsageAtTheEnd(), "a server")
    magics.session = fake
    try:
        result, out = run(ip, "%%lm --static\nSay:{gen a max_tokens=50}")
    finally:
        magics.session = real
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    [meta] = summaries(out)
    assert meta["status"] == "interrupted"
    assert meta["tokens"] == {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 1, "unreported_prompts": 1}
    assert out.outputs[-1].data["text/plain"].endswith(
        "tokens: prompt unknown, cached unknown (a gen was stopped before the backend reported its prompt), "
        "completion 1")
    view = [o.data["text/plain"] for o in out.outputs if "view" in (o.metadata or {}).get("lmnb", {})][-1]
    assert view.splitlines()[1].startswith("KV cache: this cell 0/0 prompt tokens cached (–) + unknown (1 gen stopped "
                                           "before the backend reported its prompt); session ")


def test_line_magic_help_also_lists_the_cell_options(ip):
    """`%%lm --help` alone in a cell is refused by IPython (an empty cell body), which points to the
    line magic; `%lm --help` listed only the subcommands, so the cell options were shown nowhere."""
    result, out = run(ip, "%lm --help")
    assert result.success
    for words in ("SUBCOMMAND", "Cells: %%lm [options]", "--state NAME", "--append", "--temperature", "--max-tokens",
                  "--seed", "--out VAR", "--quiet", "--static", "--python"):
        assert words in out.stdout, (words, out.stdout)
    result, out = run(ip, "%lm load --help")  # a subcommand's help stays its own
    assert result.success and "--max-total-tokens" in out.stdout and "--temperature" not in out.stdout


def test_help_subcommand_shows_the_help(ip):
    """`%lm help` was "invalid choice: 'help'"; it is `%lm --help`, and `%lm help load` is `%lm load --help`."""
    from lmnb_kernel.magics import _subcommands, line_parser

    result, out = run(ip, "%lm help")
    assert result.success and "SUBCOMMAND" in out.stdout and "Cells: %%lm [options]" in out.stdout, out.stderr
    assert out.stdout == run(ip, "%lm --help")[1].stdout
    # (IPython's reST usage, "::\n\n  %lm ...", was printed as it is in a docstring)
    assert out.stdout.startswith("usage: %lm SUBCOMMAND ...\n") and "\nusage: %%lm [--python]" in out.stdout
    assert "::" not in out.stdout
    result, out = run(ip, "%lm help load")
    assert result.success and "--max-total-tokens" in out.stdout and "--temperature" not in out.stdout, out.stderr
    # (the load subcommand's own argparse help, as `%lm load --help` prints it)
    load = _subcommands(line_parser())["load"]
    assert out.stdout == run(ip, "%lm load --help")[1].stdout
    # (argparse's usage, its wrapped lines under the first option, where IPython's reST began "::")
    usage = ("usage: %lm load [--device DEVICE] [--dtype DTYPE]\n"
             "                [--max-total-tokens MAX_TOTAL_TOKENS] [--random-weights]\n"
             "                [model]\n\n"
             "load a model into a new in-process engine now\n")
    assert out.stdout.startswith(usage) and out.stdout.endswith(load.format_help().split("\n\n", 2)[2] + "\n")


def test_help_lists_help_among_the_subcommands(ip):
    """`%lm help` listed load ... unpin, but not help itself."""
    result, out = run(ip, "%lm help")
    listed = [line.split()[0] for line in out.stdout.split("SUBCOMMAND\n", 1)[1].split("\n\n")[0].splitlines()
              if line.startswith("    ") and not line.startswith("     ")]
    assert result.success and listed == ["load", "connect", "stats", "tree", "states", "reset", "flush", "pin",
                                         "unpin", "help"]
    assert "    help      this help; %lm help SUBCOMMAND: a subcommand's options\n" in out.stdout


@pytest.mark.parametrize("line, message", [
    ("%lm HELP", "(did you mean: %lm help?)"), ("%lm Stats", "(did you mean: %lm stats?)"),
    ("%lm STAT", "(did you mean: %lm stats?)"), ("%lm help STATS", "did you mean: %lm help stats? ")])
def test_a_subcommand_in_another_case_gets_did_you_mean(ip, line, message):
    """`%lm HELP` got no "did you mean": difflib matched case-sensitively, so 'HELP' was close to nothing."""
    result, out = run(ip, line)
    assert isinstance(result.error_in_exec, UsageError) and message in str(result.error_in_exec)


@pytest.mark.parametrize("line, hint", [("%lm help stat", "did you mean: %lm help stats? "),
                                        ("%lm stat --help", "did you mean: %lm help stats? "), ("%lm help nosuch", "")])
def test_help_for_a_subcommand_lm_lacks_is_refused_with_did_you_mean(ip, line, hint):
    """`%lm help stat` printed the general help, as if 'stat' were a subcommand."""
    name = line.split()[2] if line.split()[1] == "help" else line.split()[1]
    result, out = run(ip, line)
    assert isinstance(result.error_in_exec, UsageError) and "SUBCOMMAND" not in out.stdout
    assert str(result.error_in_exec) == f"%lm has no subcommand {name!r}; {hint}%lm help lists them"


def test_a_failing_helper_called_from_a_cell_shows_its_own_frames_then_the_cell_error(ip):
    # the cell error was one line, so a function defined in another cell and called from a hole or
    # an --python body failed with no hint of where inside it (found by a review helper)
    run(ip, "def halve_to_nothing(x):\n    y = x * 2\n    return y / 0\n")
    for cell, where in (("%%lm --static\nQ: {halve_to_nothing(3)}", "line 2, col 5: {halve_to_nothing(3)} failed"),
                        ("%%lm --static --python\ns += str(halve_to_nothing(3))", "line 2: ZeroDivisionError")):
        result, out = run(ip, cell)
        assert not result.success
        frames, _, error = out.stdout.rpartition("CellError")
        assert "in halve_to_nothing(x)" in frames and "----> 3     return y / 0" in frames
        assert "ZeroDivisionError: division by zero" in frames
        assert where in error
    result, out = run(ip, "%%lm --static\nQ: {1/0}")  # the cell's own code raised: its position says it all
    assert not result.success and "Traceback" not in out.stdout and "{1/0} failed: ZeroDivisionError" in out.stdout
    # and lmnb's own check of a gen's arguments (its frames are lmnb's): the message says it all
    result, out = run(ip, "%%lm --static --python\ns += lmnb.gen('x', regex='(')")
    assert not result.success and "Traceback" not in out.stdout and "is not a valid regular expression" in out.stdout
    # also where the check runs in the __init__ a dataclass generated (GenParams'), a frame of no file:
    # it showed as a traceback of lmnb/api.py and lmnb/ir.py above the cell error
    for option, said in (("max_tokens='eight'", "max_tokens='eight' is invalid: must be an integer"),
                         ("stop=5", "stop=5 is invalid: give a string or a list of strings")):
        result, out = run(ip, f"%%lm --static --python\ns += lmnb.gen('x', {option})")
        assert not result.success and "Traceback" not in out.stdout and "lmnb/ir.py" not in out.stdout
        assert out.stdout.endswith(f"CellError\x1b[0m: line 2: TypeError: {said}\n")
    # unless the cell's own handler passed that error to a helper that raised another: its frames show
    run(ip, "def rewrap(e):\n    raise RuntimeError('my helper rejects it') from e\n")
    result, out = run(ip, "%%lm --static --python\ntry:\n    s += lmnb.gen('x', regex='(')\nexcept ValueError as e:\n"
                          "    rewrap(e)")
    frames = out.stdout.rpartition("CellError")[0]
    assert not result.success and "in rewrap(e)" in frames and "RuntimeError: my helper rejects it" in frames


def test_a_python_body_primitive_that_fails_as_it_runs_is_told_at_the_line_that_added_it(ip):
    # "CellError: ProgramError: Gen('x') failed: ..." named no line: the body had moved on when the
    # backend refused the gen, so no frame of the error was the body's; in a long body, with
    # several gens of one name, which one failed was left to guess
    body = ("%%lm --static --python\n"
            "s += 'Hi'\n"
            "s += lmnb.gen('x', max_tokens=2)\n"
            "\n"
            "s += lmnb.gen('x', max_tokens=10**6)\n"
            "s += lmnb.gen('y', max_tokens=2)\n")
    result, out = run(ip, body)
    assert not result.success and "Traceback" not in out.stdout
    error = out.stdout.rpartition("CellError\x1b[0m: ")[2]
    assert error.startswith("line 5: ProgramError: Gen('x') failed: ValueError: prompt of ") and "context length" in error


def test_an_lm_function_that_raises_shows_its_own_line_without_lmnb_frames(ip):
    # five frames of lmnb's run machinery (api.py, interpreter.py) stood between the call and the
    # program's own raise, from a plain cell and from a --python body alike
    run(ip, "import lmnb\n@lmnb.function\ndef rejects(s, q):\n    s += q\n    raise ValueError('no good: ' + q)\n")
    for cell in ("rejects.run(q='yo')", "rejects(q='yo')", "%%lm --static --python\nst = rejects.run(q='yo')"):
        result, out = run(ip, cell)
        assert not result.success
        assert "----> 5     raise ValueError('no good: ' + q)" in out.stdout and "ValueError: no good: yo" in out.stdout
        assert "lmnb/api.py" not in out.stdout and "lmnb/interpreter.py" not in out.stdout, out.stdout


def test_a_gen_whose_output_the_class_refuses_still_counts_its_request(ip):
    # the request ran to its end, but its counts never reached the view: the summary said "prompt
    # unknown (a gen was stopped before the backend reported its prompt)"
    run(ip, "from pydantic import BaseModel, field_validator\n"
            "class Flag(BaseModel):\n    ok: bool\n"
            "class Refused(Flag):\n    @field_validator('ok')\n    @classmethod\n"
            "    def never(cls, v):\n        raise ValueError('never valid')\n")
    body = "\nFlag as JSON:{gen f json_schema=%s max_tokens=30}"
    result, accepted = run(ip, "%%lm --static --temperature 0" + body % "Flag")
    assert result.success
    result, refused = run(ip, "%%lm --static --temperature 0" + body % "Refused")  # the same output: greedy
    assert not result.success and "field 'ok': Value error, never valid" in refused.stdout
    [ok], [failed] = summaries(accepted), summaries(refused)
    assert failed["status"] == "error" and "unreported_prompts" not in failed["tokens"]
    for key in ("prompt_tokens", "completion_tokens"):
        assert failed["tokens"][key] == ok["tokens"][key] > 0


def test_a_helper_that_wraps_its_error_shows_its_frames_and_the_cause(ip):
    # the innermost cause (int's ValueError) was never raised through the cell's code, so nothing
    # was shown (found by a review helper)
    run(ip, "def parse_or_explain(x):\n    try:\n        return int(x)\n    except ValueError as e:\n"
            "        raise RuntimeError('not a number') from e\n")
    result, out = run(ip, "%%lm --static\nQ: {parse_or_explain('x')}")
    frames, _, error = out.stdout.rpartition("CellError")
    assert not result.success and "{parse_or_explain('x')} failed: RuntimeError: not a number" in error
    assert "ValueError: invalid literal for int()" in frames and "in parse_or_explain(x)" in frames
    assert "----> 5     raise RuntimeError('not a number') from e" in frames


def test_a_cell_option_given_twice_is_refused_before_anything_runs(ip):
    # "%%lm --temperature 0 --temperature 1" sampled at 1, silently (found by a review helper)
    result, _ = run(ip, "%%lm --static --temperature 0 --temperature 1\nhi{gen never_set max_tokens=1}")
    assert type(result.error_in_exec).__name__ == "UsageError"
    assert "--temperature is given twice; give it once" in str(result.error_in_exec)
    assert "never_set" not in ip.user_ns


def test_a_cell_flag_given_twice_is_refused_before_anything_runs(ip):
    # argparse's store_true took "--quiet --quiet" as one --quiet, where a repeated option is refused
    result, out = run(ip, "%%lm --quiet --static --quiet\nhi{gen never_set max_tokens=1}")
    assert type(result.error_in_exec).__name__ == "UsageError"
    assert "--quiet is given twice; give it once" in str(result.error_in_exec)
    assert "never_set" not in ip.user_ns


def run_in_cell(ip, code: str, cell_id: str | None):
    """``run`` as a notebook runs a cell: with its Jupyter cell id (None: a console, which sends
    none) and an execution count of its own."""
    with capture_output() as out:
        result = ip.run_cell(code, store_history=True, cell_id=cell_id)
    assert result.success, out.stdout + out.stderr
    return out.outputs[-1].data["text/plain"].splitlines()[-1]  # the summary's last line


def test_rerunning_the_cell_that_extended_a_state_last_replaces_its_turn(ip):
    """Re-running a --state cell (edit it, run it again) appended its prompt to the state again, so
    the state kept every version of the edited cell's turn."""
    replaced = "re-run: replaced this cell's earlier turn in state 'chat' (--append adds another instead)"
    kept = ("re-run: state 'chat' still holds this cell's earlier turn, as later cells extended it; to start "
            "over, %lm reset chat and re-run its cells in order")
    first_a, a = "%%lm --static --state chat\nQ1:{gen a}", "%%lm --static --state chat\nQ1 edited:{gen a}"
    b, b_edited = "%%lm --static --state chat\n\nQ2:{gen b}", "%%lm --static --state chat\n\nQ2 edited:{gen b}"
    with recording(ip) as backend:
        session = ip._lmnb_magics.session

        def text() -> str:
            return session.states["chat"].state.text()

        assert run_in_cell(ip, first_a, "A").endswith("· state 'chat'")
        run_in_cell(ip, a, "A")  # the cell that created the state: re-run, it creates it afresh
        assert text() == "Q1 edited:ok" and backend.calls[-1][0] == "Q1 edited:"
        [n] = session.states["chat"].cells
        run_in_cell(ip, b, "B")
        assert run_in_cell(ip, b_edited, "B") == replaced
        assert backend.calls[-1][0] == "Q1 edited:ok\nQ2 edited:"  # from the state before B's first run
        assert text() == "Q1 edited:ok\nQ2 edited:ok" and session.states["chat"].cells == [n, n + 2]
        assert run_in_cell(ip, a, "A") == kept  # B extended it after A: rewinding would drop B's turn
        assert text() == "Q1 edited:ok\nQ2 edited:okQ1 edited:ok"
        assert run_in_cell(ip, a, "A") == replaced  # now A is the last: its re-run is idempotent
        assert text() == "Q1 edited:ok\nQ2 edited:okQ1 edited:ok"
        # a failed re-run leaves the state, and which cell extended it last, as they were
        failed = ip.run_cell("%%lm --static --state chat\n\nbroken:{gen a}{1 / 0}", store_history=True, cell_id="A")
        assert not failed.success and text() == "Q1 edited:ok\nQ2 edited:okQ1 edited:ok"
        assert run_in_cell(ip, a, "A") == replaced and text() == "Q1 edited:ok\nQ2 edited:okQ1 edited:ok"
        # --append: a chat loop re-runs one cell to go on; without a cell id (a console) each run adds too
        for cell_id, loop in [("L", "%%lm --static --state chat --append\n\nMore:{gen m}"),
                              (None, "%%lm --static --state chat\n\nMore:{gen m}")]:
            run(ip, "%lm reset chat")
            for _ in range(2):
                assert run_in_cell(ip, loop, cell_id).endswith("· state 'chat'")
            assert text() == "\nMore:ok\nMore:ok"
        run_in_cell(ip, b, "B")
        run(ip, "%lm reset chat")  # the reset forgets which cell extended it last too
        assert run_in_cell(ip, b_edited, "B").endswith("· state 'chat'") and text() == "\nQ2 edited:ok"


def test_a_rerun_through_python_code_or_a_cell_magic_above_lm(ip):
    """Only the %%lm the cell holds takes the cell's id: a Python loop that runs %%lm cells adds a turn
    each time, and a %%lm below %%capture is its cell's."""
    with recording(ip):
        session = ip._lmnb_magics.session
        loop = "for q in ['x', 'y']:\n    get_ipython().run_cell_magic('lm', '--static --state chat', '\\n{q}:{gen a}')"
        run(ip, "%lm reset chat")
        for _ in range(2):
            assert ip.run_cell(loop, store_history=True, cell_id="P").success
        assert session.states["chat"].state.text() == "\nx:ok\ny:ok\nx:ok\ny:ok"
        captured = "%%capture c\n%%lm --static --state chat\n\nQ:{gen a}"
        for _ in range(2):
            assert ip.run_cell(captured, store_history=True, cell_id="C").success
        assert session.states["chat"].state.text() == "\nx:ok\ny:ok\nx:ok\ny:ok\nQ:ok"
        assert ip.user_ns["c"].outputs[-1].data["text/plain"].splitlines()[-1] == (
            "re-run: replaced this cell's earlier turn in state 'chat' (--append adds another instead)")


def test_a_setting_given_to_the_sessions_backend_stand_in_is_the_backends():
    """lmnb.get_default_backend().chat_template = lmnb.get_chat_template("chatml") in the kernel landed
    on the stand-in (SessionBackend): reads showed chatml, runs, which use the session's backend,
    kept the model's own template. The setting is the backend's now, as where no kernel stands in."""

    class Backend:
        chat_template = None

    class FakeSession:
        backend = staticmethod(lambda: held)

    held = Backend()
    stand_in = SessionBackend(FakeSession())
    template = lmnb.get_chat_template("chatml")
    stand_in.chat_template = template
    assert held.chat_template is template and stand_in.chat_template is template
    assert "chat_template" not in vars(stand_in)


@pytest.mark.parametrize("option, env, live, rate", [
    ("--static", None, False, 5.0), ("", "static", False, 5.0), ("--static", "static", False, 5.0),
    ("", None, True, 20.0), ("", "headless", False, 1.0), ("--static", "headless", False, 1.0)])
def test_a_static_view_updates_at_most_5_times_a_second(ip, monkeypatch, option, env, live, rate):
    # --static drew at the live widget's 20/s though each static update resends the whole view: a
    # {fork 8} cell of 450 tokens sent 140 updates, 31 MB, where RunView documents 5/s
    magics = ip.magics_manager.registry["LMMagics"]
    make_view, views = magics.make_view, []
    monkeypatch.setattr(magics, "make_view", lambda args, count: views.append(make_view(args, count)) or views[-1])
    if env is None:
        monkeypatch.delenv("LMNB_VIEW", raising=False)
    else:
        monkeypatch.setenv("LMNB_VIEW", env)
    # (not under capture_output, where a cell's view is static and shown once, then replaced once:
    # test_capture_above_lm_holds_the_view_and_summary_and_errors_count_the_cells_lines)
    magics.run_program(f"{option} --temperature 0", "Q:{gen rated max_tokens=1}\n")
    assert [(v.live, v.updates, v.max_hz) for v in views] == [(live, True, rate)]


def test_flush_and_tree_before_any_engine_are_notes_not_errors(ip):
    # they raised a CellError (reply status "error"): a Run All beginning with %lm flush stopped there
    magics = ip.magics_manager.registry["LMMagics"]
    with separate_session(ip) as session, capture_output() as out:
        magics.run_command("flush")
        magics.run_command("tree")
        assert not session.started  # neither loads a model to say so
    assert [o.data["text/plain"] for o in out.outputs] == [
        "nothing cached yet: no engine has been started (it starts with the first %%lm cell, or %lm load MODEL)",
        "no radix tree yet: no engine has been started (it starts with the first %%lm cell, or %lm load MODEL)"]


def test_an_image_or_video_the_model_cannot_take_is_named_by_its_hole_as_written(ip, tmp_path):
    """{image img} of a PIL image on a text-only model failed as "Image(<PIL.Image.Image image
    mode=RGB size=8x8 at 0x7F63B49DABD0>) failed: ...": its repr, with a memory address, where a
    hole's own failure names the hole as the cell wrote it ({p + 1} failed)."""
    from PIL import Image

    ip.user_ns["img"] = Image.new("RGB", (8, 8))
    ip.user_ns["clip"] = tmp_path / "clip.mp4"
    for hole in ("{image img}", "{video clip frames=2}"):
        failed, _ = run(ip, f"%%lm --static\nLook:\n{hole}\nWhat is it?{{gen x max_tokens=2}}")
        assert not failed.success
        error = str(failed.error_in_exec)
        assert error.startswith(f"line 3, col 1: {hole} failed: "), error
        assert f"\n    {hole}\n    ^" in error and "0x" not in error, error


def test_a_state_that_writes_its_own_bos_is_pinned_as_the_ids_it_runs_as():
    """On a tokenizer that adds a BOS (the demo model's), a state whose text writes its own "<s>"
    runs as the tokenizer's ids less the added BOS (``Engine.prompt_ids``), but ``%lm pin`` (and
    ``%lm tree``) encoded it with both: the pin held a prefix no request of the state ever uses,
    and its count was one token too many. Worked from the tokenizer here."""
    from types import SimpleNamespace

    session = Session()
    session.load(EngineConfig(device="cpu", max_total_tokens=2048))  # no model: the demo checkpoint
    try:
        engine = session.backend().engine
        text = "<s>Is the sky blue? Answer:"
        encoded = engine.encode(text)
        assert encoded[:2] == [engine.tokenizer.bos_token_id] * 2  # (the case)
        state = SimpleNamespace(text=lambda: text, stream_executor=SimpleNamespace(images_=[]))
        session.keep("bos", state, cell=1)
        assert session.pin("bos") == len(encoded) - 1
        assert engine.match_node(encoded[1:])[1] == len(encoded) - 1  # the ids a request of it runs as
    finally:
        session.close()


def test_a_captured_lm_tree_keeps_one_picture_of_the_tree_as_the_capture_ends(ip):
    """%%capture over %lm tree kept the tree as %lm tree drew it and again as the refresh after the
    captured cell redrew it (update_display_data, kept by the capture as one more output), so
    captured.outputs held every draw and captured.show() replayed them all; and a tree shown by an
    earlier cell put its refresh into the outputs of every later captured cell. Captured, the tree
    is one output, replaced as it is redrawn; a capture it was not shown in gets none of it."""
    from lmnb_kernel.widgets import VIEW_MIME

    run(ip, "%%lm --static --temperature 0\nThe tree{gen tree_a max_tokens=2}")
    result, out = run(ip, "%%capture c\n%lm tree")
    assert result.success and out.outputs == []
    [tree] = ip.user_ns["c"].outputs
    assert not tree.update and tree.metadata == {"lmnb": {"view": "tree"}} and "radix tree" in tree.data["text/plain"]
    # the capture's body ran as a cell of its own, which the tree is redrawn after: a redraw lands
    # in the one output, here as one that tells it (a path evicted since shows as a faded ghost)
    magics = ip.magics_manager.registry["LMMagics"]
    with capture_output() as c:
        ip.run_cell("%lm tree")
        assert "lmnb-evicted" not in c.outputs[0].data["text/html"]
        assert get_session().engine("test").flush_cache()
        magics.refresh_tree()
    [tree] = c.outputs
    assert not tree.update and "lmnb-evicted" in tree.data["text/html"]
    assert tree.data[VIEW_MIME]["nodes"] == magics.tree_view.bundle()[VIEW_MIME]["nodes"]
    result, out = run(ip, "%%capture c\nx = 1")
    assert result.success and out.outputs == [] and ip.user_ns["c"].outputs == []


@pytest.mark.parametrize("where", ["frames", "print"])
def test_a_stop_while_a_cell_error_is_shown_ends_with_its_first_line_and_keeps_the_one_line_errors(ip, where):
    """A Stop (Ctrl-C) that landed while IPython showed a %%lm cell's CellError (formatting the
    frames of the helper the cell called, or printing) raised out of lmnb's handler into IPython's
    guard of it, which printed the KeyboardInterrupt's traceback through IPython's and lmnb's frames
    and the CellError's whole one, and unregistered the handler: every later CellError showed the
    magic's frames. A trace function sends SIGINT as that step starts."""
    import signal
    import sys

    from lmnb_kernel.errors import CellError, show_cell_error

    # (the test shell's _showtraceback is its own, set on the instance)
    step = type(ip.InteractiveTB).structured_traceback if where == "frames" else ip._showtraceback.__func__

    def press(frame, event, arg):
        if event == "call" and frame.f_code is step.__code__:
            sys.settrace(None)
            signal.raise_signal(signal.SIGINT)

    run(ip, "def double_to_nothing(x):\n    y = x * 2\n    return y / 0\n")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sys.settrace(press)
        failed, out = run(ip, "%%lm --static\nQ: {double_to_nothing(3)}")
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGINT, previous)
    try:
        assert not failed.success and isinstance(failed.error_in_exec, CellError)
        first = str(failed.error_in_exec).splitlines()[0]
        assert first == "line 2, col 5: {double_to_nothing(3)} failed: ZeroDivisionError: division by zero"
        assert out.stdout == f"\x1b[0;31mCellError\x1b[0m: {first} (stopped while showing the error)\n"
        assert out.stderr == ""
        assert ip.custom_exceptions == (CellError,)  # later cell errors are still one clear message
        failed, out = run(ip, "%%lm --static\nQ: {1/0}")
        assert not failed.success and "Traceback" not in out.stdout and "{1/0} failed: ZeroDivisionError" in out.stdout
    finally:  # (as it failed, the handler is put back for the module's later tests)
        ip.set_custom_exc((CellError,), show_cell_error)
