"""The training loop shared by both stages: resumable, logged, deterministic.

- Batches are a pure function of (seed, step): a run killed and restarted from its last checkpoint
  sees exactly the batches it would have seen, so its loss curve continues unchanged.
- A checkpoint (`output_dir/checkpoint/`) holds the trainable weights, optimizer, scheduler and
  step; it is written to a temporary directory and renamed, so a kill never leaves half of one.
- `output_dir/log.jsonl`: one line per logged step (step, loss, lr, tokens, seconds, tokens/s).
- The finished model is saved with `save_pretrained` (full model, or LoRA adapter + tokenizer)
  plus `pipkie.json`, and loads with `pipkie.model.modeling.load_model`.
- accelerate places model and batches (CPU here; the same code runs on GPUs) and runs bf16
  autocast when `bf16` is set.
- Several processes (`accelerate launch` / `torchrun`; configs/accelerate/): `batch_size` stays the
  global batch. Every process builds the same batch of step s (a pure function of seed and step)
  and takes its own contiguous slice of rows (`shard`); each process's loss is its share of the
  global per-token mean (its summed loss x processes / all processes' target count), and the
  trainable parameters' gradients are averaged over processes after each backward (one
  all-reduce of all of them, flattened). So N processes take the same steps as one process with
  the same global batch, up to float rounding. The gradients are averaged here rather than by
  DDP's wrapper because the copy head runs outside the model's forward and a process's rows may
  not use it in a step, which DDP's reducer does not allow. Under an FSDP config
  (configs/accelerate/fsdp-8gpu.yaml) accelerate shards the model instead and FSDP reduces the
  gradients. Only the main process writes logs, checkpoints and the model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator, DistributedType
from tqdm.auto import tqdm
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from pipkie.model.attention import build_attention_mask
from pipkie.model.copyhead import field_nll, get_head
from pipkie.model.precision import bf16_is_fast
from pipkie.train.config import TrainConfig
from pipkie.train.instances import padded_width

CKPT = "checkpoint"


def trainable_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def forward_batch(model, batch: dict, pattern: str, hidden: bool = False):
    """(logits at the `keep` positions (N, V), final hidden states or None, index (B, T) -> row of
    the logits) for a training batch."""
    mask = build_attention_mask(
        model,
        pattern,
        batch["attention_mask"],
        query_length=batch["input_ids"].shape[1],
        block_ids=batch["block_ids"],
        position_ids=batch["position_ids"],
    )
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=mask,
        position_ids=batch["position_ids"],
        logits_to_keep=batch["keep"],
        use_cache=False,
        output_hidden_states=hidden,
    )
    keep = batch["keep"]
    index = (keep.flatten().cumsum(0) - 1).view(keep.shape)
    return out.logits.reshape(-1, out.logits.shape[-1]).float(), out.hidden_states[-1] if hidden else None, index


def loss_on_batch(model, batch: dict, pattern: str, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy at the `keep` positions only (logits are computed nowhere else); with a copy
    head (`copy_fields` in the batch), the negative log-likelihood of the generate/copy mixture.
    `reduction`: "mean" over the kept positions, or their "sum"."""
    fields = batch.get("copy_fields")
    logits, hidden, index = forward_batch(model, batch, pattern, hidden=bool(fields))
    if not fields:
        return F.cross_entropy(logits, batch["targets"], reduction=reduction)
    losses = F.cross_entropy(logits, batch["targets"], reduction="none")  # (N,) at every kept position
    head = get_head(model)
    rows = [index[f.row, f.slots] for f in fields]
    nll = torch.cat([field_nll(head, hidden, logits[r], f) for r, f in zip(rows, fields)])
    losses = losses.index_put((torch.cat(rows),), nll)  # a copy field's slots: the mixture's NLL instead
    return losses.sum() if reduction == "sum" else losses.mean()


