"""Engine requests whose output is scripted: the sampler made to pick given ids, one a step."""

from __future__ import annotations


def scripted(engine, monkeypatch, pieces: list) -> list[int]:
    """Make ``engine`` sample the ids of ``pieces`` (text, encoded alone, or a token id), one a step
    and then EOS, in every request with a ``logit_bias``: the bias step adds 1e4 to the scripted id
    of the row's next output position instead (a scripted sampler; greedy requests pick it).
    Returns the ids, the EOS last."""
    from lmnb_engine import sampler

    tok = engine.tokenizer
    script = [i for p in pieces for i in ([p] if isinstance(p, int) else tok.encode(p, add_special_tokens=False))]
    script.append(tok.convert_tokens_to_ids("</s>"))

    def forced(logits, reqs):  # (in place of the bias, which run_streamed makes 0)
        for row, req in enumerate(reqs):
            if req.logit_bias is not None:
                logits[row, script[min(len(req.output_ids), len(script) - 1)]] += 1e4

    monkeypatch.setattr(sampler, "apply_logit_bias", forced)
    return script


def run_streamed(engine, stop=None, **options):
    """Stream one greedy request (max_new_tokens 20 unless ``options`` say otherwise) on the prompt
    "the cat" with ``stop`` and ``options`` (``SamplingParams``'s), the output scripted by
    ``scripted``; checks that the streamed text is the returned text (the stream never showed what
    a stop cut) and returns ``(result, the events' text deltas)``."""
    from lmnb_engine.params import SamplingParams

    params = SamplingParams(**{"max_new_tokens": 20, "temperature": 0.0, "stop": stop, "logit_bias": {0: 0.0},
                               **options})
    events = list(engine.stream("the cat", params))
    r = events[-1].result
    deltas = [e.text_delta for e in events]
    assert "".join(deltas) == r.text
    return r, deltas
