"""The results file of a batch job: append-only JSON lines, each row exactly once across crashes.

How "exactly once" holds:
- A record is written with one ``os.write`` of ``json + "\\n"`` on an ``O_APPEND`` descriptor, so it
  reaches the operating system before the next row is considered done; a killed process loses at
  most the line it was writing.
- A line without its newline at the end of the file is the one a killed run was writing: ``open``
  cuts it off (that row runs again), unless it holds a whole record (an editor left out the last
  line break): that is kept, and the next record starts with the line break. Any other line that
  is not a JSON record means someone else changed the file, and ``open`` refuses to continue
  instead of guessing.
- Rows already in the file are skipped by key: ``("row", index)``, or ``("id", value)`` with
  ``--id-field``. Each record carries a hash of the row's fields the program reads
  (``input_hash``), so a rerun whose input holds another row under that key is refused rather than
  skipping it (a failed row's record is replaced instead: its input was fixed), and a fingerprint
  of the script's code (``script``), so records written by an edited script are counted and named.
- Records to replace (``forget``) are removed by rewriting the file to a temporary one renamed over
  it, before the run writes anything.
- Blank lines (an editor's trailing newline) are ignored.
- An exclusive ``flock`` on the file keeps a second run from appending to it at the same time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Collection, Optional

from lmnb.output_paths import OutputInUse, lock_output, make_folders, remove_if_unwritten, why_unwritable

# Statuses of a record: the row ran, its program failed, or the input record itself is unusable.
OK, ERROR, BAD_INPUT = "ok", "error", "bad_input"


_RECORD_START = b'{"row": '  # how every record begins (the runner puts "row" first)


def _not_ours(path: Path, lineno: int, line: bytes) -> str:
    """The error for ``line`` (line ``lineno`` of ``path``), which holds no result record, naming
    the field that is not as the job writes it where it is a JSON object (``_flaw``)."""
    value = _loaded(line)
    why = f"{_flaw(value)}: " if isinstance(value, dict) else ""
    return (f"{path} line {lineno} is not a result record of this job ({why}it was changed by something else, "
            "or is another file); move the file away or fix that line, then run again")


_OUTPUT_FIX = "give --output a path in a folder this job can write to (e.g. --output results.jsonl)"


def _unwritable(path: Path, e: OSError) -> str:
    """Why the output file ``path`` cannot be opened to append to and read back (``e``), with the fix."""
    return (f"cannot open the output file {path} to append the results to and read them back: "
            f"{why_unwritable(path, e)}; {_OUTPUT_FIX}")


class StoreError(RuntimeError):
    """The results file cannot be used (locked by another run, changed by hand, other options)."""


def input_hash(fields: Any) -> str:
    """A short sha256 (16 hex digits) of one input row's fields that the program reads (key order
    does not count), or of a malformed row's bytes as read (``InputRow.raw``: every such row hashed
    as its fields, None, so all had one hash), stored as ``input_hash``."""
    data = fields if isinstance(fields, bytes) else json.dumps(fields, sort_keys=True, ensure_ascii=True,
                                                               default=repr).encode("ascii")
    return hashlib.sha256(data).hexdigest()[:16]


def row_key(record: dict) -> tuple:
    """The key a record is done under: ``("id", the id as text)`` if it has one, else ``("row", index)``.
    An id read from CSV is text: ``"7"`` there is the row a JSON-lines input gave as ``7``."""
    if "id" in record:
        return ("id", str(record["id"]))
    return ("row", record["row"])


class ResultStore:
    """The output of one job run. Use ``open`` first, then ``done``/``write``, then ``close``.

    ``id_field``: the ``--id-field`` of this run (None = rows are keyed by their index); a file
    written with different keying is refused, since its keys would not match. ``settings``: what
    this run's results depend on (notebook parameters, backend, model; JSON values); each record
    carries them, and a file whose rows were run with other settings is refused, so one file never
    mixes results of two configurations (records from before settings were written are taken, as
    are records whose "settings" is empty, ``{}``, which records none).
    ``script``: the fingerprint of the script's code (``Job``'s ``code_fingerprint``), written into
    each record; ``other_script`` counts the records of done rows written by other code.
    """

    def __init__(self, path: Path, id_field: Optional[str] = None, settings: Optional[dict] = None,
                 script: Optional[str] = None):
        self.path = Path(path)
        self.id_field = id_field
        self.settings = settings
        self.script = script
        self.other_script = 0
        self.keys: set = set()
        self.input_hashes: dict[tuple, str] = {}  # key → input_hash of the done row (records that have one)
        self.failed: dict[tuple, dict] = {}  # key → record of done rows whose records are errors (error or bad_input)
        self.counts = {OK: 0, ERROR: 0, BAD_INPUT: 0}
        self.repaired = False  # a torn last line was cut off by open()
        self.torn_row: Optional[int] = None  # the "row" of that line, where enough of it was written to tell
        self.retried = 0  # error records dropped by open(retry_errors=True)
        self._forgotten: set = set()  # keys whose records drop_forgotten() removes from the file
        self._fd: Optional[int] = None
        self._line_open = False  # the file's last line has no line break yet
        self.made_folder: Optional[Path] = None  # the folder open() made for the file, if it made one
        self._made_file = False  # open() made the file (drop_if_unwritten removes it again)

    # -- opening ------------------------------------------------------------------------------------
    def open(self, retry_errors: bool = False) -> None:
        """Lock the file (creating it, and its folders that do not exist: ``made_folder``), cut off
        a torn last line and load the keys of done rows.

        With ``retry_errors`` the records of failed rows are set aside (``forget``), so those rows
        run again.

        Raises:
            StoreError: the file's folder cannot be made, another run holds the lock, a line is not a JSON record, the records
                were keyed differently (with/without ``--id-field``), or a row has two records.
        """
        try:  # (made, as lmnb run and lmnb export make theirs; said by the job)
            self.made_folder = make_folders(self.path)
        except OSError as e:  # (a file there was "[Errno 20] Not a directory" from open())
            raise StoreError(_unwritable(self.path, e)) from None  # (in lmnb run's and lmnb export's words)
        try:
            if self.path.exists() and not self.path.is_file():  # (reading a pipe back would wait forever)
                what = "a folder" if self.path.is_dir() else "not a regular file (a pipe, a terminal or a device)"
                raise StoreError(f"the output {self.path} is {what}; the results are appended to a file and read "
                                 "back to resume, so give a file's path (follow it with tail -f FILE)")
            self._made_file = not self.path.exists()
            self._fd = self._locked_fd()
            records = self._load()
        except OSError as e:  # (it said "[Errno 2] No such file or directory" of --output /proc/o.jsonl)
            raise StoreError(_unwritable(self.path, e)) from None
        for _, record in records:  # (before --retry-errors removes anything from a file it refuses)
            self._check_keying(record)
            self._check_settings(record)
        for _, record in records:
            key = row_key(record)
            if key in self.keys:  # (the job writes each key once: two result files joined, say)
                what = f"id {record['id']!r}" if key[0] == "id" else f"row {record['row']}"
                raise StoreError(f"{self.path} holds two records of {what}, so it is not one run's results (two "
                                 "files joined?); keep one record of each row, or write to a new output file")
            self.keys.add(key)
            if isinstance(record.get("input_hash"), str):
                self.input_hashes[key] = record["input_hash"]
            if self.script is not None and record.get("script") not in (None, self.script):
                self.other_script += 1
            status = record.get("status")
            self.counts[status if status in self.counts else ERROR] += 1
            if status != OK:
                self.failed[key] = record
        if retry_errors:
            self.retried = len(self.failed)
            self.forget(list(self.failed))

    def _locked_fd(self) -> int:
        try:
            return lock_output(self.path)
        except OutputInUse as e:
            raise StoreError(str(e)) from None

    def _load(self) -> list[tuple[bytes, dict]]:
        with open(self.path, "rb") as f:
            data = f.read()
        end = data.rfind(b"\n") + 1
        records = []
        for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
            if not line.strip():
                continue
            record = _record(line)
            if record is None:
                raise StoreError(_not_ours(self.path, lineno, line))
            records.append((line, record))
        tail = data[end:]
        if not tail.strip():
            if tail:  # (blank: an editor's spaces)
                os.ftruncate(self._fd, end)
        elif (last := _record(tail)) is not None:  # a whole record that lost its line break (an edit):
            records.append((tail, last))  # kept, and the next write starts with the line break
            self._line_open = True
        else:  # checked after every other line: a file that is not ours is never cut
            # (no cut-off record is JSON: it lacks at least its closing brace; a whole one is a hand edit)
            if not (tail.startswith(_RECORD_START) or _RECORD_START.startswith(tail)) or _loaded(tail) is not _NOT_JSON:
                raise StoreError(_not_ours(self.path, data[:end].count(b"\n") + 1, tail))
            # The tail after the last newline is a record a killed run did not finish writing.
            os.ftruncate(self._fd, end)
            self.repaired = True
            row = re.match(rb'\{"row": (\d+),', tail)  # (the index written whole: "1" of a cut "12" is not it)
            self.torn_row = int(row.group(1)) if row else None
        return records

    def check_before_setup(self, unknown: Collection[str] = ()) -> None:
        """``open``'s refusal of a file whose records were keyed otherwise or run with other
        settings, made before the notebook's set-up cells run (a model load: minutes), reading
        the file without taking its lock or changing it. ``unknown``: the keys of ``settings``
        that are not known yet (a parameter the parameters cell computes), left out of the
        comparison; ``open`` compares them. A file that cannot be read, or that holds a line
        that is no record (which ``open`` refuses in its own words), is left to ``open``.

        Raises:
            StoreError: as ``open`` does for keying and settings, in its words."""
        try:
            data = self.path.read_bytes() if self.path.is_file() else b""
        except OSError:
            return
        *lines, tail = data.split(b"\n")
        records = [_record(line) for line in lines if line.strip()]
        if None in records:
            return
        if tail.strip() and (last := _record(tail)) is not None:  # (a torn tail is cut off by open)
            records.append(last)
        for record in records:
            self._check_keying(record)
            self._check_settings(record, unknown)

    def _check_keying(self, record: dict) -> None:
        if record.get("status") == BAD_INPUT:
            return  # unusable input records are keyed by row index under either scheme
        has_id = "id" in record
        if self.id_field is not None and not has_id:
            raise StoreError(f"{self.path} holds rows written without --id-field; rerun with the same "
                             "options as the first run, or write to a new output file")
        if self.id_field is None and has_id:
            raise StoreError(f"{self.path} holds rows keyed by an id field; rerun with the same "
                             "--id-field as the first run, or write to a new output file")

    def _check_settings(self, record: dict, unknown: Collection[str] = ()) -> None:
        old = record.get("settings")
        # (a bad_input row never ran, so no setting made its record: a job whose --backend could
        # not start had written its bad rows, and the rerun with the right URL was refused; an
        # empty "settings" records none, as a record without it, which another writer or a hand
        # edit leaves: it was refused as run with "--backend: not set there")
        if self.settings is None or not old or old == self.settings or record.get("status") == BAD_INPUT:
            return
        changed = sorted(k for k in {*old, *self.settings} - set(unknown) if old.get(k) != self.settings.get(k))
        if not changed:
            return
        # (a setting a record has not, or this run has not, is said so: "None there" read as the value None)
        shown = "; ".join(f"{k}: {_setting(old, k)} there, {_setting(self.settings, k)} now" for k in changed)
        raise StoreError(f"{self.path} holds rows run with other settings ({shown}); rerun with the same "
                         "options as the first run, or write to a new output file")

    def _rewrite(self, lines: list[bytes]) -> None:
        target = Path(os.path.realpath(self.path))  # (a symbolic link stays one, to the rewritten file)
        tmp = target.with_name(target.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                if hasattr(os, "fchmod"):  # (POSIX) a private file stays private
                    os.fchmod(f.fileno(), os.fstat(self._fd).st_mode & 0o7777)
                f.writelines(line + b"\n" for line in lines)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except OSError as e:  # (a folder that takes no new file, where the file itself may be written)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StoreError(f"could not write the output file {self.path} anew without the records of the rows to "
                             f"run again (--retry-errors, or rows whose input changed): {e.strerror or e} ({tmp}); "
                             "the file is as it was: give --output a file in a folder this job can write to, or make "
                             "room") from None
        self._line_open = False
        os.close(self._fd)
        self._fd = self._locked_fd()

    # -- use --------------------------------------------------------------------------------------
    def bad_inputs(self) -> dict[tuple, tuple]:
        """key → (input_hash, error) of each ``bad_input`` record in the file."""
        return {key: (r.get("input_hash"), r.get("error")) for key, r in self.failed.items()
                if r.get("status") == BAD_INPUT}

    def forget(self, keys) -> None:
        """Set aside the records of these failed rows: they count as not done, and ``drop_forgotten``
        (or the first ``write``) removes them from the file."""
        for key in keys:
            record = self.failed.pop(key)
            self.keys.discard(key)
            self.input_hashes.pop(key, None)
            status = record.get("status")
            self.counts[status if status in self.counts else ERROR] -= 1
            if self.script is not None and record.get("script") not in (None, self.script):
                self.other_script -= 1
            self._forgotten.add(key)

    def drop_forgotten(self) -> None:
        """Rewrite the file without the records ``forget`` set aside (nothing when there are none)."""
        if not self._forgotten:
            return
        with open(self.path, "rb") as f:  # (every line is a record: open() checked, and nothing was written since)
            lines = [line for line in f.read().split(b"\n") if line.strip()]
        self._rewrite([line for line in lines if row_key(_record(line)) not in self._forgotten])
        self._forgotten = set()

    def done(self, key: tuple) -> bool:
        """Whether a row with this key (see ``row_key``) is already in the file."""
        return key in self.keys

    def same_input(self, key: tuple, digest: str) -> bool:
        """Whether the done row under ``key`` ran on input with this ``input_hash`` (True where its
        record predates input hashes)."""
        return self.input_hashes.get(key, digest) == digest

    def write(self, record: dict) -> None:
        """Append ``record`` as one line. Values JSON cannot hold are written as their ``repr`` (a
        float nan or inf too: ``finite_floats``).

        Raises:
            StoreError: the row's key is already in the file (the job never writes a row twice), or
                the line could not be written (a full disk).
        """
        key = row_key(record)
        if key in self.keys:
            raise StoreError(f"row {record['row']} is already in {self.path}; it is not written twice")
        self.drop_forgotten()
        if self.settings is not None:
            record = {**record, "settings": self.settings}
        if self.script is not None:
            record = {**record, "script": self.script}
        record = finite_floats(record)
        try:
            text = json.dumps(record, ensure_ascii=False, default=_jsonable)
            data = (text + "\n").encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates in generated text: escape them
            data = (json.dumps(record, ensure_ascii=True, default=_jsonable) + "\n").encode("ascii")
        if self._line_open:
            data = b"\n" + data
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as e:  # (a full disk: the job stops; a part of this line written is cut off on the rerun)
            raise StoreError(f"could not write row {record['row']} to {self.path}: {e.strerror or e}; the rows "
                             "written before it are kept: make room, then run the same command again") from None
        self._line_open = False
        self.keys.add(key)
        status = record.get("status")
        self.counts[status if status in self.counts else ERROR] += 1

    def drop_if_unwritten(self) -> None:
        """Remove the file where ``open`` made it and nothing was written to it: a job that could
        not start (its backend) left an empty results file behind, which reads as a run of no rows.
        Call before ``close`` (the lock keeps another run from taking the file meanwhile). Where
        ``path`` is a link the user made to a file not there yet, the file made at its end goes
        and the link stays: only the file this store holds open is removed."""
        if self._made_file and self._fd is not None:
            remove_if_unwritten(self._fd, self.path)

    def close(self) -> None:
        """Release the lock (the data is already with the operating system)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _record(line: bytes) -> Optional[dict]:
    """The result record on ``line``, or None if it holds none (``_flaw``)."""
    record = _loaded(line)
    return None if record is _NOT_JSON or _flaw(record) else record


