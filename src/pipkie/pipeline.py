"""Extraction over many files on one machine: `pipkie extract DIR|GLOB... --out results.jsonl`.

    from pipkie import Extractor
    from pipkie.pipeline import expand_inputs, extract_files
    ex = Extractor.from_pretrained(threads=1)
    for outcome in extract_files(ex, expand_inputs(["scans/"]), out="results.jsonl", workers=1):
        ...                                           # Outcome: file, result (Extraction) or error

What it does, and why:

- **Inputs**: folders (searched recursively for images, PDFs, JSON words and text files) and glob
  patterns are expanded in sorted order (`expand_inputs`); a plain path is kept as given, so a
  missing file is reported as an error row, not dropped.
- **Pipeline**: with `workers=N >= 1`, files are loaded (read and OCR'd) in N worker processes
  while this process decodes the previous window of documents, so OCR and the model run on
  different cores at the same time. Workers run ahead by at most two windows, which bounds memory.
  `workers=0` loads each window in this process before decoding it (serial; what `pipkie extract`
  did before). Both paths form the very same batches, so they write the same JSON per file.
  Workers run at a lower priority (nice +5) than this process: a batch of the model is never
  slowed by OCR, and with as many workers as cores (`--workers 2` on 2 cores) OCR takes every
  moment the model's core would idle waiting for documents.
- **Dynamic batching by length**: the files are taken in windows of `window` (default 2 batches);
  a window's documents are sorted by token length and cut into batches of `batch_size` (and at
  most `max_batch_tokens` padded tokens), so short receipts are not padded to a long one's length.
  Windows are fixed slices of the input list, so batches do not depend on timing. A larger window
  groups lengths better; a smaller one starts decoding sooner (the first window's loading is
  never hidden behind decoding). A batch that
  fails is retried one document at a time, so one bad document costs only its own result.
- **Output** (`out`, JSON lines, appended window by window and flushed): one row per file,
  `{"file": path, **Extraction.to_dict()}` for a result and `{"file": path, "error": message,
  "code": code}` for a file that could not be read or decoded; the run goes on after an error.
  Errors are rows of the same file (not a sibling file) so that one file says what happened to
  every input and a resume needs to read only it.
- **Resume**: files that already have a row in `out` (a result or an error) are skipped, matched by
  the path string as given. A row cut by a kill is removed before appending. To retry the failed
  files, delete their error rows (`grep -v '"error":' results.jsonl > kept.jsonl`) and run again.
  Documents of a resumed run are batched with different neighbours; values are the same, a
  confidence can move in its last digits (left padding changes float rounding).
- **Progress**: a tqdm bar on stderr (files, rate, ETA) when it is a terminal.

OCR engine options (`ocr_options`, e.g. {"max_side": 1600}) are set in every loading process
through `pipkie.io.ocr.set_engine_options`; None keeps the engine's defaults and its outputs.
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from pipkie.io.document import Document
from pipkie.io.loaders import DocumentError, load_document
from pipkie.io.ocr import OCREngineError, set_engine_options

DIRECTORY_EXTENSIONS = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp", ".gif", ".pdf", ".json", ".txt"}


def expand_inputs(args: Iterable[str | Path]) -> list[Path]:
    """Paths of `args`: a folder -> its documents (recursively, sorted); a glob pattern that names no
    existing file -> its matches (sorted; `**` crosses folders); anything else is kept as given."""
    out: list[Path] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in DIRECTORY_EXTENSIONS)
        elif not p.exists() and glob.has_magic(str(arg)) and (matches := sorted(glob.glob(str(arg), recursive=True))):
            out += [Path(m) for m in matches if Path(m).is_file()]
        else:
            out.append(p)
    return out


@dataclass
class Outcome:
    """What happened to one input: `result` (an Extraction) or `error` (a message; `code` for
    machines). `index` is the file's position in the list given to `extract_files`; `document` is
    the loaded Document (None if loading failed)."""

    index: int
    file: Path
    document: Document | None = None
    result: object | None = None
    error: str | None = None
    code: str | None = None

    def row(self) -> dict:
        """The output file's JSON line for this file."""
        if self.error is not None:
            return {"file": str(self.file), "error": self.error, "code": self.code}
        return {"file": str(self.file), **self.result.to_dict()}


