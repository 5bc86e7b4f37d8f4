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
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from pipkie.model.attention import build_attention_mask
from pipkie.model.copyhead import field_nll, get_head
from pipkie.train.config import TrainConfig

CKPT = "checkpoint"


def trainable_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def forward_batch(model, batch: dict, pattern: str, hidden: bool = False):
    """(logits at the `keep` positions (N, V), final hidden states or None, index (B, T) -> row of
    the logits) for a training batch."""
    mask = build_attention_mask(model, pattern, batch["attention_mask"], query_length=batch["input_ids"].shape[1],
                                block_ids=batch["block_ids"], position_ids=batch["position_ids"])
    out = model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=batch["position_ids"],
                logits_to_keep=batch["keep"], use_cache=False, output_hidden_states=hidden)
    keep = batch["keep"]
    index = (keep.flatten().cumsum(0) - 1).view(keep.shape)
    return out.logits.reshape(-1, out.logits.shape[-1]).float(), out.hidden_states[-1] if hidden else None, index


def loss_on_batch(model, batch: dict, pattern: str) -> torch.Tensor:
    """Cross-entropy at the `keep` positions only (logits are computed nowhere else); with a copy
    head (`copy_fields` in the batch), the negative log-likelihood of the generate/copy mixture."""
    fields = batch.get("copy_fields")
    logits, hidden, index = forward_batch(model, batch, pattern, hidden=bool(fields))
    if not fields:
        return F.cross_entropy(logits, batch["targets"])
    losses = F.cross_entropy(logits, batch["targets"], reduction="none")  # (N,) at every kept position
    head = get_head(model)
    rows = [index[f.row, f.slots] for f in fields]
    nll = torch.cat([field_nll(head, hidden, logits[r], f) for r, f in zip(rows, fields)])
    return losses.index_put((torch.cat(rows),), nll).mean()  # a copy field's slots: the mixture's NLL instead


def train(cfg: TrainConfig, model, make_batch: Callable[[int], dict], *, save: Callable[[Path], None],
          pattern: str) -> dict:
    """Run `cfg.steps` optimisation steps (resuming if a checkpoint exists); return a summary."""
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    accel = Accelerator(mixed_precision="bf16" if cfg.bf16 else "no", cpu=not torch.cuda.is_available())
    params = [p for p in model.parameters() if p.requires_grad]
    head = get_head(model)
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    groups = [dict(params=[p for p in params if id(p) not in head_ids], lr=cfg.lr)]
    if head_ids:
        groups.append(dict(params=[p for p in params if id(p) in head_ids], lr=cfg.head_lr))
    opt = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
    if cfg.schedule == "cosine":
        sched = get_cosine_schedule_with_warmup(opt, cfg.warmup, cfg.steps)
    elif cfg.schedule == "constant":
        sched = get_constant_schedule_with_warmup(opt, cfg.warmup)
    else:
        raise ValueError(f"unknown schedule {cfg.schedule!r} (cosine or constant)")
    model, opt = accel.prepare(model, opt)
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
    (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    model.train()
    with open(out_dir / "log.jsonl", "a") as log:
        loss_ema, elapsed = _loop(cfg, model, opt, sched, accel, params, make_batch, pattern, log, start, elapsed)
    model.eval()
    save(out_dir / "model")
    summary = dict(steps=cfg.steps, train_seconds=round(elapsed, 1), final_loss_ema=loss_ema)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _loop(cfg, model, opt, sched, accel, params, make_batch, pattern, log, start, elapsed):
    out_dir, ckpt = Path(cfg.output_dir), Path(cfg.output_dir) / CKPT
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=f"{cfg.objective}", mininterval=5)
    loss_ema = None
    for step in bar:
        t0 = time.time()
        batch = {k: v.to(accel.device) if torch.is_tensor(v) else v for k, v in make_batch(step).items()}
        with accel.autocast():
            loss = loss_on_batch(model, batch, pattern)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss is {loss.item()} at step {step}; last checkpoint kept in {ckpt}")
        accel.backward(loss)
        if cfg.grad_clip:
            accel.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        dt = time.time() - t0
        elapsed += dt
        tokens = int(batch["attention_mask"].sum())
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        bar.set_postfix(loss=f"{loss_ema:.3f}", tok_s=f"{tokens / dt:.0f}")
        if (step + 1) % cfg.log_every == 0:
            log.write(json.dumps(dict(step=step + 1, loss=round(loss.item(), 5), lr=sched.get_last_lr()[0],
                                      tokens=tokens, targets=int(batch["keep"].sum()), sec=round(dt, 3),
                                      tok_per_sec=round(tokens / dt, 1), elapsed=round(elapsed, 1))) + "\n")
            log.flush()
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            tmp = out_dir / (CKPT + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            torch.save(dict(weights=trainable_state(accel.unwrap_model(model)), optimizer=opt.state_dict(),
                            scheduler=sched.state_dict(), step=step + 1, elapsed=elapsed), tmp / "state.pt")
            shutil.rmtree(ckpt, ignore_errors=True)
            tmp.rename(ckpt)
    return loss_ema, elapsed
