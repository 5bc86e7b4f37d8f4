"""One entry point: `pipkie pretrain | finetune | refit-head | evaluate | bench | extract | explain | serve`."""

from __future__ import annotations

import json
import os
from dataclasses import fields as dc_fields
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Key information extraction with parallel decoding (PIP).")


def _threads(n: int | None) -> int:
    """Threads from the option, else from PIPKIE_THREADS, else 1 (safe on a busy 2-core machine)."""
    n = n or int(os.environ.get("PIPKIE_THREADS", "1"))
    import torch

    torch.set_num_threads(n)
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    return n


def _train_config(config: Optional[Path], overrides: dict):
    from pipkie.train.config import TrainConfig

    base = json.loads(config.read_text()) if config else {}
    names = {f.name for f in dc_fields(TrainConfig)}
    unknown = set(base) - names
    if unknown:
        raise typer.BadParameter(f"unknown config fields: {sorted(unknown)}")
    base.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**base)


_train_opts = dict(
    config=typer.Option(None, help="JSON file with TrainConfig fields; options below override it"),
    base=typer.Option(None, help="smollm2 | compact | a model directory"),
    output_dir=typer.Option(None, help="where checkpoints, logs and the model go"),
    dataset=typer.Option(None), data_dir=typer.Option(None), steps=typer.Option(None),
    batch_size=typer.Option(None), lr=typer.Option(None), lora_r=typer.Option(None, help="0 = full fine-tuning"),
    synthetic=typer.Option(None, help="synthetic receipts added to the data"), threads=typer.Option(None),
    seed=typer.Option(None),
)


@app.command()
def finetune(
    objective: Optional[str] = typer.Option(None, help="pip (parallel) or ar (the autoregressive baseline); default: the config's, else pip"),
    config: Optional[Path] = _train_opts["config"], base: Optional[str] = _train_opts["base"],
    output_dir: Optional[str] = _train_opts["output_dir"], dataset: Optional[str] = _train_opts["dataset"],
    data_dir: Optional[str] = _train_opts["data_dir"], steps: Optional[int] = _train_opts["steps"],
    batch_size: Optional[int] = _train_opts["batch_size"], lr: Optional[float] = _train_opts["lr"],
    lora_r: Optional[int] = _train_opts["lora_r"], synthetic: Optional[int] = _train_opts["synthetic"],
    threads: Optional[int] = _train_opts["threads"], seed: Optional[int] = _train_opts["seed"],
):
    """Stage 2: KV-supervised fine-tuning (resumes from OUTPUT_DIR/checkpoint if present).

    Options given here override the `--config` file's fields (configs/train/*.json)."""
    from pipkie.train.finetune import finetune as run

    opts = {k: v for k, v in locals().items() if k not in ("config", "run")}
    cfg = _train_config(config, opts)
    typer.echo(f"threads: {_threads(cfg.threads)}")
    typer.echo(json.dumps(run(cfg), indent=2))


@app.command()
def pretrain(
    config: Optional[Path] = _train_opts["config"], base: Optional[str] = _train_opts["base"],
    output_dir: Optional[str] = _train_opts["output_dir"], dataset: Optional[str] = _train_opts["dataset"],
    data_dir: Optional[str] = _train_opts["data_dir"], steps: Optional[int] = _train_opts["steps"],
    batch_size: Optional[int] = _train_opts["batch_size"], lr: Optional[float] = _train_opts["lr"],
    lora_r: Optional[int] = _train_opts["lora_r"], synthetic: Optional[int] = _train_opts["synthetic"],
    threads: Optional[int] = _train_opts["threads"], seed: Optional[int] = _train_opts["seed"],
    extra_text: Optional[list[str]] = typer.Option(None, help="more corpora, NAME:DIR (e.g. kleister_nda:../shared/data/kleister_nda)"),
):
    """Stage 1: mask pre-training on document text (resumable)."""
    from pipkie.train.finetune import pretrain as run

    opts = {k: v for k, v in locals().items() if k not in ("config", "run")}
    opts["objective"] = "mask"
    cfg = _train_config(config, opts)
    typer.echo(f"threads: {_threads(cfg.threads)}")
    typer.echo(json.dumps(run(cfg), indent=2))


