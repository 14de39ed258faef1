"""Read the rows of a batch job: JSON lines or CSV, one record at a time, with line numbers.

A malformed record does not stop the reading: it comes back as an ``InputRow`` with ``error`` set
(naming the line and what is wrong), so the job can report it and write it to the output.
"""

from __future__ import annotations

import codecs
import csv
import functools
import itertools
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from lmnb_engine.json_schema import json_value


FORMATS = ("jsonl", "csv", "tsv")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}


class InputError(ValueError):
    """The input file as a whole cannot be read (missing, unknown format, UTF-16 or UTF-32, no usable CSV header)."""


@dataclass(frozen=True)
class InputRow:
    """One record of the input.

    index: 0-based record number (blank lines are not records); line: 1-based line it starts on;
    fields: column/key → value (CSV values are strings), None if the record is malformed;
    error: what is wrong with a malformed record, starting with its line number;
    raw: a malformed record's bytes as read (a JSON line without its line break, a CSV record's
    lines), which tell it from another (its ``input_hash``); None for the others.
    """

    index: int
    line: int
    fields: Optional[dict]
    error: Optional[str] = None
    raw: Optional[bytes] = None


def input_format(path: Path, given: Optional[str] = None) -> str:
    """``given``, or the format named by the file's suffix (``.jsonl``/``.ndjson``/``.json``, ``.csv``,
    ``.tsv``). Raises ``InputError`` when neither says."""
    if given is not None:
        if given not in FORMATS:
            raise InputError(f"unknown input format {given!r}; use one of {', '.join(FORMATS)}")
        return given
    fmt = _SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"cannot tell the format of {path} from its suffix; name it .jsonl or .csv, "
                         "or pass --input-format jsonl|csv|tsv")
    return fmt


def read_rows(path: Path, fmt: Optional[str] = None) -> Iterator[InputRow]:
    """The records of ``path`` in file order (see ``input_format`` for ``fmt``).

    Raises:
        InputError: the file cannot be opened or read (the system's reason, naming the file), its
            format is unknown, or a CSV file has no usable header or its header is not UTF-8 (the
            message names the line). A row that is no UTF-8 is a malformed record of its own.
    """
    try:  # (before the format: a folder or a missing file without a suffix was told to name its format)
        if path.is_dir():
            raise InputError(f"the input {path} is a folder; give the file of the rows")
        if not path.exists():  # (a pipe, as /dev/stdin or <(jq ...), is read as a file is)
            raise InputError(f"input file {path} does not exist")
    except OSError as e:  # (a folder on the way that may not be read: "Permission denied")
        raise InputError(_unreadable(path, e)) from None
    fmt = input_format(path, fmt)
    return _read(path, _jsonl(path) if fmt == "jsonl" else _delimited(path, "\t" if fmt == "tsv" else ","))


def _read(path: Path, rows: Iterator[InputRow]) -> Iterator[InputRow]:
    """``rows``, with an ``OSError`` of opening or reading ``path`` raised as ``InputError``: it
    ended the job with "[Errno 13] Permission denied", or a traceback, naming neither the option
    nor the fix."""
    try:
        yield from rows
    except OSError as e:
        raise InputError(_unreadable(path, e)) from None


def _unreadable(path: Path, e: OSError) -> str:
    """The error for the input file ``path`` that cannot be read (``e``), with the fix."""
    return f"cannot read the input file {path}: {e.strerror or e}; give --input a file this job can read"


# Byte order marks of the encodings whose text is not UTF-8 at all (UTF-32's first: it starts as UTF-16 LE's does)
_WIDE_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
              (b"\xfe\xff", "UTF-16"))


def _first_line(raw: bytes, path: Path) -> bytes:
    """The file's first line without a UTF-8 byte order mark (as some editors write). Raises
    ``InputError`` for UTF-16 or UTF-32 text (Notepad's "Unicode", PowerShell's ``>``): its every
    line read as a row of garbage, "not UTF-8" or "invalid JSON", with no word of the encoding."""
    encoding = next((name for bom, name in _WIDE_BOMS if raw.startswith(bom)), None)
    if encoding is not None:
        raise InputError(f"{path} is {encoding} text, not UTF-8; save it again as UTF-8 (e.g. "
                         f"{_iconv(encoding, path)})")
    if b"\x00" in raw[:4]:  # (without an order mark: ASCII text as UTF-16 or UTF-32 has 0 bytes between)
        message = (f"{path} is not UTF-8 text: its first line holds 0 bytes, as UTF-16 or UTF-32 text does; "
                   "save it again as UTF-8")
        encoding = _utf16_without_bom(raw)
        if encoding is not None:  # (iconv reads "UTF-16" without an order mark as big-endian: the byte order is named)
            message += f" (it looks like {encoding}, without a byte order mark: e.g. {_iconv(encoding, path)})"
        raise InputError(message)
    return raw[len(codecs.BOM_UTF8):] if raw.startswith(codecs.BOM_UTF8) else raw


