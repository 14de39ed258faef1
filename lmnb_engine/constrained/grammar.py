"""A compiled grammar: outlines-core's token index plus the compressed FSM derived from it.

``outlines_core.Index(regex, vocabulary)`` walks every token's bytes through the regex's byte-level
DFA from every reachable state (outlines-core ``src/index.rs``), so a decoding step is a lookup:
the allowed tokens of a state and the state after a token. ``CompiledGrammar`` adds, per state and
lazily (a state's work is done the first time any request reaches it, then shared):

* a packed token bitmask (int32 words, bit ``i % 32`` of word ``i // 32`` = token ``i``), with the
  EOS ids set only in accepting states;
* the **compressed FSM** edge (paper §4, App. B.1): a state is *singular* when exactly one byte
  can follow it and it is not accepting (EOS would be a second way out). Because a byte-level
  vocabulary has a one-byte token for every byte, "exactly one byte can follow" is read off the
  index as "every allowed token starts with the same byte", and the state after that byte is the
  state after its one-byte token. Chains of singular states merge into one forced byte string.

Vocabularies missing some one-byte tokens (rare: byte fallback covers all 256) get an exact
dead-state pruning pass over the full transition table instead, so no allowed token can lead into
a state from which no accepting state is reachable.

**The markers.** The index is built for ``vocab.START_MARKER (?:R) vocab.END_MARKER``, two
noncharacters that no text holds, each spelled by a token of its own that is never sampled:

* End: outlines-core keeps a token only if the DFA state after it is not a match state or is a
  full match at the end of input; regex-automata reports a match one byte late, so a token that
  continues a complete match into an incomplete one was dropped: after ``3`` in
  ``[0-9]+(\\.[0-9]+)?`` the ``.`` token, after ``yes`` in ``yes( please)?`` the space (SGLang's
  float dtype could never write a fraction). With the marker no state inside ``R`` is a match
  state, and a state accepts ``R`` exactly when the end marker's token leads out of it.
* Start: regex-automata also builds the unanchored half of the DFA, where a match may begin at
  every byte; when ``R``'s first byte recurs inside it (the ``"`` of a JSON string, whose body may
  hold ``\\"``), that half doubles with each repeat: ``{"type": "string", "maxLength": 20}`` did
  not compile in 60 s. A start character that never recurs leaves one way to begin; ``maxLength``
  1000 builds in a fraction of a second. The grammar starts after the start marker's token.

Both only where ``R`` cannot hold the start marker's character: JSON strings leave it out
(``schema``, ``json_string``), and so do the classes of user regexes (``regex_syntax``); a
Unicode property class (``\\p{L}``) is asked of the ``regex`` package. Where it can (a pattern
Python cannot read, a Unicode class that holds it: ``\\P{L}.{0,20}``), each one in the text would
begin another match and that half would double instead; and the end marker alone defeats the bare
DFA's leftmost-first pruning, which keeps such a pattern small. Those are built bare, as before
(with the dropped tokens).

Tokens into a marker's path (the states after the end marker, and byte-fallback pieces of the
markers) are never allowed.
"""

from __future__ import annotations

import re
import time
from collections import deque

import numpy as np
import torch

from lmnb_engine.byte_size import byte_size
from lmnb_engine.constrained.errors import GrammarCompileStopped, GrammarError
from lmnb_engine.constrained.index_process import DEFAULT_MEMORY_BYTES, ChildGroup, IndexBuildError, build_index
from lmnb_engine.constrained.regex_check import MAX_NESTING, nesting_depth
from lmnb_engine.constrained.vocab import END_MARKER, START_MARKER, TokenVocabulary
from lmnb_engine.regex_errors import regex_problem
from lmnb_engine.regex_parts import classes_held, unicode_classes
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_tree import constants as _c, quiet_parse

MAX_FORCED_BYTES = 4096  # a forced chain longer than this is cut (the rest is forced again next step)


