"""`pipkie bench`: speed and memory of PIP against AR decoding, side by side, in one process.

For each batch size, on the same documents and after a warm-up, every method is timed, batch by
batch in a rotating order (a background load weighs on all methods alike; a killed run resumes at
the next batch):
PIP (one pass), PIP + refine 1 and 2, AR forced-template, AR free; plus the *floor*: one plain
causal forward pass over an input as long as PIP's (document + template), the cost PIP cannot go
below. The AR methods (and the sweeps) run the PIP model's AR baseline (`Settings.ar_baseline`, or
`ar_model_path`; never the PIP model, whose AR answers are meaningless). Reported per method: median
and p90 seconds per document, value tokens (those of the decoded values, counted alike for every
method: PIP's surplus `<|pip_end|>` slots, AR's headers and end tokens are none) and value tokens per
second, peak RSS above the baseline (the kernel's peak counter, reset before each method, the heap
trimmed), the footprint (the method's model weights + that peak: what serving it alone needs, the
basis of the memory ratio), the torch CUDA allocator's peak when on GPU, and ANLS on those
documents. Ratios are computed pair by pair from the same run.

Sweeps (synthetic documents, speed only): speed-up against the number of keys and against the
value length, with AR generating exactly each key's budget (`fixed_length`) so both sides produce
the same number of value tokens.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

from pipkie.data import read_dataset
from pipkie.decoding import DECODERS, Decoder, get_decoder
from pipkie.decoding.ar import ar_decode
from pipkie.decoding.pip import pip_decode
from pipkie.decoding.slot_head import fast_head
from pipkie.eval.bench_report import plot
from pipkie.eval.memory import PeakRSS, weights_mb
from pipkie.eval.metrics import Scores
from pipkie.io.document import serialize
from pipkie.model.modeling import builder_for, load_model, model_for_decode
from pipkie.model.precision import compute_of
from pipkie.schema import Key, KeySchema

REFINE_STEPS = (1, 2)  # refinement variants timed for decoders that refine: "pip-refine1", "pip-refine2"


def all_methods() -> tuple[str, ...]:
    """Every registered decoder, and the refinement variants of those that refine."""
    return tuple(
        m for d in DECODERS.values() for m in (d.name, *(f"{d.name}-refine{k}" for k in REFINE_STEPS if d.refines))
    )


METHODS = all_methods()  # (the default of `bench`)


def method_decoder(method: str) -> tuple[Decoder, int]:
    """A method's (decoder, refine steps): "pip-refine2" -> (pip, 2); ValueError for an unknown one."""
    name, _, steps = method.partition("-refine")
    if method not in all_methods():
        raise ValueError(f"unknown method {method!r}; choose among {', '.join(all_methods())}")
    return get_decoder(name), int(steps or 0)


def value_tokens(builder, preds) -> int:
    """Tokens of the decoded values (" " + value, as the template writes them; missing values count
    nothing): the same count for every method, whatever it predicted around them."""
    return sum(len(builder._ids(" " + f.value)) for p in preds for f in p.values() if f.value is not None)


def run_method(model, builder, texts, schema, method: str, pattern: str):
    """Decode `texts` with one method; return (predictions, value tokens)."""
    decoder, refine_steps = method_decoder(method)
    preds = decoder(model, builder, texts, [schema] * len(texts), pattern=pattern, refine_steps=refine_steps)
    return preds, value_tokens(builder, preds)


@torch.inference_mode()
def floor_pass(model, builder, texts, schema) -> None:
    """One plain causal forward over inputs as long as PIP's and the next token of each row, on the
    decoders' LM head (the floor PIP is compared with: what any decoder pays to read PIP's input)."""
    from pipkie.decoding.pip import final_hidden, left_pad, positions
    from pipkie.decoding.slot_head import greedy

    encs = [builder.pip(t, schema) for t in texts]
    ids, attn = left_pad([e.input_ids for e in encs], builder.pad_id)
    greedy(model, final_hidden(model, ids, attn, positions(attn))[:, -1])


def _measure(m, b, chunk, schema, method: str, pattern: str):
    """(seconds, predictions or None, tokens, peak RSS growth in MB) of one batch with one method."""
    with PeakRSS() as mem:
        if method == "floor":
            (dt, _), preds, n = _time(floor_pass, m, b, chunk, schema), None, 0
        else:
            dt, (preds, n) = _time(run_method, m, b, chunk, schema, method, pattern)
    return dt, preds, n, mem.mb


