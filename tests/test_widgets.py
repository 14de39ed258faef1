"""The live views without a kernel: data model, rendering, frame rate, comm messages, display.

Comm traffic is recorded by swapping ``comm.create_comm`` for a recording comm (the technique of
ipywidgets' own tests, ``ipywidgets/widgets/tests/utils.py``); displays are captured with IPython's
``capture_output``. Expected values are worked out by hand in each test.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import threading
from html.parser import HTMLParser

import comm
import pytest
from helpers_shell import process_shell
from bs4 import BeautifulSoup
from comm.base_comm import BaseComm
from IPython.utils.capture import capture_output

from lmnb_kernel.widgets import SESSION, VIEW_MIME, RunView, Tally, TreeView
from lmnb_kernel.widgets.render_run import render_run_html
from lmnb_kernel.widgets.structured import check_structured

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


class RecordingComm(BaseComm):
    """A comm that keeps every message it would publish: ``(msg_type, data)``."""

    def __init__(self, *args, **kwargs):
        self.sent: list[tuple[str, dict]] = []
        super().__init__(*args, **kwargs)

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        self.sent.append((msg_type, data))


@pytest.fixture
def comms(monkeypatch):
    made: list[RecordingComm] = []

    def create(*args, **kwargs):
        c = RecordingComm(*args, **kwargs)
        made.append(c)
        return c

    monkeypatch.setattr(comm, "create_comm", create)
    return made


@pytest.fixture
def shell():
    return process_shell()


class Clock:
    """A fake monotonic clock in integer milliseconds (exact float arithmetic)."""

    def __init__(self):
        self.ms = 0

    def __call__(self) -> float:
        return self.ms / 1000


def spans(html: str, cls: str) -> list[str]:
    soup = BeautifulSoup(html, "html.parser")
    return [el.get_text() for el in soup.select(f".{cls}")]


# --- data model ---------------------------------------------------------------------------------
def test_cached_span_is_the_first_cached_chars_of_the_prompt():
    v = RunView(live=False, session=Tally())
    v.on_text("main", "You are helpful. ", source="state s (cell [1])")
    v.on_text("main", "Q: sky? A:")
    v.on_prompt("main", prompt_tokens=9, cached_tokens=4, cached_chars=12)
    html = v.finish()["text/html"]
    # by hand: "You are help" (12 chars) cached, the rest of the prompt computed, split at char 12
    assert spans(html, "lmnb-cached") == ["You are help"]
    assert spans(html, "lmnb-computed") == ["ful. ", "Q: sky? A:"]


def test_fork_prompt_classifies_the_shared_parent_prefix_once():
    v = RunView(live=False, session=Tally())
    v.on_text("main", "PREFIX-0123")  # 11 chars
    v.on_fork("main", ["a", "b"])
    v.on_text("a", "aa")
    v.on_text("b", "bbb")
    # lane a's request prefilled everything; lane b then hit the shared 11-char prefix
    v.on_prompt("a", prompt_tokens=13, cached_tokens=0, cached_chars=0)
    v.on_prompt("b", prompt_tokens=14, cached_tokens=11, cached_chars=11)
    data = v.finish()[VIEW_MIME]
    lanes = {ln["id"]: ln for ln in data["lanes"]}
    seg = lambda lid: [(s["text"], s.get("cache")) for s in lanes[lid]["segments"] if s["kind"] == "text"]
    assert seg("main") == [("PREFIX-0123", "computed")]  # the first request decides
    assert seg("a") == [("aa", "computed")]
    assert seg("b") == [("bbb", "computed")]
    assert lanes["a"]["prefix_chars"] == lanes["b"]["prefix_chars"] == 11


def test_hit_rates_for_the_cell_and_the_session():
    session = Tally(prompt_tokens=100, cached_tokens=10)  # earlier cells
    v = RunView(live=False, session=session)
    v.on_text("main", "x" * 10)
    v.on_prompt("main", prompt_tokens=20, cached_tokens=8)
    v.on_fork("main", ["a", "b"])
    v.on_prompt("a", prompt_tokens=25, cached_tokens=20)
    v.on_prompt("b", prompt_tokens=25, cached_tokens=20)
    cache = v.finish()[VIEW_MIME]["cache"]
    assert cache["cell"] == {"prompt_tokens": 70, "cached_tokens": 48, "hit_rate": 48 / 70}
    assert cache["cumulative"] == {"prompt_tokens": 170, "cached_tokens": 58, "hit_rate": 58 / 170}
    assert "68.6%" in v.finish()["text/html"]  # 48 / 70


def test_a_gen_reported_only_at_its_end_still_shades_its_cached_prompt():
    v = RunView(live=False, session=Tally())
    v.on_text("main", "abcdefgh")
    v.on_delta("main", "XY", token_ids=[1, 2])
    v.on_gen_end("main", meta={"prompt_tokens": 4, "cached_tokens": 3, "cached_chars": 6, "completion_tokens": 2})
    b = v.finish()
    # the prompt is the 8 chars before the output: 6 cached, 2 computed; the output stays generated
    assert spans(b["text/html"], "lmnb-cached") == ["abcdef"]
    assert spans(b["text/html"], "lmnb-computed") == ["gh"]
    assert spans(b["text/html"], "lmnb-gen") == ["XY"]
    assert b[VIEW_MIME]["requests"][0]["completion_tokens"] == 2


def test_cached_chars_from_a_real_tokenizer(tiny_llama):
    from transformers import AutoTokenizer

    from lmnb_kernel.widgets import prefix_chars_from

    tok = AutoTokenizer.from_pretrained(tiny_llama)  # encode adds BOS, as the engine's does
    cached = len(tok.encode("the cat"))  # a prompt "the cat" cached earlier, BOS included
    v = RunView(live=False, session=Tally(), prefix_chars=prefix_chars_from(tok))
    v.on_text("main", "the cat sat on the mat")
    v.on_delta("main", " ok")
    v.on_gen_end("main", meta={"prompt_tokens": len(tok.encode("the cat sat on the mat")), "cached_tokens": cached})
    html = v.finish()["text/html"]
    assert spans(html, "lmnb-cached") == ["the cat"]  # by hand: the 7 characters of the cached prompt
    assert spans(html, "lmnb-computed") == [" sat on the mat"]
    nothing_cached = RunView(live=False, session=Tally(), prefix_chars=prefix_chars_from(tok))
    nothing_cached.on_text("main", "a dog")
    nothing_cached.on_prompt("main", prompt_tokens=3, cached_tokens=0)
    assert spans(nothing_cached.finish()["text/html"], "lmnb-computed") == ["a dog"]


def test_generated_tokens_get_one_tooltip_each():
    v = RunView(live=False, session=Tally())
    v.on_delta("main", "Hi there", token_ids=[7, 9], token_texts=["Hi", " there"], logprobs=[-0.5, -2.0], name="g")
    v.on_gen_end("main")
    soup = BeautifulSoup(v.finish()["text/html"], "html.parser")
    toks = soup.select(".lmnb-gen .lmnb-tok")
    assert [t.get_text() for t in toks] == ["Hi", " there"]
    # exp(-0.5) = 0.6065..., exp(-2) = 0.1353...
    assert toks[0]["title"] == "'Hi' · id 7 · logprob -0.5000 (p=0.607)"
    assert toks[1]["title"] == "' there' · id 9 · logprob -2.0000 (p=0.135)"


def test_a_long_gen_shows_ids_and_logprobs_for_its_first_pieces_and_says_the_rest_are_left_out():
    """Every token's ids and logprobs went into the saved notebook (~400 KB per 10k tokens), though
    the view shows them (as tooltips) for the first MAX_TOKEN_DETAIL pieces only."""
    from lmnb_kernel.widgets.model import MAX_TOKEN_DETAIL

    n = MAX_TOKEN_DETAIL + 500
    v = RunView(live=False, session=Tally())
    for i in range(n):
        v.on_delta("main", f"t{i} ", token_ids=[i], token_texts=[f"t{i} "], logprobs=[-0.25], name="g")
    v.on_gen_end("main")
    bundle = v.finish()
    [gen] = [s for s in bundle[VIEW_MIME]["lanes"][0]["segments"] if s["kind"] == "gen"]
    assert gen == {"kind": "gen", "text": "".join(f"t{i} " for i in range(n)), "name": "g", "n_tokens": n}
    soup = BeautifulSoup(bundle["text/html"], "html.parser")
    toks = soup.select(".lmnb-gen .lmnb-tok")
    # exp(-0.25) = 0.7788...
    assert [t["title"] for t in toks] == [f"'t{i} ' · id {i} · logprob -0.2500 (p=0.779)" for i in range(MAX_TOKEN_DETAIL)]
    assert soup.select_one(".lmnb-gen").get_text() == gen["text"]
    assert soup.select_one(".lmnb-gen")["title"] == (
        f"gen g · ids and logprobs of its first {MAX_TOKEN_DETAIL} of {n} pieces only")


def test_the_saved_data_holds_each_gens_text_and_token_count_and_the_html_alone_its_tokens():
    # a {fork 8} cell of 200 tokens a branch saved ~120 KB of per-token JSON ([text, ids, logprobs]
    # per token) that no view reads, beside the HTML whose tooltips show the same: each token's
    # ids and logprobs are saved once, in the tooltips
    v = RunView(live=False, session=Tally())
    v.on_text("main", "Q:")
    v.on_fork("main", ["a", "b"])
    v.on_delta("a", "It's", token_ids=[5, 6], token_texts=["It", "'s"], logprobs=[-0.5, -1.0], name="x")
    v.on_delta("b", 'No "x"', token_ids=[7, 8], token_texts=["No", ' "x"'], logprobs=[-2.0, -0.25], name="x")
    v.on_gen_end("a")
    v.on_gen_end("b")
    bundle = v.finish()
    data = bundle[VIEW_MIME]
    assert data["version"] == 2
    assert [[s for s in ln["segments"] if s["kind"] == "gen"] for ln in data["lanes"][1:]] == [
        [{"kind": "gen", "text": "It's", "name": "x", "n_tokens": 2}],
        [{"kind": "gen", "text": 'No "x"', "name": "x", "n_tokens": 2}]]
    html = bundle["text/html"]
    # a tooltip quotes its text as repr does, within the attribute's double quotes: the single
    # quotes are written as they are (html.escape's &#x27; was an eighth of the HTML), double ones escaped
    # (exp(-0.5) = 0.6065..., exp(-1) = 0.3678..., exp(-2) = 0.1353..., exp(-0.25) = 0.7788...)
    assert ('<span class="lmnb-tok" title="\'It\' · id 5 · logprob -0.5000 (p=0.607)">It</span>'
            '<span class="lmnb-tok" title="&quot;\'s&quot; · id 6 · logprob -1.0000 (p=0.368)">\'s</span>') in html
    assert ('<span class="lmnb-tok" title="\' &quot;x&quot;\' · id 8 · logprob -0.2500 (p=0.779)"> &quot;x&quot;</span>'
            in html)
    toks = BeautifulSoup(html, "html.parser").select(".lmnb-tok")
    assert [(t.get_text(), t["title"]) for t in toks] == [
        ("It", "'It' · id 5 · logprob -0.5000 (p=0.607)"), ("'s", "\"'s\" · id 6 · logprob -1.0000 (p=0.368)"),
        ("No", "'No' · id 7 · logprob -2.0000 (p=0.135)"), (' "x"', "' \"x\"' · id 8 · logprob -0.2500 (p=0.779)")]


def test_delta_without_per_token_text_is_one_piece_with_all_ids():
    v = RunView(live=False, session=Tally())
    v.on_delta("main", "abc", token_ids=[1, 2])
    v.on_delta("main", "de", token_ids=[3])
    bundle = v.finish()
    gen = [s for s in bundle[VIEW_MIME]["lanes"][0]["segments"] if s["kind"] == "gen"]
    assert gen == [{"kind": "gen", "text": "abcde", "n_tokens": 3}]
    toks = BeautifulSoup(bundle["text/html"], "html.parser").select(".lmnb-gen .lmnb-tok")
    assert [(t.get_text(), t["title"]) for t in toks] == [("abc", "'abc' · id 1, 2"), ("de", "'de' · id 3")]


def test_join_closes_lanes_and_is_shown():
    v = RunView(live=False, session=Tally())
    v.on_fork("main", ["a", "b"], labels=["pros", "cons"])
    v.on_delta("a", "good")
    v.on_delta("b", "bad")
    v.on_join("main", ["a", "b"])
    v.on_text("main", "Summary:")
    b = v.finish()
    soup = BeautifulSoup(b["text/html"], "html.parser")
    assert [td.select_one(".lmnb-lane-header b").get_text() for td in soup.select(".lmnb-lanes td.lmnb-lane")] \
        == ["pros", "cons"]
    assert soup.select_one(".lmnb-join").get_text() == "⤶ joined pros, cons"
    lanes = {ln["id"]: ln for ln in b[VIEW_MIME]["lanes"]}
    assert lanes["a"]["joined_into"] == lanes["b"]["joined_into"] == "main"
    kinds = [s["kind"] for s in lanes["main"]["segments"]]
    assert kinds == ["fork", "join", "text"]



def test_a_wide_fork_wraps_its_lanes_four_to_a_row():
    # a fork of 10 was one table row of ten 10%-wide lanes (fork 32: 3%, a few letters a line)
    v = RunView(live=False, session=Tally())
    ids = [f"b{i}" for i in range(10)]
    v.on_fork("main", ids)
    for lid in ids:
        v.on_delta(lid, f"text of {lid}")
    soup = BeautifulSoup(v.finish()["text/html"], "html.parser")
    rows = soup.select_one("table.lmnb-lanes").find("tbody").find_all("tr", recursive=False)
    assert [len(r.find_all("td", recursive=False)) for r in rows] == [4, 4, 2]  # 10 = 4 + 4 + 2
    cells = soup.select("td.lmnb-lane")
    assert [td.select_one(".lmnb-lane-body").get_text() for td in cells] == [f"text of {lid}" for lid in ids]
    assert all("width:25.00%" in td["style"] for td in cells)


def test_a_wide_fork_renders_without_a_pass_over_every_lane_or_request_per_lane():
    """Each lane's colour was its position found by list(model.lanes).index, its header's counts a
    scan of every request, and on_fork checked each id with lanes.count: quadratic in the fork's
    width (a fork of 16000 took seconds). The lanes and requests are iterated a fixed number of
    times per render now, whatever the width."""
    from lmnb_kernel.widgets.html import LANE_COLORS

    class Counted(dict):
        passes = 0

        def __iter__(self):
            Counted.passes += 1
            return super().__iter__()

        def values(self):
            Counted.passes += 1
            return super().values()

    class CountedList(list):
        def __iter__(self):
            Counted.passes += 1
            return super().__iter__()

    v = RunView(live=False, session=Tally())
    ids = [f"b{i}" for i in range(200)]
    v.on_fork("main", ids)
    for lid in ids:
        v.on_prompt(lid, prompt_tokens=10, cached_tokens=4)
        v.on_delta(lid, f"text of {lid}")
    v.model.lanes, v.model.requests = Counted(v.model.lanes), CountedList(v.model.requests)
    soup = BeautifulSoup(render_run_html(v.model), "html.parser")
    assert Counted.passes < 10  # (at least 200 before)
    cells = soup.select("td.lmnb-lane")
    assert [re.search(r"border-left:3px solid (#\w+)", td["style"]).group(1) for td in cells] == [
        LANE_COLORS[i % len(LANE_COLORS)] for i in range(1, 201)]  # main is lane 0
    assert all("prompt 10, cached 4 (40.0%)" in td.select_one(".lmnb-lane-header").get_text() for td in cells)
    with pytest.raises(ValueError, match="lane 'c' already exists"):
        v.on_fork("main", ["a", "c", "c"])


def test_json_nested_400_deep_renders_its_top_levels_as_a_tree_and_the_rest_as_text():
    # render_json_tree recursed once per level and raised RecursionError at ~400 levels, so the
    # cell's view (finish) failed on a deeply nested JSON output
    from lmnb_kernel.widgets.render_run import MAX_JSON_DEPTH

    v = RunView(live=False, session=Tally())
    v.on_delta("main", "[" * 400 + "]" * 400)
    v.on_gen_end("main", json_schema={"type": "array"})
    soup = BeautifulSoup(v.finish()["text/html"], "html.parser")
    assert len(soup.select("details.lmnb-json-node")) == MAX_JSON_DEPTH
    deep = soup.select(".lmnb-json-deep")
    assert len(deep) == 1
    assert deep[0].get_text() == "[" * (400 - MAX_JSON_DEPTH) + "]" * (400 - MAX_JSON_DEPTH)


def test_a_constrained_output_cut_by_max_tokens_says_so_and_the_fix_in_the_text_view_too():
    """A JSON gen cut off by max_tokens showed only "rec: INVALID JSON output" in the text view
    (what `lmnb run` and a log show), and the HTML's reason read "...starting at at char 18"."""
    cut = '{"name": "Arvel", "pet'  # the string opened at char 18 never closes
    v = RunView(live=False, session=Tally())
    v.on_delta("main", cut, name="rec")
    v.on_gen_end("main", json_schema={"type": "object"}, finish_reason={"type": "length", "length": 8})
    out = v.finish()
    rec = out[VIEW_MIME]["structured"][0]
    with pytest.raises(json.JSONDecodeError) as e:
        json.loads(cut)
    assert rec["errors"] == [
        {"path": "$", "message": "cut off: the gen reached its max_tokens (finish reason length) before the output "
                                 "was complete; give it a larger max_tokens"},
        {"path": "$", "message": f"not JSON: {e.value}"}]
    assert "starting at: line 1 column 19 (char 18)" in rec["errors"][1]["message"]
    assert "rec: INVALID JSON output: cut off: the gen reached its max_tokens" in out["text/plain"]
    # a gen that stopped by itself with text that does not match: no word of max_tokens, the mismatch named
    v = RunView(live=False, session=Tally())
    v.on_delta("main", "abc", name="code")
    v.on_gen_end("main", regex=r"\d+", finish_reason={"type": "stop"})
    assert "code: INVALID regex output: output does not fully match /\\d+/" in v.finish()["text/plain"]


