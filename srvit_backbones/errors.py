"""The package's errors: library code raises them, each message naming the problem and the fix,
so that a caller (a notebook, another tool) catches ``SRViTError``; the tools' ``main``
(``tool_main``) print the message and exit with status 1."""
import functools
from typing import Callable, Optional


class SRViTError(Exception):
    """A request the package cannot serve; the message says why and what to do."""


class ConfigError(SRViTError):
    """A config, command-line option or model setting that cannot run as given."""


class InputError(SRViTError):
    """An input file or folder (images, a dataset folder, a class or annotation file) that is
    missing or unusable."""


class DataCheckError(SRViTError):
    """A dataset's files failed a check before a run (missing, unreadable, not the format the
    config reads); the message is the report."""


class CheckpointError(SRViTError, ValueError):
    """A checkpoint cannot be used for this model; the message says why and what to do."""


def tool_main(main: Optional[Callable] = None, *, prefix: str = "") -> Callable:
    """A tool's ``main`` that turns an ``SRViTError`` into the tool's exit: ``prefix`` and the
    message on stderr, exit status 1, no traceback. The only place of the package that exits.

    Args:
        main: the tool's function; None when used as ``@tool_main(prefix="error: ")``.
        prefix: written before the message.

    Returns:
        ``main`` wrapped (or, without ``main``, the decorator)."""
    if main is None:
        return functools.partial(tool_main, prefix=prefix)

    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except SRViTError as e:
            raise SystemExit(f"{prefix}{e}") from None
    return run
