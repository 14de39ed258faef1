"""The main loop of ``Job.run``: which rows run, running them on a thread pool, writing each
finished row at once, stopping cleanly on Ctrl-C, and the summary. With several threads, what a
row prints (stdout, and stderr apart) comes out in one piece when the row ends (``RowOutput``).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from lmnb.bar_stream import is_live, progress_bar
from lmnb.batch.inputs import InputRow, input_format
from lmnb.batch.messages import say
from lmnb.batch.options import UnreadableValue, key_refusal_fix, make_backend, parameter_type, start_failure
from lmnb.batch.record import RowRecorder
from lmnb.batch.store import BAD_INPUT, ERROR, OK, ResultStore, StoreError, input_hash, row_key
from lmnb_engine.json_schema import json_value

EXIT_OK, EXIT_ROW_ERRORS, EXIT_FATAL, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 128 + 13  # (SIGPIPE's number): what a shell reports for a tool that `| head` closed


class RowRunner:
    """One run of a job over its rows (``Job.run`` makes one); ``run`` returns the exit status."""

    def __init__(self, job, args, store: ResultStore, rows: list[InputRow], run_row, programs, backend=None,
                 unread: bool = False):
        self.job, self.args, self.store, self.backend = job, args, store, backend
        self.unread = unread  # the input has rows past --limit, which this run does not read
        self.rows, self.run_row, self.programs = rows, run_row, list(programs)
        self.skipped = 0  # done rows left as they are (rows still bad input are counted as that instead)
        self.bad_again = 0  # rows still unusable as their bad_input record says (the record stands)
        self.new = {OK: 0, ERROR: 0, BAD_INPUT: 0}
        self.tokens = {"prompt": 0, "cached": 0, "completion": 0}
        self.seconds = 0.0
        self.signals = 0  # SIGINT count; SIGTERM counts as two
        self.left = 0  # rows this run should do and has not written (a Ctrl-C that leaves none ends nothing)
        self.pipe_closed = False  # a row's print met a closed stdout (`job.py | head -1`)
        # the backend's words for each row this run that failed with no connection to it (pool threads
        # append: list.append is atomic), so the summary blames the backend, not the input
        self.unreachable: list[str] = []
        # the same for rows whose call the server refused for the API key (BackendAuthError, HTTP 401),
        # without the key advice each row's error ends with (the summary gives it once)
        self.key_refused: list[str] = []
        # the same for rows whose program this backend cannot run (BackendCannotRun), whatever their input
        self.cannot_run: list[str] = []
        # and the errors of rows whose code read a name nothing set (a NameError): the notebook's
        # code, not the row's input, which reaches it as run_row's arguments (a missing field is bad_input)
        self.undefined: list[str] = []
        self.outputs: tuple[RowOutput, ...] = ()  # sys.stdout and sys.stderr kept per row (several threads)
        self.written: dict[int, str] = {}  # row index → status of each record this run wrote

    def run(self) -> int:
        """Run the rows not yet done (``triage``) and print the summary; returns the exit status."""
        todo = self.triage()
        self.left = len(todo)
        self.job.warn_of_shared_state(len(todo))
        if todo and self.backend is not None:
            self.execute(self.backend, todo)
        elif todo:
            try:
                backend = make_backend(self.args, self.job.default_model)
            except (OSError, ValueError, RuntimeError, ImportError) as e:
                self.store.drop_if_unwritten()
                return fatal(start_failure(self.args, self.job.default_model, e))
            try:
                self.execute(backend, todo)
            finally:
                self._shut_down(backend)
        with _StopOnSignals(self):
            if self.pipe_closed:
                silence_stream("stdout")
            self.summary()
        if self.signals and self.left:  # (once every row is written, a Ctrl-C stops nothing)
            return EXIT_INTERRUPTED
        if self.pipe_closed:
            return EXIT_BROKEN_PIPE
        counts = self.store.counts
        return EXIT_ROW_ERRORS if counts[ERROR] or counts[BAD_INPUT] else EXIT_OK

    def _shut_down(self, backend) -> None:
        """``backend.shutdown()``. A Ctrl-C meanwhile is counted, as while rows ran; a second one
        (or SIGTERM) stops a shutdown that hangs rather than leave the job wedged."""
        try:
            with _StopOnSignals(self, stop_now=True):
                backend.shutdown()
        except KeyboardInterrupt:
            say("lmnb batch: the backend's shutdown was stopped (Ctrl-C twice)")

    # -- which rows run ---------------------------------------------------------------------------
    def triage(self) -> list[tuple[InputRow, dict]]:
        """Skip rows already done; write unusable rows as ``bad_input``; return (row, key fields).

        A ``bad_input`` record says what the input was when it was read, so each run reads it again:
        the record stands while its row is unusable in the same way, and is replaced otherwise (the
        row was fixed, so it runs; keyed by position because it had no id, it now has one, or the
        line is gone); those of rows past ``--limit``, which this run does not read, stay. A failed
        row (``error``) whose input changed is run again on the new input.

        Raises:
            StoreError: a done row's record was written for other input than the row under its key
                now (the input was edited, sorted or replaced); nothing is written then.
        """
        todo, seen_ids, bad, changed, redo = [], {}, [], [], []
        old_bad, kept, keys = self.store.bad_inputs(), set(), set()
        id_field = self.args.id_field
        for row in self.rows:
            base: dict = {"row": row.index, "line": row.line, "input_hash": input_hash(self._program_input(row))}
            error = row.error
            if error is None and id_field is not None:
                ident = row.fields.get(id_field)
                if id_field not in row.fields:
                    error = f"line {row.line}: no {id_field!r} field (--id-field {id_field})"
                elif not isinstance(ident, (str, int)) or isinstance(ident, bool):
                    error = f"line {row.line}: the id field {id_field!r} must be a string or an integer, got {ident!r}"
                elif str(ident) in seen_ids:  # (as row_key: 7 and "7" are one id)
                    error = (f"line {row.line}: id {ident!r} appears again (first on line {seen_ids[str(ident)]}); "
                             "ids must be unique")
                else:
                    seen_ids[str(ident)] = row.line
                    base["id"] = ident
            if error is None:
                missing = [f for f in self.job.inputs if f not in row.fields]
                if missing:
                    has = ", ".join(map(str, row.fields)) or "no fields"
                    error = (f"line {row.line}: missing field{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(map(repr, missing))} (the row has {has})")
                    spaced = [k for k in row.fields if isinstance(k, str) and k != k.strip() and k.strip() in missing]
                    if spaced:  # ("question, context" as a CSV header: the second column is " context")
                        error += (f"; {', '.join(map(repr, spaced))} {'have' if len(spaced) > 1 else 'has'} "
                                  "spaces around the name: remove them from the input's column names")
                    error += _other_separator(row.fields, missing) or _misspelt(row.fields, missing, self.job.inputs)
                nulls = [f for f in self.job.inputs if f in row.fields and row.fields[f] is None]
                if nulls and not missing:  # (a null would run into the prompt as the text "None")
                    error = (f"line {row.line}: {'fields' if len(nulls) > 1 else 'field'} {', '.join(map(repr, nulls))} "
                             f"{'are' if len(nulls) > 1 else 'is'} null; give a value, or leave the row out")
                elif not missing:
                    error = _not_text(row, self.job.texts) or _read_typed(row, self.job.types)
            key = row_key(base)
            keys.add(key)
            if self.store.done(key):
                if self._replaced(key, base["input_hash"], error, old_bad):
                    redo.append(key)  # (below: written as bad input again, or run)
                else:
                    if not self.store.same_input(key, base["input_hash"]):
                        changed.append((row, key))
                    kept.add(key)
                    if key in old_bad:  # still bad input: said again, and counted so (its record stands)
                        bad.append((None, error))
                    else:
                        self.skipped += 1
                    continue
            if error is not None:
                bad.append((base, error))
                continue
            todo.append((row, base))
        if changed:
            raise StoreError(self._changed_input(changed))
        # (with exactly --limit rows left, the rows past them are gone, not unread: their records go too)
        stale = {k for k in old_bad.keys() - kept
                 if not (self.unread and self.store.failed[k]["row"] >= len(self.rows))}
        self.store.forget(set(redo) | stale)
        self.store.drop_forgotten()  # (not before the input is known to fit the file)
        if not self.unread:
            self._warn_of_other_rows(self.store.keys - keys)
        for base, error in bad:
            say(f"lmnb batch: {self.args.input} {error}")
            if base is None:
                self.bad_again += 1
            else:
                self.write({**base, "status": BAD_INPUT, "error": error})
        return todo

    def _warn_of_other_rows(self, others: set) -> None:
        """Warn of the records of rows this input no longer has (it was cut short, or rows were
        taken out): they stay, and the summary counts them, while the bad_input records of such
        rows are dropped (``triage``)."""
        if not others:
            return
        keys = sorted(others, key=lambda k: (k[0], k[1] if k[0] == "row" else 0, str(k[1])))  # (row 10 after row 9)
        names = [f"id {k[1]!r}" if k[0] == "id" else f"row {k[1]}" for k in keys]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        say(f"lmnb batch: warning: {self.args.output} holds {len(names)} record{'s' * (len(names) > 1)} of rows "
            f"this input does not have ({shown}); they are kept and counted below; write to another --output to "
            "have this input's rows alone")

    def _replaced(self, key: tuple, digest: str, error, old_bad: dict) -> bool:
        """Whether the done row under ``key`` is done again: its record is bad input other than the
        row's now (``old_bad``: ``ResultStore.bad_inputs``), or an error on input that changed since."""
        if key in old_bad:
            return old_bad[key] != (digest, error)
        return key in self.store.failed and not self.store.same_input(key, digest)

    def _program_input(self, row: InputRow):
        """What ``run_row`` reads of a row: its ``Job.inputs`` fields. Other columns (a gold answer
        added for scoring later) do not make a done row's input another one. A malformed row's
        bytes as read (``InputRow.raw``), which tell it from another."""
        if not isinstance(row.fields, dict):
            return row.raw
        return {name: row.fields.get(name) for name in self.job.inputs}

    def _changed_input(self, changed: list[tuple[InputRow, tuple]]) -> str:
        lines = ", ".join(str(r.line) for r, _ in changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        keyed = (f"by --id-field {self.args.id_field}" if self.args.id_field
                 else "by their position in the input (--id-field keys them by an id instead)")
        unreadable = [r.error for r, _ in changed if r.error is not None]
        if unreadable:  # (a done row broken by an edit: `echo ROW >> rows.jsonl`, no last line break)
            more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
            fix = f"the input cannot be read there now: {unreadable[0]}{more}; fix the input and run again"
        else:
            fix = "write to a new output file, or remove those rows' records to run them again"
        if input_format(self.args.input, self.args.input_format) != "jsonl":  # (a table converted from JSON lines)
            fix += ("; if the first run read these rows as JSON lines: CSV values are strings, so a number "
                    "there (7) is other input than the same digits here (\"7\")")
        return (f"{self.store.path} holds results for other input than {self.args.input} has now under the same keys "
                f"(rows are keyed {keyed}): {len(changed)} row{'s' if len(changed) > 1 else ''}, on line"
                f"{'s' if len(changed) > 1 else ''} {lines}; {fix}")

    def write(self, record: dict) -> None:
        """Append one row's ``record`` to the output and count it by status."""
        self.store.write(record)
        self.new[record["status"]] += 1
        self.written[record["row"]] = record["status"]

    # -- running ----------------------------------------------------------------------------------
    def execute(self, backend, todo: list) -> None:
        """Run the rows of ``todo`` on ``backend`` (``--num-threads`` at a time), writing each as it
        finishes."""
        import lmnb.api

        previous = lmnb.api._default_backend  # restored after, for scripts run inside a longer process
        lmnb.set_default_backend(backend)
        try:
            self._execute(backend, todo)
        finally:
            lmnb.set_default_backend(previous)

    def bar_pipe_closed(self) -> None:
        """The progress bar met stderr a closed pipe: the job stops as at a row's print there
        (the rows in flight finish, none starts, exit 141)."""
        self.pipe_closed = True

    def _execute(self, backend, todo: list) -> None:
        if len(todo) > 1:
            self.cache_prefixes(backend)
        live = is_live(sys.stderr)  # (else its lines go to a log: 2> job.log, nohup, CI)
        bar = progress_bar(len(todo), live, self.bar_pipe_closed, unit="row", disable=self.args.no_progress,
                           dynamic_ncols=True, desc=self.args.output.name)
        window = 2 * self.args.num_threads
        pending = iter(todo)
        start = time.perf_counter()
        pool = ThreadPoolExecutor(self.args.num_threads, thread_name_prefix="lmnb-row")
        inflight: dict = {}  # each running row's future -> its place in the input
        shown = None if bar.disable else bar  # (one row at a time without it: its prints go out as they come)
        group = self.args.num_threads > 1
        streams = sys.stdout, sys.stderr = (RowOutput(sys.stdout, shown, group, live),
                                            RowOutput(sys.stderr, shown, group, live))
        self.outputs = streams
        with _StopOnSignals(self):  # (until the pool is shut down: a Ctrl-C is counted, never raised)
            try:
                self._run_pool(pool, pending, inflight, window, bar)
            finally:
                sys.stdout, sys.stderr = (out.target for out in streams)
                self.outputs = ()
                for out in streams:  # (a line left unended by a thread a row started)
                    try:
                        out.close()
                    except BrokenPipeError:
                        self.pipe_closed = True
                    except OSError:  # (a full disk: no row is left to fail for it, and the rows are written)
                        pass
            bar.close()
            self.seconds = time.perf_counter() - start
            pool.shutdown(wait=not inflight, cancel_futures=True)
        if inflight:  # stopped at once: rows still running are not written; a rerun does them
            n = len(inflight)
            say(f"lmnb batch: stopping now, without {_the_rows(n)} still running (a rerun does "
                f"{'it' if n == 1 else 'them'})")
            self.summary()
            self.store.close()
            with contextlib.suppress(OSError):  # (a closed or full stderr: the job ends with 130 all the same)
                sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)

    def _run_pool(self, pool, pending, inflight: dict, window: int, bar) -> None:
        """Keep ``window`` rows in flight and write each as it finishes, until all are done or a
        signal or a closed pipe stops the job (``inflight`` then holds the rows still running).
        The rows one wait finds done are written in input order: with one thread, the output's
        order is the input's."""
        announced = False
        places = itertools.count()
        while True:
            while self.signals == 0 and not self.pipe_closed and len(inflight) < window:
                item = next(pending, None)
                if item is None:
                    break
                inflight[pool.submit(self.run_one, *item)] = next(places)
            if not inflight or self.signals > 1:
                break
            done, _ = wait(inflight, timeout=0.25, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=inflight.get):
                del inflight[future]
                record = future.result()
                if record is None:  # (its print met a closed stdout: not done, a rerun does it)
                    continue
                self.write(record)
                self.left -= 1
                for k in self.tokens:
                    self.tokens[k] += record["tokens"][k]
                bar.update()
                if self.new[ERROR]:
                    bar.set_postfix(errors=self.new[ERROR], refresh=False)
            if self.signals == 1 and not announced:
                announced = True
                for future in list(inflight):  # rows queued but not started: a rerun does them
                    if future.cancel():
                        del inflight[future]
                if inflight:  # (none: the rows all finished, or the rest were not started)
                    say(f"lmnb batch: stopping; finishing {_the_rows(len(inflight))} already running "
                        "(Ctrl-C again to stop now)")  # (sys.stderr, the rows' RowOutput: above the bar)

    def cache_prefixes(self, backend) -> None:
        """Prefill each program's constant prefix once (``run_batch``'s prefix hint, paper §3)."""
        from lmnb.tracer import extract_prefix

        for program in self.programs:
            try:
                prefix = extract_prefix(program, backend.get_chat_template())
                if prefix:
                    backend.cache_prefix(prefix, uuid.uuid4().hex)
            except Exception as e:  # noqa: BLE001 - only a hint; the rows report real failures
                say(f"lmnb batch: prefix hint for {program!r} skipped: {type(e).__name__}: {e}")

    def run_one(self, row: InputRow, base: dict) -> dict | None:
        """Run one row (on a pool thread); returns its record, or None if the row wrote to a
        closed pipe: then, as a Unix tool stops at SIGPIPE, no new row starts. Never raises."""
        import lmnb

        recorder = RowRecorder()
        start = time.perf_counter()
        error = None
        try:
            for out in self.outputs:
                out.begin()
            try:
                with lmnb.observe(recorder):
                    self.run_row(**{name: row.fields[name] for name in self.job.inputs})
            finally:
                for out in reversed(self.outputs):  # stderr first: stdout's may meet a closed pipe
                    out.end()  # (a failing row's prints too)
        except BrokenPipeError:
            self.pipe_closed = True
            return None
        except Exception as e:  # noqa: BLE001 - a failing row is written with its error
            error = f"{type(e).__name__}: {e}{_where(e, self.run_row)}"
            from lmnb.backend.base import BackendAuthError, BackendCannotRun, BackendUnreachable, without_key_fix

            for kind, failed in ((BackendUnreachable, self.unreachable), (BackendCannotRun, self.cannot_run),
                                 (BackendAuthError, self.key_refused)):
                cause = _in_chain(e, kind)
                if cause is not None:
                    failed.append(without_key_fix(cause))
            if isinstance(e, NameError):
                self.undefined.append(error)
        record = {
            **base,
            "status": OK if error is None else ERROR,
            "variables": dict(recorder.variables),
            "finish_reasons": recorder.finish_reasons(),
            "tokens": dict(recorder.tokens),
            "seconds": round(time.perf_counter() - start, 3),
        }
        if error is not None:
            record["error"] = error
        return record

    # -- report -----------------------------------------------------------------------------------
    def summary(self) -> None:
        """Print the output file's row counts and this run's rows, speed and tokens to stderr."""
        c, n, t = self.store.counts, self.new, self.tokens
        ran = n[OK] + n[ERROR]
        lines = [f"lmnb batch: {self.args.output}: {_rows(sum(c.values()))} "
                 f"({c[OK]} ok, {c[ERROR]} failed, {c[BAD_INPUT]} bad input)"]
        bad = n[BAD_INPUT] + self.bad_again
        lines.append(f"  this run: {_rows(ran)} ran ({n[OK]} ok, {n[ERROR]} failed), {bad} bad input, "
                     f"{self.skipped} already done" + (f", {self.store.retried} errors retried" if self.store.retried else ""))
        if ran and self.seconds > 0:
            if n[OK]:  # (rows that all failed at once had a speed: "0.0 s: 677.26 rows/s")
                lines.append(f"  {self.seconds:.1f} s: {ran / self.seconds:.2f} rows/s, "
                             f"{t['completion'] / self.seconds:.1f} generated tokens/s")
            rate = f"{100 * t['cached'] / t['prompt']:.0f}%" if t["prompt"] else "n/a"
            lines.append(f"  tokens: prompt {t['prompt']}, cached {t['cached']} (cache hit rate {rate}), "
                         f"generated {t['completion']}")
        if self.store.repaired:
            lines.append(f"  {self._torn_note()}")
        if self.pipe_closed:
            lines.append("  stopped early: the rows' printed output went to a pipe that closed (| head?); run "
                         "the same command again to do the remaining rows")
        elif self.signals and self.left:
            lines.append("  stopped early: run the same command again to do the remaining rows")
        elif self.unreachable or self.key_refused or self.cannot_run or self.undefined:
            # not the input's fault: "fix the input" would mislead
            if self.unreachable:
                lines.append(f"  {_rows(len(self.unreachable))} failed because the backend could not be reached "
                             f"({self.unreachable[0]}); once it answers, run the same command again with "
                             "--retry-errors to rerun the failed rows (rows already done are kept)")
            if self.key_refused:
                why, fix = key_refusal_fix(self.args)
                lines.append(f"  {_rows(len(self.key_refused))} failed because {why} ({self.key_refused[0]}); "
                             f"{fix}, then run the same command again with --retry-errors to rerun the failed rows "
                             "(rows already done are kept)")
            if self.cannot_run:
                lines.append(f"  {_rows(len(self.cannot_run))} failed because the program cannot run on this "
                             f"backend, whatever the input ({self.cannot_run[0]}); change the notebook as that says "
                             "and export it again, or change the backend (the job's --backend, --openai MODEL, "
                             "--completion, --continue-final-message); then run with --retry-errors to rerun the failed rows (rows already "
                             "done are kept)")
            if self.undefined:
                lines.append(f"  {_rows(len(self.undefined))} failed because the notebook's code reads a name that "
                             f"nothing set ({self.undefined[0]}), which no input row can fix; in the notebook, set it in a "
                             "cell above the one that reads it (lmnb export notes a cell that reads one only a later "
                             "cell sets) and export it again; then run with --retry-errors to rerun the failed "
                             "rows (rows already done are kept)")
            failed = len(self.unreachable) + len(self.key_refused) + len(self.cannot_run) + len(self.undefined)
            if failed < c[ERROR] or c[BAD_INPUT]:
                lines.append('  other rows with "status": "error" or "bad_input" say why in "error"')
        elif c[ERROR] or c[BAD_INPUT]:
            kinds = " or ".join(f'"{k}"' for k, n in (("error", c[ERROR]), ("bad_input", c[BAD_INPUT])) if n)
            hint = "fix the input and run again: rows whose input changed run again"
            if c[ERROR]:  # an error need not be the input's: the backend failed, or timed out
                hint += "; --retry-errors also reruns failed rows on the same input (after a backend error)"
            lines.append(f'  rows with "status": {kinds} say why in "error"; {hint}')
        if self.signals and not self.left and not self.pipe_closed:
            lines.append("  Ctrl-C came, but every row is written: the job is complete")
        say("\n".join(lines))

    def _torn_note(self) -> str:
        """What became of the row whose record a killed run left half-written (``ResultStore.torn_row``):
        it said "its row ran again" also where it did not run (past --limit, or the job stopped first)."""
        said = "the output's last line was incomplete (a run was killed while writing it) and was removed"
        row = self.store.torn_row
        if row is None:
            return f"{said}; too little of it was written to tell its row, which counts as not done"
        status = self.written.get(row)
        if status == BAD_INPUT:
            return f"{said}; its row, row {row}, was written again as bad input"
        if status is not None:
            return f"{said}; its row, row {row}, ran again"
        if row >= len(self.rows):
            if self.unread:
                return f"{said}; its row, row {row}, is past --limit, so it did not run: a run that reaches it runs it"
            return f"{said}; the input has no row {row} now"
        if self.signals or self.pipe_closed:
            return f"{said}; its row, row {row}, did not run before the job stopped: a rerun runs it"
        return f"{said}; its row, row {row}, did not run this time"