def _summarize(raw: dict, docs, schema, model, *, scored: bool) -> dict:
    per_doc, total = raw["times"], sum(raw["times"])
    anls = None
    if scored:
        scores = Scores()
        for d, p in zip(docs, raw["preds"]):
            scores.add_document(p, {k: d.fields.get(k) for k in schema.names}, schema.names)
        anls = scores.summary()["anls"]
    return dict(
        median_s=statistics.median(per_doc),
        p90_s=_pct(per_doc, 0.9),
        total_s=total,
        tokens=raw["tokens"],
        tokens_per_s=raw["tokens"] / total if total else 0.0,
        peak_rss_mb=round(raw["rss_mb"], 1),
        footprint_mb=round(weights_mb(model) + raw["rss_mb"], 1),
        cuda_peak_mb=torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
        anls=anls,
    )


def _time(fn, *a):
    t0 = time.perf_counter()
    out = fn(*a)
    return time.perf_counter() - t0, out


def load_pair(
    model_path: str,
    ar_model_path: str | None = None,
    *,
    need_ar: bool = True,
    compute: str | None = None,
    ar_compute: str | None = None,
):
    """(model, builder, settings, AR model, AR builder, AR model path): the PIP model and, if
    `need_ar`, its AR baseline (same architecture and data, trained causally: a real AR extractor;
    none is an error, `model_for_decode`), else the PIP model again in the AR slots. The PIP model's
    layers run in `compute` (`pipkie.model.precision`), the AR model's in `ar_compute` (default the
    same): AR decoding at batch 1 is no faster in bfloat16, so a fair run may give each its fastest."""
    model, tokenizer, settings = load_model(model_path, pad_vocab=True, compute=compute)
    builder = builder_for(tokenizer, settings)
    ar_model, ar_builder = model, builder
    if need_ar:
        ar_model_path = ar_model_path or model_for_decode(model_path, "ar-forced", settings)
        ar_model, ar_tok, ar_settings = load_model(ar_model_path, pad_vocab=True, compute=ar_compute or compute)
        if ar_settings.objective != "ar":
            raise ValueError(
                f"the AR baseline {ar_model_path} is not an AR model (objective {ar_settings.objective!r})"
            )
        ar_builder = builder_for(ar_tok, ar_settings)
    return model, builder, settings, ar_model, ar_builder, ar_model_path


