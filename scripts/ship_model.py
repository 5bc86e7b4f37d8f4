"""Copy a trained pipkie model directory into models/ in bf16 and check its size.

    python scripts/ship_model.py ../runs/generalist-pip/model models/pipkie --ar-baseline ../pipkie-ar
    python scripts/ship_model.py ../runs/generalist-ar/model models/pipkie-ar

Floating-point tensors of the weight files (LoRA adapter, full weights, copy head) are stored in
bf16 (they load back into fp32 modules: inference runs in fp32); the rest is copied as is.
`--ar-baseline` records, in the shipped pipkie.json, the AR model trained the same way (a path
relative to the shipped directory), which `--decode ar-free|ar-forced` and `pipkie bench` use.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

WEIGHTS = {"adapter_model.safetensors", "model.safetensors", "copy_head.safetensors"}
KEEP = WEIGHTS | {
    "adapter_config.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "pipkie.json",
    "headfit.json",
}
LIMIT_MB = 60


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--ar-baseline", help="path of the AR baseline relative to DST (written into pipkie.json)")
    args = p.parse_args()
    if not (args.src / "pipkie.json").exists():
        sys.exit(f"{args.src} is not a pipkie model directory (no pipkie.json)")
    args.dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(args.src.iterdir()):
        if f.name not in KEEP:
            continue
        if f.name in WEIGHTS:
            with safe_open(f, "pt") as handle:
                metadata = handle.metadata() or {}  # e.g. the copy head's sizes
            tensors = load_file(f)
            save_file(
                {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()},
                args.dst / f.name,
                metadata={"format": "pt", **metadata},
            )
        else:
            shutil.copy2(f, args.dst / f.name)
    if args.ar_baseline:
        settings = json.loads((args.dst / "pipkie.json").read_text())
        settings["ar_baseline"] = args.ar_baseline
        (args.dst / "pipkie.json").write_text(json.dumps(settings, indent=2) + "\n")
    size = sum(f.stat().st_size for f in args.dst.iterdir()) / 2**20
    print(f"{args.dst}: {size:.1f} MB")
    if size > LIMIT_MB:
        sys.exit(f"too large to ship ({size:.1f} MB > {LIMIT_MB} MB)")


if __name__ == "__main__":
    main()