_JSON_KINDS = ((bool, "a boolean"), ((int, float), "a number"), (list, "a list"), (dict, "an object"))


def _not_text(row: InputRow, texts) -> str | None:
    """The error for a row that gives a text field (``Job.texts``) a value other than a string
    (null is said apart), or None."""
    wrong = [(f, row.fields[f]) for f in texts if row.fields.get(f) is not None and not isinstance(row.fields[f], str)]
    if not wrong:
        return None
    shown = "; ".join(f"field {f!r} is {next(kind for t, kind in _JSON_KINDS if isinstance(v, t))}, {json.dumps(v):.40}"
                      for f, v in wrong)
    example = json.dumps(f"{json.dumps(wrong[0][1]):.40}")
    return (f"line {row.line}: {shown}; the notebook's example of {'it' if len(wrong) == 1 else 'each'} is text, "
            f"which its code was written for: give a string (in quotes, e.g. {example})")


def _read_typed(row: InputRow, types: dict) -> str | None:
    """Read the row's fields that are notebook parameters (``Job.types``) as their options read
    text, in place (a JSON value as its JSON text, which the options read as the command line's:
    32, [1, 2], a list for a tuple or a set, as JSON has neither); the error for the first that
    does not read so, or None. The error shows the value as JSON, as the row holds it (``got
    true``, not Python's ``'True'``), without the command line's hint of the shell's quotes."""
    for name, kind in types.items():
        value = row.fields[name]
        try:
            # (JSON's \ud83d\ude00 escapes, read back as a Python literal, were two lone surrogates)
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            row.fields[name] = parameter_type(kind())(text)
        except UnreadableValue as e:
            return (f"line {row.line}: field {name!r}: {e.saying(json_value(value, 40))}; it is the notebook's "
                    f"parameter {name}, whose default is of type {kind.__name__}")
    return None


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _the_rows(n: int) -> str:
    """"the row" or "the N rows" (it said "the 1 rows")."""
    return "the row" if n == 1 else f"the {n} rows"


