"""Compile the engine's Triton kernels for NVIDIA GPUs on a machine without one.

The CPU interpreter (``TRITON_INTERPRET=1``) checks what a kernel computes, not whether it
compiles: it accepts programs the GPU compiler rejects and knows nothing of registers or shared
memory. This module asks the real kernel wrappers for the launches they would make on a GPU of a
given architecture (``triton_support.device_arch`` answers that architecture; the launch is
recorded instead of run), then compiles each distinct launch with ``triton.compile`` for that
target, exactly as Triton's JIT would specialize it, and reads the register count and spills
from ptxas run as Triton runs it (its arguments, ``-v`` among them) and the shared memory from
the compiled metadata.

    python -m lmnb_engine.testing.triton_compile [--arch 80,86,89,90] [--jobs 2] [--json]

A launch passes when it compiles, fits the architecture's shared memory and, for 16-bit inputs
(the GPU path), spills no registers; float32 on a GPU is a checking mode, where a few spilled
bytes are reported but allowed.

Run it in a process where ``TRITON_INTERPRET`` is unset (interpreted kernels cannot be compiled).
It uses Triton's launch internals (``create_function_from_signature``, ``JITFunction._pack_args``)
and the command line of its NVIDIA backend's ``make_cubin`` (written against triton 3.9), and fails
with ``RuntimeError`` naming the version if they change.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
from concurrent.futures import ProcessPoolExecutor
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Callable, Iterator
from unittest import mock

import torch

# Shared memory one block may use (opt-in maximum) per architecture, in bytes (CUDA programming
# guide, "Technical Specifications per Compute Capability").
MAX_SHARED = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
ARCH_NAMES = {80: "A100", 86: "A10G", 89: "L4", 90: "H100/H200"}

# (name, query heads, KV heads, head_dim, hidden, intermediate): the real shapes the engine serves
# on one GPU, a tensor-parallel shard, and the built-in demo model.
SHAPES = [
    ("llama-2-7b", 32, 32, 128, 4096, 11008),
    ("llama-3-8b", 32, 8, 128, 4096, 14336),
    ("llama-3-8b-tp2", 16, 4, 128, 4096, 7168),
    ("llama-3.2-1b", 32, 8, 64, 2048, 8192),
    ("qwen2-7b", 28, 4, 128, 3584, 18944),
    ("wide-heads-256", 16, 8, 256, 4096, 11008),
    ("demo", 8, 4, 32, 256, 768),
]
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class Launch:
    """One recorded kernel launch: the kernel and the arguments the wrapper passed."""

    kernel: object  # triton.runtime.jit.JITFunction
    args: tuple
    kwargs: dict


@dataclass
class CompileReport:
    """What compiling one launch for one architecture gave (sizes in bytes)."""

    kernel: str
    arch: int
    dtype: str
    config: str
    registers: int
    spill_bytes: int
    shared_bytes: int
    max_shared: int

    @property
    def ok(self) -> bool:
        """Whether the launch fits the architecture's shared memory and spills no registers (float32 may
        spill)."""
        return self.shared_bytes <= self.max_shared and (self.spill_bytes == 0 or self.dtype == "float32")


@contextlib.contextmanager
def _recording(arch: int) -> Iterator[list[Launch]]:
    """Within: kernel launches are recorded, not run, and wrappers see a GPU of ``arch``."""
    from triton.runtime.jit import JITFunction

    from lmnb_engine import triton_support

    launches: list[Launch] = []

    def record(self, *args, grid, warmup, **kwargs):
        launches.append(Launch(self, args, kwargs))

    with mock.patch.object(JITFunction, "run", record), \
            mock.patch.object(triton_support, "device_arch", lambda device: arch):
        yield launches


def _wrapper_calls(hq: int, hkv: int, d: int, hidden: int, inter: int, dtype: torch.dtype) -> list[Callable[[], None]]:
    """Calls of every kernel wrapper on tiny CPU tensors of one model shape (only the head
    counts, sizes and dtype decide a launch's compiled form; batch and lengths do not)."""
    from lmnb_engine.attention.triton_ops import decode_attention_fwd, extend_attention_fwd, store_kv
    from lmnb_engine.layers.triton_ops import rms_norm, rotary_store_kv_, silu_and_mul

    T, B, slots = 4, 2, 16
    q = torch.zeros(T, hq, d, dtype=dtype)
    k = torch.zeros(T, hkv, d, dtype=dtype)
    pool = torch.zeros(slots, hkv, d, dtype=dtype)
    table = torch.zeros(B, 8, dtype=torch.int32)
    i64 = torch.zeros(B, dtype=torch.int64)
    lens = torch.full((B,), 2, dtype=torch.int64)
    splits = torch.ones(B, dtype=torch.int32)
    cos = torch.zeros(T, d, dtype=dtype)
    x = torch.zeros(T, hidden, dtype=dtype)
    return [
        lambda: extend_attention_fwd(q, k, k, torch.empty_like(q), pool, pool, table, i64, i64, lens, i64, 2, d**-0.5),
        lambda: decode_attention_fwd(q[:B], pool, pool, torch.empty_like(q[:B]), table, i64, lens, splits, 16,
                                     d**-0.5),
        lambda: decode_attention_fwd(q[:B], pool, pool, torch.empty_like(q[:B]), table, i64, lens, splits, 1,
                                     d**-0.5),  # one split: the output written directly
        lambda: store_kv(k, k, pool, pool, torch.zeros(T, dtype=torch.int64)),
        lambda: rms_norm(x, torch.ones(hidden, dtype=dtype), 1e-5, residual=x),
        lambda: rms_norm(x, torch.ones(hidden, dtype=dtype), 1e-5),
        lambda: rms_norm(q, torch.ones(d, dtype=dtype), 1e-6),  # Qwen3's per-head q/k norm
        lambda: silu_and_mul(torch.zeros(T, 2 * inter, dtype=dtype)),
        lambda: rotary_store_kv_(q, k, k, cos, cos, pool, pool, torch.zeros(T, dtype=torch.int64)),
    ]


def record_launches(arch: int, shapes=SHAPES, dtypes=DTYPES) -> list[tuple[str, str, Launch]]:
    """(shape name, dtype name, launch) for every kernel launch the wrappers make on ``arch``."""
    out = []
    with _recording(arch) as launches:
        for name, hq, hkv, d, hidden, inter in shapes:
            for dtype in dtypes:
                for call in _wrapper_calls(hq, hkv, d, hidden, inter, dtype):
                    before = len(launches)
                    call()
                    out += [(name, str(dtype)[6:], launch) for launch in launches[before:]]
    return out


def _specialize(launch: Launch, target) -> tuple:
    """(source, options) as ``JITFunction.run`` would build them for ``target``."""
    from triton import knobs
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    backend = make_backend(target)
    kwargs = dict(launch.kwargs)
    kwargs.setdefault("debug", fn.debug or knobs.runtime.debug)
    for knob in ("instrumentation_mode", "fpsan_homomorphic_casts"):
        if hasattr(knobs.compilation, knob):
            kwargs.setdefault(knob, getattr(knobs.compilation, knob))
    try:
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = binder(*launch.args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    except (AttributeError, TypeError) as exc:
        import triton

        raise RuntimeError(f"triton {triton.__version__}'s launch internals differ from those this checker "
                           f"was written for (3.9): {exc}") from exc
    return ASTSource(fn, signature, constexprs, attrs), options


class _Captured(Exception):
    """Raised in place of running ptxas once Triton's ``make_cubin`` has built its command."""


def _ptxas_command(ptx: str, arch: int, options) -> tuple[str, list[str]]:
    """(ptxas path, arguments) that Triton's own ``make_cubin`` runs for this PTX, ``arch`` and the
    compile ``options`` (a ``CUDAOptions``), its source and output files left out.

    ptxas allocates registers differently under the arguments Triton adds (``-lineinfo`` and
    ``--regAllocOptLevel=2`` in triton 3.9, and more under its knobs and options: 78 registers
    for Llama-2-7B's bf16 split decode on sm_90 where ``-v`` alone gives 72), so they are taken
    from Triton's code rather than copied: ``make_cubin`` is called with ``subprocess.run``
    answering by raising, in a temporary directory that takes the files it writes. Raises
    ``RuntimeError`` naming the Triton version if no command of the form
    ``[ptxas, *args, source, "-o", output]`` comes out."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    run = subprocess.run
    commands = []

    def capture(cmd, **kwargs):
        if len(cmd) < 4 or cmd[-2] != "-o":  # not the compile (ptxas --version, say)
            return run(cmd, **kwargs)
        commands.append(list(cmd))
        raise _Captured

    backend = make_backend(GPUTarget("cuda", arch, 32))
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(tempfile, "tempdir", tmp), \
            mock.patch.object(subprocess, "run", capture), contextlib.suppress(_Captured):
        backend.make_cubin(ptx, {}, options, arch)
    if len(commands) != 1:
        raise RuntimeError(f"triton {triton.__version__}'s make_cubin ran {len(commands)} commands of the form "
                           "[ptxas, *args, source, '-o', output], not the one this checker was written for (3.9)")
    [cmd] = commands
    return cmd[0], cmd[1:-3]


def _ptxas_usage(ptx: str, arch: int, options) -> tuple[int, int]:
    """(registers per thread, spill bytes stored + loaded) from ptxas for ``arch``, run with the
    arguments Triton runs it with for ``options`` (``_ptxas_command``; they include ``-v``).

    The answer is kept in Triton's cache (``$TRITON_CACHE_DIR``) under a hash of what decides it:
    the ptxas (its path and version), its arguments and the PTX. Where ``triton.compile`` finds
    its launches cached, these ptxas runs (about 0.25 s each, 576 of them) were nearly all of a
    check's time. Raises ``RuntimeError`` with ptxas's message if it fails."""
    from triton.backends.nvidia.compiler import get_ptxas_version
    from triton.runtime.cache import get_cache_manager

    tool, args = _ptxas_command(ptx, arch, options)
    # (ptxas --version whole, build included, as Triton keys its own cache: tool.version is "12.8")
    key = hashlib.sha256(json.dumps([tool, get_ptxas_version(arch), args, ptx]).encode()).hexdigest()
    cache = get_cache_manager(key)
    cached = cache.get_file("ptxas_usage.json")
    if cached is not None:
        with open(cached) as f:
            registers, spills = json.load(f)
        return registers, spills
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/k.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        res = subprocess.run([tool, *args, src, "-o", f"{tmp}/k.cubin"], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"ptxas {' '.join(args)} failed: {res.stderr.strip()[-500:]}")
    regs = re.search(r"Used (\d+) registers", res.stderr)
    if regs is None:  # Triton's arguments without -v: nothing to read
        raise RuntimeError(f"ptxas {' '.join(args)} printed no register count; its output: {res.stderr[-500:]!r}")
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", res.stderr)]
    registers = int(regs.group(1))
    cache.put(json.dumps([registers, sum(spills)]), "ptxas_usage.json", binary=False)
    return registers, sum(spills)


def compile_launch(launch: Launch, arch: int, dtype: str) -> CompileReport:
    """Compile one recorded launch (of inputs in ``dtype``) for ``arch``. Raises what
    ``triton.compile`` raises."""
    import triton
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", arch, 32)
    src, options = _specialize(launch, target)
    compiled = triton.compile(src, target=target, options=options.__dict__)
    registers, spills = _ptxas_usage(compiled.asm["ptx"], arch, options)
    consts = {k: v for k, v in launch.kwargs.items() if k.isupper()}
    config = ", ".join(f"{k}={v}" for k, v in consts.items())
    config += f", warps={options.num_warps}, stages={options.num_stages}"
    return CompileReport(launch.kernel.__name__, arch, dtype, config, registers, spills,
                         int(compiled.metadata.shared), MAX_SHARED[arch])


def check_arch(arch: int) -> tuple[list[CompileReport], list[str]]:
    """Compile every distinct launch for ``arch``.

    Returns (reports, failures): failures name the kernel, the shape that launched it and the
    compiler's message, for launches that did not compile.
    """
    reports: list[CompileReport] = []
    failures: list[str] = []
    seen: set[tuple] = set()
    for shape, dtype, launch in record_launches(arch):
        key = (launch.kernel.__name__, _launch_key(launch))
        if key in seen:
            continue
        seen.add(key)
        try:
            reports.append(compile_launch(launch, arch, dtype))
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the rest still compile
            failures.append(f"sm_{arch} {launch.kernel.__name__} ({shape} {dtype}): {type(exc).__name__}: "
                            f"{str(exc).strip()[-600:]}")
    print(f"sm_{arch}: {len(reports)} launches compiled, {len(failures)} failed", file=sys.stderr, flush=True)
    return reports, failures


def check(archs=(80, 86, 89, 90), jobs: int = 1) -> tuple[list[CompileReport], list[str]]:
    """``check_arch`` for every architecture, ``jobs`` of them at a time (processes)."""
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(check_arch, archs))
    else:
        results = [check_arch(a) for a in archs]
    return [r for rs, _ in results for r in rs], [f for _, fs in results for f in fs]


def _launch_key(launch: Launch) -> tuple:
    """What decides a launch's compiled form: constexprs and options, argument dtypes, and how
    Triton specializes integers (equal to 1, divisible by 16)."""
    def kind(a):
        if isinstance(a, torch.Tensor):
            return str(a.dtype)
        if isinstance(a, int) and not isinstance(a, bool):
            return ("int", a == 1, a % 16 == 0)
        return type(a).__name__
    return tuple(kind(a) for a in launch.args) + tuple(sorted((k, repr(v)) for k, v in launch.kwargs.items()))


def main(argv: list[str] | None = None) -> int:
    """Command line: compile every kernel launch for ``--arch`` and print the reports; returns the exit
    status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="80,86,89,90", help="compute capabilities, comma-separated")
    ap.add_argument("--jobs", type=int, default=1, help="architectures compiled in parallel (processes)")
    ap.add_argument("--json", action="store_true", help="print reports and failures as JSON")
    args = ap.parse_args(argv)
    from lmnb_engine.triton_support import interpreting

    if interpreting():
        print("unset TRITON_INTERPRET: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    try:
        archs = tuple(int(a) for a in args.arch.split(","))
    except ValueError:
        ap.error(f"--arch takes compute capabilities like 80,90, not {args.arch!r}")
    unknown = [a for a in archs if a not in MAX_SHARED]
    if unknown:
        ap.error(f"no shared-memory limit known for sm_{unknown[0]}; the engine's GPUs are "
                 + ", ".join(f"{a} ({ARCH_NAMES[a]})" for a in MAX_SHARED))
    reports, failures = check(archs, args.jobs)
    if args.json:
        print(json.dumps({"reports": [asdict(r) | {"ok": r.ok} for r in reports], "failures": failures}))
    else:
        for r in reports:
            print(f"{'ok  ' if r.ok else 'BAD '} sm_{r.arch} {r.kernel:22s} {r.dtype:8s} regs {r.registers:3d} "
                  f"spills {r.spill_bytes:5d} shared {r.shared_bytes:6d}/{r.max_shared}  {r.config}")
        for f in failures:
            print("FAIL", f)
    return 0 if not failures and all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
