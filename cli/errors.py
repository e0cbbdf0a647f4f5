"""User errors: one clear message and exit status 2, never a traceback.

Every command runs inside `user_errors`, which turns the problems a user can cause (a missing or
malformed file, an invalid job request, no credentials, a stack that is not deployed, an unknown
execution) into a rich-formatted message on stderr. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ProfileNotFound,
)
from rich.console import Console
from rich.markup import escape

# soft_wrap: field paths and ARNs must stay on one line, whatever the terminal width.
stderr = Console(stderr=True, soft_wrap=True, highlight=False)

USER_ERROR_EXIT = 2

F = TypeVar("F", bound=Callable[..., Any])


class UserError(Exception):
    """A problem the user can fix. `hint` says how."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def _from_client_error(exc: ClientError) -> UserError:
    error = exc.response.get("Error", {})
    code = error.get("Code", "Error")
    message = error.get("Message", str(exc))
    operation = getattr(exc, "operation_name", "the AWS call")
    hint = None
    if code in {"AccessDenied", "AccessDeniedException", "UnrecognizedClientException",
                "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException"}:
        hint = "check your AWS credentials and that your role may call this API"
    elif code in {"ExecutionDoesNotExist", "StateMachineDoesNotExist", "ResourceNotFoundException"}:
        hint = "check the name or ARN, and --region / --prefix"
    return UserError(f"{operation} failed: {code}: {message}", hint)


def as_user_error(exc: BaseException) -> UserError | None:
    """The UserError a user-caused exception stands for, or None for a bug."""
    if isinstance(exc, UserError):
        return exc
    # contract.errors.RequestInvalid: matched by name so that this module does not import jobs.
    if type(exc).__name__ == "RequestInvalid":
        return UserError(f"invalid job request:\n{exc}", "fix the fields named above")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return UserError("no AWS credentials found",
                         "configure them (aws configure, AWS_PROFILE, or SSO login), or use --platform FILE "
                         "for the offline commands")
    if isinstance(exc, NoRegionError):
        return UserError("no AWS region configured", "pass --region or set AWS_REGION")
    if isinstance(exc, ProfileNotFound):
        return UserError(str(exc), "check AWS_PROFILE")
    if isinstance(exc, EndpointConnectionError):
        return UserError(f"cannot reach AWS: {exc}", "check the network and --region")
    if isinstance(exc, ParamValidationError):
        return UserError(f"AWS rejected the parameters: {exc}")
    if isinstance(exc, ClientError):
        return _from_client_error(exc)
    return None


def report(error: UserError) -> None:
    stderr.print(f"[bold red]error:[/] {escape(error.message)}")
    if error.hint:
        stderr.print(f"[dim]hint:[/] {escape(error.hint)}")


def user_errors(command: F) -> F:
    """Decorate a typer command so that user errors exit 2 with their message."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            # Ctrl-C while watching or following: nothing in AWS is stopped by leaving.
            stderr.print("[yellow]interrupted[/] (anything already started on AWS keeps running; "
                         "`trainctl stop` stops it)")
            raise typer.Exit(130) from None
        except Exception as exc:
            error = as_user_error(exc)
            if error is None:
                raise
            report(error)
            raise typer.Exit(USER_ERROR_EXIT) from None

    return wrapper  # type: ignore[return-value]
