"""`pipkie finetune` under `accelerate launch` with 2 CPU processes (gloo) takes the same steps as one
process with the same global batch: the logged loss of every step agrees to float rounding.

A tiny compact model (2 layers, 64 wide, its own BPE tokenizer) with a copy head, on synthetic
receipts (nothing downloaded, no shared data), 4 steps of a global batch of 4 (2 rows per process).
`--multi_gpu` is accelerate's switch for its torchrun launcher; on a machine without GPUs the
processes run on the CPU and talk over gloo (MULTI_CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(
    objective="pip",
    base="compact",
    compact=dict(arch="qwen2", hidden=64, layers=2, heads=4, ffn=128),
    tokenizer_vocab=500,
    lora_r=0,
    dataset="",
    synthetic=8,
    steps=4,
    batch_size=4,
    lr=2e-3,
    warmup=1,
    threads=1,
    bf16=False,
    checkpoint_every=100,
    max_length=384,
    slot_tokens=4,
    field_blocks=True,
    copy_head=True,
    budgets={"company": 8, "date": 6, "address": 12, "total": 5},
)
# Relative difference allowed between the two runs' loss at each step: float rounding of sums taken
# in another order (per process, then across processes), carried through 4 AdamW steps.
TOLERANCE = 1e-4


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


def test_two_processes_take_the_steps_of_one_with_the_same_global_batch(tmp_path):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(CONFIG))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    finetune = ["-m", "pipkie.cli", "finetune", "--config", str(config)]
    one = subprocess.run(
        [sys.executable, *finetune, "--output-dir", str(tmp_path / "one")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    two = subprocess.run(
        [*launch, *finetune, "--output-dir", str(tmp_path / "two")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["processes"] == 2
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(a) == len(b) == CONFIG["steps"]
    assert b == pytest.approx(a, rel=TOLERANCE)
    assert a[0] != a[-1]  # it trained
    assert (tmp_path / "two" / "model" / "pipkie.json").exists()


def test_micro_batches_take_the_steps_of_the_whole_batch(tmp_path):
    """Gradient accumulation over slices of 1 row (each cut to its own width) takes the same steps
    as the whole batch at once, and its slices are the batch's rows."""
    import torch

    from pipkie.train.config import TrainConfig
    from pipkie.train.finetune import finetune
    from pipkie.train.loop import micro_batches

    runs = {}
    for micro in (0, 1):
        out = tmp_path / f"micro{micro}"
        finetune(TrainConfig(**{**CONFIG, "micro_batch": micro, "output_dir": str(out)}))
        runs[micro] = losses(out)
    assert len(runs[1]) == CONFIG["steps"] and runs[1] == pytest.approx(runs[0], rel=TOLERANCE)

    keep = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    batch = dict(
        input_ids=torch.arange(12).view(3, 4),
        attention_mask=torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]),
        keep=keep,
        targets=torch.tensor([10, 11, 20, 30, 31, 32]),
    )
    parts = list(micro_batches(batch, 2, multiple=2))
    assert [p["input_ids"].tolist() for p in parts] == [[[0, 1], [4, 5]], [[8, 9, 10, 11]]]
    assert [p["targets"].tolist() for p in parts] == [[10, 11, 20], [30, 31, 32]]
    assert list(micro_batches(batch, 0)) == [batch]
