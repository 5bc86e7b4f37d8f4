"""The model: loading and settings, the answer template, attention masks, the copy head, lists.

- `modeling`: `load_model`, `Settings` (pipkie.json), which model a decoder runs on.
- `template`: `TemplateBuilder`, the input a model sees (instruction, document, answer blocks).
- `attention`: the attention patterns, small named predicates composed into a mask.
- `copyhead`: the pointer that copies a value's tokens out of the document.
- `groups`: the template of a list of items (group blocks that see the previous group).
"""