def done_files(out: str | Path) -> set[str]:
    """Files that already have a row in `out` (created if missing). A last line without its newline
    (a run killed while writing) is cut off, so rows appended next start on a line of their own."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        out.touch()
        return set()
    data = out.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(out, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
        data = data[: data.rfind(b"\n") + 1]
    done = set()
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            done.add(json.loads(line)["file"])
        except (ValueError, KeyError, TypeError):
            continue  # not one of our rows: leave it, never fail a resume on it
    return done


def length_batches(lengths: list[int], batch_size: int, max_batch_tokens: int | None = None) -> list[list[int]]:
    """Indices into `lengths` grouped into batches of similar length: sorted by (length, index),
    cut every `batch_size` items, and earlier where the padded size (items x longest) would pass
    `max_batch_tokens`. Deterministic: the same lengths always give the same batches."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        last = batches[-1] if batches else None
        if (
            last is None
            or len(last) >= batch_size
            or (max_batch_tokens and (len(last) + 1) * lengths[i] > max_batch_tokens)
        ):
            batches.append([i])
        else:
            last.append(i)
    return batches


def token_length(ex, doc: Document) -> int:
    """Tokens of the document's words (or text): what its decoding cost grows with."""
    text = doc.text if doc.text is not None else " ".join(w.text for w in doc.words)
    return len(ex.tokenizer(text, add_special_tokens=False)["input_ids"])


def decode_documents(
    ex,
    docs: list[Document],
    *,
    schema=None,
    decode: str = "pip",
    refine_steps: int = 0,
    snap: bool = True,
    batch_size: int = 8,
    max_batch_tokens: int | None = None,
) -> list:
    """An Extraction (or the Exception that stopped it) per document, in the order given; batches
    of similar length (`length_batches`), a failed batch retried one document at a time."""
    results: list = [None] * len(docs)
    lengths = [token_length(ex, d) for d in docs]
    kw = dict(schema=schema, decode=decode, refine_steps=refine_steps, snap=snap)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation: reported on each Extraction
        for batch in length_batches(lengths, batch_size, max_batch_tokens):
            try:
                for i, r in zip(batch, ex.extract_many([docs[i] for i in batch], batch_size=len(batch), **kw)):
                    results[i] = r
            except Exception:  # find the document that fails: each one alone
                for i in batch:
                    try:
                        results[i] = ex.extract_many([docs[i]], **kw)[0]
                    except Exception as e:
                        results[i] = e
    return results


def decode_outcomes(ex, outcomes: list, docs: list[Document], **kw) -> None:
    """`decode_documents` of `docs`, each result (or its error, as `extraction_failed`) put on the
    Outcome at the same place: what the local and the Ray paths both do with a loaded window."""
    for o, r in zip(outcomes, decode_documents(ex, docs, **kw)):
        if isinstance(r, Exception):
            o.error = f"{o.file}: extraction failed ({type(r).__name__}: {r})".replace("\n", " ")
            o.code = "extraction_failed"
        else:
            o.result = r


def configure_ocr(engine: str, options: dict | None) -> None:
    """Engine options for this process (`pipkie.io.ocr.set_engine_options`)."""
    if options:
        set_engine_options(engine, **options)


def load_file(path: str, engine: str, threads: int, max_pages: int) -> tuple[Document | None, str | None, str | None]:
    """(document, None, None), or (None, message, code) for a file that cannot be loaded: errors are
    returned, not raised, so that they cross the process boundary as plain strings."""
    try:
        return load_document(path, ocr=engine, threads=threads, max_pages=max_pages), None, None
    except (DocumentError, OCREngineError) as e:
        return None, str(e).replace("\n", " "), getattr(e, "code", "ocr_engine")
    except Exception as e:  # never let one file stop the run
        return None, f"{path}: cannot load ({type(e).__name__}: {e})".replace("\n", " "), "load_failed"


WORKER_NICE = 5  # loading processes yield the CPU to the model's process (see the module docstring)


def _init_worker(engine: str, options: dict | None) -> None:
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.nice(WORKER_NICE)
    configure_ocr(engine, options)