def test_a_constrained_output_cut_by_its_own_stop_says_which_stop_cut_it():
    """A regex gen that its stop or stop_regex ended midway ({gen a regex=r"\\p{Lu}\\w+ \\w+" stop="e"}
    gave 'Arv') showed only "INVALID regex output: output does not fully match", as if the
    constraint had failed; the stop that cut it is the cause, named first as max_tokens' is."""
    from lmnb_engine.outputs import FinishReason
    for reason in ({"type": "stop", "matched": "e"}, FinishReason("stop", matched="e")):
        v = RunView(live=False, session=Tally())
        v.on_delta("main", "Arv", name="a")
        v.on_gen_end("main", regex=r"\p{Lu}\w+ \w+", finish_reason=reason)
        out = v.finish()
        errors = out[VIEW_MIME]["structured"][0]["errors"]
        assert errors[0]["message"] == ("cut off: its stop 'e' ended the gen (finish reason stop) before the output "
                                        "was complete; leave that stop out of a gen with a regex or json_schema")
        assert errors[1]["message"] == "output does not fully match /\\p{Lu}\\w+ \\w+/"  # the mismatch still named
        assert "a: INVALID regex output: cut off: its stop 'e' ended the gen" in out["text/plain"]
    # a stop token (EOS, stop_token_ids) or a complete output: no word of a stop string
    for reason, text in (({"type": "stop", "matched": 2}, "Arv"), ({"type": "stop", "matched": "e"}, "Arv x")):
        v = RunView(live=False, session=Tally())
        v.on_delta("main", text, name="a")
        v.on_gen_end("main", regex=r"\p{Lu}\w+ \w+", finish_reason=reason)
        assert "cut off" not in v.finish()["text/plain"]


