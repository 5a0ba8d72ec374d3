"""The inference server has a key of its own: vLLM is started with it (runtime LoRA loading
is on, so anyone reaching the port could otherwise swap the adapter behind a live name),
every project client sends it, and a job config cannot point a worker at another URL."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json

import httpx
import pytest
from django.conf import settings

from tests.security.conftest import recording_server

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


def test_the_server_the_project_starts_requires_a_key(tmp_path):
    from training.inference.server import ServerSpec
    from training.services.inference import server_spec_for_base
    from training.serving.models import BaseModel

    assert len(settings.INFERENCE_API_KEY) >= 32
    base = BaseModel(name="m", path=str(tmp_path))
    spec = server_spec_for_base(base, extra_env={"VLLM_API_KEY": ""})
    argv, env = spec.command()
    assert "--enable-lora" in argv and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    # The key is in the server's environment (vLLM reads --api-key from VLLM_API_KEY), not in
    # its argv, which every local user can read in the process list.
    assert env["VLLM_API_KEY"] == settings.INFERENCE_API_KEY
    assert settings.INFERENCE_API_KEY not in " ".join(argv)
    assert env["VLLM_SERVER_DEV_MODE"] == "0"  # endpoints the key does not cover stay off
    with pytest.raises(ValueError, match="needs an API key"):
        ServerSpec(model_path=str(tmp_path), served_name="m", api_key="").command()


def test_a_server_started_for_one_run_gets_a_key_of_its_own(tmp_path):
    """The trainer's GPU check starts its own server: without the site's key it still has one."""
    from training.inference.server import ServerSpec

    keys = [ServerSpec(model_path=str(tmp_path), served_name="m").command()[1]["VLLM_API_KEY"] for _ in range(2)]
    assert all(len(k) >= 32 for k in keys) and keys[0] != keys[1]


def test_every_inference_client_call_sends_the_key():
    from training.services.inference import inference_client

    server, seen = recording_server(status=200, body=b'{"object": "list", "data": []}')
    client = inference_client(f"http://127.0.0.1:{server.server_port}")
    try:
        client.models()
        client.adapter_load("v2", "/adapters/v2")
        client.adapter_unload("v2")
    finally:
        server.shutdown()
    assert [r["path"] for r in seen] == ["/v1/models", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
    assert all(r["authorization"] == f"Bearer {settings.INFERENCE_API_KEY}" for r in seen)


def test_rollouts_send_the_key_they_are_given(tmp_path):
    from training.trainer.vllm_rollout import VllmRollouts

    server, seen = recording_server(status=200, body=b'{"data": [{"id": "tiny"}]}')
    try:
        rollouts = VllmRollouts(base_url=f"http://127.0.0.1:{server.server_port}/v1", run_dir=tmp_path, api_key="k-1")
        assert rollouts._base_model() == "tiny"
        rollouts._post(f"{rollouts.base_url}/unload_lora_adapter", {"lora_name": "x"})
    finally:
        server.shutdown()
    assert [r["authorization"] for r in seen] == ["Bearer k-1", "Bearer k-1"]


def test_the_gateway_forwards_completions_with_the_servers_key_not_the_clients(tmp_path):
    from feedback.gateway.upstream import UpstreamPool

    server, seen = recording_server(status=200, body=COMPLETION)

    async def ask() -> int:
        pool = UpstreamPool(f"http://127.0.0.1:{server.server_port}", api_key=settings.INFERENCE_API_KEY)
        response = await pool.request("POST", "/v1/chat/completions", b"{}")
        status = response.status
        response.close()
        pool.close()
        return status

    try:
        # In a thread of its own: the browser tests leave an event loop running in this one.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            assert pool.submit(asyncio.run, ask()).result(timeout=60) == 200
    finally:
        server.shutdown()
    assert seen == [{"path": "/v1/chat/completions", "authorization": f"Bearer {settings.INFERENCE_API_KEY}"}]


@pytest.mark.django_db(transaction=True)
def test_a_completion_through_the_gateway_reaches_the_server_with_its_key(gateway, tmp_path):
    from feedback.services.api_keys import api_key_create
    from tests.factories import DeploymentFactory
    from training.serving.services import base_model_register, live_version_set

    server, seen = recording_server(status=200, body=COMPLETION)
    try:
        folder = tmp_path / "model"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        deployment = DeploymentFactory(name="support-bot")
        _, version = base_model_register(name="m", path=folder, inference_url=f"http://127.0.0.1:{server.server_port}")
        live_version_set(deployment=deployment, version=version)
        key = api_key_create(deployment=deployment, scopes=["ingest"]).plaintext
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        gateway.drain()
    finally:
        server.shutdown()
    assert response.status_code == 200, response.text
    assert [r["authorization"] for r in seen] == [f"Bearer {settings.INFERENCE_API_KEY}"]


@pytest.mark.django_db
class TestRolloutUrl:
    @pytest.fixture
    def base_version(self, tmp_path, settings):
        from training.serving.models import BaseModel, ModelVersion, ModelVersionKind

        settings.INFERENCE_URL = "http://127.0.0.1:8001"
        settings.INFERENCE_ROLLOUT_URLS = ["http://10.0.0.7:8001/v1"]
        settings.TRAINING_DIR = tmp_path / "training"
        base = BaseModel.objects.create(name="tiny", path=str(tmp_path), inference_url="http://10.0.0.5:8001")
        return ModelVersion.objects.create(
            name="tiny", base_model=base, kind=ModelVersionKind.BASE, path=str(tmp_path), status="live"
        )

    def create(self, base_version, **config):
        from training.services.jobs import training_job_create

        return training_job_create(
            kind="episodes",
            config={"environment": "files", "steps": 1, "rollout": "vllm", **config},
            base_version=base_version,
            training_set=None,
            enqueue=False,
        )

    def test_an_arbitrary_vllm_url_is_refused(self, base_version):
        from training.services.jobs import JobError

        for url in ("http://attacker.example/v1", "http://127.0.0.1:9/v1", "http://10.0.0.5:8001.evil/v1"):
            with pytest.raises(JobError) as info:
                self.create(base_version, vllm_url=url)
            assert info.value.errors[0][0] == "config.vllm_url"
            assert "base model's inference server (http://10.0.0.5:8001/v1)" in info.value.errors[0][1]

    def test_the_base_models_server_is_the_default_and_configured_ones_are_allowed(self, base_version):
        assert self.create(base_version).config["vllm_url"] == "http://10.0.0.5:8001/v1"
        assert self.create(base_version, vllm_url="http://10.0.0.5:8001/").config["vllm_url"] == (
            "http://10.0.0.5:8001/v1"
        )
        assert self.create(base_version, vllm_url="http://10.0.0.7:8001").config["vllm_url"] == (
            "http://10.0.0.7:8001/v1"
        )

    def test_the_worker_refuses_a_config_changed_after_it_was_created(self, base_version):
        from training.models import TrainingJob
        from training.services.job_start import training_job_run
        from webapp.kernel.work import WorkStatus

        server, seen = recording_server(status=200, body=b'{"data": [{"id": "tiny"}]}')
        try:
            job = self.create(base_version)
            attacker = f"http://127.0.0.1:{server.server_port}/v1"
            TrainingJob.objects.filter(pk=job.pk).update(config={**job.config, "vllm_url": attacker})
            assert training_job_run(job_id=job.pk, worker="w1") == WorkStatus.FAILED
        finally:
            server.shutdown()
        job.refresh_from_db()
        assert "config.vllm_url" in job.error
        assert seen == []


@pytest.mark.vllm
@pytest.mark.slow
def test_the_real_server_refuses_adapter_loading_and_completions_without_the_key(vllm_server, tool_call_adapter_path):
    from training.services.inference import inference_client

    url = vllm_server.url
    load = {"lora_name": "swapped", "lora_path": str(tool_call_adapter_path)}
    chat = {"model": vllm_server.served_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=load, timeout=60).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=load, headers=wrong, timeout=60).status_code == 401
    assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).status_code == 401
    assert "swapped" not in {m.id for m in vllm_server.client().models()}
    # The project's own client sends the key: it works.
    assert inference_client(url).chat(model=vllm_server.served_name, messages=chat["messages"], max_tokens=2)
