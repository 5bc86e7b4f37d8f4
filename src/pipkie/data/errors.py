"""The one error every reader raises: it names the file (and line) that could not be read."""


class DataError(ValueError):
    def __init__(self, path, message: str, line: int | None = None):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = path, line