def test_json_nested_thousands_deep_is_reported_invalid_not_raised():
    # json.loads raised RecursionError (not a JSONDecodeError) out of on_gen_end, failing the cell
    v = RunView(live=False, session=Tally())
    v.on_delta("main", "[" * 100_000 + "]" * 100_000)
    v.on_gen_end("main", json_schema={"type": "array"})
    rec = v.finish()[VIEW_MIME]["structured"][0]
    assert (rec["valid"], rec["value"], rec["errors"]) == (False, None, [{"path": "$", "message": "nested too deeply to parse"}])


def test_a_5000_item_json_array_draws_a_bounded_tree():
    # every item was drawn: a 29 KB output made ~1 MB of HTML in the saved notebook
    from lmnb_kernel.widgets.render_run import MAX_JSON_NODES

    v = RunView(live=False, session=Tally())
    v.on_delta("main", json.dumps(list(range(5000))))
    v.on_gen_end("main", json_schema={"type": "array"})
    soup = BeautifulSoup(v.finish()["text/html"], "html.parser")
    leaves = [x.get_text() for x in soup.select(".lmnb-json .lmnb-json-leaf")]
    assert len(leaves) == MAX_JSON_NODES - 1  # the array itself is a node
    assert leaves == [str(i) for i in range(MAX_JSON_NODES - 1)]
    assert soup.select_one(".lmnb-json-more").get_text() == f"… {5000 - (MAX_JSON_NODES - 1)} more not shown"


def test_an_invalid_json_output_is_not_shown_twice_in_full():
    # a 10,000-character output cut by max_tokens was shown whole in the lane and again whole under
    # the schema check, doubling the saved notebook
    from lmnb_kernel.widgets.render_run import TEXT_HEAD, TEXT_TAIL

    text = '{"a": "' + "x" * 9993
    v = RunView(live=False, session=Tally())
    v.on_delta("main", text)
    v.on_gen_end("main", json_schema={"type": "object"})
    soup = BeautifulSoup(v.finish()["text/html"], "html.parser")
    assert soup.select_one(".lmnb-gen").get_text() == text
    pre = soup.select_one(".lmnb-structured pre").get_text()
    hidden = 10000 - TEXT_HEAD - TEXT_TAIL
    assert pre == text[:TEXT_HEAD] + f" … {hidden:,} characters not shown … " + text[-TEXT_TAIL:]

# --- structured output and select ---------------------------------------------------------------
SCHEMA = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"},
                         "age": {"type": "integer", "minimum": 10}}}


def test_json_output_checked_against_the_schema():
    rec = check_structured('{"name": "bob", "age": 5}', json_schema=SCHEMA)
    assert rec["valid"] is False
    assert [e["path"] for e in rec["errors"]] == ["$.age"]  # 5 < minimum 10
    assert rec["patterns"] == [{"path": "$.name", "pattern": "^[a-z]+$", "value": "bob", "match": True}]
    ok = check_structured('{"name": "Bob", "age": 12}', json_schema=SCHEMA)
    assert ok["errors"] == [{"path": "$.name", "message": "'Bob' does not match '^[a-z]+$'"}]
    assert ok["patterns"][0]["match"] is False
    assert check_structured('{"name": "bob", "age": 12}', json_schema=SCHEMA)["valid"] is True
    bad = check_structured('{"name": ', json_schema=json_dumps(SCHEMA))
    assert bad["valid"] is False and bad["errors"][0]["message"].startswith("not JSON")


def test_a_gen_with_the_boolean_schema_true_is_checked_as_any_json_value():
    """gen(json_schema=True) (JSON Schema's boolean schema: any JSON value) took a cell's view down:
    the check read the schema with dict(True), "TypeError: 'bool' object is not iterable"."""
    v = RunView(live=False, session=Tally())
    v.on_delta("main", '[1, "a", null]', name="x")
    v.on_gen_end("main", json_schema=True)
    rec = v.finish()[VIEW_MIME]["structured"][0]
    assert (rec["kind"], rec["valid"], rec["errors"], rec["value"]) == ("json", True, [], [1, "a", None])
    cut = check_structured('{"a": ', json_schema=True)  # still JSON: text that does not parse is invalid
    assert cut["valid"] is False and cut["errors"][0]["message"].startswith("not JSON")


def test_a_json_error_marks_its_own_node_when_a_key_holds_a_dot():
    """Error marks were matched by "$.a.b", the path of both the key "a.b" and of b inside a: the
    valid nested value was marked too. (And "$.2": the key "2" or index 2.)"""
    from lmnb_kernel.widgets.render_run import render_structured

    schema = {"type": "object", "properties": {"a.b": {"type": "integer"}, "a": {"type": "object"},
                                               "l": {"type": "array", "items": {"type": "integer"}},
                                               "2": {"type": "integer"}}}
    rec = check_structured('{"a.b": "x", "a": {"b": 1}, "l": [0, 1, 2], "2": "y"}', json_schema=schema)
    assert sorted(e["path"] for e in rec["errors"]) == ['$["2"]', '$["a.b"]']
    soup = BeautifulSoup(render_structured(rec, "out", "main"), "html.parser")
    marked = sorted(m.parent.get_text().split(":")[0] for m in soup.select(".lmnb-json-error"))
    assert marked == ['"2"', '"a.b"']  # not b inside a, nor l[2]
    rec = check_structured('{"café": 1}', json_schema={"properties": {"café": {"type": "string"}}})
    assert [e["path"] for e in rec["errors"]] == ['$["café"]']  # (as written, not "caf\\u00e9")


def json_dumps(x):
    import json

    return json.dumps(x)


def test_regex_constraint_must_match_the_whole_output():
    assert check_structured("2024-01-31", regex=r"\d{4}-\d{2}-\d{2}")["regex_match"] is True
    assert check_structured("2024-01-31!", regex=r"\d{4}-\d{2}-\d{2}")["regex_match"] is False
    with pytest.raises(ValueError, match="json_schema= or regex="):
        check_structured("x")


def test_regex_constraint_with_unicode_property_classes_is_checked_not_called_invalid():
    # gen(regex=r"\p{Lu}\p{Ll}+") is taken by gen(), the cell and the engine; Python's re lacks
    # \p{...}, so the view called a matching output "INVALID": "The" is an upper-case letter then
    # lower-case ones, "the" is not, and "Thé" is (é is Ll)
    pattern = r"\p{Lu}\p{Ll}+"
    assert check_structured("The", regex=pattern)["regex_match"] is True
    assert check_structured("The", regex=pattern)["valid"] is True
    assert check_structured("Thé", regex=pattern)["valid"] is True
    rec = check_structured("the", regex=pattern)
    assert rec["regex_match"] is False and rec["valid"] is False
    assert rec["errors"] == [{"path": "$", "message": f"output does not fully match /{pattern}/"}]
    assert check_structured("x", regex=r"\p{Nope}")["errors"][0]["message"].startswith("the regex does not compile")


@pytest.mark.parametrize("pattern, text, valid", [
    # Rust's regex (the engine's automaton library) reads these; the regex package refuses the first
    # three ("unknown property") and reads the class intersection "&&" as literal characters, so
    # the view called every output "INVALID" and \p{Age=3.0} "does not compile". Ages (UTS #18:
    # assigned in that version or earlier): A is Unicode 1.1, U+1FAE8 (shaking face) 15.0, U+20B9
    # (rupee sign) 6.0, U+2FFC 15.1
    (r"\p{Age=15.0}+", "A\U0001FAE8", True), (r"\p{Age=15.0}", "\u2FFC", False),
    (r"\p{Age=3.0}+", "AB", True), (r"\p{Age=3.0}", "\u20B9", False),
    (r"\p{isLu}+", "AB", True), (r"\p{isLu}+", "Ab", False),  # "is" is ignored in a name: Lu
    (r"[\p{Lu}&&[^AEIOU]]+", "BCD", True), (r"[\p{Lu}&&[^AEIOU]]+", "BAD", False),  # capitals but vowels
    # the whole text is walked at once: byte by byte the automaton drops the "." after "A3"
    (r"\p{Lu}[0-9]+(\.[0-9]+)?", "A3.14", True), (r"\p{Lu}[0-9]+(\.[0-9]+)?", "A3.", False),
    (r"\p{Lu}*", "", True), (r"\p{Lu}", "", False),
    # the rest of the pattern means what Python's re makes of it, as in the engine (respelled): its \w
    # holds "½" (str.isalnum) and no combining mark (U+0301), Rust's the other way round; a{,2} is 0 to 2
    (r"\p{Lu}\w+", "A\u00bd", True), (r"\p{Lu}\w+", "Ae\u0301", False), (r"\p{Lu}a{,2}", "Aaa", True),
    (r"^\p{Lu}+$", "AB", True),  # (edge anchors: the whole output matches anyway)
])
def test_regex_output_is_judged_by_the_engines_automaton_where_re_cannot_read_it(pattern, text, valid):
    rec = check_structured(text, regex=pattern)
    assert (rec["valid"], rec["regex_match"]) == (valid, valid)
    assert rec["errors"] == ([] if valid else [{"path": "$", "message": f"output does not fully match /{pattern}/"}])