class RowOutput:
    """``sys.stdout`` (or ``sys.stderr``) while rows run. It writes a lone surrogate, which no
    stream can encode, as U+FFFD. On several threads (``group``; ``begin`` / ``end`` around each
    row), what a row's thread prints is kept and written in one piece when the row ends, so the
    lines of rows running together do not interleave (nor do the pieces of one ``print``: its text
    and its newline are two writes). GNU parallel groups its jobs' output the same way by default. A
    row's piece ends its last line, so the next row's starts on a line of its own. Other threads
    (the main one, and threads a row starts itself) write through.

    With the progress ``bar`` shown, text goes out in whole lines, each written as ``tqdm.write``
    writes where the bar is ``live`` (drawn in place): the bar is cleared first and drawn again
    below, where a print ran into the bar's line on a terminal ("out.jsonl:   0%|...| 0/3
    [...]row says x0"); a bar written in lines (a log) is left as it is, as it would write a line
    after each print. A line not yet ended waits for its newline, or for the row's end (``end``),
    which ends it.

    Attributes:
        target: the stream rows' output goes to (the ``sys.stdout`` this replaced).
    """

    def __init__(self, target, bar=None, group: bool = False, live: bool = True):
        self.target = target
        self.bar = bar  # the tqdm bar on stderr, or None (--no-progress)
        self.live = live
        self.group = group
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pending: dict[int, str] = {}  # thread id → its line not yet ended (with a bar)

    def begin(self) -> None:
        """Start keeping what this thread prints, if ``group`` (call at a row's start)."""
        if self.group:
            self._local.buffer = io.StringIO()

    def end(self) -> None:
        """Write what this thread printed since ``begin`` in one piece, or its line not yet ended,
        ending its last line (call at a row's end).

        Raises:
            BrokenPipeError: stdout is a pipe its reader closed.
        """
        buffer = self._local.__dict__.pop("buffer", None)
        with self._lock:
            text = self._pending.pop(threading.get_ident(), "")  # (written before the row: it comes first)
        self._put(text + (buffer.getvalue() if buffer is not None else ""))

    def close(self) -> None:
        """Write the lines threads left unended (after the rows ran)."""
        with self._lock:
            texts, self._pending = list(self._pending.values()), {}
        for text in texts:
            self._put(text)

    def _put(self, text: str) -> None:
        """Write ``text``, its last line ended, in one piece (above the bar)."""
        if not text:
            return
        if not text.endswith("\n"):
            text += "\n"
        if self.bar is None or not self.live:
            with self._lock:
                self.target.write(text)
                self.target.flush()
            return
        with self.bar.external_write_mode(file=self.bar.fp):  # (tqdm's lock: the bar is not drawn meanwhile)
            self.target.write(text)
            self.target.flush()

    def write(self, text: str) -> int:
        # A lone surrogate (print("\\ud800")) no stream can encode failed the row that printed it;
        # it is written as U+FFFD, as the lmnb kernel shows it (a valid pair as its character).
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        buffer = getattr(self._local, "buffer", None)
        if buffer is not None:
            return buffer.write(text)
        if self.bar is not None:
            with self._lock:
                lines, newline, rest = (self._pending.pop(threading.get_ident(), "") + text).rpartition("\n")
                if rest:
                    self._pending[threading.get_ident()] = rest
            if newline:
                self._put(lines + newline)
            return len(text)
        with self._lock:
            return self.target.write(text)

    def flush(self) -> None:
        if getattr(self._local, "buffer", None) is None:
            self.target.flush()

    def __getattr__(self, name: str):  # fileno, encoding, isatty, ... of the real stream
        return getattr(self.target, name)


