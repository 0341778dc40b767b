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
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from stackflow.core.refs import StackRef

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
    "StackflowDrift": "Bool",
}
# Sources whose os.environ / os.getenv reads define the worker's environment.
ENV_SOURCES = ("stackflow",)
# Variables set on the worker that a dependency, not stackflow code, reads.
READ_BY_LIBRARIES = {
    "KUBECONFIG": "kubernetes.config.load_kube_config()",
    "STACKFLOW_ONPREM_ROOTS": "stackflow.runtimes.policy, through its table of policy variables",
}
# Variables compose requires (`${VAR:?message}`, no default), with the dummy values the
# tests give them. Passwords go into URLs, so the dummies are URL-safe, as the header asks.
REQUIRED_SECRETS = {
    "POSTGRES_PASSWORD": "pg-Pass.1",
    "STACKFLOW_DB_PASSWORD": "sf-Pass.2",
    "REDIS_PASSWORD": "rd-Pass.3",
    "STACKFLOW_ENCRYPTION_KEY": "ci:" + "A" * 43 + "=",  # id ci, 32 zero bytes
    "STACKFLOW_CODEC_TOKEN": "cd-Token.4",
    "STACKFLOW_API_TOKENS_FILE": "/etc/stackflow-tests/api-tokens.json",
}
# Optional variables the compose file substitutes; unset so the defaults are checked.
COMPOSE_VARIABLES = (
    "STACKFLOW_CODEC_OIDC_ISSUER",
    "STACKFLOW_CODEC_OIDC_AUDIENCE",
    "STACKFLOW_CODEC_OIDC_JWKS_URL",
    "TEMPORAL_CODEC_PASS_ACCESS_TOKEN",
    "STACKFLOW_WORKER_KUBECONFIG",
    "STACKFLOW_WORKER_TF_BIN",
    "COMPOSE_FILE",
    "COMPOSE_PROJECT_NAME",
)
CODEC = "codec-server"
API = "stackflow-api"
UI = "temporal-ui"
# Every variable the Temporal UI image (temporalio/ui 2.54) reads into its configuration
# (ui-server v2.54.1's config/docker.yaml template, the UI the Temporal CLI v1.9.1 embeds);
# a name outside it is a typo the UI ignores.
UI_VARIABLES = {
    "TEMPORAL_ACTIVITY_COMMANDS_DISABLED",
    "TEMPORAL_ADDRESS",
    "TEMPORAL_AUTH_CALLBACK_URL",
    "TEMPORAL_AUTH_CLIENT_ID",
    "TEMPORAL_AUTH_CLIENT_SECRET",
    "TEMPORAL_AUTH_ENABLED",
    "TEMPORAL_AUTH_ISSUER_URL",
    "TEMPORAL_AUTH_LABEL",
    "TEMPORAL_AUTH_PROVIDER_URL",
    "TEMPORAL_AUTH_REDIRECT_TO_PROVIDER",
    "TEMPORAL_AUTH_SCOPES",
    "TEMPORAL_AUTH_TYPE",
    "TEMPORAL_AUTH_USE_ID_TOKEN_AS_BEARER",
    "TEMPORAL_BATCH_ACTIONS_DISABLED",
    "TEMPORAL_CLOUD_UI",
    "TEMPORAL_CODEC_DEFAULT_ERROR_LINK",
    "TEMPORAL_CODEC_DEFAULT_ERROR_MESSAGE",
    "TEMPORAL_CODEC_ENDPOINT",
    "TEMPORAL_CODEC_INCLUDE_CREDENTIALS",
    "TEMPORAL_CODEC_PASS_ACCESS_TOKEN",
    "TEMPORAL_CONFIG_REFRESH_INTERVAL",
    "TEMPORAL_CORS_ORIGINS",
    "TEMPORAL_CORS_UNSAFE_ALLOW_ALL_ORIGINS",
    "TEMPORAL_CSRF_COOKIE_INSECURE",
    "TEMPORAL_DEFAULT_NAMESPACE",
    "TEMPORAL_DISABLE_NEWS_FETCH",
    "TEMPORAL_DISABLE_WRITE_ACTIONS",
    "TEMPORAL_FEEDBACK_URL",
    "TEMPORAL_FORWARD_HEADERS",
    "TEMPORAL_HIDE_LOGS",
    "TEMPORAL_HIDE_WORKFLOW_QUERY_ERRORS",
    "TEMPORAL_NAV_COLLAPSED_BY_DEFAULT",
    "TEMPORAL_REFRESH_WORKFLOW_COUNTS_DISABLED",
    "TEMPORAL_SHOW_TEMPORAL_SYSTEM_NAMESPACE",
    "TEMPORAL_START_WORKFLOW_DISABLED",
    "TEMPORAL_TLS_CA",
    "TEMPORAL_TLS_CA_DATA",
    "TEMPORAL_TLS_CERT",
    "TEMPORAL_TLS_CERT_DATA",
    "TEMPORAL_TLS_ENABLE_HOST_VERIFICATION",
    "TEMPORAL_TLS_KEY",
    "TEMPORAL_TLS_KEY_DATA",
    "TEMPORAL_TLS_SERVER_NAME",
    "TEMPORAL_UI_ENABLED",
    "TEMPORAL_UI_PORT",
    "TEMPORAL_UI_PUBLIC_PATH",
    "TEMPORAL_UI_SERVER_TLS_CERT",
    "TEMPORAL_UI_SERVER_TLS_KEY",
    "TEMPORAL_WORKFLOW_CANCEL_DISABLED",
    "TEMPORAL_WORKFLOW_PAUSE_DISABLED",
    "TEMPORAL_WORKFLOW_RESET_DISABLED",
    "TEMPORAL_WORKFLOW_SIGNAL_DISABLED",
    "TEMPORAL_WORKFLOW_TERMINATE_DISABLED",
    "TEMPORAL_WORKFLOW_UPDATE_DISABLED",
}


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