def test_the_views_automaton_of_a_pattern_is_built_once_for_its_outputs(monkeypatch):
    """The view built the pattern's automaton anew at each output's end (1.5 s for this address
    pattern on a 2-core box, paid by every gen of a batch), where the engine compiles it once. Its
    byte index is kept now: a second output of the pattern builds nothing; an output the byte walk
    cannot follow (a step out of a state where a match could end: "a1.b" after "a1") or that does
    not match is judged by the one-token build, as before. Checked by hand: local part, "@",
    domain, ".", 2 to 6 letters."""
    import outlines_core

    from lmnb_kernel.widgets.structured import _automaton_accepts

    built, real_index = [], outlines_core.Index

    def index(*args):
        built.append(args[0])
        return real_index(*args)

    monkeypatch.setattr(outlines_core, "Index", index)
    pattern = r"[\p{L}\p{N}]{1,64}@\p{L}{1,20}\.\p{L}{2,6}"
    assert check_structured("bob@ex.com", regex=pattern)["valid"] is True
    first = len(built)
    assert check_structured("alice@example.org", regex=pattern)["valid"] is True
    assert len(built) == first  # (nothing built for the second output)
    texts = ("bob@ex", "bob@ex.c", "b\u00e9b@\u00e9x.fr")
    assert [check_structured(text, regex=pattern)["valid"] for text in texts] == [False, False, True]
    assert _automaton_accepts(r"\p{Lu}[0-9]+(\.[0-9]+)?", "A1.5") is True  # (the one-token build)


def test_the_engines_regex_outputs_with_rust_only_classes_are_valid_in_the_view(tiny_engine):
    """What the engine writes under a class only Rust's regex reads, the view calls valid; checked
    by hand: unicodedata's category (Lu: an upper-case letter) and Python's \\w."""
    import unicodedata

    from lmnb_engine import SamplingParams

    for pattern in (r"\p{isLu}{3}", r"\p{isLu}\w{2}"):
        text = tiny_engine.generate("Name:", SamplingParams(max_new_tokens=12, temperature=0.0, regex=pattern)).text
        assert len(text) == 3 and unicodedata.category(text[0]) == "Lu", text
        assert all(unicodedata.category(c) == "Lu" for c in text) if "{3}" in pattern else re.fullmatch(r"\w\w", text[1:])
        assert check_structured(text, regex=pattern)["valid"] is True


def test_the_views_regex_check_loads_no_torch():
    """A kernel on a remote backend need not load torch to check a regex with a Unicode class:
    the engine's respelling (lmnb_engine.constrained.regex_syntax) is torch-free, and so is the
    package it sits in until its engine parts are used."""
    import subprocess
    import sys

    code = ("import sys\nfrom lmnb_kernel.widgets.structured import check_structured\n"
            "print(check_structured('A\u00bd', regex=r'\\p{Lu}\\w+')['valid'])\n"
            "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True", "[]"]


