"""Tensor parallelism on CPU: 2 processes over gloo, each holding half of a tiny Llama, must give
the logits of the unsplit model (single-process ``ModelRunner``, itself checked against HF
elsewhere) on extend batches with and without a cached prefix and on decode batches; rank 0
drives through ``TensorParallelRunner`` and rank 1 follows in ``worker_loop``. Covers an untied
LM head and a tied one with a vocabulary that does not split evenly (zero-padded shard)."""

from __future__ import annotations

import multiprocessing as mp
import sys

import pytest
import torch

WORLD = 2


def _script(runner) -> list[torch.Tensor]:
    """Three forwards over two requests (rows 0 and 1): a cold extend, an extend after a cached
    prefix (row 0 grows by 5, row 1 starts fresh on row 1 after 7 cached tokens), then a decode."""
    from lmnb_engine.forward_batch import ForwardBatch, ForwardMode

    table = runner.req_to_token_pool.req_to_token
    g = torch.Generator().manual_seed(3)
    vocab = runner.config.vocab_size
    table[0, :20] = torch.arange(1, 21, dtype=torch.int32)
    table[1, :20] = torch.arange(21, 41, dtype=torch.int32)
    steps = [([0, 1], [0, 0], [9, 7]), ([0, 1], [9, 7], [5, 6]), ([0, 1], [14, 13], [1, 1])]
    logits = []
    for rows, prefix, ext in steps:
        ids = torch.randint(3, vocab, (sum(ext),), generator=g).tolist()
        loc = torch.cat([table[r, p : p + e].long() for r, p, e in zip(rows, prefix, ext)])
        mode = ForwardMode.DECODE if all(e == 1 for e in ext) else ForwardMode.EXTEND
        batch = ForwardBatch.build(mode, ids, loc, table, rows, prefix, ext)
        logits.append(runner.forward(batch))
    return logits


def _runner(path, tp=None):
    from lmnb_engine.model_loader import load_model

    loaded = load_model(path, device="cpu", dtype="float32")
    kw = dict(max_total_tokens=64, max_running_requests=4, attention_backend="torch")
    if tp is None:
        from lmnb_engine.model_runner import ModelRunner

        return ModelRunner(loaded, **kw)
    from lmnb_engine.distributed import TensorParallelRunner

    return TensorParallelRunner(loaded, tp, **kw)


def _rank_main(rank: int, paths: list[str], rendezvous: str, out) -> None:
    import torch.distributed as dist

    from lmnb_engine.distributed import TPGroup, worker_loop
    from lmnb_engine.distributed.launch import exit_rank

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    code = 0
    try:
        for path in paths:
            runner = _runner(path, TPGroup(rank, WORLD))
            if rank == 0:
                # numpy: pickled by value (torch tensors would go through shared memory that dies
                # with this process)
                out.put(("logits", path, [x.numpy().copy() for x in _script(runner)], runner.max_total_tokens))
                runner.shutdown()
            else:
                out.put(("worker", path, worker_loop(runner), runner.config.num_kv_heads))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        out.put(("error", rank, repr(exc), None))
        code = 1
    finally:
        dist.destroy_process_group()
    out.close()
    out.join_thread()  # (the queue's feeder thread has sent everything: exit_rank skips the teardown)
    exit_rank(code)  # as the engine's worker ranks end (gloo at interpreter teardown aborted one in ~20-40)


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint_factory):
    untied = tiny_checkpoint_factory("llama")
    tied_odd_vocab = tiny_checkpoint_factory("llama", vocab_size=509, tie_word_embeddings=True)
    return [str(untied), str(tied_odd_vocab)]


