"""Errors that the command line turns into one clear line on stderr."""


class UsageError(ValueError):
    """A bad argument or configuration: the message names the value and the valid range."""


class UndecodableError(RuntimeError):
    """A delivery plan that some worker cannot decode from its own cache."""


class VerificationError(RuntimeError):
    """Decoded bytes differ from the master's bytes."""
