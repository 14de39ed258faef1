"""`lmnb export` of a notebook that imports a module of the user's with many top-level objects.

helpers.py beside the notebook makes N lists and N/5 instances at its top level; the set-up cell
imports it twice (`import helpers`, `from helpers import *`) and the row cell has L lines that read
them (`x1 = helpers.C1[0] + ...`), so that the notes on what the rows change in the module's
objects (``notes_modules``) look at every object for every row node. Seconds of CPU time for one
export (``export_notebook``, which parses and plans the notebook and writes the script), least of R.

    OMP_NUM_THREADS=1 python benches/bench_export_module_notes.py --out benches/results/DATE-cpu-export-module-notes.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benches/ is not a package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # (helpers_export.notebook)

from cpu_bench import add_out_argument, cpu_name, write_report  # noqa: E402


def export_seconds(objects: int, lines: int, repeats: int) -> float:
    """The least CPU time of ``repeats`` exports of the notebook the module docstring describes."""
    from helpers_export import notebook

    from lmnb.export import export_notebook

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "helpers.py").write_text(
            "".join(f"C{i} = [{i}]\n" for i in range(objects))
            + "class K:\n    def f(self):\n        self.n = 1\n"
            + "".join(f"k{i} = K()\n" for i in range(objects // 5)), encoding="utf-8")
        row = "\n".join(f"x{i} = helpers.C{i % objects}[0] + len(str(q)) * {i}" for i in range(lines)) + "\nr = str(x1)"
        nb = notebook("import helpers\nfrom helpers import *\nq = 'A'", "%%lm --temperature 0\n{q}{gen x max_tokens=1}",
                      row, "%%lm --temperature 0\n{r}{gen z max_tokens=1}")
        times = []
        for _ in range(repeats):
            start = time.process_time()
            export_notebook(nb, folder=Path(folder))
            times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_out_argument(parser)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    lines = [f"# {__doc__.splitlines()[0]}", "", f"- machine: {cpu_name()}", "",
             "| objects N | row lines L | export CPU s |", "|---|---|---|"]
    for objects, rows in [(10, 30), (100, 300)]:
        lines.append(f"| {objects} | {rows} | {export_seconds(objects, rows, args.repeats):.2f} |")
    write_report(lines, args.out)


if __name__ == "__main__":
    main()
