"""The service's settings: one pydantic model, each field a documented limit or knob with its default.

    settings = ServeSettings.from_env()                   # PIPKIE_MAX_WORDS=20000 ... override defaults
    settings = ServeSettings.from_env(max_batch=4)        # explicit values override the environment
    app = create_app(extractor, settings)

Every field can be set by the environment variable `PIPKIE_<FIELD>` (upper case: `PIPKIE_MODEL`,
`PIPKIE_THREADS`, `PIPKIE_MAX_PIXELS`, ...), as the FastAPI full-stack template's pydantic-settings
class does, without the extra dependency: values are strings validated by pydantic (`"8"` -> 8,
`"false"` -> False), and a bad one is an error naming its variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_PREFIX = "PIPKIE_"


class ServeSettings(BaseModel):
    """What `pipkie serve` runs with. Limits answer 413/422/503 with a message when exceeded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # what runs
    model: str | None = Field(None, description="model directory (default: the shipped model)")
    threads: int = Field(1, ge=1, le=256, description="torch and OCR threads")
    compute: Literal["float32", "bfloat16"] = Field(
        "auto",
        validate_default=True,
        description="the layers' precision (pipkie.model.precision): auto = bfloat16 where the CPU runs it natively",
    )
    ocr: Literal["rapidocr", "tesseract"] = Field("rapidocr", description="OCR engine for images and scans")
    ocr_min_score: float | None = Field(
        None, description="rapidocr: drop lines it scores under this, 0-1 (default: the engine's, 0.9)"
    )
    load_workers: int = Field(2, ge=1, le=64, description="threads loading/OCR-ing documents (bounded pool)")
    warmup: bool = Field(True, description="one model call at startup, to measure seconds per document")
    # batching
    max_batch: int = Field(8, ge=1, le=256, description="most requests decoded in one model call")
    max_wait_ms: float = Field(10, ge=0, le=10_000, description="how long the first queued request waits for others")
    # limits on one request
    max_upload_mb: float = Field(10, gt=0, le=1024, description="largest request body / upload, MB (413)")
    max_pages: int = Field(10, ge=1, le=10_000, description="most pages of a PDF / frames of a TIFF (413)")
    max_pixels: int = Field(40_000_000, ge=1, description="most pixels of one page image, from its header (413)")
    max_words: int = Field(10_000, ge=1, description="most words (OCR, PDF text layer, JSON, text) (413)")
    max_keys: int = Field(32, ge=1, le=64, description="most keys asked for at once (422)")
    # time and back-pressure
    request_timeout_s: float = Field(15, gt=0, description="a request's deadline unless it sends X-Request-Timeout")
    min_request_timeout_s: float = Field(1, gt=0, description="the shortest deadline X-Request-Timeout may ask")
    max_request_timeout_s: float = Field(300, gt=0, description="the longest deadline X-Request-Timeout may ask")
    max_queue: int = Field(32, ge=1, description="most requests admitted at once, loading or queued (503 beyond)")
    ocr_seconds: float = Field(4.0, gt=0, description="estimated seconds to load+OCR an image, until measured")

    @field_validator("ocr_min_score")
    @classmethod
    def _min_score(cls, value, info):
        """The engine's own check (`pipkie.io.ocr.check_min_score`); none when `ocr` was refused."""
        from pipkie.io.ocr import check_min_score

        return check_min_score(info.data["ocr"], value) if "ocr" in info.data else value

    @field_validator("compute", mode="before")
    @classmethod
    def _compute(cls, value):
        """bf16 / fp32 as well (`pipkie.model.precision.resolve_compute`)."""
        from pipkie.model.precision import resolve_compute

        return resolve_compute(value) if isinstance(value, str) else value

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_upload_mb * 2**20)

    def public(self) -> dict:
        """The limits a client may want to know (GET /health)."""
        private = {"model", "threads", "compute", "ocr", "ocr_min_score", "load_workers", "warmup", "ocr_seconds"}
        return self.model_dump(exclude=private)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> ServeSettings:
        """Defaults, then `PIPKIE_<FIELD>` variables of `env` (os.environ), then `overrides` that
        are not None. ValueError naming the variable or option if a value is invalid."""
        env = os.environ if env is None else env
        values: dict = {}
        source: dict[str, str] = {}
        for name in cls.model_fields:
            var = ENV_PREFIX + name.upper()
            if env.get(var) not in (None, ""):
                values[name], source[name] = env[var], var
        unknown = sorted(set(overrides) - set(cls.model_fields))
        if unknown:
            raise ValueError(f"unknown serve settings {unknown}; known: {sorted(cls.model_fields)}")
        for name, value in overrides.items():
            if value is not None:
                values[name], source[name] = value, name
        try:
            return cls(**values)
        except ValidationError as e:
            problems = "; ".join(f"{source.get(str(err['loc'][0]), err['loc'][0])}: {err['msg']}" for err in e.errors())
            raise ValueError(f"invalid serve settings: {problems}") from None