def test_the_constrained_packages_public_names_are_listed_before_their_first_use():
    """lmnb_engine.constrained imports its names on first use (PEP 562); dir() (and so a notebook's
    tab completion) listed none of them until then. Checked in a fresh interpreter, where nothing
    imported them yet: dir() holds every name of __all__, and each is what its module defines."""
    import subprocess
    import sys

    code = ("import importlib, lmnb_engine.constrained as c\n"
            "print(sorted(set(c.__all__) - set(dir(c))))\n"
            "print(all(getattr(c, n) is getattr(importlib.import_module(f'{c.__name__}.{c._MODULE_OF[n]}'), n) "
            "for n in c.__all__))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "True"]


def test_without_the_automaton_library_the_regex_package_reads_a_unicode_class(monkeypatch):
    """A kernel without outlines-core (one talking to a remote backend) reads \\p{...} with the regex
    package, which agrees with Rust's regex on a script: α and β are Greek, A is not."""
    import sys

    monkeypatch.setitem(sys.modules, "outlines_core", None)  # (import outlines_core raises ImportError)
    assert check_structured("αβ", regex=r"\p{Greek}+")["valid"] is True
    assert check_structured("αA", regex=r"\p{Greek}+")["valid"] is False


def test_jump_forward_savings_and_json_tree_in_the_view():
    v = RunView(live=False, session=Tally())
    v.on_delta("main", '{"name": "bob", "age": 5}', token_ids=list(range(30)), name="person")
    v.on_gen_end("main", json_schema=SCHEMA,
                 meta={"prompt_tokens": 12, "cached_tokens": 0, "completion_tokens": 30,
                       "forward_passes": 18, "jumped_tokens": 12})
    html = v.finish()["text/html"]
    soup = BeautifulSoup(html, "html.parser")
    assert soup.select_one(".lmnb-jump").get_text() == (
        "jump-forward: 12 tokens jumped; 18 forward passes for 30 tokens (saved 12)")  # 30 - 18
    assert soup.select_one(".lmnb-invalid") is not None
    assert soup.select_one("details.lmnb-json-node") is not None  # collapsible tree
    assert "5 is less than the minimum of 10" in soup.select_one(".lmnb-json-error").get_text()


def test_requests_structured_outputs_and_selects_name_fork_lanes_by_their_label():
    # the kernel's lanes are ids like "b0" shown as "branch 0" in the lane headers; the request table
    # and the headings of a branch's JSON check and select used to show the bare id
    v = RunView(live=False, session=Tally())
    v.on_text("main", "Q:")
    v.on_fork("main", ["b0", "b1"], labels=["branch 0", "branch 1"])
    v.on_delta("b1", '{"name": "bob", "age": 12}', token_ids=[5])
    v.on_gen_end("b1", name="p", json_schema=SCHEMA, meta={"prompt_tokens": 3, "cached_tokens": 1,
                                                           "completion_tokens": 1})
    v.on_select("b0", name="tool", choices=["x", "y"], scores=[-1.0, -0.5],
                meta={"prompt_tokens": 4, "cached_tokens": 2})
    b = v.finish()
    soup = BeautifulSoup(b["text/html"], "html.parser")
    assert [tr.find("td").get_text() for tr in soup.select(".lmnb-requests tbody tr")] == ["branch 1", "branch 0"]
    assert soup.select_one(".lmnb-structured div").get_text() == "p · (branch 1) JSON · ✓ valid"
    assert soup.select_one(".lmnb-select div").get_text().startswith("tool (branch 0) select")
    assert "── branch 0 (fork of main) ──" in b["text/plain"]


def test_select_scores_as_bars_with_the_chosen_marked():
    v = RunView(live=False, session=Tally())
    v.on_select("main", name="tool", choices=["search", "calc", "none"], scores=[-0.1, -2.0, float("nan")])
    b = v.finish()
    sel = b[VIEW_MIME]["selects"][0]
    assert sel["chosen"] == 0  # the best finite score
    soup = BeautifulSoup(b["text/html"], "html.parser")
    rows = soup.select(".lmnb-select tr")
    assert "lmnb-chosen" in rows[0]["class"] and "lmnb-chosen" not in rows[1]["class"]
    widths = [r.select_one(".lmnb-bar div")["style"] for r in rows]
    # bar = exp(score - best): exp(0) = 100%, exp(-1.9) = 14.96%, unscored 0%
    assert [re.search(r"width:([\d.]+)%", w).group(1) for w in widths] == ["100.0", "15.0", "0.0"]
    assert spans(b["text/html"], "lmnb-select-choice") == ["search"]


def test_a_select_over_many_choices_and_a_cell_of_many_requests_draw_bounded_tables():
    """Every choice of a select and every request was a table row: a select over 8000 labels made
    4.5 MB of HTML in the saved notebook (its data keeps every score)."""
    from lmnb_kernel.widgets.render_run import MAX_REQUEST_ROWS, MAX_SELECT_ROWS

    v = RunView(live=False, session=Tally())
    n = MAX_SELECT_ROWS + 70
    scores = [-float(i) for i in range(n)]
    scores[3] = float("nan")  # (unscored: last)
    v.on_select("main", name="label", choices=[f"c{i}" for i in range(n)], scores=scores, chosen=n - 1)
    for _ in range(MAX_REQUEST_ROWS + 5):
        v.on_prompt("main", prompt_tokens=2, cached_tokens=1)
    b = v.finish()
    soup = BeautifulSoup(b["text/html"], "html.parser")
    shown = [r.td.get_text().removeprefix("✓ ") for r in soup.select(".lmnb-select tr")]
    best = [f"c{i}" for i in range(MAX_SELECT_ROWS + 1) if i != 3]  # the 50 best scores
    assert shown == best + [f"c{n - 1}"]  # and the chosen one, in the choices' order
    assert soup.select_one(".lmnb-select .lmnb-more").get_text() == "… 69 more choices, with lower scores, not shown"
    assert len(b[VIEW_MIME]["selects"][0]["scores"]) == n
    assert len(soup.select(".lmnb-requests tbody tr")) == MAX_REQUEST_ROWS
    assert soup.select_one(".lmnb-requests .lmnb-more").get_text() == "… 5 more requests not shown"
    assert b["text/plain"].splitlines()[-1].endswith(f"*'c{n - 1}'={-(n - 1):.3f}, … 69 more choices, with lower "
                                                     "scores, not shown")


# --- sanitizer safety -----------------------------------------------------------------------------
# Transcribed from JupyterLab's sanitizer (packages/apputils/src/sanitizer.ts): the tags and
# attributes we may use, and for each CSS property we use, the value grammar it accepts.
# img (image thumbnails, issue 10): the sanitizer allows img with src/alt/width/height and exempts src
# from its URL-scheme check (allowedSchemesAppliedToAttributes; jupyterlab#5183); we only ever emit
# inline PNG data URLs there (checked below), so nothing is fetched from elsewhere.
ALLOWED_TAGS = {"b", "details", "div", "li", "span", "summary", "table", "tbody", "td", "th", "thead", "tr",
                "ul", "pre", "img"}
ALLOWED_ATTRS = {"class", "style", "title", "open"}
IMG_ATTRS = {"src", "alt", "width", "height"}
_LEN = r"(0|[+-]?([0-9]*[.])?[0-9]+(px|em|rem|ex|in|cm|mm|pt|pc))"
_LEN_POS = r"(0|[+]?([0-9]*[.])?[0-9]+(px|em|rem|ex|in|cm|mm|pt|pc))"
_PCT_POS = r"[+]?([0-9]*[.])?[0-9]+%"
_COLOR = r"(#(0x)?[0-9a-f]+|transparent|[a-z]+)"
_BORDER = rf"(({_LEN}|thin|medium|thick|none|hidden|dotted|dashed|solid|double)\s*|{_COLOR}\s*){{1,3}}"
CSS_VALUES = {
    "background-color": _COLOR, "color": _COLOR, "border": _BORDER, "border-left": _BORDER,
    "border-top": _BORDER, "border-bottom": _BORDER,
    "border-radius": rf"(({_LEN}|{_PCT_POS})\s*){{1,4}}", "border-collapse": "collapse|separate",
    "border-spacing": rf"{_LEN}\s*({_LEN})?", "padding": rf"(({_LEN_POS}|{_PCT_POS})\s*){{1,4}}",
    "padding-left": rf"{_LEN_POS}|{_PCT_POS}", "padding-top": rf"{_LEN_POS}|{_PCT_POS}",
    "margin": rf"(({_LEN}|{_PCT_POS}|auto)\s*){{1,4}}", "margin-right": rf"{_LEN}|{_PCT_POS}|auto",
    "margin-top": rf"{_LEN}|{_PCT_POS}|auto", "margin-bottom": rf"{_LEN}|{_PCT_POS}|auto",
    "width": rf"{_LEN_POS}|{_PCT_POS}|auto", "height": rf"{_LEN}|{_PCT_POS}|auto",
    "display": "inline|block|inline-block|table|flex|none", "vertical-align": "baseline|top|middle|bottom",
    "white-space": "normal|pre|nowrap|pre-wrap|pre-line", "word-wrap": "normal|break-word",
    "font-family": r"[a-z -]+(,\s*[a-z -]+)*", "font-size": rf"{_LEN_POS}|{_PCT_POS}",
    "font-style": "normal|italic|oblique", "font-weight": "normal|bold|bolder|lighter|[1-9]00",
    "line-height": rf"normal|[+]?([0-9]*[.])?[0-9]+|{_LEN_POS}", "text-align": "left|right|center|justify",
    "text-decoration": "none|((underline|overline|line-through)\\s*)+", "opacity": r"[+]?(1([.]0+)?|0([.][0-9]+)?)",
    "list-style-type": "none|disc|circle|square|decimal", "table-layout": "auto|fixed",
    "max-height": rf"{_LEN_POS}|{_PCT_POS}|none|auto", "overflow-y": "visible|hidden|scroll|auto",
}


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in ALLOWED_TAGS:
            self.problems.append(f"tag <{tag}>")
        for name, value in attrs:
            if tag == "img" and name in IMG_ATTRS:
                if name == "src" and not re.fullmatch(r"data:image/png;base64,[A-Za-z0-9+/=]+", value):
                    self.problems.append(f"img src {value[:40]!r} is not an inline PNG")
                continue
            if name not in ALLOWED_ATTRS:
                self.problems.append(f"attribute {name} on <{tag}>")
            if name == "style":
                for decl in filter(None, (d.strip() for d in value.split(";"))):
                    prop, _, val = (x.strip() for x in decl.partition(":"))
                    rule = CSS_VALUES.get(prop)
                    if rule is None or not re.fullmatch(rule, val, flags=re.I):
                        self.problems.append(f"style {prop}:{val}")


def sanitizer_problems(html: str) -> list[str]:
    p = _Collect()
    p.feed(html)
    return p.problems


def _busy_view() -> RunView:
    v = RunView("cell <1>", live=False, session=Tally())
    v.on_text("main", "<script>alert(1)</script> & \"quotes\"", source="state s")
    v.on_prompt("main", prompt_tokens=10, cached_tokens=5, cached_chars=8)
    v.on_fork("main", ["a", "b"])
    v.on_delta("a", "<b>", token_ids=[1], token_texts=["<b>"], logprobs=[-1.0])
    v.on_delta("b", '{"name": "bob", "age": 5}', token_ids=[2])
    v.on_gen_end("b", json_schema=SCHEMA, meta={"completion_tokens": 9, "forward_passes": 5, "jumped_tokens": 4})
    v.on_join("main", ["a", "b"])
    v.on_select("main", name="s", choices=["x", "y"], scores=[-1.0, -0.5])
    return v


def test_static_html_passes_jupyterlabs_sanitizer_rules_and_escapes_text():
    v = _busy_view()
    html = v.finish("error", error=ValueError("boom <x>"))["text/html"]
    assert sanitizer_problems(html) == []
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "data-k" not in html
    soup = BeautifulSoup(html, "html.parser")
    assert soup.select_one(".lmnb-error-message").get_text() == "ValueError: boom <x>"
    assert soup.select_one("div.lmnb-run")["class"] == ["lmnb-run", "lmnb-error"]


def test_tables_keep_the_views_dark_text_on_white_rows_under_a_dark_theme():
    # JupyterLab's CSS sets every <table>'s colour and every <tr>'s background from the theme (light
    # grey text and near-black rows in JupyterLab Dark); the view is dark text (#1f2328) on white
    # (#ffffff), so fork lanes, select scores and the request table set both inline.
    soup = BeautifulSoup(_busy_view().finish()["text/html"], "html.parser")
    tables = soup.find_all("table")  # the fork's lanes, the select's choices, the requests
    assert len(tables) == 3

    def style(el, prop):
        decls = dict(d.split(":", 1) for d in el.get("style", "").split(";") if ":" in d)
        return decls.get(prop)

    assert [style(t, "color") for t in tables] == ["#1f2328"] * 3
    rows = soup.find_all("tr")
    assert len(rows) == 1 + 2 + 2  # the fork's row, two choices, the request table's head and one request
    assert [style(r, "background-color") for r in rows] == ["#ffffff"] * 5


def test_a_video_thumbnail_is_its_middle_frame(tmp_path):
    from PIL import Image

    from lmnb import ir
    from lmnb_kernel.widgets.media import thumbnail

    gif = tmp_path / "v.gif"
    frames = [Image.new("RGB", (8, 8), (i * 30, 0, 0)) for i in range(9)]
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=40, loop=0)
    thumb = thumbnail(ir.Video(str(gif), 5))  # frames 0, 2, 4, 6, 8 (linspace(0, 8, 5)); the middle is 4
    png = Image.open(io.BytesIO(base64.b64decode(thumb.url.partition(",")[2])))
    assert png.convert("RGB").getpixel((4, 4)) == (120, 0, 0)  # it was frame 0's (0, 0, 0)


def test_image_thumbnails_show_their_cache_status_and_pass_the_sanitizer():
    from PIL import Image

    from lmnb import ir
    from lmnb_kernel.widgets.media import THUMB_PX, thumbnail

    big = Image.new("RGB", (300, 150), (200, 30, 30))
    thumb = thumbnail(ir.Image(big))
    assert (thumb.width, thumb.height) == (THUMB_PX, 48)  # 300x150 scaled to a 96 px long side
    v = RunView("cell", live=False, session=Tally())
    v.on_text("main", "<|user|>")
    v.on_media("main", "<image>", kind="image", thumb=thumb)
    v.on_text("main", "\n<image>\n")  # an image a {join concat} brought back: text, but it has an entry
    v.on_media("main", "<image>", kind="video", thumb=thumbnail(ir.Video("/no/such.mp4", 4)), frames=4)
    v.on_text("main", "\nQ?")
    html = render_run_html(v.model, live=False)
    assert "lmnb-media-pending" in html and "[video, 4 frames]" in html  # not sent yet; unreadable: a label
    v.on_delta("main", "A", token_ids=[5])
    v.on_gen_end("main", meta={"prompt_tokens": 40, "cached_tokens": 20, "completion_tokens": 1})
    v.on_media_cache("main", [{"tokens": 10, "cached_tokens": 10}, {"tokens": 10, "cached_tokens": 0},
                              {"tokens": 16, "cached_tokens": 3}])
    v.on_media_cache("main", [{"tokens": 10, "cached_tokens": 0}] * 2 + [{"tokens": 16, "cached_tokens": 0}])  # first wins
    html = v.finish()["text/html"]
    assert sanitizer_problems(html) == []
    soup = BeautifulSoup(html, "html.parser")
    image, video = soup.select(".lmnb-media")
    assert image.img["src"] == thumb.url and (image.img["width"], image.img["height"]) == ("96", "48")
    assert image.select_one(".lmnb-badge").get_text() == "cached" and "10/10 tokens" in image["title"]
    assert video.select_one(".lmnb-badge").get_text() == "partly cached" and video.img is None
    assert "<image>" in v.finish()["text/plain"]


