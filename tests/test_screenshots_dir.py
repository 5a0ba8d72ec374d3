"""A test run writes its screenshots to a build folder, never over the tracked docs/screenshots/."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.fixtures.browser import ROOT, screenshots_dir


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="asks git whether the folder is ignored: only a git checkout can answer (not a source archive)",
)
def test_the_default_screenshot_folder_is_ignored_by_git(monkeypatch):
    monkeypatch.delenv("PRACTICUM_SCREENSHOTS_DIR", raising=False)
    folder = screenshots_dir()
    assert folder == ROOT / "var" / "screenshots"
    # git check-ignore exits 0 when the path is ignored: a test run's pictures never dirty the tree.
    probe = folder / "trace-detail.png"
    assert subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=ROOT).returncode == 0


def test_make_screenshots_points_the_folder_at_docs(monkeypatch):
    monkeypatch.setenv("PRACTICUM_SCREENSHOTS_DIR", str(ROOT / "docs" / "screenshots"))
    assert screenshots_dir() == ROOT / "docs" / "screenshots"
