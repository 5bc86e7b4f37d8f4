"""AR baseline, extended to the PIP model's 240 steps: the 200-step run of `launch.py ar` resumed
from its final checkpoint with the cosine schedule stretched to STEPS (as launch_copy_long.py did
for PIP). Same data stream (batches are a function of the step), same LoRA adapter.

    cp -r runs/smollm2-ar runs/smollm2-ar-long && python results/train/launch_ar_long.py 240
"""
import sys

from pipkie.train.config import TrainConfig
from pipkie.train.finetune import finetune

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 240
cfg = TrainConfig(objective="ar", output_dir="runs/smollm2-ar-long", steps=steps, batch_size=4, lr=4e-4, warmup=20,
                  templates_per_doc=2, threads=1, checkpoint_every=10,
                  budgets={"company": 24, "date": 12, "address": 64, "total": 10})
print(finetune(cfg))