def _spawn_ranks(target, args: tuple, n_messages: int, timeout: float, monkeypatch) -> tuple[list, list]:
    """Run ``target(rank, *args, queue)`` in ``WORLD`` spawned processes; returns the
    ``n_messages`` they put on the queue and the processes (joined)."""
    main = sys.modules["__main__"]
    if not hasattr(main, "__spec__"):
        # IPython's test shell (started by other test modules) replaces __main__ with a module
        # that lacks __spec__, which multiprocessing's spawn reads; the workers need nothing from it.
        monkeypatch.setattr(main, "__spec__", None, raising=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, *args, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    messages = [out.get(timeout=timeout) for _ in range(n_messages)]
    for p in procs:
        p.join(60)
    return messages, procs


def test_two_rank_tensor_parallel_matches_single_process(checkpoints, tmp_path, monkeypatch):
    messages, procs = _spawn_ranks(_rank_main, (checkpoints, str(tmp_path / "rdv")), 2 * len(checkpoints), 240,
                                   monkeypatch)
    errors = [m for m in messages if m[0] == "error"]
    assert not errors, errors
    assert all(p.exitcode == 0 for p in procs)
    for path in checkpoints:
        (_, _, tp_logits, pool), = [m for m in messages if m[0] == "logits" and m[1] == path]
        tp_logits = [torch.from_numpy(x) for x in tp_logits]
        (_, _, steps, local_kv_heads), = [m for m in messages if m[0] == "worker" and m[1] == path]
        assert pool == 64 and steps == 3  # the worker ran every broadcast batch
        ref_runner = _runner(path)
        assert local_kv_heads == ref_runner.config.num_kv_heads // WORLD
        ref = _script(ref_runner)
        assert [x.shape for x in tp_logits] == [x.shape for x in ref] == [(2, ref_runner.config.vocab_size)] * 3
        for got, want in zip(tp_logits, ref):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def _agree_main(rank: int, picks: list, strict: bool, rendezvous: str, out) -> None:
    """Rank ``rank`` of a 2-rank gloo group: a backend stand-in that chose the flash-attn labelled
    ``picks[rank]`` (None: Triton; ``strict``: asked for by name) runs ``agree_on_extend_kernel``;
    puts the label it keeps, or the error it raises."""
    import types

    import torch.distributed as dist

    from lmnb_engine.distributed import TPGroup
    from lmnb_engine.distributed.runner import agree_on_extend_kernel

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    try:
        pick = picks[rank]
        attn = types.SimpleNamespace(flash=None if pick is None else types.SimpleNamespace(label=pick), strict=strict)
        try:
            agree_on_extend_kernel(attn, TPGroup(rank, WORLD), torch.device("cpu"))
        except RuntimeError as exc:
            out.put((rank, str(exc)))
        else:
            out.put((rank, attn.flash and attn.flash.label))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("picks, agreed", [
    (("flash-attn 2", "flash-attn 2"), "flash-attn 2"),  # the same choice stands
    ((None, None), None),
    (("torch varlen_attn", None), None),  # a rank that timed Triton faster, or whose check failed: all run Triton
    # different flash-attns (each rank's candidates depend on its GPU): Triton, not a kernel a rank never checked
    (("FlashAttention-3", "flash-attn 2"), None),
])
def test_tensor_parallel_ranks_agree_on_the_extend_kernel(picks, agreed, tmp_path, monkeypatch):
    """Under "auto" each rank times flash-attn on its own shard; a near-tie falling differently on
    two ranks left them on different kernels (and model_info told rank 0's)."""
    messages, procs = _spawn_ranks(_agree_main, (list(picks), False, str(tmp_path / "rdv")), WORLD, 120, monkeypatch)
    got = dict(messages)
    assert got == {0: agreed, 1: agreed} and all(p.exitcode == 0 for p in procs)


def test_flash_attn_by_name_refuses_ranks_that_found_different_builds(tmp_path, monkeypatch):
    """Asked for by name, flash-attn is not dropped for Triton in silence (as "auto" does): every
    rank raises, naming its own build."""
    picks = ["FlashAttention-3", "flash-attn 2"]
    messages, procs = _spawn_ranks(_agree_main, (picks, True, str(tmp_path / "rdv")), WORLD, 120, monkeypatch)
    for rank, message in messages:
        assert message == (f"attention_backend='flash_attn': the tensor-parallel ranks run different flash-attn builds "
                           f"(rank {rank}: {picks[rank]}); install one build for all the GPUs, or use "
                           "attention_backend='triton'")
    assert sorted(rank for rank, _ in messages) == [0, 1]


def test_shard_refuses_heads_that_do_not_split(tiny_checkpoint_factory):
    from lmnb_engine.distributed import TPGroup, shard_model_
    from lmnb_engine.model_loader import load_model

    loaded = load_model(str(tiny_checkpoint_factory("llama")), device="cpu")
    with pytest.raises(ValueError, match="divisible by 3"):
        shard_model_(loaded.model, TPGroup(0, 3))
    with pytest.raises(ValueError, match="outside"):
        TPGroup(2, 2)


def test_engine_with_tp_size_2_generates_what_one_process_does(tiny_checkpoint_factory):
    """``Engine(tp_size=2)`` on CPU: rank 1 in a spawned worker over gloo. Greedy tokens equal
    the single-process engine's and logprobs agree within float32 rounding (the all-reduce adds
    the halves in another order), radix hits included; shutdown ends the worker cleanly."""
    import torch.distributed as dist

    from lmnb_engine import Engine, SamplingParams

    path = str(tiny_checkpoint_factory("llama"))
    params = SamplingParams(max_new_tokens=6, temperature=0.0, return_logprob=True)
    texts = ["the cat is red and the dog", "the cat is red and the bird is"]
    kw = dict(device="cpu", max_total_tokens=512, attention_backend="torch")
    with Engine(path, **kw) as one:
        one.generate(texts[0], SamplingParams(max_new_tokens=0))
        want = one.generate(texts, params)
    with Engine(path, tp_size=2, **kw) as eng:
        (worker,) = eng._tp_group.procs
        assert worker.is_alive() and eng.model_info()["tp_size"] == 2
        eng.generate(texts[0], SamplingParams(max_new_tokens=0))
        got = eng.generate(texts, params)
        assert got[1].meta.cached_tokens > 0  # the shared prefix was a radix hit on every rank
        eng.check_invariants()
    worker.join(30)
    assert worker.exitcode == 0 and not dist.is_initialized()
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        assert max(abs(a.logprob - b.logprob) for a, b in zip(g.logprobs, w.logprobs)) < 1e-4


def test_engine_tp_settings_that_cannot_work_fail_before_any_worker_starts(tiny_checkpoint_factory, tmp_path):
    from lmnb_engine import Engine
    from lmnb_engine.testing.tiny_llava import make_tiny_llava_checkpoint

    path = str(tiny_checkpoint_factory("llama"))  # 4 query heads, 2 KV heads
    with pytest.raises(ValueError, match="divisible by 3"):
        Engine(path, device="cpu", tp_size=3, max_total_tokens=64)
    with pytest.raises(ValueError, match="tp_size=0"):
        Engine(path, device="cpu", tp_size=0)
    with pytest.raises(ValueError, match="tp_size='2' must be an int"):
        Engine(path, device="cpu", tp_size="2")
    with pytest.raises(ValueError, match="unknown attention backend 'bogus'"):
        Engine(path, device="cpu", tp_size=2, attention_backend="bogus")
    with pytest.raises(ValueError, match="text-only Llama family"):
        Engine(str(make_tiny_llava_checkpoint(tmp_path / "llava")), device="cpu", tp_size=2)
    with pytest.raises(ValueError, match="CUDA graphs"):
        Engine(path, device="cpu", tp_size=2, cuda_graph_max_bs=8)


def test_a_workers_load_error_reaches_the_caller_as_a_single_process_load_raises_it(
        tiny_checkpoint_factory, tmp_path, monkeypatch):
    """A worker's load error came back as a RuntimeError holding its text, which lost its type and
    the fixes that front ends say in their own syntax (``in_option_syntax``). The worker's load
    is made to fail where rank 0's did not: the weights go once rank 0 has loaded its shard; the
    single-process load of what is left is the reference."""
    import shutil

    import torch.distributed as dist

    import lmnb_engine.distributed.launch as launch
    from lmnb_engine import Engine
    from lmnb_engine.cli_options import in_option_syntax

    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint_factory("llama"), path)
    start = launch.start_tensor_parallel

    def start_without_the_weights(*args, **kwargs):
        for weights in path.glob("*.safetensors"):
            weights.unlink()
        return start(*args, **kwargs)

    monkeypatch.setattr(launch, "start_tensor_parallel", start_without_the_weights)
    with pytest.raises(Exception) as tp:
        Engine(str(path), device="cpu", tp_size=2, max_total_tokens=256)
    assert not mp.active_children() and not dist.is_initialized()
    with pytest.raises(Exception) as one:
        Engine(str(path), device="cpu", max_total_tokens=256)
    assert type(tp.value) is type(one.value) is FileNotFoundError
    assert str(tp.value) == str(one.value)
    options = {"random_weights": False}  # (a command line with --random-weights)
    assert in_option_syntax(tp.value, options) == in_option_syntax(one.value, options)
    assert "--random-weights" in in_option_syntax(tp.value, options)
    assert str(tp.value.__cause__) == "tensor-parallel rank 1 could not load the model"


