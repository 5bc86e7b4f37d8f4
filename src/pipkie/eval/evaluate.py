"""`pipkie evaluate`: decode a labelled split and score it (ANLS, exact-match F1, per key), with
the confidences' calibration and the documents that did not fit the context.

Predictions are appended to `<json>.predictions.jsonl` as they are made (`pipkie.eval.store`), so
an interrupted run resumes where it stopped, and only a run under the same settings (model, keys,
decoder, data, OCR, key map) resumes: anything else starts over, with a message saying why.

Decoders are those of `pipkie.decoding.DECODERS` (`pip`, `ar-free`, `ar-forced`); an AR decoder
runs the model's AR baseline, never the PIP weights (`model_for_decode`).

Lists of items (`--keys "items[name,quantity,price]"`, `pipkie.model.groups`): each row's `pred` and
`gold` hold the list as [{field: value}] (gold from the documents' `items.*` fields,
`eval_data.gold_items`), and the summary's `items` has, per list, `pipkie.eval.metrics.ItemScores`
(item precision/recall/F1, per-field ANLS of matched items).

The summary (returned, printed by `format_table`, written to `json_path`) holds `pipkie.eval.metrics`'
numbers, `truncated_docs` (documents cut to fit the model's context; each row's `truncated` is
its count of cut tokens, from the decoder's own encoding, `Encoded.truncated`), `calibration`
(`pipkie.eval.calibration`, of the raw confidences the rows store, so a map can be refitted on
them), `calibrated` (the same under the model's `confidence_calibration`, the confidences
`Extractor` reports; only when the model has a map), `warnings` (e.g. a requested key no
document has a gold value for) and the run's `fingerprint`.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pipkie.decoding import get_decoder
from pipkie.decoding.abstain import thresholds
from pipkie.decoding.disjoint import DISJOINT
from pipkie.decoding.gaps import GAPS
from pipkie.decoding.items import ITEM_RULES
from pipkie.decoding.labels import LABELS
from pipkie.decoding.snap import SNAP
from pipkie.eval.abstention import withhold_rows
from pipkie.eval.calibration import calibrated_pairs, calibration, calibration_pairs, reliability_diagram
from pipkie.eval.gold import gold_fields, gold_items, gold_warnings, load_documents, parse_key_map
from pipkie.eval.metrics import ItemScores, Scores
from pipkie.eval.store import model_fingerprint, read_predictions, resume, run_fingerprint
from pipkie.io.document import serialize
from pipkie.model.groups import field_budget as item_budget
from pipkie.model.groups import items_budgets
from pipkie.model.modeling import builder_for, load_model, model_for_decode
from pipkie.model.precision import resolve_compute
from pipkie.schema import KeySchema


def decode_batch(model, builder, texts, schema: KeySchema, decode: str, *, pattern: str, refine_steps: int = 0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation: counted per document (truncated_tokens)
        return get_decoder(decode)(
            model, builder, texts, [schema] * len(texts), pattern=pattern, refine_steps=refine_steps
        )


def truncated_tokens(builder, text: str, schema: KeySchema, decode: str) -> int:
    """Document tokens the decoder's input drops to fit the context (0 when the document fits)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return int(get_decoder(decode).encode(builder, text, schema).truncated)


def summarize(
    rows: list[dict],
    keys: list[str],
    groups: dict[str, list[str]] | None = None,
    confidence_map: dict | None = None,
    abstention: dict | None = None,
) -> dict:
    """Scores, truncation and calibration of predictions-file rows (their own gold values); `groups`
    (list name -> its fields): the lists of items, scored by `ItemScores` (the summary's `items`);
    `confidence_map`: a model's `confidence_calibration`, scored as `calibrated` beside the raw
    `calibration`; `abstention`: a model's thresholds (`Settings.abstention`), the scores with them
    applied as `abstained` beside the raw ones (rows keep raw values: `pipkie.eval.abstention`)."""
    scores = Scores()
    for r in rows:
        scores.add_document(r["pred"], r["gold"], keys)
    pairs = calibration_pairs(rows, keys)
    out = dict(
        scores.summary(),
        n_docs=len(rows),
        truncated_docs=sum(bool(r.get("truncated")) for r in rows),
        calibration=calibration(pairs),
    )
    if confidence_map is not None:
        out["calibrated"] = dict(calibration(calibrated_pairs(pairs, confidence_map)), map=confidence_map)
    if abstention is not None:
        withheld = Scores()
        for r in withhold_rows(rows, thresholds(abstention)):
            withheld.add_document(r["pred"], r["gold"], keys)
        out["abstained"] = dict(withheld.summary(), map=abstention)
    if groups:
        out["items"] = {}
        for name, fields in groups.items():
            s = ItemScores(tuple(fields))
            for r in rows:
                s.add(r["pred"].get(name), r["gold"].get(name))
            out["items"][name] = s.summary()
    return out


