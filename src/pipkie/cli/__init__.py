"""`pipkie`, the command line: one module per group of commands, all on one Typer app.

    train     finetune, pretrain, refit-head, soup, label   (finetune/pretrain options built from TrainConfig's fields)
    extract   extract, explain, ocr
    evaluate  evaluate, calibrate, abstain, bench, compare
    serve     serve

A new command goes in the module of its group (or a new module imported below).
"""

from pipkie.cli import train, extract, evaluate, serve  # noqa: F401, I001  (each registers its commands, in this order)
from pipkie.cli.common import app, short_helps

short_helps(app)  # `pipkie --help` lists each command by its docstring's first sentence, on one line


def main():
    app()


__all__ = ["app", "main"]