def test_tree_html_passes_jupyterlabs_sanitizer_rules():
    tv = TreeView(kv_bytes_per_token=64, clock=lambda: 100.0)
    records = [{"node_id": 0, "parent_id": None, "num_tokens": 0, "lock_ref": 0, "last_access_time": 1.0},
               {"node_id": 1, "parent_id": 0, "num_tokens": 4, "text_preview": "<i>hi</i>", "lock_ref": 0,
                "last_access_time": 90.0}]
    html = tv.update(records, paths={"s <cell 1>": 1})["text/html"]
    assert sanitizer_problems(html) == []
    assert "&lt;i&gt;" in html


# --- live widget: comm messages, ops, frame rate, Stop ----------------------------------------------
def _apply_ops(soup: BeautifulSoup, ops: list[dict]) -> None:
    """What live.js does with an op frame, on a BeautifulSoup tree."""
    for op in ops:
        target = soup.find(attrs={"data-k": op["k"]})
        assert target is not None, f"op targets missing element {op['k']}"
        frag = BeautifulSoup(op["html"], "html.parser")
        if op["op"] == "set":
            target.clear()
        for node in list(frag.contents):
            target.append(node)


def _run_comm(comms: list[RecordingComm]) -> RecordingComm:
    """The view's own comm (ipywidgets also opens one for the DOM widget's Layout)."""
    [c] = [c for c in comms if c.sent[0][1]["state"].get("_model_name") == "AnyModel"]
    return c


def _frames(c: RecordingComm) -> list[dict]:
    """The widget's messages after comm_open: trait updates and custom (ops) messages."""
    return [data for kind, data in c.sent if kind == "comm_msg"]


def test_live_ops_rebuild_exactly_what_a_fresh_render_shows(comms, shell):
    clock = Clock()
    v = RunView("t", clock=clock, snapshot_s=1e9, session=Tally())  # ops only, no snapshots
    with capture_output():
        v.show()
    c = _run_comm(comms)
    soup = BeautifulSoup(c.sent[0][1]["state"]["snapshot"]["html"], "html.parser")

    def step(fn):
        fn()
        clock.ms += 60  # > 50 ms: every event may send a frame
        v.tick()

    step(lambda: v.on_text("main", "Intro text. "))
    step(lambda: v.on_prompt("main", prompt_tokens=5, cached_tokens=2, cached_chars=6))
    step(lambda: v.on_fork("main", ["a", "b"]))
    for i in range(5):
        step(lambda i=i: v.on_delta("a", f"a{i} ", token_ids=[i], token_texts=[f"a{i} "]))
        step(lambda i=i: v.on_delta("b", f"b{i} ", token_ids=[i]))
    step(lambda: v.on_text("a", " more"))  # a new segment after an open gen
    step(lambda: v.on_prompt("a", prompt_tokens=9, cached_tokens=5, cached_chars=12))  # re-splits lanes
    step(lambda: v.on_join("main", ["a", "b"]))
    step(lambda: v.on_select("main", name="s", choices=["x", "y"], scores=[-1.0, -0.1]))
    for data in _frames(c):
        if data["method"] == "custom":
            _apply_ops(soup, data["content"]["ops"])
    expected = BeautifulSoup(render_run_html(v.model, live=True), "html.parser")
    assert str(soup) == str(expected)
    assert all(d["method"] == "custom" for d in _frames(c))  # incremental, never a full resend
    # token appends carry only the new tokens, not the whole lane
    appends = [op for d in _frames(c) for op in d["content"]["ops"] if op["k"].startswith("seg:a:")]
    assert [BeautifulSoup(op["html"], "html.parser").get_text() for op in appends] == ["a1 ", "a2 ", "a3 ", "a4 "]


def test_frames_never_exceed_max_hz(comms, shell):
    clock = Clock()
    v = RunView("t", clock=clock, max_hz=20, session=Tally())
    with capture_output():
        v.show()
    c = _run_comm(comms)
    v.on_fork("main", ["a", "b", "c"])
    for ms in range(1, 1001):  # a token per lane every millisecond for one second
        clock.ms = ms
        for lane in "abc":
            v.on_delta(lane, "x", token_ids=[1])
    # 1 s at one frame per >= 50 ms: at most 1000 / 50 = 20 frames
    assert 1 <= len(_frames(c)) <= 20
    assert v.frames == len(_frames(c))
    clock.ms = 1049
    v.tick()  # 49 ms after the last frame: held back
    assert len(_frames(c)) == v.frames
    with capture_output():
        b = v.finish()
    assert [ln["segments"][0]["text"] for ln in b[VIEW_MIME]["lanes"][1:]] == ["x" * 1000] * 3


def test_snapshot_frames_carry_the_whole_view_and_status(comms, shell):
    clock = Clock()
    v = RunView("t", clock=clock, snapshot_s=1.0, session=Tally())
    with capture_output():
        v.show()
    c = _run_comm(comms)
    clock.ms = 1000
    v.on_text("main", "hello")
    update = _frames(c)[-1]
    assert update["method"] == "update"
    assert update["state"]["snapshot"]["seq"] == 1 and "hello" in update["state"]["snapshot"]["html"]


def test_stop_click_sets_the_flag_calls_abort_and_shows_stopping(comms, shell):
    aborted = []
    clock = Clock()
    v = RunView("t", clock=clock, on_stop=lambda: aborted.append(threading.get_ident()), session=Tally())
    with capture_output():
        v.show()
    c = _run_comm(comms)
    # the frontend's click arrives as a comm_msg on a kernel thread (a subshell in JupyterLab >= 4.4)
    msg = {"content": {"comm_id": c.comm_id, "data": {"method": "custom", "content": {"action": "stop"}}},
           "buffers": []}
    t = threading.Thread(target=c.handle_msg, args=(msg,))
    t.start()
    t.join()
    assert v.stop_requested.is_set() and aborted == [t.ident]
    clock.ms = 100
    v.tick()  # the main thread's next frame reports it
    assert _frames(c)[-1]["state"]["status"] == "stopping"
    with capture_output():
        b = v.finish("interrupted")
    assert "lmnb-interrupted" in b["text/html"]
    c.handle_msg(msg)  # a late click (queued until the cell ended) does nothing
    assert len(aborted) == 1


def test_finish_replaces_the_live_output_in_place(comms, shell):
    v = RunView("t", session=Tally())
    with capture_output() as cap:
        v.show()
        v.on_text("main", "ab")
        v.on_prompt("main", prompt_tokens=2, cached_tokens=1, cached_chars=1)
        v.on_fork("main", ["a", "b"])
        bundle = v.finish()
    first, last = cap.outputs[0], cap.outputs[-1]
    assert WIDGET_MIME in first.data and first.data[WIDGET_MIME]["model_id"] == _run_comm(comms).comm_id
    assert "text/html" in first.data  # a note for frontends without widgets
    # and a text one for terminals (jupyter-run printed the widget's repr, "<...LiveRunWidget object at 0x...>")
    assert first.data["text/plain"] == ("lmnb run in progress: the live view needs Jupyter widgets; the result "
                                        "replaces this note when the cell finishes.")
    assert not first.update and last.update
    assert last.transient["display_id"] == first.transient["display_id"] == v.display_id
    assert last.data == bundle and WIDGET_MIME not in bundle
    assert set(bundle) == {"text/html", "text/plain", VIEW_MIME}
    assert spans(bundle["text/html"], "lmnb-cached") == ["a"]
    assert len(BeautifulSoup(bundle["text/html"], "html.parser").select("td.lmnb-lane")) == 2
    assert _run_comm(comms).sent[-1][0] == "comm_close"
    # every comm the view opened is closed (the Layout's was left open: one more per live cell)
    assert [c.sent[-1][0] for c in comms] == ["comm_close"] * len(comms) and len(comms) == 2
    assert v.finished and v.finish() is bundle  # idempotent


def test_static_mode_updates_the_display_without_a_widget(comms, shell):
    clock = Clock()
    v = RunView("t", live=False, clock=clock, session=Tally())
    with capture_output() as cap:
        v.show()
        clock.ms = 300
        v.on_text("main", "hello")
        v.finish()
    assert comms == []
    assert [o.update for o in cap.outputs] == [False, True, True]
    assert "hello" in cap.outputs[1].data["text/html"]
    assert len({o.transient["display_id"] for o in cap.outputs}) == 1


