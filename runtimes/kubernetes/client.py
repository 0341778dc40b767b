"""A thin, synchronous Kubernetes API client: connection, raw JSON requests, discovery.

The official ``kubernetes`` package builds the connection (kubeconfig or in-cluster
config, TLS, tokens, exec plugins) and does the HTTP; requests are sent raw against the
REST paths so any kind, built-in or custom, goes through one code path and server-side
apply can send ``application/apply-patch+yaml``. Every method blocks: the runtime calls
them through ``asyncio.to_thread``.

Errors leave this module as :class:`ApiError` (the server answered with a failure status)
or :class:`runtimes.base.Unavailable` (it could not be reached at all).
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from runtimes.base import InvalidInput, Unavailable

JSON = dict[str, Any]
REQUEST_TIMEOUT = (5.0, 60.0)
"""(connect, read) seconds of one API request."""
_IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


class ApiError(Exception):
    """The API server answered with a failure ``Status``."""

    def __init__(self, status: int, body: JSON | None, text: str) -> None:
        self.status = status
        self.body = body or {}
        self.reason: str = str(self.body.get("reason") or "")
        self.message: str = str(self.body.get("message") or text or f"HTTP {status}").strip()
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
        """Send one request; the decoded JSON answer, ApiError on a failure status."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            _, url, headers, _, _ = self.api.param_serialize(
                method=method,
                resource_path=path,
                query_params=sorted((query or {}).items()),
                header_params=headers,
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(
                method, url, header_params=headers, body=body, _request_timeout=REQUEST_TIMEOUT
            )
            response.read()  # type: ignore[no-untyped-call]
        except k8s_client.ApiException as exc:  # raised by the client for TLS failures
            if exc.status and int(exc.status) >= 400:
                raise ApiError(int(exc.status), _decode(exc.body), str(exc.reason)) from None
            raise Unavailable(f"Kubernetes API {self.label} unreachable: {exc.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(f"Kubernetes API {self.label} unreachable: {_short(exc)}") from None
        raw = response.data or b""
        text = raw.decode("utf-8", errors="replace")
        decoded = _decode(text)
        if response.status >= 400:
            raise ApiError(int(response.status), decoded, text[:500])
        return decoded or {}

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

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]


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
    text = str(reason or exc)
    text = re.sub(r"<urllib3[^>]*>:?\s*", "", text)
    return text[:300]


def _configuration() -> k8s_client.Configuration:
    cfg = k8s_client.Configuration()
    cfg.connection_pool_maxsize = 32  # preview runs up to 16 resources at once
    cfg.retries = 1  # fail fast: the activity retry policy owns retrying
    return cfg


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
        return KubeClient(k8s_client.ApiClient(cfg), "in-cluster")
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
    label = cfg.host + (f" (context {context})" if context else "")
    return KubeClient(k8s_client.ApiClient(cfg), label)