class _Loader:
    """Loads files by index: in this process when it is asked for one (workers=0), or ahead of time
    in `workers` spawned processes. A worker that dies (a crash in a native OCR library) breaks the
    pool: it is restarted, and the file being waited for is tried once more alone before it is
    reported as the one that crashed it."""

    def __init__(self, files: list[Path], workers: int, args: tuple, options: dict | None):
        self.files, self.workers, self.args, self.options = files, workers, args, options
        self.pending: dict[int, object] = {}
        self.next = 0
        self.pool = self._pool() if workers else None

    def _pool(self):
        return ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self.args[0], self.options),
        )

    def _submit(self, i: int):
        self.pending[i] = self.pool.submit(load_file, str(self.files[i]), *self.args)

    def prefetch(self, upto: int) -> None:
        while self.pool and self.next < min(upto, len(self.files)):
            self._submit(self.next)
            self.next += 1

    def _restart(self, resubmit: Iterable[int]) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = self._pool()
        for j in resubmit:
            self._submit(j)

    def get(self, i: int):
        if self.pool is None:
            return load_file(str(self.files[i]), *self.args)
        self.prefetch(i + 1)
        try:
            return self.pending.pop(i).result()
        except BrokenProcessPool:
            pass
        others = sorted(self.pending)
        self._restart([i])  # this file alone in a fresh pool: did it crash the worker?
        try:
            result = self.pending.pop(i).result()
        except BrokenProcessPool:
            self._restart([])
            result = None, f"{self.files[i]}: the OCR worker process crashed on this file", "worker_crashed"
        for j in others:
            self._submit(j)
        return result

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown(wait=True, cancel_futures=True)


def extract_files(
    ex,
    files: list[Path],
    *,
    schema=None,
    decode: str = "pip",
    refine_steps: int = 0,
    snap: bool = True,
    batch_size: int = 8,
    window: int | None = None,
    max_batch_tokens: int | None = None,
    max_pages: int = 20,
    workers: int = 0,
    ocr_threads: int | None = None,
    ocr_options: dict | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> Iterator[Outcome]:
    """Extract from every file (see the module docstring); yields one Outcome per file processed,
    window by window, in input order within a window. With `out`, rows are appended there (and files
    already in it skipped). OCR engine and threads: the extractor's (`ex.ocr`; `ocr_threads`,
    default `ex.threads`, per loading process)."""
    from tqdm import tqdm

    log = log or (lambda m: None)
    files = [Path(f) for f in files]
    order = list(range(len(files)))
    if out is not None:
        done = done_files(out)
        order = [i for i in order if str(files[i]) not in done]
        if len(order) < len(files):
            log(f"resuming: {len(files) - len(order)} of {len(files)} file(s) already in {out}")
    window = window or 2 * batch_size
    args = (ex.ocr, ocr_threads or ex.threads, max_pages)
    if not workers:
        configure_ocr(ex.ocr, ocr_options)
    loader = _Loader([files[i] for i in order], workers, args, ocr_options)
    sink = open(out, "a", encoding="utf-8") if out is not None else None
    bar = tqdm(total=len(order), unit="file", file=sys.stderr, disable=None if progress else True, smoothing=0.1)
    try:
        for start in range(0, len(order), window):
            loader.prefetch(start + 3 * window)  # this window and two ahead
            todo = range(start, min(start + window, len(order)))
            outcomes = [Outcome(order[k], files[order[k]]) for k in todo]
            for o, k in zip(outcomes, todo):
                o.document, o.error, o.code = loader.get(k)
            ok = [o for o in outcomes if o.document is not None]
            decode_outcomes(
                ex,
                ok,
                [o.document for o in ok],
                schema=schema,
                decode=decode,
                refine_steps=refine_steps,
                snap=snap,
                batch_size=batch_size,
                max_batch_tokens=max_batch_tokens,
            )
            if sink is not None:
                sink.write("".join(json.dumps(o.row(), ensure_ascii=False) + "\n" for o in outcomes))
                sink.flush()
            bar.update(len(outcomes))
            yield from outcomes
    finally:
        bar.close()
        loader.close()
        if sink is not None:
            sink.close()
