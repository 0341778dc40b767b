"""Static checks of the "run stackflow for real" deployment files.

No Docker engine is needed: ``docker-compose config`` (Compose v1, Debian's
``docker-compose`` package) validates ``docker-compose.yml``, and the rest of
the promises (pinned images, healthchecks, start-up order, the namespace and
search-attribute job, the worker's environment, the Dockerfile) are checked by
reading the files.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DEPLOY_DIR = ROOT / "deploy"

WORKER = "stackflow-worker"
REQUIRED_WORKER_ENV = {
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "STACKFLOW_TASK_QUEUE",
    "REDIS_URL",
    "STACKFLOW_HOME",
}
SEARCH_ATTRIBUTES = {
    "StackflowProject": "Keyword",
    "StackflowWorkspace": "Keyword",
    "StackflowPhase": "Keyword",
}
# Sources whose os.environ / os.getenv reads define the worker's environment.
ENV_SOURCES = ("worker.py", "stackflow", "activities", "runtimes")
# Variables set on the worker that a dependency, not stackflow code, reads.
READ_BY_LIBRARIES = {
    "KUBECONFIG": "kubernetes.config.load_kube_config()",
    "STACKFLOW_ONPREM_ROOTS": "stackflow.policy, through its table of policy variables",
}
# Variables the compose file substitutes; unset so the defaults are checked.
COMPOSE_VARIABLES = (
    "POSTGRES_PASSWORD",
    "STACKFLOW_WORKER_KUBECONFIG",
    "STACKFLOW_WORKER_TF_BIN",
    "COMPOSE_FILE",
    "COMPOSE_PROJECT_NAME",
)


# --------------------------------------------------------------------------
# helpers


def compose_binary() -> str:
    path = shutil.which("docker-compose")
    if path is None:
        pytest.fail(
            "docker-compose is not installed, so docker-compose.yml cannot be "
            "validated: run `apt-get install -y docker-compose` (Compose v1)",
            pytrace=False,
        )
    return path


def run_compose(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARIABLES}
    return subprocess.run(
        [compose_binary(), "-f", str(COMPOSE_FILE), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """docker-compose.yml as written."""
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """docker-compose.yml as the installed docker-compose understands it."""
    proc = run_compose("config")
    assert proc.returncode == 0, f"docker-compose config failed:\n{proc.stderr}"
    data = yaml.safe_load(proc.stdout)
    assert isinstance(data, dict)
    return data


def services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs = config.get("services")
    assert isinstance(svcs, dict), "no services in docker-compose.yml"
    return svcs


def environment(service: dict[str, Any]) -> dict[str, str | None]:
    """A service's environment, from either the mapping or the list form."""
    env = service.get("environment") or {}
    if isinstance(env, dict):
        return {str(k): None if v is None else str(v) for k, v in env.items()}
    out: dict[str, str | None] = {}
    for item in env:
        name, sep, value = str(item).partition("=")
        out[name] = value if sep else None
    return out


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """depends_on as {service: condition}; the short form means service_started."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def image_of(service: dict[str, Any]) -> str:
    image = service.get("image")
    assert isinstance(image, str), f"service has no image: {service}"
    return image


def services_with_image(config: dict[str, Any], repository: str) -> list[str]:
    return [
        name
        for name, svc in services(config).items()
        if isinstance(svc.get("image"), str) and svc["image"].split(":")[0] == repository
    ]


def command_words(service: dict[str, Any]) -> list[str]:
    words: list[str] = []
    for key in ("entrypoint", "command"):
        value = service.get(key)
        if isinstance(value, str):
            words.extend(value.split())
        elif isinstance(value, list):
            words.extend(str(v) for v in value)
    return words


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, PurePosixPath]]:
    """(host path, container path) of the service's bind mounts in the raw file."""
    mounts = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            if volume.get("type") != "bind":
                continue
            source, target = str(volume["source"]), str(volume["target"])
        else:
            parts = str(volume).split(":")
            if len(parts) < 2 or not parts[0].startswith((".", "/")):
                continue
            source, target = parts[0], parts[1]
        mounts.append(((ROOT / source).resolve(), PurePosixPath(target)))
    return mounts


