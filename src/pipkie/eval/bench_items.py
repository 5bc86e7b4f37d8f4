"""`pipkie bench --lines 1,5,10,20,40`: PIP against AR as the number of line items grows.

A PIP pass costs the same whatever the number of items (one forward pass over the document and a
template of K item groups), while an AR extractor writes every item token by token. For each number
of lines n, `batch` synthetic receipts with exactly n item lines (`items_receipt`: a store header,
n lines `qty name price` drawn from `pipkie.data.receipts`' goods and a locale's money format, then
the totals) are decoded with `items[name, quantity, price]` by PIP, AR forced-template and AR free,
side by side in one process, each batch `repeats` times per method (the fastest kept, methods in a
rotating order; see `pipkie.eval.bench`). The budget is the same for every n (`items_budget`, default
the largest n): what a user would give for receipts of up to that many lines; every method then
cuts K to a receipt's lines + 1 (`pipkie.model.groups.within_lines`). Reported per point: seconds
per document of each method, the speed-ups, AR's decoding steps and item F1 (`pipkie.eval.metrics`).

The AR methods run the PIP model's AR baseline (`--ar-model`, or its `ar_baseline`), as in `pipkie
bench`. When the template and the longest receipt need more than the model's context, the builder's
`max_length` is raised for the sweep (up to the model's position limit, else an error says so).
"""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path

import torch

from pipkie.decoding import DECODERS, get_decoder
from pipkie.decoding.ar import ARStats
from pipkie.eval.metrics import ItemScores
from pipkie.schema import Group, Key, KeySchema

LINES = (1, 5, 10, 20, 40)
METHODS = tuple(DECODERS)  # every decoder, one pass each (no refinement variants here)
FIELDS = ("name", "quantity", "price")


def items_receipt(n: int, rng: random.Random) -> tuple[str, list[dict[str, str]]]:
    """(text, gold items) of a receipt with exactly n item lines."""
    from pipkie.data import locales as L
    from pipkie.data.vocab import FOODS, GOODS

    loc = L.LOCALES[rng.choice(sorted(L.LOCALES))]
    goods = rng.choice((FOODS, GOODS))
    lines = [
        rng.choice(("CORNER MARKET", "BLUE CAFE", "CITY PHARMACY", "GREEN GROCER")),
        "12 MAIN STREET",
        f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/2023 {rng.randint(8, 21):02d}:{rng.randint(0, 59):02d}",
    ]
    items, total = [], 0.0
    for _ in range(n):
        qty, unit = rng.choice((1, 1, 2, 3)), round(rng.uniform(0.5, 40), 2)
        total += qty * unit
        it = dict(name=rng.choice(goods), quantity=str(qty), price=L.money(qty * unit, loc, ""))
        items.append(it)
        lines.append(f"{it['quantity']} {it['name']} {it['price']}")
    lines += [f"TOTAL {L.money(total, loc, '')}", "THANK YOU"]
    return "\n".join(lines), items


def items_schema(k: int) -> KeySchema:
    return KeySchema((), (Group("items", tuple(Key(f) for f in FIELDS), k),))


def with_room(model, builder, texts: list[str], schema: KeySchema, ar: bool):
    """`builder`, or a copy whose max_length holds the longest text with the template (PIP) or the
    answer budget (AR); ValueError when that is beyond the model's positions."""
    reserved = builder.ar_reserved(schema) if ar else builder.template_length(schema)
    need = max(len(builder.document_ids(t)) for t in texts) + reserved + len(builder.instruction_ids) + 1
    if need <= builder.max_length:
        return builder
    limit = getattr(
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config,
        "max_position_embeddings",
        None,
    )
    if limit is not None and need > limit:
        raise ValueError(
            f"{schema.groups[0].max_items} items need {need} tokens with the longest receipt; the model "
            f"has {limit} positions (give fewer lines or a smaller --lines-items)"
        )
    wide = copy.copy(builder)
    wide.max_length = need
    return wide


def _decode(method: str, model, builder, texts, schema, pattern: str, stats: ARStats):
    """The decoder `method` as `pipkie extract` runs it (`Decoder.__call__`: K cut to each receipt's
    lines + 1, values snapped); AR decoders also count their steps into `stats`."""
    return get_decoder(method)(model, builder, texts, [schema] * len(texts), pattern=pattern, stats=stats)


