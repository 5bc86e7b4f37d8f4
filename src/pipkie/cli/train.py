"""Training from the command line: `pipkie finetune`, `pretrain`, `refit-head`, `soup`, `label`.

The options of finetune and pretrain are built from `TrainConfig`'s fields (their help is the
field's), so a new field is a new option without touching this file. Fields that are not a plain
str/int/float/bool/list of str (mixtures, budgets, the compact architecture) are set in a
`--config` JSON file (configs/train/*.json); options given on the command line override it.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Optional

import typer

from pipkie.cli.common import app, parse_shard, set_threads
from pipkie.train.config import TrainConfig

_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list[str]": list[str]}
_CONFIG = inspect.Parameter(
    "config",
    inspect.Parameter.KEYWORD_ONLY,
    annotation=Optional[Path],
    default=typer.Option(None, help="JSON file of TrainConfig fields; options override it"),
)


def _default(f) -> object:
    return f.default_factory() if f.default is MISSING else f.default


def config_options(skip: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per TrainConfig field of a plain type, each a Typer option (default None:
    "not given", so that the config file's value stands)."""
    out = [_CONFIG]
    for f in fields(TrainConfig):
        kind = _TYPES.get(str(f.type))
        if kind is None or f.name in skip:
            continue
        help_ = f.metadata.get("help", "")
        out.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=Optional[kind],
                default=typer.Option(None, help=f"{help_} [default: {_default(f)!r}]"),
            )
        )
    return out


def train_config(config: Path | None, overrides: dict) -> TrainConfig:
    """The config file's fields (unknown ones are an error), then the options given."""
    base = {}
    if config:
        if not config.is_file():
            raise typer.BadParameter(f"{config}: no such file", param_hint="--config")
        base = json.loads(config.read_text())
    unknown = set(base) - {f.name for f in fields(TrainConfig)}
    if unknown:
        raise typer.BadParameter(f"unknown config fields: {sorted(unknown)}", param_hint="--config")
    base.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**base)


def _command(name: str, doc: str, run_name: str, fixed: dict | None = None):
    """Register `pipkie NAME` running pipkie.train.finetune.RUN_NAME on the config it builds."""
    fixed = fixed or {}

    def command(**options):
        from pipkie.train import finetune

        cfg = train_config(options.pop("config"), {**options, **fixed})
        typer.echo(f"threads: {set_threads(cfg.threads)}")
        typer.echo(json.dumps(getattr(finetune, run_name)(cfg), indent=2))

    command.__signature__ = inspect.Signature(config_options(skip=tuple(fixed)))
    command.__doc__ = doc
    command.__name__ = name
    app.command(name)(command)


_command(
    "finetune",
    """Stage 2: KV-supervised fine-tuning, PIP (--objective pip) or its AR baseline (--objective ar).

Resumes from OUTPUT_DIR/checkpoint if present. The shipped models: --config configs/train/generalist-pip.json
(and -ar.json).""",
    "finetune",
)
_command("pretrain", "Stage 1: mask pre-training on document text (resumable).", "pretrain", {"objective": "mask"})


@app.command("refit-head")
def refit_head(
    model: str = typer.Option(..., help="a fine-tuned model with a copy head"),
    output: str = typer.Option(..., help="where the model with the refitted head goes (may be --model)"),
    dataset: str = "sroie",
    data_dir: str = typer.Option(..., help="the dataset's directory"),
    split: str = "train",
    epochs: int = 20,
    lr: float = 1e-4,
    holdout: float = 0.1,
    seed: int = 0,
    limit: int | None = None,
    erase: float = typer.Option(0.0, help="share of documents with one field erased, answering unknown"),
    threads: int | None = typer.Option(None, help="torch threads (default $PIPKIE_THREADS or 1)"),
):
    """Stage 2b: refit the copy head on frozen features of the training split (pipkie.train.refit_head)."""
    from pipkie.train.refit_head import refit_head as run

    n = set_threads(threads)
    typer.echo(f"threads: {n}")
    typer.echo(
        json.dumps(
            run(
                model=model,
                output=output,
                dataset=dataset,
                data_dir=data_dir,
                split=split,
                epochs=epochs,
                lr=lr,
                erase=erase,
                holdout=holdout,
                seed=seed,
                threads=n,
                limit=limit,
            ),
            indent=2,
        )
    )


