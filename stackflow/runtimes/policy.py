"""The worker policy: what a spec may make this worker do.

Spec authors write specs; whoever runs the worker decides what specs may do on it. The
policy is set on the worker - environment variables, optionally a YAML file named by
``STACKFLOW_POLICY_FILE`` (a variable that is set wins over the file) - and checked when a
resource is previewed (before any runtime call: no ``tofu init``, no file read, no
Kubernetes request), again before it is applied or deleted, and by the runtimes themselves
on every call. A violation is a :class:`PolicyViolation` (a :class:`SpecError`: exit 2, one
line naming the resource and the field).

This module owns only what is generic: the settings (one section per built-in runtime,
read from ``STACKFLOW_*`` variables and the policy file by :func:`load_policy`, and one per
other installed runtime whose rules name a section model, ``RuntimeRules.policy_section``,
read from the file under the runtime's name: :meth:`WorkerPolicy.section`), the
per-project sections and :class:`PolicyViolation`; the paths no spec may touch are found by
:mod:`stackflow.runtimes.policy_paths`. Each runtime checks its own part, in its own package:
``runtimes/terraform/policy.py`` (providers, provisioners, ``context.env``, files named by
arguments), ``runtimes/kubernetes/policy.py`` (kubeconfigs, contexts, plugins, namespaces,
kinds), ``runtimes/onprem/policy.py`` (roots and sizes), called from the runtime's
``check_policy`` (:class:`runtimes.base.Runtime`) with the policy of the run's project
(:meth:`WorkerPolicy.for_project`).

Projects. The policy file may hold ``projects:``, a mapping of project globs to sections
shaped as the worker's own (only the settings each section class lists in ``PER_PROJECT``,
each with how it narrows). The first glob (in the file's order) that matches a run's
project gives its policy; a project no glob matches may not use the worker (default deny);
with no ``projects`` every project has the worker's policy. A section may only narrow the
worker's (a root outside the worker's roots, a glob not within the worker's, a flag the
worker has off): anything wider stops the worker at start, one line naming it.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import threading
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import ByteSize, Field, ValidationError, field_validator

from stackflow.model.runtime_rules import RuntimeLoadError, all_rules, resolve
from stackflow.runtimes.policy_paths import (
    POLICY_FILE_VAR,
    ProtectedPath,
    real_path,
    split_list,
    stackflow_paths,
    worker_kubeconfigs,
)
from stackflow.runtimes.policy_section import (
    Narrow,
    PolicyConfigError,
    PolicySection,
    PolicyViolation,
    added,
    glob_covers,
    narrower_flag,
    narrower_globs,
    narrower_host_roots,
    narrower_paths,
    narrower_size,
)

MIB = 1024 * 1024
POLICY_FILE_MAX_BYTES = MIB

DEFAULT_TF_PROVIDERS = ("hashicorp/*",)
_ENV_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]!-]+$")

__all__ = [
    "Narrow",
    "PolicyConfigError",
    "PolicySection",
    "PolicyViolation",
    "added",
    "glob_covers",
    "narrower_flag",
    "narrower_globs",
    "narrower_host_roots",
    "narrower_paths",
    "narrower_size",
]
"""What this module re-exports from :mod:`stackflow.runtimes.policy_section` (what it defines
is public as well)."""


def _absolute(values: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for value in values:
        path = os.path.expanduser(value)
        if not os.path.isabs(path):
            raise ValueError(f"{value!r} is not an absolute path")
        out.append(os.path.normpath(path))
    return tuple(out)


class TerraformPolicy(PolicySection):
    allow_provisioners: bool = False
    """Trust Terraform specs to run programs on the worker (provisioners, connection
    blocks, code-running providers, exec blocks and file settings in provider configs)."""
    allowed_env: tuple[str, ...] = ()
    """``context.env`` names (or globs such as ``AWS_*``) specs may pass to the CLI."""
    pass_env: tuple[str, ...] = ()
    """Names (or globs) of the worker's own variables passed to the CLI (cloud credentials
    of the worker itself); never stackflow's, Temporal's or Redis's."""
    allowed_providers: tuple[str, ...] = DEFAULT_TF_PROVIDERS
    """Provider sources specs may use: ``namespace/name`` globs (the public registries) or
    ``host/namespace/name`` globs; ``*`` allows any."""
    remote_path_arguments: tuple[str, ...] = ()
    """Arguments (``<resource type>.<argument>`` globs, nested blocks' keys joined by dots)
    whose file-like names name no file on the worker (a path in a git repository, inside an
    archive): not confined to the OnPrem roots. Whole worker only."""

    PER_PROJECT: ClassVar[Mapping[str, Narrow]] = {
        "allow_provisioners": narrower_flag,
        "allowed_env": narrower_globs,
        "pass_env": narrower_globs,
        "allowed_providers": narrower_globs,
    }

    @field_validator("allowed_env", "pass_env")
    @classmethod
    def _env_patterns(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not _ENV_PATTERN.match(value):
                raise ValueError(f"{value!r} is not a variable name or glob")
        return values

    @field_validator("allowed_providers")
    @classmethod
    def _provider_patterns(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            parts = value.strip("/").split("/")
            if not (value == "*" or len(parts) in (2, 3)) or not all(parts):
                raise ValueError(
                    f"{value!r} is not '*', '<namespace>/<name>' or '<host>/<namespace>/<name>'"
                )
        return tuple(v.strip("/").lower() for v in values)


class KubernetesPolicy(PolicySection):
    allowed_kubeconfigs: tuple[str, ...] = ()
    """kubeconfig files (or directories holding them) specs may name, besides the worker's
    own ``KUBECONFIG``."""
    allowed_contexts: tuple[str, ...] | None = None
    """Contexts (names or globs) specs may use; None: any context of an allowed file."""
    allow_exec: bool = False
    """Allow exec credential plugins and auth-provider plugins in the kubeconfigs used."""
    worker_kubeconfig: bool = True
    """Specs may use the worker's own kubeconfig (``KUBECONFIG``) by naming none."""
    allowed_namespaces: tuple[str, ...] | None = None
    """Namespaces (names or globs) objects may live in; None: any. When set, cluster-scoped
    objects are refused but for a ``Namespace`` whose name is allowed."""
    allowed_kinds: tuple[str, ...] | None = None
    """Kinds (globs) objects may be: ``Kind`` (any API group), ``<group>/<Kind>`` (the core
    group is ``core``); None: any."""

    PER_PROJECT: ClassVar[Mapping[str, Narrow]] = {
        "allowed_kubeconfigs": narrower_paths,
        "allowed_contexts": narrower_globs,
        "allow_exec": narrower_flag,
        "worker_kubeconfig": narrower_flag,
        "allowed_namespaces": narrower_globs,
        "allowed_kinds": narrower_globs,
    }

    _paths = field_validator("allowed_kubeconfigs")(_absolute)


class OnPremPolicy(PolicySection):
    roots: tuple[str, ...] = ()
    """Directories OnPrem resources may live in; none: OnPrem is refused."""
    max_bytes: ByteSize = ByteSize(MIB)
    """Largest file content written or read."""
    protected: tuple[str, ...] = ()
    """More paths no spec may touch, on top of stackflow's own."""
    hosts: tuple[str, ...] = ()
    """Hosts reached over SSH and a root on each, ``<host glob>:<root>`` (``web-*:/etc/app``),
    the glob matched against the name of ``ssh://user@name:port`` or a host alias; none: no
    host."""
    known_hosts: str | None = None
    """The known-hosts file host keys are pinned from (None: ~/.ssh/known_hosts)."""
    ssh_config: str | None = None
    """The OpenSSH client configuration (aliases, users, ports, keys; None: ~/.ssh/config)."""
    ssh_keys: tuple[str, ...] = ()
    """Private key files (none: the agent's and the default ones, as ``ssh``)."""
    ssh_concurrency: int = Field(default=8, ge=1, le=64)
    """Calls in flight at once on one host's connection."""

    PER_PROJECT: ClassVar[Mapping[str, Narrow]] = {
        "roots": narrower_paths,
        "max_bytes": narrower_size,
        "protected": added,
        "hosts": narrower_host_roots,
    }

    _paths = field_validator("roots", "protected")(_absolute)

    @field_validator("hosts")
    @classmethod
    def _host_roots(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for value in values:
            glob, sep, root = value.partition(":/")
            if not glob or not sep or "/" in glob:
                raise ValueError(f"{value!r} is not '<host glob>:<absolute root>'")
            out.append(f"{glob}:{posixpath.normpath('/' + root)}")
        return tuple(out)

    def ssh_files(self) -> list[str]:
        """The SSH files the policy names (no spec may write them: a known host planted)."""
        named = (self.known_hosts, self.ssh_config, *self.ssh_keys)
        return [os.path.expanduser(path) for path in named if path]

    def host_roots(self, name: str) -> list[str]:
        """The roots on the host named ``name`` (none: it is not one of the worker's)."""
        pairs = (entry.partition(":/") for entry in self.hosts)
        return [f"/{root}" for glob, _, root in pairs if fnmatch.fnmatchcase(name, glob)]


class ApprovalPolicy(PolicySection):
    four_eyes: tuple[str, ...] = ()
    """Project globs whose runs the requester may not approve (``STACKFLOW_FOUR_EYES``):
    enforced by the run's ``approve`` Update validator, so for every client."""

    def four_eyes_for(self, project: str) -> bool:
        return any(fnmatch.fnmatchcase(project, glob) for glob in self.four_eyes)


class PolicySettings(PolicySection):
    """What the policy file (and the environment variables) set."""

    terraform: TerraformPolicy = Field(default_factory=TerraformPolicy)
    kubernetes: KubernetesPolicy = Field(default_factory=KubernetesPolicy)
    onprem: OnPremPolicy = Field(default_factory=OnPremPolicy)
    approvals: ApprovalPolicy = Field(default_factory=ApprovalPolicy)

    @classmethod
    def scoped_sections(cls) -> tuple[str, ...]:
        """The sections a project's section may narrow: those with per-project settings."""
        return tuple(
            name
            for name, info in cls.model_fields.items()
            if isinstance(info.default_factory, type)
            and issubclass(info.default_factory, PolicySection)
            and info.default_factory.PER_PROJECT
        )


S = TypeVar("S", bound=PolicySection)


def runtime_sections() -> dict[str, type[PolicySection]]:
    """Section name -> model, for each installed runtime whose rules name a section model
    (``RuntimeRules.policy_section``) other than stackflow's own (fields of
    :class:`PolicySettings`). PolicyConfigError when one does not load or takes a built-in's
    name."""
    found: dict[str, type[PolicySection]] = {}
    for type_name, rules in sorted(all_rules().items()):
        if rules.policy_section is None:
            continue
        name = rules.runtime_name
        try:
            model = resolve(rules.policy_section, f"the policy section of type {type_name!r}")
        except RuntimeLoadError as exc:
            raise PolicyConfigError(f"worker policy: {exc}") from None
        if not (isinstance(model, type) and issubclass(model, PolicySection)):
            raise PolicyConfigError(
                f"worker policy: the policy section of type {type_name!r} "
                f"({rules.policy_section}) is not a PolicySection"
            )
        own = PolicySettings.model_fields.get(name)
        if own is not None:
            if own.default_factory is not model:
                raise PolicyConfigError(
                    f"worker policy: type {type_name!r} names its section {name!r}, "
                    f"a section of stackflow's own"
                )
            continue
        found[name] = model
    return found


PROJECTS_KEY = "projects"
"""The policy file's per-project sections: ``projects: {<project glob>: {<section>: ...}}``."""


class WorkerPolicy(PolicySettings):
    """The settings plus what this worker keeps to itself (found by :func:`load_policy`)."""

    protected: tuple[ProtectedPath, ...] = ()
    worker_kubeconfigs: tuple[str, ...] = ()
    """The worker's own kubeconfig files (``KUBECONFIG``, else ~/.kube/config)."""
    source: str = "defaults"
    scope: str | None = None
    """The project glob whose section narrowed this policy (None: the worker's own)."""
    sections: tuple[tuple[str, PolicySection], ...] = ()
    """The sections of other installed runtimes (:func:`runtime_sections`), (name, section)
    pairs (a tuple: a policy is hashable): each runtime reads its own through
    :meth:`section`."""
    projects: tuple[tuple[str, WorkerPolicy], ...] = ()
    """Each project section (its glob, the policy it makes), in the file's order: the first
    whose glob matches a run's project is that run's policy; a project none matches may
    not use the worker. None at all: every project has the worker's policy."""

    def for_project(self, project: str, resource_id: str) -> WorkerPolicy:
        """The policy of ``project``'s runs; PolicyViolation when the worker has project
        sections and none names it (default deny)."""
        if not self.projects:
            return self
        for glob, scoped in self.projects:
            if fnmatch.fnmatchcase(project, glob):
                return scoped
        raise PolicyViolation(
            resource_id,
            "project",
            f"project {project!r} has no section in this worker's policy (projects: "
            f"{', '.join(glob for glob, _ in self.projects)}), so it may not use this worker; "
            f"add one under {PROJECTS_KEY} in {POLICY_FILE_VAR}",
        )

    def section(self, name: str, model: type[S]) -> S:
        """The section ``name`` of this policy (a built-in's or an installed runtime's own),
        as ``model``; PolicyConfigError when there is no such section."""
        found = getattr(self, name) if name in PolicySettings.model_fields else None
        found = dict(self.sections).get(name, found)
        if not isinstance(found, model):
            raise PolicyConfigError(
                f"worker policy: no section {name!r} of {model.__name__} "
                f"(sections: {', '.join(self._all_sections())})"
            )
        return found

    def _all_sections(self) -> dict[str, PolicySection]:
        own = {
            name: getattr(self, name)
            for name in PolicySettings.model_fields
            if isinstance(getattr(self, name), PolicySection)
        }
        return {**own, **dict(self.sections)}

    def _scoped(self) -> dict[str, PolicySection]:
        """The sections a project's section may narrow: those with per-project settings."""
        scoped = {*self.scoped_sections(), *(n for n, s in self.sections if s.PER_PROJECT)}
        return {n: s for n, s in self._all_sections().items() if n in scoped}

    def summary(self) -> str:
        """One line for the worker's log."""
        tf, kube, onprem = self.terraform, self.kubernetes, self.onprem
        line = (
            f"policy ({self.source}): provisioners {'allowed' if tf.allow_provisioners else 'no'}"
            f", providers {','.join(tf.allowed_providers)}"
            f", context.env {','.join(tf.allowed_env) or 'none'}"
            f", kubeconfigs {len(kube.allowed_kubeconfigs)} + the worker's"
            f", kube plugins {'allowed' if kube.allow_exec else 'no'}"
            f", kube namespaces {','.join(kube.allowed_namespaces or ('any',))}"
            f", kinds {','.join(kube.allowed_kinds or ('any',))}"
            f", OnPrem roots {':'.join(onprem.roots) or 'none'} (max {int(onprem.max_bytes)} B)"
            f", OnPrem hosts {','.join(onprem.hosts) or 'none'}"
            f", four-eyes {','.join(self.approvals.four_eyes) or 'none'}"
        )
        if self.sections:
            line += f", runtime sections {','.join(name for name, _ in self.sections)}"
        if not self.projects:
            return line + ", projects: all alike"
        scopes = []
        for glob, scoped in self.projects:
            theirs = scoped._all_sections()
            changes = [
                f"{name}.{change}"
                for name, section in self._scoped().items()
                for change in section.differences(theirs[name])
            ]
            scopes.append(f"{glob} ({'; '.join(changes) or 'as the worker'})")
        return line + f", projects: {', '.join(scopes)}, any other denied"

    def narrowed_by(self, raw: Mapping[str, Any]) -> WorkerPolicy:
        """This policy as a project's section narrows it (the sections' own
        :meth:`PolicySection.narrowed`); ValueError names ``section.key: problem``."""
        if not isinstance(raw, Mapping):
            raise ValueError("must be a mapping of sections")
        sections = self._scoped()
        updates: dict[str, Any] = {}
        runtimes = dict(self.sections)
        own = {name for name, _ in self.sections}
        for name, block in raw.items():
            if name not in sections:
                raise ValueError(
                    f"{name}: not a section a project may narrow ({', '.join(sections)})"
                )
            if not isinstance(block, Mapping):
                raise ValueError(f"{name}: must be a mapping")
            try:
                narrowed = sections[name].narrowed(block)
            except ValueError as exc:
                raise ValueError(f"{name}.{exc}") from None
            if name in own:
                runtimes[name] = narrowed
            else:
                updates[name] = narrowed
        updates["sections"] = tuple(runtimes.items())
        extra = updates.get("onprem", self.onprem).protected
        protected = list(self.protected)
        known = {p.path for p in protected}
        for path in extra:
            real = real_path(path)
            if real not in known:
                protected.append(ProtectedPath(path=real, reason="protected for this project"))
        return self.model_copy(update={**updates, "protected": tuple(protected), "projects": ()})


WorkerPolicy.model_rebuild()


# ---- loading ---------------------------------------------------------------------------------
_ENV_SETTINGS: dict[str, tuple[str, str, str]] = {
    "STACKFLOW_ALLOW_PROVISIONERS": ("terraform", "allow_provisioners", "bool"),
    "STACKFLOW_ALLOWED_ENV": ("terraform", "allowed_env", ","),
    "STACKFLOW_TF_PASS_ENV": ("terraform", "pass_env", ","),
    "STACKFLOW_ALLOWED_TF_PROVIDERS": ("terraform", "allowed_providers", ","),
    "STACKFLOW_ALLOWED_KUBECONFIGS": ("kubernetes", "allowed_kubeconfigs", os.pathsep),
    "STACKFLOW_ALLOWED_KUBE_CONTEXTS": ("kubernetes", "allowed_contexts", ","),
    "STACKFLOW_ALLOW_KUBE_EXEC": ("kubernetes", "allow_exec", "bool"),
    "STACKFLOW_ALLOWED_KUBE_NAMESPACES": ("kubernetes", "allowed_namespaces", ","),
    "STACKFLOW_ALLOWED_KUBE_KINDS": ("kubernetes", "allowed_kinds", ","),
    "STACKFLOW_ONPREM_ROOTS": ("onprem", "roots", os.pathsep),
    "STACKFLOW_ONPREM_MAX_BYTES": ("onprem", "max_bytes", "text"),
    "STACKFLOW_ONPREM_HOSTS": ("onprem", "hosts", ","),
    "STACKFLOW_ONPREM_KNOWN_HOSTS": ("onprem", "known_hosts", "text"),
    "STACKFLOW_ONPREM_SSH_CONFIG": ("onprem", "ssh_config", "text"),
    "STACKFLOW_ONPREM_SSH_KEYS": ("onprem", "ssh_keys", os.pathsep),
    "STACKFLOW_FOUR_EYES": ("approvals", "four_eyes", ","),
}
"""Environment variable -> (section, setting, how it is split)."""


def _read_policy_file(path: str) -> dict[str, Any]:
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            raw = handle.read(POLICY_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise PolicyConfigError(
            f"worker policy: {POLICY_FILE_VAR} {path}: {exc.strerror}"
        ) from None
    if len(raw) > POLICY_FILE_MAX_BYTES:
        raise PolicyConfigError(f"worker policy: {POLICY_FILE_VAR} {path}: larger than 1 MiB")
    try:
        doc = yaml.safe_load(raw.decode("utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = " ".join(str(exc).split())[:300]
        raise PolicyConfigError(f"worker policy: {path}: {problem}") from None
    if not isinstance(doc, dict):
        raise PolicyConfigError(
            f"worker policy: {path}: expected a mapping with terraform, kubernetes, onprem"
        )
    return doc


def load_policy(environ: Mapping[str, str] | None = None) -> WorkerPolicy:
    """The policy the environment (and ``STACKFLOW_POLICY_FILE``) sets; a set variable wins
    over the file, an empty one counts as unset. PolicyConfigError names what is wrong."""
    env = os.environ if environ is None else environ
    file = env.get(POLICY_FILE_VAR) or None
    data: dict[str, Any] = _read_policy_file(file) if file else {}
    projects = data.pop(PROJECTS_KEY, None)
    declared = runtime_sections()
    own_raw = {name: data.pop(name) for name in list(data) if name in declared}
    origin: dict[tuple[str, ...], str] = {}
    for var, (section, key, how) in _ENV_SETTINGS.items():
        raw = env.get(var, "").strip()
        if not raw:
            continue
        block = data.get(section)
        if block is None:
            block = data[section] = {}
        if not isinstance(block, dict):
            raise PolicyConfigError(f"worker policy: {file}: {section} must be a mapping")
        block[key] = raw if how in ("bool", "text") else split_list(raw, how)
        origin[(section, key)] = var
    try:
        settings = PolicySettings.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(str(p) for p in err["loc"])
        where = origin.get(loc[:2]) or f"{file}: {'.'.join(loc)}"
        raise PolicyConfigError(f"worker policy: {where}: {err['msg']}") from None
    sections: dict[str, PolicySection] = {}
    for name, model in declared.items():
        block = own_raw.get(name)
        if not isinstance(block, dict | None):
            raise PolicyConfigError(f"worker policy: {file}: {name} must be a mapping")
        try:
            sections[name] = model.model_validate(block or {})
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join((name, *(str(p) for p in err["loc"])))
            raise PolicyConfigError(f"worker policy: {file}: {where}: {err['msg']}") from None
    sources = [f"file {file}"] if file else []
    if origin:
        sources.append("environment")
    policy = WorkerPolicy(
        terraform=settings.terraform,
        kubernetes=settings.kubernetes,
        onprem=settings.onprem,
        approvals=settings.approvals,
        sections=tuple(sections.items()),
        protected=tuple(
            stackflow_paths(
                env,
                settings.kubernetes.allowed_kubeconfigs,
                (*settings.onprem.protected, *settings.onprem.ssh_files()),
            )
        ),
        worker_kubeconfigs=tuple(worker_kubeconfigs(env)),
        source=" + ".join(sources) or "defaults",
    )
    if projects is None:
        return policy
    if not isinstance(projects, dict) or not projects:
        raise PolicyConfigError(
            f"worker policy: {file}: {PROJECTS_KEY} must map project globs to sections"
        )
    scopes = []
    for glob, raw in projects.items():
        try:
            scoped = policy.narrowed_by({} if raw is None else raw)
        except ValueError as exc:
            raise PolicyConfigError(f"worker policy: {file}: {PROJECTS_KEY}.{glob}.{exc}") from None
        scopes.append((str(glob), scoped.model_copy(update={"scope": str(glob)})))
    return policy.model_copy(update={"projects": tuple(scopes)})


_cached: tuple[tuple[Any, ...], WorkerPolicy] | None = None
_cache_lock = threading.Lock()
_FINGERPRINT_NAMES = ("KUBECONFIG", "TF_CLI_CONFIG_FILE", "HOME")


_FINGERPRINT_BYTES = tuple(name.encode() for name in _FINGERPRINT_NAMES)


_seen_env: tuple[dict[bytes, bytes], tuple[Any, ...]] | None = None
"""The environment's bytes when last fingerprinted (a copy) and what they gave: an
environment equal to it (one comparison in C, values mostly the same objects) gives the same
items without walking every variable again, as each runtime call's policy check would."""


def _fingerprint(environ: Mapping[str, str]) -> tuple[Any, ...]:
    global _seen_env
    raw = getattr(environ, "_data", None)  # os.environ's own bytes: nothing decoded
    if isinstance(raw, dict):
        seen = _seen_env
        if seen is not None and seen[0] == raw:
            items: tuple[Any, ...] = seen[1]
        else:
            items = tuple(
                sorted(
                    (k, v)
                    for k, v in raw.items()
                    if k.startswith(b"STACKFLOW_") or k in _FINGERPRINT_BYTES
                )
            )
            _seen_env = (dict(raw), items)
    else:
        items = tuple(
            sorted(
                (k, v)
                for k, v in environ.items()
                if k.startswith("STACKFLOW_") or k in _FINGERPRINT_NAMES
            )
        )
    file = environ.get(POLICY_FILE_VAR)
    if file:
        try:
            st = os.stat(os.path.expanduser(file))
            return (*items, (st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            return (*items, None)
    return items


def worker_policy() -> WorkerPolicy:
    """This process's policy, from its environment; loaded again when the environment (or
    the policy file) changes."""
    global _cached
    key = _fingerprint(os.environ)
    with _cache_lock:
        if _cached is not None and _cached[0] == key:
            return _cached[1]
    policy = load_policy()
    with _cache_lock:
        _cached = (key, policy)
    return policy
