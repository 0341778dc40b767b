"""A thin, synchronous Kubernetes API client: connection, raw JSON requests, discovery.

The official ``kubernetes`` package builds the connection (kubeconfig or in-cluster
config, TLS, tokens, exec plugins) and does the HTTP; requests are sent raw against the
REST paths so any kind, built-in or custom, goes through one code path and server-side
apply can send ``application/apply-patch+yaml``. Every method blocks: the runtime calls
them through ``asyncio.to_thread``.

Errors leave this module as :class:`ApiError` (the server answered with a failure status),
:class:`runtimes.base.Unavailable` (it could not be reached at all) or
:class:`runtimes.base.InvalidInput` (no retry can help: the kubeconfig, the server's TLS
certificate, an object that is not valid Unicode).

Bodies are sent as UTF-8 JSON (see :func:`encode_body`): server-side apply reads its body as
YAML, whose parser rejects the ``\\ud83c\\udf70`` surrogate pairs an ASCII-only JSON encoder
writes for characters beyond the BMP (and the raw control characters JSON leaves alone).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from stackflow.runtimes.base import InvalidInput, Unavailable

JSON = dict[str, Any]
APPLY_PATCH = "application/apply-patch+yaml; charset=utf-8"
"""Server-side apply's content type (the body is JSON, which is YAML)."""
POOL_CONNECTIONS = 32
"""Kept-alive connections per cluster client (the runtime runs as many requests at once)."""
REQUEST_TIMEOUT = (5.0, 60.0)
_TIMEOUT = urllib3.Timeout(connect=REQUEST_TIMEOUT[0], read=REQUEST_TIMEOUT[1])
"""(connect, read) seconds of one API request."""
_IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


class ApiError(Exception):
    """The API server answered with a failure ``Status``."""

    def __init__(self, status: int, body: JSON | None, text: str, server: str = "") -> None:
        self.status = status
        self.body = body or {}
        self.reason: str = str(self.body.get("reason") or "")
        self.message: str = str(self.body.get("message") or text or f"HTTP {status}").strip()
        self.server = server
        """The API server that answered (its address, and the kubeconfig context if any)."""
        super().__init__(f"HTTP {status}: {self.message}")

    @property
    def details(self) -> JSON:
        details = self.body.get("details")
        return details if isinstance(details, dict) else {}

    @property
    def causes(self) -> list[JSON]:
        causes = self.details.get("causes")
        return [c for c in causes if isinstance(c, dict)] if isinstance(causes, list) else []


@dataclass(frozen=True)
class ApiResource:
    """One discovered REST resource: where objects of a kind live."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None = None) -> str:
        prefix = (
            f"/api/{self.api_version}"
            if "/" not in self.api_version
            else f"/apis/{self.api_version}"
        )
        if self.namespaced:
            if not namespace:
                raise InvalidInput(f"{self.kind} is namespaced: metadata.namespace is required")
            prefix += f"/namespaces/{namespace}"
        prefix += f"/{self.plural}"
        return f"{prefix}/{name}" if name is not None else prefix


def _group_version_path(api_version: str) -> str:
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


# Characters a JSON encoder leaves raw that YAML (the body of server-side apply) refuses or
# reads as a line break: DEL, C1 controls (NEL among them), the Unicode line and paragraph
# separators, the byte-order mark and the two non-characters. They are escaped; everything
# else, astral characters included, goes as UTF-8.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def encode_body(body: Any) -> bytes:
    """``body`` as UTF-8 JSON that JSON and YAML parsers (go-yaml included) read alike.

    A string holding half of a UTF-16 surrogate pair is not text: InvalidInput.
    """
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    text = _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start]
        context = exc.object[max(0, exc.start - 40) : exc.start]
        raise InvalidInput(
            f"the object holds \\u{ord(bad):04x}, half of a UTF-16 surrogate pair, which is "
            f"not a character (after {context!r})"
        ) from None


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it wraps (urllib3 keeps them in ``reason`` or ``args``)."""
    found: list[BaseException] = []
    stack: list[object] = [exc]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or any(current is f for f in found):
            continue
        found.append(current)
        stack.extend([getattr(current, "reason", None), current.__cause__, *current.args])
    return found


