"""The paper's workloads (SGLang §6, research runtime_bench §4.2) as token-level programs on
synthetic data of the same token shapes: no downloads, deterministic from a seed.

A program is a function ``run(client, item)`` that talks to a ``Client`` (``benches/clients.py``)
the way the lmnb interpreter talks to a backend: ``gen`` (one generation), ``gen_many`` (a fork:
branches submitted together), ``prefill`` (the frontend hint of §3: a shared prefix sent on its
own before the branches) and ``select`` (the normalized prompt logprob of each choice). Prompts
are token ids, so every system sees exactly the same tokens and the hit rate is not blurred by
retokenization. Outputs have fixed lengths (``ignore_eos``); stop strings become token budgets.

Each ``Workload`` also records the shape it mirrors; ``optimal_hit_rate`` is paper A.3's bound.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

# The JSON field regexes of SGLang's json_decode_regex benchmark (string, float, int, list).
REGEX_STR = r'"[\w\d\s]{1,16}"'
REGEX_FLOAT = r"[-+]?[0-9]{1,4}\.[0-9]{1,4}"
REGEX_INT = r"[0-9]{1,9}"
REGEX_LIST = r'\["[\w\d\s]{1,16}"(, "[\w\d\s]{1,16}"){0,2}\]'


class Client(Protocol):
    """What a program needs from a system under test (lmnb engine or HF baseline)."""

    def gen(self, prompt: list[int], max_new_tokens: int, regex: str | None = None) -> list[int]: ...

    def gen_many(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]: ...

    def prefill(self, prompts: list[list[int]]) -> None: ...

    def select(self, prefix: list[int], choices: list[list[int]]) -> int: ...


@dataclass(frozen=True)
class Scale:
    """Sizes of every workload. ``FULL`` is for one H200 within the suite's time budget;
    ``SMOKE`` runs on a CPU in seconds. Token lengths are ranges ``(lo, hi)`` drawn uniformly."""

    mmlu_subjects: int = 4
    mmlu_questions: int = 64  # per subject
    mmlu_prefix: int = 1500  # tokens of the 5-shot block (SGLang caps it at 1536)
    mmlu_question: tuple[int, int] = (50, 70)
    hella_questions: int = 64
    hella_shot: tuple[int, int] = (50, 70)  # tokens per worked example (20 of them)
    hella_context: tuple[int, int] = (30, 50)
    hella_ending: tuple[int, int] = (15, 30)
    chat_short_programs: int = 32
    chat_long_programs: int = 8
    chat_turn: tuple[int, int] = (256, 512)  # user tokens per turn (paper: 256-512)
    chat_short_out: tuple[int, int] = (4, 8)
    chat_long_out: tuple[int, int] = (256, 512)
    tot_questions: int = 4
    tot_question: tuple[int, int] = (80, 160)
    tot_gen: int = 128  # SGLang: 256
    sot_topics: int = 16
    sot_fewshot: int = 300
    sot_tip: int = 24
    sot_expand: int = 128
    judge_articles: int = 8
    judge_article: tuple[int, int] = (600, 1000)
    judge_gen: int = 256
    json_docs: int = 16
    json_doc: tuple[int, int] = (600, 1000)
    react_questions: int = 16
    react_header: int = 1500
    react_steps: tuple[int, int] = (3, 5)
    react_gen: int = 48  # SGLang: up to 200, stop at "Observation"
    react_observation: tuple[int, int] = (40, 80)
    parallel: int = 64  # throughput concurrency (capped by each workload's program count)
    latency_programs: int = 2


FULL = Scale()
SMOKE = Scale(
    mmlu_subjects=2, mmlu_questions=4, mmlu_prefix=48, mmlu_question=(6, 10),
    hella_questions=3, hella_shot=(3, 5), hella_context=(4, 6), hella_ending=(2, 4),
    chat_short_programs=3, chat_long_programs=2, chat_turn=(8, 16), chat_short_out=(2, 3), chat_long_out=(6, 8),
    tot_questions=1, tot_question=(8, 12), tot_gen=3, sot_topics=2, sot_fewshot=24, sot_tip=3, sot_expand=4,
    judge_articles=2, judge_article=(24, 40), judge_gen=4, json_docs=2, json_doc=(24, 40),
    react_questions=2, react_header=48, react_steps=(2, 3), react_gen=4, react_observation=(4, 8),
    parallel=4, latency_programs=1,
)


@dataclass
class Workload:
    """One benchmark: its programs' data and the program that runs one item.

    ``shape`` says what it mirrors and how it differs from SGLang's benchmark; ``notes`` lists
    features a baseline may lack (e.g. regex constraints).
    """

    name: str
    items: list[Any]
    run: Callable[[Client, Any], None]
    parallel: int
    latency_programs: int
    shape: str
    uses_regex: bool = False
    params: dict = field(default_factory=dict)


class _Tokens:
    """Random token ids in ``[lo, hi)`` from one seeded generator."""

    def __init__(self, vocab: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lo, self.hi = 10, vocab  # keep clear of the special tokens at the start
        self._pool = range(self.lo, self.hi)

    def n(self, count: int) -> list[int]:
        return self.rng.choices(self._pool, k=count)

    def span(self, bounds: tuple[int, int]) -> list[int]:
        return self.n(self.rng.randint(*bounds))

    def between(self, bounds: tuple[int, int]) -> int:
        return self.rng.randint(*bounds)


def optimal_hit_rate(requests: list[tuple[list[int], list[int]]]) -> float:
    """Paper A.3's bound on the hit rate: put every request in one radix tree (a trie of token
    ids); an ideal cache computes each tree position that occurs in a prompt once, except
    positions some request decoded (their KV exists before any later prompt repeats them, as in
    multi-turn chat). ``requests`` are (prompt, output) pairs; the last output token has no KV
    yet when a request ends, so it does not count as decoded.

    Returns ``1 - computed prompt positions / prompt tokens``."""
    root: list = [{}, False, False]  # [children, in a prompt, decoded]
    total = 0
    for prompt, output in requests:
        total += len(prompt)
        node = root
        for i, tok in enumerate(prompt + output[:-1]):
            child = node[0].get(tok)
            if child is None:
                child = node[0][tok] = [{}, False, False]
            if i < len(prompt):
                child[1] = True
            else:
                child[2] = True
            node = child
    computed, stack = 0, [root]
    while stack:
        node = stack.pop()
        computed += node[1] and not node[2]
        stack.extend(node[0].values())
    return 1.0 - computed / total if total else 0.0


# --- the programs ------------------------------------------------------------------------------

def _mmlu(c: Client, item) -> None:
    prefix, question = item
    c.gen(prefix + question, 1)


def _hellaswag(c: Client, item) -> None:
    prefix, context, endings = item
    c.select(prefix + context, endings)


def _chat(c: Client, item) -> None:
    prompt: list[int] = []
    for turn, n_out in item:
        prompt = prompt + turn
        prompt = prompt + c.gen(prompt, n_out)


def _tree_of_thought(c: Client, item) -> None:
    """fork(3) plan -> each fork(3) execute -> each fork(3) reflect: 3 + 9 + 27 generations."""
    base, stages, markers, n_gen = item
    frontier = [base]
    for stage in stages:  # plan, execute, reflect
        shared = [p + stage for p in frontier]
        c.prefill(shared)  # the frontend hint: the fork's common prefix goes first
        branches = [s + [m] for s in shared for m in markers]
        frontier = [b + out for b, out in zip(branches, c.gen_many(branches, n_gen))]


def _skeleton_of_thought(c: Client, item) -> None:
    """Tips one after another on the main prompt; each tip's expansion starts as soon as the tip
    exists (a separate program over a few-shot prompt) and all are joined at the end."""
    head, tip_markers, fewshot, topic, n_tip, n_expand, pool = item
    prompt = head
    pending = []
    for marker in tip_markers:
        prompt = prompt + marker
        tip = c.gen(prompt, n_tip)
        prompt = prompt + tip
        pending.append(pool.submit(c.gen, fewshot + topic + tip, n_expand))
    for marker, job in zip(tip_markers, pending):
        prompt = prompt + marker + job.result()


def _llm_judge(c: Client, item) -> None:
    """Branch-solve-merge: fork(6) judgments of one article, join, then a 2-token score."""
    article, dims, summary, n_gen = item
    c.prefill([article])
    branches = [article + d for d in dims]
    judgments = c.gen_many(branches, n_gen)
    merged = article + [t for d, j in zip(dims, judgments) for t in d + j] + summary
    c.gen(merged, 2)


def _json_regex(c: Client, item) -> None:
    doc, fields = item
    prompt = doc
    for literal, regex, n in fields:
        prompt = prompt + literal
        prompt = prompt + c.gen(prompt, n, regex=regex)


def _react(c: Client, item) -> None:
    header, question, steps, n_gen = item
    prompt = header + question
    for thought_marker, observation in steps:
        prompt = prompt + thought_marker
        prompt = prompt + c.gen(prompt, n_gen) + observation


def build(vocab: int, scale: Scale, seed: int = 0, encode: Callable[[str], list[int]] | None = None,
          thread_pool: Any = None) -> list[Workload]:
    """All workloads for a model with ``vocab`` token ids.

    Args:
        vocab: token ids are drawn from ``[10, vocab)``.
        scale: ``FULL`` or ``SMOKE`` (or a custom ``Scale``).
        encode: text -> ids for the JSON literals (``{"name": ...``); random ids if None.
        thread_pool: an executor for skeleton-of-thought's asynchronous expansions (required to
            run that workload; its size bounds the expansions in flight).
    """
    tok = _Tokens(vocab, seed)
    s = scale
    par = lambda n: max(1, min(s.parallel, n))  # noqa: E731 - tiny local helper
    out: list[Workload] = []

    prefixes = [tok.n(s.mmlu_prefix) for _ in range(s.mmlu_subjects)]
    items = [(p, tok.span(s.mmlu_question)) for p in prefixes for _ in range(s.mmlu_questions)]
    tok.rng.shuffle(items)  # subjects interleaved, as a batch over a mixed test set would be
    out.append(Workload("mmlu", items, _mmlu, par(len(items)), s.latency_programs,
                        f"{s.mmlu_subjects} subjects x {s.mmlu_questions} questions, 5-shot prefix {s.mmlu_prefix} "
                        f"tokens, question {s.mmlu_question}, 1 token out (SGLang mmlu, --nsub)"))

    shots = [i for _ in range(20) for i in tok.span(s.hella_shot)]
    items = [(shots, tok.span(s.hella_context), [tok.span(s.hella_ending) for _ in range(4)])
             for _ in range(s.hella_questions)]
    out.append(Workload("hellaswag", items, _hellaswag, par(len(items)), s.latency_programs,
                        f"20-shot prefix ({len(shots)} tokens) + context {s.hella_context} + select over 4 endings "
                        f"{s.hella_ending} (prefix hint, then 4 scored continuations)"))

    chats = []
    for name, n, outs in (("chat_short", s.chat_short_programs, s.chat_short_out),
                          ("chat_long", s.chat_long_programs, s.chat_long_out)):
        items = [[(tok.span(s.chat_turn), tok.between(outs)) for _ in range(4)] for _ in range(n)]
        chats.append(Workload(name, items, _chat, par(n), s.latency_programs if name == "chat_short" else 1,
                              f"4 turns, user {s.chat_turn} tokens per turn, answers {outs} tokens "
                              "(SGLang multi_turn_chat; fully synthetic there too)"))
    out.append(chats[0])

    stages = [tok.n(20) for _ in range(3)]
    markers = tok.n(3)
    items = [(tok.n(60) + tok.span(s.tot_question), stages, markers, s.tot_gen) for _ in range(s.tot_questions)]
    out.append(Workload("tree_of_thought", items, _tree_of_thought, par(len(items)), 1,
                        f"question {s.tot_question} tokens after a 60-token instruction; fork 3 x 3 x 3 "
                        f"(39 generations of {s.tot_gen} tokens; SGLang: 256, temperature 0.3); distinct "
                        "branch markers stand in for sampling diversity"))

    head_common = tok.n(40)
    fewshot = tok.n(s.sot_fewshot)
    tip_markers = [tok.n(2) for _ in range(4)]
    items = [(head_common + topic, tip_markers, fewshot, topic, s.sot_tip, s.sot_expand, thread_pool)
             for topic in (tok.n(8) for _ in range(s.sot_topics))]
    out.append(Workload("skeleton_of_thought", items, _skeleton_of_thought, par(len(items)), s.latency_programs,
                        f"4 tips of {s.sot_tip} tokens, each expanded ({s.sot_fewshot}-token 3-shot prompt, "
                        f"{s.sot_expand} tokens) while the next tip is written; join (SGLang tip_suggestion)"))

    system = tok.n(60)
    dims = [tok.n(30) for _ in range(6)]
    summary = tok.n(20)
    items = [(system + tok.span(s.judge_article), dims, summary, s.judge_gen) for _ in range(s.judge_articles)]
    out.append(Workload("llm_judge", items, _llm_judge, par(len(items)), s.latency_programs,
                        f"article {s.judge_article} tokens; fork 6 judgments of {s.judge_gen} tokens; join; "
                        "2-token score (SGLang llm_judge, branch-solve-merge)"))

    instruction = tok.n(30)
    lits = ['{\n  "name": ', ',\n  "country": ', ',\n  "latitude": ', ',\n  "population": ', ',\n  "top 3 landmarks": ']
    literal_ids = [encode(x) if encode else tok.n(6) for x in lits]
    regexes = [(REGEX_STR, 8), (REGEX_STR, 8), (REGEX_FLOAT, 8), (REGEX_INT, 8), (REGEX_LIST, 24)]
    fields = [(lit, rx, n) for lit, (rx, n) in zip(literal_ids, regexes)]
    items = [(tok.span(s.json_doc) + instruction, fields) for _ in range(s.json_docs)]
    out.append(Workload("json_regex", items, _json_regex, par(len(items)), s.latency_programs,
                        f"document {s.json_doc} tokens + instruction; 5 regex-constrained fields of 8/8/8/8/24 "
                        "tokens (SGLang json_decode_regex)", uses_regex=True))

    header = tok.n(s.react_header)
    items = []
    for _ in range(s.react_questions):
        steps = [(tok.n(4), tok.span(s.react_observation)) for _ in range(tok.between(s.react_steps))]
        items.append((header, tok.n(40), steps, s.react_gen))
    out.append(Workload("react", items, _react, par(len(items)), s.latency_programs,
                        f"{s.react_header}-token few-shot header + 40-token question; {s.react_steps} steps of a "
                        f"{s.react_gen}-token thought + a recorded {s.react_observation}-token observation "
                        "(SGLang react, replayed traces)"))
    out.append(chats[1])  # last: the longest to run, and the one the paper finds no speed-up on
    return out
