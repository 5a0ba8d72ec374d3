"""The documentation's examples, run against a running demo as printed.

An example is a fenced ```bash or ```python block of a docs page (or the README) that talks to
the demo's site (`127.0.0.1:8000` or `localhost:8000`). A page's examples run in order in one
bash process, so what one example sets (`KEY=…`, `TRACE=…`) the next one reads, as in a
reader's terminal. Python examples run there with the project's interpreter.

What differs from a reader's terminal, and why:
- the site's address is the test demo's free port, not 8000;
- the FAST demo serves the tiny model `tiny-talking` where `make demo` serves
  `smollm2-135m-instruct`: the name is swapped;
- `curl` fails on an HTTP error (`--fail-with-body`), so an example that answers 4xx or 5xx
  fails the test instead of printing an error body nobody reads;
- it runs in a scratch folder holding links to the project's `.venv`, `manage.py` and
  `feedback/` (examples write files such as `traces.jsonl` there, not in the checkout).

    .venv/bin/python tests/docs/examples.py --url http://127.0.0.1:8010 --data-dir /tmp/demo
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = re.compile(r"(?:127\.0\.0\.1|localhost):8000\b")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
# The demo's base model in `make demo`, and the one the FAST demo serves in its place.
FULL_MODEL, FAST_MODEL = "smollm2-135m-instruct", "tiny-talking"
# What each page's examples print when they did what the page says, beyond exiting 0.
PRINTS = {
    "docs/how-to/connect-an-agent.md": "chatcmpl-",
    "docs/how-to/opentelemetry.md": "\nWhere is my order A1042?\n",
    "docs/how-to/review-in-the-browser.md": '"api_url":',
    "docs/how-to/review-traces.md": '"outcome":"success"',
    "docs/how-to/send-traces.md": '"body":"Say when it shipped',
    "docs/how-to/training-jobs.md": "succeeded tiny-talking-sft-",
}
DEMO_LOGINS = {f"{name}:{name}-demo" for name in ("operator", "approver", "reviewer", "admin")}


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    language: str
    code: str
    # `<!-- not run: why -->` on the line above the block (a service that never exits).
    not_run: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """Every page a reader reads for how to do something: not the decision records and
    experiment logs, which quote what was run at the time."""
    found = [ROOT / "README.md"]
    for path in sorted((ROOT / "docs").rglob("*.md")):
        if not {"decisions", "experiments"} & set(path.relative_to(ROOT / "docs").parts):
            found.append(path)
    return found


NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")


def blocks(page: Path) -> list[Example]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        above = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = NOT_RUN.search(above)
        line = text[: m.start()].count("\n") + 1
        found.append(Example(page, line, m.group(1), m.group(2), reason.group(1) if reason else ""))
    return found


def talks_to_the_site(block: Example) -> bool:
    return bool(SITE.search(block.code))


def examples(page: Path) -> list[Example]:
    """A page's runnable blocks, when one of them talks to the site: then every one of them, in
    order, since the others set up what those read (a key, an exporter's address)."""
    runnable = [b for b in blocks(page) if b.language in {"bash", "python"} and not b.not_run]
    return runnable if any(talks_to_the_site(b) for b in runnable) else []


def script(page_examples: list[Example], *, url: str) -> str:
    """One bash script for a page: each example in order, python ones through a here-document."""
    parts = ["set -euo pipefail"]
    for example in page_examples:
        code = SITE.sub(url.removeprefix("http://"), example.code).replace(FULL_MODEL, FAST_MODEL)
        parts.append(f"echo '### {example.where}' >&2")
        if example.language == "python":
            parts.append(f".venv/bin/python - <<'PYTHON_EXAMPLE'\n{code}PYTHON_EXAMPLE")
        else:
            parts.append(code)
    return "\n".join(parts) + "\n"


def scratch_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="docs-examples-"))
    for name in (".venv", "manage.py", "feedback"):
        (folder / name).symlink_to(ROOT / name)
    shim = folder / "bin"
    shim.mkdir()
    real = subprocess.run(["bash", "-c", "command -v curl"], capture_output=True, text=True, check=True).stdout.strip()
    (shim / "curl").write_text(f'#!/bin/sh\nexec {real} --fail-with-body --show-error "$@"\n')
    (shim / "curl").chmod(0o755)
    return folder


def run_page(page: Path, *, url: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    folder = scratch_folder()
    # Its own process group, so a timeout stops what the examples started (a polling loop).
    process = subprocess.Popen(
        ["bash", "-c", script(examples(page), url=url)],
        cwd=folder,
        env={**env, "PATH": f"{folder / 'bin'}:{env.get('PATH', os.defpath)}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        stderr += f"\n(stopped after {timeout:.0f} s)"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def page_failures(*, url: str, env: dict[str, str]) -> list[str]:
    """Run every page's examples; what went wrong, page by page (empty when all ran)."""
    failures = []
    for page in pages():
        if not examples(page):
            continue
        name = page.relative_to(ROOT).as_posix()
        done = run_page(page, url=url, env=env)
        if done.returncode:
            failures.append(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}\n{done.stdout[-1000:]}")
        elif PRINTS.get(name, "") not in done.stdout:
            failures.append(f"{name}: did not print {PRINTS[name]!r}\n{done.stdout[-2000:]}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the running demo's site")
    parser.add_argument("--data-dir", required=True, help="the demo's PRACTICUM_DATA_DIR")
    parser.add_argument("pages", nargs="*", help="only these pages")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRACTICUM_", "DATABASE_URL", "CELERY_"))}
    env["PRACTICUM_DATA_DIR"] = args.data_dir
    failed = 0
    for page in pages():
        if args.pages and not any(str(page).endswith(p) for p in args.pages):
            continue
        if not examples(page):
            continue
        done = run_page(page, url=args.url, env=env)
        status = "ok" if done.returncode == 0 else f"FAILED ({done.returncode})"
        print(f"{page.relative_to(ROOT)}: {len(examples(page))} examples {status}")
        if done.returncode:
            failed += 1
            print(done.stderr[-3000:], done.stdout[-2000:], sep="\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
