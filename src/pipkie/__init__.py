"""pipkie: key information extraction with parallel decoding (PIP)."""

__version__ = "0.1.0"

from pipkie.document import Document, Word  # noqa: E402
from pipkie.schema import Key, KeySchema  # noqa: E402


def __getattr__(name):  # the Extractor pulls in torch/transformers: import it lazily
    if name in ("Extractor", "Extraction"):
        from pipkie import extract

        return getattr(extract, name)
    raise AttributeError(name)


__all__ = ["Document", "Word", "Key", "KeySchema", "Extractor", "Extraction"]
