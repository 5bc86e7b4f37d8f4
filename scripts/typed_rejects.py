"""An AR predictions file with its keys typed: values not of their type become unknown.

    python scripts/typed_rejects.py results/dev/wr-sroie-ar-forced-r4.predictions.jsonl \
        date=date,total=money results/dev/wr-sroie-typed-ar-forced-r4.predictions.jsonl

Every decoder applies exactly this rule last, after snapping (`pipkie.decoding.types.reject_untyped`,
in `Decoder.__call__`), so a typed AR run equals its untyped run with the rule applied: this
writes it without decoding again (score it with `pipkie compare`).
"""

import json
import sys

from pipkie.decoding.types import check_type, reject


def main(src: str, types: str, dst: str) -> None:
    kinds = {k: check_type(t) for k, _, t in (p.partition("=") for p in types.split(","))}
    with open(src) as f, open(dst, "w") as out:
        for line in f:
            r = json.loads(line)
            r["pred"] = {k: reject(kinds.get(k), v) for k, v in r["pred"].items()}
            r["run"] = f"{r.get('run')}+typed:{types}"
            out.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
