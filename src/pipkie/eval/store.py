"""The predictions file of an evaluation (`<json>.predictions.jsonl`) and the fingerprint that
decides whether it can be resumed.

One row per document, appended as documents are decoded, so an interrupted `pipkie evaluate`
resumes where it stopped. Resuming is only right when every row was made under the settings of
the current run, so every row carries `run`, the hash of the run's fingerprint: the model (a hash
of its weight, tokenizer and `pipkie.json` files' bytes), the keys with their descriptions and
slot budgets, the decoder, refinement steps, OCR engine, dataset, split, data directory, limit
and key map. Batch size and threads are left out: they change the time, not the predictions.

When the file holds rows of other settings (or rows written before fingerprints existed) the run
starts over and says why; the old file is kept beside it as `<json>.predictions.previous.jsonl`
so a changed setting never silently destroys a long run. `fresh=True` starts over in any case.

A row: `id`, `decode`, `seconds` (per document, its batch's time shared), `pred` {key: value or
None}, `confidence` {key: 0-1}, `gold` {key: list of values or None}, `truncated` (document tokens
cut to fit the context; 0 when it fitted), `run`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
MODEL_FILES = (
    "pipkie.json",
    "config.json",
    "adapter_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "headfit.json",
)


def model_fingerprint(path: str | Path) -> str:
    """Hash of a model directory's weight, config and tokenizer files (names and bytes, each read
    once); a name that is not a directory (e.g. `smollm2`) stands for itself.

    `pipkie.json`'s `confidence_calibration` is left out (`_settings_bytes`): the map changes the
    confidences `Extractor` reports, not a prediction row (rows keep raw confidences), so writing
    a map must not make evaluations of that model start over."""
    p = Path(path)
    if not p.is_dir():
        return f"name:{path}"
    files = sorted(f for f in p.iterdir() if f.is_file() and (f.suffix in WEIGHT_SUFFIXES or f.name in MODEL_FILES))
    if not files:
        raise FileNotFoundError(f"{p}: no model files (weights or pipkie.json) to fingerprint")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        if f.name == "pipkie.json":
            h.update(hashlib.sha256(_settings_bytes(f)).digest())
            continue
        with open(f, "rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()[:16]


def _settings_bytes(path: Path) -> bytes:
    """A `pipkie.json`'s bytes, or, when it holds `confidence_calibration`, the bytes it has
    without it as `Settings.save` writes them (so a model fingerprints as it did before its map
    was written)."""
    raw = path.read_bytes()
    try:
        data = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(data, dict) or "confidence_calibration" not in data:
        return raw
    data.pop("confidence_calibration")
    return (json.dumps(data, indent=2) + "\n").encode()


def run_fingerprint(**settings) -> dict:
    """The settings (JSON-serialisable) plus `hash`, a digest of them in canonical form."""
    canonical = json.dumps(settings, sort_keys=True, ensure_ascii=False)
    return dict(settings, hash=hashlib.sha256(canonical.encode()).hexdigest()[:16])


def read_predictions(path: str | Path) -> list[dict]:
    """Rows of a predictions file; a line that is not a row raises ValueError naming the file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                if not isinstance(r, dict) or not {"id", "pred", "gold"} <= set(r):
                    raise ValueError("expected an object with id, pred and gold")
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                raise ValueError(f"{path}:{i}: not a predictions row ({e})") from None
            rows.append(r)
    return rows


def _differences(old: dict, new: dict) -> list[str]:
    return [k for k in sorted(set(old) | set(new)) if k != "hash" and old.get(k) != new.get(k)]


def resume(
    path: Path,
    fingerprint: dict,
    *,
    fresh: bool = False,
    summary: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, dict]:
    """Rows of `path` that this run may keep (by document id): all of them when every row has this
    run's fingerprint, else none (the file is moved aside, with a message saying why)."""
    if not path.exists():
        return {}
    rows = read_predictions(path)
    stale = [r for r in rows if r.get("run") != fingerprint["hash"]]
    if not fresh and not stale:
        return {r["id"]: r for r in rows}
    if fresh:
        why = "--fresh"
    elif all("run" not in r for r in stale):
        why = "its rows were written without a record of their settings"
    else:
        old = json.loads(summary.read_text()).get("fingerprint", {}) if summary and summary.is_file() else {}
        diff = _differences(old, fingerprint) if old.get("hash") == stale[0].get("run") else []
        why = f"they were made with another {', '.join(diff)}" if diff else "they were made under other settings"
    backup = path.with_name(path.name.removesuffix(".jsonl") + ".previous.jsonl")
    path.replace(backup)
    log(f"evaluate: not resuming from {path} ({len(rows)} rows): {why}; starting over (old rows kept in {backup})")
    return {}
