"""Errors that the CLI prints as one line (no traceback): they name the file, line or field at fault."""

# What must not reach a terminal as it is: C0 and C1 control characters (ESC starts ANSI colours,
# cursor moves and OSC-8 hyperlinks; among them every line break str.splitlines() knows but
# U+2028/U+2029, added), DEL, and the bidirectional overrides that reorder what a line shows.
_CONTROLS = [*map(chr, range(0x20)), *map(chr, range(0x7F, 0xA0)), "\u2028", "\u2029", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))]
_ESCAPES = {ord(c): c.encode("unicode_escape").decode() for c in _CONTROLS}


def printable(text: str, keep: str = "") -> str:
    """`text` with each control character written as its escape (ESC as `\\x1b`), except those in
    `keep`: for everything the tool echoes that it did not write itself (labels, corpus words,
    paths, a server's error messages)."""
    table = {k: v for k, v in _ESCAPES.items() if chr(k) not in keep} if keep else _ESCAPES
    return text.translate(table)


class BBoxError(Exception):
    """Base class: the message is complete and user-facing."""

    def __init__(self, message: object = "", *args: object):
        # Messages quote user data (document ids, YAML keys, a server's reply) that may hold line
        # breaks or terminal escapes; escape them so the promise of one line holds and nothing
        # quoted can colour, move or link the terminal.
        if isinstance(message, str):
            message = printable(message)
        super().__init__(message, *args)


class ConfigError(BBoxError):
    pass


class CorpusError(BBoxError):
    pass


class ArtifactError(BBoxError):
    pass


class ScoringError(BBoxError):
    pass


class EndpointError(BBoxError):
    pass


class NumericalError(BBoxError):
    pass


class LockError(BBoxError):
    pass


class UndeclaredRead(RuntimeError):
    """A stage read a config section it does not declare: a bug in bbox, not in the user's input."""
