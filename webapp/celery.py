"""The Celery app. Queues: `default` (judge calls, flagging, bookkeeping), `training`
(one GPU or the CPU, concurrency 1) and `deploy` (talks to the inference server)."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("practicum")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_queues=[Queue("default"), Queue("training"), Queue("deploy")],
    task_default_queue="default",
    task_ignore_result=True,
    # Long jobs: acknowledge after the task finishes and hand a task back when its
    # worker dies, so a killed training job is redelivered and resumes from its checkpoint.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
app.autodiscover_tasks()

# Periodic work (run by `celery beat`, or a worker started with -B as `make demo` does): one
# sweep for every kind of background work whose worker died, as often as the more eager of
# the training and judge check settings asks unless PRACTICUM_STALE_WORK_CHECK_SECONDS says.
_STALE_CHECK_SECONDS = float(
    os.environ.get("PRACTICUM_STALE_WORK_CHECK_SECONDS")
    or min(
        float(os.environ.get("PRACTICUM_TRAINING_STALE_CHECK_SECONDS", 60)),
        float(os.environ.get("PRACTICUM_JUDGE_STALE_CHECK_SECONDS", 60)),
    )
)
# Learning policies: each tick moves every policy one step (fire, evaluate, check) and returns.
_LEARNING_POLICY_TICK_SECONDS = float(os.environ.get("PRACTICUM_LEARNING_POLICY_TICK_SECONDS", 60))
# Progressive releases: each tick reads every running one's live signals and moves it on.
_ROLLOUT_TICK_SECONDS = float(os.environ.get("PRACTICUM_ROLLOUT_TICK_SECONDS", 30))
app.conf.beat_schedule = {
    "stale-work": {"task": "webapp.stale_work_sweep", "schedule": _STALE_CHECK_SECONDS},
    # A tick that waited past the next one is dropped: a busy worker does not work off a backlog.
    "learning-policies": {
        "task": "training.learning_policies_tick",
        "schedule": _LEARNING_POLICY_TICK_SECONDS,
        "options": {"expires": _LEARNING_POLICY_TICK_SECONDS},
    },
    "rollouts": {
        "task": "training.rollouts_tick",
        "schedule": _ROLLOUT_TICK_SECONDS,
        "options": {"expires": _ROLLOUT_TICK_SECONDS},
    },
}