def host_file(service: dict[str, Any], container_path: str) -> Path:
    """The file in this repo that a container path of the service resolves to."""
    wanted = PurePosixPath(container_path)
    for host, target in bind_mounts(service):
        if wanted == target or target in wanted.parents:
            return host.joinpath(*wanted.relative_to(target).parts)
    raise AssertionError(f"{container_path} is not under a bind mount of the service")


def script_of(service: dict[str, Any]) -> Path:
    scripts = [w for w in command_words(service) if w.endswith(".sh")]
    assert len(scripts) == 1, f"expected one .sh script in the command, got {scripts}"
    path = host_file(service, scripts[0])
    assert path.is_file(), f"{path} is missing"
    assert DEPLOY_DIR in path.parents, f"{path} is not under deploy/"
    return path


def published_ports(service: dict[str, Any]) -> set[tuple[int, int]]:
    """(host port, container port) pairs from short or long port syntax."""
    out = set()
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            out.add((int(port["published"]), int(port["target"])))
            continue
        spec = str(port).split("/")[0]
        parts = spec.split(":")
        if len(parts) >= 2:
            out.add((int(parts[-2]), int(parts[-1])))
    return out


def is_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name = image.rsplit("/", 1)[-1]
    if ":" not in name:
        return False
    tag = name.split(":", 1)[1]
    # A major-only tag such as postgres:16 floats, so require major.minor.
    return tag != "latest" and re.match(r"v?\d+\.\d+", tag) is not None


def python_sources() -> Iterator[Path]:
    for entry in ENV_SOURCES:
        path = ROOT / entry
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(path.rglob("*.py"))


def _is_environ(node: ast.expr) -> bool:
    # os.environ or a bare `environ` imported from os
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _reads_environ(func: ast.expr) -> bool:
    # os.environ.get/setdefault/pop(...), os.getenv(...), getenv(...)
    if isinstance(func, ast.Attribute):
        if func.attr in {"get", "setdefault", "pop"}:
            return _is_environ(func.value)
        return func.attr == "getenv"
    return isinstance(func, ast.Name) and func.id == "getenv"


def env_names_read(source: str) -> set[str]:
    """Names read through os.environ[...], os.environ.get(...), os.getenv(...).

    The name may be a string literal or a module-level constant holding one.
    """
    tree = ast.parse(source)
    constants: dict[str, str] = {}
    for stmt in tree.body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        if targets and isinstance(value, ast.Constant) and isinstance(value.value, str):
            for target in targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = value.value

    def name_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    found: set[str] = set()
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args and _reads_environ(node.func):
            key = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = node.slice
        elif (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and _is_environ(node.comparators[0])
        ):
            key = node.left
        if key is not None and (name := name_of(key)) is not None:
            found.add(name)
    return found


# --------------------------------------------------------------------------
# the compose file is valid for the installed docker-compose


def test_docker_compose_config_validates() -> None:
    version = subprocess.run(
        [compose_binary(), "version", "--short"], capture_output=True, text=True, check=False
    ).stdout.strip()
    proc = run_compose("config", "-q")
    assert proc.returncode == 0, (
        f"`docker-compose config -q` (docker-compose {version}) rejected "
        f"docker-compose.yml:\n{proc.stderr}"
    )


def test_installed_compose_keeps_the_start_up_conditions(resolved: dict[str, Any]) -> None:
    # An older docker-compose would silently drop conditions it does not know.
    svcs = services(resolved)
    assert depends_on(svcs["temporal"]).get("temporal-schema") == "service_completed_successfully"
    worker_deps = depends_on(svcs[WORKER])
    assert worker_deps.get("temporal-create-namespace") == "service_completed_successfully"
    assert worker_deps.get("redis") == "service_healthy"


def test_expected_services(raw: dict[str, Any]) -> None:
    assert set(services(raw)) >= {
        "postgresql",
        "temporal-schema",
        "temporal",
        "temporal-create-namespace",
        "temporal-ui",
        "redis",
        WORKER,
    }


# --------------------------------------------------------------------------
# images and health


def test_every_image_tag_is_pinned(resolved: dict[str, Any]) -> None:
    for name, svc in services(resolved).items():
        image = image_of(svc)
        assert is_pinned(image), f"{name}: image {image!r} is not pinned to a version tag"