def test_a_view_without_updates_shows_once_and_is_replaced_once_by_finish(comms, shell):
    # for captured output (%%capture), where each static frame would be kept and replayed
    clock = Clock()
    v = RunView("t", live=False, updates=False, clock=clock, session=Tally())
    with capture_output() as cap:
        v.show()
        for i in range(5):
            clock.ms += 1000
            v.on_text("main", f"t{i} ")
            v.tick()
        bundle = v.finish()
    assert comms == []
    assert [o.update for o in cap.outputs] == [False, True]
    assert "t0" not in cap.outputs[0].data["text/plain"] and cap.outputs[1].data == bundle
    assert spans(bundle["text/html"], "lmnb-text") == ["t0 ", "t1 ", "t2 ", "t3 ", "t4 "]
    with pytest.raises(ValueError, match=r"updates=False\) needs live=False"):
        RunView("t", live=True, updates=False)


def test_a_live_views_saved_output_says_it_is_unfinished_until_it_finishes(comms, shell):
    """A live view's output had no status in its metadata until finish() replaced it: ``lmnb run``
    under LMNB_VIEW=live saved a view whose last update came too late as if it were final, and
    exited 0 (``unfinished_view`` found nothing to report)."""
    from lmnb_kernel.run import unfinished_view

    v = RunView("t", clock=Clock(), session=Tally())
    with capture_output() as cap:
        v.show()
    [shown] = cap.outputs
    assert unfinished_view({"outputs": [{"metadata": shown.metadata}]}) == "running"
    with capture_output() as cap:
        v.finish("error", error="boom")
    [final] = cap.outputs
    assert final.update and unfinished_view({"outputs": [{"metadata": final.metadata}]}) is None


def test_events_from_another_thread_are_refused():
    v = RunView(live=False, session=Tally())
    errors = []

    def other():
        try:
            v.on_text("main", "x")
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors and "thread that created it" in errors[0]


def test_bad_events_raise_clear_errors():
    v = RunView(live=False, session=Tally())
    with pytest.raises(KeyError, match="unknown lane 'zz'"):
        v.on_delta("zz", "x")
    with pytest.raises(ValueError, match="cached_tokens=5 exceeds prompt_tokens=3"):
        v.on_prompt("main", prompt_tokens=3, cached_tokens=5)
    v.on_fork("main", ["a"])
    with pytest.raises(ValueError, match="lane 'a' already exists"):
        v.on_fork("main", ["a"])
    with pytest.raises(ValueError, match="one score per choice"):
        v.on_select("main", name="s", choices=["x"], scores=[1.0, 2.0])
    with pytest.raises(ValueError, match="finish status='ok'"):
        v.finish("ok")
    with pytest.raises(ValueError, match="max_hz"):
        RunView(max_hz=0)


def test_session_tally_is_shared_by_default():
    before = (SESSION.prompt_tokens, SESSION.cached_tokens)
    v = RunView(live=False)
    v.on_prompt("main", prompt_tokens=4, cached_tokens=3)
    assert (SESSION.prompt_tokens, SESSION.cached_tokens) == (before[0] + 4, before[1] + 3)


# --- radix tree -----------------------------------------------------------------------------------
def test_tree_view_of_a_real_radix_cache_with_locks_and_eviction():
    import torch

    from lmnb_engine.radix_cache import RadixCache

    cache = RadixCache(None, None)
    preview = lambda key: " ".join(map(str, key))
    a = tuple(range(1, 11))  # 10 tokens
    b = a[:5] + (20, 21, 22, 23, 24)  # shares 5 tokens with a
    cache.insert(a, torch.arange(10))
    cache.insert(b, torch.arange(10, 20))
    node_b = cache.match_prefix(b).node
    cache.inc_lock_ref(node_b)  # a running request on b

    tv = TreeView(kv_bytes_per_token=64, clock=lambda: 1e12)
    first = tv.update(cache.snapshot(preview), paths={"s (cell [1])": node_b.id})
    data = first[VIEW_MIME]
    texts = {n["text"]: n for n in data["nodes"]}
    # by hand: root, the shared 5-token prefix (locked via b), the rest of a (5, free), b's tail (5, locked)
    assert sorted((n["text"], n["num_tokens"], n["lock_ref"]) for n in data["nodes"]) == [
        ("", 0, 0), ("1 2 3 4 5", 5, 1), ("20 21 22 23 24", 5, 1), ("6 7 8 9 10", 5, 0)]
    soup = BeautifulSoup(first["text/html"], "html.parser")
    assert soup.select_one(".lmnb-evictable-total").get_text() == "evictable 5 tok (320 B)"  # 5 × 64
    path_badges = soup.select(".lmnb-path")
    assert [p.get_text() for p in path_badges] == ["s (cell [1])"]
    assert "20 21 22 23 24" in path_badges[0].find_parent(class_="lmnb-node").get_text()
    assert len(soup.select(".lmnb-locked")) == 2

    assert cache.evict(100) == 5  # only a's unlocked tail can go
    second = tv.update(cache.snapshot(preview))
    assert [n["text"] for n in second[VIEW_MIME]["evicted"]] == ["6 7 8 9 10"]
    soup = BeautifulSoup(second["text/html"], "html.parser")
    ghost = soup.select(".lmnb-node.lmnb-evicted")
    assert len(ghost) == 1 and "6 7 8 9 10" in ghost[0].get_text()
    assert "opacity:0.45" in ghost[0]["style"]
    assert texts["1 2 3 4 5"]["id"] in {n["id"] for n in second[VIEW_MIME]["nodes"]}
    assert soup.select_one(".lmnb-evictable-total").get_text() == "evictable 0 tok (0 B)"
    assert "[evicted]" in second["text/plain"]


def test_tree_view_of_a_path_thousands_of_nodes_deep():
    # a prompt grown a token at a time, each with its own next token, makes such a path: %lm tree
    # (flatten) and repr() of the snapshot recursed once per level and raised RecursionError
    import torch

    from lmnb_engine.radix_cache import RadixCache
    from lmnb_kernel.widgets.render_tree import MAX_NODES

    depth = 1500
    cache = RadixCache(None, None)
    for k in range(1, depth + 1):
        cache.insert([5] * k + [7], torch.zeros(k + 1, dtype=torch.int64))
    view = cache.snapshot(lambda key: "")
    assert len(repr(view)) < 200
    bundle = TreeView(clock=lambda: 1e12).update(view)
    # root, depth - 1 one-token [5] nodes each with a [7] leaf, and the last leaf [5, 7]
    assert len(bundle[VIEW_MIME]["nodes"]) == 2 * depth
    soup = BeautifulSoup(bundle["text/html"], "html.parser")
    assert len(soup.select(".lmnb-node")) == MAX_NODES  # rows rendered; the rest summarised
    assert bundle["text/plain"].startswith(f"radix tree: {2 * depth - 1} nodes")


def test_a_deep_path_is_indented_up_to_max_indent_levels_then_numbered():
    """Each level was indented 18 px more (2 spaces in the text): a path 400 rows deep was a
    staircase 7000 px wide."""
    from lmnb_kernel.widgets.render_tree import MAX_INDENT

    # a chain: root, then node k (k tokens deep) with a leaf "x" beside its child
    recs = [{"node_id": 0, "parent_id": None, "num_tokens": 0}]
    for k in range(1, 300):
        recs += [{"node_id": k, "parent_id": k - 1, "num_tokens": 1, "text": f"n{k}"},
                 {"node_id": f"x{k}", "parent_id": k - 1, "num_tokens": 1, "text": "x"}]
    bundle = TreeView(clock=lambda: 0.0).update(recs)
    soup = BeautifulSoup(bundle["text/html"], "html.parser")
    widest, deepest = 0, 0
    for node in soup.select(".lmnb-node"):
        uls = node.find_parents("ul")
        indent = sum(int(re.search(r"padding-left:(\d+)px", ul["style"]).group(1)) for ul in uls)
        widest = max(widest, indent)
        depth = len(uls) - 1  # (the outermost list holds the root, depth 0)
        mark = node.select_one(".lmnb-depth")
        assert (mark.get_text() if mark else None) == (f"depth {depth}" if depth > MAX_INDENT else None)
        deepest = max(deepest, depth)
    assert widest == 4 + 18 * MAX_INDENT and deepest > 100
    rows = bundle["text/plain"].splitlines()[1:-1]
    depths = [int(m.group(1)) if (m := re.match(r" *\[depth (\d+)\] ", r)) else (len(r) - len(r.lstrip())) // 2
              for r in rows]
    assert max(len(r) - len(r.lstrip()) for r in rows) == 2 * MAX_INDENT and max(depths) > 100
    assert all(b <= a + 1 for a, b in zip(depths, depths[1:]))  # (a row is at most one level below the last)


def _tree(texts=None):
    """root → 1 → 2 → 3, then 3 → 4 → 5 (both locked) and 3 → 6 → 7 (7 locked): by hand, the
    rows are root, 1-3, 4-5, 6 and 7."""
    texts = texts or {1: "The ", 2: "cat ", 3: "sat", 4: " on", 5: " mat", 6: " down", 7: "."}
    shape = {1: (0, 2, 0, 10.0), 2: (1, 2, 0, 30.0), 3: (2, 1, 0, 20.0), 4: (3, 1, 1, 50.0), 5: (4, 2, 1, 50.0),
             6: (3, 1, 0, 40.0), 7: (6, 1, 1, 60.0)}  # id: (parent, tokens, lock_ref, last access)
    return [{"node_id": 0, "parent_id": None, "num_tokens": 0}] + [
        {"node_id": i, "parent_id": p, "num_tokens": t, "text": texts[i], "lock_ref": lock, "last_access": at}
        for i, (p, t, lock, at) in shape.items()]


