"""`pipkie serve`: the HTTP service (pipkie.serve)."""

from __future__ import annotations

import typer

from pipkie.cli.common import COMPUTE_HELP, OCR_MIN_SCORE_HELP, app, error, load_extractor, set_threads


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    model: str | None = typer.Option(None, help="model directory (default: $PIPKIE_MODEL, else the shipped model)"),
    threads: int | None = typer.Option(None, help="torch/OCR threads (default $PIPKIE_THREADS or 1)"),
    compute: str | None = typer.Option(None, help=COMPUTE_HELP),
    ocr: str | None = typer.Option(None, help="rapidocr | tesseract (default rapidocr)"),
    ocr_min_score: float | None = typer.Option(None, help=OCR_MIN_SCORE_HELP),
    max_batch: int | None = typer.Option(None, min=1, help="most requests decoded together (8)"),
    max_wait_ms: float | None = typer.Option(
        None, min=0, help="how long the first queued request waits for others (10)"
    ),
    max_upload_mb: float | None = typer.Option(None, min=0.001, help="largest body/upload in MB (10; 413)"),
    max_pages: int | None = typer.Option(None, min=1, help="most PDF pages / TIFF frames (10; 413)"),
    max_pixels: int | None = typer.Option(None, min=1, help="most pixels of a page image (40,000,000; 413)"),
    max_words: int | None = typer.Option(None, min=1, help="most words of a document (10,000; 413)"),
    max_keys: int | None = typer.Option(None, min=1, help="most keys per request (32; 422)"),
    max_queue: int | None = typer.Option(None, min=1, help="most requests in progress (32; 503 beyond)"),
    timeout: float | None = typer.Option(
        None,
        min=0.1,
        help="request deadline in seconds (15): 503 at once "
        "when it cannot be met, 504 after it; X-Request-Timeout overrides",
    ),
    load_workers: int | None = typer.Option(None, min=1, help="threads loading/OCR-ing documents (2)"),
):
    """Serve POST /extract (upload or JSON words/text), POST /render, GET /health and GET /metrics;
    a page for people at /, API docs at /docs (docs/WEB.md).

    Every option can also be set as PIPKIE_<OPTION> in the environment (PIPKIE_MAX_WORDS=20000;
    --timeout is PIPKIE_REQUEST_TIMEOUT_S); options win. SIGTERM drains: new requests get 503,
    admitted ones finish."""
    from pipkie.serve import ServeSettings, run

    try:
        settings = ServeSettings.from_env(
            model=model,
            threads=threads,
            compute=compute,
            ocr=ocr,
            ocr_min_score=ocr_min_score,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            max_upload_mb=max_upload_mb,
            max_pages=max_pages,
            max_pixels=max_pixels,
            max_words=max_words,
            max_keys=max_keys,
            max_queue=max_queue,
            request_timeout_s=timeout,
            load_workers=load_workers,
        )
    except ValueError as e:
        error(str(e))
        raise typer.Exit(2) from None
    n = set_threads(settings.threads)
    ex = load_extractor(settings.model, n, settings.ocr, settings.compute)
    typer.echo(f"pipkie: serving {ex.name}: open http://{host}:{port}/ in a browser (API docs: /docs)", err=True)
    run(host, port, extractor=ex, settings=settings.model_copy(update={"threads": n}))
