"""The GPU benchmark suite's parts on CPU: paper A.3's optimal hit rate against hand counts, the
HF baseline client against the engine (same checkpoint, so the same greedy tokens and the same
``select`` choices, whatever the batching and left padding), and a ``--smoke`` run of the whole
suite (every workload on every system; achieved hit rate never above the optimal one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHES = Path(__file__).resolve().parent.parent / "benches"
sys.path.insert(0, str(BENCHES))

import clients  # noqa: E402
import workloads  # noqa: E402


def test_optimal_hit_rate_counts_each_tree_position_once():
    # trie of [1 2 3 4], [1 2 3 5], [1 2 6]: 6 positions for 11 prompt tokens
    assert workloads.optimal_hit_rate([([1, 2, 3, 4], []), ([1, 2, 3, 5], []), ([1, 2, 6], [])]) == 1 - 6 / 11


def test_optimal_hit_rate_counts_decoded_tokens_as_cached():
    # A decodes 7 8 9 after [1 2]; B's prompt [1 2 7 8 9 3] repeats it: 7 and 8 have KV already, but
    # 9 (A's last token) was never run through the model, so B computes 9 and 3: 4 of 8 computed.
    assert workloads.optimal_hit_rate([([1, 2], [7, 8, 9]), ([1, 2, 7, 8, 9, 3], [])]) == 0.5


def test_hf_client_matches_engine_client(tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM

    from lmnb_engine import Engine

    prompts = [[5, 9, 200, 31, 77, 4], [5, 9, 200, 8], [300, 301, 302, 303, 304, 305, 306, 307, 308]]
    hf = clients.HFClient(AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32).eval(),
                          pad_id=2, gather_s=0.05)
    try:
        with Engine(str(tiny_llama), max_total_tokens=2048) as eng:
            lm = clients.EngineClient(eng)
            assert hf.gen_many(prompts, 6) == lm.gen_many(prompts, 6)  # batched, left-padded, one budget
            assert [hf.gen(p, 1) for p in prompts] == [lm.gen(p, 1) for p in prompts]
            choices = [[40, 41], [120], [7, 7, 7], [250, 9]]
            assert hf.select(prompts[0], choices) == lm.select(prompts[0], choices)
            assert len(lm.take_requests()) == 3 + 3 + 1 + 4  # the select's prefix hint included
    finally:
        hf.close()


def test_smoke_suite_runs_every_workload_on_every_system(tmp_path):
    import gpu_suite

    gpu_suite.main(["--smoke", "--out-dir", str(tmp_path)])
    (result_file,) = tmp_path.glob("*-smoke.json")
    res = json.loads(result_file.read_text())
    assert res["errors"] == [] and res["skipped"] == []
    ws = res["models"]["tiny-llama"]["workloads"]
    assert sorted(ws) == sorted(w.name for w in workloads.build(512, workloads.SMOKE))
    assert res["models"]["tiny-llama"]["attention_backend"] == "torch"  # what the engine ran (on a CPU)
    for name, r in ws.items():
        for system in ("lmnb", "lmnb_nocache", "hf"):
            assert r[system]["programs_per_s"] > 0 and r[system]["latency_s"] > 0, (name, system)
        assert r["lmnb_nocache"]["hit_rate"] == 0.0
        assert 0 < r["lmnb"]["hit_rate"] <= r["lmnb"]["optimal_hit_rate"] + 1e-9, name
    micro = res["models"]["tiny-llama"]["micro"]
    assert {"decode_b1", "decode_b32", "prefill"} <= set(micro["lmnb"]) and set(micro["hf"]) == set(micro["lmnb"])
    assert result_file.with_suffix(".png").stat().st_size > 0


def test_cpu_hit_rates_runs_full_workloads_with_lmnb_only(tmp_path, monkeypatch):
    """--cpu-hit-rates: the FULL sizes (not SMOKE's), lmnb alone, no speed figures; each workload's
    hit_vs_optimal is its hit rate over the optimal bound computed from its own requests."""
    import gpu_suite

    sizes = {}
    real_engine = gpu_suite.Suite.engine

    def engine(self, model, radix):
        e = real_engine(self, model, radix)
        sizes["pool"], sizes["running"] = e.runner.max_total_tokens, e.runner.max_running_requests
        return e

    monkeypatch.setattr(gpu_suite.Suite, "engine", engine)
    assert gpu_suite.main(["--cpu-hit-rates", "--workloads", "mmlu", "--out-dir", str(tmp_path)]) == 0
    (result_file,) = tmp_path.glob("*-hit-rates.json")
    res = json.loads(result_file.read_text())
    assert res["meta"]["hit_rates_only"] and res["errors"] == [] and res["roofline"] == {}
    from lmnb_engine.model_runner import DEFAULT_MAX_RUNNING

    assert sizes == {"pool": gpu_suite.H200_POOL_TOKENS_7B, "running": DEFAULT_MAX_RUNNING["cuda"]}
    m = res["models"]["tiny-llama"]
    assert m["micro"] == {} and list(m["workloads"]) == ["mmlu"]
    r = m["workloads"]["mmlu"]
    assert set(r) == {"shape", "lmnb"} and r["lmnb"]["programs"] == workloads.FULL.mmlu_subjects * workloads.FULL.mmlu_questions
    lm = r["lmnb"]
    assert lm["hit_rate"] == pytest.approx(lm["cached_tokens"] / lm["prompt_tokens"], abs=1e-4)
    assert lm["hit_vs_optimal"] == pytest.approx(lm["hit_rate"] / lm["optimal_hit_rate"], abs=1e-3)
    # a hand count of the optimum: each subject's 5-shot block is computed once, every question fully
    subjects, per = workloads.FULL.mmlu_subjects, workloads.FULL.mmlu_questions
    assert lm["optimal_hit_rate"] == pytest.approx(
        1 - (subjects * workloads.FULL.mmlu_prefix + (lm["prompt_tokens"] - subjects * per * workloads.FULL.mmlu_prefix))
        / lm["prompt_tokens"], abs=2e-3)
    assert [t["name"] for t in res["targets"] if t["met"] is not None] == ["hit rate / optimal, mmlu (tiny-llama)"]


@pytest.mark.parametrize("scale", [workloads.FULL, workloads.SMOKE], ids=["full", "smoke"])
def test_workload_shapes(scale):
    ws = {w.name: w for w in workloads.build(32000, scale)}
    assert len(ws["mmlu"].items) == scale.mmlu_subjects * scale.mmlu_questions
    prefix, question = ws["mmlu"].items[0]
    assert len(prefix) == scale.mmlu_prefix and scale.mmlu_question[0] <= len(question) <= scale.mmlu_question[1]
    assert all(len(turns) == 4 for turns in ws["chat_long"].items)
    assert all(scale.chat_long_out[0] <= n <= scale.chat_long_out[1] for turns in ws["chat_long"].items for _, n in turns)
    assert all(10 <= t < 32000 for p, q in ws["mmlu"].items for t in p + q)


# gpu_check.py --smoke --tuned, its kernels not compared with torch (most of the pass's time): with no
# tuned table (none on a CPU) they are the very launches the first pass compared, and the part of
# its own is the plumbing (check.json read and added to, the checks' names, the verdict)
TUNED_PASS = """
import sys
benches, out = sys.argv[1:]
sys.argv[1:] = ["--smoke", "--tuned", "--out", out]
sys.path.insert(0, benches)
import gpu_check
gpu_check.against_torch = lambda *batch: (0.0, True)
sys.exit(gpu_check.main())
"""


def test_gpu_check_smoke_passes_every_check(tmp_path):
    """The device script's correctness half (``benches/gpu_check.py``) runs on CPU with tiny
    shapes, kernels interpreted: every check it would run on the H200 passes here, so a GPU
    session does not find it broken."""
    proc = subprocess.run([sys.executable, str(BENCHES / "gpu_check.py"), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = json.loads((tmp_path / "check.json").read_text())["checks"]
    names = " | ".join(c["check"] for c in checks)
    assert all(c["ok"] for c in checks) and len(checks) >= 16
    for part in ("kernel extend", "kernel decode", "one split (direct)", "16 splits", "kernel extend on",
                 "cached prefixes", "fused add + RMSNorm", "SiLU-and-mul", "RoPE", "greedy"):
        assert part in names
    # --tuned (after the kernel timings, with their tuned file): the attention checks again, added
    proc = subprocess.run([sys.executable, "-c", TUNED_PASS, str(BENCHES), str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = json.loads((tmp_path / "check.json").read_text())["checks"]
    assert again[:len(checks)] == checks
    added = [c["check"] for c in again[len(checks):]]
    assert added == ["tuned configs: " + c["check"] for c in checks
                     if c["check"].startswith("kernel ") and " on " not in c["check"]]
    assert all(c["ok"] for c in again)


NORM_CASE = """
import sys, torch
sys.argv.append("--smoke")  # gpu_check interprets Triton then, as this test process does
sys.path.insert(0, sys.argv[1])
import gpu_check
g = torch.Generator().manual_seed(0)
dt = torch.bfloat16
h = ((3 * torch.randn(300, 4096, generator=g)).to(dt) + torch.randn(300, 4096, generator=g).to(dt)).float()
w = (0.2 * torch.randn(4096, generator=g) + 1).to(dt)
inv = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
off = torch.nextafter(torch.nextafter(inv, inv + 1), inv + 1)  # the statistic two float32 ulps off
ref, got, wrong = (w * (h * s).to(dt) for s in (inv, off, inv * 1.02))
print(gpu_check.norm_close(ref, got)[0], gpu_check.norm_close(ref, wrong)[0])
"""


def test_gpu_check_norm_tolerance_allows_the_rounding_of_another_summation_order():
    """gpu_check's RMSNorm check at its Llama-3-8B shape and scales: a row statistic two float32
    ulps off (a summation in another order, as the GPU kernel's is) flips a few normalized
    values by one bf16 step, and the weight multiply rounds them again; that passes, a norm 2%
    off does not."""
    proc = subprocess.run([sys.executable, "-c", NORM_CASE, str(BENCHES)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "False"]


BF16_CASE = """
import sys, torch
import torch.nn.functional as F
sys.argv.append("--smoke")
sys.path.insert(0, sys.argv[1])
import gpu_check as gc
sdpa = F.scaled_dot_product_attention
def other_sdpa(*args, **kw):  # another correct bf16 attention: outputs a rounding step apart now and then
    out = sdpa(*args, **kw)
    noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(out.numel()))
    return (out.float() * (1 + 2**-9 * noise)).to(out.dtype)
path = gc.tiny_checkpoint(full=True)
prompts = gc.make_prompts(500, 6, 60)
for load in (gc.tiny_engine_load("bfloat16"), dict(dtype="bfloat16")):
    F.scaled_dot_product_attention = sdpa
    ref, ref_lp = gc.greedy(path, "torch", False, prompts, 24, top=2, **load)
    F.scaled_dot_product_attention = other_sdpa
    got, got_lp = gc.greedy(path, "torch", False, prompts, 24, **load)
    print(gc.agree(gc.compare_greedy(ref, ref_lp, got, got_lp), strict=False))
"""


def test_gpu_check_bf16_engines_agree_up_to_rounding():
    """gpu_check compares whole bf16 engines (torch vs Triton) on its small checkpoint's shapes:
    an attention whose outputs differ from torch's by bf16 rounding alone must pass that
    comparison. It does with the weights ``tiny_engine_load`` gives bf16 (std 0.02); the
    checkpoint's own (std 0.2) amplify the rounding into different tokens, and fail it."""
    proc = subprocess.run([sys.executable, "-c", BF16_CASE, str(BENCHES)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "False"]


# gpu_suite --smoke (argv[2:]) with its lmnb micro step held once it has measured, until a signal
# ends the process: a SIGTERM sent once the step says so lands in that step, however slow this machine
HELD_MICRO = """
import sys, time
sys.path.insert(0, sys.argv[1])
import gpu_suite
measured = gpu_suite.Suite.lmnb_micro
def held(self, *args, **kwargs):
    measured(self, *args, **kwargs)
    print("micro measured", flush=True)
    time.sleep(600)
gpu_suite.Suite.lmnb_micro = held
sys.exit(gpu_suite.main(sys.argv[2:]))
"""


def test_suite_cut_short_by_sigterm_still_reports(tmp_path):
    """gpu_check.sh's ``timeout`` ends an overrunning suite with SIGTERM: the results file then
    names the step it cut, and the report (targets, plot) of what was measured is still written.
    The SIGTERM comes while the micro step is held, once it has measured: sent as the step began,
    it landed in a later step, or between two ("(between steps)"), where the test process was slow
    to send it and the smoke step quick."""
    import signal
    proc = subprocess.Popen([sys.executable, "-c", HELD_MICRO, str(BENCHES), "--smoke", "--out-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if line == "micro measured\n":
                proc.send_signal(signal.SIGTERM)
                break
        out += proc.stdout.readlines()
        assert proc.wait(120) == 124, "".join(out)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdout.close()
    (result_file,) = tmp_path.glob("*-smoke.json")
    res = json.loads(result_file.read_text())
    cut = [s["step"] for s in res["skipped"] if s["why"] == "cut short by SIGTERM (the time limit)"]
    assert cut == ["tiny-llama: lmnb micro"], res["skipped"]
    assert res["models"]["tiny-llama"]["micro"]["lmnb"]  # (what the cut step measured is reported)
    assert len(res["targets"]) == 6 and res["roofline"]
    assert "== lmnb suite" in "".join(out)


@pytest.mark.parametrize("name, cls", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1", "matmul"),  # cuBLAS
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "matmul"),
    ("_decode_split_kernel", "attention"), ("_decode_merge_kernel", "attention"), ("_extend_kernel", "attention"),
    ("_store_kv_kernel", "kv store"), ("_rms_norm_kernel", "norm"), ("_rotary_kernel", "rope"),
    ("_silu_and_mul_kernel", "activation"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
     "unsigned int, long, 4, 4> >", "sampling"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>, std::array<char*, 1ul> >",
     "other"),
])
def test_profile_classifies_lmnb_and_cublas_kernels(name, cls):
    """The profile's coarse classes for the kernel names a decode step launches on the GPU: lmnb's
    own Triton kernels (``lmnb_engine/**/triton_ops``), cuBLAS's GEMMs, torch's argmax."""
    import gpu_profile

    assert gpu_profile.classify(name) == cls


def test_profile_sums_operator_time_by_name():
    """profile_call on CPU: two matmuls and one add under the profiler come back as aten::mm x2 and
    aten::add x1, and the total is the sum of the classes."""
    import torch

    import gpu_profile

    a = torch.randn(256, 256)
    r = gpu_profile.profile_call(lambda: (a @ a, a @ a, a + a), "cpu")
    calls = {t["name"]: (t["calls"], t["class"]) for t in r["top"]}
    assert calls["aten::mm"] == (2, "matmul") and calls["aten::add"] == (1, "other")
    assert r["kernel_ms"] == pytest.approx(sum(r["by_class"].values()), abs=1e-2)
    assert sum(t["share"] for t in r["top"]) <= 1.0 + 1e-3


def test_profile_smoke_profiles_every_run(tmp_path):
    """``gpu_profile.py --smoke``: the four runs (graphs or eager decode at batch 1, decode at
    batch 32, prefill), each with the model's matmuls among its operators and no error; the
    linear layers' shapes are the model's, their bandwidth the bytes they move over their time."""
    import gpu_profile

    assert gpu_profile.main(["--smoke", "--out-dir", str(tmp_path)]) == 0
    (result_file,) = tmp_path.glob("*-profile-smoke.json")
    res = json.loads(result_file.read_text())
    assert res["errors"] == [] and list(res["runs"]) == ["decode_b1", "decode_b1_eager", "decode_b32", "prefill"]
    for name, r in res["runs"].items():
        assert r["steps"] == (1 if name == "prefill" else 4)
        assert r["by_class"].get("matmul", 0) > 0, (name, r["by_class"])
        assert r["kernel_ms_per_step"] == pytest.approx(r["kernel_ms"] / r["steps"], abs=1e-3)
    # the smoke checkpoint: hidden 128, 4 heads of 32, 2 KV heads, MLP 256, vocabulary 512 (the
    # default), float32: qkv 128 -> 128 + 2 * 64, o_proj 128 -> 128, gate_up 128 -> 512, down
    # 256 -> 128, lm_head 128 -> 512; one row per forward at batch 1
    eager = res["runs"]["decode_b1_eager"]["linears"]
    assert {(x["m"], x["k"], x["n"]) for x in eager} == {(1, 128, 256), (1, 128, 128), (1, 128, 512), (1, 256, 128)}
    for x in eager:
        moved = 4 * (x["m"] * x["k"] + x["n"] * x["k"] + x["m"] * x["n"])
        # (gbps is rounded to 0.1 GB/s, us_per_call to 0.01 us)
        assert x["gbps"] == pytest.approx(moved / (x["us_per_call"] * 1e-6) / 1e9, rel=0.01, abs=0.051)


def test_kernel_tuner_smoke_times_every_config_against_the_default(tmp_path):
    """``gpu_kernels.py --smoke`` (its own process: it interprets Triton): the extend cases of two
    models, both decode cases and a GEMV against torch's, every configuration timed and equal to
    the default's output (float32, only the tiling differs), FLOPs and bytes as counted by hand,
    one best per case."""
    tuned_path = tmp_path / "tuned.json"
    proc = subprocess.run([sys.executable, str(BENCHES / "gpu_kernels.py"), "--smoke", "--out-dir", str(tmp_path),
                           "--write-tuned", str(tuned_path)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result_file,) = tmp_path.glob("*-kernels-smoke.json")
    res = json.loads(result_file.read_text())
    assert res["errors"] == []
    # tiny model: 2 query heads, 2 KV heads, head_dim 16. Prefill [0, 0] + [40, 24] new: 40*41/2 +
    # 24*25/2 = 1120 visible pairs; prefix [20, 9] + [12, 17]: 20*12 + 12*13/2 + 9*17 + 17*18/2 = 624
    extend = {r["case"]: r for r in res["extend"]}
    assert {c: (r["pairs"], r["flops"]) for c, r in extend.items() if c.startswith("tiny/")} == {
        "tiny/prefill": (1120, 4 * 16 * 2 * 1120), "tiny/prefix": (624, 4 * 16 * 2 * 624)}
    # the second model (4 query heads) tries the default, then the fastest two of the first's prefill
    assert extend["tiny-gqa/prefill"]["flops"] == 4 * 16 * 4 * 1120
    ranked = sorted(extend["tiny/prefill"]["configs"], key=lambda x: x["ms"])
    assert [x["config"] for x in extend["tiny-gqa/prefix"]["configs"]] == [
        {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}] + [
        x["config"] for x in ranked if not x["default"]]
    # decode, float32: 2 (K and V) x 2 KV heads x 16 x 4 bytes per token; 70 and 70+33+90+5 tokens
    decode = {r["case"]: r for r in res["decode"]}
    assert {c: r["kv_bytes"] for c, r in decode.items()} == {"tiny/b1": 256 * 70, "tiny/b4": 256 * 198}
    # GEMV, float32, 45 x 70 weights: (45 * 70 + 45 + 70) * 4 bytes; cuBLAS the default, then 2 configs
    (gemv,) = res["gemv"]
    assert (gemv["case"], gemv["bytes"]) == ("gemv/odd", 13060)
    assert [x["config"].get("block_n") for x in gemv["configs"]] == [None, 8, 16]
    for r in res["extend"] + res["decode"] + res["gemv"]:
        rows = r["configs"]
        assert sum(x["default"] for x in rows) == 1 and rows[0]["default"], r["case"]
        assert all("error" not in x and x["rel_err"] < 1e-5 and not x["wrong"] for x in rows), rows
        (best,) = [x for x in rows if x.get("best")]
        assert best["ms"] == min(x["ms"] for x in rows)
    assert len(extend["tiny/prefill"]["configs"]) == 2  # the default (16x16) and 32x16
    # b1: the default at the grid's 4 splits, then at 1 (direct, no merge), 2, 8 and 16; b4 (a grid
    # of 1): the default and the 2 configs, then the default at 2 and 4 splits
    assert [(x["config"]["block_n"], x["splits"]) for x in decode["tiny/b1"]["configs"]] == [
        (16, 4), (16, 1), (16, 2), (16, 8), (16, 16)]
    assert [(x["config"]["block_n"], x["splits"]) for x in decode["tiny/b4"]["configs"]] == [
        (16, 1), (16, 1), (32, 1), (16, 2), (16, 4)]
    # the tuned file, keyed by head_dim / GQA group / dtype, is the JSON's "tuned" (what it holds
    # depends on the interpreter's timings: its rule is tested below)
    tuned = json.loads(tuned_path.read_text())
    assert tuned == res["tuned"] and tuned["device"] == "cpu (smoke)"
    assert set(tuned["extend"]) <= {"d16/g1/float32", "d16/g2/float32"} and set(tuned["decode"]) <= {
        "d16/g1/float32/direct"}  # (b1's split kernel runs the default alone)
    assert {r["key"] for r in res["extend"]} == {"d16/g1/float32", "d16/g2/float32"}
    assert {r["case"]: r["key"] for r in res["decode"]} == {"tiny/b1": "d16/g1/float32/split",
                                                           "tiny/b4": "d16/g1/float32/direct"}


def test_tuned_configurations_are_kept_only_where_correct_and_5_percent_faster():
    """``tuned_table``: per key, a configuration run correctly in every case, slower than the
    default in none (beyond 2 % of noise), 5 % faster in total; decode rows count at the engine's
    split grid only; a key with a case still to run (or failed) is left out."""
    sys.path.insert(0, str(BENCHES))
    import gpu_kernels

    def row(cfg, ms, default=False, wrong=False, splits=None):
        r = {"config": dict(zip(("block_n", "num_warps", "num_stages"), cfg)), "default": default, "wrong": wrong,
             "ms": ms}
        return r if splits is None else {**r, "splits": splits}

    res = {"extend": [
        # key A: (1, 4, 1) is 10 % faster on both cases; (2, 4, 1) 20 % faster on one but wrong on the other
        {"key": "A", "configs": [row((9, 4, 1), 10.0, default=True), row((1, 4, 1), 9.0), row((2, 4, 1), 8.0)]},
        {"key": "A", "configs": [row((9, 4, 1), 10.0, default=True), row((1, 4, 1), 9.0),
                                 row((2, 4, 1), 8.0, wrong=True)]},
        # key B: 4 % faster in all (8 + 11.2 against 8.5 + 11.5): below the margin, nothing kept
        {"key": "B", "configs": [row((9, 4, 1), 8.5, default=True), row((3, 4, 1), 8.0)]},
        {"key": "B", "configs": [row((9, 4, 1), 11.5, default=True), row((3, 4, 1), 11.2)]},
        # key C: the faster one failed to compile: nothing kept
        {"key": "C", "configs": [row((9, 4, 1), 10.0, default=True), {"config": {"block_n": 4, "num_warps": 4,
                                  "num_stages": 1}, "default": False, "error": "out of resources"}]},
        # key E: 20 % faster on the long case, 20 % slower on the short one (9.1 % in total): not kept,
        # nor is (7, 4, 1), 20 % faster where it ran but not run on the second case
        {"key": "E", "configs": [row((9, 4, 1), 10.0, default=True), row((6, 4, 1), 8.0), row((7, 4, 1), 8.0)]},
        {"key": "E", "configs": [row((9, 4, 1), 4.0, default=True), row((6, 4, 1), 4.8)]},
        # key F: 50 % faster, but a case of F is still to run
        {"key": "F", "configs": [row((9, 4, 1), 10.0, default=True), row((8, 4, 1), 5.0)]},
    ], "decode": [
        # the default at another split count (16) is faster still, but is no configuration to keep;
        # at the engine's grid (1) (5, 4, 2) is 25 % faster
        {"key": "D", "grid_splits": 1, "configs": [row((9, 4, 2), 4.0, default=True, splits=1),
                                                   row((5, 4, 2), 3.0, splits=1), row((9, 4, 2), 1.0, splits=16)]},
    ]}
    table = gpu_kernels.tuned_table(res, "GPU X", "3.6.0", incomplete=frozenset({"F"}))
    assert table == {"device": "GPU X", "triton": "3.6.0",
                     "extend": {"A": {"block_n": 1, "num_warps": 4, "num_stages": 1}},
                     "decode": {"D": {"block_n": 5, "num_warps": 4, "num_stages": 2}}}


def test_kernel_tuner_never_picks_a_wrong_config():
    import torch

    import gpu_kernels

    ref = torch.tensor([1.0, -2.0, 4.0])
    for out, err in ((ref + 0.04, 0.01), (ref + 0.2, 0.05), (torch.tensor([1.0, float("nan"), 4.0]), None),
                     (torch.tensor([1.0, float("inf"), 4.0]), None)):
        rec = {}
        gpu_kernels._check(rec, out, ref)
        assert rec["rel_err"] == (pytest.approx(err) if err is not None else None)
        assert rec["wrong"] is (err is None or err > gpu_kernels.TOLERANCE)
    rec = {}
    gpu_kernels._check(rec, ref, torch.tensor([1.0, float("nan"), 4.0]))  # a default gone wrong: none passes
    assert rec["wrong"]

    res = gpu_kernels._mark_best({"configs": [{"ms": 1.0, "wrong": True, "default": False},
                                              {"ms": 2.0, "wrong": False, "default": True},
                                              {"error": "does not compile", "default": False}]})
    assert [x.get("best", False) for x in res["configs"]] == [False, True, False]
    assert res["best_speedup"] == 1.0
