"""pipkie: key information extraction with parallel decoding (PIP)."""

__version__ = "0.1.0"

from pipkie.io.document import Document, Word  # noqa: E402
from pipkie.schema import Key, KeySchema  # noqa: E402

_LAZY = {  # name -> module: these pull in torch/transformers or OCR engines, so they are imported on first use
    "Extractor": "pipkie.extract",
    "Extraction": "pipkie.extract",
    "Field": "pipkie.extract",
    "load_document": "pipkie.io.loaders",
    "DocumentError": "pipkie.io.loaders",
    "OCREngineError": "pipkie.io.ocr",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipkie' has no attribute {name!r}")


__all__ = ["Document", "Word", "Key", "KeySchema", *_LAZY]