def test_rank_0s_runner_refuses_its_settings_as_a_single_process_does(tiny_checkpoint_factory):
    """``max_total_tokens=1``: a single process raises ValueError with the fix; tensor-parallel
    start-up wrapped it (and rank 1's copy of it) in a RuntimeError."""
    import torch.distributed as dist

    from lmnb_engine import Engine

    path = str(tiny_checkpoint_factory("llama"))
    with pytest.raises(ValueError) as one:
        Engine(path, device="cpu", max_total_tokens=1)
    with pytest.raises(ValueError) as tp:
        Engine(path, device="cpu", tp_size=2, max_total_tokens=1)
    assert str(tp.value) == str(one.value) and tp.value.option_fixes == one.value.option_fixes
    assert not mp.active_children() and not dist.is_initialized()


def _setting_error():
    from lmnb_engine.cli_options import option_error

    return option_error(RuntimeError, "no room", ("pass {}", "max_total_tokens", None))


@pytest.mark.parametrize("make_error, wrapped", [
    # an internal error (a torch whose signature changed): it was raised bare since rank 0's
    # ValueError/TypeError passed through, without the start-up's context and the workers' errors
    (lambda: TypeError("forward() got an unexpected keyword argument 'x'"), True),
    (_setting_error, False),  # a setting, whatever its type: front ends reword its fixes
], ids=["internal error", "setting"])
def test_rank_0s_runner_error_is_raised_as_it_is_only_where_it_is_a_setting(
        tiny_checkpoint_factory, monkeypatch, make_error, wrapped):
    """Rank 0's runner fails (a stand-in that raises) once the worker has joined the group."""
    import torch.distributed as dist

    import lmnb_engine.distributed.launch as launch
    from lmnb_engine import Engine

    error = make_error()

    def failing_runner(*args, **kwargs):
        raise error

    monkeypatch.setattr(launch, "TensorParallelRunner", failing_runner)
    with pytest.raises(Exception) as got:
        Engine(str(tiny_checkpoint_factory("llama")), device="cpu", tp_size=2, max_total_tokens=256,
               attention_backend="torch")
    assert not mp.active_children() and not dist.is_initialized()
    if wrapped:
        assert type(got.value) is RuntimeError and got.value.__cause__ is error
        assert str(got.value) == f"tensor-parallel start-up failed: rank 0: TypeError: {error}"
    else:
        assert got.value is error


