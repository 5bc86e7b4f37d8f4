"""OCR engines: a page image in, words with pixel boxes and confidences out.

    engine = get_engine("rapidocr", threads=1)       # created once per (name, threads), then cached
    words = engine(image)                            # list[OCRWord], boxes in pixels of `image`
    doc_words = to_words(words, image.size, page=0)  # list[Word], boxes 0-1000

An engine is any callable `(PIL.Image.Image) -> list[OCRWord]` (the `OCREngine` protocol); the two
here also accept a path or the file's bytes. Engines load their models on the first call, not when
created, and `get_engine` caches them, so a service pays the load once.

- `RapidOCR` (default): rapidocr 3.x with the PP-OCR ONNX models shipped inside its wheel. The model
  paths are passed explicitly, so rapidocr's download code is never reached (no network at run
  time). ONNX Runtime gets `threads` intra-op threads and 1 inter-op thread (OpenCV gets `threads`
  too: a process-wide setting). Words come from rapidocr's word boxes (`return_word_box`); a line
  without them falls back to one word per line box. Lines rapidocr scores under `min_score` are
  dropped: 0.9, not rapidocr's 0.5, because on photographed receipts the lines it scores lower are
  mostly logos, stamps, dot rows and text showing through the paper read as characters (`本`,
  `*****`, `VT`), which the model then takes for the store name (docs/RESULTS.md "Lines the OCR
  engine doubts"); `set_engine_options("rapidocr", min_score=0.5)` keeps them. What its time goes
  into can be set (None, the default, keeps rapidocr's own value, so outputs do not change):
  `max_side` (an image's long side is scaled down to it before anything runs; rapidocr: 2000),
  `det_side` / `det_limit_type` (the detector's input: its shorter side scaled up to `det_side`
  under "min", its longer side down to it under "max"; rapidocr: 736, "min"), `use_cls` (the
  180-degree direction classifier run on every text line), `rec_batch` (text lines recognised per
  ONNX call). `set_engine_options` sets them for the engines a process creates from then on (e.g. in
  an OCR worker process).
- `Tesseract`: the `tesseract` binary (apt-get install tesseract-ocr tesseract-ocr-eng), run with
  `--psm 6` and OMP_THREAD_LIMIT=threads (unlimited OpenMP threads make it crawl on a busy machine).

Errors: `OCRError` (a ValueError) for an image that cannot be read or is larger than `max_pixels`
(`ImageTooLarge`, checked from the image header before anything is decoded: Pillow's own bomb
check only warns below 179 M pixels, and a 41 KB PNG can decode to 12000 x 12000); `OCREngineError`
(a RuntimeError) for an engine that is unknown, not installed (`unavailable=True`) or fails.
Each carries `reason` (what is wrong, for a client) and `detail` (the library's own message, for
the log).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol, Union

from PIL import Image, ImageOps

from pipkie.io.document import Word, normalize_box

ImageInput = Union[Image.Image, str, Path, bytes]

MAX_PIXELS = 40_000_000  # width x height of one page; a 40 M-pixel RGB page is 120 MB decoded


class OCRError(ValueError):
    """The image could not be read (missing, corrupt, unsupported, empty, too large).

    `reason`: what is wrong with the image, fit to show a client; `detail`: the decoder's message.
    """

    def __init__(self, message: str, reason: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.reason, self.detail = reason or message, detail


class ImageTooLarge(OCRError):
    """The image has more pixels than allowed (known from its header, before decoding)."""


class OCREngineError(RuntimeError):
    """The OCR engine is unknown or not installed (`unavailable`), or failed while running."""

    def __init__(self, message: str, unavailable: bool = True):
        super().__init__(message)
        self.unavailable = unavailable


def check_pixels(size: tuple[int, int], max_pixels: int | None, name: str = "<image>") -> None:
    """ImageTooLarge if a width x height `size` exceeds `max_pixels` (None: no limit)."""
    width, height = size
    if max_pixels is not None and width * height > max_pixels:
        reason = f"image is {width}x{height} = {width * height:,} pixels, more than the limit of {max_pixels:,}"
        raise ImageTooLarge(f"{name}: {reason}", reason)


@dataclass(frozen=True)
class OCRWord:
    """One recognised word: text, box (x0, y0, x1, y1) in pixels of the input image, confidence 0-1.

    `line` numbers the text line the engine found the word in (words of one line share it).
    """

    text: str
    box: tuple[float, float, float, float]
    confidence: float
    line: int = 0


class OCREngine(Protocol):
    name: str

    def __call__(self, image: Image.Image) -> list[OCRWord]: ...


def load_image(source: ImageInput, max_pixels: int | None = MAX_PIXELS) -> Image.Image:
    """An RGB, EXIF-upright copy of an image given as a PIL image, a path or bytes; OCRError if
    unreadable, ImageTooLarge (before decoding) if it has more than `max_pixels` pixels."""
    name = "<bytes>" if isinstance(source, bytes) else "<image>" if isinstance(source, Image.Image) else str(source)
    try:
        if isinstance(source, Image.Image):
            im = source
        elif isinstance(source, bytes):
            im = Image.open(io.BytesIO(source))
        else:
            im = Image.open(Path(source))
        check_pixels(im.size, max_pixels, name)  # the header is read; nothing is decoded yet
        im.load()  # Pillow decodes lazily: truncated or corrupt data fails here
        im = ImageOps.exif_transpose(im) or im
        if im.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit / float scans
            im = im.point(lambda v: v / 256).convert("L")
        im = im.convert("RGB")
    except FileNotFoundError:
        raise OCRError(f"{name}: no such file", "no such file") from None
    except OCRError:
        raise
    except Image.DecompressionBombError as e:  # Pillow's own limit, when max_pixels is above it
        raise ImageTooLarge(f"{name}: image is too large ({e})", "image is too large", str(e)) from e
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise OCRError(f"{name}: cannot read image ({e})", "cannot read image", str(e)) from e
    if im.width < 2 or im.height < 2:
        reason = f"image is empty ({im.width}x{im.height})"
        raise OCRError(f"{name}: {reason}", reason)
    return im


def _engine_limit(image: ImageInput) -> int | None:
    """An engine leaves the size policy to whoever decoded a PIL image (the loader); files and bytes
    it opens itself get the default limit."""
    return None if isinstance(image, Image.Image) else MAX_PIXELS


LINES_PER_PAGE = 100_000  # a document's engine lines are numbered page x this + the line on the page


def to_words(words: list[OCRWord], size: tuple[int, int], page: int = 0) -> list[Word]:
    """Document words (boxes 0-1000 on a page of `size` = (width, height) pixels), each with the
    engine's line, numbered apart per page (`LINES_PER_PAGE`) so a document's lines stay distinct."""
    w, h = size
    first = page * LINES_PER_PAGE
    return [Word(x.text, normalize_box(x.box, w, h), page, first + x.line) for x in words if x.text.strip()]


def _rect(points) -> tuple[float, float, float, float]:
    """Axis-aligned (x0, y0, x1, y1) of a list of [x, y] corners."""
    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points]
    return (min(xs), min(ys), max(xs), max(ys))


def check_min_score(engine: str, min_score: float | None) -> float | None:
    """`min_score` if `engine` takes it, else ValueError: only rapidocr scores its lines, from 0 to 1
    (`RapidOCR`). The one check behind the engine, the CLI options and the service's settings."""
    if min_score is None:
        return None
    if engine != "rapidocr":
        raise ValueError(f"only rapidocr takes a line-score threshold, not {engine!r}")
    if not 0 <= min_score <= 1:
        raise ValueError(f"min_score must lie in [0, 1], got {min_score}")
    return min_score


