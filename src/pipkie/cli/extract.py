"""Extraction for users: `pipkie extract`, `pipkie explain`, `pipkie ocr`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from pipkie.cli.common import (
    COMPUTE_HELP,
    OCR_MIN_SCORE_HELP,
    app,
    check_compute,
    decoder_help,
    error,
    key_schema,
    load_extractor,
    ocr_options,
    parse_shard,
    set_threads,
)


@app.command()
def extract(
    files: list[Path] = typer.Argument(
        ...,
        help="documents (images, PDFs, JSON words, SROIE box files, text), "
        "folders (searched recursively) or glob patterns",
    ),
    keys: str | None = typer.Option(
        None,
        help="comma-separated keys, e.g. company,date,address,total; a typed key as date:date (date, "
        "time, money, phone); a list of items as items[name,quantity,price] (price!: items without a "
        "price are left out) (default: the model's keys)",
    ),
    schema: Path | None = typer.Option(
        None, help="a JSON-schema file (instead of --keys): string properties, arrays of objects for lists (maxItems)"
    ),
    model: str | None = typer.Option(
        None, help="model directory (default: $PIPKIE_MODEL, else the shipped models/pipkie)"
    ),
    decode: str = typer.Option("pip", help=decoder_help("AR: the model's AR baseline, or --ar-model")),
    ar_model: str | None = typer.Option(
        None, help="AR model for --decode ar-free|ar-forced (default: the model's ar_baseline)"
    ),
    refine_steps: int = typer.Option(0, help="PIP Mask-Predict refinement passes"),
    snap: bool = typer.Option(
        True,
        "--snap/--no-snap",
        help="fit values to the document's words (every decoder): a value cut inside a word completed to "
        "its end, one that runs on into another key's value ended where that one starts",
    ),
    pretty: bool = typer.Option(
        False,
        "--json",
        help="pretty-print each result as indented JSON (default: one compact JSON object per line, i.e. JSON lines)",
    ),
    draw: Path | None = typer.Option(
        None, help="draw the boxes and values on the page image and save it here (several files: OUT.<file stem>.png)"
    ),
    threads: int | None = typer.Option(None, help="torch/OCR threads (default $PIPKIE_THREADS or 1)"),
    compute: str | None = typer.Option(None, help=COMPUTE_HELP),
    ocr: str = typer.Option("rapidocr", help="OCR engine for images and scanned PDFs: rapidocr | tesseract"),
    ocr_min_score: float | None = typer.Option(None, help=OCR_MIN_SCORE_HELP),
    batch_size: int = typer.Option(8, min=1, help="documents decoded together (one forward pass for PIP)"),
    max_pages: int = typer.Option(20, min=1, help="refuse documents with more pages"),
    progress: bool = typer.Option(
        True, "--progress/--no-progress", help="progress bar on stderr (on a terminal, for 2+ files)"
    ),
    out: Path | None = typer.Option(
        None,
        help="append one JSON line per file here (results and error rows) "
        "instead of stdout; files already in it are skipped (resume)",
    ),
    workers: int = typer.Option(
        0,
        min=0,
        help="OCR/loading processes running ahead of the model (0: load in this "
        "process, one window at a time); with --ray: model actors (0: 1)",
    ),
    ray: str | None = typer.Option(
        None,
        metavar="ADDRESS",
        help="run on Ray (pipkie[ray]; needs --out): local "
        "(a Ray instance started here), auto (the running cluster) or HOST:PORT",
    ),
):
    """Extract key fields from documents: one JSON object per file on stdout (JSON lines), or with
    --out appended to a file as {"file": ..., ...} rows, resumably (pipkie.pipeline; docs/SCALE.md).

    Each object is Extraction.to_dict(), the same JSON as the service's POST /extract.

    Per field: value, confidence (calibrated when the model carries a map: pipkie calibrate), boxes
    (page, x0 y0 x1 y1 relative to the page, text), grounding, truncated (the value filled its
    budget). Per file: truncated and dropped_tokens (a document longer than the context keeps its
    start and its end).

    A file that cannot be read gives a one-line error on stderr (and an error row in --out); the
    others are still processed, exit code 1.
    """
    from pipkie.decoding import DECODERS
    from pipkie.pipeline import expand_inputs, extract_files

    if decode not in DECODERS:
        raise typer.BadParameter(f"must be one of {', '.join(DECODERS)}", param_hint="--decode")
    ks = key_schema(keys, schema)
    ocr_opts = ocr_options(ocr, ocr_min_score)
    n = set_threads(threads)
    compute = check_compute(compute)
    ex = load_extractor(model, n, ocr, compute)
    if ks is None and not ex.settings.keys:
        raise typer.BadParameter("this model has no default keys: give --keys or --schema")
    if ar_model and not Path(ar_model).is_dir():
        error(f"AR model not found: {ar_model} is not a directory")
        raise typer.Exit(2)
    ex.ar_model = ar_model
    try:
        ex.decoder(decode)  # AR: load the AR baseline now; a PIP model without one is refused here
    except (OSError, ValueError) as e:
        error(str(e).replace("\n", " "))
        raise typer.Exit(2) from None
    files = expand_inputs(files)
    outs = draw_paths(draw, files) if draw else [None] * len(files)
    failures = 0
    common = dict(
        schema=ks,
        decode=decode,
        refine_steps=refine_steps,
        snap=snap,
        batch_size=batch_size,
        max_pages=max_pages,
        ocr_options=ocr_opts,
        progress=progress and len(files) > 1,
        log=lambda m: typer.echo(m, err=True),
    )
    if ray:
        if out is None or draw:
            raise typer.BadParameter("--ray writes its rows to --out (and cannot --draw)", param_hint="--ray")
        from pipkie.distributed import extract_files_ray

        outcomes = extract_files_ray(
            ex.name,
            files,
            out,
            ocr=ocr,
            ocr_threads=n,
            model_threads=n,
            actors=workers or 1,
            ar_model=ar_model,
            compute=compute,
            address=None if ray == "local" else ray,
            **common,
        )
    else:
        outcomes = extract_files(ex, files, workers=workers, out=out, **common)
    for o in outcomes:
        if o.error is not None:
            failures += 1
            error(o.error)
            continue
        result, path = o.result, o.file
        if out is None:
            typer.echo(result.to_json(indent=2) if pretty else result.to_json())
            if result.truncated:
                typer.echo(
                    f"note: {path}: {result.dropped_tokens} document tokens dropped from the middle to fit "
                    "the model's context (its start and end are kept)",
                    err=True,
                )
            cut = result.cut_fields()
            if cut:
                typer.echo(f"note: {path}: {', '.join(cut)} filled the whole budget (value may be cut)", err=True)
            for name in result.lists_truncated:
                typer.echo(
                    f"note: {path}: {name} filled all its items (there may be more: give a larger maxItems "
                    "in a --schema file)",
                    err=True,
                )
        if outs[o.index] is not None:
            try:
                draw_extraction(result, o.document, path, outs[o.index])
            except Exception as e:
                failures += 1
                error(f"{path}: cannot draw {outs[o.index]} ({type(e).__name__}: {e})")
    if failures:
        typer.echo(f"{failures} of {len(files)} file(s) failed", err=True)
        raise typer.Exit(1)


def draw_paths(draw: Path, files: list[Path]) -> list[Path]:
    """OUT.png for one file; OUT.<file stem>.png for several (OUT.<i>.<stem>.png if stems repeat)."""
    if len(files) == 1:
        return [draw]
    stems = [f.stem for f in files]
    return [
        draw.with_name(f"{draw.stem}.{i}.{s}{draw.suffix}" if stems.count(s) > 1 else f"{draw.stem}.{s}{draw.suffix}")
        for i, s in enumerate(stems)
    ]


def draw_extraction(result, doc, source: Path, out: Path) -> Path:
    """The fields' boxes on the page; each item of a list is one entry ("items 3": its values), so
    that every item gets its own colour."""
    from collections import Counter

    from pipkie.io.document import Word
    from pipkie.io.grounding import draw
    from pipkie.io.heatmap import page_image

    def words_of(f):
        return [Word(b.text, tuple(round(v * 1000) for v in (b.x0, b.y0, b.x1, b.y1)), b.page) for b in f.boxes]

    fields = {}
    for key, f in result.fields.items():
        if isinstance(f, list):
            for i, item in enumerate(f, 1):
                read = [x for x in item.values() if x.value is not None]
                fields[f"{key} {i}"] = (" · ".join(x.value for x in read), [w for x in read for w in words_of(x)])
            continue
        if f.value is None:
            continue
        fields[key] = (f.value, words_of(f))
    pages = Counter(w.page for _, words in fields.values() for w in words)
    page = pages.most_common(1)[0][0] if pages else 0
    return draw(doc, fields, page_image(doc, page, source), out, page=page)


@app.command()
def ocr(
    src: Path = typer.Argument(..., help="a folder of images/PDFs (searched recursively) or one file"),
    out: Path = typer.Option(..., help="folder for the JSON-words files ({relative path}.json)"),
    engine: str = typer.Option("rapidocr", help="rapidocr | tesseract"),
    threads: int | None = typer.Option(None, help="OCR threads per process (default $PIPKIE_THREADS or 1)"),
    limit: int | None = typer.Option(None, help="at most this many files"),
    shard: str = typer.Option("0/1", help="I/N: every N-th file from the I-th (run N processes to use N cores)"),
    min_score: float | None = typer.Option(None, help=OCR_MIN_SCORE_HELP),
):
    """OCR a folder into pipkie's JSON-words format, resumably (files already done are skipped).

    The outputs load with `pipkie extract OUT/x.json` and as the dataset `words` (`pipkie.data.words`).
    """
    from pipkie.io.ocr import set_engine_options
    from pipkie.io.ocr_folder import ocr_folder

    part = parse_shard(shard)
    options = ocr_options(engine, min_score, "--min-score")
    if options:
        set_engine_options(engine, **options)
    try:
        stats = ocr_folder(src, out, engine=engine, threads=set_threads(threads), limit=limit, shard=part)
    except FileNotFoundError as e:
        raise typer.BadParameter(str(e), param_hint="SRC") from None
    typer.echo(json.dumps(stats))
    if stats["failed"]:
        typer.echo(f"{stats['failed']} file(s) failed: see {out / 'errors.jsonl'}", err=True)


@app.command()
def explain(
    file: Path = typer.Argument(..., help="the document (image, PDF, JSON words, box file or text)"),
    key: str = typer.Option(..., help="the field to explain, e.g. total"),
    keys: str | None = typer.Option(None, help="the keys it is decoded among (default: the model's keys)"),
    model: str | None = typer.Option(None, help="model directory (default: $PIPKIE_MODEL, else the shipped model)"),
    out: Path | None = typer.Option(None, help="heat map PNG (default: <file stem>.<key>.heat.png)"),
    page: int | None = typer.Option(None, help="page to draw, from 0 (default: the one with most attention)"),
    top: int = typer.Option(10, help="words listed"),
    pretty: bool = typer.Option(False, "--json", help="print the top words as JSON"),
    threads: int | None = typer.Option(None),
    ocr: str = typer.Option("rapidocr", help="rapidocr | tesseract"),
):
    """What chose a field's value: the copy head's start distribution over the document's words and
    the attention of the field's slots (layers, heads, slots averaged), listed and drawn as heat maps
    side by side. The value and confidence are exactly `pipkie extract`'s (the same decoding)."""
    from pipkie.explain import explain as run
    from pipkie.io.heatmap import draw_heatmap
    from pipkie.io.loaders import DocumentError
    from pipkie.io.ocr import OCREngineError

    n = set_threads(threads)
    ks = key_schema(keys, None)
    ex = load_extractor(model, n, ocr)
    try:
        doc = ex.load(file)
        e = run(ex, doc, key, keys=ks)
    except (DocumentError, OCREngineError, ValueError) as err:
        error(str(err))
        raise typer.Exit(1) from None
    out = out or Path(f"{file.stem}.{key}.heat.png")
    draw_heatmap(e, file, out, doc=doc, page=page)
    if pretty:
        typer.echo(json.dumps({**e.to_dict(top=top), "heatmap": str(out)}, ensure_ascii=False, indent=2))
        return
    typer.echo(
        f"{key} = {e.value!r} (confidence {e.confidence:.2f})"
        + (" (filled its whole budget)" if e.value_truncated else "")
        + (f"; {e.truncated} document tokens dropped from the middle" if e.truncated else "")
    )
    if e.copy_head:
        typer.echo("copy head, where the value starts (probability per word):")
        for w, x in e.top_starts(top):
            typer.echo(f"  {x:6.3f}  p{w.page} {w.text}")
    typer.echo(f"attention of its {e.slots} slots ({e.document_share:.0%} on the document), per word:")
    for w, x in e.top(top):
        typer.echo(f"  {x:6.3f}  p{w.page} {w.text}")
    typer.echo(f"heat map: {out}")
