"""Errors that the CLI prints as one line (no traceback): they name the file, line or field at fault."""

# Every character str.splitlines() breaks at, not only \n and \r (e.g. NEL, U+2028).
_LINE_BREAKS = {ord(c): c.encode("unicode_escape").decode() for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


class BBoxError(Exception):
    """Base class: the message is complete and user-facing."""

    def __init__(self, message: object = "", *args: object):
        # Messages quote user data (document ids, YAML keys) that may hold line breaks; escape
        # them so the promise of one line (no traceback-like output, greppable logs) holds.
        if isinstance(message, str):
            message = message.translate(_LINE_BREAKS)
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