def bench(
    *,
    model_path: str,
    ar_model_path: str | None = None,
    dataset: str = "sroie",
    data_dir: str,
    split: str = "test",
    batch_sizes=(1, 8),
    limit: int = 32,
    threads: int = 1,
    repeats: int = 1,
    methods=METHODS,
    sweeps: bool = True,
    json_path: str | None = None,
    plot_dir: str | None = None,
    compute: str | None = None,
    ar_compute: str | None = None,
    log=print,
) -> dict:
    if not methods or set(methods) - set(all_methods()):
        raise ValueError(f"methods must be among {', '.join(all_methods())}, got {', '.join(methods) or 'none'}")
    torch.set_num_threads(threads)
    model, builder, settings, ar_model, ar_builder, ar_model_path = load_pair(
        model_path,
        ar_model_path,
        need_ar=sweeps or any(method_decoder(m)[0].objective == "ar" for m in methods),
        compute=compute,
        ar_compute=ar_compute,
    )
    pattern = settings.pattern
    docs = list(read_dataset(dataset, data_dir, split, limit=limit))
    schema = KeySchema.resolve(
        default=lambda: settings.keys or sorted({k for d in docs for k in d.fields if not k.startswith("items.")})
    )  # the model's keys, else the gold's
    # Batches group documents of similar length (sorted by token count), as an offline batch job
    # would, so left-padding costs every method little; at batch 1 the order changes nothing.
    ordered = sorted(((serialize(d), d) for d in docs), key=lambda td: len(builder.tok(td[0]).input_ids))
    texts, docs = [t for t, _ in ordered], [d for _, d in ordered]
    env = dict(
        threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        cpu_count=os.cpu_count(),
        device="cpu",
        torch=torch.__version__,
        model=model_path,
        ar_model=ar_model_path,
        attention=model.config._attn_implementation,
        compute=compute_of(model),  # the layers' precision (load_pair)
        ar_compute=compute_of(ar_model),
        lm_head="bf16 (AMX), decisions checked against float32" if fast_head(model) else "float32",
        repeats=repeats,
        parameters=sum(p.numel() for p in model.parameters()),
        documents=len(docs),
        order="by token count",
        methods=list(methods),  # the methods interleaved batch by batch: a resume needs the same set
    )
    log(f"bench: {env}")
    partial = Path(str(json_path) + ".partial") if json_path else None
    result = _resume(partial, env, log) or dict(env=env, batches={})

    def save():
        if partial:
            partial.write_text(json.dumps(result, indent=2) + "\n")

    names = ("floor",) + tuple(methods)
    pick = {
        name: (ar_model, ar_builder)
        if name != "floor" and method_decoder(name)[0].objective == "ar"
        else (model, builder)
        for name in names
    }
    for bs in batch_sizes:
        chunks = [texts[i : i + bs] for i in range(0, len(texts), bs)]
        block = result["batches"].setdefault(str(bs), dict(methods={}, ratios={}, done=0, raw={}))
        raw = block["raw"]
        for name in names:
            raw.setdefault(name, dict(times=[], tokens=0, rss_mb=0.0, preds=[]))
        if block["done"] < len(chunks):
            for name in names:  # warm-up on the first batch (allocator, kernels, caches)
                _measure(*pick[name], chunks[0], schema, name, pattern)
        elif block["done"]:
            log(f"  batch {bs}: measured in the previous run")
        # Methods are interleaved batch by batch (in a rotating order), so that a background load
        # that comes and goes weighs on every method alike and the ratios stay paired. With
        # `repeats` > 1 every method runs each batch that many times (rounds interleaved the same
        # way) and keeps its fastest time: interference only ever adds time, so the minimum is the
        # best estimate of a method's own cost (as `timeit` does); memory keeps the largest peak.
        for ci in range(block["done"], len(chunks)):
            best = {}
            for rep in range(repeats):
                turn = (ci + rep) % len(names)
                for name in names[turn:] + names[:turn]:
                    dt, preds, n, mb = _measure(*pick[name], chunks[ci], schema, name, pattern)
                    if name in best:  # the first round's predictions; the fastest time, the largest peak
                        preds, dt, mb = best[name][1], min(dt, best[name][0]), max(mb, best[name][3])
                    best[name] = (dt, preds, n, mb)
            for name, (dt, preds, n, mb) in best.items():
                r = raw[name]
                r["times"] += [dt / len(chunks[ci])] * len(chunks[ci])
                r["tokens"] += n
                r["rss_mb"] = max(r["rss_mb"], mb)
                r["preds"] += [{k: f.value for k, f in p.items()} for p in preds or []]
            block["done"] = ci + 1
            save()
            log(f"  batch {bs}: {ci + 1}/{len(chunks)} batches measured")
        rows = block["methods"]
        for name in names:
            rows[name] = _summarize(raw[name], docs, schema, pick[name][0], scored=name != "floor")
            r = rows[name]
            log(
                f"  batch {bs} {name:<12} median {r['median_s']:.4f} s/doc  p90 {r['p90_s']:.4f}  tokens {r['tokens']}"
                f"  rss +{r['peak_rss_mb']:.0f} MB" + (f"  ANLS {r['anls']:.3f}" if r["anls"] is not None else "")
            )
        ratios = {}
        if "pip" in rows:
            for other in ("ar-free", "ar-forced"):
                if other in rows:
                    ratios[f"speedup_vs_{other}"] = rows[other]["median_s"] / rows["pip"]["median_s"]
                    # the most any decoder could gain that still reads PIP's input once (PIP at its floor)
                    ratios[f"ceiling_vs_{other}"] = rows[other]["median_s"] / rows["floor"]["median_s"]
                    # what serving the method alone needs (weights + its peak working memory), and the
                    # working memory alone (RSS above the idle process) - the first is the target
                    ratios[f"memory_vs_{other}"] = rows["pip"]["footprint_mb"] / rows[other]["footprint_mb"]
                    ratios[f"working_memory_vs_{other}"] = (
                        rows["pip"]["peak_rss_mb"] / rows[other]["peak_rss_mb"]
                        if rows[other]["peak_rss_mb"] > 0
                        else None
                    )
            ratios["floor_ratio"] = rows["pip"]["median_s"] / rows["floor"]["median_s"]
            # paired: the median over batches of the two methods' times on that same batch (measured
            # back to back), robust to a background load that comes and goes
            for other, key in (
                ("floor", "floor_ratio_paired"),
                ("ar-free", "speedup_vs_ar-free_paired"),
                ("ar-forced", "speedup_vs_ar-forced_paired"),
            ):
                if other in rows:
                    pairs = [(o, p) for o, p in zip(raw[other]["times"], raw["pip"]["times"]) if o > 0 and p > 0]
                    ratios[key] = statistics.median(p / o if other == "floor" else o / p for o, p in pairs)
        block["ratios"] = ratios
        save()
        log(f"  batch {bs} ratios: " + ", ".join(f"{k}={v:.2f}" for k, v in ratios.items() if v is not None))
    if sweeps:
        result.setdefault("sweeps", {"keys": {}, "value_length": {}})
        run_sweeps(
            model,
            builder,
            pattern,
            batch_sizes,
            ar_model=ar_model,
            ar_builder=ar_builder,
            log=log,
            out=result["sweeps"],
            save=save,
        )
    if json_path:
        for block in result["batches"].values():  # per-document times stay; predictions were for resuming
            for r in block.get("raw", {}).values():
                r.pop("preds", None)
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
        if partial and partial.exists():
            partial.unlink()
    if plot_dir:
        plot(result, plot_dir)
    return result


