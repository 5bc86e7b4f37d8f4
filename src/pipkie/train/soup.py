"""`pipkie soup A B ... --out C`: the element-wise mean of fine-tuned models' weights (a model soup).

Two runs of one config that differ only in their seed can read a data set seven points apart
(docs/RESULTS.md, rounds 8c/8d and 9/10): one run is a draw. Averaging the weights of runs
fine-tuned from the same model (Wortsman et al., 2022, "Model soups") keeps one model's cost at
inference and takes much of that spread out. What is averaged, file by file:

- `adapter_model.safetensors` (LoRA factors and saved modules), `model.safetensors` (full weights)
  and `copy_head.safetensors`: every floating-point tensor, in float32, stored back in the widest
  of its dtypes (a shipped bf16 model averaged with a float32 run gives float32).
  For LoRA runs that continue one adapter (`TrainConfig.init`), the mean of the factors B and A
  is the mean of the weight updates up to a second-order term (the runs' changes to B times their
  changes to A), small after a short fine-tune.
- Everything else must agree: the decoding settings (`pipkie.json`, which fix the template the
  weights were trained to read), the adapter config, the tensors' names, shapes and integer values.

Confidence calibration and abstention thresholds were fitted on one model's predictions and do not
carry over: the soup has none (refit them with `pipkie calibrate` / `pipkie abstain`). Nor does the
pointer to an AR twin (`ar_baseline`): a PIP soup's twin is the soup of the twins, named when it is
shipped (`scripts/ship_model.py --ar-baseline`). The output
directory records what it was made of in `soup.json`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pipkie.model.modeling import SETTINGS_FILE, Settings

WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "copy_head.safetensors")
FITTED = ("confidence_calibration", "abstention")  # fitted on one model's predictions: dropped
NOT_SETTINGS = (*FITTED, "ar_baseline")  # not how the weights decode: neither compared nor carried
NOT_COPIED = {SETTINGS_FILE, "README.md", "soup.json", *WEIGHT_FILES}  # (a model card is one run's)


def _adapter_config(model: Path) -> dict:
    """The adapter config with its module lists as sets: peft writes `target_modules` from a set, so
    two runs of one config may list them in different orders."""
    config = json.loads((model / "adapter_config.json").read_text())
    return {k: sorted(v) if isinstance(v, list) and k.endswith("modules") else v for k, v in config.items()}


def _settings(model: Path) -> dict:
    if not (model / SETTINGS_FILE).is_file():
        raise ValueError(f"{model}: not a pipkie model directory (no {SETTINGS_FILE})")
    s = asdict(Settings.load(model))
    return {k: v for k, v in s.items() if k not in NOT_SETTINGS}


def _agree(models: list[Path], what: str, values: list) -> None:
    for m, v in zip(models[1:], values[1:]):
        if v != values[0]:
            raise ValueError(f"cannot average {models[0]} and {m}: their {what} differ")


def _mean_file(models: list[Path], name: str, weights: list[float]) -> tuple[dict, dict]:
    """(averaged tensors, metadata of the first model's file)."""
    with safe_open(models[0] / name, "pt") as f:
        metadata = f.metadata() or {}
    tensors = [load_file(m / name) for m in models]
    _agree(models, f"{name} tensor names", [sorted(t) for t in tensors])
    out = {}
    for key, first in tensors[0].items():
        floating = [t[key].is_floating_point() for t in tensors]
        _agree(models, f"{name} tensor {key} (shape, kind)", [(t[key].shape, f) for t, f in zip(tensors, floating)])
        if all(floating):
            mean = sum(w * t[key].float() for w, t in zip(weights, tensors))
            out[key] = mean.to(max((t[key].dtype for t in tensors), key=lambda d: torch.finfo(d).bits))
        else:
            _agree(models, f"{name} tensor {key} dtype", [t[key].dtype for t in tensors])
            if any(not torch.equal(first, t[key]) for t in tensors[1:]):
                raise ValueError(f"cannot average {name}: integer tensor {key} differs between models")
            out[key] = first
    return out, metadata


def soup(models: list[str | Path], out: str | Path, weights: list[float] | None = None) -> dict:
    """Write the weighted mean of `models` (directories) to `out`; returns what was done.

    `weights` (default: equal) are normalised to sum to 1. Raises ValueError, naming the first
    difference, when the models cannot be averaged (settings, files, tensor names or shapes)."""
    models = [Path(m) for m in models]
    out = Path(out)
    if len(models) < 2:
        raise ValueError("a soup needs at least two models")
    if any(out.resolve() == m.resolve() for m in models):
        raise ValueError(f"--out {out} is one of the models averaged: write the soup elsewhere")
    if out.exists() and not (out / "soup.json").is_file() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not an earlier soup: it is not replaced (choose a new path)")
    weights = [1.0] * len(models) if weights is None else [float(w) for w in weights]
    if len(weights) != len(models) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights: one non-negative number per model, not all 0 (got {weights})")
    weights = [w / sum(weights) for w in weights]
    for m in models:
        if not m.is_dir():
            raise ValueError(f"{m}: no such model directory")
    _agree(models, f"decoding settings ({SETTINGS_FILE})", [_settings(m) for m in models])
    present = [[n for n in WEIGHT_FILES if (m / n).is_file()] for m in models]
    _agree(models, "weight files", present)
    if not present[0]:
        raise ValueError(f"{models[0]}: no weight files ({', '.join(WEIGHT_FILES)})")
    if (models[0] / "adapter_config.json").is_file():
        configs = [_adapter_config(m) for m in models]
        _agree(models, "adapter configs", configs)

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in present[0]:
        tensors, metadata = _mean_file(models, name, weights)
        save_file(tensors, tmp / name, metadata={"format": "pt", **metadata})
    for f in sorted(models[0].iterdir()):
        if f.is_file() and f.name not in NOT_COPIED:
            shutil.copy2(f, tmp / f.name)
    Settings(**_settings(models[0])).save(tmp)
    record = dict(of=[str(m) for m in models], weights=weights, files=present[0])
    (tmp / "soup.json").write_text(json.dumps(record, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return dict(out=str(out), **record)
