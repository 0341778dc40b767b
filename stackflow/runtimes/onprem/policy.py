"""The OnPrem runtime's part of the worker policy: its paths live in the worker's file roots
(:mod:`stackflow.runtimes.file_roots`), and content is at most ``STACKFLOW_ONPREM_MAX_BYTES``
(default 1 MiB)."""

from __future__ import annotations

from stackflow.runtimes.file_roots import check_size
from stackflow.runtimes.policy import WorkerPolicy


def check_content(policy: WorkerPolicy, resource_id: str, content: str | None) -> None:
    if content is not None and len(content) * 4 > int(policy.onprem.max_bytes):
        size = len(content.encode("utf-8", errors="surrogatepass"))
        check_size(policy, resource_id, "attributes.content", size, "the content")
