"""Notebooks for the export tests, and helpers to run a notebook's cells and an exported script.

The reference for an exported script is the notebook itself: its cells run in an IPython shell
with the ``lmnb_kernel`` extension (the real ``%%lm`` magic, static view), one notebook pass per
input row, the row's fields set right after the cell that defines the notebook's example.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]


def notebook(*cells) -> nbformat.NotebookNode:
    """A notebook from cell sources: ``str`` = code, ``("md", text)``, ``("parameters", code)``."""
    nb = new_notebook()
    for c in cells:
        if isinstance(c, str):
            nb.cells.append(new_code_cell(c))
        elif c[0] == "md":
            nb.cells.append(new_markdown_cell(c[1]))
        else:
            nb.cells.append(new_code_cell(c[1], metadata={"tags": ["parameters"]}))
    nb.metadata["kernelspec"] = {"name": "lmnb", "display_name": "lmnb", "language": "python"}
    return nb


# Few-shot QA: a parameters cell, the example in its own cell, a setup cell that builds the prompt
# from it (so it runs per row), gen + select, Python between %%lm cells, a display-only command,
# a named state continued by a later cell, a fork over a list, and a --python cell.
QA = notebook(
    ("md", "# Few-shot QA\nAnswer, then judge the answer."),
    ("parameters", "max_len = 6"),
    'import lmnb\nexamples = ["red", "blue"]',
    'question = "What color is the sky?"',
    'prompt = f"Q: {question}\\nA:"',
    '%%lm --temperature 0 --state chat\n{prompt}{gen answer max_tokens=max_len stop="\\n"}\n'
    'Is that right?{select verdict choices=["yes", "no"]}',
    "%lm stats\nshort = answer.strip()[:8]",
    "%%lm --temperature 0 --state chat\n{fork ex in examples}\nCompare {ex} with {short}:{gen cmp max_tokens=4}\n{join}",
    '%%lm --python --temperature 0 --max-tokens 3\ns += "Say: " + short\ns += lmnb.gen("said")',
    "%lm tree",
)

# Chat roles over two turns, with two row fields set in one cell.
CHAT = notebook(
    'topic = "cats"\nperson = "Ada"',
    "%%lm --temperature 0\n{system}\nYou are terse.\n{/system}\n{user}\n{person} asks about {topic}.\n{/user}\n"
    "{assistant}\n{gen reply max_tokens=5}\n{/assistant}\n{user}\nShorter?\n{/user}\n"
    "{assistant}\n{gen reply2 max_tokens=3}\n{/assistant}",
)

# Cells as IPython runs them but not as typed: an indented %%lm cell (IPython drops the shared
# indentation) and a --python body pasted from an interactive session (IPython drops its prompts).
PASTED = notebook(
    'question = "What color is the sky?"',
    "  %%lm --temperature 0\n  Q: {question}\n    \n  A:{gen answer max_tokens=4}",
    '    %%lm --python --temperature 0 --max-tokens 3\n    >>> for w in ["Say:", answer]:\n'
    '    ...     s += w\n    >>> s += lmnb.gen("said")',
)

BUILTIN = {"qa": QA, "chat": CHAT, "pasted": PASTED}


def notebooks() -> dict:
    """name → notebook: every notebook in notebooks/ and the builtin ones above."""
    out = {f"notebooks/{p.name}": nbformat.read(p, as_version=4) for p in sorted((REPO / "notebooks").glob("*.ipynb"))}
    out.update({f"builtin:{k}": v for k, v in BUILTIN.items()})
    return out


def example_values(plan) -> dict:
    """The notebook's example value of each row field (its first string-literal assignment)."""
    import ast

    from lmnb.export.cells import Code

    values = {}
    for cell in plan.cells:
        if not isinstance(cell, Code):
            continue
        tree = ast.parse(cell.source)
        for name in plan.inputs:
            for first, _ in cell.string_assignments.get(name, []):
                stmt = next(s for s in tree.body if s.lineno == first)
                values.setdefault(name, ast.literal_eval(stmt.value))
    return values


class NotebookRunner:
    """Runs notebooks cell by cell in one IPython shell with ``%load_ext lmnb_kernel``."""

    def __init__(self):
        from helpers_shell import process_shell

        import lmnb

        self.shell = process_shell()
        self.default_backend = lmnb.api._default_backend
        self.run_cell("%load_ext lmnb_kernel")

    def close(self) -> None:
        """Unload the extension, so its post-cell hooks (``%lm tree`` refresh) leave the shared
        process shell with it, and put back lmnb's default backend (a notebook's cell may set its
        own, which unloading keeps)."""
        import lmnb

        self.shell.extension_manager.unload_extension("lmnb_kernel")
        lmnb.api._default_backend = self.default_backend

    def run_cell(self, source: str) -> None:
        from IPython.utils.capture import capture_output

        with capture_output():
            result = self.shell.run_cell(source)
        if not result.success:
            raise AssertionError(f"notebook cell failed: {source[:60]!r}: {result.error_in_exec or result.error_before_exec!r}")

    def run(self, nb, plan, row: dict | None = None) -> dict:
        """Run every code cell; with ``row``, set its fields after the last cell that sets the
        notebook's example of one. Returns the user namespace."""
        from lmnb.export.cells import Code

        self.shell.reset(new_session=False)
        self.run_cell("%lm reset")
        inject_after = max((c.index for c in plan.setup if isinstance(c, Code)
                            and set(c.string_assignments) & set(plan.inputs)), default=0)
        if row is not None and inject_after == 0:
            self.shell.user_ns.update(row)
        for index, cell in enumerate(nb.cells, start=1):
            if cell.cell_type == "code" and cell.source.strip():
                self.run_cell(cell.source)
            if row is not None and index == inject_after:
                self.shell.user_ns.update(row)
        return self.shell.user_ns


def jsonable(value):
    """``value`` as it reads back from a results file."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=repr))


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_results(path: Path) -> list:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def script_env(model) -> dict:
    return {**os.environ, "LMNB_MODEL": str(model), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_script(script: Path, *args, model) -> tuple[int, str, dict]:
    """Run an exported script as ``__main__`` in this process (the engine loads without a new
    Python and torch import); returns (exit status, stderr, the script's globals). lmnb's default
    backend and $LMNB_MODEL are restored afterwards."""
    import contextlib
    import io
    import runpy

    import lmnb.api

    argv, env, backend = sys.argv, os.environ.get("LMNB_MODEL"), lmnb.api._default_backend
    sys.argv = [str(script), *map(str, args)]
    os.environ["LMNB_MODEL"] = str(model)
    err = io.StringIO()
    namespace: dict = {}
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            namespace = runpy.run_path(str(script), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv, lmnb.api._default_backend = argv, backend
        if env is None:
            os.environ.pop("LMNB_MODEL")
        else:
            os.environ["LMNB_MODEL"] = env
    return code, err.getvalue(), namespace