def transport_failure(exc: BaseException, server: str) -> InvalidInput | Unavailable:
    """The runtime error for a request that got no HTTP answer from ``server``.

    A TLS certificate the kubeconfig does not trust is InvalidInput (retrying will not help);
    refused or reset connections, timeouts and DNS failures are Unavailable.
    """
    causes = _causes(exc)
    if any(
        isinstance(c, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(c)
        for c in causes
    ):
        return InvalidInput(
            f"Kubernetes API {server}: its TLS certificate is not trusted ({_short(exc)}); "
            "retrying will not help: check the kubeconfig's certificate-authority and server"
        )
    return Unavailable(f"Kubernetes API {server} unreachable: {_short(exc)}")


@dataclass
class KubeClient:
    """One cluster connection plus its discovery cache (safe to share across threads)."""

    api: k8s_client.ApiClient
    label: str
    _resources: dict[str, dict[str, ApiResource]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- requests ------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: JSON | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        """Send one request; the decoded JSON answer, ApiError on a failure status (see
        :meth:`exchange`)."""
        return self.exchange(method, path, query=query, body=body, content_type=content_type)[1]

    def exchange(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: JSON | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, JSON]:
        """Send one request; (the status, the decoded JSON answer), ApiError on a failure
        status.

        A JSON body goes as the client's (ASCII, escaped) JSON; any other content type, e.g.
        server-side apply's YAML, as :func:`encode_body`'s UTF-8 JSON.
        """
        headers = {
            **self.api.default_headers,
            "Accept": "application/json",
            "Content-Type": content_type,
        }
        data: bytes | None = None
        if body is not None:
            data = (
                json.dumps(body).encode("ascii")
                if content_type.startswith("application/json")
                else encode_body(body)
            )
        cfg = self.api.configuration
        for auth in cfg.auth_settings().values():  # the bearer token, refreshed by its hook
            if auth["in"] == "header" and auth["value"]:
                headers[auth["key"]] = auth["value"]
        url = cfg.host + path
        if query:
            url += "?" + urllib.parse.urlencode(sorted(query.items()))
        try:
            # the generated client's own request path (parameter sanitising, serialisation
            # and response wrapping) costs a third of a request's CPU; its connection pool,
            # TLS settings and retries are what this uses
            response = self.api.rest_client.pool_manager.request(
                method, url, body=data, headers=headers, timeout=_TIMEOUT, preload_content=True
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise transport_failure(exc, self.label) from None
        raw = response.data or b""
        text = raw.decode("utf-8", errors="replace")
        decoded = _decode(text)
        if response.status >= 400:
            raise ApiError(int(response.status), decoded, text[:500], self.label)
        return int(response.status), decoded or {}

    # ---- discovery -----------------------------------------------------------------------
    def resource_for(
        self, api_version: str, kind: str, *, refresh: bool = False
    ) -> ApiResource | None:
        """The REST resource serving ``kind`` in ``api_version``; re-discovered on a miss."""
        if not refresh:
            with self._lock:
                known = self._resources.get(api_version)
            if known is not None and kind in known:
                return known[kind]
        found = self._discover(api_version)
        with self._lock:
            self._resources[api_version] = found
        return found.get(kind)

    def undiscovered(self, kinds: list[tuple[str, str]]) -> list[str]:
        """The API versions of ``kinds`` ((apiVersion, kind) pairs) whose discovery, asked
        again (refreshing the cache), does not list the kind yet."""
        return [v for v, kind in kinds if self.resource_for(v, kind, refresh=True) is None]

    def forget(self, api_version: str) -> None:
        """Drop what discovery said of ``api_version``: the next lookup asks the server."""
        with self._lock:
            self._resources.pop(api_version, None)

    def forget_group(self, group: str) -> None:
        """Drop what discovery said of every version of ``group`` (its CRD was deleted)."""
        with self._lock:
            for known in [v for v in self._resources if v.rpartition("/")[0] == group]:
                del self._resources[known]

    def _discover(self, api_version: str) -> dict[str, ApiResource]:
        try:
            listing = self.request("GET", _group_version_path(api_version))
        except ApiError as exc:
            if exc.status == 404:  # the group/version is not served (yet)
                return {}
            raise
        found: dict[str, ApiResource] = {}
        for item in listing.get("resources") or []:
            name = str(item.get("name", ""))
            if "/" in name or not item.get("kind"):
                continue  # a subresource such as deployments/status
            found.setdefault(
                str(item["kind"]),
                ApiResource(api_version, str(item["kind"]), name, bool(item.get("namespaced"))),
            )
        return found

    def unserved(self, api_version: str, kind: str) -> tuple[str, bool | None]:
        """Why ``kind`` is not served in ``api_version``, and whether it soon may be.

        (reason, True): its CustomResourceDefinition or aggregated API exists but is not
        serving it yet; (reason, False): nothing in the cluster would serve it, waiting is
        pointless; ("", None): the cluster did not let us look (e.g. RBAC).
        """
        group, _, version = api_version.rpartition("/")
        try:
            if "." in group:  # only CRDs and aggregated APIs add kinds to a running cluster
                crd = self._crd_for(group, kind)
                if crd is not None:
                    return crd_state(crd, version)
                service = f"{version}.{group}"
                found = self._get_or_none(f"/apis/apiregistration.k8s.io/v1/apiservices/{service}")
                waiting = api_service_waiting(found) if found is not None else None
                if waiting is not None:
                    return f"its APIService {service} is not available yet ({waiting})", True
            served = self._served_versions(group)
        except ApiError:
            return "", None
        custom = "." in group
        if not served:
            reason = f"the API group {group!r} is not served"
            if custom:
                reason += f" and no CustomResourceDefinition defines kind {kind}"
            return reason + " (is the apiVersion right? is its CRD applied?)", False
        if version not in served:
            return f"group {group or 'core'} serves {', '.join(served)}, not {version}", False
        with self._lock:
            kinds = sorted(self._resources.get(api_version) or {})
        alike = [k for k in kinds if k.lower() == kind.lower()]
        hint = f"; did you mean {alike[0]}? (kinds are case-sensitive)" if alike else ""
        if custom:
            hint += " (is its CRD applied?)"
            missing = f"{api_version} has no kind {kind} and no CustomResourceDefinition"
            return f"{missing} defines it{hint}", False
        return f"{api_version} has no kind {kind}{hint}", False

    def _get_or_none(self, path: str, query: dict[str, str] | None = None) -> JSON | None:
        try:
            return self.request("GET", path, query=query)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _served_versions(self, group: str) -> list[str]:
        if not group:
            listing = self._get_or_none("/api") or {}
            return [str(v) for v in listing.get("versions") or []]
        listing = self._get_or_none(f"/apis/{group}") or {}
        return [str(v.get("version")) for v in listing.get("versions") or [] if v.get("version")]

    def _crd_for(self, group: str, kind: str) -> JSON | None:
        """The CustomResourceDefinition of ``kind`` in ``group``: by its usual name, else
        by listing them all."""
        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        guess = self._get_or_none(f"{crds}/{kind.lower()}s.{group}")
        if guess is not None and _defines(guess, group, kind):
            return guess
        query = {"limit": "200"}
        while True:
            page = self._get_or_none(crds, query) or {}
            for item in page.get("items") or []:
                if isinstance(item, dict) and _defines(item, group, kind):
                    return item
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return None
            query = {"limit": "200", "continue": str(token)}

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]


def _defines(crd: JSON, group: str, kind: str) -> bool:
    spec = crd.get("spec") or {}
    return bool(spec.get("group") == group and (spec.get("names") or {}).get("kind") == kind)


def api_service_waiting(service: JSON) -> str | None:
    """Why an aggregated API (one served by another server) is not available, or None when
    it is, or when the APIService is one of the server's own built-in groups."""
    if not (service.get("spec") or {}).get("service"):
        return None  # local: a built-in group, served by this very server
    for condition in (service.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Available":
            if condition.get("status") == "True":
                return None
            return " ".join(str(condition.get("message") or condition.get("reason")).split())
    return "no Available condition yet"


def crd_state(crd: JSON, version: str) -> tuple[str, bool]:
    """Why a CRD's kind is not served (yet): (reason, whether waiting may help)."""
    name = str((crd.get("metadata") or {}).get("name"))
    spec, status = crd.get("spec") or {}, crd.get("status") or {}
    served = [str(v.get("name")) for v in spec.get("versions") or [] if v.get("served")]
    if version not in served:
        versions = ", ".join(served) or "no version"
        return f"its CustomResourceDefinition {name} serves {versions}, not {version}", False
    if (crd.get("metadata") or {}).get("deletionTimestamp"):
        return f"its CustomResourceDefinition {name} is being deleted", False
    for condition in status.get("conditions") or []:
        if condition.get("type") == "NamesAccepted" and condition.get("status") == "False":
            why = " ".join(str(condition.get("message") or "").split())
            return f"its CustomResourceDefinition {name} is not accepted: {why}", False
    return f"its CustomResourceDefinition {name} is not established yet", True


def _decode(text: str | None) -> JSON | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _short(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    text = " ".join(str(reason or exc).split())
    text = re.sub(r"<urllib3[^>]*>:?\s*", "", text)
    return text[:300]


def _configuration() -> k8s_client.Configuration:
    cfg = k8s_client.Configuration()
    cfg.connection_pool_maxsize = POOL_CONNECTIONS  # preview runs up to 16 resources at once
    cfg.retries = 1  # fail fast: the activity retry policy owns retrying
    return cfg


REFRESH_SECONDS = 1.0
"""The kubeconfig loader's credential refresh (a token's expiry, a token file) runs before
every request; it is run at most this often (each run re-sets the whole configuration)."""


def _throttle_refresh(cfg: k8s_client.Configuration) -> None:
    """Run the loader's refresh hook at most every ``REFRESH_SECONDS``. The hook re-sets the
    whole configuration, its own hook included: the throttle puts itself back after each
    run, and throttles the hook that run installed."""
    hook = cfg.refresh_api_key_hook
    if hook is None:
        return
    lock = threading.Lock()
    last = [float("-inf")]
    current = [hook]

    def refresh(configuration: k8s_client.Configuration) -> None:
        with lock:
            now = time.monotonic()
            if now - last[0] < REFRESH_SECONDS:
                return
            last[0] = now
            current[0](configuration)
            installed = configuration.refresh_api_key_hook
            if installed is not refresh:
                if installed is not None:
                    current[0] = installed
                configuration.refresh_api_key_hook = refresh

    cfg.refresh_api_key_hook = refresh


def connect(kubeconfig: str | None, context: str | None) -> KubeClient:
    """A client for a kubeconfig (path, or ``KUBECONFIG``/~/.kube/config) or in-cluster config."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    default = Path.home() / ".kube" / "config"
    if path is None and not default.is_file() and _IN_CLUSTER_TOKEN.is_file():
        cfg = _configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except ConfigException as exc:
            raise InvalidInput(f"in-cluster Kubernetes config: {exc}") from None
        return KubeClient(k8s_client.ApiClient(cfg), f"{cfg.host} (in-cluster)")
    path = path or str(default)
    files = [p for p in path.split(os.pathsep) if p]
    if not any(Path(os.path.expanduser(p)).is_file() for p in files):
        raise InvalidInput(
            f"no Kubernetes cluster configured: kubeconfig {path} does not exist "
            "(set extensions.kubeConfig, the spec context kubeConfig, or KUBECONFIG)"
        )
    cfg = _configuration()
    try:
        # a KUBECONFIG list of paths is merged by the loader
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path,
            context=context,
            client_configuration=cfg,
            persist_config=False,
        )
    except (ConfigException, OSError, ValueError) as exc:
        where = f"{path}" + (f" context {context!r}" if context else "")
        raise InvalidInput(f"kubeconfig {where}: {exc}") from None
    _throttle_refresh(cfg)
    label = cfg.host + (f" (context {context})" if context else "")
    return KubeClient(k8s_client.ApiClient(cfg), label)
