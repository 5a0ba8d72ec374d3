from __future__ import annotations

import pytest

from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory


@pytest.fixture
def deployment(transactional_db):
    return DeploymentFactory(name="support-bot")


@pytest.fixture
def api_key(deployment) -> str:
    return api_key_create(deployment=deployment, scopes=["ingest", "read"]).plaintext


@pytest.fixture
def base_live(deployment, tiny_base):
    """The deployment serves the tiny base weights."""
    from training.serving.models import ModelVersion
    from training.serving.services import live_version_set

    version = ModelVersion.objects.get(name=tiny_base.name)
    live_version_set(deployment=deployment, version=version)
    return version


@pytest.fixture
def tool_call_version(tiny_base, tool_call_adapter_path, vllm_server):
    """A LoRA version (answers every prompt with a lookup_order tool call), loaded in the server."""
    from training.serving.models import ModelVersion
    from training.serving.services import model_version_create

    version = model_version_create(
        name="tiny-tool-caller",
        base_model=tiny_base,
        kind="lora",
        path=tool_call_adapter_path,
        parent=ModelVersion.objects.get(name=tiny_base.name),
    )
    vllm_server.client().adapter_load(version.name, version.path)
    return version


@pytest.fixture
def openai_client(gateway, api_key):
    import openai

    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture
def chat_upstream():
    """An OpenAI-compatible server with scripted answers (`tests/fixtures/chat_upstream.py`);
    set `.reply` to script it. Answers "hello" until told otherwise."""
    from tests.fixtures.chat_upstream import ChatUpstream

    upstream = ChatUpstream(reply=lambda request: {"content": "hello"})
    yield upstream
    upstream.close()


@pytest.fixture
def fake_live(deployment, chat_upstream, tmp_path):
    """The deployment is served by `chat_upstream`."""
    from tests.fixtures.chat_upstream import live_on

    return live_on(deployment, chat_upstream, tmp_path)
