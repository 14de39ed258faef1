"""``Req.grammar`` for a regex / JSON-schema request: the scheduler's view of constrained decoding.

Implements the ``TokenGrammar`` hook of ``lmnb_engine.request`` (mask before sampling, accept
after, terminated → finish) and holds the request's jump-forward state. A jump happens in two
halves around one forward pass (see ``jump_forward``):

* after a token is appended, ``plan_jump`` proposes a draft for the forced string; its leading
  *certain* tokens (the only token their state allows) are accepted at once, the rest is kept as
  ``speculative``. The scheduler appends the whole draft to the request (``Req.append_forced``), so
  the next step extends the last sampled token, the certain tokens and the speculative ones;
* that step computes logits at the last ``len(speculative) + 1`` positions and samples each row
  under ``verification_bitmask`` (the mask of the state before that position); ``verify`` keeps
  the speculative tokens the sampler agrees with, and the scheduler rolls back the others and
  appends the sampler's token at the first disagreement.
"""

from __future__ import annotations

import numpy as np
import torch

from lmnb_engine.constrained.grammar import CompiledGrammar
from lmnb_engine.constrained.matcher import GrammarMatcher

INCOMPLETE_MESSAGE = "incomplete: the token limit was reached before the output matched its regex / JSON schema"


class RequestGrammar:
    """One request's grammar state; owned by the scheduler thread.

    Args:
        grammar: the compiled grammar (shared between requests).
        jump_forward: plan jump-forward drafts (the engine option ``disable_jump_forward`` turns
            it off; requests with penalties or ``min_new_tokens`` never jump, since their logits
            at a draft position would depend on the draft).
        logprobs: the request returns logprobs, so every draft token is verified (gets a logits
            row) rather than accepted as certain.
    Attributes:
        speculative: list[int], draft tokens at the end of the request's output that the next
            forward pass verifies (empty between a verification and the next plan).
    """

    def __init__(self, grammar: CompiledGrammar, jump_forward: bool = True, logprobs: bool = False):
        self.matcher = GrammarMatcher(grammar)
        self.jump_forward = jump_forward
        self.logprobs = logprobs
        self.speculative: list[int] = []

    # --- TokenGrammar hook ---------------------------------------------------------------------
    def allowed_token_mask(self, vocab_size: int) -> torch.Tensor:
        """bool [vocab_size]: tokens allowed in the current state (EOS only when accepting)."""
        bits = np.unpackbits(self.matcher.bitmask().numpy().view(np.uint8), bitorder="little")
        return torch.from_numpy(bits[:vocab_size].astype(bool))

    def accept_token(self, token_id: int) -> None:
        """Advance the grammar by one sampled token."""
        self.matcher.accept_token(token_id)

    def is_terminated(self) -> bool:
        """EOS accepted, or a full match that nothing but EOS can extend: the output is complete."""
        return self.matcher.is_terminated()

    # --- finish semantics ----------------------------------------------------------------------
    def incomplete_message(self) -> str | None:
        """``INCOMPLETE_MESSAGE`` when the output so far is not a full match, else None."""
        return None if self.matcher.is_accepting() else INCOMPLETE_MESSAGE

    # --- jump-forward --------------------------------------------------------------------------
    def plan_jump(self, output_ids: list[int], budget: int) -> tuple[int, list[int]]:
        """Propose the draft after the last output token.

        Args:
            output_ids: the request's output so far (the window for retokenization).
            budget: most draft tokens to propose (leave room for the token sampled after them).
        Returns:
            (number of certain tokens, draft): the caller appends the whole draft to the output;
            ``draft[certain:]`` becomes ``speculative``.
        """
        if not self.jump_forward or self.speculative:
            return 0, []
        draft = self.matcher.propose_draft(output_ids, budget)
        certain = 0 if self.logprobs else self.matcher.accept_certain(draft)
        self.speculative = draft[certain:]
        return certain, draft

    def verification_bitmask(self) -> torch.Tensor:
        """int32 [len(speculative) + 1, W]: mask of each logits row the verification samples."""
        return self.matcher.draft_bitmasks(self.speculative)

    def verify(self, sampled: list[int]) -> tuple[int, int | None]:
        """Accept the speculative tokens that equal ``sampled`` row by row, then the sampler's own
        token at the first difference (or after the last draft token) unless the output is
        already complete. Returns (speculative tokens kept, next token or None); the caller rolls
        back the other speculative tokens and appends the next token."""
        result = self.matcher.accept_draft(self.speculative, sampled)
        self.speculative = []
        return result

    def drop_speculative(self) -> int:
        """Forget the unverified draft (request finishing or retracted); returns its length, the
        number of output tokens the caller must remove."""
        k = len(self.speculative)
        self.speculative = []
        return k