class RapidOCR:
    """rapidocr 3.x (PP-OCR det + cls + rec ONNX models from the wheel), word-level boxes."""

    name = "rapidocr"

    def __init__(
        self,
        threads: int = 1,
        word_boxes: bool = True,
        min_score: float = 0.9,
        *,
        max_side: int | None = None,
        det_side: int | None = None,
        det_limit_type: str | None = None,
        use_cls: bool | None = None,
        rec_batch: int | None = None,
    ):
        if threads < 1:
            raise ValueError("threads must be >= 1")
        if det_limit_type not in (None, "min", "max"):
            raise ValueError("det_limit_type must be 'min' or 'max'")
        check_min_score(self.name, min_score)
        self.threads, self.word_boxes, self.min_score = threads, word_boxes, min_score
        tuning = {
            "Global.max_side_len": max_side,
            "Det.limit_side_len": det_side,
            "Det.limit_type": det_limit_type,
            "Global.use_cls": use_cls,
            "Rec.rec_batch_num": rec_batch,
        }
        self.tuning = {k: v for k, v in tuning.items() if v is not None}  # only what differs from rapidocr's own
        self._ocr = None
        self._lock = threading.Lock()

    def _engine(self):
        if self._ocr is None:
            with self._lock:
                if self._ocr is None:
                    self._ocr = self._build()
        return self._ocr

    def _build(self):
        try:
            import cv2
            import rapidocr
        except ImportError as e:
            raise OCREngineError(f"rapidocr is not installed ({e}); pip install rapidocr onnxruntime") from e
        models = Path(rapidocr.__file__).parent / "models"
        # The default models of rapidocr 3.10; given by path so nothing is looked up or downloaded.
        paths = {
            "Det": models / "PP-OCRv6_det_small.onnx",
            "Cls": models / "ch_ppocr_mobile_v2.0_cls_mobile.onnx",
            "Rec": models / "PP-OCRv6_rec_small.onnx",
        }
        missing = [str(p) for p in paths.values() if not p.exists()]
        if missing:
            raise OCREngineError(f"rapidocr models not found in the installed wheel: {missing}")
        cv2.setNumThreads(self.threads)
        params = {
            "Global.log_level": "warning",
            "Global.text_score": self.min_score,
            "Global.return_word_box": self.word_boxes,
            "EngineConfig.onnxruntime.intra_op_num_threads": self.threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
            **{f"{task}.model_path": str(p) for task, p in paths.items()},
            **self.tuning,
        }
        try:
            return rapidocr.RapidOCR(params=params)
        except Exception as e:  # rapidocr raises many types on bad installs
            raise OCREngineError(f"cannot start rapidocr: {e}") from e

    def __call__(self, image: ImageInput) -> list[OCRWord]:
        im = load_image(image, _engine_limit(image))
        engine = self._engine()
        try:
            res = engine(im)
        except Exception as e:
            raise OCREngineError(f"rapidocr failed: {e}", unavailable=False) from e
        if not getattr(res, "txts", None) or res.boxes is None:
            return []  # no text found
        return self._parse(res)

    @staticmethod
    def _word_line(entry) -> list[tuple[str, float, list]] | None:
        """rapidocr's words of one line as (text, score, corners), or None if it has none usable."""
        if not isinstance(entry, (tuple, list)) or not entry:
            return None
        out = []
        for w in entry:
            if not (isinstance(w, (tuple, list)) and len(w) == 3 and isinstance(w[0], str) and w[2] is not None):
                return None
            out.append((w[0], float(w[1]), w[2]))
        return out

    def _parse(self, res) -> list[OCRWord]:
        lines = list(zip(res.txts, res.scores, res.boxes))
        word_lines = list(res.word_results or ())
        # rapidocr drops lines without word boxes from word_results, which then no longer lines up
        # with txts: use word boxes only when there is exactly one entry per line.
        aligned = self.word_boxes and len(word_lines) == len(lines)
        out: list[OCRWord] = []
        for i, (text, score, box) in enumerate(lines):
            words = self._word_line(word_lines[i]) if aligned else None
            if words and "".join(t for t, _, _ in words).replace(" ", "") == text.replace(" ", ""):
                out.extend(OCRWord(t, _rect(b), s, i) for t, s, b in words if t.strip())
            elif text.strip():
                out.append(OCRWord(text.strip(), _rect(box), float(score), i))
        return out


