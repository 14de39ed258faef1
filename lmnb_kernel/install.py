"""``lmnb install-kernel``: install the ``lmnb`` kernelspec for Jupyter.

Writes kernel.json to a temporary directory and hands it to ``KernelSpecManager.install_kernel_spec``,
as ``ipykernel install`` does (research/jupyter.md §1.3). ``argv`` uses this interpreter's absolute
path, so a Jupyter server in another environment still starts the kernel in this one.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from lmnb_engine.cli_options import Once, OnceFlag

KERNEL_NAME = "lmnb"
DISPLAY_NAME = "lmnb (Python 3)"


def kernel_spec(python: str | None = None, display_name: str = DISPLAY_NAME) -> dict:
    """The kernel.json contents (``interrupt_mode: signal``: Ctrl-C reaches the cell as SIGINT).
    ``kernel_protocol_version`` is the one the kernel's ``kernel_info_reply`` gives, ipykernel's
    (7.4 says 5.3, though its own kernelspec claims 5.5: a frontend reads subshell support from
    ``supported_features``, not from the version); left out where ipykernel cannot be imported
    (that kernel cannot start, and says why as ``lmnb run`` or Jupyter starts it).
    ``metadata.supported_encryption`` is what ipykernel's own kernelspec declares (``["curve"]`` in
    7.4, whose kernel takes CurveZMQ keys from its connection file, as ours, its subclass,
    does): without it a kernel manager asked for ``transport_encryption="auto"`` gave ipykernel's
    kernel keys and ours none, so ours ran in plain text and logged "Kernel is running over TCP
    without encryption". (Under jupyter_client's default, "disabled", both log it.)"""
    try:
        from ipykernel._version import kernel_protocol_version
        from ipykernel.kernelspec import get_kernel_dict
    except ImportError:
        kernel_protocol_version, get_kernel_dict = None, None

    spec = {
        "argv": [python or sys.executable, "-m", "lmnb_kernel", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "env": {"TOKENIZERS_PARALLELISM": "false"},
        "metadata": {"debugger": True, "lmnb": {"spec_version": 1}},
    }
    if kernel_protocol_version is not None:
        spec["kernel_protocol_version"] = kernel_protocol_version
    encryption = get_kernel_dict().get("metadata", {}).get("supported_encryption") if get_kernel_dict else None
    if encryption is not None:
        spec["metadata"]["supported_encryption"] = encryption
    return spec


def install_arguments(parser) -> None:
    """Add the options of ``lmnb install-kernel`` to ``parser``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action=OnceFlag, help="install for the current user (the default)")
    where.add_argument("--sys-prefix", action=OnceFlag, help=f"install into this environment ({sys.prefix})")
    where.add_argument("--prefix", metavar="PATH", action=Once, help="install under PATH/share/jupyter/kernels")
    parser.add_argument("--name", default=KERNEL_NAME, action=Once, help=f"kernelspec name (default {KERNEL_NAME!r})")
    parser.add_argument("--display-name", metavar="TEXT", action=Once,
                        help=f"the name Jupyter's launcher and kernel menu show (default {DISPLAY_NAME!r}, "
                             f"and {display_name('NAME')!r} with --name NAME)")


def display_name(name: str) -> str:
    """The default display name of kernelspec ``name``: two installs under different names (two
    environments) would otherwise look the same in JupyterLab's launcher."""
    return DISPLAY_NAME if name == KERNEL_NAME else f"{DISPLAY_NAME[:-1]}, {name})"


def install(args) -> int:
    """Install the kernelspec; prints where it went. Returns 0, or 2 with a message on stderr for
    a name Jupyter refuses or a place that cannot be written."""
    from jupyter_client.kernelspec import KernelSpecManager

    prefix = sys.prefix if args.sys_prefix else args.prefix
    if not args.name:  # (jupyter_client then names the spec after its temporary source folder)
        print(f"lmnb install-kernel: --name is empty; give the kernelspec's name, or leave the option out for "
              f"{KERNEL_NAME!r}", file=sys.stderr)
        return 2
    shown = display_name(args.name) if args.display_name is None else args.display_name.strip()
    if not shown:
        print("lmnb install-kernel: --display-name is empty; give the text the launcher should show, or leave "
              "the option out", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "kernel.json").write_text(json.dumps(kernel_spec(display_name=shown), indent=2))
            dest = KernelSpecManager().install_kernel_spec(
                tmp, kernel_name=args.name, user=prefix is None, prefix=prefix
            )
    except ValueError as e:  # jupyter_client's check of the name
        print(f"lmnb install-kernel: --name {args.name!r}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a prefix that is a file, or a folder this user cannot write
        where = "--sys-prefix" if args.sys_prefix else f"--prefix {prefix}" if prefix else "--user"
        print(f"lmnb install-kernel: cannot install with {where}: {e}; choose a folder you can write "
              "(--user, or --prefix PATH)", file=sys.stderr)
        return 2
    print(f"installed kernelspec {args.name!r} ({shown}) in {dest}")
    return 0