def _bom_bytes(first_line: bytes) -> int:
    """How many bytes of the file's ``first_line`` (as read) a UTF-8 byte order mark takes: 3, or 0
    without one. A position told in line 1 counts them, as a hex editor shows the file: "at byte B"
    was counted from after it."""
    return len(codecs.BOM_UTF8) if first_line.startswith(codecs.BOM_UTF8) else 0


def _not_utf8_at(lineno: int, e: UnicodeDecodeError, bom: int) -> str:
    """"line N: not UTF-8 text (REASON at byte B)" for line ``lineno`` that decoding (``e``) found
    no UTF-8: B counted from 0 in its line as the file holds it, line 1's counting the ``bom``
    bytes of a byte order mark (``_bom_bytes``) it was read without, so that it is the byte's
    offset in the file (a JSON line's, a CSV record's)."""
    return f"line {lineno}: not UTF-8 text ({e.reason} at byte {e.start + bom * (lineno == 1)})"


def _utf16_without_bom(raw: bytes) -> Optional[str]:
    """"UTF-16LE" or "UTF-16BE" where the first line's first bytes hold a 0 byte at every second
    place and none between (ASCII text in UTF-16: "q" is 71 00 little-endian), else None (UTF-32
    has 0 bytes side by side; other text says nothing sure)."""
    head = raw[:64]
    if len(head) < 3:
        return None
    for encoding, zeros in (("UTF-16LE", 1), ("UTF-16BE", 0)):
        if all((byte == 0) == (i % 2 == zeros) for i, byte in enumerate(head)):
            return encoding
    return None


def _iconv(encoding: str, path: Path) -> str:
    """The iconv command that writes ``path`` as UTF-8 beside it (NAME-utf8.SUFFIX)."""
    converted = path.with_name(f"{path.stem}-utf8{path.suffix}")
    return f"iconv -f {encoding} -t UTF-8 {shell_path(path)} > {shell_path(converted)}"


def shell_path(path: Path) -> str:
    """``path`` as a shell command's argument: quoted where needed, and with ``./`` before a name
    that starts with "-" (Path drops the ``./`` given; the command then took the name for options)."""
    text = str(path)
    return shlex.quote("./" + text if text.startswith("-") else text)


def _jsonl(path: Path) -> Iterator[InputRow]:
    index = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                bom, raw = _bom_bytes(raw), _first_line(raw, path)
            if not raw.strip():
                continue
            if index == 0 and raw.lstrip().startswith(b"["):  # (each of its lines would be a bad row)
                raise InputError(f"{path} is a JSON array; the input is JSON lines, one object per line: convert "
                                 f"it with  jq -c '.[]' {shell_path(path)} > rows.jsonl  (pandas: to_json(..., "
                                 "orient='records', lines=True))")
            fields, error, raw = None, None, raw.rstrip(b"\r\n")
            try:
                # (without its line break: JSON's error at the line's end was "column 1" of a next line)
                value = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                error = _not_utf8_at(lineno, e, bom)
            except json.JSONDecodeError as e:
                error = f"line {lineno}: invalid JSON: {e.msg} at column {e.colno}"
            except (ValueError, RecursionError) as e:  # (an integer of over 4300 digits; arrays nested too deep)
                error = f"line {lineno}: {_long_integer(raw) or 'JSON this reader cannot hold: ' + str(e).split(';')[0]}"
            else:
                broken = _lone_surrogate(value)
                if broken is not None:
                    error = (f"line {lineno}: {broken} holds a lone surrogate (a \\ud800-\\udfff escape without "
                             "its pair: half of a broken character), which no tokenizer can encode; fix the text")
                elif isinstance(value, dict):
                    fields = value
                else:
                    shown = json_value(value, 40)  # (as written: "got NoneType" said it of null)
                    error = f"line {lineno}: a row must be a JSON object {{\"field\": value, ...}}, got {shown}"
            yield InputRow(index, lineno, fields, error, raw if fields is None else None)
            index += 1


def _long_integer(raw: bytes) -> Optional[str]:
    """What is wrong with a row's line that ``json.loads`` refused for an integer of more digits
    than Python reads (its own words named neither the field nor the number), or None."""
    from lmnb_engine.params import long_integer_in_json, past_digit_limit, shown_integer_text  # torch-free

    try:
        found = long_integer_in_json(raw)
    except (ValueError, RecursionError):
        return None
    if found is None:
        return None
    path, text = found
    where = f"field {path[0]!r}" if path else "the row"
    return (f"{where} holds {shown_integer_text(text)}, {past_digit_limit()}; write a smaller number, or the digits "
            "as a string")


