"""Per-request grammar state: accept tokens, roll back, token masks, jump-forward drafts."""

from __future__ import annotations

import torch

from lmnb_engine.constrained.errors import GrammarError
from lmnb_engine.constrained.grammar import CompiledGrammar
from lmnb_engine.constrained.jump_forward import plan_draft


class GrammarMatcher:
    """Where one request is in its ``CompiledGrammar``.

    Keeps the state after every accepted token so that ``rollback(k)`` is exact. The engine calls,
    per step: ``bitmask()`` (or ``draft_bitmasks`` for a jump-forward extend) before sampling,
    ``accept_token`` / ``accept_draft`` after, and ``propose_draft`` to plan the next jump.
    """

    def __init__(self, grammar: CompiledGrammar):
        self.grammar = grammar
        self._states = [grammar.initial_state]
        self.finished = False  # an EOS token was accepted

    @property
    def state(self) -> int:
        """The current automaton state."""
        return self._states[-1]

    @property
    def num_tokens(self) -> int:
        """Tokens accepted so far (EOS included)."""
        return len(self._states) - 1

    def is_accepting(self) -> bool:
        """The output so far is a full match."""
        return self.grammar.is_final(self.state)

    def is_terminated(self) -> bool:
        """EOS was accepted, or the output is a full match that no token but EOS can extend."""
        return self.finished or self.grammar.is_terminal(self.state)

    def accept_token(self, token: int) -> None:
        """Advance by one sampled token.

        Raises:
            GrammarError: the token is not allowed here (the mask was not applied to its logits).
        """
        nxt = self.grammar.next_state(self.state, int(token))
        if nxt is None or self.finished:
            raise GrammarError(
                f"token {token} is not allowed by the grammar in state {self.state} "
                f"(after {self.num_tokens} tokens); its token mask was not applied"
            )
        self._states.append(nxt)
        self.finished = int(token) in self.grammar.vocab.eos_token_ids

    def rollback(self, k: int) -> None:
        """Forget the last ``k`` accepted tokens."""
        if not 0 <= k <= self.num_tokens:
            raise ValueError(f"cannot roll back {k} tokens: only {self.num_tokens} were accepted")
        if k:
            del self._states[-k:]
            self.finished = False

    def bitmask(self) -> torch.Tensor:
        """int32 [W] packed token mask of the current state (shared; do not modify)."""
        return self.grammar.bitmask(self.state)

    def forced_bytes(self) -> bytes:
        """The compressed-FSM string forced from the current state (b"" if none)."""
        return self.grammar.forced_bytes(self.state)[0]

    def propose_draft(self, recent_ids: list[int], max_tokens: int) -> list[int]:
        """Jump-forward draft token ids for the current state (see ``jump_forward``); no state change."""
        if self.finished:
            return []
        return plan_draft(self.grammar, self.state, recent_ids, max_tokens)

    def accept_certain(self, draft: list[int]) -> int:
        """Accept the leading draft tokens that are the only token their state allows; return how many.

        Any sampler must pick such a token (its masked distribution has one outcome), so these
        need no verification. The caller appends them as ordinary output tokens and keeps the rest
        of the draft speculative; if ``is_terminated()`` afterwards, the output is complete and no
        forward pass is needed.
        """
        n = 0
        for t in draft:
            allowed = self.grammar.allowed_ids(self.state)
            if self.finished or len(allowed) != 1 or int(allowed[0]) != int(t):
                break
            self.accept_token(t)
            n += 1
        return n

    def draft_states(self, draft: list[int]) -> list[int]:
        """States before each token of ``draft`` and after the last: ``len(draft) + 1`` states.

        Raises:
            GrammarError: a draft token is not allowed (the draft was not made by ``propose_draft``).
        """
        states = [self.state]
        for t in draft:
            nxt = self.grammar.next_state(states[-1], t)
            if nxt is None:
                raise GrammarError(f"draft token {t} is not allowed in state {states[-1]}")
            states.append(nxt)
        return states

    def draft_bitmasks(self, draft: list[int]) -> torch.Tensor:
        """int32 [len(draft)+1, W]: the mask at the last sampled token's position and after each
        draft token, i.e. the rows of a jump-forward extend's logits, in order."""
        return torch.stack([self.grammar.bitmask(s) for s in self.draft_states(draft)])

    def accept_draft(self, draft: list[int], sampled: list[int]) -> tuple[int, int | None]:
        """Verify a draft against the tokens sampled at its ``len(draft)+1`` positions.

        ``sampled[i]`` is the token the sampler picked from the logits row ``i`` of the extend
        under mask row ``i`` of ``draft_bitmasks``. Draft tokens are accepted while
        ``sampled[i] == draft[i]``; then ``sampled[j]`` (the model's own next token) is accepted,
        unless the kept draft already completed the output (``is_terminated``): plain decoding
        would have stopped there without sampling again.

        Returns:
            (j, next token or None): the caller keeps ``j`` draft tokens, rolls back the other
            ``len(draft) - j`` and appends the next token if there is one.
        Raises:
            ValueError: ``len(sampled) != len(draft) + 1``.
        """
        if len(sampled) != len(draft) + 1:
            raise ValueError(f"need {len(draft) + 1} sampled tokens for a draft of {len(draft)}, got {len(sampled)}")
        j = 0
        while j < len(draft) and int(sampled[j]) == int(draft[j]):
            j += 1
        for t in draft[:j]:
            self.accept_token(t)
        if self.is_terminated():
            return j, None
        self.accept_token(sampled[j])
        return j, int(sampled[j])