class Tesseract:
    """The `tesseract` command-line OCR (5.x), page segmentation mode 6, TSV output."""

    name = "tesseract"

    def __init__(self, threads: int = 1, lang: str = "eng", psm: int = 6, timeout: float = 120):
        self.binary = shutil.which("tesseract")
        if self.binary is None:
            raise OCREngineError(
                "the tesseract binary is not on PATH; install it (apt-get install tesseract-ocr "
                "tesseract-ocr-eng) or use the 'rapidocr' engine"
            )
        self.threads, self.lang, self.psm, self.timeout = threads, lang, psm, timeout

    def __call__(self, image: ImageInput) -> list[OCRWord]:
        im = load_image(image, _engine_limit(image))
        buf = io.BytesIO()
        im.save(buf, "PNG")
        env = {**os.environ, "OMP_THREAD_LIMIT": str(self.threads)}
        cmd = [self.binary, "stdin", "stdout", "-l", self.lang, "--psm", str(self.psm), "tsv"]
        try:
            proc = subprocess.run(cmd, input=buf.getvalue(), capture_output=True, env=env, timeout=self.timeout)
        except subprocess.TimeoutExpired as e:
            raise OCREngineError(f"tesseract took over {self.timeout} s", unavailable=False) from e
        if proc.returncode != 0:
            raise OCREngineError(f"tesseract failed: {proc.stderr.decode(errors='replace').strip()}", unavailable=False)
        return parse_tesseract_tsv(proc.stdout.decode("utf-8", errors="replace"))


