"""Readers: turn files, folders, globs or a Hugging Face dataset into one column of document text.

Every reader returns an Arrow table with a single `text` column (one row per document, in file
order), so the rest of the pipeline never cares where the text came from. Each problem a user can fix
is a DataError that names the file. Text files (.csv, .txt, .json, .jsonl) are read as UTF-8 without
a byte-order mark; bytes that are not UTF-8 become U+FFFD and are counted (an error with
--strict_utf8); .txt files and CSV values get LF line ends.
"""

from __future__ import annotations

import codecs
import csv
import glob
import hashlib
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from data.config import DEFAULT_TEXT_COLUMN, SAMPLE_CSV, DataConfig
from data.errors import DataError

FORMATS = {".csv": "csv", ".txt": "txt", ".json": "json", ".jsonl": "jsonl", ".parquet": "parquet"}
_GLOB_CHARS = set("*?[")
_CHUNK = 1 << 20
# Bytes of CSV that pyarrow parses at a time (a longer row is read with a larger block). Its reader
# reads some 40 blocks ahead of the rows taken, so this also bounds the memory reading takes.
CSV_BLOCK_BYTES = 1 << 20
# Rows of a Hugging Face dataset handed on at a time (its table is memory-mapped already).
_HF_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class SourceFile:
    """One input file and the reader it gets."""

    path: Path
    fmt: str


@dataclass
class Sources:
    """What the corpus is made of, resolved, plus what identifies its content for the cache key."""

    description: str
    files: list[SourceFile] = field(default_factory=list)
    key: dict[str, Any] = field(default_factory=dict)
    hf_dataset: Any = None  # the loaded datasets.Dataset when reading a Hugging Face dataset


# ----------------------------------------------------------------------------- resolving paths


def _format_of(path: Path) -> str | None:
    return FORMATS.get(path.suffix.lower())


def _files_in_folder(folder: Path) -> list[Path]:
    """Supported files under a folder, recursively, in a stable (sorted) order; hidden ones skipped."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / n for n in sorted(names) if not n.startswith(".") and _format_of(Path(n))]
    return found


def resolve_files(patterns: list[str]) -> list[SourceFile]:
    """Expand files, folders and globs into a de-duplicated list of files in a stable order.

    Order matters (documents are packed in it), so globs and folders are sorted, and a file named
    twice is read once, where it first appears.
    """
    files: list[Path] = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if _GLOB_CHARS & set(pattern):
            matches = [Path(m) for m in sorted(glob.glob(str(path), recursive=True))]
            matches = [m for m in matches if m.is_file() and _format_of(m)]
            if not matches:
                raise DataError(
                    f"{pattern}: no .csv/.txt/.json/.jsonl/.parquet files match this pattern; check the path"
                )
            files += matches
        elif path.is_dir():
            inside = _files_in_folder(path)
            if not inside:
                raise DataError(
                    f"{path}: folder holds no .csv/.txt/.json/.jsonl/.parquet files; point --data at the corpus files"
                )
            files += inside
        elif path.is_file():
            if not _format_of(path):
                raise DataError(
                    f"{path}: unsupported file type {path.suffix or '(none)'!r}; use .csv, .txt, .json, .jsonl or .parquet"
                )
            files.append(path)
        else:
            raise DataError(f"{path}: no such file or folder; check the path given to --data")
    seen: set[Path] = set()
    unique = []
    for f in files:
        real = f.resolve()
        if real not in seen:
            seen.add(real)
            unique.append(SourceFile(path=f, fmt=_format_of(f) or ""))
    return unique


# ----------------------------------------------------------------------------- content identity


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks so a large CSV is never held in memory."""
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


_LINE_END = re.compile(r"\r\n?|\n")
# Each byte that is not UTF-8 becomes one of these under errors="surrogateescape" (and nothing else does:
# Python's decoder refuses encoded surrogates), so counting them counts the bad bytes.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def _is_utf8(data: bytes) -> bool:
    """Whether `data` is all valid UTF-8, decoded in chunks so that a large valid file (the common
    case) never becomes one large str."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    try:
        for start in range(0, len(view), _CHUNK):
            decoder.decode(view[start : start + _CHUNK])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def _first_bad_byte(data: bytes) -> int:
    """Offset of the first byte that is not UTF-8, in `data` known to hold one."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    raise ValueError("the data is valid UTF-8")