def test_an_engine_starts_after_one_whose_rendezvous_failed(tiny_checkpoint_factory, tmp_path, monkeypatch):
    """Rank 0's failed ``init_process_group`` (a worker gone before joining, Ctrl-C) left torch's
    count of groups at 1, so the next engine's rank 0 named its group "1" where its fresh worker
    named its "0", and start-up hung until the rendezvous timed out (10 minutes; 30 s here). The
    failure is a real rendezvous that times out: rank 0 alone, on a file no worker knows."""
    import datetime

    import torch.distributed as dist

    import lmnb_engine.distributed.launch as launch
    from lmnb_engine import Engine, SamplingParams

    path = str(tiny_checkpoint_factory("llama"))
    kw = dict(device="cpu", tp_size=2, max_total_tokens=256, attention_backend="torch")
    init = dist.init_process_group

    def init_alone(backend, **kwargs):
        init(backend, init_method=f"file://{tmp_path / 'nobody'}", rank=0, world_size=2,
             timeout=datetime.timedelta(seconds=1))

    monkeypatch.setattr(dist, "init_process_group", init_alone)
    with pytest.raises(RuntimeError, match="timeout"):
        Engine(path, **kw)
    monkeypatch.setattr(dist, "init_process_group", init)
    monkeypatch.setattr(launch, "COLLECTIVE_TIMEOUT", datetime.timedelta(seconds=30))
    with Engine(path, **kw) as eng:
        assert len(eng.generate("the cat", SamplingParams(max_new_tokens=2, temperature=0.0)).token_ids) == 2
    assert not mp.active_children() and not dist.is_initialized()


class NeedyError(Exception):
    """An error whose ``__init__`` needs more than its ``args``: it pickles, and fails to unpickle."""

    def __init__(self, message, code):
        super().__init__(message)


