"""Measuring from the command line: `pipkie evaluate`, `pipkie calibrate`, `pipkie bench`, `pipkie compare`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from pipkie.cli.common import (
    COMPUTE_HELP,
    app,
    check_compute,
    decoder_help,
    error,
    int_list,
    key_schema,
    quiet_transformers,
    set_threads,
)


@app.command()
def evaluate(
    dataset: str = typer.Option("sroie", help="sroie | wildreceipt | kleister_nda | funsd | cord | poie | donut"),
    data_dir: str = typer.Option(..., help="the dataset's directory"),
    split: str = typer.Option("test"),
    decode: str = typer.Option("pip", help=decoder_help("AR decoders run the model's AR baseline")),
    model: str | None = typer.Option(None, help="model directory (default: the shipped model)"),
    keys: str | None = typer.Option(
        None,
        help="comma-separated keys, typed as date:date (date, time, money, phone), "
        "lists as items[name,quantity,price] (price!: a field every item must have) (default: the model's)",
    ),
    schema: Path | None = typer.Option(
        None, help="a JSON-schema file (keys with descriptions/budgets, arrays of objects)"
    ),
    key_map: str | None = typer.Option(
        None, help="KEY=GOLD_KEY,...: score KEY against the dataset's GOLD_KEY (e.g. company=store_name)"
    ),
    limit: int | None = typer.Option(None, help="first N documents only"),
    batch_size: int = typer.Option(4, min=1),
    refine_steps: int = typer.Option(0, min=0, help="PIP Mask-Predict refinement passes"),
    ocr: str | None = typer.Option(
        None, help="rapidocr | tesseract: OCR the documents' images instead of using the dataset's words"
    ),
    ocr_cache: Path | None = typer.Option(
        None, help="OCR words cache (default: ocr-cache/ beside --json); `pipkie ocr DATA_DIR --out DIR` writes one"
    ),
    threads: int | None = typer.Option(None),
    compute: str | None = typer.Option(None, help=COMPUTE_HELP),
    json_path: Path | None = typer.Option(
        None, "--json", help="write the result here (+ .predictions.jsonl, resumed only under the same settings)"
    ),
    fresh: bool = typer.Option(False, "--fresh", help="start over even if the predictions file matches these settings"),
    reliability: Path | None = typer.Option(None, help="save a reliability diagram (PNG) of the confidences here"),
):
    """Decode a labelled split and print ANLS / exact-match F1 per key, calibration and truncation.

    An existing predictions file is resumed only when it was made under the same settings (model
    weights, keys, decoder, refinement, OCR, data, limit, key map); otherwise the run starts over
    and says why (the old file is kept as .predictions.previous.jsonl).
    """
    from pipkie.eval.evaluate import evaluate as run
    from pipkie.eval.evaluate import format_table
    from pipkie.io.ocr import OCREngineError
    from pipkie.model.modeling import default_model_path

    n = set_threads(threads)
    compute = check_compute(compute)
    ks = key_schema(keys, schema)
    quiet_transformers()
    try:
        result = run(
            dataset=dataset,
            data_dir=data_dir,
            split=split,
            decode=decode,
            model_path=model or default_model_path(),
            keys=ks,
            key_map=key_map,
            limit=limit,
            batch_size=batch_size,
            threads=n,
            refine_steps=refine_steps,
            ocr=ocr,
            ocr_cache=str(ocr_cache) if ocr_cache else None,
            json_path=str(json_path) if json_path else None,
            fresh=fresh,
            reliability=str(reliability) if reliability else None,
            compute=compute,
            log=lambda m: typer.echo(m, err=True),
        )
    except (ValueError, FileNotFoundError, OCREngineError) as e:
        error(str(e).replace("\n", " "))
        raise typer.Exit(2) from None
    typer.echo(format_table(result))


@app.command()
def calibrate(
    predictions: list[Path] = typer.Argument(
        ..., help="predictions files to fit the map on (pipkie evaluate's .predictions.jsonl, the model's own)"
    ),
    model: str | None = typer.Option(None, help="model directory the map is for (default: the shipped model)"),
    keys: str | None = typer.Option(None, help="comma-separated keys to use (default: each file's gold keys)"),
    score: list[Path] = typer.Option(
        [], "--score", help="a predictions file scored with the map but not fitted on (repeatable)"
    ),
    cross_fit: int = typer.Option(
        0, "--cross-fit", min=0, help="K >= 2: also judge the map on held-out documents, fitting on K-1 folds of K"
    ),
    seed: int = typer.Option(0, help="--cross-fit: the documents' shuffle"),
    write: bool = typer.Option(
        False, "--write", help="save the map (fitted on all the files) in the model's pipkie.json"
    ),
    json_path: Path | None = typer.Option(None, "--json", help="write the result here"),
):
    """Fit a map from raw to calibrated confidences on labelled predictions, print ECE, the share of
    values with confidence >= 0.9 and their exactness before and after, and with --write save it
    with the model (pipkie extract, the service and explain then report calibrated confidences).

    The files' rows keep raw confidences (pipkie evaluate stores them so), so a map can be refitted
    at any time; fit it on the model's own predictions, on documents like those it will read."""
    from pipkie.eval.calibration import calibrate_files, format_calibration

    if cross_fit == 1:
        raise typer.BadParameter("cross-fitting needs at least 2 folds", param_hint="--cross-fit")
    model = _model_for_map(model, [*predictions, *score])
    ks = [k.strip() for k in keys.split(",") if k.strip()] if keys else None
    try:
        result = calibrate_files(predictions, keys=ks, score=score, folds=cross_fit, seed=seed)
    except ValueError as e:
        error(str(e))
        raise typer.Exit(2) from None
    _finish_map(result, model, predictions, "confidence_calibration", write, json_path, format_calibration)


