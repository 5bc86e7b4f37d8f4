"""One entry point: `pipkie pretrain | finetune | evaluate | bench | extract | explain | serve`."""

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
    objective: str = typer.Option("pip", help="pip (parallel) or ar (the autoregressive baseline)"),
    config: Optional[Path] = _train_opts["config"], base: Optional[str] = _train_opts["base"],
    output_dir: Optional[str] = _train_opts["output_dir"], dataset: Optional[str] = _train_opts["dataset"],
    data_dir: Optional[str] = _train_opts["data_dir"], steps: Optional[int] = _train_opts["steps"],
    batch_size: Optional[int] = _train_opts["batch_size"], lr: Optional[float] = _train_opts["lr"],
    lora_r: Optional[int] = _train_opts["lora_r"], synthetic: Optional[int] = _train_opts["synthetic"],
    threads: Optional[int] = _train_opts["threads"], seed: Optional[int] = _train_opts["seed"],
):
    """Stage 2: KV-supervised fine-tuning (resumes from OUTPUT_DIR/checkpoint if present)."""
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


@app.command()
def evaluate(
    dataset: str = typer.Option("sroie", help="sroie | wildreceipt | kleister_nda | funsd | cord | poie | donut"),
    data_dir: str = typer.Option(..., help="the dataset's directory"),
    split: str = typer.Option("test"),
    decode: str = typer.Option("pip", help="pip | ar | ar-forced"),
    model: Optional[str] = typer.Option(None, help="model directory (default: the shipped model)"),
    keys: Optional[str] = typer.Option(None, help="comma-separated keys (default: the model's)"),
    limit: Optional[int] = typer.Option(None, help="first N documents only"),
    batch_size: int = typer.Option(4),
    refine_steps: int = typer.Option(0, help="PIP Mask-Predict refinement passes"),
    threads: Optional[int] = typer.Option(None),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here (+ .predictions.jsonl)"),
):
    """Decode a labelled split and print ANLS / exact-match F1 per key."""
    from pipkie.evaluate import evaluate as run, format_table
    from pipkie.modeling import default_model_path

    n = _threads(threads)
    result = run(dataset=dataset, data_dir=data_dir, split=split, decode=decode, model_path=model or default_model_path(),
                 keys=keys.split(",") if keys else None, limit=limit, batch_size=batch_size, threads=n,
                 refine_steps=refine_steps, json_path=str(json_path) if json_path else None)
    typer.echo(format_table(result))


def main():
    app()


if __name__ == "__main__":
    main()
