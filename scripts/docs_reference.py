"""Write the generated reference pages of the documentation site.

- docs/reference/settings.md: between its markers, every environment variable the code reads
  (every `PRACTICUM_*` one, and Django's own), with its default and the comment beside it;
- docs/reference/commands.md: the project's management commands and their arguments;
- docs/reference/api.md: the REST API, rendered from the OpenAPI schema (drf-spectacular);
- docs/decisions/index.md and docs/experiments/index.md: every record and experiment, by title.

`python scripts/docs_reference.py` rewrites them; `--check` exits 1 naming each page that is
out of date (tests/docs/ runs the same comparison).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SETTINGS_PAGE = DOCS / "reference" / "settings.md"
COMMANDS_PAGE = DOCS / "reference" / "commands.md"
API_PAGE = DOCS / "reference" / "api.md"
DECISIONS_PAGE = DOCS / "decisions" / "index.md"
EXPERIMENTS_PAGE = DOCS / "experiments" / "index.md"
START = "<!-- generated: every setting (scripts/docs_reference.py) -->"
END = "<!-- end of generated settings -->"

# Where settings are read: the site and its workers, the scripts beside them, and the test
# suite's own fixtures (not the tests, which set variables rather than read settings).
SITE = ["webapp", "feedback", "training"]
SCRIPTS = ["scripts", "manage.py"]
TEST_SUITE = ["tests/conftest.py", "tests/fixtures"]
NAME = re.compile(r"\bPRACTICUM_[A-Z0-9_]+")
# Environment variables without the prefix that webapp/settings.py reads.
DJANGO_NAMES = re.compile(r'os\.environ(?:\.get)?[(\[]"([A-Z][A-Z0-9_]+)"')
# Families of variables named at run time; a family is listed once.
FAMILIES = {
    "PRACTICUM_JUDGE_KEY_": (
        "PRACTICUM_JUDGE_KEY_<NAME>",
        "a deployment's own judge key: its judge endpoint names the variable (admin → Deployment "
        "judge endpoints); no other variable may be named",
    ),
}


def _sources(entries: Iterable[str]) -> list[Path]:
    files: list[Path] = []
    for entry in entries:
        path = ROOT / entry
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in {".py", ".sh"} and "migrations" not in p.parts)
    return files


def _block_above(lines: list[str], index: int) -> list[str]:
    """The comment lines right above line `index` (0-based), without a blank line between."""
    found: list[str] = []
    i = index - 1
    while i >= 0 and lines[i].strip().startswith("#"):
        found.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return found


def _statements(path: Path) -> list[ast.stmt]:
    if path.suffix != ".py":
        return []
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.stmt)]


def _explanation(lines: list[str], statements: list[ast.stmt], index: int, name: str) -> str:
    """The comment that explains the read on line `index`: right above its statement, first in
    its block, or heading its paragraph when that comment names it."""
    enclosing = [s for s in statements if s.lineno - 1 <= index <= (s.end_lineno or s.lineno) - 1]
    statement = min(enclosing, key=lambda s: (s.end_lineno or s.lineno) - s.lineno) if enclosing else None
    first = statement.lineno - 1 if statement else index
    direct = _block_above(lines, first)
    if not direct and statement is not None and isinstance(statement, ast.If) and statement.body:
        direct = _block_above(lines, statement.body[0].lineno - 1)
    if not direct:
        same_line = lines[index].split("  # ", 1)
        direct = [same_line[1].strip()] if len(same_line) == 2 else []
    if direct:
        return " ".join(direct)
    targets = {name}
    if isinstance(statement, ast.Assign | ast.AnnAssign):
        for target in statement.targets if isinstance(statement, ast.Assign) else [statement.target]:
            if isinstance(target, ast.Name):
                targets.add(target.id)
    i = first - 1
    while i >= 0 and lines[i].strip() and not lines[i].strip().startswith("#"):
        i -= 1
    heading = " ".join(_block_above(lines, i + 1))
    return heading if any(re.search(rf"\b{t}\b", heading) for t in targets) else ""


def _python_defaults(path: Path) -> dict[str, str]:
    """`os.environ.get(NAME, default)`, `env_bool(NAME, default)` and `... or default` reads."""
    tree = ast.parse(path.read_text())
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            for value in node.values[:-1]:
                name = _read_name(value)
                if name and name not in found:
                    found[name] = ast.unparse(node.values[-1])
        if isinstance(node, ast.Call):
            name = _read_name(node)
            if name and len(node.args) > 1 and name not in found:
                found[name] = ast.unparse(node.args[1])
    return found


def _read_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        value = node.args[0].value
        if isinstance(value, str) and re.fullmatch(r"[A-Z][A-Z0-9_]+", value):
            return value
    return None


def _shell_defaults(path: Path) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"\$\{(PRACTICUM_[A-Z0-9_]+):-([^}]*)\}", path.read_text())}


def settings_read() -> dict[str, dict]:
    """Every variable the code reads: name → where, default and the comment that explains it."""
    found: dict[str, dict] = {}
    groups = [("site", _sources(SITE)), ("scripts", _sources(SCRIPTS)), ("test suite", _sources(TEST_SUITE))]
    for group, files in groups:
        for path in files:
            text = path.read_text()
            lines = text.splitlines()
            statements = _statements(path)
            defaults = _python_defaults(path) if path.suffix == ".py" else _shell_defaults(path)
            rel = path.relative_to(ROOT).as_posix()
            names = [(m.group(0), text.count("\n", 0, m.start())) for m in NAME.finditer(text)]
            if rel == "webapp/settings.py":
                names += [(m.group(1), text.count("\n", 0, m.start())) for m in DJANGO_NAMES.finditer(text)]
            for name, line in names:
                if name.endswith("_"):
                    family = next((f for f in FAMILIES if name.startswith(f)), None)
                    if family is None:
                        continue  # a prefix matched in passing (`PRACTICUM_JUDGE_*` in a comment)
                    name = FAMILIES[family][0]
                entry = found.setdefault(name, {"group": group, "files": [], "default": "", "meaning": ""})
                if rel not in entry["files"]:
                    entry["files"].append(rel)
                if not entry["default"] and name in defaults:
                    entry["default"] = defaults[name]
                in_comment = lines[line].lstrip().startswith("#")
                if not entry["meaning"] and not in_comment:
                    entry["meaning"] = _explanation(lines, statements, line, name)
    for name, meaning in FAMILIES.values():
        if name in found:
            found[name]["meaning"] = meaning
    _KNOWN.update(found)
    described = _docs_tables()
    for name, entry in found.items():
        entry["page"] = described.get(name, ("", ""))[1]
        if not entry["meaning"] and name in described:
            entry["meaning"] = described[name][0]
    return found


def _docs_tables() -> dict[str, tuple[str, str]]:
    """Settings described in the hand-written docs' tables: name → (meaning, page)."""
    found: dict[str, tuple[str, str]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        rel = page.relative_to(DOCS).as_posix()
        if rel.split("/")[0] in {"decisions", "experiments"}:
            continue
        text = page.read_text()
        if page == SETTINGS_PAGE:
            text = text.split(START)[0]
        for line in text.splitlines():
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if len(cells) < 2 or not cells[0].startswith("`"):
                continue
            names = re.findall(r"`([^`]+)`", cells[0])
            if not names or not re.fullmatch(r"[A-Z][A-Z0-9_]+", names[0]):
                continue
            first = names[0]
            meaning = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cells[-1])
            for name in names:
                if name.startswith("…"):
                    parts = first.split("_")
                    candidates = ["_".join(parts[:k]) + name[1:] for k in range(len(parts), 0, -1)]
                    name = next((c for c in candidates if c != first and c.startswith("PRACTICUM_")), name)
                    name = next((c for c in candidates if c in _KNOWN), name)
                found.setdefault(name, (meaning, rel))
    return found