def bitmask_width(vocab_size: int) -> int:
    """Number of int32 words in a packed token bitmask for ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def pack_token_ids(ids: np.ndarray, vocab_size: int) -> torch.Tensor:
    """int32 [bitmask_width(vocab_size)] bitmask with the bits of ``ids`` (int array) set."""
    bits = np.zeros(bitmask_width(vocab_size) * 32, dtype=bool)
    bits[ids] = True
    return torch.from_numpy(np.packbits(bits, bitorder="little").view("<i4").astype(np.int32))


class CompiledGrammar:
    """One regex compiled against one ``TokenVocabulary``; shared (read-only) by all its requests.

    States are outlines-core's state ids (ints). ``next_state`` returns None for a token the state
    does not allow. Thread-safety: the lazy per-state caches are filled idempotently, so concurrent
    readers at worst compute an entry twice.

    Attributes:
        regex: the pattern (str). vocab: the ``TokenVocabulary``. initial_state: int.
        compile_seconds: wall time of the index (built for ``regex`` then the end marker).
    """

    def __init__(self, regex: str, vocab: TokenVocabulary, index, compile_seconds: float, marked: bool = True):
        self.regex = regex
        self.vocab = vocab
        self.index = index
        self.compile_seconds = compile_seconds
        self.initial_state: int = index.get_initial_state()
        self.marked = marked  # (built between the markers; else the bare regex, as outlines-core builds it)
        if marked:
            self.initial_state = index.get_next_state(self.initial_state, vocab.start_marker_id)
        self._after_marker = frozenset(index.get_final_states())  # (the index's own accepting states)
        self._eos = np.array(sorted(vocab.eos_token_ids), dtype=np.int64)
        self._final: dict[int, bool] = {}
        self._marker: dict[int, bool] = {}
        self._marker_pieces = np.array(sorted(vocab.marker_piece_ids), dtype=np.int64)
        self._allowed: dict[int, np.ndarray] = {}
        self._bitmask: dict[int, torch.Tensor] = {}
        self._forced: dict[int, tuple[bytes, int]] = {}
        self._terminal: dict[int, bool] = {}
        self._dead: frozenset[int] = frozenset()
        self._transitions: dict[int, dict[int, int]] | None = None
        if not vocab.byte_complete:
            self._prune_dead_states()

    def _prune_dead_states(self) -> None:
        """Mark states that cannot reach an accepting state (exact, over the full table)."""
        self._transitions = self.index.get_transitions()
        reverse: dict[int, set[int]] = {}
        for src, edges in self._transitions.items():
            for nxt in edges.values():
                reverse.setdefault(nxt, set()).add(src)
        accepting = [s for s in self._transitions if self.is_final(s)]
        live, todo = set(accepting), deque(accepting)
        while todo:
            for src in reverse.get(todo.popleft(), ()):
                if src not in live:
                    live.add(src)
                    todo.append(src)
        self._dead = frozenset(set(self._transitions) - live)

    def is_final(self, state: int) -> bool:
        """True if the text so far is a full match (EOS may be sampled): the end marker's token
        completes the marked pattern (where the pattern may hold any character, the token can
        also be read as text: that path does not count)."""
        hit = self._final.get(state)
        if hit is None:
            hit = self._final[state] = (self._step(state, self.vocab.end_marker_id) in self._after_marker
                                        if self.marked else state in self._after_marker)
        return hit

    def _step(self, state: int, token: int) -> int | None:
        if self._transitions is not None:
            return self._transitions.get(state, {}).get(token)
        return self.index.get_next_state(state, token)

    def _in_marker(self, state: int) -> bool:
        """``state`` is only on the way through the end marker (reached by byte-fallback pieces of
        it): every way on is more pieces of it, up to its end, and none reaches an accepting state
        of the pattern (text whose bytes are all pieces of the marker's, like U+10FFBF's, is text)."""
        hit = self._marker.get(state)
        if hit is None:
            hit = self._marker[state] = self.marked and self._only_marker_ahead(state)
        return hit

    def _only_marker_ahead(self, state: int) -> bool:
        pieces, seen, todo = self.vocab.marker_piece_ids, {state}, [state]
        while todo:
            s = todo.pop()
            if self.is_final(s):
                return False
            if s in self._after_marker:  # (and not accepting: the marker read as the marker)
                continue
            for t in self.index.get_allowed_tokens(s):
                if t < self.vocab.vocab_size and t not in self.vocab.eos_token_ids:
                    if t not in pieces:
                        return False
                    nxt = self._step(s, t)
                    if nxt is not None and nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
        return True

    def next_state(self, state: int, token: int) -> int | None:
        """State after ``token`` (an EOS id keeps an accepting state); None if not allowed."""
        if token in self.vocab.eos_token_ids:
            return state if self.is_final(state) else None
        if token >= self.vocab.vocab_size:
            return None
        nxt = self._step(state, token)
        if nxt is None or nxt in self._dead:
            return None
        if token in self.vocab.marker_piece_ids and self._in_marker(nxt):
            return None
        return nxt

    def allowed_ids(self, state: int) -> np.ndarray:
        """Sorted int64 ids allowed in ``state`` (EOS ids only if accepting)."""
        ids = self._allowed.get(state)
        if ids is None:
            ids = np.asarray(self.index.get_allowed_tokens(state), dtype=np.int64)
            ids = ids[(ids != self.vocab.outlines_eos) & (ids < self.vocab.vocab_size)]
            if self._dead:
                ids = np.array([t for t in ids if self.next_state(state, int(t)) is not None], dtype=np.int64)
            else:  # (only through its pieces can a token enter the marker)
                pieces = ids[np.isin(ids, self._marker_pieces)]
                ids = ids[~np.isin(ids, [t for t in pieces if self.next_state(state, int(t)) is None])]
            if self.is_final(state):
                ids = np.union1d(ids, self._eos)
            ids.sort()
            self._allowed[state] = ids
        return ids

    def bitmask(self, state: int) -> torch.Tensor:
        """int32 [bitmask_width(vocab.vocab_size)] packed mask of ``allowed_ids(state)`` (CPU)."""
        mask = self._bitmask.get(state)
        if mask is None:
            mask = pack_token_ids(self.allowed_ids(state), self.vocab.vocab_size)
            self._bitmask[state] = mask
        return mask

    def is_terminal(self, state: int) -> bool:
        """Accepting, and no token but EOS may follow: the output is complete."""
        hit = self._terminal.get(state)
        if hit is None:
            hit = self.is_final(state) and not np.isin(self.allowed_ids(state), self._eos, invert=True).any()
            self._terminal[state] = hit
        return hit

    def _forced_edge(self, state: int) -> tuple[int, int] | None:
        """(byte, next state) if ``state`` is singular, else None."""
        if self.is_final(state):
            return None
        ids = self.allowed_ids(state)
        first = np.unique(self.vocab.first_byte[ids])
        if len(first) != 1 or first[0] < 0:
            return None
        token = int(self.vocab.byte_token[first[0]])
        nxt = self.next_state(state, token) if token >= 0 else None
        return None if nxt is None else (int(first[0]), nxt)

    def forced_bytes(self, state: int) -> tuple[bytes, int]:
        """(forced byte string, state after it): the compressed-FSM edge out of ``state``.

        Empty bytes when the state is not singular. Cut at ``MAX_FORCED_BYTES``.
        """
        hit = self._forced.get(state)
        if hit is None:
            out, s = bytearray(), state
            while len(out) < MAX_FORCED_BYTES:
                edge = self._forced_edge(s)
                if edge is None:
                    break
                out.append(edge[0])
                s = edge[1]
            hit = (bytes(out), s)
            self._forced[state] = hit
        return hit


_TOO_LARGE = ("its automaton is very large (long counted repeats, or a long maxLength on a top-level string): "
              "loosen the bound and limit the length with max_tokens instead")


def too_slow_message(regex: str, timeout_s: float | None) -> str:
    """The error of a constraint whose compile outlasted ``timeout_s`` seconds."""
    return f"compiling the constraint {shown_regex(regex)} took longer than {timeout_s:g} s, so {_TOO_LARGE}"


def may_hold(regex: str, code: int) -> bool:
    """Whether some match of ``regex`` (read by Python's parser) can hold the character ``code``:
    ``.``, a negated class or category not excluding it, a range or literal with it, a Unicode
    property class (``\\p{L}``, which Python lacks) that the ``regex`` package says holds it. The
    rest of a pattern with such classes is read with them held by characters other than ``code``
    (``classes_held``: in a negated class, a held class excludes nothing more, erring towards
    yes). True when Python cannot read the pattern."""
    import regex as regex_package

    for m in unicode_classes(regex):
        try:
            if regex_package.fullmatch(m.group(2), chr(code)):
                return True
        except regex_package.error:
            return True
    parsed = quiet_parse(classes_held(regex))
    return True if parsed is None else _holds(parsed.data, code)


_NEGATED_CATEGORIES = {_c.CATEGORY_NOT_DIGIT, _c.CATEGORY_NOT_SPACE, _c.CATEGORY_NOT_WORD}


def _holds(items, code: int) -> bool:
    """``may_hold`` over parsed items (``re._parser`` nodes)."""
    for op, av in items:
        if op is _c.ANY or (op is _c.NOT_LITERAL and av != code) or (op is _c.LITERAL and av == code):
            return True
        if op is _c.IN:
            negated = bool(av) and av[0][0] is _c.NEGATE
            inside = any((o is _c.LITERAL and v == code) or (o is _c.RANGE and v[0] <= code <= v[1])
                         or (o is _c.CATEGORY and v in _NEGATED_CATEGORIES) for o, v in av)
            if inside != negated:
                return True
        elif op is _c.BRANCH and any(_holds(alt, code) for alt in av[1]):
            return True
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT) and _holds(av[2], code):
            return True
        elif op is _c.SUBPATTERN and _holds(av[-1], code):
            return True
    return False


def compile_grammar(
    regex: str, vocab: TokenVocabulary, timeout_s: float | None = None, memory_bytes: int | None = DEFAULT_MEMORY_BYTES,
    owner: ChildGroup | None = None,
) -> CompiledGrammar:
    """Build the outlines-core index of ``regex`` over ``vocab`` (seconds for large vocabularies),
    in a child process (``index_process``) that is killed after ``timeout_s`` seconds and may use
    at most ``memory_bytes`` of address space (None: no limit); the child belongs to ``owner``,
    whose ``stop()`` kills it.

    Raises:
        GrammarError: the library rejects the pattern (its message is included), or no sequence
            of tokens from this vocabulary can ever complete a match.
        GrammarCompileStopped: the automaton was too large to build within the time or memory
            limit, the compile process died, or ``owner`` was stopped.
    """
    start = time.perf_counter()
    marked = not may_hold(regex, ord(START_MARKER))  # (the module docstring says why)
    pattern = f"\\x{{{ord(START_MARKER):X}}}(?:{regex})\\x{{{ord(END_MARKER):X}}}" if marked else regex
    try:
        index = build_index(pattern, vocab.outlines_vocabulary(), timeout_s, memory_bytes, owner)
    except IndexBuildError as e:
        if e.reason == "timeout":
            raise GrammarCompileStopped(too_slow_message(regex, timeout_s)) from None
        if e.reason == "memory":
            limit = f" (limit {byte_size(memory_bytes)})" if memory_bytes else ""
            raise GrammarCompileStopped(
                f"compiling the constraint {shown_regex(regex)} ran out of memory{limit}, so {_TOO_LARGE}"
            ) from None
        if e.reason == "stopped":
            raise GrammarCompileStopped(f"the compile of {shown_regex(regex)} was stopped: the engine shut down",
                                        by_shutdown=True) from None
        raise GrammarCompileStopped(
            f"the grammar compiler stopped while compiling {shown_regex(regex)} ({e.detail}); retry the request",
            transient=True,
        ) from None
    except ValueError as e:
        text = str(e)
        if "following characters: []" in text:  # a state no character leads on from: a dead end in the pattern
            raise GrammarError(f"regex {shown_regex(regex)} has a part that matches no text (e.g. a class with no character in "
                               "it, \"[^\\\\s\\\\S]\"), which the automaton library refuses; remove that part") from None
        if "incompatible" in text or "no transitions" in text.lower():
            raise GrammarError(
                f"regex {shown_regex(regex)} can never be satisfied with this tokenizer's vocabulary: {text}"
            ) from None
        try:  # the library's own message ("error building NFA") does not say what is wrong; Python's does
            re.compile(regex)
        except re.error:  # (worded as the language's gen() and %%lm cells word it; \p{L} read as they read it)
            problem = regex_problem(regex)
            if problem:
                raise GrammarError(problem) from None
        except (RecursionError, OverflowError):
            pass
        depth = nesting_depth(regex)
        if depth > MAX_NESTING:  # (a JSON schema's regex: its structure and patterns nest together)
            raise GrammarError(
                f"the constraint {shown_regex(regex)} nests parentheses {depth} levels deep, deeper than the automaton "
                f"library builds ({text}); flatten the schema's nesting or its patterns") from None
        raise GrammarError(f"regex {shown_regex(regex)} cannot be compiled to a token index: {text}") from None
    grammar = CompiledGrammar(regex, vocab, index, time.perf_counter() - start, marked)
    if not grammar._after_marker or grammar.initial_state in grammar._dead:
        raise GrammarError(
            f"regex {shown_regex(regex)} can never be satisfied with this tokenizer's vocabulary: no sequence of "
            "its tokens reaches a full match (a character the pattern requires has no token)"
        )
    return grammar
