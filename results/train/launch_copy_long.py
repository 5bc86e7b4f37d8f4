"""PIP-copy, extended: the 140-step run of launch_copy.py resumed from its final checkpoint with the
cosine schedule stretched to STEPS (default 240). Same data stream (batches are a function of the
step), same LoRA adapter and copy head; the learning rate re-enters the cosine at step 140 (1.6e-4).

    cp -r runs/smollm2-pipcopy runs/smollm2-pipcopy-long && python results/train/launch_copy_long.py 240
"""
import sys

from pipkie.train.config import TrainConfig
from pipkie.train.finetune import finetune

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 240
cfg = TrainConfig(objective="pip", output_dir="runs/smollm2-pipcopy-long", steps=steps, batch_size=4, lr=4e-4,
                  warmup=15, templates_per_doc=2, threads=1, checkpoint_every=10, slot_tokens=64, field_blocks=True,
                  head_lr=1e-3, copy_head=True, budgets={"company": 24, "date": 12, "address": 64, "total": 10})
print(finetune(cfg))