def list_keys(rows: list[dict]) -> dict[str, list[str]]:
    """The lists among predictions-file rows' keys (a list's prediction is a list of objects), with
    the fields their items have."""
    names = {k for r in rows for k, v in r["pred"].items() if isinstance(v, list)}
    out: dict[str, list[str]] = {k: [] for k in sorted(names)}
    for r in rows:
        for k in names:
            for side in (r["pred"], r["gold"]):
                out[k] += [f for x in side.get(k) or [] for f in x if f not in out[k]]
    return {k: v or ["name"] for k, v in out.items()}  # no item anywhere: nothing to tell the fields


def rescore(pred_path: str | Path, keys: list[str] | None = None) -> dict:
    """`summarize` of a predictions file, over `keys` (default: the gold keys of its first row; lists
    of items are found by their shape)."""
    rows = read_predictions(pred_path)
    if not rows:
        raise ValueError(f"{pred_path}: no predictions")
    groups = list_keys(rows)
    return summarize(rows, [k for k in keys or list(rows[0]["gold"]) if k not in groups], groups)


def _key_print(k, budget: int) -> list:
    """A key in the run's fingerprint: name, description, slots and (only when it has one) its type,
    so that fingerprints of untyped keys stay what they were before types."""
    return [k.name, k.description, budget, *([k.type] if k.type else [])]