def test_expected_images(resolved: dict[str, Any]) -> None:
    svcs = services(resolved)
    assert image_of(svcs["postgresql"]).startswith("postgres:")
    assert image_of(svcs["redis"]).startswith("redis:")
    assert image_of(svcs["temporal"]).startswith("temporalio/server:")
    assert image_of(svcs["temporal-ui"]).startswith("temporalio/ui:")
    for job in ("temporal-schema", "temporal-create-namespace"):
        assert image_of(svcs[job]).startswith("temporalio/admin-tools:")
    # Server and admin-tools (schema files, CLI) must come from the same release.
    server_tag = image_of(svcs["temporal"]).split(":", 1)[1]
    for job in ("temporal-schema", "temporal-create-namespace"):
        assert image_of(svcs[job]).split(":", 1)[1] == server_tag


@pytest.mark.parametrize("name", ["postgresql", "redis", "temporal"])
def test_healthcheck_present(raw: dict[str, Any], name: str) -> None:
    check = services(raw)[name].get("healthcheck")
    assert isinstance(check, dict), f"{name} has no healthcheck"
    assert not check.get("disable"), f"{name} disables its healthcheck"
    test = check.get("test")
    assert test and test != ["NONE"], f"{name} healthcheck has no test command"


def test_redis_healthcheck_pings(raw: dict[str, Any]) -> None:
    test = services(raw)["redis"]["healthcheck"]["test"]
    assert "redis-cli" in " ".join(test) and "ping" in " ".join(test)


# --------------------------------------------------------------------------
# Temporal: schema job, server, namespace job, UI


def test_schema_job_runs_before_the_server(raw: dict[str, Any]) -> None:
    svcs = services(raw)
    job = svcs["temporal-schema"]
    assert depends_on(job) == {"postgresql": "service_healthy"}
    assert job.get("restart", "no") == "no", "a one-shot job must not be restarted"
    assert depends_on(svcs["temporal"]) == {"temporal-schema": "service_completed_successfully"}


def test_schema_script_sets_up_both_databases(raw: dict[str, Any]) -> None:
    script = script_of(services(raw)["temporal-schema"])
    text = script.read_text()
    assert "temporal-sql-tool" in text
    assert "--plugin postgres12" in text
    for step in (" create", "setup-schema", "update-schema"):
        assert step in text, f"{script.name} never runs `temporal-sql-tool ...{step}`"
    assert re.search(r"DBNAME:=temporal\}", text)
    assert re.search(r"VISIBILITY_DBNAME:=temporal_visibility\}", text)
    assert "temporal/versioned" in text and "visibility/versioned" in text


def test_server_uses_postgres_and_the_dynamic_config(raw: dict[str, Any]) -> None:
    server = services(raw)["temporal"]
    env = environment(server)
    assert env["DB"] == "postgres12"
    assert env["POSTGRES_SEEDS"] == "postgresql"
    path = env["DYNAMIC_CONFIG_FILE_PATH"]
    assert path is not None
    config = host_file(server, path)
    assert config.is_file() and DEPLOY_DIR in config.parents
    assert isinstance(yaml.safe_load(config.read_text()), dict)
    assert (7233, 7233) in published_ports(server)


def test_namespace_job_registers_the_search_attributes(raw: dict[str, Any]) -> None:
    job = services(raw)["temporal-create-namespace"]
    assert depends_on(job) == {"temporal": "service_healthy"}
    assert job.get("restart", "no") == "no"
    env = environment(job)
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert env["TEMPORAL_NAMESPACE"] == "default"
    pairs = (env["STACKFLOW_SEARCH_ATTRIBUTES"] or "").split()
    registered = dict(pair.split("=", 1) for pair in pairs)
    assert registered == SEARCH_ATTRIBUTES

    text = script_of(job).read_text()
    assert "temporal operator namespace create" in text
    assert "temporal operator search-attribute create" in text
    assert "STACKFLOW_SEARCH_ATTRIBUTES" in text
    assert '--name "$name" --type "$type"' in text


