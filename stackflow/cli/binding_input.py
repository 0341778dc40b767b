"""What `stackflow source` and `stackflow notify` share: the secret, read from a file or stdin
(never from an argument, so it is in no shell history or process list), the names checked,
and the first invalid field of a model as one line naming the option."""

from __future__ import annotations

import getpass
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from stackflow.core.errors import SpecError
from stackflow.temporal.operation import NAME_LIMIT, NAME_PATTERN

if TYPE_CHECKING:
    pass

M = TypeVar("M", bound=BaseModel)

SECRET_LIMIT = 64 * 1024
"""Bytes read for a secret at most (a secret is at most 256 characters)."""
PLACEHOLDER = "x" * 32
"""Stands in for the secret while the other fields are checked, before it is asked for."""


def exit_codes(not_found: str | None, bad: str) -> str:
    """The --help epilog of a command here: what its exit codes mean."""
    one = f"{not_found}, or " if not_found else ""
    return (
        f"Exit codes: 0 ok, 1 {one}the API or the state backend failed or is unreachable, "
        f"2 bad input ({bad}), a token without the role the call needs, or a state backend "
        "whose schema is not migrated."
    )


def read_secret(secret_file: Path | None) -> str:
    """The secret in ``secret_file`` (``-``: stdin), else on stdin (asked for, not echoed,
    when stdin is a terminal), without its line ending; SpecError when it is empty."""
    if secret_file is not None and str(secret_file) != "-":
        where = f"--secret-file {secret_file}"
        try:
            with secret_file.open(encoding="utf-8") as handle:
                text = handle.read(SECRET_LIMIT)
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else err
            raise SpecError(f"{where}: cannot be read ({reason})") from None
    elif sys.stdin.isatty():
        where = "the secret typed"
        text = getpass.getpass("Secret (not shown): ")
    else:
        where = "stdin"
        try:
            text = sys.stdin.read(SECRET_LIMIT)
        except UnicodeDecodeError:
            raise SpecError("stdin: the secret is not UTF-8 text") from None
    secret = text.rstrip("\r\n")
    if not secret.strip():
        raise SpecError(f"the secret is empty ({where}): give it in --secret-file FILE or on stdin")
    return secret


def check_names(**names: str) -> None:
    """SpecError naming the option when a project or workspace name is not one (``--project``
    given as ``project=``)."""
    for option, value in names.items():
        if not (0 < len(value) <= NAME_LIMIT) or not re.fullmatch(NAME_PATTERN, value):
            raise SpecError(
                f"--{option} {value!r}: letters, digits, '.', '_' and '-' (starting with a "
                f"letter or digit), at most {NAME_LIMIT} characters"
            )


def checked(model: type[M], data: dict[str, Any], options: dict[str, str]) -> M:
    """``model`` from ``data``, or SpecError with its first invalid field as the option
    ``options`` names for it (``{"url": "--url"}``), never echoing the value."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        where = options.get(field, field or "input")
        msg = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            msg = "unknown field"
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise SpecError(" ".join(f"{where}: {msg}{more}".split())) from None