def lines_sweep(
    model,
    builder,
    pattern: str,
    *,
    ar_model,
    ar_builder,
    lines=LINES,
    batch_sizes=(1,),
    items_budget: int | None = None,
    repeats: int = 1,
    seed: int = 0,
    log=print,
    out: dict | None = None,
    save=None,
) -> dict:
    """{batch size: [point per number of lines]} (see the module docstring). Points already in `out`
    (a resumed run) are kept; `save` is called after each new one."""
    k = items_budget or max(lines)
    schema = items_schema(k)
    out = out if out is not None else {}
    for bs in batch_sizes:
        pts = out.setdefault(str(bs), [])
        for n in lines:
            if any(p["lines"] == n for p in pts):
                continue
            rng = random.Random(f"{seed}-{n}")
            docs = [items_receipt(n, rng) for _ in range(bs)]
            texts = [t for t, _ in docs]
            pick = {
                "pip": (model, with_room(model, builder, texts, schema, ar=False)),
                "ar-forced": (ar_model, with_room(ar_model, ar_builder, texts, schema, ar=True)),
            }
            pick["ar-free"] = pick["ar-forced"]
            _decode("pip", *pick["pip"], texts, schema, pattern, ARStats())  # warm-up (kernels, allocator)
            times = {m: [] for m in METHODS}
            preds, steps = {}, {}
            for rep in range(repeats):
                turn = rep % len(METHODS)
                for m in METHODS[turn:] + METHODS[:turn]:
                    stats = ARStats()
                    t0 = time.perf_counter()
                    preds[m] = _decode(m, *pick[m], texts, schema, pattern, stats)
                    times[m].append((time.perf_counter() - t0) / bs)
                    steps[m] = stats.steps
            point = dict(lines=n, items_budget=k, batch=bs)
            for m in METHODS:
                scores = ItemScores(FIELDS)
                for (_, gold), p in zip(docs, preds[m]):
                    scores.add(p["items"].value, gold)
                point[f"{m}_s"] = min(times[m])
                point[f"{m}_item_f1"] = scores.summary()["f1"]
            point["ar_forced_steps"], point["ar_free_steps"] = steps["ar-forced"], steps["ar-free"]
            for m in ("ar-forced", "ar-free"):
                point[f"speedup_vs_{m}"] = point[f"{m}_s"] / point["pip_s"]
            pts.append(point)
            log(
                f"  lines {n:>3} batch {bs}: PIP {point['pip_s']:.3f} s/doc, AR forced {point['ar-forced_s']:.3f} "
                f"(×{point['speedup_vs_ar-forced']:.1f}), AR free {point['ar-free_s']:.3f} (×{point['speedup_vs_ar-free']:.1f})"  # noqa: E501
            )
            if save:
                save()
    return out


def lines_bench(
    *,
    model_path: str,
    ar_model_path: str | None = None,
    lines=LINES,
    batch_sizes=(1,),
    items_budget: int | None = None,
    seed: int = 0,
    threads: int = 1,
    repeats: int = 1,
    json_path: str | None = None,
    plot_dir: str | None = None,
    compute: str | None = None,
    ar_compute: str | None = None,
    log=print,
) -> dict:
    """Load the PIP model and its AR baseline (layers in `compute` and `ar_compute`, `load_pair`),
    run `lines_sweep`, write the JSON and the plot."""
    from pipkie.eval.bench import load_pair
    from pipkie.model.precision import compute_of

    torch.set_num_threads(threads)
    model, builder, settings, ar_model, ar_builder, ar_path = load_pair(
        model_path, ar_model_path, need_ar=True, compute=compute, ar_compute=ar_compute
    )
    pattern = settings.pattern if settings.objective == "pip" else "prefix_causal"
    env = dict(
        threads=torch.get_num_threads(),
        compute=compute_of(model),
        ar_compute=compute_of(ar_model),
        model=model_path,
        ar_model=ar_path,
        repeats=repeats,
        seed=seed,
        items_budget=items_budget or max(lines),
        parameters=sum(p.numel() for p in model.parameters()),
    )
    log(f"bench lines: {env}")
    result = dict(env=env, lines={})

    def save():
        if json_path:
            Path(json_path).write_text(json.dumps(result, indent=2) + "\n")

    lines_sweep(
        model,
        builder,
        pattern,
        ar_model=ar_model,
        ar_builder=ar_builder,
        lines=lines,
        batch_sizes=batch_sizes,
        items_budget=items_budget,
        repeats=repeats,
        seed=seed,
        log=log,
        out=result["lines"],
        save=save,
    )
    save()
    if plot_dir:
        plot_lines(result, plot_dir)
    return result


def plot_lines(result: dict, plot_dir: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(plot_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4))
    for bs, pts in result["lines"].items():
        xs = [p["lines"] for p in pts]
        for m, style in (("pip", "-"), ("ar-forced", "--"), ("ar-free", ":")):
            ax.plot(xs, [p[f"{m}_s"] for p in pts], style, marker="o", label=f"{m}, batch {bs}")
        for m in ("ar-forced", "ar-free"):
            bx.plot(xs, [p[f"speedup_vs_{m}"] for p in pts], marker="o", label=f"vs {m}, batch {bs}")
    ax.set_xlabel("item lines")
    ax.set_ylabel("s / document")
    bx.set_xlabel("item lines")
    bx.set_ylabel("speed-up of PIP")
    for a in (ax, bx):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    env = result["env"]
    title = f"{env['threads']} thread(s), {env['parameters'] / 1e6:.0f}M params, K = {env['items_budget']} items"
    if "compute" in env:  # runs before session 28 were float32
        title += f", PIP {env['compute']} / AR {env.get('ar_compute', env['compute'])}"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = out / "speedup_lines.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    (out / "bench_lines.md").write_text(lines_table(result))
    return path


def lines_table(result: dict) -> str:
    rows = [
        "| batch | lines | PIP s/doc | AR forced s/doc | AR free s/doc | × vs forced | × vs free | item F1 PIP / forced / free |",  # noqa: E501
        "|---|---|---|---|---|---|---|---|",
    ]
    for bs, pts in result["lines"].items():
        for p in pts:
            rows.append(
                f"| {bs} | {p['lines']} | {p['pip_s']:.3f} | {p['ar-forced_s']:.3f} | {p['ar-free_s']:.3f} | "
                f"{p['speedup_vs_ar-forced']:.1f} | {p['speedup_vs_ar-free']:.1f} | "
                f"{100 * p['pip_item_f1']:.0f} / {100 * p['ar-forced_item_f1']:.0f} / {100 * p['ar-free_item_f1']:.0f} |"  # noqa: E501
            )
    return "\n".join(rows) + "\n"
