"""What an evaluation with whole episodes records for the approver: each episode's kind and
policy violations, success and violations per kind, the gain with its task-bootstrap
interval, and the decision curve of both versions (the tiny model, generated in-process)."""

from __future__ import annotations

import pytest

from webapp.kernel.work import WorkStatus

TASKS = 4


@pytest.fixture
def tool_registry(db, tiny_model_path, tool_call_adapter_path):
    from tests.factories import DeploymentFactory
    from training.inference.server import free_port
    from training.serving.services import base_model_register, live_version_set, model_version_create

    base, base_version = base_model_register(
        name="tiny", path=tiny_model_path, inference_url=f"http://127.0.0.1:{free_port()}"
    )
    deployment = DeploymentFactory(name="support-bot")
    live_version_set(deployment=deployment, version=base_version)
    # Answers every prompt with a lookup of order A1001, which the store does not have.
    candidate = model_version_create(
        name="tiny-tools", base_model=base, kind="lora", path=tool_call_adapter_path, parent=base_version
    )
    return deployment, candidate


def test_an_episode_evaluation_records_kinds_violations_the_gain_and_the_decision_curve(
    tool_registry, operator, settings
):
    from training.environments.support_desk import KINDS, REFUND_WINDOW_DAYS, SupportDesk
    from training.promotion.services.evaluation import evaluation_create, evaluation_run

    settings.EVAL_DECISION_CURVE_PER_POINT = 1
    settings.EVAL_DECISION_CURVE_EVERY = 6  # 0, 6, …, 60 and 31: 12 days, and 3 statuses
    deployment, candidate = tool_registry
    evaluation = evaluation_create(
        candidate=candidate,
        deployment=deployment,
        environment="support-desk",
        environment_tasks=TASKS,
        created_by=operator,
        max_tokens=40,
        generator="local",
    )
    assert evaluation.config["decision_curve"] == {"per_point": 1, "every": 6}
    evaluation = evaluation_run(evaluation_id=evaluation.pk)
    assert evaluation.status == WorkStatus.FINISHED, evaluation.error

    tasks = {t.id: t for t in SupportDesk().tasks()}
    for item in evaluation.items.all():
        kind = tasks[item.source["task_id"]].hidden["kind"]
        for side in (item.candidate, item.baseline):
            assert (side["kind"], side["kind_label"]) == (kind, KINDS[kind])
            assert isinstance(side["policy_violations"], list)
    summary = evaluation.summary
    cand = summary["candidate"]["episodes"]
    # The candidate only looks up an order the store does not have: it writes nothing.
    assert cand["violations"] == {
        "rate": 0.0,
        "count": 0,
        "n": TASKS,
        "ci_low": 0.0,
        "ci_high": cand["violations"]["ci_high"],
    }
    kinds = [tasks[i.source["task_id"]].hidden["kind"] for i in evaluation.items.order_by("position")]
    assert set(cand["by_kind"]) == set(kinds)  # a stored object keeps no key order
    assert sum(k["violations"]["n"] for k in cand["by_kind"].values()) == TASKS
    assert all(k["label"] == KINDS[name] for name, k in cand["by_kind"].items())

    graded = [i for i in evaluation.items.all() if i.candidate["success"] is not None]
    gain = summary["gain"]
    assert gain["method"] == "task-bootstrap" and (gain["tasks"], gain["seeds"]) == (len(graded), 1)
    expected = sum(i.candidate["success"] - i.baseline["success"] for i in graded) / len(graded)
    assert gain["mean"] == pytest.approx(expected) and gain["ci_low"] <= gain["mean"] <= gain["ci_high"]

    curve = summary["decision_curve"]
    assert curve["x_label"] == "days since delivery" and curve["rule"]["threshold"] == REFUND_WINDOW_DAYS
    days = sorted({*range(0, 61, 6), 30, 31})
    assert [x for x, _p, _n in curve["series"]["candidate"]] == days
    assert all(n == 1 for _x, _p, n in curve["series"]["live"])
    # It never refunds: P = 0 at every day, right past the line and wrong up to it.
    assert all(p == 0.0 for _x, p, _n in curve["series"]["candidate"])
    assert set(curve["statuses"]["candidate"]) == {"shipped", "processing", "refunded"}
    refused = len([d for d in days if d > REFUND_WINDOW_DAYS]) + 3
    contexts = len(days) + 3
    assert curve["agreement"]["candidate"] == {"rate": refused / contexts, "count": refused, "n": contexts}


def test_no_curve_where_it_is_turned_off_or_the_evaluation_has_no_environment(tool_registry, operator, settings):
    from training.promotion.services.evaluation import evaluation_create

    settings.EVAL_DECISION_CURVE_PER_POINT = 0
    deployment, candidate = tool_registry
    off = evaluation_create(
        candidate=candidate, deployment=deployment, environment="support-desk", environment_tasks=1, generator="local"
    )
    assert off.config["decision_curve"]["per_point"] == 0
    items = evaluation_create(
        candidate=candidate,
        deployment=deployment,
        items=[{"messages": [{"role": "user", "content": "hello"}]}],
        generator="local",
    )
    assert "decision_curve" not in items.config