_KNOWN: set[str] = set()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def settings_table() -> str:
    found = settings_read()
    titles = {
        "site": "Read by the web processes and the workers",
        "scripts": "Read by the scripts (`make demo`, the measurements)",
        "test suite": "Read by the test suite",
    }
    out = [START, ""]
    for group, title in titles.items():
        rows = sorted((n, e) for n, e in found.items() if e["group"] == group)
        out += [
            f"### {title}",
            "",
            "| variable | default | read in | meaning | described in |",
            "|---|---|---|---|---|",
        ]
        for name, entry in rows:
            default = f"`{_cell(entry['default'])}`" if entry["default"] else ""
            files = ", ".join(f"`{f}`" for f in entry["files"])
            page = entry["page"]
            link = f"[{page}]({os.path.relpath(DOCS / page, SETTINGS_PAGE.parent)})" if page else ""
            out.append(f"| `{name}` | {default} | {files} | {_cell(entry['meaning'])} | {link} |")
        out.append("")
    out.append(END)
    return "\n".join(out)


def settings_page(current: str) -> str:
    head, _, rest = current.partition(START)
    _, _, tail = rest.partition(END)
    return head + settings_table() + tail


def _django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()


def commands_page() -> str:
    from django.core.management import get_commands, load_command_class
    from django.core.management.base import BaseCommand

    base = {a.dest for a in BaseCommand().create_parser("manage.py", "x")._actions}
    ours = sorted(
        (name, app) for name, app in get_commands().items() if app.split(".")[0] in {"webapp", "feedback", "training"}
    )
    out = [
        "# Management commands",
        "",
        "The project's own commands, `.venv/bin/python manage.py <command>`; each also takes Django's",
        "common options (`--verbosity`, `--settings`, …). Generated from the commands' argument",
        "parsers by `scripts/docs_reference.py`. Django's and the installed apps' commands",
        "(`migrate`, `createsuperuser`, `axes_reset`, …) are listed by `manage.py help`.",
        "",
    ]
    for name, app in ours:
        command = load_command_class(app, name)
        parser = command.create_parser("manage.py", name)
        out += [f"## `{name}`", "", f"*{app}*", ""]
        if command.help:
            out += [" ".join(command.help.split()), ""]
        rows = [a for a in parser._actions if a.dest not in base]
        if rows:
            out += ["| argument | meaning |", "|---|---|"]
            for action in rows:
                flag = ", ".join(action.option_strings) or action.dest
                meaning = (action.help or "") % {"default": action.default} if action.help else ""
                if action.choices:
                    meaning += f" (one of: {', '.join(map(str, action.choices))})"
                out.append(f"| `{flag}` | {_cell(meaning)} |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _schema_fields(schema: dict, components: dict, outputs: bool = False) -> list[tuple[str, str, bool, str]]:
    if schema.get("type") == "array" and "items" in schema:
        schema = schema["items"]
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    required = set(schema.get("required", []))
    rows = []
    for name, prop in schema.get("properties", {}).items():
        if "$ref" in prop:
            kind = prop["$ref"].rsplit("/", 1)[1]
        elif "allOf" in prop:
            kind = " ".join(p["$ref"].rsplit("/", 1)[1] for p in prop["allOf"] if "$ref" in p)
        else:
            kind = prop.get("type", "")
            if kind == "array" and "items" in prop:
                kind = f"array of {prop['items'].get('type') or prop['items'].get('$ref', '').rsplit('/', 1)[-1]}"
        if prop.get("readOnly") and not outputs:
            continue
        rows.append((name, kind, name in required, prop.get("description", "")))
    return rows


def api_page() -> str:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema.get("components", {}).get("schemas", {})
    by_tag: dict[str, list[tuple[str, str, dict]]] = {}
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            by_tag.setdefault((op.get("tags") or ["api"])[0], []).append((method.upper(), path, op))
    out = [
        "# REST API",
        "",
        "Rendered from the OpenAPI schema the site serves at `/api/schema/` (to people who are",
        "logged in and to key holders) by `scripts/docs_reference.py`. An error from `/api/v1/` reads",
        '`{"detail": "...", "errors": [{"field": ..., "reason": ...}]}`; `/api/openai/v1/` answers',
        "OpenAI's error object. Keys and scopes:",
        "[Send traces](../how-to/send-traces.md); the OpenAI-compatible gateway (`/v1/chat/completions`,",
        "`/v1/models`, `/v1/health`), which is not a REST resource: [Connect an agent](../how-to/connect-an-agent.md).",
        "",
    ]
    for tag in sorted(by_tag):
        out += [f"## {tag}", ""]
        for method, path, op in by_tag[tag]:
            out += [f"### `{method} {path}`", ""]
            if op.get("summary"):
                out += [op["summary"], ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            params = [p for p in op.get("parameters", []) if p.get("in") in {"query", "path"}]
            body = op.get("requestBody", {}).get("content", {})
            fields = []
            for media in ("application/json", "multipart/form-data"):
                if media in body:
                    fields = _schema_fields(body[media]["schema"], components)
                    break
            if params or fields:
                out += ["| name | in | type | required | meaning |", "|---|---|---|---|---|"]
                for p in params:
                    kind = p.get("schema", {}).get("type", "")
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {kind} | {'yes' if p.get('required') else ''} "
                        f"| {_cell(p.get('description', ''))} |"
                    )
                for name, kind, required, meaning in fields:
                    out.append(f"| `{name}` | body | {_cell(kind)} | {'yes' if required else ''} | {_cell(meaning)} |")
                out.append("")
            answers = []
            for code, response in op.get("responses", {}).items():
                description = _cell(response.get("description", ""))
                same = not description or description == op.get("summary")
                answers.append(code if same else f"{code} ({description})")
                content = response.get("content", {}).get("application/json", {}).get("schema")
                if code.startswith("2") and content:
                    fields = [name for name, *_ in _schema_fields(content, components, outputs=True)]
                    if fields:
                        answers[-1] += " with " + ", ".join(f"`{f}`" for f in fields)
            if answers:
                out += [f"Answers: {'; '.join(answers)}.", ""]
    return "\n".join(out).rstrip() + "\n"


def _title(path: Path) -> str:
    first = path.read_text().splitlines()[0] if path.read_text() else ""
    return first.removeprefix("# ").strip() or path.stem


def decisions_page() -> str:
    out = [
        "# Decision records",
        "",
        "The decisions that were hard, each with its context, the options, the choice and its",
        "consequences (`docs/decisions/NNNN-slug.md`, numbered in the order they landed).",
        "",
    ]
    for path in sorted(DECISIONS_PAGE.parent.glob("[0-9]*.md")):
        title = _title(path)
        number = path.name[:4]
        title = title if title.startswith(number) else f"{number} — {title}"
        out.append(f"- [{title}]({path.name})")
    return "\n".join(out) + "\n"


def experiments_page() -> str:
    out = [
        "# Experiments",
        "",
        "The dated log of training experiments, failures included: each says what was asked, the",
        "command that measured it, the figures and what they leave open. Newest last.",
        "",
    ]
    folder = EXPERIMENTS_PAGE.parent
    for path in sorted(folder.glob("2*.md")):
        out.append(f"- [{_title(path)}]({path.name})")
    data = sorted(p for p in folder.iterdir() if p.name[0].isdigit() and p.suffix != ".md")
    if data:
        out += ["", "## Their data", "", "The runs' records, as the commands wrote them:", ""]
        out += [f"- [{p.name}]({p.name})" for p in data]
    return "\n".join(out) + "\n"


def pages() -> dict[Path, str]:
    _django()
    return {
        SETTINGS_PAGE: settings_page(SETTINGS_PAGE.read_text()),
        COMMANDS_PAGE: commands_page(),
        API_PAGE: api_page(),
        DECISIONS_PAGE: decisions_page(),
        EXPERIMENTS_PAGE: experiments_page(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed page is out of date")
    options = parser.parse_args()
    stale = []
    for path, text in pages().items():
        current = path.read_text() if path.exists() else ""
        if current != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if not options.check:
                path.write_text(text)
    if options.check and stale:
        print("out of date (run scripts/docs_reference.py):", ", ".join(stale))
        return 1
    for name in stale:
        print("wrote", name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