def take_rows(batch: dict, lo: int, hi: int) -> dict:
    """Rows lo..hi of a batch: row tensors sliced, the flat `targets` cut where those rows' kept
    positions are, copy fields kept for those rows and renumbered."""
    rows = batch["input_ids"].shape[0]
    kept = torch.cat([torch.zeros(1, dtype=torch.long), batch["keep"].sum(1).cumsum(0)])
    out = {
        k: v[lo:hi] if torch.is_tensor(v) and v.dim() and v.shape[0] == rows and k != "targets" else v
        for k, v in batch.items()
    }
    out["targets"] = batch["targets"][kept[lo] : kept[hi]]
    if "copy_fields" in batch:
        out["copy_fields"] = [dataclasses.replace(f, row=f.row - lo) for f in batch["copy_fields"] if lo <= f.row < hi]
    return out


def shard(batch: dict, rank: int, world: int) -> dict:
    """Process `rank`'s contiguous slice of the rows of a global batch (all of it when world == 1)."""
    if world == 1:
        return batch
    rows = batch["input_ids"].shape[0]
    if rows < world:
        raise ValueError(f"batch_size {rows} is smaller than the {world} processes: each needs a row")
    return take_rows(batch, rank * rows // world, (rank + 1) * rows // world)


def micro_batches(batch: dict, size: int, multiple: int = 64):
    """The batch in slices of `size` rows (all of it when size is 0 or covers it), each cut to the
    width its own rows need (rounded up to `multiple`, as `collate` does): gradient accumulation
    with less padding and a peak memory of `size` rows instead of the whole batch."""
    rows = batch["input_ids"].shape[0]
    if not size or size >= rows:
        yield batch
        return
    for lo in range(0, rows, size):
        part = take_rows(batch, lo, min(rows, lo + size))
        width = part["attention_mask"].shape[1]
        need = padded_width(int(part["attention_mask"].sum(1).max()), multiple)
        if need < width:
            part = {
                k: v[:, :need] if torch.is_tensor(v) and v.dim() == 2 and v.shape[1] == width else v
                for k, v in part.items()
            }
        yield part


def average_gradients(params: list[torch.Tensor], world: int) -> None:
    """Average the gradients of `params` over the `world` processes (one flattened all-reduce)."""
    if world == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.flatten().float() for g in grads])
    torch.distributed.all_reduce(flat)
    flat /= world
    for p, g in zip(params, flat.split([g.numel() for g in grads])):
        p.grad = g.view_as(p).to(p.dtype)


