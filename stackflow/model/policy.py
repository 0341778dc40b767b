"""Policy as data: the bundles a run evaluates (:class:`BundleRef`), a project's pushed bundle
(:class:`PolicyBinding`), and what the policy gate decided: every message of every policy, the
digests of the bundles
and of the input it judged, and the outcome (deny wins over require_approval over warn).

The decision the workflow holds (history, the release, events) keeps the first
:data:`MESSAGES_LIMIT` messages, each at most :data:`MESSAGE_LIMIT` characters; ``counts``
are always whole and ``full_ref`` names the whole decision in the state backend when
messages were left out."""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stackflow.core.terminal import one_line_safe

MESSAGES_LIMIT = 20
MESSAGE_LIMIT = 300
DECISION_KIND = "policy_decision"

_DIGEST = r"^sha256:[0-9a-f]{64}$"


class BundleRef(BaseModel):
    """One bundle a run evaluates: the project's (pushed) or the run's own."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: Literal["project", "run"]
    digest: str = Field(pattern=_DIGEST)


class PolicyBinding(BaseModel):
    """A project's pushed bundle."""

    project: str
    digest: str
    updated_by: str | None = None
    updated_at: datetime


class Rule(StrEnum):
    deny = "deny"
    require_approval = "require_approval"
    warn = "warn"


class Outcome(StrEnum):
    passed = "pass"
    warned = "warn"
    approval = "require_approval"
    denied = "deny"


class PolicyMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    policy: str
    """The module that said it (``project/images.rego``, ``run/labels.rego``)."""
    rule: Rule
    msg: str
    resource: str | None = None

    def line(self) -> str:
        return f"{self.policy}: {self.msg}"


def clean(text: str) -> str:
    text = one_line_safe(text)
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def messages_of(policy: str, rule: Rule, value: Any) -> list[PolicyMessage]:
    """A rule's value as messages: a set of strings or of ``{msg, resource}`` objects (or a
    boolean rule that holds: one message saying so)."""
    if value is None or value is False:
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        resource: str | None = None
        if item is True:
            msg = f"{rule} holds"
        elif isinstance(item, str):
            msg = item
        elif isinstance(item, dict):
            raw = item.get("msg", item.get("message"))
            msg = raw if isinstance(raw, str) else json.dumps(item, sort_keys=True, default=str)
            if item.get("resource") is not None:
                resource = clean(str(item["resource"]))
        else:
            msg = json.dumps(item, sort_keys=True, default=str)
        out.append(PolicyMessage(policy=policy, rule=rule, msg=clean(msg), resource=resource))
    return out


class PolicyDecision(BaseModel):
    model_config = ConfigDict(extra="ignore")

    outcome: Outcome
    bundles: list[BundleRef] = Field(default_factory=list)
    input_digest: str
    """The sha256 of the input document (kept in the state backend: ``policy eval``)."""
    policies: list[str] = Field(default_factory=list, max_length=200)
    messages: list[PolicyMessage] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    """Messages per rule, all of them."""
    full_ref: str | None = None
    """The whole decision in the state backend, when ``messages`` is cut short."""
    evaluated_at: str | None = None
    duration_ms: int = 0

    @classmethod
    def of(
        cls,
        messages: list[PolicyMessage],
        *,
        bundles: list[BundleRef],
        input_digest: str,
        policies: list[str],
        evaluated_at: str | None,
        duration_ms: int,
    ) -> PolicyDecision:
        order = {Rule.deny: 0, Rule.require_approval: 1, Rule.warn: 2}
        ordered = sorted(messages, key=lambda m: (order[m.rule], m.policy, m.resource or "", m.msg))
        counts = {rule.value: sum(1 for m in ordered if m.rule == rule) for rule in Rule}
        outcome = (
            Outcome.denied
            if counts["deny"]
            else Outcome.approval
            if counts["require_approval"]
            else Outcome.warned
            if counts["warn"]
            else Outcome.passed
        )
        return cls(
            outcome=outcome,
            bundles=bundles,
            input_digest=input_digest,
            policies=policies[:200],
            messages=ordered,
            counts={k: v for k, v in counts.items() if v},
            evaluated_at=evaluated_at,
            duration_ms=duration_ms,
        )

    def brief(self, full_ref: str | None) -> PolicyDecision:
        """This decision within the byte budget (``full_ref``: where the whole one is)."""
        if len(self.messages) <= MESSAGES_LIMIT:
            return self
        return self.model_copy(
            update={"messages": self.messages[:MESSAGES_LIMIT], "full_ref": full_ref}
        )

    def of_rule(self, rule: Rule) -> list[PolicyMessage]:
        return [m for m in self.messages if m.rule == rule]

    def denial_line(self) -> str:
        """One line for a denied run: the first denial, naming the policy and the
        resource, and how many more."""
        denials = self.of_rule(Rule.deny)
        total = self.counts.get("deny", len(denials))
        first = denials[0].line() if denials else "denied"
        more = f" (and {total - 1} more)" if total > 1 else ""
        return f"policy denied: {first}{more}"

    def approval_reason(self) -> str:
        found = self.of_rule(Rule.require_approval)
        total = self.counts.get("require_approval", len(found))
        first = found[0].line() if found else "approval required"
        return first + (f" (and {total - 1} more)" if total > 1 else "")
