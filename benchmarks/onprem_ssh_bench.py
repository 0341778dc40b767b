"""OnPrem over SSH, side by side: 1,000 files (default) spread over 4 hosts, each host a
real ``sshd`` on its own loopback address (tests/integration/sshhelp.py), written by

- stackflow: the OnPrem runtime in this process, every apply made at once (the runtime runs
  them in batches of its ``BATCH_LIMIT``, one SSH connection per host per batch, the hosts
  side by side) into empty directories; then the same apply again (nothing to write: every
  file read and compared over SFTP);
- rsync: one ``rsync -a`` per host, the 4 at once, from a local tree of the same files
  (already made) into empty directories;
- scp in a loop: one ``scp`` per file, the hosts side by side, each host's copies over one
  shared SSH connection (``ControlMaster``): the per-file copy an Ansible-style tool makes.

Wall seconds of each (medians) and stackflow's time over the others' (the median and range
of each run's ratio: the machine is shared).

    .venv/bin/python benchmarks/onprem_ssh_bench.py [--files 1000] [--hosts 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stackflow.runtimes.base import ResourceRequest, RuntimeOptions  # noqa: E402
from stackflow.runtimes.onprem import OnPremRuntime  # noqa: E402
from stackflow.runtimes.policy import load_policy  # noqa: E402
from tests.integration.sshhelp import Sshd, SshHosts  # noqa: E402


def content(i: int) -> str:
    return f"# file {i}\n" + f"setting_{i} = {'x' * 200}\n"


def ssh_options(hosts: SshHosts, h: Sshd, control: Path) -> list[str]:
    return [
        "-i", str(hosts.client_key), "-o", f"UserKnownHostsFile={hosts.known_hosts}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-F", "/dev/null",
        "-o", "ControlMaster=auto", "-o", f"ControlPath={control}", "-o", "ControlPersist=60",
    ]  # fmt: skip


async def stackflow(hosts: SshHosts, files: int, target: str) -> tuple[float, float]:
    env = {**hosts.env(), "STACKFLOW_ONPREM_ROOTS": str(hosts.base)}
    runtime = OnPremRuntime(load_policy(env))
    options = RuntimeOptions(project="bench", workspace="default")
    requests = []
    for i in range(files):
        h = hosts.hosts[i % len(hosts.hosts)]
        attrs = {
            "kind": "File",
            "path": f"{h.root}/{target}/f{i:05d}.conf",
            "content": content(i),
            "host": h.url,
        }
        requests.append(ResourceRequest(id=f"f{i}", type="OnPrem", attributes=attrs))
    times = []
    for _ in range(2):  # a first apply writes everything, a second finds it all in place
        started = time.perf_counter()
        await asyncio.gather(*(runtime.apply(r, options) for r in requests))
        times.append(time.perf_counter() - started)
    await runtime.close()
    return times[0], times[1]


def rsync(hosts: SshHosts, files: int, work: Path, target: str) -> float:
    work.mkdir()
    sources = []
    for n, h in enumerate(hosts.hosts):
        src = work / f"rsync-src{n}"
        src.mkdir()
        for i in range(n, files, len(hosts.hosts)):
            (src / f"f{i:05d}.conf").write_text(content(i))
        sources.append((h, src))

    def one(pair: tuple[Sshd, Path]) -> None:
        h, src = pair
        ssh = " ".join(["ssh", "-p", str(h.port), *ssh_options(hosts, h, work / f"rs{h.n}")])
        dest = f"{h.user}@{h.address}:{h.root}/{target}/"
        subprocess.run(["rsync", "-a", "-e", ssh, f"{src}/", dest], check=True)

    started = time.perf_counter()
    with ThreadPoolExecutor(len(sources)) as pool:
        list(pool.map(one, sources))
    return time.perf_counter() - started


def scp_loop(hosts: SshHosts, files: int, work: Path, target: str) -> float:
    work.mkdir()
    src = work / "scp-src"
    src.mkdir()
    for i in range(files):
        (src / f"f{i:05d}.conf").write_text(content(i))

    def one(h: Sshd) -> None:
        opts = ssh_options(hosts, h, work / f"cm{h.n}")
        at = f"{h.user}@{h.address}"
        subprocess.run(["ssh", "-p", str(h.port), *opts, at, f"mkdir -p {h.root}/{target}"],
                       check=True)  # fmt: skip
        for i in range(h.n, files, len(hosts.hosts)):
            name = f"f{i:05d}.conf"
            subprocess.run(["scp", "-q", "-P", str(h.port), *opts, str(src / name),
                            f"{at}:{h.root}/{target}/{name}"], check=True)  # fmt: skip

    started = time.perf_counter()
    with ThreadPoolExecutor(len(hosts.hosts)) as pool:
        list(pool.map(one, hosts.hosts))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs; medians and ranges (a shared machine)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="onprem-ssh-bench-"))
    runs: dict[str, list[float]] = {"apply": [], "again": [], "rsync": [], "scp": []}
    try:
        with SshHosts(work / "ssh", args.hosts) as hosts:
            for n in range(args.repeat):
                first, again = asyncio.run(stackflow(hosts, args.files, f"stackflow{n}"))
                runs["apply"].append(first)
                runs["again"].append(again)
                runs["rsync"].append(rsync(hosts, args.files, work / f"r{n}", f"rsync{n}"))
                runs["scp"].append(scp_loop(hosts, args.files, work / f"s{n}", f"scp{n}"))
        mid = {name: statistics.median(times) for name, times in runs.items()}
        ratios = {
            peer: sorted(a / b for a, b in zip(runs["apply"], runs[peer], strict=True))
            for peer in ("rsync", "scp")
        }
        print(f"{args.files} files over {args.hosts} hosts (sshd on loopback), wall seconds, "
              f"median of {args.repeat} (all: {runs})")  # fmt: skip
        print(f"  stackflow apply        {mid['apply']:7.2f}s")
        print(f"  stackflow apply again  {mid['again']:7.2f}s  (nothing to write)")
        print(f"  rsync -a, per host     {mid['rsync']:7.2f}s")
        print(f"  scp per file           {mid['scp']:7.2f}s")
        for peer, found in ratios.items():  # each run's apply over the same run's peer
            print(f"  stackflow / {peer:<10} {statistics.median(found):7.2f}x "
                  f"({found[0]:.2f}-{found[-1]:.2f})")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