@pytest.mark.parametrize("error, raised", [
    # a worker's SystemExit (a library's sys.exit in its load), raised as it is in rank 0, ended
    # the caller's process (a kernel, `lmnb serve`) without a word
    (SystemExit(3), RuntimeError("tensor-parallel rank 1 could not load the model: SystemExit: 3")),
    (FileNotFoundError("no weights"), FileNotFoundError("no weights")),
    (NeedyError("x", 1), RuntimeError("tensor-parallel rank 1 could not load the model: NeedyError: x")),
])
def test_rank_0_raises_a_workers_load_error_as_it_is_only_where_it_is_an_exception_that_survives_pickling(
        error, raised):
    """What a worker reports of its failed load (``_report``) and what rank 0 makes of it
    (``_wait_loaded``), over the pipe they use; the worker's process is a stand-in that never
    ends (its sentinel, a pipe never written)."""
    import types

    import lmnb_engine.distributed.launch as launch

    reader, writer = mp.Pipe(duplex=False)
    never, _ = mp.Pipe(duplex=False)
    launch._report(writer, "load the model", error)
    group = types.SimpleNamespace(conns=[reader], procs=[types.SimpleNamespace(sentinel=never, exitcode=None)])
    with pytest.raises(BaseException) as got:
        launch._wait_loaded(group)
    assert (type(got.value), str(got.value)) == (type(raised), str(raised))


def test_a_workers_error_whose_class_rank_0_cannot_import_is_named_with_its_rank(monkeypatch, tmp_path):
    """The worker's error pickles and unpickles where it was raised, but its class's module is not
    importable in rank 0 (here: gone from ``sys.modules`` once reported). Unpickled inside
    ``conn.recv()``, its ModuleNotFoundError escaped ``_wait_loaded`` and ``worker_errors`` in
    place of the rank and the message; each says them now, over the pipe they use."""
    import types

    import lmnb_engine.distributed.launch as launch

    module = types.ModuleType("lmnb_test_worker_only")
    exec("class WorkerOnlyError(Exception):\n    pass\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    never, _ = mp.Pipe(duplex=False)
    stand_in = types.SimpleNamespace(sentinel=never, exitcode=None)  # (a worker process that never ends)
    readers = []
    for _ in range(2):
        reader, writer = mp.Pipe(duplex=False)
        launch._report(writer, "load the model", module.WorkerOnlyError("no weights"))
        readers.append(reader)
    monkeypatch.delitem(sys.modules, module.__name__)

    with pytest.raises(RuntimeError) as got:
        launch._wait_loaded(types.SimpleNamespace(conns=readers[:1], procs=[stand_in]))
    assert str(got.value) == "tensor-parallel rank 1 could not load the model: WorkerOnlyError: no weights"
    group = launch.TensorParallelGroup(None, [stand_in], readers[1:], str(tmp_path))
    assert group.worker_errors() == ["rank 1: could not load the model: WorkerOnlyError: no weights"]


def test_a_failed_rendezvous_is_raised_as_it_is_where_torchs_private_group_count_cannot_be_set(
        tiny_checkpoint_factory, monkeypatch):
    """The reset of torch's group count after a failed ``init_process_group`` sets a private
    attribute (``distributed_c10d._world.group_count``, which torch's source marks to go): a
    torch where it cannot be set raised AttributeError from the reset, in place of the
    rendezvous's own error. Here torch's ``_world`` as one whose ``group_count`` is read-only."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from lmnb_engine import Engine

    class ReadOnlyCount:
        def __init__(self, world):
            self.__dict__["world"] = world

        def __getattr__(self, name):
            return getattr(self.world, name)

        def __setattr__(self, name, value):
            if name == "group_count":
                raise AttributeError("property 'group_count' of '_World' object has no setter")
            setattr(self.world, name, value)

    def init_fails(backend, **kwargs):
        raise RuntimeError("the rendezvous failed")

    monkeypatch.setattr(distributed_c10d, "_world", ReadOnlyCount(distributed_c10d._world))
    monkeypatch.setattr(dist, "init_process_group", init_fails)
    with pytest.raises(RuntimeError, match="^the rendezvous failed$"):
        Engine(str(tiny_checkpoint_factory("llama")), device="cpu", tp_size=2, max_total_tokens=256)
    assert not mp.active_children()


@pytest.mark.parametrize("arch,overrides", [("llama", {}), ("qwen2", {}),
                                            ("llama", dict(vocab_size=509, tie_word_embeddings=True))])
def test_loading_a_shard_equals_slicing_the_loaded_model(tiny_checkpoint_factory, arch, overrides):
    """``load_model(tp=...)`` shards on the meta device and fills the shard from slices of the
    checkpoint; ``shard_model_`` slices a model loaded whole. Both give every rank the same
    tensors, and a rank holds about 1/2 of the weights (norms and biases are whole)."""
    from lmnb_engine.distributed import TPGroup, shard_model_
    from lmnb_engine.model_loader import load_model

    path = str(tiny_checkpoint_factory(arch, **overrides))
    whole = sum(p.numel() for p in load_model(path, device="cpu").model.parameters())
    for rank in range(WORLD):
        tp = TPGroup(rank, WORLD)
        direct = dict(load_model(path, device="cpu", tp=tp).model.named_parameters())
        sliced = dict(shard_model_(load_model(path, device="cpu").model, tp).named_parameters())
        assert direct.keys() == sliced.keys()
        for name in direct:
            assert torch.equal(direct[name], sliced[name]), name
        assert sum(p.numel() for p in direct.values()) < 0.6 * whole


def test_interrupts_are_rank_0s_and_a_dead_worker_is_named(tiny_checkpoint_factory):
    """Ctrl-C and Jupyter's interrupt signal the whole process group: the worker ignores SIGINT
    and the engine keeps working. A worker killed outright makes every later request fail at
    once with an error naming the rank, instead of aborting silently."""
    import os
    import signal

    from lmnb_engine import Engine, SamplingParams

    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    with Engine(str(tiny_checkpoint_factory("llama")), device="cpu", tp_size=2, max_total_tokens=256,
                attention_backend="torch") as eng:
        (worker,) = eng._tp_group.procs
        before = eng.generate("the cat", params).token_ids
        os.kill(worker.pid, signal.SIGINT)
        worker.join(1)
        assert worker.is_alive()
        assert eng.generate("the cat", params).token_ids == before
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        with pytest.raises(RuntimeError, match="tensor-parallel rank 1 has exited.*create a new Engine"):
            eng.generate("the cat", params)


def test_a_script_without_a_main_guard_starts_workers(tiny_checkpoint_factory, tmp_path):
    """Spawned workers do not re-run the parent's script: a flat script (no ``if __name__ ==
    "__main__"``) and one read from stdin both work, and the script's top level runs once."""
    import subprocess

    path = tiny_checkpoint_factory("llama")
    marker = tmp_path / "runs.txt"
    script = (
        "from lmnb_engine import Engine, SamplingParams\n"
        f"open({str(marker)!r}, 'a').write('x')\n"
        f"eng = Engine({str(path)!r}, device='cpu', tp_size=2, max_total_tokens=256)\n"
        "print('TOKENS', eng.generate('the cat', SamplingParams(max_new_tokens=3, temperature=0)).token_ids)\n"
        "eng.shutdown()\n"
    )
    flat = tmp_path / "flat.py"
    flat.write_text(script)
    for cmd, stdin in (([sys.executable, str(flat)], None), ([sys.executable, "-"], script)):
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and "TOKENS [" in proc.stdout, proc.stderr[-2000:]
    assert marker.read_text() == "xx"  # once per run: the worker did not execute the script


