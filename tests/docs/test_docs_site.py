"""The README stays short, and the docs site's reference pages say what the code does.

`mkdocs build --strict` (broken links and anchors, pages missing from the menu) runs in CI
(`.ci/run`) and `make docs-build`.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETTINGS_PAGE = ROOT / "docs" / "reference" / "settings.md"


def _generator():
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return re.sub(r"[ ]+", "-", text).strip("-")


def test_the_readme_is_at_most_200_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the manual belongs in docs/"


def test_every_link_in_the_readme_leads_somewhere():
    text = README.read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", text)
    assert links
    for target, anchor in links:
        if target.startswith("http"):
            continue
        path = ROOT / target
        assert path.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            headings = [_slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)]
            assert anchor in headings, f"README.md links to {target}#{anchor}, which has no such heading"


def _read_in_code() -> set[str]:
    """Every PRACTICUM_* variable named in the code, grepped without the generator's help."""
    files = [ROOT / "manage.py", ROOT / "tests" / "conftest.py"]
    for folder in ("webapp", "feedback", "training", "scripts", "tests/fixtures"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".sh"} and "migrations" not in p.parts]
    names: set[str] = set()
    for path in files:
        names |= set(re.findall(r"\bPRACTICUM_[A-Z0-9_]*[A-Z0-9]\b(?![_{])", path.read_text()))
    return names


def test_the_settings_reference_lists_every_setting_the_code_reads():
    page = SETTINGS_PAGE.read_text()
    listed = set(re.findall(r"^\| `(PRACTICUM_[A-Z0-9_]+)`", page, re.MULTILINE))
    names = _read_in_code()
    assert len(names) > 90  # the grep found the settings, not nothing
    assert sorted(names - listed) == []


def test_every_setting_in_the_reference_says_what_it_does():
    page = SETTINGS_PAGE.read_text()
    generated = page.split("<!-- generated: every setting")[1]
    rows = [line for line in generated.splitlines() if line.startswith("| `")]
    assert rows
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert cells[3], f"no meaning for {cells[0]}: comment it in the code or describe it in a docs table"


@pytest.mark.django_db(databases=[])
def test_the_generated_pages_are_up_to_date():
    stale = [
        path.relative_to(ROOT).as_posix()
        for path, text in _generator().pages().items()
        if not path.exists() or path.read_text() != text
    ]
    assert stale == [], "out of date: run .venv/bin/python scripts/docs_reference.py"


def test_every_decision_record_and_experiment_is_in_its_index():
    for folder, pattern in (("decisions", "[0-9]*.md"), ("experiments", "2*.md")):
        index = (ROOT / "docs" / folder / "index.md").read_text()
        for path in (ROOT / "docs" / folder).glob(pattern):
            assert f"]({path.name})" in index, f"docs/{folder}/index.md does not link {path.name}"


def test_the_readme_prints_what_make_demo_prints():
    """The console lines the README shows are the ones scripts/demo.sh writes (default host,
    port and episodes, without FAST=1)."""
    block = re.search(r"```\n(  The web server is up.*?)```", README.read_text(), re.DOTALL).group(1)
    script = (ROOT / "scripts" / "demo.sh").read_text()
    script = script.replace("$URL", "http://127.0.0.1:8000").replace("$EPISODES", "36")
    for line in block.splitlines():
        if line.strip() != "…":
            assert line in script, f"make demo does not print {line.strip()!r}"


def _examples():
    from tests.docs import examples

    return examples


def test_the_examples_that_run_against_the_demo_are_found():
    """The pages tests/test_demo_script.py runs against the demo, each with its examples; an
    example that talks to the site is a ```bash or ```python block, run or marked with why not."""
    ex = _examples()
    running = {p.relative_to(ROOT).as_posix(): len(ex.examples(p)) for p in ex.pages() if ex.examples(p)}
    assert set(running) == set(ex.PRINTS), running
    for page in ex.pages():
        for block in ex.blocks(page):
            if not ex.talks_to_the_site(block):
                continue
            commands = [line for line in block.code.splitlines() if line.startswith(("curl", ".venv/", "python"))]
            assert block.language in {"bash", "python"} or not commands, (
                f"{block.where}: a command block with no language"
            )
            if block.language in {"bash", "python"} and page.relative_to(ROOT).as_posix() not in running:
                assert block.not_run, f"{block.where}: an example on a page whose examples are not run"


def test_the_examples_log_in_as_the_demo_people():
    """Run or not, an example logs in as someone `make demo` creates, with their password."""
    ex = _examples()
    for page in ex.pages():
        for block in ex.blocks(page):
            for login in re.findall(r"-u ([^\s]+)", block.code):
                assert login in ex.DEMO_LOGINS, f"{block.where}: -u {login} is not a demo login"
            assert "localhost:8000" not in block.code, f"{block.where}: the demo prints 127.0.0.1:8000"
