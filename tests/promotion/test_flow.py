"""The whole loop's last steps with real parts: the vLLM server on the tiny model, a Celery
worker on Redis (deploy and default queues), the gateway, the `openai` client, the judge
endpoint, and the HTTP API for people.

evaluate (server generation, worker) → request → approve → release (worker) → the gateway
answers from the tool-call adapter → rollback → the version before answers again (the
talking adapter: the random tiny model itself answers only newlines, which no release's
smoke test passes).
"""

from __future__ import annotations

import time

import openai
import pytest

from feedback.models import DeploymentJudge
from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory, user_with_role
from tests.fixtures.adapters import LOOKUP_TOOL
from tests.fixtures.inference import talking_version_create
from tests.fixtures.judge import scores_lookups
from training.promotion.models import AuditAction, AuditEvent
from training.serving.models import LiveVersion, LiveVersionChange

pytestmark = [pytest.mark.vllm, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "Where is my order A1001?"}]


def ask(agent: openai.OpenAI):
    raw = agent.chat.completions.with_raw_response.create(
        model="support-agent", messages=QUESTION, tools=[LOOKUP_TOOL], temperature=0, max_tokens=40
    )
    return raw.headers["x-practicum-model-version"], raw.parse().choices[0].message


def wait_for(predicate, *, timeout: float, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"not true within {timeout} s")


@pytest.fixture
def people(transactional_db):
    return user_with_role("operator", "olga"), user_with_role("approver", "arno")


def test_evaluate_approve_deploy_and_roll_back_through_the_gateway(
    vllm_server,
    tiny_base,
    tool_call_adapter_path,
    talking_adapter_path,
    gateway,
    deploy_worker,
    judge_server,
    people,
    client,
):
    from training.serving.services import live_version_set, model_version_create

    operator, approver = people
    deployment = DeploymentFactory(name="support-bot")
    base_version = talking_version_create(tiny_base, talking_adapter_path, vllm_server)
    live_version_set(deployment=deployment, version=base_version)
    DeploymentJudge.objects.create(deployment=deployment, base_url=judge_server.base_url, model="test-judge")
    judge_server.respond_with(scores_lookups)
    candidate = model_version_create(
        name="tiny-tools-v1", base_model=tiny_base, kind="lora", path=tool_call_adapter_path, parent=base_version
    )
    key = api_key_create(deployment=deployment, scopes=["ingest"]).plaintext
    agent = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=60)

    version, message = ask(agent)
    assert version == base_version.name and not message.tool_calls

    # Evaluate on the inference server, in the worker.
    client.force_login(operator)
    created = client.post(
        "/api/v1/evaluations",
        {
            "candidate": candidate.name,
            "deployment": deployment.name,
            "items": [{"messages": QUESTION, "tools": [LOOKUP_TOOL]}],
            "max_tokens": 40,
        },
        content_type="application/json",
    ).json()
    assert created["config"]["generator"] == "server"
    evaluation = wait_for(
        lambda: (e := client.get(f"/api/v1/evaluations/{created['id']}").json())["status"] == "finished" and e,
        timeout=120,
        poll=0.5,
    )
    summary = evaluation["summary"]
    assert summary["comparison"]["win_rate"] == 1.0, summary
    assert (summary["candidate"]["tool_calls"], summary["candidate"]["tool_call_validity"]) == (1, 1.0)
    assert summary["kl"]["n"] == 1 and summary["kl"]["mean"] > 0

    promotion = client.post(
        "/api/v1/promotions",
        {"candidate": candidate.name, "deployment": deployment.name, "evaluation": created["id"], "note": "v1"},
        content_type="application/json",
    ).json()

    # Approve, then ask through the gateway until the adapter answers.
    client.force_login(approver)
    approved_at = time.monotonic()
    response = client.post(f"/api/v1/promotions/{promotion['id']}/approve", {"comment": "ok"}, "application/json")
    assert response.status_code == 202, response.json()
    version, message = wait_for(lambda: (r := ask(agent))[0] == candidate.name and r, timeout=60)
    serving_s = time.monotonic() - approved_at
    assert message.tool_calls[0].function.name == "lookup_order"
    release = client.get(f"/api/v1/releases/{response.json()['id']}").json()
    assert (release["status"], release["step"]) == ("finished", "switch")
    print(
        f"\napproval → new version serving through the gateway: {serving_s:.2f} s; release steps (ms): "
        f"{release['timings_ms']}"
    )
    assert serving_s < 30

    # Roll back: the base answers again.
    rolled = client.post(f"/api/v1/deployments/{deployment.name}/rollback", {"reason": "test"}, "application/json")
    assert rolled.status_code == 202, rolled.json()
    version, message = wait_for(lambda: (r := ask(agent))[0] == base_version.name and r, timeout=60)
    assert not message.tool_calls
    assert LiveVersion.objects.get(deployment=deployment).version == base_version
    assert client.get(f"/api/v1/promotions/{promotion['id']}").json()["status"] == "rolled_back"

    steps = list(AuditEvent.objects.order_by("id").values_list("action", "actor_name"))
    assert steps == [
        (AuditAction.EVALUATION_STARTED, "olga"),
        (AuditAction.EVALUATION_FINISHED, ""),
        (AuditAction.PROMOTION_REQUESTED, "olga"),
        (AuditAction.PROMOTION_APPROVED, "arno"),
        (AuditAction.RELEASE_LOADED, ""),
        (AuditAction.RELEASE_SMOKE_PASSED, ""),
        (AuditAction.ROLLBACK_REQUESTED, "arno"),
        (AuditAction.RELEASE_LOADED, ""),
        (AuditAction.RELEASE_SMOKE_PASSED, ""),
    ]
    # Each switch is one row of the pointer's trail, which the audit log shows among the steps.
    moves = LiveVersionChange.objects.filter(deployment=deployment).order_by("id")
    assert list(moves.values_list("kind", "changed_by__username"))[-2:] == [("promotion", "arno"), ("rollback", "arno")]
    log = client.get(f"/api/v1/audit?deployment={deployment.name}").json()["events"]
    assert [e["data"]["kind"] for e in log if e["action"] == AuditAction.LIVE_SWITCHED][:2] == ["rollback", "promotion"]
