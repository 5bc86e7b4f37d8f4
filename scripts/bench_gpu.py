"""PIP vs AR decoding on a GPU at Qwen2-VL-2B and -7B scale (random weights, nothing downloaded).

    PYTHONPATH=src python scripts/bench_gpu.py --json results/bench-gpu.json      # any CUDA machine
    PYTHONPATH=src python scripts/bench_gpu.py --tiny --device cpu                 # a smoke test here

What is timed, per model size and batch size (bf16, after a warm-up, CUDA-synchronised):
- `pip`: one forward pass over document + answer template (PIP's block attention), argmax at every
  slot, as pipkie's default runs it (`pipkie.decoding.pip.OnePass` on the "pipkie_sdpa" attention): one
  call, the document's rows on sdpa's causal kernel, the template's rows with their slice of the
  block mask (`pipkie.model.attention.pip_sdpa_attention`);
- `pip-mask`: the same pass with the whole explicit block mask (plain sdpa: no causal kernel);
- `pip-split`: the causal prefix, then the template on its KV cache, in two calls
  (`pipkie.decoding.pip.SplitPass`, pipkie's route when refining);
- `floor`: one plain causal forward pass over an input of the same length;
- `ar-forced`: causal prefill of document + key list, then per key its header is fed and the value
  generated greedily token by token with the KV cache;
- `ar-free`: prefill, then the whole answer (headers, values, end tokens) generated token by token.
The models are the language model of Qwen2-VL (Qwen2 architecture at the 2B and 7B sizes; the
vision tower, which only adds prefill work on the image, is left out). With random weights AR would
stop at random places, so every AR method generates exactly the number of tokens a SROIE answer has
(the test set's mean value lengths in SmolLM2 tokens, see docs/RESULTS.md): PIP fills as many slots
as its budgets, AR writes what a trained model would write. Inputs are random token ids of SROIE
length. It runs in about 2 minutes of H200 time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from pipkie.model.attention import PIP_SDPA, build_attention_mask

SIZES = {  # Qwen2-VL-2B / -7B language models
    "qwen2-vl-2b": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
    ),
    "qwen2-vl-7b": dict(
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=1000,
    ),
}
DOC_TOKENS = 427  # mean SROIE test document (SmolLM2 tokens)
FIELDS = {"company": (12, 24), "date": (10, 12), "address": (41, 64), "total": (5, 10)}  # (mean value, budget)
HEADER, KEY_LIST = 3, 12  # tokens of "\nkey:" and of the AR prompt's key list


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def pip_inputs(batch: int, vocab: int, device, g):
    """(ids, block ids, slot mask) for document + template; one block per field (field_blocks)."""
    ids, block, slots = (
        [torch.randint(100, vocab - 100, (DOC_TOKENS + 1,), generator=g)],
        [torch.zeros(DOC_TOKENS + 1)],
        [],
    )
    slots.append(torch.zeros(DOC_TOKENS + 1, dtype=torch.bool))
    for i, (_, budget) in enumerate(FIELDS.values(), start=1):
        ids.append(torch.randint(100, vocab - 100, (HEADER + budget,), generator=g))
        block.append(torch.full((HEADER + budget,), i))
        slots.append(torch.tensor([False] * HEADER + [True] * budget))
    one = lambda parts, dt: torch.cat(parts).to(dt)[None].repeat(batch, 1).to(device)  # noqa: E731
    return one(ids, torch.long), one(block, torch.long), one(slots, torch.bool)


@torch.inference_mode()
def pip(model, ids, block, slots, route: str = "one-call"):
    """PIP's pass: "one-call" (pipkie's default: prefix rows on the causal kernel; the model must be on
    "pipkie_sdpa"), "mask" (the whole explicit block mask), or "split" (the causal prefix into a KV
    cache, then the template block)."""
    attn = torch.ones_like(ids)
    pos = torch.arange(ids.shape[1], device=ids.device)[None].expand_as(ids)
    P = DOC_TOKENS + 1
    if route != "split":
        mask = build_attention_mask(
            model, "prefix_causal", attn, query_length=ids.shape[1], block_ids=block, position_ids=pos
        )
        extra = {"pip_causal_rows": P} if route == "one-call" else {}
        return model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=slots, **extra).logits.argmax(
            -1
        )
    cache = DynamicCache(config=model.config)
    model(
        input_ids=ids[:, :P],
        attention_mask=attn[:, :P],
        position_ids=pos[:, :P],
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    mask = build_attention_mask(
        model,
        "prefix_causal",
        attn,
        query_length=ids.shape[1] - P,
        block_ids=block,
        cache=cache,
        position_ids=pos[:, P:],
    )
    return model(
        input_ids=ids[:, P:],
        attention_mask=mask,
        position_ids=pos[:, P:],
        cache=cache,
        use_cache=True,
        logits_to_keep=slots[:, P:],
    ).logits.argmax(-1)


@torch.inference_mode()
def floor(model, ids, block, slots):
    model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1)


@torch.inference_mode()
def ar(model, prompt, steps: list[tuple[int, int]]):
    """Prefill `prompt`, then for each (fed, generated): feed `fed` forced tokens in one call and
    generate `generated` tokens one by one (greedy, KV cache)."""
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    for fed, generated in steps:
        if fed:
            forced = torch.randint(100, 1000, (prompt.shape[0], fed), device=prompt.device)
            tok = (
                model(input_ids=forced, cache=cache, use_cache=True, logits_to_keep=1)
                .logits[:, -1]
                .argmax(-1, keepdim=True)
            )
        for _ in range(generated):
            tok = (
                model(input_ids=tok, cache=cache, use_cache=True, logits_to_keep=1)
                .logits[:, -1]
                .argmax(-1, keepdim=True)
            )


def timed(fn, device, repeats: int) -> tuple[float, float, float]:
    """(median s, p90 s, peak allocator MB above the start) over `repeats` calls."""
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.type == "cuda" else float("nan")
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))], peak


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="qwen2-vl-2b,qwen2-vl-7b")
    ap.add_argument("--tiny", action="store_true", help="a tiny config (smoke test)")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(0)
    sizes = ["tiny"] if args.tiny else args.sizes.split(",")
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "doc_tokens": DOC_TOKENS,
        "fields": FIELDS,
        "runs": [],
    }
    print({k: v for k, v in result.items() if k != "runs"}, flush=True)
    value_tokens = sum(v for v, _ in FIELDS.values())
    forced_steps = [(HEADER, v + 1) for v, _ in FIELDS.values()]  # header fed, value + end generated
    free_steps = [(0, len(FIELDS) * (HEADER + 1) + value_tokens + 1)]  # headers, values, ends, eos
    for size in sizes:
        cfg = AutoConfig.for_model("qwen2", **SIZES[size], max_position_embeddings=4096, tie_word_embeddings=False)
        t0 = time.perf_counter()
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa").eval()
        params = sum(p.numel() for p in model.parameters())
        print(f"{size}: {params / 1e9:.2f}B parameters, built in {time.perf_counter() - t0:.1f} s", flush=True)
        for batch in [int(b) for b in args.batch.split(",")]:
            ids, block, slots = pip_inputs(batch, cfg.vocab_size, device, g)
            prompt = ids[:, : DOC_TOKENS + KEY_LIST]
            methods = {
                "floor": lambda: floor(model, ids, block, slots),
                "pip": lambda: pip(model, ids, block, slots),
                "pip-mask": lambda: pip(model, ids, block, slots, "mask"),
                "pip-split": lambda: pip(model, ids, block, slots, "split"),
                "ar-forced": lambda: ar(model, prompt, forced_steps),
                "ar-free": lambda: ar(model, prompt, free_steps),
            }
            rows = {}
            model.set_attn_implementation(PIP_SDPA)  # the same as sdpa for every call but `pip`'s
            # bf16: the two kernels round differently, so near-ties may flip; report the agreement
            same = (pip(model, ids, block, slots) == pip(model, ids, block, slots, "mask")).float().mean().item()
            print(f"  {size} batch {batch}: pip and pip-mask argmax agree on {same:.1%} of slots", flush=True)
            for name, fn in methods.items():
                fn()  # warm-up
                med, p90, peak = timed(fn, device, args.repeats)
                rows[name] = dict(median_s_per_doc=med / batch, p90_s_per_doc=p90 / batch, peak_alloc_mb=peak)
                print(
                    f"  {size} batch {batch} {name:<10} {med / batch * 1000:9.2f} ms/doc  p90 {p90 / batch * 1000:9.2f}"
                    f"  peak +{peak:.0f} MB",
                    flush=True,
                )
            ratios = {
                "speedup_vs_ar_free": rows["ar-free"]["median_s_per_doc"] / rows["pip"]["median_s_per_doc"],
                "speedup_vs_ar_forced": rows["ar-forced"]["median_s_per_doc"] / rows["pip"]["median_s_per_doc"],
                "floor_ratio": rows["pip"]["median_s_per_doc"] / rows["floor"]["median_s_per_doc"],
            }
            print(f"  {size} batch {batch} ratios " + "  ".join(f"{k} {v:.2f}" for k, v in ratios.items()), flush=True)
            result["runs"].append(
                dict(
                    size=size,
                    parameters=params,
                    batch=batch,
                    methods=rows,
                    ratios=ratios,
                    pip_agrees_with_pip_mask=same,
                )
            )
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