class _StopOnSignals:
    """While running rows: Ctrl-C asks to stop after the rows in flight, a second Ctrl-C (or
    SIGTERM) to stop now. The handlers only count, so a record is never cut by a signal; with
    ``stop_now``, a count of two or more raises ``KeyboardInterrupt`` (no record is being written)."""

    def __init__(self, run: RowRunner, stop_now: bool = False):
        self.run = run
        self.stop_now = stop_now
        self.saved: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig, weight in ((signal.SIGINT, 1), (signal.SIGTERM, 2)):
                self.saved[sig] = signal.signal(sig, lambda *_, w=weight: self._hit(w))
        return self

    def _hit(self, weight: int) -> None:
        self.run.signals += weight
        if self.stop_now and self.run.signals > 1:
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        return False


def _misspelt(fields, missing: list, inputs: list) -> str:
    """The "did you mean" for a row whose field names a ``missing`` one misspelt (``persn`` for
    ``person``: the error named both with no word that they are one), or "". Not for a field the
    job reads, nor one that only has spaces around a missing name (said as such). A field close to
    several missing names is offered for the closest (the first of equals), not renamed twice."""
    from difflib import SequenceMatcher

    from lmnb_engine.suggest import close_match

    others = [k for k in fields if isinstance(k, str) and k not in inputs and k.strip() not in missing]
    meant: dict = {}  # row field → the missing name it is offered for
    for name in missing:
        found = close_match(name, others)
        if found is not None and (found not in meant or SequenceMatcher(None, found, name).ratio() >
                                  SequenceMatcher(None, found, meant[found]).ratio()):
            meant[found] = name
    pairs = [(found, name) for name in missing for found in meant if meant[found] == name]
    if len(pairs) == 1:
        return f"; did you mean {pairs[0][1]!r} for the row's {pairs[0][0]!r}? rename it in the input"
    if pairs:
        return f"; did you mean {', '.join(f'{a!r} → {b!r}' for a, b in pairs)}? rename them in the input"
    return ""


