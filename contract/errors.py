"""Problems a user can fix, each naming its field, and the errors that carry them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    path: str  # dotted field path: "instance.count", "hyperparameters.lr", "instance_groups[1].type"
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class Invalid(Exception):
    """A document that cannot be used. `str(exc)` is one `path: message` line per problem."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def __reduce__(self):  # keep it picklable (pytest-xdist, multiprocessing) despite the custom __init__
        return (type(self), (self.problems,))


class RequestInvalid(Invalid):
    """A job request that cannot run.

    The class name is part of the contract: the state machine matches the Lambda error name
    `RequestInvalid`, and trainctl turns it into exit code 2.
    """


class ConfigError(ValueError):
    """A training-configuration mistake the user can fix; entry points print it as one line, no traceback."""


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and every error under it, once each: its cause and context, and each rank's failure inside a DCP
    CheckpointException (kept in `.failures` as (exception, traceback), the exception's own text only naming ranks)."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [e.__cause__, e.__context__]
