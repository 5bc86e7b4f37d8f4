"""PIP-copy run: SmolLM2-135M + LoRA r=32, slot tokens, field blocks and the copy head (pipkie.copyhead)."""
import sys

from pipkie.train.config import TrainConfig
from pipkie.train.finetune import finetune

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 180
cfg = TrainConfig(objective="pip", output_dir="runs/smollm2-pipcopy", steps=steps, batch_size=4, lr=4e-4, warmup=15,
                  templates_per_doc=2, threads=1, checkpoint_every=10, slot_tokens=64, field_blocks=True, head_lr=1e-3,
                  copy_head=True, budgets={"company": 24, "date": 12, "address": 64, "total": 10})
print(finetune(cfg))
