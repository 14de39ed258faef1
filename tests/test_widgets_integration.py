"""Issue 7's views fed by real ``%%lm`` cells: what lmnb's program events carry reaches the view.

Each cell runs through the ``%%lm`` magic in an in-process IPython shell on a tiny checkpoint;
the final static bundle (``VIEW_MIME`` data and HTML) is read as a saved notebook would hold it.
Expected values come from the engine asked directly with the prompt the cell builds (greedy
decoding is deterministic), from ``jsonschema`` / ``re`` on the captured values, and from token
counts of the tree snapshot, never from the view code under test.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from helpers_shell import lm_shell
from bs4 import BeautifulSoup
from IPython.utils.capture import capture_output

from lmnb_engine import SamplingParams
from lmnb_kernel.session import get_session
from lmnb_kernel.widgets import VIEW_MIME

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}}, "required": ["name"]}


@pytest.fixture(scope="module")
def ip(tiny_llama):
    with lm_shell(tiny_llama) as shell:
        yield shell


def run(ip, code: str):
    with capture_output() as out:
        result = ip.run_cell(code)
    assert result.success, out.stdout + str(result.error_in_exec)
    return out


def final_view(out) -> tuple[dict, str]:
    """(VIEW_MIME data, text/html) of the cell's run view as it ended (its last display update)."""
    bundle = [o.data for o in out.outputs if VIEW_MIME in o.data and o.data[VIEW_MIME].get("kind") == "run"][-1]
    assert bundle[VIEW_MIME]["status"] == "done"
    return bundle[VIEW_MIME], bundle["text/html"]


def engine():
    return get_session().backend().engine


def reference(prompt: str, **params):
    """The engine's own greedy result for ``prompt``, with the chat template's stops lmnb adds to
    an unconstrained gen."""
    constrained = "regex" in params or "json_schema" in params
    stop = None if constrained else list(get_session().backend().get_chat_template().stop_str) or None
    return engine().generate(prompt, SamplingParams(temperature=0, stop=stop, **params))


def gen_segments(view: dict) -> list[dict]:
    return [s for ln in view["lanes"] for s in ln["segments"] if s["kind"] == "gen"]


def test_json_schema_gen_shows_validity_and_jump_forward_savings(ip):
    ip.user_ns["schema"] = SCHEMA
    out = run(ip, '%%lm --static --temperature 0\nGive JSON:{gen obj json_schema=schema max_tokens=30}\n'
                  'Num:{gen n regex="[0-9]+" max_tokens=4}')
    view, html = final_view(out)
    ref = reference("Give JSON:", max_new_tokens=30, json_schema=json.dumps(SCHEMA))
    obj_text = ip.user_ns["obj"]
    assert obj_text == ref.text
    recs = {r["name"]: r for r in view["structured"]}
    # validity as jsonschema itself judges the captured output
    valid = jsonschema.Draft202012Validator(SCHEMA).is_valid(json.loads(obj_text))
    assert valid and recs["obj"]["kind"] == "json" and recs["obj"]["valid"] is True
    # jump-forward: the schema forces '{"name":"', so tokens were jumped and passes saved
    assert ref.meta.jumped_tokens > 0
    assert recs["obj"]["jump"] == {
        "completion_tokens": ref.meta.completion_tokens, "forward_passes": ref.meta.forward_passes,
        "jumped_tokens": ref.meta.jumped_tokens,
        "passes_saved": ref.meta.completion_tokens - ref.meta.forward_passes}
    assert recs["n"]["regex"] == "[0-9]+"
    assert recs["n"]["regex_match"] is (re.fullmatch("[0-9]+", ip.user_ns["n"]) is not None)
    soup = BeautifulSoup(html, "html.parser")
    assert soup.select(".lmnb-valid")
    assert f"{ref.meta.jumped_tokens} tokens jumped" in " ".join(el.get_text() for el in soup.select(".lmnb-jump"))


def test_token_tooltips_carry_the_engines_token_ids_and_logprobs(ip):
    out = run(ip, "%%lm --static --temperature 0\nHello:{gen a max_tokens=6 return_logprob=True}")
    view, html = final_view(out)
    ref = reference("Hello:", max_new_tokens=6, return_logprob=True)
    [seg] = gen_segments(view)
    assert seg["n_tokens"] == len(ref.token_ids) and seg["text"] == ref.text
    # one tooltip a token: "'text' · id N · logprob L (p=P)", L to 4 decimals
    titles = [el["title"] for el in BeautifulSoup(html, "html.parser").select(".lmnb-tok")]
    tips = [re.fullmatch(r".* · id (\d+) · logprob (-?\d+\.\d{4}) \(p=[\d.]+\)", t, re.S) for t in titles]
    assert [int(m[1]) for m in tips] == ref.token_ids
    assert [float(m[2]) for m in tips] == pytest.approx([lp.logprob for lp in ref.logprobs], abs=1e-4)