def _model_for_map(model: str | None, files: list[Path]) -> str:
    """The model directory a fitted map is for (default: the shipped model), after checking that
    it is one and that every predictions file exists (exit 2 otherwise)."""
    from pipkie.model.modeling import SETTINGS_FILE, default_model_path

    for p in files:
        if not p.is_file():
            raise typer.BadParameter(f"{p}: no such file")
    model = model or str(default_model_path())
    if not Path(model, SETTINGS_FILE).is_file():
        error(f"{model} is not a pipkie model directory (no {SETTINGS_FILE})")
        raise typer.Exit(2)
    return model


def _finish_map(result: dict, model: str, predictions: list[Path], setting: str, write: bool, json_path, fmt) -> None:
    """What calibrate and abstain do with a fitted map: warn about another model's predictions,
    save the map as the model's `setting` with --write, write --json, print `fmt(result)`."""
    from pipkie.model.modeling import write_setting

    _warn_other_model(model, predictions)
    result["model"] = str(model)
    if write:
        result["written"] = str(write_setting(model, setting, result["map"]))
    if json_path:
        json_path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    typer.echo(fmt(result))
    if write:
        typer.echo(f"wrote {setting} into {result['written']}")


def _warn_other_model(model: str, predictions: list[Path]) -> None:
    """Warn about predictions made by another model (the summary beside a predictions file names it)."""
    from pipkie.eval.store import model_fingerprint

    mine = model_fingerprint(model)
    for p in predictions:
        summary = Path(str(p).removesuffix(".predictions.jsonl") + ".json")
        made_by = json.loads(summary.read_text()).get("fingerprint", {}).get("model") if summary.is_file() else None
        if made_by and made_by != mine:
            typer.echo(f"warning: {p} was made by another model ({made_by}) than {model} ({mine})", err=True)


@app.command()
def abstain(
    predictions: list[Path] = typer.Argument(
        ..., help="predictions files to fit the thresholds on (pipkie evaluate's .predictions.jsonl, the model's own)"
    ),
    model: str | None = typer.Option(None, help="model directory the thresholds are for (default: the shipped model)"),
    keys: str | None = typer.Option(None, help="comma-separated keys to fit (default: each file's flat gold keys)"),
    folds: int = typer.Option(5, min=2, help="cross-fitting: thresholds fitted on K-1 folds, scored on the K-th"),
    seed: int = typer.Option(0, help="the documents' shuffle into folds"),
    write: bool = typer.Option(
        False, "--write", help="save the thresholds (fitted on all the files) in the model's pipkie.json"
    ),
    json_path: Path | None = typer.Option(None, "--json", help="write the result here"),
):
    """Fit per key the confidence below which a value is answered `unknown` (the ANLS-maximising
    one), print the gain on the files and cross-fitted with its paired 95% interval, and with
    --write save the thresholds with the model (pipkie extract, the service and the API then apply
    them; evaluate reports their effect beside the raw scores). Write them only when the
    cross-fitted gain says they help on documents they were not fitted on."""
    from pipkie.eval.abstention import abstain_files, format_abstention

    model = _model_for_map(model, predictions)
    ks = [k.strip() for k in keys.split(",") if k.strip()] if keys else None
    try:
        result = abstain_files(predictions, ks, folds=folds, seed=seed)
    except ValueError as e:
        error(str(e))
        raise typer.Exit(2) from None
    _finish_map(result, model, predictions, "abstention", write, json_path, format_abstention)


