"""Documents in and out: the `Document` type, loaders for every accepted file type, OCR engines,
folder OCR, and grounding (which words a value was read from).

- `document`: Document / Word and serialization into the model's text.
- `reading_order`: a page's words grouped into lines (tilted photos, tall OCR boxes).
- `loaders`: `load_document(path | bytes)` for images, PDFs, TIFFs, JSON words, SROIE box files, text.
- `ocr`: the `ENGINES` registry (rapidocr, tesseract) and image loading with its limits.
- `ocr_folder`: `pipkie ocr`, a folder of images/PDFs into JSON-words files, resumable.
- `grounding`: a value's boxes (`locate`), the items of a list (`ground_items`).
"""