def read_utf8(path: Path, strict: bool) -> tuple[bytes, int]:
    """The bytes of text file `path` as valid UTF-8 without a byte-order mark, and how many of its
    bytes were not UTF-8.

    Such bytes become U+FFFD (Python's errors="replace"), so that a stray byte in one file of
    thousands does not cost the whole corpus; the caller reports them. With `strict` they are a
    DataError giving the offset of the first. A leading BOM marks the encoding; it is not text.
    """
    data = path.read_bytes()
    bad = 0
    if not _is_utf8(data):
        if strict:
            raise DataError(
                f"{path}: not UTF-8 text (bad byte at offset {_first_bad_byte(data)}); re-encode it, e.g. "
                "`iconv -f latin1 -t utf-8`, or leave out --strict_utf8 to read such bytes as U+FFFD"
            )
        bad = len(_ESCAPED_BYTE.findall(data.decode("utf-8", "surrogateescape")))
        data = data.decode("utf-8", "replace").encode("utf-8")
    return data.removeprefix(codecs.BOM_UTF8), bad


def scan_utf8(path: Path, strict: bool) -> int:
    """How many bytes of file `path` are not UTF-8, read in chunks; with `strict` the first is a
    DataError giving its offset, as `read_utf8` does for a file read whole."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            held = len(decoder.getstate()[0])  # bytes of a character cut by the previous chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                if strict:
                    raise DataError(
                        f"{path}: not UTF-8 text (bad byte at offset {offset - held + exc.start}); re-encode it, "
                        "e.g. `iconv -f latin1 -t utf-8`, or leave out --strict_utf8 to read such bytes as U+FFFD"
                    ) from None
                return _count_bad_bytes(path)
            if not chunk:
                return 0
            offset += len(chunk)


def _count_bad_bytes(path: Path) -> int:
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    bad = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            bad += len(_ESCAPED_BYTE.findall(decoder.decode(chunk)))
    return bad + len(_ESCAPED_BYTE.findall(decoder.decode(b"", final=True)))


class _Utf8Stream(io.RawIOBase):
    """A file's bytes, read in chunks, as valid UTF-8: with `replace`, each sequence that is not UTF-8
    becomes U+FFFD, as `bytes.decode("utf-8", "replace")` would. `position()` tells how far into the
    file reading has come, for progress."""

    def __init__(self, path: Path, replace: bool) -> None:
        self._file = open(path, "rb")
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace") if replace else None
        self._pending = memoryview(b"")
        self._done = False

    def readable(self) -> bool:
        return True

    def position(self) -> int:
        return self._file.tell()

    def readinto(self, buffer: Any) -> int:
        if self._decoder is None:
            return self._file.readinto(buffer)
        while not self._pending and not self._done:
            chunk = self._file.read(_CHUNK)
            self._done = not chunk
            self._pending = memoryview(self._decoder.decode(chunk, final=self._done).encode("utf-8"))
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def describe(config: DataConfig, hf_cache_dir: Path) -> Sources:
    """Resolve the sources of `config` and fingerprint their content, without reading documents.

    Files are identified by format and sha256 of their bytes, in order (not by name or mtime: moving
    a corpus keeps its cache, and editing a file in place always invalidates it).
    """
    if config.hf_dataset is not None:
        return _describe_hf(config, hf_cache_dir)
    if config.uses_sample:
        files = [SourceFile(path=SAMPLE_CSV, fmt="csv")]
        description = f"bundled sample {SAMPLE_CSV}"
    else:
        files = resolve_files(config.paths)
        description = ", ".join(str(f.path) for f in files[:3])
        description += f" and {len(files) - 3} more files" if len(files) > 3 else ""
    for f in files:
        if f.path.stat().st_size == 0:
            raise DataError(f"{f.path}: file is empty; remove it from --data or give it documents")
    key = {"files": [[f.fmt, file_sha256(f.path)] for f in files]}
    return Sources(description=description, files=files, key=key)


# ----------------------------------------------------------------------------- readers


def _missing_column(where: Any, column: str, columns: list[str]) -> DataError:
    shown = ", ".join(repr(c) if c else "'' (unnamed index)" for c in columns) or "none"
    return DataError(f"{where}: no column {column!r} (it has {shown}); pass --text_column NAME")


def _text_from_table(table: pa.Table, column: str, prepend_title: bool, where: Any) -> pa.Table:
    """Reduce a table to its `text` column: the chosen column, title-prefixed if asked; nulls -> ""."""
    for needed in [column] + (["title"] if prepend_title else []):
        if needed not in table.column_names:
            raise _missing_column(where, needed, table.column_names)

    def as_text(name: str) -> pa.ChunkedArray:
        col = table.column(name)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type)):
            raise DataError(f"{where}: column {name!r} holds {col.type}, not text; pass --text_column NAME")
        return pc.fill_null(col.cast(pa.large_string()), "")

    text = as_text(column)
    if prepend_title:
        title = as_text("title")
        # An article without content is empty even if it has a title: a headline alone is not a document.
        has_content = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0)
        has_title = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(title)), 0)
        titled = pc.binary_join_element_wise(title, text, pa.scalar("\n\n", pa.large_string()))
        text = pc.if_else(pc.and_(has_content, has_title), titled, text)
    return pa.table({"text": text})


def _unix_newlines(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """CRLF and lone CR line ends as LF: they come from the file's platform (Windows, classic Mac),
    not from the text, and a file may mix them."""
    return pc.replace_substring(pc.replace_substring(values, "\r\n", "\n"), "\r", "\n")


def _csv_header(path: Path, bad_bytes: int) -> list[str]:
    with io.TextIOWrapper(_Utf8Stream(path, bad_bytes > 0), encoding="utf-8-sig", newline="") as text:
        return next(csv.reader(text), [])


def _csv_batches(stream: _Utf8Stream, wanted: list[str], block_size: int) -> Iterator[pa.RecordBatch]:
    reader = pacsv.open_csv(
        pa.PythonFile(stream, mode="r"),  # pyarrow drops a leading byte-order mark itself
        read_options=pacsv.ReadOptions(block_size=block_size),
        # Kaggle's All the News has newlines inside quoted `content`; "" escapes a quote (the default).
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            include_columns=wanted, column_types={c: pa.large_string() for c in wanted}
        ),
    )
    yield from reader


def _stream_csv(
    path: Path, column: str, prepend_title: bool, bad_bytes: int, at: Callable[[int], None]
) -> Iterator[pa.Table]:
    """The documents of a CSV file as `text` tables, parsed a block at a time.

    pyarrow parses in blocks that must each hold whole rows. A row longer than the block (a book in
    one cell) stops the reader; it starts again with a block eight times larger, skipping the rows
    already given, so memory follows the longest row rather than the file. `at(offset)` is told how
    far into the file each table came from.
    """
    header = _csv_header(path, bad_bytes)
    wanted = [column] + (["title"] if prepend_title else [])
    for needed in wanted:
        if needed not in header:
            raise _missing_column(path, needed, header)
    rows, block = 0, CSV_BLOCK_BYTES
    while True:
        seen = 0
        try:
            with _Utf8Stream(path, bad_bytes > 0) as stream:
                for batch in _csv_batches(stream, wanted, block):
                    fresh = batch.slice(max(0, rows - seen))
                    seen += batch.num_rows
                    if fresh.num_rows:
                        rows += fresh.num_rows
                        at(stream.position())
                        table = pa.table({name: _unix_newlines(fresh.column(name)) for name in wanted})
                        yield _text_from_table(table, column, prepend_title, path)
            break
        except pa.ArrowInvalid as exc:
            size = path.stat().st_size
            if "straddl" not in str(exc) or block > size:
                raise DataError(f"{path}: not a valid CSV ({str(exc).splitlines()[0]}); check its quoting") from None
            block = min(block * 8, size + 1, 2**31 - 1)
    if rows == 0:
        raise DataError(f"{path}: CSV has a header but no rows; remove it from --data or add documents")


def _read_txt(data: bytes) -> pa.Table:
    # One document per file: the whole file is the text.
    return pa.table({"text": _unix_newlines(pa.chunked_array([[data.decode("utf-8")]], pa.large_string()))})


def _json_records(path: Path, raw: str, fmt: str) -> list[Any]:
    if fmt == "json":
        try:
            records = json.loads(raw)
        except json.JSONDecodeError:
            records = None  # many ".json" corpora are JSON Lines; try that below
        if isinstance(records, list):
            return records
        if records is not None:
            raise DataError(
                f"{path}: expected a JSON array of objects or one object per line, got a {type(records).__name__}"
            )
    out = []
    # Not str.splitlines(): that also splits at U+2028, U+2029 and U+0085, which JSON allows raw
    # inside strings. A raw CR is not allowed there, so every CR and LF ends a line.
    for lineno, line in enumerate(_LINE_END.split(raw), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}: line {lineno} is not valid JSON ({exc.msg}); fix or remove it") from None
    return out


def _read_json(path: Path, data: bytes, fmt: str, column: str, prepend_title: bool) -> pa.Table:
    records = _json_records(path, data.decode("utf-8"), fmt)
    if not records:
        raise DataError(f"{path}: no JSON records; remove it from --data or add documents")
    if not all(isinstance(r, dict) for r in records):
        raise DataError(f"{path}: every JSON record must be an object with a {column!r} field")
    names = [column] + (["title"] if prepend_title else [])
    for name in names:
        if not any(name in r for r in records):
            raise _missing_column(path, name, list(records[0]))
    columns = {}
    for name in names:
        values = [r.get(name) for r in records]
        bad = next((i for i, v in enumerate(values) if v is not None and not isinstance(v, str)), None)
        if bad is not None:
            raise DataError(f"{path}: record {bad + 1} field {name!r} is {type(values[bad]).__name__}, not text")
        columns[name] = pa.array(values, pa.large_string())
    return _text_from_table(pa.table(columns), column, prepend_title, path)


def _read_parquet(path: Path, column: str, prepend_title: bool) -> pa.Table:
    try:
        names = pq.read_schema(path).names
        wanted = [column] + (["title"] if prepend_title else [])
        for needed in wanted:
            if needed not in names:
                raise _missing_column(path, needed, names)
        table = pq.read_table(path, columns=wanted)
    except pa.ArrowException as exc:
        raise DataError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0]})") from None
    if table.num_rows == 0:
        raise DataError(f"{path}: parquet file has no rows; remove it from --data or add documents")
    return _text_from_table(table, column, prepend_title, path)


def read_file(
    src: SourceFile,
    text_column: str | None,
    prepend_title: bool,
    strict_utf8: bool,
    at: Callable[[int], None] = lambda offset: None,
) -> tuple[Iterator[pa.Table], int]:
    """The documents of one file as `text` tables (one row per document; a CSV file streamed in
    blocks, any other read whole), and the count of its bytes that were not UTF-8 (read as U+FFFD;
    with `strict_utf8` they are a DataError)."""
    column = text_column or DEFAULT_TEXT_COLUMN.get(src.fmt, "text")
    if src.fmt == "parquet":
        return iter([_read_parquet(src.path, column, prepend_title)]), 0  # pyarrow decodes parquet's strings
    if src.fmt == "csv":
        bad_bytes = scan_utf8(src.path, strict_utf8)
        return _stream_csv(src.path, column, prepend_title, bad_bytes, at), bad_bytes
    data, bad_bytes = read_utf8(src.path, strict_utf8)
    if src.fmt == "txt":
        return iter([_read_txt(data)]), bad_bytes
    if src.fmt in ("json", "jsonl"):
        return iter([_read_json(src.path, data, src.fmt, column, prepend_title)]), bad_bytes
    raise AssertionError(f"no reader for {src.fmt}")


@dataclass
class ReadReport:
    """How far reading has come, and which of the files read held bytes that are not UTF-8; filled in
    as the corpus is read."""

    total: int = 0  # bytes of the source files (rows of a Hugging Face dataset)
    done: int = 0  # how many of those have been read
    files_read: int = 0
    not_utf8: list[tuple[str, int]] = field(default_factory=list)  # (file, bytes read as U+FFFD), in order


def iter_documents(sources: Sources, config: DataConfig, report: ReadReport) -> Iterator[pa.Table]:
    """The documents of the corpus as `text` tables, in order, one file (or CSV block) at a time; at
    most `max_documents` rows in all. Files are opened only as the stream reaches them."""
    limit = config.max_documents
    if sources.hf_dataset is not None:
        table = _hf_text_table(sources.hf_dataset, config)
        report.total = table.num_rows
        for batch in table.to_batches(max_chunksize=_HF_BATCH_ROWS):
            report.done += batch.num_rows
            yield pa.Table.from_batches([batch])
        return
    sizes = [src.path.stat().st_size for src in sources.files]
    report.total, rows = sum(sizes), 0
    for i, src in enumerate(sources.files):
        if limit is not None and rows >= limit:
            return  # a quick run need not parse the rest of a large corpus
        before = sum(sizes[:i])
        report.done = before

        def at(offset: int, before: int = before) -> None:
            report.done = before + offset

        tables, bad_bytes = read_file(src, config.text_column, config.prepend_title, config.strict_utf8, at)
        report.files_read += 1
        if bad_bytes:
            report.not_utf8.append((str(src.path), bad_bytes))
        for table in tables:
            take = table if limit is None else table.slice(0, limit - rows)
            rows += take.num_rows
            if take.num_rows:
                yield take
            if limit is not None and rows >= limit:
                break
        report.done = before + sizes[i]


@dataclass
class Corpus:
    """The documents read, and which of the files read held bytes that are not UTF-8."""

    table: pa.Table  # one `text` column, one row per document, in order
    files_read: int
    not_utf8: list[tuple[str, int]] = field(default_factory=list)  # (file, bytes read as U+FFFD), in order


def read_corpus(sources: Sources, config: DataConfig) -> Corpus:
    """All documents of the corpus in memory, in order; at most `max_documents` rows."""
    report = ReadReport()
    tables = list(iter_documents(sources, config, report))
    empty = pa.table({"text": pa.array([], pa.large_string())})
    return Corpus(pa.concat_tables(tables or [empty]), files_read=report.files_read, not_utf8=report.not_utf8)


def read_documents(sources: Sources, config: DataConfig) -> pa.Table:
    """All documents of the corpus, in order, as one `text` table; at most `max_documents` rows."""
    return read_corpus(sources, config).table


# ----------------------------------------------------------------------------- Hugging Face datasets


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any(
        (path / name).exists() for name in ("dataset_info.json", "state.json", "dataset_dict.json")
    )


def _describe_hf(config: DataConfig, hf_cache_dir: Path) -> Sources:
    """Load a Hugging Face dataset (a hub name, a builder such as "csv" with --data as data_files, or
    a folder written by `save_to_disk`) and fingerprint it."""
    import datasets  # only this source needs the loader machinery

    name = config.hf_dataset
    assert name is not None
    where = f"{name}" + (f" ({config.hf_config})" if config.hf_config else "") + f" split {config.hf_split!r}"
    local = Path(name).expanduser()
    try:
        if _is_saved_dataset(local):
            ds = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                if config.hf_split not in ds:
                    raise DataError(
                        f"{local}: no split {config.hf_split!r} (it has {', '.join(ds)}); pass --hf_split NAME"
                    )
                ds = ds[config.hf_split]
            saved = sorted(p for p in local.rglob("*") if p.is_file())
            key: dict[str, Any] = {"hf_saved": [[str(p.relative_to(local)), file_sha256(p)] for p in saved]}
        else:
            files = resolve_files(config.paths) if config.paths else []
            ds = datasets.load_dataset(
                name,
                config.hf_config,
                split=config.hf_split,
                data_files=[str(f.path) for f in files] or None,
                cache_dir=str(hf_cache_dir),
            )
            # datasets' own fingerprint identifies hub data; local data files are hashed here as well,
            # since content edits must always invalidate the cache.
            key = {
                "hf": [name, config.hf_config, config.hf_split, ds._fingerprint],
                "files": [file_sha256(f.path) for f in files],
            }
    except DataError:
        raise
    except Exception as exc:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ValueError, ...)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{where}: cannot load this dataset ({first}); check the name, config and split") from None
    column = config.text_column or DEFAULT_TEXT_COLUMN["hf"]
    needed = [column] + (["title"] if config.prepend_title else [])
    for n in needed:
        if n not in ds.column_names:
            raise _missing_column(where, n, ds.column_names)
    if len(ds) == 0:
        raise DataError(f"{where}: dataset has no rows; pick another split with --hf_split")
    return Sources(description=f"Hugging Face dataset {where}", key=key, hf_dataset=ds)


def _hf_text_table(ds: Any, config: DataConfig) -> pa.Table:
    column = config.text_column or DEFAULT_TEXT_COLUMN["hf"]
    cols = [column] + (["title"] if config.prepend_title else [])
    ds = ds.select_columns(cols)
    if config.max_documents:
        ds = ds.select(range(min(config.max_documents, len(ds))))
    ds = ds.flatten_indices() if ds._indices is not None else ds
    return _text_from_table(ds.data.table, column, config.prepend_title, config.hf_dataset)
