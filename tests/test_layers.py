"""The import contracts (pyproject.toml, docs/decisions/0046-layers-contract.md) catch what
they are there for: each probe below adds one import that crosses the floor plan to a copy
of the tree, and `lint-imports` must then fail, naming the contract that forbids it."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("feedback", "training", "webapp")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

FLOOR_PLAN = "The floor plan: site > training > feedback > serving > engine > kernel"
NO_TORCH_ON_THE_WEB = "Feedback, serving, the kernel and the inference client load no trainer and no torch"
EVALUATION = "The evaluation library loads no torch and no trainer but in its worker-only functions"
NO_PAGES_BELOW = "Models, selectors and services import no page, form, API or URL module of any app"
INSIDE_APPS = "Inside each app: URLs > pages and APIs > forms > services and selectors > models"
ENGINE = "The engine is Django-free"
ACYCLIC = "The services packages have no import cycle"
# Django's own entry points: they wire every layer together and belong to none.
WEBAPP_WIRING = {
    "__init__",
    "apps",
    "asgi",
    "celery",
    "settings",
    "settings_env",
    "settings_judge",
    "urls",
    "wsgi",
    "templatetags",
}

# (module the import is added to, the import, the contracts it must break)
PROBES = [
    ("webapp/kernel/work.py", "import feedback.models", {FLOOR_PLAN}),
    ("webapp/kernel/ids.py", "import webapp.site.views", {FLOOR_PLAN, NO_PAGES_BELOW}),
    ("feedback/services/review.py", "import training.finetuning.models", {FLOOR_PLAN}),
    ("feedback/gateway/recorder.py", "import training.finetuning.jobs", {FLOOR_PLAN}),
    ("feedback/services/judging.py", "import training.trainer.loss", {NO_TORCH_ON_THE_WEB}),
    ("training/promotion/evaluation/bootstrap.py", "import torch", {EVALUATION}),
    ("training/promotion/evaluation/paired_runs.py", "import training.trainer.grpo", {EVALUATION}),
    ("training/services/jobs.py", "import training.learning_policies.views", {NO_PAGES_BELOW}),
    ("feedback/selectors/review.py", "import feedback.forms", {NO_PAGES_BELOW, INSIDE_APPS}),
    ("training/serving/services.py", "import feedback.models", {FLOOR_PLAN}),
    ("training/serving/selectors.py", "import training.promotion.models", {FLOOR_PLAN}),
    ("training/trainer/config.py", "import django.db", {ENGINE}),
    ("training/environments/base.py", "import training.trainer.loss", {FLOOR_PLAN}),
    ("training/inference/codec.py", "import torch", {NO_TORCH_ON_THE_WEB}),
    ("feedback/services/stitching.py", "import feedback.services.capture", {ACYCLIC}),
    ("training/services/job_runner.py", "import training.services.job_processes", {ACYCLIC}),
    ("training/promotion/services/release.py", "import training.promotion.services.promotion_checks", {ACYCLIC}),
]


def _lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


@pytest.fixture
def tree(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    shutil.copytree(pristine, copy)
    return copy


def _broken(output: str) -> set[str]:
    # Each contract's line of the summary; a long name wraps onto the next line.
    text = " ".join(output.split())
    names = {FLOOR_PLAN, NO_TORCH_ON_THE_WEB, EVALUATION, NO_PAGES_BELOW, INSIDE_APPS, ENGINE, ACYCLIC}
    return {name for name in names if f"{name} BROKEN" in text or f"{name}BROKEN" in text}


def test_the_tree_as_it_is_keeps_every_contract(tree: Path):
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "probe", "contracts"), PROBES, ids=[f"{m}:{p}" for m, p, _ in PROBES])
def test_an_import_across_the_floor_plan_fails_the_lint(tree: Path, module: str, probe: str, contracts: set[str]):
    path = tree / module
    path.write_text(path.read_text() + f"\n{probe}\n")
    result = _lint(tree)
    assert result.returncode != 0, f"{probe} in {module} broke no contract:\n{result.stdout}"
    assert contracts <= _broken(result.stdout), result.stdout


def _floor_plan() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == FLOOR_PLAN)
    return [{name.strip() for name in layer.replace("|", ":").split(":")} for layer in contract["layers"]]


def _children(package: str) -> set[str]:
    """Every child of `package` that holds Python: modules, and folders with Python files in
    them whether or not they have an `__init__.py` (an implicit namespace package imports as
    well, and the linter does not see it)."""
    folder = ROOT / package.replace(".", "/")
    found = {f"{package}.{m.name}" for m in pkgutil.iter_modules([str(folder)])}
    for child in folder.iterdir():
        if child.is_dir() and child.name != "__pycache__" and any(child.rglob("*.py")):
            found.add(f"{package}.{child.name}")
    return found


def test_every_folder_of_python_in_the_apps_is_a_package():
    """The import linter skips a folder without `__init__.py`, so a module there could import
    across the floor plan unseen."""
    missing = sorted(
        folder.relative_to(ROOT).as_posix()
        for app in ("webapp", "feedback", "training")
        for folder in [ROOT / app, *(ROOT / app).rglob("*")]
        if folder.is_dir()
        and folder.name != "__pycache__"
        and any(p.suffix == ".py" for p in folder.iterdir())
        and not (folder / "__init__.py").exists()
    )
    assert missing == []


def test_every_module_of_the_apps_sits_in_one_layer_of_the_floor_plan():
    """The training layer is written as the list of training's children but serving and the
    engine (import-linter refuses a layer that contains another): a new child must be added."""
    layers = _floor_plan()
    named = set().union(*layers)
    assert sum(len(layer) for layer in layers) == len(named), "a module is in two layers"

    def placed(module: str) -> bool:
        return any(module == n or module.startswith(f"{n}.") for n in named)

    unplaced = {m for m in _children("training") | _children("webapp") if not placed(m)}
    assert unplaced == {f"webapp.{name}" for name in WEBAPP_WIRING if name != "__init__"}
    assert "feedback" in named
