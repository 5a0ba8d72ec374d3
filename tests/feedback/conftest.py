from __future__ import annotations

import pytest

from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory


@pytest.fixture
def deployment(db):
    return DeploymentFactory(name="support-bot")


@pytest.fixture
def make_key(db):
    def make(deployment, scopes=("ingest",), **kwargs) -> str:
        return api_key_create(deployment=deployment, scopes=list(scopes), **kwargs).plaintext

    return make


@pytest.fixture
def ingest_key(deployment, make_key) -> str:
    return make_key(deployment, ["ingest", "read"])