def test_an_engine_collected_on_its_scheduler_thread_releases_the_workers_after_the_step(tiny_checkpoint_factory):
    """The garbage collector may finalize a dropped engine (its handles and the engine form a
    reference cycle) on the scheduler thread, in the middle of a step. The worker ranks were
    released right there: the step's forward then failed on the exited rank and the request ended
    with an "internal error" instead of the shutdown's own message."""
    from lmnb_engine import Engine, SamplingParams

    eng = Engine(str(tiny_checkpoint_factory("llama")), device="cpu", tp_size=2, max_total_tokens=256,
                 attention_backend="torch")
    start, collected = eng.scheduler._start, []

    def start_then_collect(req, match):  # the collection strikes right after the admission
        start(req, match)
        if not collected:
            collected.append(True)
            eng._finalizer()  # what collecting the engine runs

    eng.scheduler._start = start_then_collect
    handle = eng.submit("the cat", SamplingParams(max_new_tokens=4, temperature=0.0))
    result = handle.result(timeout=60)
    assert (result.finish_reason.type, result.finish_reason.message) == (
        "abort", "aborted: the engine shut down (Engine.shutdown, or the Engine was dropped) before the request finished")
    eng.scheduler._thread.join(60)
    (worker,) = eng._tp_group.procs
    assert not eng.scheduler._thread.is_alive() and worker.exitcode == 0