@app.command("soup")
def soup(
    models: list[Path] = typer.Argument(..., help="model directories fine-tuned from the same model (2 or more)"),
    out: Path = typer.Option(..., help="directory of the averaged model (not one of MODELS)"),
    weights: Optional[str] = typer.Option(None, help="comma-separated weight per model (default: equal)"),
):
    """Average the weights of models fine-tuned from one model (a model soup, pipkie.train.soup):
    one model's cost at inference, less of one run's seed-to-seed spread."""
    from pipkie.train.soup import soup as run

    try:
        w = [float(x) for x in weights.split(",")] if weights else None
        typer.echo(json.dumps(run(models, out, w), indent=2))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


@app.command("label")
def label(
    src: Path = typer.Argument(..., help="a folder of JSON-words documents (`pipkie ocr`'s output)"),
    out: Path = typer.Option(..., help="folder of the labelled documents (read back as the dataset `words`)"),
    keys: str = typer.Option(
        ...,
        help='keys to label, e.g. "company,date:date,total:money" or "total:money,items[name,price:money]"',
    ),
    min_confidence: float = typer.Option(0.9, help="keep a value when its (calibrated) confidence is at least this"),
    store_as: Optional[str] = typer.Option(None, help="key=field,...: store a key's values under another name"),
    sum_to: Optional[str] = typer.Option(
        None,
        help="asked keys whose amount a list's prices must add up to (e.g. subtotal,total) for it to be kept",
    ),
    model: Optional[str] = typer.Option(None, help="model directory (default: $PIPKIE_MODEL, else the shipped one)"),
    batch_size: int = typer.Option(4, min=1),
    limit: Optional[int] = typer.Option(None, help="at most this many documents of SRC"),
    shard: str = typer.Option("0/1", help="I/N: every N-th document from the I-th (run N processes to use N cores)"),
    threads: Optional[int] = typer.Option(None, help="torch threads (default $PIPKIE_THREADS or 1)"),
):
    """Pseudo-labels for self-training (pipkie.train.label): the model's confident answers on unlabelled
    documents become their fields, for a `words` source of a training mixture; a list's items are kept
    when a run of them adds up to an amount read with them (--sum-to). Resumable; a second call with
    other keys adds their fields to the same documents."""
    from pipkie.cli.common import error, key_schema, load_extractor
    from pipkie.data.errors import DataError
    from pipkie.eval.gold import parse_key_map
    from pipkie.train.label import label_folder

    schema = key_schema(keys, None)
    try:
        renames = parse_key_map(store_as, "--store-as", "KEY=FIELD")
    except ValueError as e:
        raise typer.BadParameter(
            f"expected key=field pairs separated by commas ({e})", param_hint="--store-as"
        ) from None
    part = parse_shard(shard)
    n = set_threads(threads)
    typer.echo(f"threads: {n}", err=True)
    ex = load_extractor(model, n, "rapidocr")
    try:
        stats = label_folder(
            ex,
            src,
            out,
            keys=schema,
            min_confidence=min_confidence,
            store_as=renames,
            sum_to=tuple(k.strip() for k in sum_to.split(",") if k.strip()) if sum_to else (),
            batch_size=batch_size,
            limit=limit,
            shard=part,
        )
    except DataError as e:
        error(str(e))
        raise typer.Exit(1) from None
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    typer.echo(json.dumps(stats))


@app.command("label-items")
def label_items(
    src: Path = typer.Argument(..., help="a folder of JSON-words documents (`pipkie ocr`'s output)"),
    out: Path = typer.Option(..., help="folder of the labelled documents (read back as the dataset `words`)"),
    limit: Optional[int] = typer.Option(None, help="at most this many documents of SRC"),
):
    """Line items by arithmetic alone, no model (pipkie.train.sum_items): a run of consecutive lines whose
    amounts add up to the cent to an amount printed below them becomes a document's items, for a
    `words` source of a training mixture. Rerun: documents are rewritten."""
    from pipkie.cli.common import error
    from pipkie.data.errors import DataError
    from pipkie.train.sum_items import label_items_folder

    try:
        stats = label_items_folder(src, out, limit=limit)
    except DataError as e:
        error(str(e))
        raise typer.Exit(1) from None
    typer.echo(json.dumps(stats))
