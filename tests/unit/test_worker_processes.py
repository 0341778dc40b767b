"""``--processes``: how many worker processes, their metrics ports and their environment."""

from __future__ import annotations

import os

import pytest

from stackflow.worker.processes import (
    INDEX_ENV,
    PROCESSES_ENV,
    ProcessesError,
    child_env,
    describe_index,
    metrics_addresses,
    process_count,
)


def test_a_number_of_processes_or_auto() -> None:
    assert process_count(None) == 1
    assert process_count("  ") == 1
    assert process_count("3") == 3
    assert process_count("AUTO") == len(os.sched_getaffinity(0))
    for bad in ("0", "65", "-1", "two", "1.5"):
        with pytest.raises(ProcessesError, match=rf"worker processes '{bad}': give a number"):
            process_count(bad)


def test_each_process_serves_metrics_on_its_own_port() -> None:
    assert metrics_addresses(None, 3) == [None, None, None]
    assert metrics_addresses("127.0.0.1:9464", 3) == [
        "127.0.0.1:9464",
        "127.0.0.1:9465",
        "127.0.0.1:9466",
    ]
    assert metrics_addresses("[::1]:9000", 2) == ["[::1]:9000", "[::1]:9001"]
    for bad in ("9464", "host:", "host:port", "host:65535"):
        with pytest.raises(ProcessesError, match="metrics address"):
            metrics_addresses(bad, 2)


def test_a_process_is_told_it_is_one_of_several() -> None:
    metrics = "STACKFLOW_METRICS_ADDRESS"
    env = child_env({metrics: "h:1", PROCESSES_ENV: "4", "A": "b"}, 2, 4, "h:3")
    assert env == {"A": "b", PROCESSES_ENV: "1", INDEX_ENV: "2/4", metrics: "h:3"}
    assert child_env({metrics: "h:1"}, 0, 2, None) == {PROCESSES_ENV: "1", INDEX_ENV: "0/2"}
    assert describe_index({INDEX_ENV: "2/4"}) == f"process 3 of 4, pid {os.getpid()}"
    assert describe_index({}) is None
    assert describe_index({INDEX_ENV: "x"}) is None
