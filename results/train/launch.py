import sys
from pipkie.train.config import TrainConfig
from pipkie.train.finetune import finetune
obj = sys.argv[1]
extra = dict(slot_tokens=64, field_blocks=True) if obj == "pip" else {}
cfg = TrainConfig(objective=obj, output_dir=f"runs/smollm2-{obj}", steps=200, batch_size=4, lr=4e-4, warmup=20,
                  templates_per_doc=2, threads=1, checkpoint_every=20,
                  budgets={"company": 24, "date": 12, "address": 64, "total": 10}, **extra)
print(finetune(cfg))
