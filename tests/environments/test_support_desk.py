"""The support-desk environment: a fixed task family, a hidden refund policy graded on the
final rows, tracking tasks without a grade, and a train / held-out split."""

from __future__ import annotations

import json

from training.environments import Completion, environment_get, episode_run
from training.environments.support_desk import SupportDesk, orders_table, refund_allowed, tasks_sample


def call(name: str, order_id: str, **extra) -> Completion:
    arguments = json.dumps({"order_id": order_id, **extra})
    return Completion(
        message={
            "content": "",
            "tool_calls": [{"id": f"c-{name}", "type": "function", "function": {"name": name, "arguments": arguments}}],
        },
        tokens=12,
    )


def scripted(*turns):
    it = iter(turns)
    return lambda messages, tools, max_tokens: next(it)


def test_it_is_registered_and_its_tasks_are_the_same_on_every_build():
    desk = environment_get("support-desk")
    assert isinstance(desk, SupportDesk)
    again = SupportDesk()
    assert [(t.id, t.prompt, t.split) for t in desk.tasks()] == [(t.id, t.prompt, t.split) for t in again.tasks()]
    heldout = desk.tasks_for(split="heldout", graded=True)
    train = desk.tasks_for(split="train", graded=True)
    assert len(heldout) == 12 and len(train) == 36
    assert not {t.hidden["order_id"] for t in heldout} & {t.hidden["order_id"] for t in train}
    # Both splits hold orders the policy refunds and orders it does not.
    assert {t.hidden["refund"] for t in heldout} == {True, False} == {t.hidden["refund"] for t in train}
    assert all("policy" not in t.system and "30 days" not in t.prompt for t in desk.tasks())


def test_the_hidden_policy():
    rows = {r["order_id"]: dict(r) for r in orders_table().rows}
    assert refund_allowed(rows["A1001"])  # delivered 3 days ago
    assert not refund_allowed(rows["A1002"])  # still shipping
    assert not refund_allowed(rows["A1004"])  # delivered 45 days ago


def test_a_refund_the_policy_allows_succeeds_and_one_it_forbids_fails_with_a_reason():
    desk = SupportDesk()
    allowed, forbidden = desk.task("refund-A1001"), desk.task("refund-A1004")
    refund_done = episode_run(
        desk,
        allowed,
        scripted(call("lookup_order", "A1001"), call("issue_refund", "A1001"), Completion({"content": "Done."}, 2)),
    )
    assert (refund_done.reward, refund_done.grade.reason) == (1.0, "refunded order A1001 in full, as the policy allows")
    assert json.loads(refund_done.messages[3]["content"])["status"] == "delivered"

    wrong = episode_run(desk, forbidden, scripted(call("issue_refund", "A1004"), Completion({"content": "Done."}, 2)))
    assert wrong.reward == 0.0
    assert wrong.grade.reason.startswith('order A1004: status is "refunded", expected "delivered"')

    declined = episode_run(
        desk, forbidden, scripted(call("lookup_order", "A1004"), Completion({"content": "Sorry."}, 2))
    )
    assert (declined.reward, declined.grade.reason) == (
        1.0,
        "did not refund order A1004, which the policy does not allow",
    )

    partial = episode_run(
        desk, allowed, scripted(call("issue_refund", "A1001", amount=1), Completion({"content": "Ok."}, 2))
    )
    assert partial.reward == 0.0 and "refunded_amount is 1" in partial.grade.reason

    other = episode_run(desk, forbidden, scripted(call("issue_refund", "A1001"), Completion({"content": "Ok."}, 2)))
    assert other.reward == 0.0 and "order A1001 was changed" in other.grade.reason


def test_tool_mistakes_are_errors_the_model_reads():
    desk = SupportDesk()
    task = desk.task("refund-A1001")
    episode = episode_run(
        desk,
        task,
        scripted(
            call("lookup_order", "Z9999"),
            call("issue_refund", "A1001", amount=10_000),
            call("issue_refund", "A1001", note="x"),
            Completion({"content": "Sorry."}, 2),
        ),
    )
    errors = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert errors == [
        'error: no order with order_id "Z9999"',
        "error: amount must be at most the order's price, 12.50",
        "error: unknown argument(s) note",
    ]
    assert episode.tool_errors == 3 and episode.reward == 0.0


def test_tracking_tasks_carry_feedback_and_no_grade():
    desk = SupportDesk()
    tracking = desk.tasks_for(split="train", graded=False)
    assert tracking and all(t.hidden["operator_comment"] and t.hidden["customer_feedback"] for t in tracking)
    episode = episode_run(desk, tracking[0], scripted(Completion({"content": "It has shipped."}, 4)))
    assert not desk.graded(tracking[0]) and episode.grade.reason.startswith("not graded")


def test_task_samples_are_reproducible():
    assert [t.id for t in tasks_sample(split="train", count=10, seed=3, graded_share=0.5)] == [
        t.id for t in tasks_sample(split="train", count=10, seed=3, graded_share=0.5)
    ]
    assert all(t.hidden["graded"] for t in tasks_sample(split="heldout", count=20, seed=1))


def test_the_audit_names_writes_to_other_customers_orders_and_ids_the_customer_never_gave():
    desk = SupportDesk()
    task = desk.task("refund-A1001")
    # The order the customer wrote is A1001; the agent looks up and refunds A1002 instead,
    # an id it was never shown (as a model that learned its training traffic by heart does).
    wrong = episode_run(
        desk,
        task,
        scripted(call("lookup_order", "A1002"), call("issue_refund", "A1002"), Completion({"content": "Done."}, 2)),
    )
    assert wrong.reward == 0.0
    assert wrong.audit.unknown_ids == ("A1002", "A1002")
    assert len(wrong.audit.collateral_changes) == 1 and "A1002" in wrong.audit.collateral_changes[0]
    assert wrong.metadata("support-desk")["collateral_changes"] == 1

    right = episode_run(
        desk,
        task,
        scripted(call("lookup_order", "a1001 "), call("issue_refund", "A1001"), Completion({"content": "Done."}, 2)),
    )
    assert right.reward == 1.0
    assert right.audit.collateral_changes == () and right.audit.unknown_ids == ()

    # An id that only appeared in an error message is still unknown: the error is not a source.
    guessed = episode_run(
        desk,
        task,
        scripted(call("lookup_order", "Z9"), call("lookup_order", "Z9"), Completion({"content": "Sorry."}, 2)),
    )
    assert guessed.audit.unknown_ids == ("Z9", "Z9") and guessed.audit.collateral_changes == ()


def test_an_id_is_known_only_as_a_whole_token_of_what_the_customer_wrote():
    desk = SupportDesk()
    partial = episode_run(
        desk, desk.task("refund-A1001"), scripted(call("lookup_order", "A100"), Completion({"content": "?"}, 2))
    )
    assert partial.audit.unknown_ids == ("A100",)
