"""Progressive release end to end on the tiny model: real vLLM servers, the gateway, a Celery
worker that runs the release and the periodic check, and customers talking through the real
`openai` client.

- A good candidate (the talking adapter under a second name) walks 5 % -> 25 % -> 100 % by
  itself, and no conversation changes version mid-way, not even one that began on live at 5 %
  and continues after the step to 25 % covers its point. The base model has two replicas
  (the session's server, and a second one `serve_inference` supervises), and two gateway
  processes take turns with each conversation's calls: a conversation's turns reach both
  replicas and both processes, and its version never changes.
- A candidate that greets the release's smoke request but answers customers with nothing is
  rolled back at 5 % by the check, with the reason in its change log, and every conversation
  goes back to live."""

from __future__ import annotations

import time

import openai
import pytest
from django.conf import settings

from feedback.gateway.split import conversation_bucket, conversation_key
from feedback.models import Message, Trace
from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory
from tests.fixtures.adapters import PROMPTS, silent_adapter_train
from tests.fixtures.inference import GatewayServer, _ThreadedUvicorn, talking_version_create
from tests.promotion.conftest import evaluation_row
from tests.promotion.test_replicas_vllm import second_replica, served  # noqa: F401 (fixture)
from training.inference.server import free_port
from training.promotion.rollout_models import Rollout, RolloutState
from training.promotion.services.promotion import promotion_approve, promotion_request_create
from training.promotion.services.release_plans import release_plan_create
from training.serving.models import LiveVersion
from training.serving.services import live_version_set, model_version_create
from training.tasks import rollouts_tick_task

pytestmark = [pytest.mark.vllm, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

STEPS = [
    {"share": 0.05, "min_conversations": 3, "min_minutes": 0},
    {"share": 0.25, "min_conversations": 3, "min_minutes": 0},
    {"share": 1.0},
]
# A handful of answers on a shared CPU measures latency too noisily to gate these steps on it
# (the first answers of a freshly loaded adapter are slower); every other signal keeps its default.
THRESHOLDS = {"latency": 5.0}


def sessions(low: float, high: float, count: int, taken: set[str]) -> list[str]:
    """`count` new session ids whose conversations' points lie in [low, high)."""
    out, i = [], 0
    while len(out) < count:
        session = f"customer-{i}"
        point = conversation_bucket(conversation_key(session=session, trace_key=None, api_key_id=None, messages=[]))
        if low <= point < high and session not in taken:
            out.append(session)
            taken.add(session)
        i += 1
    return out


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)


def rollout_state(rollout_id: int) -> tuple[str, int]:
    r = Rollout.objects.get(pk=rollout_id)
    return r.state, r.step


class Customers:
    """Conversations through the gateway, each its history and session id. With several
    gateway processes, a conversation's calls take them in turn; each call notes the replica
    that answered it (calls are one at a time: the one whose count of requests grew)."""

    def __init__(self, gateways, key: str) -> None:
        self.gateways = list(gateways)
        self.clients = [
            openai.OpenAI(base_url=f"{g.url}/v1", api_key=key, max_retries=0, timeout=120) for g in self.gateways
        ]
        self.histories: dict[str, list[dict]] = {}
        self.served: dict[str, list[str]] = {}
        self.replicas: dict[str, list[str]] = {}
        self.processes: dict[str, list[int]] = {}

    def say(self, session: str) -> str:
        history = self.histories.setdefault(session, [dict(m) for m in PROMPTS[len(self.histories) % len(PROMPTS)]])
        if history[-1]["role"] == "assistant":
            history.append({"role": "user", "content": "Thanks. Anything else?"})
        turn = len(self.served.get(session, []))
        process = turn % len(self.gateways)
        balancer = self.gateways[process].app.balancer
        before = {url: r.sent for url, r in balancer.replicas.items()}
        raw = self.clients[process].chat.completions.with_raw_response.create(
            model="support",
            messages=history,
            max_tokens=16,
            temperature=0,
            extra_headers={"X-Practicum-Session-Id": session},
        )
        reply = raw.parse()
        history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        self.served.setdefault(session, []).append(raw.headers["x-practicum-model-version"])
        grew = [url for url, r in balancer.replicas.items() if r.sent > before.get(url, 0)]
        assert len(grew) == 1, grew  # one replica answered, without a retry
        self.replicas.setdefault(session, []).append(grew[0])
        self.processes.setdefault(session, []).append(process)
        return reply.choices[0].message.content or ""


