"""Copy a trained pipkie model directory into models/ (the shipped default) and check its size."""

import shutil
import sys
from pathlib import Path

src, dst = Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else "models/pipkie-sroie")
keep = {"adapter_model.safetensors", "adapter_config.json", "model.safetensors", "config.json",
        "generation_config.json", "tokenizer.json", "tokenizer_config.json", "pipkie.json", "copy_head.safetensors", "headfit.json"}
dst.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.name in keep:
        shutil.copy2(f, dst / f.name)
size = sum(f.stat().st_size for f in dst.iterdir()) / 2**20
print(f"{dst}: {size:.1f} MB")
if size > 60:
    sys.exit(f"too large to ship ({size:.1f} MB > 60 MB)")
