"""Compute precision at inference: float32, or the decoder's layers in bfloat16.

A PIP pass is a few large matrix products (a receipt with 20 line items: ~1,500 tokens at once),
which CPUs with bf16 units (AMX, AVX512-BF16) run about twice as fast in bfloat16; AR decoding at
batch 1 multiplies one row at a time, is bound by everything but the arithmetic, and gains nothing
(both measured in docs/RESULTS.md, "Template rows run by run, and bfloat16 layers"), with every dev
number within noise of float32's. So the default, `auto`, is bfloat16 where the CPU (inference runs
on the CPU) multiplies bf16 natively (`cpu_runs_bf16`: AMX or AVX512-BF16) and float32 elsewhere,
where PyTorch's generic bf16 kernels are many times slower; `--compute float32` reproduces
float32 numbers anywhere. The AR baseline loads in the PIP model's precision unless a benchmark gives
it its own (`pipkie bench --ar-compute`).

What changes under `bfloat16`: the transformer layers' weights are cast (half the memory), and the
embeddings' output is cast on its way into the first layer. What does not: the embeddings themselves
(tied to the LM head, whose own bf16 path, `pipkie.decoding.slot_head`, keeps float32 decisions),
the final norm (float32 weights, so the hidden states the LM head and the copy head read are float32),
and the copy head. Training always runs in float32 (with autocast where `pipkie.train.loop` says).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import torch

COMPUTE = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ENV = "PIPKIE_COMPUTE"  # the default when no --compute is given
AUTO = "auto"  # bfloat16 where the CPU runs it natively (`cpu_runs_bf16`), else float32


def cpu_runs_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU (or the one `cpuinfo`, /proc/cpuinfo's text, describes) runs bf16 matmuls
    natively: AVX512-BF16 or AMX. Elsewhere (an AVX2 CPU) PyTorch falls back to a generic gemm: a
    SmolLM2 LoRA step took over 11 minutes instead of ~60 s in float32 (session 13, 2 threads)."""
    if cpuinfo is None:
        return _cpu_runs_bf16_here()
    return bool(set(cpuinfo.split()) & {"avx512_bf16", "amx_bf16"})


@cache
def _cpu_runs_bf16_here() -> bool:
    try:
        return cpu_runs_bf16(Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux: trust PyTorch's own reading of the CPU
        return "AVX512" in torch.backends.cpu.get_cpu_capability()


def bf16_is_fast() -> bool:
    """Whether training's autocast should run in bf16 (`pipkie.train.loop`): on a CUDA device that
    supports it, else where `cpu_runs_bf16`. Inference runs on the CPU and asks `cpu_runs_bf16`."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return cpu_runs_bf16()


def resolve_compute(name: str | None = None) -> str:
    """The compute precision to use: `name`, else $PIPKIE_COMPUTE, else `auto` (bfloat16 where
    `cpu_runs_bf16`, else float32); "fp32" / "bf16" as well; ValueError for anything else."""
    raw = name or os.environ.get(ENV) or AUTO
    alias = {"fp32": "float32", "bf16": "bfloat16"}.get(raw.lower(), raw.lower())
    if alias == AUTO:
        return "bfloat16" if cpu_runs_bf16() else "float32"
    if alias not in COMPUTE:
        raise ValueError(f"unknown compute precision {raw!r}; choose one of {[AUTO, *sorted(COMPUTE)]}")
    return alias


def layers_of(model):
    """The decoder's stack of transformer layers, or None (vision-language models are left alone)."""
    if getattr(model.config, "sub_configs", None):
        return None
    decoder = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    return getattr(decoder, "layers", None)


def compute_of(model) -> str:
    """The precision `model`'s layers run in ("float32" or "bfloat16")."""
    layers = layers_of(model)
    if layers is None:
        return "float32"
    dtype = next(layers.parameters()).dtype
    return next((k for k, v in COMPUTE.items() if v == dtype), str(dtype))


def set_compute(model, compute: str | None = None) -> str:
    """Run `model`'s layers in `compute` (`resolve_compute`); returns the precision now in use.
    Idempotent; float32 undoes bfloat16 (at bfloat16's rounding: the weights were cast)."""
    compute = resolve_compute(compute)
    layers = layers_of(model)
    if layers is None:
        return "float32"
    dtype = COMPUTE[compute]
    layers.to(dtype)
    embed = model.get_input_embeddings()
    hook = getattr(embed, "_pipkie_compute_hook", None)
    if hook is not None:
        hook.remove()
        embed._pipkie_compute_hook = None
    if dtype != torch.float32:
        embed._pipkie_compute_hook = embed.register_forward_hook(lambda _m, _i, out: out.to(dtype))
    return compute