def _lone_surrogate(value) -> Optional[str]:
    """Where in a row's parsed JSON a string holds a lone surrogate (JSON's escapes allow one), or None."""
    from lmnb_engine.tokenizer import find_lone_surrogate  # torch-free; here so `job.py --help` loads no engine

    found = find_lone_surrogate(value)
    if found is None:
        return None
    path, in_key = found
    return "a field name" if in_key else f"field {path[0]!r}" if path else "the row"


def _delimited(path: Path, delimiter: str) -> Iterator[InputRow]:
    # csv's default limit is 128 KiB a field: past it the reader loses its place inside the quoted
    # text, and each later line of the field read as a row of its own.
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
    with open(path, "rb") as f:
        first = f.readline()  # (its mark is looked for here: a pipe cannot be read again, so the line is handed on)
        undecodable = functools.partial(_undecodable, bom=_bom_bytes(first))
        records = _records(_decoded_lines(itertools.chain([first] if first else [], f), path), delimiter)
        # Blank lines before the header are skipped, as pandas' read_csv does (its header=0 is the
        # first line that is not blank); csv.DictReader takes a blank first line for a header of no
        # columns, and puts each row's values under the key None.
        start, header, problem, text = next((r for r in records if r[1] != []), (None, None, None, None))
        if start is None:
            raise InputError(f"{path} has no CSV header: it holds no line but blank ones; its first line must "
                             "name every column")
        bad_bytes = undecodable(start, text)
        if bad_bytes is not None:
            raise InputError(f"{path} {bad_bytes}; save the file as UTF-8")
        if problem is not None:
            raise InputError(f"{path} line {start}: cannot read the CSV header: {problem}")
        if not all(h.strip() for h in header):
            first = "first line" if start == 1 else "first line that is not blank"
            raise InputError(f"{path} line {start}: the {first} must name every column (a CSV header)")
        duplicates = sorted({h for h in header if header.count(h) > 1})
        if duplicates:
            raise InputError(f"{path} line {start}: column names appear twice: {', '.join(duplicates)}")
        index, other = 0, _other_separator(header, delimiter)
        for start, record, problem, text in records:
            bad_bytes = undecodable(start, text)
            if bad_bytes is not None:
                yield InputRow(index, start, None, bad_bytes, _as_read(text))
            elif problem is not None:
                yield InputRow(index, start, None, f"line {start}: malformed CSV: {problem}{other}", _as_read(text))
            elif not record:
                continue  # a blank line
            elif len(record) != len(header):
                error = f"line {start}: {len(record)} values for {len(header)} columns ({', '.join(header)}){other}"
                yield InputRow(index, start, None, error, _as_read(text))
            elif record == header:  # (cat more.csv >> rows.csv: a row of the column names would run as data)
                yield InputRow(index, start, None, f"line {start}: the header again (a file appended with its "
                                                   "header?); remove the line", _as_read(text))
            else:
                yield InputRow(index, start, dict(zip(header, record)))
            index += 1


def _as_read(text: str) -> bytes:
    """A malformed CSV record's ``InputRow.raw``: its lines as read (bytes that are no UTF-8 as
    they were), without the last line break."""
    return text.rstrip("\r\n").encode("utf-8", "surrogateescape")


_ESCAPED = re.compile("[\udc80-\udcff]")  # (a byte that is no UTF-8, as surrogateescape keeps it)
_LINES = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")  # (the places where a line ends, as _decoded_lines splits them)


def _undecodable(start: int, text: str, bom: int = 0) -> Optional[str]:
    """Where the lines ``text`` of a record, the first line ``start``, hold bytes that are no
    UTF-8 (``_decoded_lines`` keeps them as lone surrogates): ``_not_utf8_at`` the first such line
    (``bom``: the bytes of a byte order mark ``text`` is read without). None where they hold none."""
    if not _ESCAPED.search(text):
        return None
    for n, line in enumerate(_LINES.split(text)):
        try:
            line.encode("utf-8", "surrogateescape").decode("utf-8")
        except UnicodeDecodeError as e:
            return _not_utf8_at(start + n, e, bom)
    return None