def _resume(partial: Path | None, env: dict, log) -> dict | None:
    """The previous run's partial result, if it measured the same setting (model, threads, documents,
    methods)."""
    if not partial or not partial.exists():
        return None
    prev = json.loads(partial.read_text())
    if prev.get("env") != env:
        log(f"  {partial} is from another setting: starting afresh")
        return None
    log(f"  resuming from {partial}")
    prev["resumed"] = True  # batches measured before the restart keep their timings
    return prev


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _synthetic_text(rng: random.Random, n_lines: int = 30) -> str:
    from pipkie.data.synthetic import generate_receipts

    doc = next(iter(generate_receipts(1, seed=rng.randint(0, 10**6), render=False)))
    return serialize(doc)


def run_sweeps(
    model,
    builder,
    pattern,
    batch_sizes,
    *,
    ar_model=None,
    ar_builder=None,
    keys=(1, 2, 4, 8, 16, 32),
    lengths=(4, 8, 16, 32, 64),
    repeats: int = 3,
    log=print,
    out: dict | None = None,
    save=None,
) -> dict:
    """Speed-up of PIP over AR-forced (both producing the same number of value tokens) as the number
    of keys and the value length grow. Points already in `out` (a resumed run) are kept; `save` is
    called after each new point."""
    ar_model, ar_builder = ar_model or model, ar_builder or builder
    rng = random.Random(0)
    texts = [_synthetic_text(rng) for _ in range(max(batch_sizes))]
    out = out if out is not None else {"keys": {}, "value_length": {}}
    for bs in batch_sizes:
        for axis, grid in (("keys", keys), ("value_length", lengths)):
            pts = out[axis].setdefault(str(bs), [])
            for x in grid:
                if any(p["x"] == x for p in pts):
                    continue
                n_keys, length = (x, 8) if axis == "keys" else (4, x)
                schema = KeySchema(tuple(Key(f"field_{i}", max_tokens=length) for i in range(n_keys)))
                batch = texts[:bs]
                t_pip, t_ar = [], []
                for _ in range(repeats):
                    t_pip.append(_time(lambda: pip_decode(model, builder, batch, [schema] * bs, pattern=pattern))[0])
                    t_ar.append(
                        _time(
                            lambda: ar_decode(
                                ar_model, ar_builder, batch, [schema] * bs, mode="forced", fixed_length=True
                            )
                        )[0]
                    )
                p, a = statistics.median(t_pip), statistics.median(t_ar)
                pts.append(dict(x=x, pip_s=p / bs, ar_forced_s=a / bs, speedup=a / p))
                log(f"  sweep batch {bs} {axis}={x}: PIP {p / bs:.3f} s/doc, AR {a / bs:.3f} s/doc, ×{a / p:.1f}")
                if save:
                    save()
    return out
