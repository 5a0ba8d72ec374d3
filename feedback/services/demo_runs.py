"""Running the demo agent from the dashboard (the tour's "run the agent again" step).

The agent talks to the gateway exactly as a customer's harness would: with a deployment
API key, over HTTP. The key is made for the run, lives at most `DEMO_AGENT_KEY_SECONDS`,
and is revoked when the run ends, so no key travels through the broker or stays behind."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from feedback.demo.agent import demo_agent_run
from feedback.services.api_keys import api_key_create, api_key_revoke
from feedback.tasks import demo_agent_run_task
from training.serving.models import Deployment
from webapp.kernel.errors import Invalid

SPLITS = ("train", "test")
MAX_EPISODES = 200


class DemoRunError(Invalid, ValueError):
    """A run that cannot be started; `errors` lists (field, reason) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors), errors=errors)


def demo_agent_run_enqueue(*, deployment: Deployment, split: str, episodes: int) -> None:
    """Check the request and queue a run of the demo agent on the `default` queue. The
    agent goes to the configured gateway (`GATEWAY_URL`), never to an address a request
    names: the run carries a freshly minted key there."""
    errors = []
    if split not in SPLITS:
        errors.append(("split", f"must be one of {', '.join(SPLITS)}"))
    if not 1 <= episodes <= MAX_EPISODES:
        errors.append(("episodes", f"must be between 1 and {MAX_EPISODES}"))
    if not settings.GATEWAY_URL.startswith(("http://", "https://")):
        errors.append(("PRACTICUM_GATEWAY_URL", "must be an http(s) URL"))
    if errors:
        raise DemoRunError(errors)

    demo_agent_run_task.delay_on_commit(deployment.pk, split, episodes)


def demo_agent_run_for(*, deployment: Deployment, split: str, episodes: int, seed: int = 0) -> Any:
    """Run the demo agent against the configured gateway with a key made for this run."""
    base_url = settings.GATEWAY_URL
    created = api_key_create(
        deployment=deployment,
        scopes=["ingest", "feedback"],
        name="demo agent run",
        expires_at=timezone.now() + timedelta(seconds=settings.DEMO_AGENT_KEY_SECONDS),
    )
    try:
        return demo_agent_run(base_url=base_url, api_key=created.plaintext, split=split, episodes=episodes, seed=seed)
    finally:
        api_key_revoke(api_key=created.api_key)