def evaluate(
    *,
    dataset: str,
    data_dir: str,
    split: str = "test",
    decode: str = "pip",
    model_path: str,
    keys: Iterable | str | None = None,
    key_map: str | dict | None = None,
    limit: int | None = None,
    batch_size: int = 4,
    threads: int = 1,
    refine_steps: int = 0,
    ocr: str | None = None,
    ocr_cache: str | None = None,
    json_path: str | None = None,
    fresh: bool = False,
    reliability: str | None = None,
    compute: str | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Decode `split` of `dataset` with the model and score it; the summary described above.

    keys: names, "a,b", a KeySchema or a schema file (default: the model's keys, else the gold
    keys); key_map: {requested key: gold key} or "a=x,b=y"; ocr: an OCR engine to read the images
    with instead of the dataset's words (its words cached in `ocr_cache`, default `ocr-cache/`
    beside `json_path`); json_path: where the summary goes, its predictions file beside it;
    reliability: a PNG path for the reliability diagram; compute: the layers' precision
    (`pipkie.model.precision`). `log` gets the progress messages."""
    decode = get_decoder(decode).name
    key_map = parse_key_map(key_map)
    ocr = None if ocr in (None, "", "none", "dataset") else ocr
    model_path = model_for_decode(model_path, decode)  # AR decodes run the AR baseline, never PIP weights
    model_id = model_fingerprint(model_path)
    if ocr and not ocr_cache:
        ocr_cache = str(
            (Path(json_path).parent if json_path else Path("."))
            / "ocr-cache"
            / f"{ocr}-{Path(data_dir).resolve().name}"
        )
    docs, warns = load_documents(
        dataset, data_dir, split, limit=limit, ocr=ocr, ocr_cache=ocr_cache, threads=threads, log=log
    )
    torch.set_num_threads(threads)
    compute = resolve_compute(compute)
    model, tokenizer, settings = load_model(model_path, pad_vocab=True, compute=compute)
    builder = builder_for(tokenizer, settings)
    schema = KeySchema.resolve(
        keys or None,
        default=lambda: settings.keys or sorted({k for d in docs for k in d.fields if not k.startswith("items.")}),
    )  # the model's keys, else the gold's
    groups = {g.name: g for g in schema.groups}
    warns += gold_warnings(docs, schema.names, key_map, groups)
    for w in warns:
        log(f"warning: {w}")
    fingerprint = run_fingerprint(
        model=model_id,
        keys=[_key_print(k, builder.budget(k)) for k in schema],
        decode=decode,
        refine_steps=refine_steps,
        ocr=ocr,
        dataset=dataset,
        split=split,
        data_dir=str(Path(data_dir).resolve()),
        limit=limit,
        key_map=key_map,
        post=f"{SNAP}-{DISJOINT}-{LABELS}",  # snapped to words, disjoint, no trailing labels (older rows decoded again)
        **({"compute": compute} if compute != "float32" else {}),  # float32 runs resume as before
        **(
            {
                "lists": [
                    [g.name, n, [_key_print(k, item_budget(builder, g, k)) for k in g.fields]]
                    + ([list(g.required)] if g.required else [])  # items without one are left out
                    for g, n in zip(schema.groups, items_budgets(builder, schema))
                ],
                "placement": f"{ITEM_RULES}-{GAPS}",  # a list's fields off the copy head (decoding.items), gaps filled
                **({"item_headers": builder.item_headers} if builder.item_headers != "each" else {}),
                **({"item_slots": builder.item_slots} if builder.item_slots else {}),
            }
            if schema.groups
            else {}
        ),
    )
    pred_path = Path(json_path).with_suffix(".predictions.jsonl") if json_path else None
    done = resume(pred_path, fingerprint, fresh=fresh, summary=Path(json_path), log=log) if pred_path else {}
    todo = [d for d in docs if d.id not in done]
    if done:
        log(f"evaluate: resuming {pred_path}: {len(docs) - len(todo)} of {len(docs)} documents already decoded")
    pattern = settings.pattern
    if pred_path:
        pred_path.parent.mkdir(parents=True, exist_ok=True)
    out = open(pred_path, "a", encoding="utf-8") if pred_path else None
    bar = tqdm(total=len(docs), initial=len(docs) - len(todo), desc=f"evaluate {decode}")
    try:
        for i in range(0, len(todo), batch_size):
            chunk = todo[i : i + batch_size]
            texts = [serialize(d) for d in chunk]
            t0 = time.perf_counter()
            preds = decode_batch(model, builder, texts, schema, decode, pattern=pattern, refine_steps=refine_steps)
            dt = (time.perf_counter() - t0) / len(chunk)
            for d, t, p in zip(chunk, texts, preds):
                gold = gold_fields(d, schema.names, key_map)
                gold.update({g.name: gold_items(d, g, key_map) for g in schema.groups})
                r = dict(
                    id=d.id,
                    decode=decode,
                    seconds=dt,
                    pred={k: f.value for k, f in p.items()},
                    confidence={k: round(f.confidence, 4) for k, f in p.items()},
                    gold=gold,
                    truncated=truncated_tokens(builder, t, schema, decode),
                    run=fingerprint["hash"],
                )
                done[d.id] = r
                if out:
                    out.write(json.dumps(r, ensure_ascii=False) + "\n")
                    out.flush()
            bar.update(len(chunk))
    finally:
        bar.close()
        if out:
            out.close()
    rows = [done[d.id] for d in docs]
    result = dict(
        summarize(
            rows,
            schema.names,
            {g.name: g.names for g in schema.groups},
            settings.confidence_calibration,
            settings.abstention,
        ),
        sec_per_doc=sum(r["seconds"] for r in rows) / len(rows),
        decode=decode,
        model=str(model_path),
        dataset=dataset,
        split=split,
        keys=schema.names + [g.spec() for g in schema.groups],
        key_map=key_map,
        ocr=ocr or "dataset",
        batch_size=batch_size,
        threads=threads,
        compute=compute,
        refine_steps=refine_steps,
        truncated_ids=[r["id"] for r in rows if r["truncated"]],
        warnings=warns,
        fingerprint=fingerprint,
    )
    if reliability:
        result["reliability"] = str(
            reliability_diagram(
                result["calibration"], reliability, title=f"{dataset} {split} · {decode} · {Path(model_path).name}"
            )
        )
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def calibration_line(cal: dict, label: str = "calibration") -> str:
    """One line of a `calibration` summary: ECE, share ≥ high and its exactness."""
    return (
        f"{label}: ECE {cal['ece']:.3f} over {cal['n_values']} values; "
        f"{_pct(cal['high_share'])}% have confidence ≥ {cal['high']}, {_pct(cal['high_exact'])}% of those exact"
    )


def format_table(result: dict) -> str:
    lines = [
        f"{result['dataset']} {result['split']} · decode={result['decode']} · {result['n_docs']} docs · "
        f"{result['sec_per_doc']:.3f} s/doc",
        f"{'key':<12}{'ANLS':>8}{'exact':>8}{'F1':>8}{'ANLS ns':>9}",
        "-" * 45,
    ]
    nospace = lambda v: f"{100 * v['anls_nospace']:>9.1f}" if "anls_nospace" in v else ""  # noqa: E731
    for k, v in result["per_key"].items():
        lines.append(f"{k:<12}{100 * v['anls']:>8.1f}{100 * v['exact']:>8.1f}{100 * v['f1']:>8.1f}{nospace(v)}")
    lines.append("-" * 45)
    if result["per_key"]:
        lines.append(f"{'all':<12}{100 * result['anls']:>8.1f}{'':>8}{100 * result['f1']:>8.1f}{nospace(result)}")
        lines.append("(ANLS ns: ANLS ignoring whitespace, pipkie.eval.metrics)")
    if "abstained" in result:
        a, ts = result["abstained"], result["abstained"]["map"]["thresholds"]
        lines.append(
            f"with the model's abstention ({', '.join(f'{k} < {t:.2f}' for k, t in ts.items()) or 'no threshold'}): "
            f"ANLS {100 * a['anls']:.1f}, F1 {100 * a['f1']:.1f}"
        )
    for name, s in result.get("items", {}).items():
        lines.append(
            f"{name}: item P {100 * s['precision']:.1f} R {100 * s['recall']:.1f} F1 {100 * s['f1']:.1f} "
            f"({s['tp']} right of {s['n_pred']} predicted, {s['n_gold']} gold); ANLS of matched items: "
            + ", ".join(f"{f} {100 * a:.1f}" for f, a in s["per_field"].items())
        )
    for name, what in (("calibration", "raw"), ("calibrated", "the model's map")):
        cal = result.get(name)
        if cal and cal["n_values"]:
            lines.append(calibration_line(cal, f"calibration ({what})" if "calibrated" in result else "calibration"))
    if "truncated_docs" in result:
        lines.append(f"truncated to fit the context: {result['truncated_docs']} of {result['n_docs']} documents")
    lines += [f"warning: {w}" for w in result.get("warnings", [])]
    return "\n".join(lines)
