"""Abstention: a value read with too little confidence answered as `unknown`.

The model answers `unknown` for a key only when it has learnt to (the copy head's absent score,
`pipkie.model.copyhead`); on receipts unlike its training data it still copies *something* for a key
the receipt does not have (a phone line for a missing address: docs/RESULTS.md "Generalist, seventh
round"). A value scored by ANLS earns nothing when it is wrong, and `unknown` earns everything when
the key is absent, so below some confidence answering `unknown` is the better bet. Where that
confidence lies depends on the model and on how often a key is missing from the documents it
reads, so it is fitted, per key, on the model's own labelled predictions (`pipkie abstain`,
`pipkie.eval.abstention`) and saved with the model (`Settings.abstention`).

`withhold` is what every decoder does last (`Decoder.__call__`, after snapping and types): a field
of a key with a threshold whose value's confidence is below it answers `unknown`, keeping its
confidence and, in `FieldResult.withheld`, the value it would have answered (so predictions can be
scored and thresholds refitted without decoding again). Keys without a threshold, and list items,
are left as they are. Plain Python: the schema and the CLI read it without torch.
"""

from __future__ import annotations

import math
from dataclasses import replace

METHOD = "confidence_below"


def check_abstention(spec: dict | None) -> dict | None:
    """`spec` when it is a usable abstention map ({"method", "thresholds": {key: t in [0, 1]}, ...}),
    None for none; ValueError saying what is wrong otherwise."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("method") != METHOD:
        raise ValueError(f"abstention: expected {{'method': {METHOD!r}, 'thresholds': {{key: t}}}}, got {spec!r}")
    ts = spec.get("thresholds")
    if not isinstance(ts, dict):
        raise ValueError(f"abstention: thresholds must be an object of key -> number, got {ts!r}")
    for k, t in ts.items():
        ok = isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and 0 <= t <= 1
        if not isinstance(k, str) or not ok:
            raise ValueError(f"abstention: threshold of {k!r} must be a number in [0, 1], got {t!r}")
    return spec


def thresholds(spec: dict | None) -> dict[str, float]:
    """A map's thresholds, key -> confidence below which its value is withheld ({} for none)."""
    return dict(spec["thresholds"]) if spec else {}


def withhold(pred: dict, below: dict[str, float] | None) -> dict:
    """One document's results with each thresholded key's value below its threshold made unknown
    (`FieldResult.withheld` keeps it)."""
    if not below:
        return pred
    out = dict(pred)
    for k, t in below.items():
        r = out.get(k)
        if getattr(r, "value", None) is not None and r.confidence < t:  # (an ItemsResult has no single value)
            out[k] = replace(r, value=None, truncated=False, withheld=r.value)
    return out
