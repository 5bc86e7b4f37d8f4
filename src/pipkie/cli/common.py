"""What every command shares: the Typer app, threads, errors on stderr, loading the model and the keys."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import typer

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Key information extraction with parallel decoding (PIP)."
)


def short_helps(typer_app: typer.Typer) -> None:
    """Give every command without a short help its docstring's first sentence, joined on one line
    (Typer would list the whole first paragraph with the docstring's own line breaks)."""
    for cmd in typer_app.registered_commands:
        doc = inspect.getdoc(cmd.callback) if cmd.callback else None
        if cmd.short_help is None and doc:
            first = " ".join(doc.split("\n\n")[0].split())
            cmd.short_help = first.split(". ")[0].rstrip(".") + "."


def decoder_help(what: str = "") -> str:
    """--decode's help: the registered decoders (`pipkie.decoding.DECODERS`), without importing them."""
    from pipkie.decoding import DECODERS

    return " | ".join(DECODERS) + (f" ({what})" if what else "")


def set_threads(n: int | None) -> int:
    """Threads from the option, else from PIPKIE_THREADS, else 1 (safe on a busy 2-core machine)."""
    n = n or int(os.environ.get("PIPKIE_THREADS", "1"))
    import torch

    torch.set_num_threads(n)
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    return n


COMPUTE_HELP = (
    "the layers' precision: auto | float32 | bfloat16 (default $PIPKIE_COMPUTE, else auto: bfloat16 where "
    "the CPU runs it natively (AMX, AVX512-BF16), else float32; bfloat16 runs PIP's pass ~2x faster, "
    "AR decoding no faster; accuracy within noise, docs/RESULTS.md)"
)


def check_compute(value: str | None) -> str:
    """--compute resolved (`pipkie.model.precision.resolve_compute`), or a usage error."""
    from pipkie.model.precision import resolve_compute

    try:
        return resolve_compute(value)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--compute") from None


OCR_MIN_SCORE_HELP = "rapidocr: drop lines it scores under this, 0-1 (default 0.9; its own 0.5 lets logos in as text)"


def ocr_options(ocr: str, min_score: float | None, hint: str = "--ocr-min-score") -> dict | None:
    """OCR engine options from the command line (`pipkie.io.ocr.set_engine_options`), or a usage
    error (`pipkie.io.ocr.check_min_score`)."""
    from pipkie.io.ocr import check_min_score

    try:
        return None if check_min_score(ocr, min_score) is None else {"min_score": min_score}
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=hint) from None


def quiet_transformers() -> None:
    """No weight-loading progress bars or info logs on stderr (it carries our progress and errors)."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - only cosmetic
        pass


def error(msg: str) -> None:
    """One line on stderr, prefixed `error:`."""
    typer.echo(f"error: {msg}", err=True)


def load_extractor(model: str | None, threads: int, ocr: str, compute: str | None = None):
    from pipkie.extract import Extractor
    from pipkie.model.modeling import default_model_path

    quiet_transformers()
    try:
        path = model or default_model_path()  # --model, else $PIPKIE_MODEL, else models/pipkie
        if path != "smollm2" and not Path(path).exists():  # never wait on a hub look-up for a typo
            raise FileNotFoundError(
                f"model not found: {path} (give a pipkie model directory with --model or $PIPKIE_MODEL)"
            )
        return Extractor.from_pretrained(path, threads=threads, ocr=ocr, compute=compute)
    except FileNotFoundError as e:
        error(str(e))
    except (OSError, ValueError, RuntimeError) as e:
        error(f"cannot load the model {model or ''}: {e}".replace("  ", " ").replace("\n", " "))
    raise typer.Exit(2)


def key_schema(keys: str | None, schema: Path | None):
    """The --keys / --schema given (checked before a model is loaded), else None (the model's keys)."""
    from pipkie.schema import KeySchema, SchemaError

    if schema and not schema.is_file():
        raise typer.BadParameter(f"{schema}: no such file", param_hint="--schema")
    if not keys and not schema:
        return None
    try:
        return KeySchema.resolve(keys or None, schema)
    except SchemaError as e:
        raise typer.BadParameter(str(e), param_hint="--schema" if schema else "--keys") from None


def int_list(text: str, option: str) -> list[int]:
    """ "1,5,10" -> [1, 5, 10]; anything else (or a number below 1) is a usage error."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise typer.BadParameter(f"expected positive integers separated by commas, got {text!r}", param_hint=option)
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """ "I/N" -> (I, N) with 0 <= I < N: the part of a folder one of N processes takes; else a usage error."""
    try:
        part = tuple(int(v) for v in text.split("/"))
    except ValueError:
        part = ()
    if len(part) != 2 or not 0 <= part[0] < part[1]:
        raise typer.BadParameter(
            f"shard must be (i, n) with 0 <= i < n: expected I/N, got {text!r}", param_hint="--shard"
        )
    return part
