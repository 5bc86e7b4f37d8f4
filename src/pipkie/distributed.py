"""Extraction over many machines with Ray Data: `pipkie extract ... --out results.jsonl --ray [ADDRESS]`.

    from pipkie.distributed import extract_files_ray
    for outcome in extract_files_ray("models/pipkie", files, "results.jsonl", address="auto"):
        ...

Needs the optional extra `pipkie[ray]` (`ray[data]`). The pipeline, streamed by Ray Data:

    paths ─► OCR (map_batches: CPU tasks, `ocr_threads` CPUs each) ─► extract (map_batches on an
    actor pool: one model per actor, `model_threads` CPUs each) ─► rows, written here to `out`

- Files are read by the OCR tasks, where they run: on a cluster every node must see the same paths
  (a shared or mounted file system); documents travel to the actors as JSON (`Document.to_dict`).
- Each actor loads the model once and decodes the rows it is given exactly as the one-machine path
  does (`pipkie.pipeline.decode_documents`: length batches, a failed batch retried one document at
  a time); rows reach an actor in bundles of up to `window`, sorted by their input position first,
  so the same bundle always gives the same batches.
- The output is the one-machine format (`pipkie.pipeline`): one row per file, results and error
  rows, written by this (driver) process as rows stream back, flushed every `flush_every` rows;
  files already in `out` are skipped, so a run resumes the same way. Rows come back in the order
  Ray finishes them, not the input order. Confidences agree with the one-machine path to float
  rounding when Ray bundles files differently from its windows (batch neighbours change padding).

`address`: None starts a local Ray instance in this process; "auto" or "HOST:PORT" joins a
running cluster (`ray start --head`; docs/SCALE.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from pipkie.io.document import Document
from pipkie.pipeline import Outcome, configure_ocr, decode_outcomes, done_files, load_file

_configured: set = set()  # OCR options already set in this worker process


def ocr_batch(batch: dict, *, engine: str, threads: int, max_pages: int, options: dict | None) -> dict:
    """Ray Data task: load (and OCR) each file of a batch; a document as JSON, or its error."""
    key = (engine, json.dumps(options, sort_keys=True))
    if key not in _configured:
        configure_ocr(engine, options)
        _configured.add(key)
    docs, errors, codes = [], [], []
    for path in batch["file"]:
        doc, error, code = load_file(str(path), engine, threads, max_pages)
        docs.append(json.dumps(doc.to_dict(), ensure_ascii=False) if doc is not None else "")
        errors.append(error or "")
        codes.append(code or "")
    return {"index": batch["index"], "file": batch["file"], "doc": docs, "error": errors, "code": codes}


class ExtractActor:
    """Ray Data actor: one Extractor (loaded once), rows of OCR'd documents in, output rows out."""

    def __init__(
        self,
        model: str,
        threads: int = 1,
        ocr: str = "rapidocr",
        ar_model: str | None = None,
        compute: str | None = None,
    ):
        import torch

        from pipkie import Extractor

        torch.set_num_threads(threads)
        self.ex = Extractor.from_pretrained(model, threads=threads, ocr=ocr, ar_model=ar_model, compute=compute)

    def __call__(
        self,
        batch: dict,
        *,
        schema=None,
        decode: str = "pip",
        refine_steps: int = 0,
        snap: bool = True,
        batch_size: int = 8,
        max_batch_tokens: int | None = None,
    ) -> dict:
        order = sorted(range(len(batch["index"])), key=lambda i: int(batch["index"][i]))
        outcomes = [
            Outcome(
                int(batch["index"][i]),
                Path(str(batch["file"][i])),
                error=str(batch["error"][i]) or None,
                code=str(batch["code"][i]) or None,
            )
            for i in order
        ]
        docs = {
            o.index: Document.from_dict(json.loads(str(batch["doc"][i])))
            for o, i in zip(outcomes, order)
            if o.error is None
        }
        ok = [o for o in outcomes if o.error is None]
        decode_outcomes(
            self.ex,
            ok,
            [docs[o.index] for o in ok],
            schema=schema,
            decode=decode,
            refine_steps=refine_steps,
            snap=snap,
            batch_size=batch_size,
            max_batch_tokens=max_batch_tokens,
        )
        return {
            "index": [o.index for o in outcomes],
            "row": [json.dumps(o.row(), ensure_ascii=False) for o in outcomes],
        }


class _Row(dict):
    """An output row's extraction, as the CLI reads an Extraction (`to_dict`)."""

    def to_dict(self) -> dict:
        return dict(self)


def extract_files_ray(
    model: str,
    files: list[Path],
    out: str | Path,
    *,
    schema=None,
    decode: str = "pip",
    refine_steps: int = 0,
    snap: bool = True,
    batch_size: int = 8,
    window: int | None = None,
    max_batch_tokens: int | None = None,
    max_pages: int = 20,
    ocr: str = "rapidocr",
    ocr_threads: int = 1,
    ocr_options: dict | None = None,
    model_threads: int = 1,
    actors: int = 1,
    ar_model: str | None = None,
    compute: str | None = None,
    address: str | None = None,
    flush_every: int = 32,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> Iterator[Outcome]:
    """Extract from every file not yet in `out` on Ray (see the module docstring); yields one
    Outcome per file as its row is written (its `result` is the row's extraction as a dict)."""
    import ray

    log = log or (lambda m: None)
    files = [Path(f) for f in files]
    done = done_files(out)
    positions = [i for i, f in enumerate(files) if str(f) not in done]  # in `files`, as Outcome.index
    todo = [files[i] for i in positions]
    if len(todo) < len(files):
        log(f"resuming: {len(files) - len(todo)} of {len(files)} file(s) already in {out}")
    if not todo:
        return
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="warning")
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = progress
    ctx.print_on_execution_start = False
    ds = ray.data.from_items([{"index": k, "file": str(f)} for k, f in enumerate(todo)])
    # OCR's CPUs given by a function: Ray then keeps OCR a stage of tasks of its own, spread over the
    # cluster's free CPUs, instead of fusing it into the model actors (which would run it serially)
    ds = ds.map_batches(
        ocr_batch,
        batch_size=max(1, batch_size // 2),
        ray_remote_args_fn=lambda: {"num_cpus": ocr_threads},
        fn_kwargs=dict(engine=ocr, threads=ocr_threads, max_pages=max_pages, options=ocr_options),
    )
    ds = ds.map_batches(
        ExtractActor,
        batch_size=window or 2 * batch_size,
        num_cpus=model_threads,
        compute=ray.data.ActorPoolStrategy(size=actors),
        fn_constructor_kwargs=dict(
            model=str(model), threads=model_threads, ocr=ocr, ar_model=ar_model, compute=compute
        ),
        fn_kwargs=dict(
            schema=schema,
            decode=decode,
            refine_steps=refine_steps,
            snap=snap,
            batch_size=batch_size,
            max_batch_tokens=max_batch_tokens,
        ),
    )
    with open(out, "a", encoding="utf-8") as sink:
        for n, item in enumerate(ds.iter_rows(), 1):
            row = json.loads(item["row"])
            sink.write(item["row"] + "\n")
            if n % flush_every == 0:
                sink.flush()
            i = positions[int(item["index"])]
            if "error" in row:
                yield Outcome(i, files[i], error=row["error"], code=row["code"])
            else:
                yield Outcome(i, files[i], result=_Row({k: v for k, v in row.items() if k != "file"}))
