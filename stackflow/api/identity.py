"""Who calls the API: roles (viewer < operator < approver), an identity with its roles per
project, and the role map both static tokens and OIDC claims are read into."""

from __future__ import annotations

from enum import IntEnum
from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stackflow.core.errors import StackflowError


class Role(IntEnum):
    viewer = 1
    operator = 2
    approver = 3


class AuthUnavailable(StackflowError):
    """Whether a credential is valid cannot be known now (the OIDC issuer's keys cannot be
    fetched): the request is refused with 503, neither accepted nor called invalid."""


def role_map(value: Any, where: str = "") -> Any:
    """``{glob: role name}`` with the names as :class:`Role` (anything else is left for
    pydantic to refuse); ValueError naming the glob for a role that does not exist."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for glob, role in value.items():
        if isinstance(role, str):
            if role not in Role.__members__:
                raise ValueError(
                    f"{where}role {role!r} of {glob!r}: use viewer, operator or approver"
                )
            role = Role[role]
        out[glob] = role
    return out


def best_role(roles: dict[str, Role], project: str) -> Role | None:
    """The highest role of the globs in ``roles`` that match ``project``."""
    found = [role for glob, role in roles.items() if fnmatchcase(project, glob)]
    return max(found) if found else None


class Identity(BaseModel):
    """An authenticated caller: its name (what runs record) and its role per project glob."""

    model_config = ConfigDict(frozen=True)

    name: str
    roles: dict[str, Role] = Field(default_factory=dict)

    def role_for(self, project: str) -> Role | None:
        return best_role(self.roles, project)

    def allows(self, project: str, needed: Role) -> bool:
        role = self.role_for(project)
        return role is not None and role >= needed