def run_compose(
    *args: str, secrets: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """docker-compose with the required secrets set to their dummies (``secrets`` overrides
    them; None unsets one), the optional variables unset and no .env file read."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in COMPOSE_VARIABLES and k not in REQUIRED_SECRETS
    }
    for name, value in {**REQUIRED_SECRETS, **(secrets or {})}.items():
        if value is not None:
            env[name] = value
    with tempfile.TemporaryDirectory() as empty:
        env_file = Path(empty) / "empty.env"
        env_file.write_text("")
        return subprocess.run(
            [compose_binary(), "--env-file", str(env_file), "-f", str(COMPOSE_FILE), *args],
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(ready: Callable[[], bool], message: str, attempts: int = 120) -> None:
    """Poll ``ready`` (a start-up wait, not a timing assertion)."""
    for _ in range(attempts):
        if ready():
            return
        time.sleep(0.25)
    raise AssertionError(message)


def python_sources(entries: tuple[str, ...] = ENV_SOURCES) -> Iterator[Path]:
    for entry in entries:
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
        CODEC,
        WORKER,
        API,
    }


# --------------------------------------------------------------------------
# no default passwords, everything on loopback

SECRET_REFERENCE = re.compile(
    r"\$\{(?P<name>[A-Z0-9_]*(?:PASSWORD|SECRET|KEY|TOKEN)[A-Z0-9_]*)(?P<rest>[^}]*)\}"
)


def test_no_secret_has_a_default() -> None:
    """Every password, secret, key or token the file substitutes is required (`${VAR:?message}`
    naming the variable); the UI's switch to pass its users' access token is no secret."""
    found: dict[str, set[str]] = {}
    for match in SECRET_REFERENCE.finditer(COMPOSE_FILE.read_text()):
        found.setdefault(match["name"], set()).add(match["rest"])
    assert set(found) == set(REQUIRED_SECRETS) | {"TEMPORAL_CODEC_PASS_ACCESS_TOKEN"}, found
    for name in REQUIRED_SECRETS:
        for rest in found[name]:
            assert rest.startswith(":?") and f"set {name} in .env" in rest, (
                f"${{{name}{rest}}}: a secret must be required, with a message saying how to set it"
            )
    assert found["TEMPORAL_CODEC_PASS_ACCESS_TOKEN"] == {":-false"}


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
@pytest.mark.parametrize("name", sorted(REQUIRED_SECRETS))
def test_compose_refuses_to_start_without_a_required_secret(name: str, value: str | None) -> None:
    proc = run_compose("config", "-q", secrets={name: value})
    assert proc.returncode != 0, f"docker-compose accepted the file without {name}"
    assert f"set {name} in .env next to docker-compose.yml" in proc.stderr, proc.stderr


def test_the_dummy_secrets_are_what_the_services_get(resolved: dict[str, Any]) -> None:
    svcs = services(resolved)
    pg = REQUIRED_SECRETS["POSTGRES_PASSWORD"]
    assert environment(svcs["postgresql"])["POSTGRES_PASSWORD"] == pg
    assert environment(svcs["temporal"])["POSTGRES_PWD"] == pg
    assert environment(svcs["temporal-schema"])["SQL_PASSWORD"] == pg
    database = environment(svcs["stackflow-database"])
    assert database["PGPASSWORD"] == pg
    assert database["STACKFLOW_DB_PASSWORD"] == REQUIRED_SECRETS["STACKFLOW_DB_PASSWORD"]
    key = REQUIRED_SECRETS["STACKFLOW_ENCRYPTION_KEY"]
    assert environment(svcs[WORKER])["STACKFLOW_ENCRYPTION_KEY"] == key
    assert environment(svcs[CODEC])["STACKFLOW_ENCRYPTION_KEY"] == key


def port_bindings(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) of a resolved service's published ports."""
    out = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            out.append((str(port.get("host_ip", "")), int(port["published"]), int(port["target"])))
            continue
        parts = str(port).split("/")[0].split(":")
        host_ip = parts[0] if len(parts) == 3 else ""
        out.append((host_ip, int(parts[-2]), int(parts[-1])))
    return out


def test_every_published_port_binds_to_loopback_only(resolved: dict[str, Any]) -> None:
    published = {}
    for name, svc in services(resolved).items():
        for host_ip, host_port, target in port_bindings(svc):
            assert host_ip == "127.0.0.1", f"{name} publishes {host_port} on {host_ip or 'all'}"
            published[name] = (host_port, target)
    assert published == {
        "postgresql": (5432, 5432),
        "temporal": (7233, 7233),
        UI: (8080, 8080),
        CODEC: (8081, 8081),
        "redis": (6379, 6379),
        API: (8090, 8090),
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


@pytest.mark.parametrize("name", ["postgresql", "redis", "temporal", CODEC])
def test_healthcheck_present(raw: dict[str, Any], name: str) -> None:
    check = services(raw)[name].get("healthcheck")
    assert isinstance(check, dict), f"{name} has no healthcheck"
    assert not check.get("disable"), f"{name} disables its healthcheck"
    test = check.get("test")
    assert test and test != ["NONE"], f"{name} healthcheck has no test command"


def test_redis_healthcheck_pings(raw: dict[str, Any]) -> None:
    test = services(raw)["redis"]["healthcheck"]["test"]
    assert "redis-cli" in " ".join(test) and "ping" in " ".join(test)


def container_shell(words: list[str]) -> str:
    """A `CMD-SHELL` healthcheck or `sh -c` command as the container's shell receives it
    (compose turns `$$` into `$`; `config` prints it escaped again)."""
    return words[-1].replace("$$", "$")


def test_redis_requires_its_password_and_the_worker_and_healthcheck_use_it(
    resolved: dict[str, Any], tmp_path: Path
) -> None:
    """The compose Redis command and healthcheck, run for real (a throwaway redis-server on a
    free port): no password, no PING; the healthcheck passes only with the right password;
    the worker's REDIS_URL authenticates."""
    import redis as redis_client

    server = shutil.which("redis-server")
    if server is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server/redis-cli missing: run `make setup`", pytrace=False)
    svc = services(resolved)["redis"]
    command = svc["command"]
    assert command[:2] == ["/bin/sh", "-c"] and "--requirepass" in command[-1]
    check = svc["healthcheck"]["test"]
    assert check[0] == "CMD-SHELL"
    password = environment(svc)["REDIS_PASSWORD"]
    assert password == REQUIRED_SECRETS["REDIS_PASSWORD"]
    port = free_port()
    env = {"PATH": os.environ["PATH"], "REDIS_PASSWORD": password}
    proc = subprocess.Popen(
        [
            "sh",
            "-c",
            f"{container_shell(command)} --port {port} --bind 127.0.0.1 --dir {tmp_path} --save ''",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        healthcheck = container_shell(check).replace("redis-cli", f"redis-cli -p {port}")

        def healthy(with_password: str) -> bool:
            result = subprocess.run(
                ["sh", "-c", healthcheck],
                env={**env, "REDIS_PASSWORD": with_password},
                capture_output=True,
                timeout=30,
            )
            return result.returncode == 0

        wait_until(lambda: healthy(password), "the compose Redis never became healthy")
        assert not healthy("wrong-password"), "the healthcheck passes without the password"
        anonymous = subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, timeout=30
        )
        assert "NOAUTH" in anonymous.stdout + anonymous.stderr
        url = environment(services(resolved)[WORKER])["REDIS_URL"]
        assert url == f"redis://:{password}@redis:6379/0"
        client = redis_client.Redis.from_url(url.replace("@redis:6379", f"@127.0.0.1:{port}"))
        try:
            assert client.ping() is True
        finally:
            client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
    ui = services(raw)[UI]
    assert (8080, 8080) in published_ports(ui)
    assert environment(ui)["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert depends_on(ui) == {"temporal": "service_healthy", CODEC: "service_started"}


def test_ui_variables_are_ones_the_ui_reads(raw: dict[str, Any]) -> None:
    unknown = sorted(set(environment(services(raw)[UI])) - UI_VARIABLES)
    assert not unknown, f"{UI} sets {unknown}, which the Temporal UI image does not read"


def test_ui_write_actions_are_configured_explicitly(resolved: dict[str, Any]) -> None:
    env = environment(services(resolved)[UI])
    # Steering runs (Updates), cancel, terminate, reset: on; batch actions, starting runs
    # from hand-written input and pausing a run: off. Each one said, none left to the image's
    # defaults.
    expected = {
        "TEMPORAL_DISABLE_WRITE_ACTIONS": "false",
        "TEMPORAL_WORKFLOW_UPDATE_DISABLED": "false",
        "TEMPORAL_WORKFLOW_SIGNAL_DISABLED": "false",
        "TEMPORAL_WORKFLOW_CANCEL_DISABLED": "false",
        "TEMPORAL_WORKFLOW_TERMINATE_DISABLED": "false",
        "TEMPORAL_WORKFLOW_RESET_DISABLED": "false",
        "TEMPORAL_BATCH_ACTIONS_DISABLED": "true",
        "TEMPORAL_START_WORKFLOW_DISABLED": "true",
        "TEMPORAL_WORKFLOW_PAUSE_DISABLED": "true",
    }
    assert {name: env.get(name) for name in expected} == expected


def test_ui_decodes_through_the_published_codec_server(resolved: dict[str, Any]) -> None:
    """The browser, not the UI server, calls the codec endpoint: it must be the codec
    server's published loopback address, and the codec server must allow the UI's origins."""
    svcs = services(resolved)
    env = environment(svcs[UI])
    [(host_ip, codec_port, _)] = port_bindings(svcs[CODEC])
    assert env["TEMPORAL_CODEC_ENDPOINT"] == f"http://{host_ip}:{codec_port}"
    assert env["TEMPORAL_CODEC_PASS_ACCESS_TOKEN"] == "false"
    assert env["TEMPORAL_CODEC_INCLUDE_CREDENTIALS"] == "false"
    [(_, ui_port, _)] = port_bindings(svcs[UI])
    words = command_words(svcs[CODEC])
    origins = {words[i + 1] for i, word in enumerate(words) if word == "--origin"}
    assert origins == {f"http://127.0.0.1:{ui_port}", f"http://localhost:{ui_port}"}


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
    assert env["REDIS_URL"] == f"redis://:{REQUIRED_SECRETS['REDIS_PASSWORD']}@redis:6379/0"
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
# the codec server


def test_codec_server_is_the_worker_image_with_the_same_key(raw: dict[str, Any]) -> None:
    svcs = services(raw)
    codec, worker = svcs[CODEC], svcs[WORKER]
    assert codec.get("image") == worker.get("image")
    assert codec.get("build") == worker.get("build")
    words = command_words(codec)
    assert words[:2] == ["stackflow", "codec-server"]
    # Inside its container it must listen on every interface (published on loopback only).
    assert words[words.index("--host") + 1] == "0.0.0.0"
    [(_, container_port)] = published_ports(codec)
    assert words[words.index("--port") + 1] == str(container_port)
    env = environment(codec)
    assert env["STACKFLOW_ENCRYPTION_KEY"] == environment(worker)["STACKFLOW_ENCRYPTION_KEY"]
    assert set(env) == {
        "STACKFLOW_ENCRYPTION_KEY",
        "STACKFLOW_CODEC_TOKEN",
        "STACKFLOW_CODEC_OIDC_ISSUER",
        "STACKFLOW_CODEC_OIDC_AUDIENCE",
        "STACKFLOW_CODEC_OIDC_JWKS_URL",
    }
    read: set[str] = set()
    for path in python_sources(("cli", "stackflow")):
        read |= env_names_read(path.read_text())
    assert set(env) <= read, f"{CODEC} sets {sorted(set(env) - read)}, which no code reads"


def post(
    url: str, body: bytes, headers: dict[str, str], method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body or None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_the_compose_codec_server_refuses_to_start_without_its_token(
    resolved: dict[str, Any],
) -> None:
    """Its compose command listens on every interface: with no token (nor OIDC) it decodes
    for anyone, so it refuses to start, exit 2, one line."""
    import sys

    svc = services(resolved)[CODEC]
    env = {k: v for k, v in environment(svc).items() if v is not None}
    env["STACKFLOW_CODEC_TOKEN"] = ""
    words = command_words(svc)
    words[words.index("--port") + 1] = str(free_port())
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        words,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(ROOT / ".run"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc
    assert proc.stderr.startswith("Error: codec server on 0.0.0.0: decoding for anyone")


@pytest.mark.parametrize("token", [None, "s3cret-token"], ids=["compose-token", "other-token"])
def test_codec_server_runs_with_the_compose_command(
    resolved: dict[str, Any], token: str | None
) -> None:
    """The compose command and environment, run for real (on a free loopback port instead of
    0.0.0.0:8081): it decodes what a client with the compose key encodes, answers CORS for
    the UI's origins only, and refuses requests without its STACKFLOW_CODEC_TOKEN."""
    import asyncio
    import json
    import sys

    from google.protobuf import json_format
    from temporalio.api.common.v1 import Payloads

    from stackflow.core.crypto import KeyRing
    from stackflow.temporal.codec import data_converter

    svc = services(resolved)[CODEC]
    words = command_words(svc)
    port = free_port()
    words[words.index("--host") + 1] = "127.0.0.1"
    words[words.index("--port") + 1] = str(port)
    env = {k: v for k, v in environment(svc).items() if v is not None}
    assert env["STACKFLOW_CODEC_TOKEN"] == REQUIRED_SECRETS["STACKFLOW_CODEC_TOKEN"]
    if token is None:
        token = env["STACKFLOW_CODEC_TOKEN"]
    env["STACKFLOW_CODEC_TOKEN"] = token
    bin_dir = Path(sys.executable).parent  # the image puts /app/.venv/bin first on PATH
    proc = subprocess.Popen(
        words,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(ROOT / ".run"), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"codec server exited: {proc.stderr.read()!r}")  # type: ignore[union-attr]
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, "the codec server never listened")
        ring = KeyRing.parse(env["STACKFLOW_ENCRYPTION_KEY"], "compose")
        encoded = asyncio.run(data_converter(ring).encode([{"project": "compose-codec"}]))
        assert b"compose-codec" not in b"".join(p.data for p in encoded)
        body = json.dumps(json_format.MessageToDict(Payloads(payloads=encoded))).encode()
        base = f"http://127.0.0.1:{port}"
        headers = {"Content-Type": "application/json", "X-Namespace": "default"}
        ui_origins = {w for i, w in enumerate(words) if i and words[i - 1] == "--origin"}
        for origin in ui_origins:
            status, got, _ = post(f"{base}/decode", b"", {"Origin": origin}, method="OPTIONS")
            assert status == 204 and got.get("Access-Control-Allow-Origin") == origin
        status, got, _ = post(f"{base}/decode", b"", {"Origin": "http://evil.example"}, "OPTIONS")
        assert "Access-Control-Allow-Origin" not in got

        status, _, reply = post(f"{base}/decode", body, headers)
        assert status == 401
        headers["Authorization"] = f"Bearer {token}"
        status, _, reply = post(f"{base}/decode", body, headers)
        assert status == 200, reply
        decoded = json_format.Parse(reply, Payloads())
        assert [json.loads(p.data) for p in decoded.payloads] == [{"project": "compose-codec"}]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
    for item in ("pyproject.toml", "uv.lock", "README.md", "stackflow/"):
        assert item in copied

    users = [arg for kw, arg in instructions if kw == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert ("STOPSIGNAL", "SIGTERM") in instructions
    cmds = [arg for kw, arg in instructions if kw == "CMD"]
    assert cmds == ['["/app/.venv/bin/python", "-m", "stackflow.worker"]']
    assert any(
        kw == "ENV" and "UV_PROJECT_ENVIRONMENT=/app/.venv" in arg for kw, arg in instructions
    )


def test_worker_runs_as_a_fixed_unprivileged_user_owning_its_volumes(
    raw: dict[str, Any],
) -> None:
    """The image's last USER is a system user with a fixed uid (so volume ownership is
    stable across rebuilds), and every named-volume mount point of the services built from
    the image is created and owned by it (a fresh named volume copies that ownership, so it
    stays writable)."""
    instructions = dockerfile_instructions()
    user = [arg for kw, arg in instructions if kw == "USER"][-1].split(":")[0]
    runs = " ".join(arg for kw, arg in instructions if kw == "RUN")
    created = re.search(rf"useradd\b[^&]*--uid (\d+)[^&]*\b{re.escape(user)}\b", runs)
    assert created, f"USER {user} is not created with a fixed --uid"
    assert int(created[1]) >= 1000
    assert re.search(rf"groupadd\b[^&]*--gid {created[1]}\b", runs)
    chowned: set[str] = set()
    for match in re.finditer(rf"chown {re.escape(user)}:{re.escape(user)} ([^&]+)", runs):
        chowned |= set(match[1].split())
    made: set[str] = set()
    for match in re.finditer(r"mkdir -p ([^&]+)", runs):
        made |= set(match[1].split())
    built = [name for name, svc in services(raw).items() if "build" in svc]
    assert set(built) == {WORKER, CODEC, API}
    targets = set()
    for name in built:
        for volume in services(raw)[name].get("volumes") or []:
            source, target = str(volume).split(":")[:2]
            if not source.startswith((".", "/", "${")):  # a bind mount of a host path
                targets.add(target)
    assert targets == {"/data/stackflow", "/data/onprem"}
    assert targets <= made and targets <= chowned, (targets, made, chowned)
    onprem = environment(services(raw)[WORKER])["STACKFLOW_ONPREM_ROOTS"]
    assert onprem in targets, "the OnPrem root must be a writable volume"


def test_dockerignore() -> None:
    entries = {line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip()}
    for entry in (".venv", ".git", ".run", "**/__pycache__", ".pytest_cache", ".mypy_cache"):
        assert entry in entries, f".dockerignore does not exclude {entry}"
    # Everything the Dockerfile copies must stay in the build context.
    for needed in ("pyproject.toml", "uv.lock", "README.md", "stackflow"):
        assert needed not in entries


# --------------------------------------------------------------------------
# The compose worker's environment, for real


def dev_key_line() -> str:
    """The dev loop's key (the test's client encrypts with it) as compose passes a key."""
    import base64

    from stackflow.core.crypto import KeyRing

    ring = KeyRing.from_env()
    if ring is None:
        return ""
    return f"{ring.current}:{base64.b64encode(ring.keys[ring.current]).decode()}"


async def test_worker_runs_with_the_compose_environment_against_the_dev_postgres(
    resolved: dict[str, Any], tmp_path: Path
) -> None:
    """The worker started with exactly the variables the compose file gives the worker, their
    values pointed from compose host names at the dev services: it migrates its own database
    and applies a stack into it."""
    import uuid

    from temporalio.client import Client

    from stackflow.state.backend import open_backend
    from stackflow.temporal.codec import data_converter
    from stackflow.temporal.operation import OperationInput, OperationResult
    from tests.integration.conftest import WorkerProcess, require_env

    compose_env = environment(services(resolved)[WORKER])
    assert compose_env["STACKFLOW_STATE_URL"] == (
        f"postgresql://stackflow:{REQUIRED_SECRETS['STACKFLOW_DB_PASSWORD']}"
        "@postgresql:5432/stackflow"
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
            [release] = backend.list(StackRef(project, "default"), with_state=True)
            assert release.phase == "succeeded" and len(release.state.resources) == 1
        finally:
            backend.close()
        assert target.read_text() == "hi\n"
    finally:
        worker.stop()
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_api_is_the_worker_image_on_the_worker_state_with_a_mounted_tokens_file(
    raw: dict[str, Any], resolved: dict[str, Any]
) -> None:
    svcs = services(raw)
    api, worker = svcs[API], svcs[WORKER]
    assert api.get("image") == worker.get("image") and api.get("build") == worker.get("build")
    words = command_words(api)
    assert words[:2] == ["stackflow", "serve"]
    assert words[words.index("--host") + 1] == "0.0.0.0"
    [(_, container_port)] = published_ports(api)
    assert words[words.index("--port") + 1] == str(container_port)
    assert depends_on(api).get("stackflow-worker") == "service_started"
    env = environment(services(resolved)[API])
    worker_env = environment(services(resolved)[WORKER])
    for name in ("STACKFLOW_STATE_URL", "STACKFLOW_ENCRYPTION_KEY", "TEMPORAL_ADDRESS"):
        assert env[name] == worker_env[name], name
    assert env["STACKFLOW_TASK_QUEUE"] == worker_env["STACKFLOW_TASK_QUEUE"]
    mounts = [str(v) for v in api.get("volumes") or []]
    assert any(m.endswith(f":{env['STACKFLOW_API_TOKENS']}:ro") for m in mounts), mounts
    assert "healthcheck" in api
