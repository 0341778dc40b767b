"""The generated pages of the docs site: the HTTP API reference from the FastAPI app's OpenAPI
schema and the CLI reference from the `stackflow` command tree, both read from the code at
build time, so they cannot drift from it.

An MkDocs hook (mkdocs.yml: ``hooks: [scripts/docs_reference.py]``): ``on_files`` adds
``reference/http-api.md`` and ``reference/cli.md`` to the site as generated files (nothing
is written into docs/). Run alone it prints them:

    .venv/bin/python scripts/docs_reference.py http-api|cli

Nothing here needs a running service: the app is built with no Temporal client and no state
backend (building the schema touches neither), and every command module is imported to list
its options without running it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the tree being documented, not an installed copy

PAGES = {"reference/http-api.md": "http_api_page", "reference/cli.md": "cli_page"}

# ---------------------------------------------------------------------------------- Markdown


def _text(value: str) -> str:
    """Plain text for Markdown: code spans kept, HTML-looking and emphasis characters
    escaped, table pipes escaped, lines of one paragraph joined."""
    value = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", value)  # reST roles: :class:`X` -> `X`
    parts = re.split(r"(``.+?``|`[^`]*`)", value)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(part)
            continue
        part = part.replace("\\", "\\\\")
        for char, escaped in (("<", "&lt;"), (">", "&gt;"), ("*", "\\*")):
            part = part.replace(char, escaped)
        out.append(part.replace("|", "\\|"))
    return "".join(out)


def _paragraphs(value: str | None) -> list[str]:
    """A docstring or help text as Markdown paragraphs (one per blank-line block)."""
    if not value:
        return []
    blocks = re.split(r"\n\s*\n", value.replace("\b", "").strip())
    return [_text(" ".join(line.strip() for line in block.splitlines())) for block in blocks]


def _code(value: str) -> str:
    """``value`` as one inline code span, whatever backticks it holds."""
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


# ---------------------------------------------------------------------------------- HTTP API


def openapi_schema() -> dict[str, Any]:
    """The schema `stackflow serve` publishes at /openapi.json."""
    from stackflow.api.app import create_app
    from stackflow.api.auth import TokenTable

    async def no_temporal() -> Any:
        raise RuntimeError("the docs build connects to nothing")

    app = create_app(no_temporal, cast(Any, None), TokenTable([]), task_queue="stackflow")
    return app.openapi()


SECTIONS = (
    ("Runs", "/runs"),
    ("Releases and outputs", "/releases"),
    ("Releases and outputs", "/outputs"),
    ("Git sources", "/source"),
    ("Webhooks", "/v1/hooks/"),
    ("Notifications", "/notifications"),
    ("Policy", "/policy"),
    ("Health and metrics", ""),
)


def _section(path: str) -> str:
    return next(name for name, part in SECTIONS if part in path)


def _anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in a few words, with links to the named schemas it uses."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " or ".join(dict.fromkeys(_type(s) for s in schema[key]))
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {_type(schema['additionalProperties'])}"
    if "enum" in schema:
        return " \\| ".join(_code(str(v)) for v in schema["enum"])
    if "const" in schema:
        return _code(str(schema["const"]))
    return str(kind or "any")


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### {method.upper()} `{path}`", ""]
    if op.get("summary"):
        lines += [f"**{_text(op['summary'])}**", ""]
    for para in _paragraphs(op.get("description")):
        lines += [para, ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            default = ""
            if "default" in schema:
                default = f" (default {_code(json.dumps(schema['default']))})"
            described = " ".join(_paragraphs(p.get("description") or schema.get("description")))
            lines.append(
                f"| `{p['name']}` | {p['in']} | {_type(schema)} | "
                f"{'yes' if p.get('required') else 'no'} | {described}{default} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body ({_code(media)}): {_type(content.get('schema', {}))}", ""]
    responses = sorted(op.get("responses", {}).items())
    lines += ["| status | meaning | body |", "|---|---|---|"]
    errors = []
    for status, response in responses:
        content = response.get("content", {})
        shown = [
            f"{_type(c['schema'])} ({_code(media)})"
            for media, c in content.items()
            if c.get("schema")
        ]
        meaning = _text(response.get("description", ""))
        if status.startswith(("4", "5")) and not shown:
            errors.append(f"{status} {meaning}")
        else:
            lines.append(f"| {status} | {meaning} | {'; '.join(shown)} |")
    lines.append("")
    if errors:
        lines += [f"Errors ([problem+json](../guide/http-api.md#errors)): {'; '.join(errors)}.", ""]
    return [*lines, ""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#{_anchor(name)}}}", ""]
    for para in _paragraphs(schema.get("description")):
        lines += [para, ""]
    props = schema.get("properties", {})
    if not props:
        return [*lines, f"Type: {_type(schema)}", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | description |", "|---|---|---|---|"]
    for field, sub in props.items():
        default = f" Default: {_code(json.dumps(sub['default']))}." if "default" in sub else ""
        described = " ".join(_paragraphs(sub.get("description")))
        lines.append(
            f"| `{field}` | {_type(sub)} | {'yes' if field in required else 'no'} | "
            f"{described}{default} |"
        )
    return [*lines, ""]


def http_api_page() -> str:
    schema = openapi_schema()
    info = schema["info"]
    lines = [
        "# HTTP API reference",
        "",
        "<!-- generated by scripts/docs_reference.py from the FastAPI app; do not edit -->",
        "",
        f"Generated at build time from the OpenAPI {schema['openapi']} schema of "
        f"`stackflow serve` ({_text(info['title'])}, API version {info['version']}): "
        f"{_text(info.get('summary', ''))} A running server publishes the same schema at "
        "`/openapi.json` and an interactive page at `/docs`. How to authenticate, the roles, "
        "idempotent starts, errors and the event stream are explained in the "
        "[HTTP API guide](../guide/http-api.md).",
        "",
    ]
    by_section: dict[str, list[str]] = {}
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            by_section.setdefault(_section(path), []).extend(_operation(method, path, op))
    for name, _ in SECTIONS:
        if name in by_section:
            lines += [f"## {name}", "", *by_section.pop(name)]
    lines += ["## Schemas", ""]
    for name, sub in sorted(schema.get("components", {}).get("schemas", {}).items()):
        lines += _schema(name, sub)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------- CLI


def _command_tree() -> Any:
    """The `stackflow` command as click builds it (every command module imported)."""
    import typer.main

    from stackflow.cli.app import app
    from stackflow.cli.main import load_commands

    load_commands()
    return typer.main.get_command(app)


def _command(cmd: Any, ctx: Any, depth: int) -> list[str]:
    path = ctx.command_path
    lines = [f"{'#' * depth} {path} {{#{re.sub(r'[^a-z0-9]+', '-', path.lower())}}}", ""]
    for para in _paragraphs(cmd.help):
        lines += [para, ""]
    lines += ["```text", ctx.get_usage(), "```", ""]
    records = [(p, p.get_help_record(ctx)) for p in cmd.params if not getattr(p, "hidden", False)]
    if records:
        for param, record in records:
            names, help_text = record if record else (param.name.upper(), "")
            kind = "argument" if param.param_type_name == "argument" else ""
            extra = f" ({kind})" if kind else ""
            lines.append(f"- {_code(names)}{extra}: {' '.join(_paragraphs(help_text))}".rstrip())
        lines.append("")
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            lines += _command(sub, sub.context_class(sub, info_name=name, parent=ctx), depth + 1)
    return lines


def cli_page() -> str:
    root = _command_tree()
    ctx = root.context_class(root, info_name="stackflow")
    lines = [
        "# CLI reference",
        "",
        "<!-- generated by scripts/docs_reference.py from the typer app; do not edit -->",
        "",
        "Generated at build time from the `stackflow` command tree (each command's "
        "`--help`). The [getting started](../getting-started.md) page and the user guide "
        "show the commands at work.",
        "",
        *(f"{para}\n" for para in _paragraphs(root.help)),
        *(f"{para}\n" for para in _paragraphs(root.epilog)),
    ]
    for name in root.list_commands(ctx):
        sub = root.get_command(ctx, name)
        if sub is None or sub.hidden:
            continue
        lines += _command(sub, sub.context_class(sub, info_name=name, parent=ctx), 2)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------- hook


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, builder in PAGES.items():
        files.append(File.generated(config, uri, content=globals()[builder]()))
    return files


if __name__ == "__main__":
    wanted = sys.argv[1] if len(sys.argv) > 1 else ""
    page = {"http-api": http_api_page, "cli": cli_page}.get(wanted)
    if page is None:
        raise SystemExit("usage: docs_reference.py http-api|cli")
    sys.stdout.write(page())
