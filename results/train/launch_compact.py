"""Compact track: a ~17M-parameter Qwen2-architecture model from a config, BPE tokenizer trained here.

    python results/train/launch_compact.py pretrain STEPS   # stage 1: masked reconstruction + span copy
    python results/train/launch_compact.py pip STEPS        # stage 2 from stage 1: PIP with the copy head
    python results/train/launch_compact.py ar STEPS         # stage 2 from stage 1: the AR baseline
"""
import sys

from pipkie.train.config import TrainConfig
from pipkie.train.finetune import finetune, pretrain

stage, steps = sys.argv[1], int(sys.argv[2])
common = dict(batch_size=8, threads=1, checkpoint_every=50, slot_tokens=64, field_blocks=True, copy_head=True,
              lora_r=0, budgets={"company": 24, "date": 12, "address": 64, "total": 10}, steps=steps, warmup=50)
if stage == "pretrain":
    cfg = TrainConfig(objective="mask", base="compact", output_dir="runs/compact-pre", lr=1e-3, synthetic=1000,
                      extra_text=["kleister_nda:../shared/data/kleister_nda"], pretrain_tasks=("mask", "copy", "copy"),
                      **common)
    print(pretrain(cfg))
else:
    cfg = TrainConfig(objective=stage, base="runs/compact-pre/model", output_dir=f"runs/compact-{stage}", lr=5e-4,
                      templates_per_doc=2, **common)
    print(finetune(cfg))