def parse_tesseract_tsv(tsv: str) -> list[OCRWord]:
    """Words (level 5 rows) of tesseract's TSV output; confidence 0-100 becomes 0-1."""
    out: list[OCRWord] = []
    line_ids: dict[tuple[str, ...], int] = {}
    for row in csv.DictReader(io.StringIO(tsv), delimiter="\t", quoting=csv.QUOTE_NONE):
        text = (row.get("text") or "").strip()
        if row.get("level") != "5" or not text:
            continue
        try:
            x, y, w, h = (float(row[k]) for k in ("left", "top", "width", "height"))
            conf = float(row["conf"])
        except (KeyError, TypeError, ValueError):
            continue
        key = (row.get("page_num"), row.get("block_num"), row.get("par_num"), row.get("line_num"))
        line = line_ids.setdefault(key, len(line_ids))
        out.append(OCRWord(text, (x, y, x + w, y + h), max(0.0, conf) / 100, line))
    return out


ENGINES = {"rapidocr": RapidOCR, "tesseract": Tesseract}
_OPTIONS: dict[str, dict] = {}  # engine name -> keyword arguments of the engines created from now on


def set_engine_options(name: str, **options) -> None:
    """Process-wide keyword arguments for the engine `name` (RapidOCR: max_side, det_side, ...);
    engines cached before are dropped, so the next `get_engine` creates one with them."""
    if name.lower() not in ENGINES:
        raise OCREngineError(f"unknown OCR engine {name!r}; choose one of {sorted(ENGINES)}")
    _OPTIONS[name.lower()] = {k: v for k, v in options.items() if v is not None}
    _cached_engine.cache_clear()


def get_engine(name: str = "rapidocr", threads: int = 1) -> OCREngine:
    """The engine `name` ("rapidocr" or "tesseract") with `threads` threads, created once and cached."""
    if name.lower() not in ENGINES:
        raise OCREngineError(f"unknown OCR engine {name!r}; choose one of {sorted(ENGINES)}")
    return _cached_engine(name.lower(), int(threads))


@cache
def _cached_engine(name: str, threads: int) -> OCREngine:
    return ENGINES[name](threads=threads, **_OPTIONS.get(name, {}))
