"""The delayed unload after a flip leaves alone a version something still asks the servers
for: an evaluation queued or running with it as candidate or baseline generates through the
inference server under its name, and would fail on a 404 half-way."""

from __future__ import annotations

import pytest

import training.promotion.services.release as release_service
from tests.promotion.conftest import evaluation_row
from training.promotion.services.release import release_adapter_unload


class Unloads:
    url = "http://replica:8001"

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def adapter_unload(self, name: str) -> None:
        self.seen.append(name)


@pytest.mark.parametrize("role", ["candidate", "baseline"])
@pytest.mark.parametrize("status", ["queued", "running"])
def test_a_version_an_evaluation_in_progress_uses_is_not_unloaded_until_it_ends(registry, monkeypatch, role, status):
    unloaded: list[str] = []
    monkeypatch.setattr(release_service, "version_servers", lambda version: [Unloads(unloaded)])
    version = registry.candidate  # a LoRA version no deployment serves
    other = registry.base_version
    evaluation = evaluation_row(
        version if role == "candidate" else other,
        registry.deployment,
        version if role == "baseline" else other,
        status=status,
    )
    assert release_adapter_unload(version_id=version.pk) == []
    assert unloaded == []
    type(evaluation).objects.filter(pk=evaluation.pk).update(status="finished")
    assert release_adapter_unload(version_id=version.pk) == ["http://replica:8001"]
    assert unloaded == [version.name]
