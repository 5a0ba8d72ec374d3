"""The start of a training job in a worker: claim it, then train it here
(`job_runner.training_job_held_run`) or, for a job of several processes or one that starts
its own vLLM engine, in torchrun's processes this worker supervises (`job_processes`).

Imported only by workers and commands (torch is imported inside the functions that train)."""

from __future__ import annotations

from training.models import TrainingJob
from training.services.job_processes import training_job_processes_run
from training.services.job_runner import training_job_claim, training_job_held_run
from training.trainer.config import ConfigError, config_from_dict


def training_job_run(*, job_id: int, worker: str) -> str:
    """Run (or resume) a job to its end. Returns the final status, or "skipped". A job of
    `processes` > 1, or one that starts its own vLLM engine (`rollout: "colocate"`), runs in
    torchrun's processes, this worker supervising them: the engine's core is a child
    process, which a worker's pool process (a daemon) may not start."""
    job = training_job_claim(job_id, worker)
    if job is None:
        return "skipped"
    if _launched(job):
        return training_job_processes_run(job, worker)
    return training_job_held_run(job, worker)


def _launched(job: TrainingJob) -> bool:
    """Whether the job runs in processes of its own, once its config validates: a config
    written past the create service (out of range, not an int) must not reach torchrun's
    command line. False for a config that does not validate: that run fails the job with
    its errors."""
    try:
        config = config_from_dict(job.config)
    except ConfigError:
        return False
    return config.processes > 1 or getattr(config, "rollout", "local") == "colocate"
