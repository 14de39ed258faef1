"""Scaffolding the CPU benches share: torch threads, the machine line, the model shape, the report.

Used by ``bench_fewshot_cpu.py``, ``bench_json_decode.py`` and ``bench_llava_cpu.py`` (each
writes a markdown report that starts with the same machine line).
"""

from __future__ import annotations

import argparse
import os
import platform


def cpu_name() -> str:
    """The CPU model from ``/proc/cpuinfo`` (else ``platform.processor()``, else "unknown")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def set_torch_threads() -> int:
    """Set torch's intra-op threads to ``$OMP_NUM_THREADS`` (default 2) and return that number."""
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    return threads


def machine_line(threads: int) -> str:
    """The report's ``- machine:`` line: CPU, cores, torch threads."""
    return f"- machine: {cpu_name()}, nproc {os.cpu_count()}, torch threads {threads}"


def llama_dims(hidden_size: int, layers: int) -> dict:
    """``make_tiny_checkpoint`` keyword arguments of a Llama-shaped language model: heads of 64,
    grouped-query attention with two query heads per KV head, MLP width 8/3 of ``hidden_size``."""
    return dict(hidden_size=hidden_size, intermediate_size=hidden_size * 8 // 3, num_hidden_layers=layers,
                num_attention_heads=hidden_size // 64, num_key_value_heads=max(1, hidden_size // 128),
                max_position_embeddings=2048)


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--out`` option every bench has (see ``write_report``)."""
    parser.add_argument("--out", help="also write the report (markdown) to this file")


def write_report(lines: list[str], out: str | None) -> None:
    """Print the report (one line per item of ``lines``) and, when ``out`` is given, write it there."""
    report = "\n".join(lines) + "\n"
    print(report)
    if out:
        with open(out, "w") as f:
            f.write(report)