@pytest.fixture
def other_gateway(transactional_db):
    """Another gateway process's app (its own pins, route cache and replica counts) on the same
    database: a conversation's next call may reach a process that never routed it."""
    from feedback.gateway.app import GatewayApp, mount
    from webapp.asgi import django_application

    app = GatewayApp(auth_ttl=0, route_ttl=0, upstream_timeout=60)
    port = free_port()
    with _ThreadedUvicorn(mount(django_application, app), port):
        yield GatewayServer(url=f"http://127.0.0.1:{port}", app=app)


@pytest.fixture
def setting(transactional_db, vllm_server, tiny_base, talking_adapter_path, operator, approver):
    deployment = DeploymentFactory(name="support-bot")
    live = talking_version_create(tiny_base, talking_adapter_path, vllm_server, name="tiny-talking")
    live_version_set(deployment=deployment, version=live)
    plan = release_plan_create(name="quick", deployment=deployment, steps=STEPS, thresholds=THRESHOLDS)
    key = api_key_create(deployment=deployment, scopes=["ingest"]).plaintext
    return deployment, live, plan, key


def approve(deployment, live, candidate, plan, operator, approver) -> Rollout:
    evaluation = evaluation_row(candidate, deployment, live)
    promotion = promotion_request_create(
        candidate=candidate, deployment=deployment, evaluation=evaluation, requested_by=operator
    )
    release = promotion_approve(promotion=promotion, user=approver, comment="in steps", plan=plan)
    rollout = Rollout.objects.get(release=release)
    wait_until(lambda: rollout_state(rollout.pk)[0] != RolloutState.STARTING, 180, "the release loads the candidate")
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.RUNNING, rollout.reason
    return rollout


def tick_until(rollout: Rollout, state_step: tuple[str, int], what: str) -> None:
    def moved() -> bool:
        if rollout_state(rollout.pk) == state_step:
            return True
        rollouts_tick_task.delay()  # what celery beat sends every PRACTICUM_ROLLOUT_TICK_SECONDS
        return False

    wait_until(moved, 120, what)