@app.command()
def bench(
    dataset: str = typer.Option("sroie"),
    data_dir: str | None = typer.Option(None, help="the dataset's directory (not needed for --lines alone)"),
    split: str = typer.Option("test"),
    model: str | None = typer.Option(None, help="model directory (default: the shipped model)"),
    ar_model: str | None = typer.Option(None, help="AR model for the AR methods (default: the model's ar_baseline)"),
    lines: str | None = typer.Option(
        None,
        help="numbers of item lines, e.g. 1,5,10,20,40: PIP vs AR on synthetic "
        "receipts with items[name,quantity,price] (pipkie.eval.bench_items)",
    ),
    lines_items: int | None = typer.Option(None, min=1, help="--lines: the list's maxItems (default: the most lines)"),
    lines_seed: int = typer.Option(0, help="--lines: which draw of synthetic receipts (another seed, other receipts)"),
    batch: str = typer.Option("1,8", help="batch sizes, comma-separated"),
    limit: int = typer.Option(32, help="documents timed per batch size"),
    threads: int | None = typer.Option(None, help="torch threads (default $PIPKIE_THREADS or 1)"),
    compute: str | None = typer.Option(None, help=COMPUTE_HELP),
    ar_compute: str | None = typer.Option(
        None, help="the AR model's precision (default: --compute's); AR at batch 1 is no faster in bfloat16"
    ),
    repeats: int = typer.Option(1, min=1, help="time each batch this many times per method, keep the fastest"),
    methods: str | None = typer.Option(None, help="comma-separated (default: every decoder, and pip-refine1,2)"),
    sweeps: bool = typer.Option(True, help="speed-up sweeps over number of keys and value length"),
    json_path: Path | None = typer.Option(None, "--json"),
    plot: Path | None = typer.Option(None, help="directory for PNG plots and a markdown table"),
):
    """Time PIP against AR (free and forced) side by side, with the single-prefill floor.

    The AR methods run the PIP model's AR baseline (its pipkie.json's ar_baseline) or --ar-model."""
    from pipkie.eval.bench import all_methods, method_decoder
    from pipkie.eval.bench import bench as run
    from pipkie.eval.bench_report import markdown_table
    from pipkie.model.modeling import default_model_path, model_for_decode

    n = set_threads(threads)
    compute = check_compute(compute)
    ar_compute = check_compute(ar_compute or compute)
    known = all_methods()
    wanted = tuple(m.strip() for m in methods.split(",") if m.strip()) if methods is not None else known
    if not wanted or set(wanted) - set(known):
        raise typer.BadParameter(f"methods must be among {', '.join(known)}", param_hint="--methods")
    counts = int_list(lines, "--lines") if lines else None
    batches = int_list(batch, "--batch")
    if data_dir is None and not counts:
        raise typer.BadParameter(
            "give the dataset's directory (or --lines for the line-item sweep alone)", param_hint="--data-dir"
        )
    try:
        model = model or default_model_path()
        if not Path(model).is_dir():
            raise FileNotFoundError(f"model not found: {model} is not a directory")
        if counts or sweeps or any(method_decoder(m)[0].objective == "ar" for m in wanted):
            ar_model = ar_model or model_for_decode(model, "ar-forced")
            if not Path(ar_model).is_dir():
                raise FileNotFoundError(f"AR model not found: {ar_model} is not a directory")
    except (FileNotFoundError, ValueError) as e:
        error(str(e))
        raise typer.Exit(2) from None
    omp = os.environ.get("OMP_NUM_THREADS")
    typer.echo(f"threads: torch={n} OMP_NUM_THREADS={omp} compute: PIP {compute}, AR {ar_compute}")
    if counts:
        from pipkie.eval.bench_items import lines_bench, lines_table

        try:
            swept = lines_bench(
                model_path=model,
                ar_model_path=ar_model,
                lines=counts,
                batch_sizes=batches,
                items_budget=lines_items,
                seed=lines_seed,
                threads=n,
                repeats=repeats,
                json_path=str(json_path.with_suffix(".lines.json")) if json_path else None,
                plot_dir=str(plot) if plot else None,
                compute=compute,
                ar_compute=ar_compute,
                log=typer.echo,
            )
        except ValueError as e:
            error(str(e))
            raise typer.Exit(2) from None
        typer.echo(lines_table(swept))
        if data_dir is None:
            return
    result = run(
        model_path=model,
        ar_model_path=ar_model,
        dataset=dataset,
        data_dir=data_dir,
        split=split,
        batch_sizes=batches,
        limit=limit,
        threads=n,
        repeats=repeats,
        methods=wanted,
        sweeps=sweeps,
        json_path=str(json_path) if json_path else None,
        plot_dir=str(plot) if plot else None,
        compute=compute,
        ar_compute=ar_compute,
        log=typer.echo,
    )
    typer.echo(markdown_table(result))


@app.command()
def compare(
    a: Path = typer.Argument(..., help="predictions file of system A (pipkie evaluate's .predictions.jsonl)"),
    b: Path = typer.Argument(..., help="predictions file of system B, on the same documents"),
    metric: str = typer.Option(
        "anls",
        help="anls | anls-nospace (ANLS ignoring whitespace) | exact (micro exact-match F1) | items (item F1 per list)",
    ),
    samples: int = typer.Option(10000, min=1, help="bootstrap resamples"),
    seed: int = typer.Option(0),
    level: float = typer.Option(0.95, min=0.5, max=0.999, help="interval coverage"),
    json_path: Path | None = typer.Option(None, "--json", help="write the result here"),
):
    """Paired bootstrap over documents: A − B with its 95% interval, overall and per key."""
    from pipkie.eval.compare import compare_files, format_comparison

    for p in (a, b):
        if not p.is_file():
            raise typer.BadParameter(f"{p}: no such file")
    try:
        result = compare_files(a, b, metric=metric, samples=samples, seed=seed, level=level)
    except ValueError as e:
        error(str(e))
        raise typer.Exit(2) from None
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    typer.echo(format_comparison(result))
