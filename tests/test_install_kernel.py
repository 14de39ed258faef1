"""``lmnb install-kernel``: where the kernelspec goes, and clear errors for what Jupyter refuses."""

from __future__ import annotations

import json
import subprocess
import sys


def _install(*args):
    return subprocess.run([sys.executable, "-m", "lmnb_kernel.cli", "install-kernel", *args],
                          capture_output=True, text=True, timeout=120)


def test_install_kernel_writes_the_spec_under_the_prefix(tmp_path):
    out = _install("--prefix", str(tmp_path), "--name", "lmnb-test")
    assert out.returncode == 0, out.stderr
    spec = json.loads((tmp_path / "share/jupyter/kernels/lmnb-test/kernel.json").read_text())
    assert spec["argv"][1:3] == ["-m", "lmnb_kernel"] and spec["display_name"] == "lmnb (Python 3, lmnb-test)"
    assert out.stdout.startswith("installed kernelspec 'lmnb-test' (lmnb (Python 3, lmnb-test)) in ")


def test_install_kernel_display_names_tell_installs_apart(tmp_path):
    # every install was "lmnb (Python 3)": two of them looked the same in JupyterLab's launcher
    kernels = tmp_path / "share/jupyter/kernels"
    assert _install("--prefix", str(tmp_path)).returncode == 0
    assert _install("--prefix", str(tmp_path), "--name", "lmnb-gpu", "--display-name", " lmnb on the GPU ").returncode == 0
    shown = {d.name: json.loads((d / "kernel.json").read_text())["display_name"] for d in kernels.iterdir()}
    assert shown == {"lmnb": "lmnb (Python 3)", "lmnb-gpu": "lmnb on the GPU"}
    out = _install("--prefix", str(tmp_path), "--name", "other", "--display-name", "  ")
    assert out.returncode == 2 and out.stderr.startswith("lmnb install-kernel: --display-name is empty")
    assert not (kernels / "other").exists()


def test_install_kernel_with_a_name_jupyter_refuses_says_so_without_a_traceback(tmp_path):
    # Jupyter kernel names are ASCII letters, digits, '-', '.', '_': a space is refused.
    out = _install("--prefix", str(tmp_path), "--name", "my kernel")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("lmnb install-kernel: --name 'my kernel': Invalid kernel name")
    assert not (tmp_path / "share").exists()
    # an empty name: jupyter_client named the spec after its temporary folder ("tmpmyj8xppx")
    out = _install("--prefix", str(tmp_path), "--name", "")
    assert (out.returncode, out.stderr) == (2, "lmnb install-kernel: --name is empty; give the kernelspec's name, or "
                                                "leave the option out for 'lmnb'\n")
    assert not (tmp_path / "share").exists()


def test_install_kernel_under_a_prefix_that_is_a_file_says_so_without_a_traceback(tmp_path):
    (tmp_path / "file").write_text("")
    out = _install("--prefix", str(tmp_path / "file"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"lmnb install-kernel: cannot install with --prefix {tmp_path / 'file'}: ")
    assert "Not a directory" in out.stderr and "--user, or --prefix PATH" in out.stderr
