"""The ``lmnb`` command line: one entry point, one subcommand per job.

Lives in ``lmnb_kernel`` because it sits at the top of the import chain
(lmnb_kernel → lmnb → lmnb_engine); each subcommand imports its module lazily so ``lmnb --help``
is fast and never loads torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, function, one-line help). Each module exposes
# ``add_arguments(parser)`` named ``<function>_arguments`` and ``<function>(args) -> int``.
SUBCOMMANDS = {
    "run": ("lmnb_kernel.run", "run", "execute a notebook headless with the lmnb kernel"),
    "install-kernel": ("lmnb_kernel.install", "install", "install the lmnb kernelspec"),
    "serve": ("lmnb_engine.http_server", "serve", "serve the in-process engine over HTTP"),
    "export": ("lmnb.export", "export", "export a %%lm notebook to a batch script"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lmnb", description="lmnb: LM programs in notebooks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, func, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_)
        p.set_defaults(_target=(module, func))
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            p.set_defaults(_missing=f"'lmnb {name}' is not available in this build ({module} missing)")
            continue
        getattr(mod, f"{func}_arguments")(p)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(args._missing, file=sys.stderr)
        return 2
    module, func = args._target
    return int(getattr(importlib.import_module(module), func)(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
