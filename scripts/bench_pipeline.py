"""Files per minute of `pipkie extract --out` on receipt photos: OCR alone, model alone, serial, pipelined.

    PYTHONPATH=src python scripts/bench_pipeline.py --workers 1 --threads 1 --json results/bench-pipeline.json
    PYTHONPATH=src python scripts/bench_pipeline.py --limit 3                     # a smoke test

The same `--limit` files (the first ones, sorted, of `--data`: WildReceipt photos without labels)
go through four runs in one process, one after the other:
- `ocr`: every file loaded and OCR'd in this process (`pipkie.load_document`), nothing decoded;
- `model`: the documents of the `ocr` run decoded with the model (`pipeline.decode_documents`:
  the same length batches), no OCR;
- `serial`: `pipeline.extract_files(workers=0)`: each window OCR'd here, then decoded;
- `pipelined`: `pipeline.extract_files(workers=N)`: N OCR processes run ahead of the model.
The OCR engine and the model are loaded (and run once) before any timing; the pipelined run's time
includes starting its worker processes and their OCR engines, as a real run's does. A pipeline can
at best hide the faster stage behind the slower one, so the report gives, besides files/min,
`pipelined / serial` (the speed-up) and `pipelined / ideal`, where ideal is the slower of `ocr`
and `model` alone. Threads: `--threads` torch threads for the model, `--ocr-threads` ONNX Runtime
threads per OCR process; on a 2-core machine `--threads 1 --ocr-threads 1 --workers 1` puts one
stage on each core. The rapidocr settings that bound OCR time can be changed (`--max-side`,
`--det-side`, `--det-limit-type`, `--no-cls`, `--rec-batch`; defaults: rapidocr's own).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "wildreceipt_unlabeled" / "image_files"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="folder of images (searched recursively)")
    ap.add_argument("--limit", type=int, default=40, help="files timed (the first ones, sorted)")
    ap.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    ap.add_argument("--keys", default=None, help="comma-separated keys (default: the model's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the model")
    ap.add_argument("--ocr-threads", type=int, default=1, help="ONNX Runtime threads per OCR process")
    ap.add_argument("--workers", type=int, default=1, help="OCR processes of the pipelined run")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--window", type=int, default=None, help="files per length-sorting window (default 2 batches)")
    ap.add_argument("--max-side", type=int, default=None, help="rapidocr Global.max_side_len (its default 2000)")
    ap.add_argument("--det-side", type=int, default=None, help="rapidocr Det.limit_side_len (its default 736)")
    ap.add_argument("--det-limit-type", choices=("min", "max"), default=None, help="rapidocr Det.limit_type (min)")
    ap.add_argument("--no-cls", action="store_true", help="skip rapidocr's text direction classifier")
    ap.add_argument("--rec-batch", type=int, default=None, help="rapidocr Rec.rec_batch_num (its default 6)")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import torch

    from pipkie import Extractor, KeySchema, load_document
    from pipkie.pipeline import configure_ocr, decode_documents, expand_inputs, extract_files

    torch.set_num_threads(args.threads)
    files = expand_inputs([args.data])[: args.limit]
    if not files:
        sys.exit(f"no images under {args.data}")
    options = dict(
        max_side=args.max_side,
        det_side=args.det_side,
        det_limit_type=args.det_limit_type,
        use_cls=False if args.no_cls else None,
        rec_batch=args.rec_batch,
    )
    options = {k: v for k, v in options.items() if v is not None}
    ex = Extractor.from_pretrained(args.model, threads=args.threads)
    schema = KeySchema.parse(args.keys) if args.keys else None
    configure_ocr(ex.ocr, options)
    warm = load_document(files[0], ocr=ex.ocr, threads=args.ocr_threads)  # engine and model loaded, run once
    decode_documents(ex, [warm], schema=schema)
    print(
        f"threads: torch={torch.get_num_threads()} ocr={args.ocr_threads} per process, workers={args.workers}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, cpus={os.cpu_count()}; files: {len(files)}; "
        f"ocr options: {options or 'rapidocr defaults'}",
        flush=True,
    )

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    docs = []
    for f in files:
        try:
            docs.append(load_document(f, ocr=ex.ocr, threads=args.ocr_threads))
        except Exception as e:  # counted as done, as the pipeline counts an error row
            print(f"ocr: {f}: {e}", file=sys.stderr)
    seconds["ocr"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    window = args.window or 2 * args.batch_size  # the pipeline's windows, so the same batches
    for i in range(0, len(docs), window):
        decode_documents(ex, docs[i : i + window], schema=schema, batch_size=args.batch_size)
    seconds["model"] = time.perf_counter() - t0

    errors, values = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, workers in (("serial", 0), ("pipelined", args.workers)):
            t0 = time.perf_counter()
            outcomes = list(
                extract_files(
                    ex,
                    files,
                    schema=schema,
                    batch_size=args.batch_size,
                    window=args.window,
                    workers=workers,
                    ocr_threads=args.ocr_threads,
                    ocr_options=options,
                    out=Path(tmp) / f"{name}.jsonl",
                    progress=False,
                )
            )
            seconds[name] = time.perf_counter() - t0
            errors[name] = sum(o.error is not None for o in outcomes)
            values[name] = {str(o.file): o.result.values() if o.result else o.error for o in outcomes}

    per_min = {k: round(60 * len(files) / v, 2) for k, v in seconds.items()}
    ideal = max(seconds["ocr"], seconds["model"])
    report = dict(
        files=len(files),
        data=str(args.data),
        model=ex.name,
        batch_size=args.batch_size,
        window=args.window,
        threads=dict(
            torch=args.threads,
            ocr_per_process=args.ocr_threads,
            workers=args.workers,
            omp=os.environ.get("OMP_NUM_THREADS"),
            cpus=os.cpu_count(),
        ),
        ocr_options=options,
        seconds={k: round(v, 2) for k, v in seconds.items()},
        files_per_min=per_min,
        errors=errors,
        same_values=values["serial"] == values["pipelined"],  # every file's extracted values
        ratios={
            "pipelined/serial": round(seconds["serial"] / seconds["pipelined"], 3),
            "pipelined/ideal": round(ideal / seconds["pipelined"], 3),
            "ocr share of serial": round(seconds["ocr"] / seconds["serial"], 3),
        },
    )
    for k, v in per_min.items():
        print(f"{k:>10}: {v:8.2f} files/min  ({seconds[k]:.1f} s)")
    print("ratios: " + ", ".join(f"{k} {v}" for k, v in report["ratios"].items()))
    print(f"serial and pipelined values identical: {report['same_values']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