@app.command("refit-head")
def refit_head(
    model: str = typer.Option(..., help="a fine-tuned model with a copy head"),
    output: str = typer.Option(..., help="where the model with the refitted head goes (may be --model)"),
    dataset: str = "sroie", data_dir: str = typer.Option(..., help="the dataset's directory"), split: str = "train",
    epochs: int = 20, lr: float = 1e-4, holdout: float = 0.1, seed: int = 0, limit: Optional[int] = None,
    threads: Optional[int] = typer.Option(None, help="torch threads (default $PIPKIE_THREADS or 1)"),
):
    """Stage 2b: refit the copy head on frozen features of the training split (pipkie.train.headfit)."""
    from pipkie.train.headfit import refit_head as run

    n = _threads(threads)
    typer.echo(f"threads: {n}")
    typer.echo(json.dumps(run(model=model, output=output, dataset=dataset, data_dir=data_dir, split=split,
                              epochs=epochs, lr=lr, holdout=holdout, seed=seed, threads=n, limit=limit), indent=2))


@app.command()
def evaluate(
    dataset: str = typer.Option("sroie", help="sroie | wildreceipt | kleister_nda | funsd | cord | poie | donut"),
    data_dir: str = typer.Option(..., help="the dataset's directory"),
    split: str = typer.Option("test"),
    decode: str = typer.Option("pip", help="pip | ar-free | ar-forced (ar = ar-free)"),
    model: Optional[str] = typer.Option(None, help="model directory (default: the shipped model)"),
    keys: Optional[str] = typer.Option(None, help="comma-separated keys, lists as items[name,quantity,price] "
                                       "(default: the model's)"),
    schema: Optional[Path] = typer.Option(None, help="a JSON-schema file (keys with descriptions/budgets, arrays of objects)"),
    key_map: Optional[str] = typer.Option(None, help="KEY=GOLD_KEY,...: score KEY against the dataset's GOLD_KEY (e.g. company=store_name)"),
    limit: Optional[int] = typer.Option(None, help="first N documents only"),
    batch_size: int = typer.Option(4, min=1),
    refine_steps: int = typer.Option(0, min=0, help="PIP Mask-Predict refinement passes"),
    ocr: Optional[str] = typer.Option(None, help="rapidocr | tesseract: OCR the documents' images instead of using the dataset's words"),
    ocr_cache: Optional[Path] = typer.Option(None, help="OCR words cache (default: ocr-cache/ beside --json); `pipkie ocr DATA_DIR --out DIR` writes one"),
    threads: Optional[int] = typer.Option(None),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here (+ .predictions.jsonl, resumed only under the same settings)"),
    fresh: bool = typer.Option(False, "--fresh", help="start over even if the predictions file matches these settings"),
    reliability: Optional[Path] = typer.Option(None, help="save a reliability diagram (PNG) of the confidences here"),
):
    """Decode a labelled split and print ANLS / exact-match F1 per key, calibration and truncation.

    An existing predictions file is resumed only when it was made under the same settings (model
    weights, keys, decoder, refinement, OCR, data, limit, key map); otherwise the run starts over
    and says why (the old file is kept as .predictions.previous.jsonl).
    """
    from pipkie.evaluate import evaluate as run, format_table
    from pipkie.modeling import default_model_path
    from pipkie.ocr import OCREngineError

    n = _threads(threads)
    ks = _key_schema(keys, schema)
    _quiet_transformers()
    try:
        result = run(dataset=dataset, data_dir=data_dir, split=split, decode=decode, model_path=model or default_model_path(),
                     keys=ks, key_map=key_map, limit=limit, batch_size=batch_size, threads=n, refine_steps=refine_steps,
                     ocr=ocr, ocr_cache=str(ocr_cache) if ocr_cache else None, json_path=str(json_path) if json_path else None,
                     fresh=fresh, reliability=str(reliability) if reliability else None, log=lambda m: typer.echo(m, err=True))
    except (ValueError, FileNotFoundError, OCREngineError) as e:
        _err(str(e).replace("\n", " "))
        raise typer.Exit(2)
    typer.echo(format_table(result))