def test_a_good_candidate_walks_every_step_by_itself_and_no_conversation_switches(
    setting,
    second_replica,  # noqa: F811 (fixture): after `setting`, so its server loads the live adapter
    gateway,
    other_gateway,
    deploy_worker,
    vllm_server,
    tiny_base,
    talking_adapter_path,
    operator,
    approver,
):
    deployment, live, plan, key = setting
    replicas = [vllm_server.url, second_replica[0]]
    # `serve_inference` loads the live adapter when its server is up, before it serves anyone.
    wait_until(lambda: live.name in served(replicas[1]), 120, "the second replica serving the live version")
    candidate = model_version_create(
        name="tiny-talking-r2", base_model=tiny_base, kind="lora", path=talking_adapter_path, parent=live
    )
    rollout = approve(deployment, live, candidate, plan, operator, approver)
    # The release loaded and smoke-tested the candidate on both replicas before the first step.
    assert [r["replica"] for r in rollout.release.smoke["replicas"]] == replicas
    assert all(candidate.name in served(url) for url in replicas)
    customers, taken = Customers([gateway, other_gateway], key), set()
    early = sessions(0.0, 0.05, 3, taken)  # the candidate's from 5 %
    movers = sessions(0.05, 0.25, 3, taken)  # live's at 5 %; the 25 % step covers their points
    stay = sessions(0.25, 1.0, 6, taken)
    for session in early + movers + stay:
        customers.say(session)
    gateway.drain()

    tick_until(rollout, (RolloutState.RUNNING, 1), "the check advances to 25 %")

    # Conversations under way continue where they began, each through the other gateway process,
    # which never routed it; new ones take the new share. (In the reverse order: each process
    # takes its replicas in turn, so a conversation's second call reaches the other replica.)
    for session in reversed(early + movers + stay):
        customers.say(session)
    fresh = sessions(0.05, 0.25, 3, taken) + sessions(0.25, 1.0, 3, taken)
    for session in fresh:
        customers.say(session)
    gateway.drain()
    other_gateway.drain()

    tick_until(rollout, (RolloutState.COMPLETE, 2), "the check completes the plan")
    assert LiveVersion.objects.get(deployment=deployment).version == candidate

    expected = {s: candidate.name for s in early + fresh[:3]} | {s: live.name for s in movers + stay + fresh[3:]}
    for session, name in expected.items():
        assert set(customers.served[session]) == {name}, (session, customers.served[session])
        trace = Trace.objects.get(deployment=deployment, session_id=session)
        versions = set(
            Message.objects.filter(trace=trace, role="assistant").values_list("model_version__name", flat=True)
        )
        assert versions == {name}
        assert trace.metadata["practicum_release"]["canary"] is (name == candidate.name)
    # Every conversation's calls went through both gateway processes, the calls as a whole to
    # both replicas, and the conversations of each version had turns on both replicas.
    assert all(set(customers.processes[s]) == {0, 1} for s in early + movers + stay)
    both = {s for s, urls in customers.replicas.items() if set(urls) == set(replicas)}
    assert {expected[s] for s in both} == {candidate.name, live.name}, customers.replicas
    moves = list(rollout.changes.values_list("actor_name", "from_share", "to_share", "to_state"))
    assert moves[-2:] == [("automatic", 0.05, 0.25, "running"), ("automatic", 0.25, 1.0, "complete")]
    # Complete: the candidate is live, and serves every new conversation.
    late = sessions(0.5, 1.0, 1, taken)[0]
    customers.say(late)
    assert customers.served[late] == [candidate.name]


@pytest.fixture(scope="session")
def silent_adapter_path(tiny_model_path):
    return silent_adapter_train(tiny_model_path, settings.DATA_DIR / "test-models" / "tiny-lora-silent")


def test_a_candidate_that_answers_customers_with_nothing_is_rolled_back_at_5_percent(
    setting, gateway, deploy_worker, vllm_server, tiny_base, silent_adapter_path, operator, approver
):
    deployment, live, plan, key = setting
    candidate = model_version_create(
        name="tiny-silent", base_model=tiny_base, kind="lora", path=silent_adapter_path, parent=live
    )
    # Its smoke request passes: only customers see what it does.
    rollout = approve(deployment, live, candidate, plan, operator, approver)
    customers, taken = Customers([gateway], key), set()
    # A rollback needs 10 of the candidate's answers at least: one or two never end a release.
    early, stay = sessions(0.0, 0.05, 10, taken), sessions(0.05, 1.0, 12, taken)
    for session in early:
        assert customers.say(session).strip() == ""
    for session in stay:
        assert customers.say(session).strip()
    gateway.drain()

    tick_until(rollout, (RolloutState.ROLLED_BACK, 0), "the check rolls the candidate back")

    rollout.refresh_from_db()
    assert rollout.reason.startswith("regressed beyond its threshold: Empty answers 1.000 vs live 0.000")
    last = rollout.changes.last()
    assert (last.actor_name, last.from_share, last.to_share) == ("automatic", 0.05, 0.0)
    assert LiveVersion.objects.get(deployment=deployment).version == live
    # The conversations the candidate served continue on live.
    for session in early:
        assert customers.say(session).strip()
        assert customers.served[session][-1] == live.name