def _records(lines: Iterator[str], delimiter: str) -> Iterator[tuple]:
    """The CSV records of ``lines``: (its first line, 1-based; its values; problem; its text, the
    lines it was read from). A blank line
    (empty, or of spaces and, where the separator is no tab, tabs) has values [].

    Each record is read strictly; one that a strict reader refuses (a quote opened and never
    closed, which a lenient reader read to the file's end as one value, so those rows never ran;
    text after a closing quote, kept without the quotes) has values None and ``problem`` set: what
    is wrong, with what to change in the file. It then ends where a lenient reader ends it (as
    Python's csv, pandas and Excel read the file), and reading goes on after it: a strict reader
    went on at the line after its error, inside the record, so the rest of a quoted value ran as a
    row, or its closing quote opened one that took later rows. A strict reader alone, with the
    lenient one called only at an error, reads a file of good rows about twice as fast as reading
    each record twice."""
    kept: list = []  # (the lines read for the record being read: the lenient reader's, at an error)
    # A line of only spaces and tabs is a blank line, as pandas' read_csv (its C parser, the default)
    # skips it; a tab only where it is no separator: in TSV "\t" is a row of two empty values.
    blank = " \r\n" if delimiter == "\t" else " \t\r\n"

    def keeping():
        for line in lines:
            kept.append(line)
            yield line

    source, end = keeping(), 0
    while True:
        reader, before = csv.reader(source, delimiter=delimiter, strict=True), end
        try:
            for record in reader:
                start, end = end + 1, before + reader.line_num
                if len(kept) == 1 and not kept[0].strip(blank):
                    record = []  # (a line of only blanks outside quotes, which pandas skips as a blank line)
                text = "".join(kept)
                kept.clear()
                yield start, record, None, text
            return
        except csv.Error as e:
            start, read = end + 1, kept[:]
            kept.clear()
            lenient = csv.reader(itertools.chain(read, source), delimiter=delimiter)
            try:
                next(lenient)
            except csv.Error as lenient_error:  # (csv goes on at the next line, as the strict reader does here)
                problem = str(lenient_error)
            else:
                problem = None
            end = start - 1 + lenient.line_num
            text = "".join(read + kept)  # (the lines the lenient reader took past the strict one's)
            kept.clear()
            yield start, None, _csv_hint(e, start, end, delimiter) if problem is None else problem, text


def _other_separator(header: list, delimiter: str) -> str:
    """A hint for a header of one column that reads as several separated by another character
    (a spreadsheet's semicolon CSV: "question;extra"), for the errors of its malformed rows: a
    quoted "a;b";c read as text after a closing quote, and the message said to fix the quotes.
    "" when that is not it."""
    if len(header) != 1:
        return ""
    for sep in (";", "|", "\t", ","):
        if sep != delimiter and sum(1 for name in header[0].split(sep) if name.strip()) > 1:
            return (f"; the header {header[0]!r} looks like several columns separated by {sep!r}: the input must "
                    "be comma-separated (CSV), or tab-separated (.tsv, --input-format tsv); save it so")
    return ""


def _csv_hint(error: csv.Error, start: int, end: int, delimiter: str) -> str:
    """csv's ``error`` for the row on lines ``start``..``end`` of a file of ``delimiter``-separated
    values, with what to change in the file."""
    if str(error) == "unexpected end of data":  # (csv's words for a quote still open at the end)
        rest = f"lines {start}-{end}" if end > start else f"line {start}"
        return (f"a quote opened in this row is never closed: {rest}, to the end of the file, are inside it; "
                'close the quoted value, or write a quote inside it as ""')
    if "expected after" in str(error):  # ('"a"b': text after a closing quote)
        # (csv's words, "'\t' expected after '\"'", showed a TSV file's tab as a blank)
        separator = "a tab" if delimiter == "\t" else repr(delimiter)
        return (f"text after a closing quote, where {separator} or the line's end must follow (a space there "
                'too): quote the whole value, writing a quote inside it as "", or remove what follows the quote')
    return str(error)


_BARE_CR = re.compile(r"(?<=\r)(?!\n)")  # (the place after a CR that no LF follows)


def _decoded_lines(raw_lines: Iterable[bytes], path: Path) -> Iterator[str]:
    for lineno, raw in enumerate(raw_lines, start=1):
        if lineno == 1:
            raw = _first_line(raw, path)
        # (bytes that are no UTF-8 kept as lone surrogates: the record holding them is bad input,
        # _undecodable, as a JSON line's is; the job stopped at the first, for every row)
        text = raw.decode("utf-8", "surrogateescape")
        # A CR alone ends a line too, as csv reads a file opened with newline='' (Excel for Mac's "CSV
        # (Macintosh)" ends lines so): its whole file was one line, refused as "new-line character
        # seen in unquoted field". (A CR inside a quoted value stays in it: csv joins the lines.)
        if "\r" not in text or (text.endswith("\r\n") and text.count("\r") == 1):  # (the usual line, at no regex's cost)
            yield text
        else:
            yield from (line for line in _BARE_CR.split(text) if line)