def test_a_chain_of_single_child_nodes_is_one_row_in_the_html_and_the_text():
    # each node was a row, one level deeper than its parent: a path of single-child nodes (a
    # sibling evicted, or each turn of a chat its own node) was a staircase of rows
    bundle = TreeView(kv_bytes_per_token=10, clock=lambda: 100.0).update(_tree(), paths={"s": 5})
    assert bundle["text/plain"].splitlines() == [
        "radix tree: 7 nodes",
        "root (0 tok, lock 0)",
        "  'The cat sat' (5 tok in 3 nodes, lock 0)",
        "    ' on mat' (3 tok in 2 nodes, lock 1) <s>",
        "    ' down' (1 tok, lock 0)",  # (its child is locked: another row)
        "      '.' (1 tok, lock 1)",
    ]
    soup = BeautifulSoup(bundle["text/html"], "html.parser")
    rows = soup.select(".lmnb-node")
    assert [r.select_one(".lmnb-node-text").get_text() for r in rows] == [
        "root", "'The cat sat'", "' on mat'", "' down'", "'.'"]
    chained = rows[1].get_text()
    assert rows[1]["title"] == "nodes 1, 2, 3 · on paths: s"
    assert "5 tok" in chained and "3 nodes" in chained and "age 70.0 s" in chained  # the newest access: 30 s
    assert "evictable 50 B" in chained  # 5 tokens × 10 bytes
    assert [len(r.find_parents("ul")) for r in rows] == [1, 2, 3, 3, 4]  # a level per row, not per node
    assert [b.get_text() for b in rows[2].select(".lmnb-path")] == ["s"]


def test_a_chain_stops_where_a_path_ends_and_after_a_cut_preview():
    text = TreeView(clock=lambda: 100.0).update(_tree(), paths={"p": 2})["text/plain"].splitlines()
    assert text[2:4] == ["  'The cat ' (4 tok in 2 nodes, lock 0) <p>", "    'sat' (1 tok, lock 0)"]
    texts = {1: "The long …", 2: "cat ", 3: "sat", 4: " on", 5: " mat", 6: " down", 7: "."}
    text = TreeView(clock=lambda: 100.0).update(_tree(texts))["text/plain"].splitlines()
    assert text[2] == "  'The long …' (5 tok in 3 nodes, lock 0)"  # (not "…cat sat": the edge text was cut)


def test_tree_view_refresh_updates_the_same_display(shell, monkeypatch):
    from IPython.core.displaypub import DisplayPublisher

    class Recording(DisplayPublisher):  # (as a kernel's: each publish is sent, an update too)
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False):
            sent.append({"data": data, "transient": transient, "update": update})

    recs = [{"node_id": 0, "parent_id": None, "num_tokens": 0},
            {"node_id": 1, "parent_id": 0, "num_tokens": 3, "text_preview": "abc", "pinned": True}]
    tv, sent = TreeView(), []
    monkeypatch.setattr(shell, "display_pub", Recording())
    tv.show(recs)
    tv.refresh(recs[:1])
    assert [o["update"] for o in sent] == [False, True]
    assert sent[0]["transient"]["display_id"] == sent[1]["transient"]["display_id"] == tv.display_id
    assert "lmnb-pinned" in sent[0]["data"]["text/html"]
    assert "lmnb-evicted" in sent[1]["data"]["text/html"]
    with pytest.raises(ValueError, match="no field 'num_tokens'"):
        tv.update([{"node_id": 5}])


def test_a_captured_tree_view_is_one_output_replaced_by_each_refresh(shell):
    """Captured, each refresh was kept as one more output; and a tree shown before the capture put
    its refreshes into it."""
    recs = [{"node_id": 0, "parent_id": None, "num_tokens": 0},
            {"node_id": 1, "parent_id": 0, "num_tokens": 3, "text_preview": "abc", "pinned": True}]
    tv = TreeView()
    with capture_output() as cap:
        tv.show(recs)
        tv.refresh(recs)
        last = tv.refresh(recs[:1])
    [tree] = cap.outputs
    assert not tree.update and tree.data == last and tree.transient["display_id"] == tv.display_id
    assert "lmnb-evicted" in tree.data["text/html"]
    with capture_output() as cap:
        tv.refresh(recs)
    assert cap.outputs == []


def test_kv_bytes_per_token_counts_k_and_v_of_every_layer():
    from lmnb_kernel.widgets import kv_bytes_per_token

    # 2 (K, V) x 4 layers x 2 kv heads x 16 head dim x 2 bytes (bf16) = 512
    assert kv_bytes_per_token({"num_layers": 4, "num_kv_heads": 2, "head_dim": 16, "dtype": "bfloat16"}) == 512
    with pytest.raises(ValueError, match="unknown KV dtype"):
        kv_bytes_per_token({"num_layers": 1, "num_kv_heads": 1, "head_dim": 1, "dtype": "complex64"})


def test_age_and_math_helpers():
    from lmnb_kernel.widgets.html import human_bytes, pct

    assert human_bytes(1536) == "1.5 KiB" and human_bytes(100) == "100 B"
    assert pct(0.5) == "50.0%" and pct(None) == "–" and pct(math.nan) == "–"


def test_tree_view_cut_at_max_nodes_counts_every_hidden_node():
    # a root with 10 children of 49 leaves each: 501 nodes, 400 rendered. The "… N more nodes not
    # shown" notes counted hidden siblings only (said 3 of the 101 hidden nodes), and the text view
    # was cut with no note at all
    from lmnb_kernel.widgets.render_tree import MAX_NODES, render_tree_html, render_tree_text
    from lmnb_kernel.widgets.tree import TreeHistory, flatten

    recs = [{"node_id": 0, "parent_id": None, "num_tokens": 0}]
    for i in range(10):
        recs.append({"node_id": f"c{i}", "parent_id": 0, "num_tokens": 1, "text": f"c{i}"})
        recs += [{"node_id": f"c{i}g{j:02d}", "parent_id": f"c{i}", "num_tokens": 1, "text": "g"} for j in range(49)]
    history = TreeHistory()
    history.update(flatten(recs))
    soup = BeautifulSoup(render_tree_html(history, now=0.0), "html.parser")
    notes = [int(n) for n in re.findall(r"… (\d+) more nodes not shown", soup.get_text())]
    assert len(soup.select(".lmnb-node")) == MAX_NODES
    assert sum(notes) == 501 - MAX_NODES  # 101, by hand
    text = render_tree_text(history).splitlines()
    assert text[-1] == f"… {501 - MAX_NODES} more nodes not shown"
    assert len(text) == 1 + MAX_NODES + 1  # header, rows, the note


def test_a_long_prompt_is_saved_whole_once():
    # a failed cell with a 1 MB prompt saved it twice: whole in the view's JSON and again whole in
    # text/plain (the HTML already kept head and tail only)
    from lmnb_kernel.widgets.render_run import TEXT_HEAD, TEXT_TAIL

    prompt = "".join(f"{i:07d} " for i in range(125_000))  # 1,000,000 characters, no two parts alike
    v = RunView(live=False, session=Tally())
    v.on_text("main", prompt)
    bundle = v.finish("error", error=ValueError("prompt of 250000 tokens exceeds the model's context length"))
    assert bundle[VIEW_MIME]["lanes"][0]["segments"][0]["text"] == prompt
    hidden = 1_000_000 - TEXT_HEAD - TEXT_TAIL
    shown = prompt[:TEXT_HEAD] + f" … {hidden:,} characters not shown … " + prompt[-TEXT_TAIL:]
    lines = bundle["text/plain"].splitlines()
    assert lines[2:4] == ["error: ValueError: prompt of 250000 tokens exceeds the model's context length",
                          "── main ──"]
    assert lines[4] == shown and len(lines) == 5
    assert "0062500 " not in bundle["text/plain"] + bundle["text/html"]  # (the middle is in the JSON alone)


@pytest.mark.parametrize("status", ["done", "error", "interrupted"])
def test_the_widgets_last_state_has_the_runs_final_status(comms, shell, status):
    # the last update before the comm closed set only the snapshot: the model (and what nbclient
    # saves of it) stayed "running", or "stopping" after a Stop click
    v = RunView("t", session=Tally())
    with capture_output():
        v.show()
        v.on_text("main", "ab")
        v._request_stop()
        v.finish(status)
    sent = _run_comm(comms).sent
    assert sent[-1][0] == "comm_close"
    state: dict = {}
    for kind, data in sent:
        if kind == "comm_msg" and data.get("method") == "update":
            state.update(data["state"])
    assert state["status"] == status and state["snapshot"]["html"] == ""


def test_a_stop_click_after_the_view_closed_is_ignored_without_a_warning(comms, shell, caplog):
    # a click handled after the cell ended printed "No such comm: ID" (comm's warning) on the
    # cell's stderr, twice on a subshell; another unknown comm still warns
    import logging

    v = RunView("t", session=Tally())
    with capture_output():
        v.show()
        v.finish()
    closed = _run_comm(comms).comm_id
    manager = comm.get_comm_manager()
    with caplog.at_level(logging.WARNING, logger="Comm"):
        assert manager.get_comm(closed) is None and manager.get_comm(closed) is None
        assert caplog.messages == []
        assert manager.get_comm("not-a-view") is None
    assert caplog.messages == ["No such comm: not-a-view"]