@app.command()
def bench(
    dataset: str = typer.Option("sroie"),
    data_dir: Optional[str] = typer.Option(None, help="the dataset's directory (not needed for --lines alone)"),
    split: str = typer.Option("test"),
    model: Optional[str] = typer.Option(None, help="model directory (default: the shipped model)"),
    ar_model: Optional[str] = typer.Option(None, help="AR model for the AR methods (default: the model's ar_baseline)"),
    lines: Optional[str] = typer.Option(None, help="numbers of item lines, e.g. 1,5,10,20,40: PIP vs AR on synthetic "
                                        "receipts with items[name,quantity,price] (pipkie.bench_items)"),
    lines_items: Optional[int] = typer.Option(None, min=1, help="--lines: the list's maxItems (default: the most lines)"),
    batch: str = typer.Option("1,8", help="batch sizes, comma-separated"),
    limit: int = typer.Option(32, help="documents timed per batch size"),
    threads: Optional[int] = typer.Option(None, help="torch threads (default $PIPKIE_THREADS or 1)"),
    repeats: int = typer.Option(1, min=1, help="time each batch this many times per method, keep the fastest"),
    methods: str = typer.Option(",".join(("pip", "pip-refine1", "pip-refine2", "ar-forced", "ar-free"))),
    sweeps: bool = typer.Option(True, help="speed-up sweeps over number of keys and value length"),
    json_path: Optional[Path] = typer.Option(None, "--json"),
    plot: Optional[Path] = typer.Option(None, help="directory for PNG plots and a markdown table"),
):
    """Time PIP against AR (free and forced) side by side, with the single-prefill floor.

    The AR methods run the PIP model's AR baseline (its pipkie.json's ar_baseline) or --ar-model."""
    from pipkie.bench import METHODS, bench as run, markdown_table
    from pipkie.modeling import default_model_path, model_for_decode

    n = _threads(threads)
    wanted = tuple(m.strip() for m in methods.split(",") if m.strip())
    if not wanted or set(wanted) - set(METHODS):
        raise typer.BadParameter(f"methods must be among {', '.join(METHODS)}", param_hint="--methods")
    counts = _int_list(lines, "--lines") if lines else None
    batches = _int_list(batch, "--batch")
    if data_dir is None and not counts:
        raise typer.BadParameter("give the dataset's directory (or --lines for the line-item sweep alone)",
                                 param_hint="--data-dir")
    try:
        model = model or default_model_path()
        if not Path(model).is_dir():
            raise FileNotFoundError(f"model not found: {model} is not a directory")
        if counts or sweeps or any(m.startswith("ar") for m in wanted):
            ar_model = ar_model or model_for_decode(model, "ar-forced")
            if not Path(ar_model).is_dir():
                raise FileNotFoundError(f"AR model not found: {ar_model} is not a directory")
    except (FileNotFoundError, ValueError) as e:
        _err(str(e))
        raise typer.Exit(2)
    typer.echo(f"threads: torch={n} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    if counts:
        from pipkie.bench_items import lines_bench, lines_table

        try:
            swept = lines_bench(model_path=model, ar_model_path=ar_model, lines=counts, batch_sizes=batches,
                                items_budget=lines_items, threads=n, repeats=repeats,
                                json_path=str(json_path.with_suffix(".lines.json")) if json_path else None,
                                plot_dir=str(plot) if plot else None, log=typer.echo)
        except ValueError as e:
            _err(str(e))
            raise typer.Exit(2)
        typer.echo(lines_table(swept))
        if data_dir is None:
            return
    result = run(model_path=model, ar_model_path=ar_model, dataset=dataset, data_dir=data_dir, split=split,
                 batch_sizes=batches, limit=limit, threads=n,
                 repeats=repeats, methods=wanted, sweeps=sweeps, json_path=str(json_path) if json_path else None,
                 plot_dir=str(plot) if plot else None, log=typer.echo)
    typer.echo(markdown_table(result))


def _int_list(text: str, option: str) -> list[int]:
    """ "1,5,10" -> [1, 5, 10]; anything else (or a number below 1) is a usage error."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise typer.BadParameter(f"expected positive integers separated by commas, got {text!r}", param_hint=option)
    return out


# ---- extraction for users: extract, explain, serve ------------------------------------------------
def _quiet_transformers() -> None:
    """No weight-loading progress bars or info logs on stderr (it carries our progress and errors)."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - only cosmetic
        pass


def _err(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)


def _load_extractor(model: Optional[str], threads: int, ocr: str):
    from pipkie.extract import Extractor
    from pipkie.modeling import default_model_path

    _quiet_transformers()
    try:
        path = model or default_model_path()  # --model, else $PIPKIE_MODEL, else models/pipkie
        if path != "smollm2" and not Path(path).exists():  # never wait on a hub look-up for a typo
            raise FileNotFoundError(f"model not found: {path} (give a pipkie model directory with --model or $PIPKIE_MODEL)")
        return Extractor.from_pretrained(path, threads=threads, ocr=ocr)
    except FileNotFoundError as e:
        _err(str(e))
    except (OSError, ValueError, RuntimeError) as e:
        _err(f"cannot load the model {model or ''}: {e}".replace("  ", " ").replace("\n", " "))
    raise typer.Exit(2)


def _key_schema(keys: Optional[str], schema: Optional[Path]):
    from pipkie.schema import KeySchema, SchemaError

    if keys and schema:
        raise typer.BadParameter("give --keys or --schema, not both")
    try:
        if schema:
            if not schema.is_file():
                raise typer.BadParameter(f"{schema}: no such file", param_hint="--schema")
            return KeySchema.parse(schema)
        return KeySchema.parse(keys) if keys else None
    except SchemaError as e:
        raise typer.BadParameter(str(e), param_hint="--schema" if schema else "--keys") from None


def _draw_paths(draw: Path, files: list[Path]) -> list[Path]:
    """OUT.png for one file; OUT.<file stem>.png for several (OUT.<i>.<stem>.png if stems repeat)."""
    if len(files) == 1:
        return [draw]
    stems = [f.stem for f in files]
    return [draw.with_name(f"{draw.stem}.{i}.{s}{draw.suffix}" if stems.count(s) > 1 else f"{draw.stem}.{s}{draw.suffix}")
            for i, s in enumerate(stems)]


def _draw_extraction(result, doc, source: Path, out: Path) -> Path:
    """The fields' boxes on the page; each item of a list is one entry ("items 3": its values), so
    that every item gets its own colour."""
    from collections import Counter

    from pipkie.document import Word
    from pipkie.explain import page_image
    from pipkie.grounding import draw

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
def extract(
    files: list[Path] = typer.Argument(..., help="documents (images, PDFs, JSON words, SROIE box files, text), "
                                       "folders (searched recursively) or glob patterns"),
    keys: Optional[str] = typer.Option(None, help="comma-separated keys, e.g. company,date,address,total; a list of "
                                       "items as items[name,quantity,price] (default: the model's keys)"),
    schema: Optional[Path] = typer.Option(None, help="a JSON-schema file (instead of --keys): string properties, "
                                          "arrays of objects for lists (maxItems)"),
    model: Optional[str] = typer.Option(None, help="model directory (default: $PIPKIE_MODEL, else the shipped models/pipkie)"),
    decode: str = typer.Option("pip", help="pip | ar | ar-forced (AR: the model's AR baseline, or --ar-model)"),
    ar_model: Optional[str] = typer.Option(None, help="AR model for --decode ar|ar-forced (default: the model's ar_baseline)"),
    refine_steps: int = typer.Option(0, help="PIP Mask-Predict refinement passes"),
    pretty: bool = typer.Option(False, "--json", help="pretty-print each result as indented JSON (default: one compact JSON object per line, i.e. JSON lines)"),
    draw: Optional[Path] = typer.Option(None, help="draw the boxes and values on the page image and save it here (several files: OUT.<file stem>.png)"),
    threads: Optional[int] = typer.Option(None, help="torch/OCR threads (default $PIPKIE_THREADS or 1)"),
    ocr: str = typer.Option("rapidocr", help="OCR engine for images and scanned PDFs: rapidocr | tesseract"),
    batch_size: int = typer.Option(8, min=1, help="documents decoded together (one forward pass for PIP)"),
    max_pages: int = typer.Option(20, min=1, help="refuse documents with more pages"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar on stderr (on a terminal, for 2+ files)"),
    out: Optional[Path] = typer.Option(None, help="append one JSON line per file here (results and error rows) "
                                       "instead of stdout; files already in it are skipped (resume)"),
    workers: int = typer.Option(0, min=0, help="OCR/loading processes running ahead of the model (0: load in this "
                                "process, one window at a time); with --ray: model actors (0: 1)"),
    ray: Optional[str] = typer.Option(None, metavar="ADDRESS", help="run on Ray (pipkie[ray]; needs --out): local "
                                      "(a Ray instance started here), auto (the running cluster) or HOST:PORT"),
):
    """Extract key fields from documents: one JSON object per file on stdout (JSON lines), or with
    --out appended to a file as {"file": ..., ...} rows, resumably (pipkie.pipeline; docs/SCALE.md).

    Each object is Extraction.to_dict(), the same JSON as the service's POST /extract.

    Per field: value, confidence, boxes (page, x0 y0 x1 y1 relative to the page, text), grounding,
    truncated (the value filled its budget). Per file: truncated and dropped_tokens (a document
    longer than the context keeps its start and its end).

    A file that cannot be read gives a one-line error on stderr (and an error row in --out); the
    others are still processed, exit code 1.
    """
    from pipkie.extract import DECODES
    from pipkie.pipeline import expand_inputs, extract_files

    if decode not in DECODES:
        raise typer.BadParameter(f"must be one of {', '.join(DECODES)}", param_hint="--decode")
    ks = _key_schema(keys, schema)
    n = _threads(threads)
    ex = _load_extractor(model, n, ocr)
    if ks is None and not ex.settings.keys:
        raise typer.BadParameter("this model has no default keys: give --keys or --schema")
    if ar_model and not Path(ar_model).is_dir():
        _err(f"AR model not found: {ar_model} is not a directory")
        raise typer.Exit(2)
    ex.ar_model = ar_model
    try:
        ex.decoder(decode)  # AR: load the AR baseline now; a PIP model without one is refused here
    except (OSError, ValueError) as e:
        _err(str(e).replace("\n", " "))
        raise typer.Exit(2)
    files = expand_inputs(files)
    outs = _draw_paths(draw, files) if draw else [None] * len(files)
    failures = 0
    common = dict(schema=ks, decode=decode, refine_steps=refine_steps, batch_size=batch_size, max_pages=max_pages,
                  progress=progress and len(files) > 1, log=lambda m: typer.echo(m, err=True))
    if ray:
        if out is None or draw:
            raise typer.BadParameter("--ray writes its rows to --out (and cannot --draw)", param_hint="--ray")
        from pipkie.distributed import extract_files_ray

        outcomes = extract_files_ray(ex.name, files, out, ocr=ocr, ocr_threads=n, model_threads=n, actors=workers or 1,
                                     ar_model=ar_model, address=None if ray == "local" else ray, **common)
    else:
        outcomes = extract_files(ex, files, workers=workers, out=out, **common)
    for o in outcomes:
        if o.error is not None:
            failures += 1
            _err(o.error)
            continue
        result, path = o.result, o.file
        if out is None:
            typer.echo(result.to_json(indent=2) if pretty else result.to_json())
            if result.truncated:
                typer.echo(f"note: {path}: {result.dropped_tokens} document tokens dropped from the middle to fit "
                           "the model's context (its start and end are kept)", err=True)
            cut = result.cut_fields()
            if cut:
                typer.echo(f"note: {path}: {', '.join(cut)} filled the whole budget (value may be cut)", err=True)
            for name in result.lists_truncated:
                typer.echo(f"note: {path}: {name} filled all its items (there may be more: give a larger maxItems "
                           "in a --schema file)", err=True)
        if outs[o.index] is not None:
            try:
                _draw_extraction(result, o.document, path, outs[o.index])
            except Exception as e:
                failures += 1
                _err(f"{path}: cannot draw {outs[o.index]} ({type(e).__name__}: {e})")
    if failures:
        typer.echo(f"{failures} of {len(files)} file(s) failed", err=True)
        raise typer.Exit(1)


@app.command()
def ocr(
    src: Path = typer.Argument(..., help="a folder of images/PDFs (searched recursively) or one file"),
    out: Path = typer.Option(..., help="folder for the JSON-words files ({relative path}.json)"),
    engine: str = typer.Option("rapidocr", help="rapidocr | tesseract"),
    threads: Optional[int] = typer.Option(None, help="OCR threads per process (default $PIPKIE_THREADS or 1)"),
    limit: Optional[int] = typer.Option(None, help="at most this many files"),
    shard: str = typer.Option("0/1", help="I/N: every N-th file from the I-th (run N processes to use N cores)"),
):
    """OCR a folder into pipkie's JSON-words format, resumably (files already done are skipped).

    The outputs load with `pipkie extract OUT/x.json` and as the dataset `words` (`pipkie.data.words`).
    """
    from pipkie.ocr_folder import ocr_folder

    try:
        i, n = (int(v) for v in shard.split("/"))
        stats = ocr_folder(src, out, engine=engine, threads=_threads(threads), limit=limit, shard=(i, n))
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--shard") from None
    except FileNotFoundError as e:
        raise typer.BadParameter(str(e), param_hint="SRC") from None
    typer.echo(json.dumps(stats))
    if stats["failed"]:
        typer.echo(f"{stats['failed']} file(s) failed: see {out / 'errors.jsonl'}", err=True)


@app.command()
def explain(
    file: Path = typer.Argument(..., help="the document (image, PDF, JSON words, box file or text)"),
    key: str = typer.Option(..., help="the field to explain, e.g. total"),
    keys: Optional[str] = typer.Option(None, help="the keys it is decoded among (default: the model's keys)"),
    model: Optional[str] = typer.Option(None, help="model directory (default: $PIPKIE_MODEL, else the shipped model)"),
    out: Optional[Path] = typer.Option(None, help="heat map PNG (default: <file stem>.<key>.heat.png)"),
    page: Optional[int] = typer.Option(None, help="page to draw, from 0 (default: the one with most attention)"),
    top: int = typer.Option(10, help="words listed"),
    pretty: bool = typer.Option(False, "--json", help="print the top words as JSON"),
    threads: Optional[int] = typer.Option(None),
    ocr: str = typer.Option("rapidocr", help="rapidocr | tesseract"),
):
    """What chose a field's value: the copy head's start distribution over the document's words and
    the attention of the field's slots (layers, heads, slots averaged), listed and drawn as heat maps
    side by side. The value and confidence are exactly `pipkie extract`'s (the same decoding)."""
    from pipkie.explain import draw_heatmap, explain as run
    from pipkie.loaders import DocumentError
    from pipkie.ocr import OCREngineError

    n = _threads(threads)
    ks = _key_schema(keys, None)
    ex = _load_extractor(model, n, ocr)
    try:
        doc = ex.load(file)
        e = run(ex, doc, key, keys=ks)
    except (DocumentError, OCREngineError, ValueError) as err:
        _err(str(err))
        raise typer.Exit(1)
    out = out or Path(f"{file.stem}.{key}.heat.png")
    draw_heatmap(e, file, out, doc=doc, page=page)
    if pretty:
        typer.echo(json.dumps({**e.to_dict(top=top), "heatmap": str(out)}, ensure_ascii=False, indent=2))
        return
    typer.echo(f"{key} = {e.value!r} (confidence {e.confidence:.2f})"
               + (" (filled its whole budget)" if e.value_truncated else "")
               + (f"; {e.truncated} document tokens dropped from the middle" if e.truncated else ""))
    if e.copy_head:
        typer.echo("copy head, where the value starts (probability per word):")
        for w, x in e.top_starts(top):
            typer.echo(f"  {x:6.3f}  p{w.page} {w.text}")
    typer.echo(f"attention of its {e.slots} slots ({e.document_share:.0%} on the document), per word:")
    for w, x in e.top(top):
        typer.echo(f"  {x:6.3f}  p{w.page} {w.text}")
    typer.echo(f"heat map: {out}")


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    model: Optional[str] = typer.Option(None, help="model directory (default: $PIPKIE_MODEL, else the shipped model)"),
    threads: Optional[int] = typer.Option(None, help="torch/OCR threads (default $PIPKIE_THREADS or 1)"),
    ocr: Optional[str] = typer.Option(None, help="rapidocr | tesseract (default rapidocr)"),
    max_batch: Optional[int] = typer.Option(None, min=1, help="most requests decoded together (8)"),
    max_wait_ms: Optional[float] = typer.Option(None, min=0, help="how long the first queued request waits for others (10)"),
    max_upload_mb: Optional[float] = typer.Option(None, min=0.001, help="largest body/upload in MB (10; 413)"),
    max_pages: Optional[int] = typer.Option(None, min=1, help="most PDF pages / TIFF frames (10; 413)"),
    max_pixels: Optional[int] = typer.Option(None, min=1, help="most pixels of a page image (40,000,000; 413)"),
    max_words: Optional[int] = typer.Option(None, min=1, help="most words of a document (10,000; 413)"),
    max_keys: Optional[int] = typer.Option(None, min=1, help="most keys per request (32; 422)"),
    max_queue: Optional[int] = typer.Option(None, min=1, help="most requests in progress (32; 503 beyond)"),
    timeout: Optional[float] = typer.Option(None, min=0.1, help="request deadline in seconds (15): 503 at once "
                                            "when it cannot be met, 504 after it; X-Request-Timeout overrides"),
    load_workers: Optional[int] = typer.Option(None, min=1, help="threads loading/OCR-ing documents (2)"),
):
    """Serve POST /extract (upload or JSON words/text), POST /render, GET /health and GET /metrics;
    a page for people at /, API docs at /docs (docs/WEB.md).

    Every option can also be set as PIPKIE_<OPTION> in the environment (PIPKIE_MAX_WORDS=20000;
    --timeout is PIPKIE_REQUEST_TIMEOUT_S); options win. SIGTERM drains: new requests get 503,
    admitted ones finish."""
    from pipkie.serve import ServeSettings, run

    try:
        settings = ServeSettings.from_env(
            model=model, threads=threads, ocr=ocr, max_batch=max_batch, max_wait_ms=max_wait_ms,
            max_upload_mb=max_upload_mb, max_pages=max_pages, max_pixels=max_pixels, max_words=max_words,
            max_keys=max_keys, max_queue=max_queue, request_timeout_s=timeout, load_workers=load_workers)
    except ValueError as e:
        _err(str(e))
        raise typer.Exit(2)
    n = _threads(settings.threads)
    ex = _load_extractor(settings.model, n, settings.ocr)
    typer.echo(f"pipkie: serving {ex.name}: open http://{host}:{port}/ in a browser (API docs: /docs)", err=True)
    run(host, port, extractor=ex, settings=settings.model_copy(update={"threads": n}))


@app.command()
def compare(
    a: Path = typer.Argument(..., help="predictions file of system A (pipkie evaluate's .predictions.jsonl)"),
    b: Path = typer.Argument(..., help="predictions file of system B, on the same documents"),
    metric: str = typer.Option("anls", help="anls | exact (micro exact-match F1)"),
    samples: int = typer.Option(10000, min=1, help="bootstrap resamples"),
    seed: int = typer.Option(0),
    level: float = typer.Option(0.95, min=0.5, max=0.999, help="interval coverage"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
):
    """Paired bootstrap over documents: A − B with its 95% interval, overall and per key."""
    from pipkie.compare import compare_files, format_comparison

    for p in (a, b):
        if not p.is_file():
            raise typer.BadParameter(f"{p}: no such file")
    try:
        result = compare_files(a, b, metric=metric, samples=samples, seed=seed, level=level)
    except ValueError as e:
        _err(str(e))
        raise typer.Exit(2)
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    typer.echo(format_comparison(result))


def main():
    app()


if __name__ == "__main__":
    main()