def train(
    cfg: TrainConfig, model, make_batch: Callable[[int], dict], *, save: Callable[[Path], None], pattern: str
) -> dict:
    """Run `cfg.steps` optimisation steps (resuming if a checkpoint exists); return a summary."""
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    bf16 = cfg.bf16 and bf16_is_fast()
    if cfg.bf16 and not bf16:
        warnings.warn(
            "bf16 autocast off: this CPU has no native bf16 (AVX512-BF16/AMX), where it runs ~15x slower", stacklevel=2
        )
    accel = Accelerator(mixed_precision="bf16" if bf16 else "no", cpu=not torch.cuda.is_available())
    params = [p for p in model.parameters() if p.requires_grad]
    head = get_head(model)
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    groups = [dict(params=[p for p in params if id(p) not in head_ids], lr=cfg.lr)]
    if head_ids:
        absent = {id(p) for p in head.absent_parameters()} if cfg.absent_lr else set()
        groups.append(dict(params=[p for p in params if id(p) in head_ids - absent], lr=cfg.head_lr))
        if absent:
            groups.append(dict(params=[p for p in params if id(p) in absent], lr=cfg.absent_lr))
    opt = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
    if cfg.schedule == "cosine":
        sched = get_cosine_schedule_with_warmup(opt, cfg.warmup, cfg.steps)
    elif cfg.schedule == "constant":
        sched = get_constant_schedule_with_warmup(opt, cfg.warmup)
    else:
        raise ValueError(f"unknown schedule {cfg.schedule!r} (cosine or constant)")
    if accel.num_processes == 1 or accel.distributed_type == DistributedType.FSDP:
        model, opt = accel.prepare(model, opt)  # placed (FSDP: sharded, and FSDP reduces the gradients)
        params = [p for p in model.parameters() if p.requires_grad]
    else:  # data parallel, the gradients averaged in _loop (see the module docstring)
        model = model.to(accel.device)
        for t in [*model.parameters(), *model.buffers()]:  # every process starts from rank 0's weights
            torch.distributed.broadcast(t.data, src=0)
        opt = accel.prepare_optimizer(opt, device_placement=False)
    start, elapsed = 0, 0.0
    ckpt = out_dir / CKPT
    if (ckpt / "state.pt").exists():
        state = torch.load(ckpt / "state.pt", weights_only=False)
        missing = accel.unwrap_model(model).load_state_dict(state["weights"], strict=False)
        assert not missing.unexpected_keys, missing.unexpected_keys
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start, elapsed = state["step"], state.get("elapsed", 0.0)
        print(f"resumed from {ckpt} at step {start}", flush=True)
    main = accel.is_main_process
    if main:
        (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    model.train()
    with open(out_dir / "log.jsonl", "a") if main else open(os.devnull, "w") as log:
        loss_ema, elapsed = _loop(cfg, model, opt, sched, accel, params, make_batch, pattern, log, start, elapsed)
    model.eval()
    accel.wait_for_everyone()
    summary = dict(
        steps=cfg.steps, train_seconds=round(elapsed, 1), final_loss_ema=loss_ema, processes=accel.num_processes
    )
    if main:
        save(out_dir / "model")
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    accel.wait_for_everyone()
    return summary


def _loop(cfg, model, opt, sched, accel, params, make_batch, pattern, log, start, elapsed):
    out_dir, ckpt = Path(cfg.output_dir), Path(cfg.output_dir) / CKPT
    bar = tqdm(
        range(start, cfg.steps),
        initial=start,
        total=cfg.steps,
        desc=f"{cfg.objective}",
        mininterval=5,
        disable=not accel.is_main_process,
    )
    world, loss_ema = accel.num_processes, None
    for step in bar:
        t0 = time.time()
        full = make_batch(step)
        local = shard(full, accel.process_index, world)
        parts = list(micro_batches(local, cfg.micro_batch))
        total = torch.zeros(())
        for part in parts:
            part = {k: v.to(accel.device) if torch.is_tensor(v) else v for k, v in part.items()}
            with accel.autocast():
                if world == 1 and len(parts) == 1:
                    loss = loss_on_batch(model, part, pattern)
                else:  # this slice's share of the global batch's per-token mean: the gradients add up
                    loss = loss_on_batch(model, part, pattern, reduction="sum") * (world / full["targets"].numel())
            accel.backward(loss)
            total = total + loss.detach().float().cpu()
        # what is logged: the global batch's mean, as one process computes it
        loss_value = (
            total.item() if world == 1 else accel.reduce(total.to(accel.device), reduction="sum").item() / world
        )
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss is {loss_value} at step {step}; last checkpoint kept in {ckpt}")
        if accel.distributed_type != DistributedType.FSDP:
            average_gradients(params, world)
        if cfg.grad_clip:
            accel.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        dt = time.time() - t0
        elapsed += dt
        tokens = int(full["attention_mask"].sum())
        loss_ema = loss_value if loss_ema is None else 0.9 * loss_ema + 0.1 * loss_value
        bar.set_postfix(loss=f"{loss_ema:.3f}", tok_s=f"{tokens / dt:.0f}")
        if (step + 1) % cfg.log_every == 0:
            log.write(
                json.dumps(
                    dict(
                        step=step + 1,
                        loss=round(loss_value, 5),
                        lr=sched.get_last_lr()[0],
                        tokens=tokens,
                        targets=int(full["keep"].sum()),
                        sec=round(dt, 3),
                        tok_per_sec=round(tokens / dt, 1),
                        elapsed=round(elapsed, 1),
                    )
                )
                + "\n"
            )
            log.flush()
        if ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps) and accel.is_main_process:
            tmp = out_dir / (CKPT + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            torch.save(
                dict(
                    weights=trainable_state(accel.unwrap_model(model)),
                    optimizer=opt.state_dict(),
                    scheduler=sched.state_dict(),
                    step=step + 1,
                    elapsed=elapsed,
                ),
                tmp / "state.pt",
            )
            shutil.rmtree(ckpt, ignore_errors=True)
            tmp.rename(ckpt)
    return loss_ema, elapsed