_NOT_JSON = object()  # (_loaded's answer for bytes that hold no JSON value; None is JSON's null)


def _loaded(data: bytes) -> Any:
    """The JSON value ``data`` holds, or ``_NOT_JSON``."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):  # (also an integer of over 4300 digits)
        return _NOT_JSON


def _flaw(record: Any) -> Optional[str]:
    """Why ``record`` (a line's JSON value) is no result record, or None where it is one: a JSON
    object whose fields that the job reads are of the types it writes them with ("row" an integer,
    "status" a string, "settings" an object, "input_hash" a string, and a bad_input record's
    "error" a string; "status", "settings" and "input_hash" may be left out, and an unknown status
    counts as an error). A hand edit that left another type there ("settings": "x") failed the
    job with a traceback; a bad_input record without its "error" was said as "None" and counted
    bad input again, and an "input_hash" that is no string let the row's changed input through."""
    if not isinstance(record, dict):
        return "not a JSON object"
    row = record.get("row")
    if not isinstance(row, int) or isinstance(row, bool):
        return f'its "row" is {_shown(row)}, not an integer row index' if "row" in record else 'it has no "row"'
    if not isinstance(record.get("status", ""), str):
        return f'its "status" is {_shown(record["status"])}, not "ok", "error" or "bad_input"'
    if record.get("settings") is not None and not isinstance(record["settings"], dict):
        return f'its "settings" is {_shown(record["settings"])}, not an object'
    if not isinstance(record.get("input_hash", ""), str):
        return f'its "input_hash" is {_shown(record["input_hash"])}, not a string'
    if record.get("status") == BAD_INPUT and not isinstance(record.get("error"), str):
        return (f'its "error" is {_shown(record["error"])}, not a string' if "error" in record else
                'it is a "bad_input" record with no "error"')
    return None


def _setting(settings: dict, key: str) -> str:
    """The value of setting ``key`` in ``settings`` for the other-settings refusal: its repr, or
    "not set" where ``settings`` has no such key (``--completion`` and ``--chat-template`` are
    recorded only where given, and a parameter only where the notebook has it). (A key one side
    has not counts as None in the comparison, so that records written before a setting was
    recorded stay readable: "not set" is said only beside another value.)"""
    return repr(settings[key]) if key in settings else "not set"


def _shown(value: Any) -> str:
    """``value`` as JSON, cut to 40 characters, for a message."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:39] + "…"


def finite_floats(value: Any) -> Any:
    """``value`` with each float JSON cannot hold (nan, inf, -inf) as its repr ("nan", "inf"), in
    its lists, tuples and dicts too, where Python's json writes NaN and Infinity, which no JSON
    reader but Python's takes (jq, JavaScript's JSON.parse); other values as they are."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [finite_floats(item) for item in value]
    if isinstance(value, dict):
        return {key: finite_floats(item) for key, item in value.items()}
    return value


def _jsonable(value: Any) -> Any:
    # (json writes what this gives back as it is: a nan in a set or a model is "nan" here, not NaN)
    if isinstance(value, (set, frozenset, tuple)):
        return finite_floats(list(value))
    dump = getattr(value, "model_dump", None)  # pydantic models from json_schema gens
    if callable(dump):
        return finite_floats(dump())
    return repr(value)
