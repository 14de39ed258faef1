"""Shared fixtures: tiny offline checkpoints, built once per session."""

from __future__ import annotations

import os
import signal

import pytest

# Two cores on CI: keep torch from oversubscribing them. Under pytest-xdist (`make test` runs two
# workers) each worker, and what it starts, computes on one thread, so the two fill the two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The tests of Ctrl-C are a terminal's user's: a process started in the background (`cmd &` in a
# script, nohup) inherits SIGINT ignored, which Python then leaves ignored, so those tests raised
# nothing and the lmnb serve children they start inherited it too (9 failures in one worker).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _signal_handlers_put_back(request):
    # A test (or the code it runs) that leaves SIGINT ignored breaks every later Ctrl-C test of its
    # xdist worker, and the subprocesses they start inherit it: one CI run had 9 such failures in
    # one worker, none of them the cause. Each test's handlers are put back after it, with a warning
    # naming the test that changed them, so the one that leaks shows in the summary and no other.
    import signal
    import warnings

    numbers = (signal.SIGINT, signal.SIGTERM)
    before = {n: signal.getsignal(n) for n in numbers}
    yield
    changed = {n: signal.getsignal(n) for n in numbers if signal.getsignal(n) is not before[n]}
    for number in changed:
        if before[number] is not None:  # (None: a handler set outside Python, which cannot be put back)
            signal.signal(number, before[number])
    if changed:
        warnings.warn(f"{request.node.nodeid} left " + ", ".join(
            f"{signal.Signals(n).name}'s handler {h!r} (was {before[n]!r})" for n, h in changed.items()) + "; put back")


@pytest.fixture(autouse=True)
def _default_backend_put_back(request):
    # lmnb's default backend is the process's: a test that leaves one set (a program run without
    # backend= starts the demo Engine and keeps it as the default) changes what every later test
    # of its xdist worker runs on and shows; test_magics_connected's %lm stats test got a "Python
    # programs run on: lmnb.Engine (demo model)" row after one, in one CI order only. Each test's
    # default (and the host's unset default, set_unset_default) is put back after it, with a warning
    # naming the test that changed it, as for the signal handlers above. (The backend left is not
    # shut down: a later test may hold it.)
    import sys
    import warnings

    def now():
        api = sys.modules.get("lmnb.api")  # (not imported here: a test that never imports lmnb sets none)
        return (api._default_backend, api._unset_default) if api is not None else (None, None)

    before = now()
    yield
    after = now()
    changed = [f"{what} {a!r} (was {b!r})" for what, a, b in zip(("default backend", "unset default"), after, before)
               if a is not b]
    if changed:
        api = sys.modules["lmnb.api"]
        api._default_backend, api._unset_default = before
        warnings.warn(f"{request.node.nodeid} left lmnb's " + ", its ".join(changed) + "; put back")


@pytest.fixture(autouse=True)
def _stop_regex_search_budget(monkeypatch):
    # A stop-regex search may run REGEX_TIMEOUT_S (50 ms) of wall-clock time before its pattern is
    # given up and its request aborted: on a loaded CI machine a pause of the process (its CPU quota
    # spent) within a search of microseconds could give up a plain pattern by chance. Tests run the
    # in-process engine with a budget no pause reaches; those about the budget set their own, small
    # enough for the backtracking they search (test_stop_matcher's `searches` checks what each
    # search is given).
    from lmnb_engine import stop_matcher

    monkeypatch.setattr(stop_matcher, "REGEX_TIMEOUT_S", 5.0)


@pytest.fixture(scope="session")
def tiny_checkpoint_factory(tmp_path_factory):
    """``factory(arch="llama", **overrides) -> Path``; identical arguments reuse one directory."""
    from lmnb_engine.testing import make_tiny_checkpoint

    cache: dict = {}

    def factory(arch: str = "llama", seed: int = 0, **overrides):
        key = (arch, seed, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in cache:
            d = tmp_path_factory.mktemp(f"ckpt-{arch}")
            cache[key] = make_tiny_checkpoint(d, arch=arch, seed=seed, **overrides)
        return cache[key]

    return factory


@pytest.fixture(scope="session")
def tiny_llama(tiny_checkpoint_factory):
    return tiny_checkpoint_factory("llama")


@pytest.fixture(scope="session")
def tiny_llama2_bytes(tmp_path_factory):
    """A tiny random Llama checkpoint with Llama 2's form of tokenizer (``byte_fallback_tokenizer``:
    "\\n" is the byte token <0x0A>, whose run of byte tokens the detokenizer holds back until a
    token read as text ends it, or the output ends)."""
    import torch
    import transformers

    from lmnb_engine.testing.byte_fallback import byte_fallback_tokenizer
    from lmnb_engine.testing.tiny_checkpoint import _config, randomize_weights_

    path = tmp_path_factory.mktemp("llama2-bytes")
    tok = byte_fallback_tokenizer()
    torch.manual_seed(0)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": None}
    model = transformers.AutoModelForCausalLM.from_config(_config("llama", len(tok), ids))
    randomize_weights_(model)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_long(tiny_llama, tmp_path_factory):
    """``tiny_llama``'s files, its config declaring 16384 positions (512 there): a request of
    thousands of new tokens that a test aborts cannot end first, however slow the machine (16000
    tokens take over a minute to decode, where 400 took 1.7 s on a loaded machine)."""
    import json
    import shutil

    path = tmp_path_factory.mktemp("long-context") / "llama"
    shutil.copytree(tiny_llama, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16384}))
    return path


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama):
    """An in-process ``lmnb_engine.Engine`` on ``tiny_llama`` (8192 KV tokens), one per test module."""
    from lmnb_engine import Engine

    eng = Engine(model=str(tiny_llama), max_total_tokens=8192)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def llava_ckpt(tmp_path_factory):
    """[issue 10] A tiny random LLaVA-1.5 checkpoint (``make_tiny_llava_checkpoint`` defaults)."""
    from lmnb_engine.testing.tiny_llava import make_tiny_llava_checkpoint

    return make_tiny_llava_checkpoint(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def llava_hf(llava_ckpt):
    """transformers' ``(LlavaForConditionalGeneration, AutoProcessor)`` of ``llava_ckpt``, fp32."""
    import torch
    import transformers

    model = transformers.LlavaForConditionalGeneration.from_pretrained(str(llava_ckpt), dtype=torch.float32).eval()
    return model, transformers.AutoProcessor.from_pretrained(str(llava_ckpt))


# Files whose tests run longest, started first: pytest-xdist (`make test`: --dist loadfile
# --no-loadscope-reorder) hands out whole files in collection order, so a long file collected last
# (test_triton_compile: about 5 minutes of compiling on a cold Triton cache, as on CI) would run
# alone at the end while the other worker sat idle. (xdist's own order, files of most tests first,
# put that file of five tests last.)
LONGEST_FIRST = ("test_triton_compile.py", "test_bench_suite.py", "test_notebooks.py", "test_export.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # (stable: each file's own order is kept)