def test_ui_on_8080(raw: dict[str, Any]) -> None:
    ui = services(raw)["temporal-ui"]
    assert (8080, 8080) in published_ports(ui)
    assert environment(ui)["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert depends_on(ui) == {"temporal": "service_healthy"}


def test_deploy_scripts_are_valid_sh() -> None:
    scripts = sorted(DEPLOY_DIR.rglob("*.sh"))
    assert scripts, "no scripts under deploy/"
    for script in scripts:
        proc = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"
        assert script.read_text().startswith("#!/bin/sh\n")


# --------------------------------------------------------------------------
# the worker


def test_worker_is_built_here_and_waits_for_its_dependencies(raw: dict[str, Any]) -> None:
    worker = services(raw)[WORKER]
    build = worker.get("build")
    if isinstance(build, str):
        build = {"context": build}
    assert isinstance(build, dict), f"{WORKER} is not built from this repository"
    context = build.get("context")
    dockerfile = build.get("dockerfile", "Dockerfile")
    assert context is not None and (ROOT / context).resolve() == ROOT
    assert (ROOT / context / dockerfile).resolve() == DOCKERFILE

    deps = depends_on(worker)
    assert deps.get("temporal") == "service_healthy"
    assert deps.get("redis") == "service_healthy"
    assert deps.get("temporal-create-namespace") == "service_completed_successfully"


def test_worker_state_is_on_a_named_volume(raw: dict[str, Any]) -> None:
    worker = services(raw)[WORKER]
    assert environment(worker)["STACKFLOW_HOME"] == "/data/stackflow"
    assert "stackflow-data:/data/stackflow" in worker.get("volumes", [])
    assert "stackflow-data" in (raw.get("volumes") or {})


def test_worker_environment_values(resolved: dict[str, Any]) -> None:
    env = environment(services(resolved)[WORKER])
    missing = REQUIRED_WORKER_ENV - set(env)
    assert not missing, f"{WORKER} does not set {sorted(missing)}"
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert env["TEMPORAL_NAMESPACE"] == "default"
    assert env["STACKFLOW_TASK_QUEUE"] == "stackflow"
    assert env["REDIS_URL"] == "redis://redis:6379/0"
    assert env["STACKFLOW_HOME"] == "/data/stackflow"


def test_env_name_scanner() -> None:
    source = (
        "import os\nfrom os import environ, getenv\nNAME = 'FROM_CONSTANT'\n"
        "os.environ.get('A')\nos.environ['B']\nos.getenv('C', 'x')\n"
        "environ.get(NAME)\ngetenv('D')\n'E' in os.environ\nos.environ.setdefault('F', '1')\n"
        "other.get('NOT_ENV')\n"
    )
    assert env_names_read(source) == {"A", "B", "C", "D", "E", "F", "FROM_CONSTANT"}


def test_every_worker_env_name_is_read_by_the_python_sources(raw: dict[str, Any]) -> None:
    set_on_worker = set(environment(services(raw)[WORKER]))
    assert set_on_worker >= REQUIRED_WORKER_ENV

    read: set[str] = set()
    scanned = []
    for path in python_sources():
        read |= env_names_read(path.read_text())
        scanned.append(str(path.relative_to(ROOT)))
    unread = sorted(set_on_worker - read - set(READ_BY_LIBRARIES))
    assert not unread, (
        f"{WORKER} sets {unread} in docker-compose.yml but no os.environ/os.getenv "
        f"read of them was found in {', '.join(ENV_SOURCES)} "
        f"({len(scanned)} files scanned). Either the worker/engine code has not "
        "landed yet or the names drifted apart."
    )


# --------------------------------------------------------------------------
# Dockerfile and .dockerignore


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile() -> None:
    instructions = dockerfile_instructions()
    froms = [arg for kw, arg in instructions if kw == "FROM"]
    assert len(froms) == 1
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", froms[0])

    runs = " ".join(arg for kw, arg in instructions if kw == "RUN")
    assert re.search(r"pip install [^&]*\buv==\d", runs), "uv must be installed, pinned, by pip"
    assert "uv sync --frozen --no-dev" in runs

    copied = " ".join(arg for kw, arg in instructions if kw == "COPY")
    for item in ("pyproject.toml", "uv.lock", "README.md", "worker.py"):
        assert item in copied
    for package in ("stackflow", "workflows", "activities", "runtimes", "cli"):
        assert f"{package}/" in copied

    users = [arg for kw, arg in instructions if kw == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert ("STOPSIGNAL", "SIGTERM") in instructions
    cmds = [arg for kw, arg in instructions if kw == "CMD"]
    assert cmds == ['["/app/.venv/bin/python", "worker.py"]']
    assert any(
        kw == "ENV" and "UV_PROJECT_ENVIRONMENT=/app/.venv" in arg for kw, arg in instructions
    )


def test_dockerignore() -> None:
    entries = {line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip()}
    for entry in (".venv", ".git", ".run", "**/__pycache__", ".pytest_cache", ".mypy_cache"):
        assert entry in entries, f".dockerignore does not exclude {entry}"
    # Everything the Dockerfile copies must stay in the build context.
    for needed in ("pyproject.toml", "uv.lock", "README.md", "worker.py", "stackflow"):
        assert needed not in entries


# --------------------------------------------------------------------------
# The compose worker's environment, for real


def dev_key_line() -> str:
    """The dev loop's key (the test's client encrypts with it) as compose passes a key."""
    import base64

    from stackflow.crypto import KeyRing

    ring = KeyRing.from_env()
    if ring is None:
        return ""
    return f"{ring.current}:{base64.b64encode(ring.keys[ring.current]).decode()}"


async def test_worker_runs_with_the_compose_environment_against_the_dev_postgres(
    resolved: dict[str, Any], tmp_path: Path
) -> None:
    """worker.py started with exactly the variables the compose file gives the worker, their
    values pointed from compose host names at the dev services: it migrates its own database
    and applies a stack into it."""
    import uuid

    from temporalio.client import Client

    from stackflow.codec import data_converter
    from stackflow.operation import OperationInput, OperationResult
    from stackflow.state.backend import open_backend
    from tests.integration.conftest import WorkerProcess, require_env

    compose_env = environment(services(resolved)[WORKER])
    assert compose_env["STACKFLOW_STATE_URL"] == (
        "postgresql://stackflow:stackflow@postgresql:5432/stackflow"
    )
    import psycopg
    import sqlalchemy as sa

    base = require_env("STACKFLOW_POSTGRES_URL")
    database = f"sf_compose_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    state_url = sa.make_url(base).set(database=database).render_as_string(hide_password=False)
    dev = {
        "TEMPORAL_ADDRESS": require_env("TEMPORAL_ADDRESS"),
        "TEMPORAL_NAMESPACE": compose_env["TEMPORAL_NAMESPACE"],
        "STACKFLOW_TASK_QUEUE": f"compose-{uuid.uuid4().hex[:8]}",
        "REDIS_URL": require_env("REDIS_URL"),
        "STACKFLOW_HOME": str(tmp_path / "data"),
        "STACKFLOW_STATE_URL": state_url,
        "KUBECONFIG": require_env("KUBECONFIG"),
        "STACKFLOW_TF_BIN": require_env("STACKFLOW_TF_BIN"),
        "STACKFLOW_ONPREM_ROOTS": str(tmp_path),
        "STACKFLOW_ENCRYPTION_KEY": dev_key_line(),
    }
    assert set(dev) == set(compose_env), "map every variable the compose worker gets"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **dev}
    worker = WorkerProcess(tmp_path, dev["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    try:
        client = await Client.connect(
            dev["TEMPORAL_ADDRESS"], namespace="default", data_converter=data_converter()
        )
        project = f"compose{uuid.uuid4().hex[:6]}"
        target = tmp_path / "hello.txt"
        spec = {
            "resources": [
                {
                    "id": f"onprem:File:{target}",
                    "type": "OnPrem",
                    "attributes": {"kind": "File", "path": str(target), "content": "hi\n"},
                }
            ]
        }
        result = await client.execute_workflow(
            "ApplyWorkflow",
            OperationInput(project=project, spec=spec, auto_approve=True),
            id=f"stackflow/{project}/default",
            task_queue=dev["STACKFLOW_TASK_QUEUE"],
            result_type=OperationResult,
        )
        assert result.phase == "succeeded", result.error
        backend = open_backend(state_url)
        try:
            [release] = backend.list(project, "default", with_state=True)
            assert release.phase == "succeeded" and len(release.state.resources) == 1
        finally:
            backend.close()
        assert target.read_text() == "hi\n"
    finally:
        worker.stop()
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
