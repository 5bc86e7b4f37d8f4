"""`pipkie evaluate`: decode a labelled split and score it (ANLS, exact-match F1, per key).

Predictions are appended to `<json>.predictions.jsonl` as they are made, so an interrupted run
resumes where it stopped (`resume=True`, the default) instead of starting over.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pipkie.ar import ar_decode
from pipkie.data import read_dataset
from pipkie.decode import pip_decode
from pipkie.document import serialize
from pipkie.metrics import Scores
from pipkie.modeling import builder_for, load_model
from pipkie.schema import KeySchema

DECODES = ("pip", "ar", "ar-forced")


def decode_batch(model, builder, texts, schema: KeySchema, decode: str, *, pattern: str, refine_steps: int = 0):
    schemas = [schema] * len(texts)
    if decode == "pip":
        return pip_decode(model, builder, texts, schemas, pattern=pattern, refine_steps=refine_steps)
    if decode in ("ar", "ar-forced"):
        return ar_decode(model, builder, texts, schemas, mode="free" if decode == "ar" else "forced")
    raise ValueError(f"unknown decode {decode!r}; choose one of {DECODES}")


def evaluate(*, dataset: str, data_dir: str, split: str = "test", decode: str = "pip", model_path: str,
             keys: list[str] | None = None, limit: int | None = None, batch_size: int = 4, threads: int = 2,
             refine_steps: int = 0, json_path: str | None = None, resume: bool = True) -> dict:
    torch.set_num_threads(threads)
    model, tokenizer, settings = load_model(model_path, pad_vocab=True)
    builder = builder_for(tokenizer, settings)
    docs = list(read_dataset(dataset, data_dir, split, limit=limit))
    schema = KeySchema.parse(keys or settings.keys or sorted({k for d in docs for k in d.fields}))
    pred_path = Path(json_path).with_suffix(".predictions.jsonl") if json_path else None
    done: dict[str, dict] = {}
    if pred_path and resume and pred_path.exists():
        for line in pred_path.read_text().splitlines():
            r = json.loads(line)
            if r.get("decode") == decode:
                done[r["id"]] = r
    todo = [d for d in docs if d.id not in done]
    out = open(pred_path, "a" if resume else "w") if pred_path else None
    seconds = sum(r["seconds"] for r in done.values())
    bar = tqdm(total=len(docs), initial=len(docs) - len(todo), desc=f"evaluate {decode}")
    for i in range(0, len(todo), batch_size):
        chunk = todo[i: i + batch_size]
        t0 = time.perf_counter()
        preds = decode_batch(model, builder, [serialize(d) for d in chunk], schema, decode,
                             pattern=settings.pattern if settings.objective == "pip" else "prefix_causal",
                             refine_steps=refine_steps)
        dt = (time.perf_counter() - t0) / len(chunk)
        for d, p in zip(chunk, preds):
            r = dict(id=d.id, decode=decode, seconds=dt, pred={k: f.value for k, f in p.items()},
                     confidence={k: round(f.confidence, 4) for k, f in p.items()},
                     gold={k: d.fields.get(k) for k in schema.names})
            done[d.id] = r
            seconds += dt
            if out:
                out.write(json.dumps(r, ensure_ascii=False) + "\n")
                out.flush()
        bar.update(len(chunk))
    bar.close()
    if out:
        out.close()
    scores = Scores()
    for d in docs:
        r = done[d.id]
        scores.add_document(r["pred"], {k: d.fields.get(k) for k in schema.names}, schema.names)
    result = dict(scores.summary(), n_docs=len(docs), sec_per_doc=seconds / max(1, len(docs)), decode=decode,
                  model=str(model_path), dataset=dataset, split=split, batch_size=batch_size, threads=threads,
                  refine_steps=refine_steps)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_table(result: dict) -> str:
    lines = [f"{result['dataset']} {result['split']} · decode={result['decode']} · {result['n_docs']} docs · "
             f"{result['sec_per_doc']:.3f} s/doc",
             f"{'key':<12}{'ANLS':>8}{'exact':>8}{'F1':>8}",
             "-" * 36]
    for k, v in result["per_key"].items():
        lines.append(f"{k:<12}{100 * v['anls']:>8.1f}{100 * v['exact']:>8.1f}{100 * v['f1']:>8.1f}")
    lines.append("-" * 36)
    lines.append(f"{'all':<12}{100 * result['anls']:>8.1f}{'':>8}{100 * result['f1']:>8.1f}")
    return "\n".join(lines)
