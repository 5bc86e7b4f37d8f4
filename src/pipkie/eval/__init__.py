"""Measuring: scores, evaluation runs, speed benchmarks, calibration, paired comparisons.

- `metrics`: ANLS, exact match, F1 per key; items matched one-to-one (`ItemScores`).
- `evaluate`: `pipkie evaluate` (decode a labelled split, score it, resume under the same settings).
- `gold`: documents and their gold values for evaluation (key maps, lists of items, warnings).
- `store`: prediction files and the fingerprints that decide whether a run may resume.
- `calibration`: reliability diagrams and expected calibration error of the confidences; the
  confidence map (temperature of the log-confidence) that `pipkie calibrate` fits and models carry.
- `compare`: `pipkie compare`, paired bootstrap intervals between two prediction files.
- `bench`, `bench_items`: `pipkie bench`, PIP vs AR speed side by side (and over the number of lines).
"""
