"""The web process must not import torch, transformers or vLLM: they cost seconds and
gigabytes per web worker and only workers and commands need them. A web image installs
requirements-web.txt alone, so everything the web path imports must come from it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, os, sys
# Modules listed in PRACTICUM_ABSENT cannot be imported, as in an image that lacks them.
ABSENT = set(json.loads(os.environ.get("PRACTICUM_ABSENT", "[]")))
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Absent())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
import django
django.setup()
import webapp.asgi, webapp.wsgi
from django.urls import get_resolver
get_resolver().url_patterns
from django.contrib import admin
admin.autodiscover()
import importlib
for app in ("webapp", "feedback", "training"):
    for name in ("views", "apis", "admin", "selectors", "tasks", "urls"):
        try:
            importlib.import_module(f"{app}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{app}.{name}":  # the module exists but an import inside it failed
                raise
print(json.dumps(sorted({m.split(".")[0] for m in list(sys.modules)})))
"""
HEAVY = ("torch", "transformers", "vllm", "peft", "sentence_transformers")


def web_path_modules(*, absent: set[str] = frozenset()) -> set[str]:
    """The top-level modules a web process has imported once every page, API, admin and task
    module is loaded; the modules in `absent` cannot be imported (a failed import fails it)."""
    env = {**os.environ, "PRACTICUM_ABSENT": json.dumps(sorted(absent))}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _requirements(path: Path) -> list[Requirement]:
    reqs = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            reqs += _requirements(path.parent / line[3:].strip())
        elif line:
            reqs.append(Requirement(line))
    return reqs


def requirements_closure(path: Path) -> set[str]:
    """The distributions a requirements file installs: its lines and, recursively, what they
    require (with the extras asked for), read from the installed metadata."""
    todo = _requirements(path)
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.distribution(req.name).requires or []:
            sub = Requirement(spec)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                sub.marker = None
                todo.append(sub)
    return seen


def test_loading_every_page_api_admin_and_task_module_imports_no_ml_library():
    heavy = sorted(web_path_modules() & set(HEAVY))
    assert heavy == [], f"imported by the web path: {heavy}"


def test_the_web_path_loads_with_requirements_web_alone_and_it_holds_no_ml_library():
    web = requirements_closure(ROOT / "requirements-web.txt")
    assert not web & {_name(m) for m in (*HEAVY, "sentence-transformers")}, web
    # Hide what only the workers' lines of requirements.txt install, as a web image lacks it:
    # every page, API, admin and task module must still load.
    worker_only = requirements_closure(ROOT / "requirements.txt") - web
    absent = {
        module
        for module, dists in metadata.packages_distributions().items()
        if {_name(d) for d in dists} <= worker_only
    }
    assert {"torch", "transformers", "peft", "scipy"} <= absent
    web_path_modules(absent=absent)
