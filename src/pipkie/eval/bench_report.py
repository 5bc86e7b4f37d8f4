"""What `pipkie bench` writes besides its JSON: the speed-up plots of its sweeps and the markdown
table of its methods (the README's tables are pasted from it)."""

from __future__ import annotations

from pathlib import Path


def plot(result: dict, plot_dir: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(plot_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    env = result["env"]
    for axis, label in (("keys", "number of keys (8 tokens each)"), ("value_length", "value length (tokens, 4 keys)")):
        if "sweeps" not in result:
            break
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for bs, pts in result["sweeps"][axis].items():
            ax.plot([p["x"] for p in pts], [p["speedup"] for p in pts], marker="o", label=f"batch {bs}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(label)
        ax.set_ylabel("speed-up of PIP over AR-forced")
        ax.set_title(f"{env['threads']} CPU thread(s), {env['parameters'] / 1e6:.0f}M params", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        p = out_dir / f"speedup_{axis}.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    (out_dir / "bench.md").write_text(markdown_table(result))
    return paths


def markdown_table(result: dict) -> str:
    lines = [
        f"threads: {result['env']['threads']}, documents: {result['env']['documents']}, "
        f"model: {result['env']['parameters'] / 1e6:.0f}M parameters",
        "",
        "| batch | method | median s/doc | p90 s/doc | value tokens/s | working MB | footprint MB | ANLS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for bs, b in result["batches"].items():
        for m, r in b["methods"].items():
            anls = f"{100 * r['anls']:.1f}" if r["anls"] is not None else "—"
            lines.append(
                f"| {bs} | {m} | {r['median_s']:.4f} | {r['p90_s']:.4f} | {r['tokens_per_s']:.0f} | "
                f"{r['peak_rss_mb']:.0f} | {r.get('footprint_mb', 0):.0f} | {anls} |"
            )
    lines.append("")
    for bs, b in result["batches"].items():
        lines.append(f"batch {bs}: " + ", ".join(f"{k} = {v:.2f}" for k, v in b["ratios"].items() if v is not None))
    return "\n".join(lines) + "\n"
