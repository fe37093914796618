"""Errors that the CLI prints as one line (no traceback): they name the file, line or field at fault."""


class BBoxError(Exception):
    """Base class: the message is complete and user-facing."""


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