def test_unnamed_gen_and_select_requests_count_in_the_cell(ip):
    prompt = "Story:"
    before = engine().cache_stats()
    out = run(ip, f'%%lm --static --temperature 0\n{prompt}{{gen max_tokens=3}}\nPick:{{select best choices=[" cat", " dog"]}}')
    after = engine().cache_stats()
    view, _ = final_view(out)
    ref = reference(prompt, max_new_tokens=3)
    [meta] = [o.metadata["lmnb"] for o in out.outputs if "tokens" in (o.metadata or {}).get("lmnb", {})]
    assert meta["tokens"]["completion_tokens"] == ref.meta.completion_tokens  # the unnamed gen's tokens
    # every request the cell made is counted: the engine's own counters moved by exactly as much
    assert meta["tokens"]["prompt_tokens"] == after["prompt_tokens"] - before["prompt_tokens"]
    assert meta["tokens"]["cached_tokens"] == after["cached_tokens"] - before["cached_tokens"]
    gen_req, prefill_req, sel_req = view["requests"]
    assert gen_req["name"] is None and gen_req["prompt_tokens"] == ref.meta.prompt_tokens
    [gen] = gen_segments(view)
    assert (gen["text"], gen["n_tokens"]) == (ref.text, len(ref.token_ids))
    # the select prefills its prompt, then scores each choice over the whole prompt + choice
    text = prompt + ref.text + "\nPick:"
    assert prefill_req["prompt_tokens"] == len(engine().encode(text))
    assert sel_req["name"] == "best"
    assert sel_req["prompt_tokens"] == sum(len(engine().encode(text + c)) for c in (" cat", " dog"))
    # "Pick:" was in no earlier prompt, so its KV cannot have come from the cache
    [pick] = [s for s in view["lanes"][0]["segments"] if "Pick:" in s["text"]]
    assert pick["kind"] == "text" and pick["cache"] == "computed"


def test_tree_labels_named_state_paths_and_pinned_nodes(ip):
    run(ip, "%lm reset")
    run(ip, "%%lm --static --temperature 0 --state notes\nUser: keep this\nBot:{gen r max_tokens=4}")
    run(ip, "%lm pin notes")
    with capture_output() as out:
        assert ip.run_cell("%lm tree").success
    shown = [o.data for o in out.outputs if VIEW_MIME in o.data]  # %lm tree, replaced by the post-cell refresh
    tree = shown[-1][VIEW_MIME]
    ids = engine().encode(get_session().states["notes"].state.text())
    [label] = [k for k in tree["paths"] if k.startswith("notes")]
    nodes = {n["id"]: n for n in tree["nodes"]}
    end = nodes[tree["paths"][label]]
    depth, node = 0, end
    while node["parent"] is not None:  # tokens from the root to the labelled node
        depth, node = depth + node["num_tokens"], nodes[node["parent"]]
    # the pin locks exactly the state's tokens, so the state's path ends at the pinned node
    assert depth == len(ids) and end["pinned"] and end["lock_ref"] >= 1
    assert [n["id"] for n in tree["nodes"] if n["pinned"]] == [end["id"]]
    assert f"<{label}>" in shown[-1]["text/plain"]
    run(ip, "%lm unpin notes")


def test_match_node_leaves_the_tree_and_its_lru_times_alone(ip):
    run(ip, "%%lm --static --temperature 0\nA fairly long shared prefix of words{gen x max_tokens=2}")
    eng = engine()

    def flat(view):
        out = [(view.node_id, view.num_tokens, view.last_access_time)]
        for c in view.children:
            out += flat(c)
        return out

    snap = eng.tree_snapshot()
    before = flat(snap)
    ids = eng.encode("A fairly long shared prefix")
    node, n = eng.match_node(ids)
    assert flat(eng.tree_snapshot()) == before  # no split, no access time refreshed
    assert n == len(ids)
    parents = {}
    stack = [snap]
    while stack:
        v = stack.pop()
        parents[v.node_id] = (v.parent_id, v.num_tokens)
        stack.extend(v.children)
    depth, nid = 0, node
    while nid is not None:
        depth, nid = depth + parents[nid][1], parents[nid][0]
    assert depth - parents[node][1] < n < depth  # the prefix ends inside the node's edge
    run(ip, "%lm flush")
    assert eng.match_node(ids) is None


def test_two_forks_in_one_cell_each_get_their_own_lanes(ip):
    """The second fork's branches used the first fork's lane ids ("b0", "b1"): the view refused
    them and the second fork's text was lost from it (or drawn in the first fork's lanes)."""
    import warnings

    cell = "%%lm --static --temperature 0\nA:{fork 2}{gen x max_tokens=2}{join}\nB:{fork 2}{gen y max_tokens=2}{join}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failing view is reported as a UserWarning
        out = run(ip, cell)
    view, _ = final_view(out)
    lanes = {ln["id"]: "".join(s["text"] for s in ln["segments"]) for ln in view["lanes"]}
    xs, ys = ip.user_ns["x"], ip.user_ns["y"]
    assert len(lanes) == 5  # main + two branches per fork
    branch_texts = sorted(t for k, t in lanes.items() if k != "main")
    assert branch_texts == sorted(xs + ys)  # each branch lane holds exactly its own gen
