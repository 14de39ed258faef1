"""Run an lmnb notebook's programs over a data file: the runtime of scripts from ``lmnb export``.

``Job`` is what the script calls (``python job.py --input rows.jsonl --output results.jsonl``);
``read_rows`` reads JSON lines / CSV inputs with line numbers; ``ResultStore`` is the append-only,
resumable results file; ``RowRecorder`` collects a row's captured variables and token counts;
``RowRunner`` is the main loop. Nothing here imports torch: only ``--backend engine`` loads the engine.
"""

from lmnb.batch.inputs import InputError, InputRow, read_rows
from lmnb.batch.job import UNBOUND, Job, continued, row_copy, star_import, star_values
from lmnb.batch.options import parameter_options
from lmnb.batch.record import RowRecorder
from lmnb.batch.runner import RowRunner
from lmnb.batch.store import ResultStore, StoreError, row_key

__all__ = ["UNBOUND", "InputError", "InputRow", "Job", "ResultStore", "RowRecorder", "RowRunner", "StoreError",
           "continued", "parameter_options", "read_rows", "row_copy", "row_key", "star_import", "star_values"]