def _other_separator(fields, missing: list) -> str:
    """A hint for a table whose columns are not separated by commas (or tabs in a .tsv): a
    spreadsheet's semicolon CSV reads as one column "id;question". "" when that is not it."""
    for name in fields if isinstance(fields, dict) else ():
        for sep in (";", "|", "\t", ","):
            if isinstance(name, str) and sep in name and set(missing) & {n.strip() for n in name.split(sep)}:
                return (f"; the column name {name!r} looks like several separated by {sep!r}: the input must be "
                        "comma-separated (CSV), or tab-separated (.tsv, --input-format tsv); save it so")
    return ""


def _in_chain(error: BaseException, kind: type):
    """The first ``kind`` in ``error``'s chain (a failed gen's ``ProgramError`` holds the backend's
    error as its cause), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _where(error: BaseException, run_row) -> str:
    """' (job.py line N, notebook cell C)': the last line of ``run_row``'s script in the error's
    traceback, and the ``# -- cell C`` comment above it (exported scripts mark each cell so)."""
    code = getattr(run_row, "__code__", None)
    filename = getattr(code, "co_filename", None)
    tb, lineno = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    if lineno is None:
        return ""
    import linecache
    import re

    top = code.co_firstlineno if lineno >= code.co_firstlineno else 1  # (not above run_row's own def)
    marks = (re.match(r"\s*# -- cell (\d+)", linecache.getline(filename, i)) for i in range(lineno, top - 1, -1))
    cell = next((m.group(1) for m in marks if m), None)
    return f" ({os.path.basename(filename)} line {lineno}" + (f", notebook cell {cell})" if cell else ")")


def silence_stream(name: str) -> None:
    """Point the process's ``sys.<name>`` (``"stdout"`` or ``"stderr"``) at /dev/null, so that
    flushing what the rows printed into the closed pipe raises no BrokenPipeError at exit (the
    recipe of Python's signal docs)."""
    stream = getattr(sys, name)
    if stream is not getattr(sys, f"__{name}__") or stream is None:
        return  # (replaced, e.g. captured by a test: not the pipe)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):
        pass


def fatal(message: str) -> int:
    """Print ``message`` as the job's error; returns the exit status for it."""
    say(f"lmnb batch: {message}")
    return EXIT_FATAL
