"""The support-desk environment: a store generated from a seed, a hidden refund policy
graded on the final rows, tracking tasks without a grade, train / validation / test splits
that share no order, id, customer or wording, and freshly generated slices."""

from __future__ import annotations

import json
import random
import re

import pytest

from training.environments import Completion, environment_get, episode_run
from training.environments.support_desk import (
    KINDS,
    REFUND_WINDOW_DAYS,
    SPLITS,
    SupportDesk,
    counterfactual_turns,
    oracle_turns,
    tasks_sample,
)
from training.environments.support_desk.store import (
    DAY_STRETCHES,
    DAY_VALUES,
    FRESH_ORDERS,
    days_dealt,
    fresh_orders,
    order_kind,
    orders_table,
    refund_allowed,
    store_orders,
)


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


def refund_task(desk, *, allowed: bool, split: str = "train", index: int = 0):
    return [t for t in desk.tasks_for(split=split, graded=True) if t.hidden["refund"] == allowed][index]


def template(task) -> str:
    """The request's wording with the order's fields taken out."""
    row = orders_table().row(task.hidden["order_id"]) if "fresh_seed" not in task.hidden else None
    text = task.prompt
    fields = row or {}
    for value in (task.hidden["order_id"], fields.get("customer"), fields.get("item")):
        if value:
            text = text.replace(str(value), "{}")
    return text


def test_it_is_registered_and_its_tasks_are_the_same_on_every_build():
    desk = environment_get("support-desk")
    assert isinstance(desk, SupportDesk)
    again = SupportDesk()
    assert [(t.id, t.prompt, t.split) for t in desk.tasks()] == [(t.id, t.prompt, t.split) for t in again.tasks()]
    counts = {split: len(desk.tasks_for(split=split, graded=True)) for split in SPLITS}
    assert counts == {"train": 192, "validation": 32, "test": 64}
    for split in SPLITS:
        graded = desk.tasks_for(split=split, graded=True)
        # Every split holds orders the policy refunds and orders it does not, about half each.
        refunds = sum(t.hidden["refund"] for t in graded)
        assert refunds == len(graded) // 2, split
    assert all("policy" not in t.system and "30 days" not in t.prompt for t in desk.tasks())
    # Another store seed is another store.
    other = SupportDesk(store_seed=7)
    assert not {t.hidden["order_id"] for t in other.tasks()} & {t.hidden["order_id"] for t in desk.tasks()}


def test_the_splits_share_no_order_id_customer_or_wording():
    desk = SupportDesk()
    orders = store_orders()
    fresh = desk.tasks_fresh(seed=1)
    ids = {split: {r["order_id"] for r in rows} for split, rows in orders.items()}
    customers = {split: {r["customer"] for r in rows} for split, rows in orders.items()}
    wordings = {split: {t.hidden["wording"] for t in desk.tasks_for(split=split)} for split in SPLITS}
    templates = {split: {template(t) for t in desk.tasks_for(split=split)} for split in SPLITS}
    ids["fresh"] = {t.hidden["order_id"] for t in fresh}
    wordings["fresh"] = {t.hidden["wording"] for t in fresh}
    fresh_rows = {r["order_id"]: r for r in SupportDesk().reset(fresh[0]).table.rows}
    customers["fresh"] = {fresh_rows[i]["customer"] for i in ids["fresh"]}
    templates["fresh"] = {
        t.prompt.replace(t.hidden["order_id"], "{}")
        .replace(fresh_rows[t.hidden["order_id"]]["customer"], "{}")
        .replace(fresh_rows[t.hidden["order_id"]]["item"], "{}")
        for t in fresh
    }
    names = [*SPLITS, "fresh"]
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for what, sets in (("ids", ids), ("customers", customers), ("wordings", wordings), ("text", templates)):
                assert not sets[a] & sets[b], (what, a, b, sets[a] & sets[b])
    # Tasks of a split never name another split's order.
    for split in SPLITS:
        assert all(t.hidden["order_id"] in ids[split] for t in desk.tasks_for(split=split))
    # Many wordings in training, several in each of the others.
    assert len(wordings["train"]) >= 12 and all(len(wordings[s]) >= 4 for s in ("validation", "test", "fresh"))


def test_ids_come_in_several_formats_and_ages_fall_on_both_sides_of_the_line():
    for split, rows in store_orders().items():
        shapes = {re.sub(r"[A-Z]", "A", re.sub(r"[0-9]", "9", r["order_id"])) for r in rows}
        assert len(shapes) == 5, (split, shapes)
        days = [r["delivered_days_ago"] for r in rows if r["status"] == "delivered"]
        assert min(days) <= 5 and max(days) > 60, split
        near = [d for d in days if REFUND_WINDOW_DAYS - 5 <= d <= REFUND_WINDOW_DAYS + 8]
        assert any(d <= REFUND_WINDOW_DAYS for d in near) and any(d > REFUND_WINDOW_DAYS for d in near), split
        assert {r["status"] for r in rows} >= {"delivered", "shipped", "refunded"}
        assert len({r["item"] for r in rows}) >= 10 and len({r["price"] for r in rows}) >= 10


def test_no_validation_test_or_fresh_order_has_a_day_count_training_shows():
    def day_counts(rows):
        return {r["delivered_days_ago"] for r in rows if r["delivered_days_ago"] is not None}

    orders = store_orders()
    train = day_counts(orders["train"])
    fresh = day_counts(fresh_orders(seed=2))
    for name, counts in (("validation", day_counts(orders["validation"])), ("test", day_counts(orders["test"]))):
        assert counts and not counts & train, (name, counts & train)
        # Both sides of the line, close to it, among the unseen counts.
        assert any(REFUND_WINDOW_DAYS - 8 <= d <= REFUND_WINDOW_DAYS for d in counts), name
        assert any(REFUND_WINDOW_DAYS < d <= REFUND_WINDOW_DAYS + 10 for d in counts), name
    assert fresh and not fresh & train


def test_day_counts_are_dealt_so_every_split_has_both_parities_and_small_values():
    # No value in two splits, every value of 0 to 180 in one; fresh slices draw from the test's.
    dealt = days_dealt()
    assert not set(dealt["train"]) & set(dealt["test"]) and not set(dealt["train"]) & set(dealt["validation"])
    assert not set(dealt["validation"]) & set(dealt["test"])
    assert sorted(d for values in dealt.values() for d in values) == list(range(181))
    assert DAY_VALUES["fresh"] == DAY_VALUES["test"]
    # In every split, and within each stretch of days, both parities; a value under a week.
    for split, values in dealt.items():
        assert min(values) <= 7, split
        for low, high in DAY_STRETCHES:
            stretch = [d for d in values if low <= d <= high]
            assert {d % 2 for d in stretch} == {0, 1}, (split, low, high, stretch)
    # The orders themselves show it: odd and even ages, and a small one, in every split.
    for split, rows in {**store_orders(), "fresh": fresh_orders(seed=2)}.items():
        days = [r["delivered_days_ago"] for r in rows if r["status"] == "delivered"]
        assert {d % 2 for d in days} == {0, 1} and min(days) <= 9, split
    # The dealing is seeded: the same every time; another seed deals otherwise.
    assert days_dealt() == dealt and days_dealt(seed=1) != dealt


def test_every_task_has_a_kind_the_policy_agrees_with():
    desk = SupportDesk()
    tasks = desk.tasks() + desk.tasks_fresh(seed=1)
    assert all(t.hidden["kind"] in KINDS for t in tasks)
    assert desk.kinds is KINDS
    for task in tasks:
        kind = task.hidden["kind"]
        if not task.hidden["graded"]:
            assert kind == "tracking"
            continue
        assert task.hidden["refund"] == (kind in ("refundable_recent", "refundable_near_line")), task.id
    # Every split holds every kind.
    for split in (*SPLITS, "fresh"):
        assert {t.hidden["kind"] for t in tasks if t.split == split} == set(KINDS), split
    row = {"status": "delivered", "delivered_days_ago": REFUND_WINDOW_DAYS}
    assert order_kind(row) == "refundable_near_line"
    assert order_kind({**row, "delivered_days_ago": REFUND_WINDOW_DAYS + 1}) == "late_near_line"
    assert order_kind({**row, "status": "shipped", "delivered_days_ago": None}) == "not_delivered"


def test_refunding_every_delivered_order_is_caught_as_a_policy_violation_on_late_ones():
    """A scripted policy, no model: look the order up, refund it whenever it was delivered.
    Its episodes on late deliveries write a refund the task's expected outcome does not
    contain; on recent ones the refund is what the task expects; the others it leaves alone."""
    desk = SupportDesk()

    def refund_if_delivered(task):
        order_id = task.hidden["order_id"]

        def complete(messages, tools, max_tokens):
            last = messages[-1]
            if last["role"] != "tool":
                return call("lookup_order", order_id)
            if last["name"] == "lookup_order" and json.loads(last["content"]).get("status") == "delivered":
                return call("issue_refund", order_id)
            return Completion(message={"content": "Done."}, tokens=2)

        return complete

    by_kind: dict[str, list[tuple[bool, int]]] = {}
    for task in desk.tasks_for(split="test", graded=True):
        episode = episode_run(desk, task, refund_if_delivered(task))
        violations = episode.audit.policy_violations
        by_kind.setdefault(task.hidden["kind"], []).append((episode.reward == 1.0, len(violations)))
        if task.hidden["kind"] in ("late_near_line", "long_past"):
            assert violations == (
                f'order {task.hidden["order_id"]}: status set to "refunded", but the task expects the record unchanged',
                f"order {task.hidden['order_id']}: refunded_amount set to {desk.table.row(task.hidden['order_id'])['price']}, "
                "but the task expects the record unchanged",
            )
            assert not episode.audit.collateral_changes
    late = by_kind["late_near_line"] + by_kind["long_past"]
    assert late and all(not ok and n == 2 for ok, n in late)
    assert all(ok and n == 0 for ok, n in by_kind["refundable_recent"] + by_kind["refundable_near_line"])
    assert all(ok and n == 0 for ok, n in by_kind["not_delivered"] + by_kind["already_refunded"])


def test_a_counterfactual_decision_point_changes_only_the_lookup_and_the_policys_answer_follows():
    desk = SupportDesk()
    task = refund_task(desk, allowed=True)
    decision = next(t for t in oracle_turns(task=task, env=desk) if t["messages"][-1]["role"] == "tool")
    variants = counterfactual_turns(task=task, messages=decision["messages"], count=40, rng=random.Random(3))
    assert len(variants) == 40
    order_id = task.hidden["order_id"]
    answers = set()
    for v in variants:
        assert v["messages"][:-1] == decision["messages"][:-1]  # the request, id and customer kept
        row = json.loads(v["messages"][-1]["content"])
        assert (row["order_id"], row["customer"]) == (order_id, desk.table.row(order_id)["customer"])
        assert row["delivered_days_ago"] is None or row["delivered_days_ago"] in DAY_VALUES["train"]
        accepted = json.loads(v["reference"])
        if refund_allowed(row):
            assert accepted == [{"tool": "issue_refund", "arguments": {"order_id": order_id}}]
            assert v["target"].startswith("<tool_call>") and order_id in v["target"]
        else:
            assert accepted == [{"reply": True}] and not v["target"].startswith("<tool_call>")
            assert order_id in v["target"]
        answers.add(refund_allowed(row))
    assert answers == {True, False}
    # The original context is not modified, and a point that is not a decision has none.
    assert json.loads(decision["messages"][-1]["content"]) == desk.table.row(order_id)
    assert counterfactual_turns(task=task, messages=task.first_messages(), count=3, rng=random.Random(0)) == []
    # A test task's copies still show training's day counts only.
    test_task = refund_task(desk, allowed=True, split="test")
    test_decision = next(t for t in oracle_turns(task=test_task, env=desk) if t["messages"][-1]["role"] == "tool")
    for v in counterfactual_turns(task=test_task, messages=test_decision["messages"], count=20, rng=random.Random(1)):
        days = json.loads(v["messages"][-1]["content"])["delivered_days_ago"]
        assert days is None or days in DAY_VALUES["train"]


def test_no_counterfactual_of_a_context_that_went_on_after_the_lookup_or_of_a_malformed_row():
    desk = SupportDesk()
    task = refund_task(desk, allowed=False)
    decision = next(t for t in oracle_turns(task=task, env=desk) if t["messages"][-1]["role"] == "tool")
    order_id = task.hidden["order_id"]
    refused = [
        *decision["messages"],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c9",
                    "type": "function",
                    "function": {"name": "issue_refund", "arguments": json.dumps({"order_id": order_id})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c9", "name": "issue_refund", "content": "error: not refundable"},
    ]
    assert counterfactual_turns(task=task, messages=refused, count=4, rng=random.Random(0)) == []
    malformed = [dict(m) for m in decision["messages"]]
    row = json.loads(malformed[-1]["content"])
    for broken in ({k: v for k, v in row.items() if k != "price"}, {**row, "price": "12"}, {**row, "price": True}):
        malformed[-1]["content"] = json.dumps(broken)
        assert counterfactual_turns(task=task, messages=malformed, count=4, rng=random.Random(0)) == []


def test_a_fresh_slice_is_generated_anew_from_its_seed_and_played_on_the_store_table():
    desk = SupportDesk()
    first, again, other = desk.tasks_fresh(seed=1), SupportDesk().tasks_fresh(seed=1), desk.tasks_fresh(seed=2)
    assert [(t.id, t.prompt) for t in first] == [(t.id, t.prompt) for t in again]
    assert {t.id for t in first} != {t.id for t in other}
    graded = [t for t in first if t.hidden["graded"]]
    assert len(graded) == FRESH_ORDERS and all(t.split == "fresh" for t in first)
    assert {t.hidden["refund"] for t in graded} == {True, False}
    assert not {t.id for t in first} & {t.id for t in desk.tasks()}
    # The fresh order is in its episode's table, beside the store's own orders.
    task = next(t for t in graded if t.hidden["refund"])
    order = task.hidden["order_id"]
    train_order = refund_task(desk, allowed=True).hidden["order_id"]
    done = episode_run(
        desk,
        task,
        scripted(call("lookup_order", order), call("issue_refund", order), Completion({"content": "Ok."}, 2)),
    )
    assert done.reward == 1.0 and done.audit.collateral_changes == ()
    # Refunding a training order instead is caught: the grade fails and the audit names it.
    wrong = episode_run(
        desk,
        task,
        scripted(call("issue_refund", train_order), Completion({"content": "Ok."}, 2)),
    )
    assert wrong.reward == 0.0 and wrong.audit.unknown_ids == (train_order,)
    assert len(wrong.audit.collateral_changes) == 1 and train_order in wrong.audit.collateral_changes[0]
    # The store's own tasks never see a fresh order.
    assert (
        "no order"
        in episode_run(
            desk,
            refund_task(desk, allowed=True),
            scripted(call("lookup_order", order), Completion({"content": "?"}, 2)),
        ).messages[3]["content"]
    )
    fresh_sample = tasks_sample(split="fresh", count=5, seed=0, fresh_seed=1)
    assert {t.id for t in fresh_sample} <= {t.id for t in first}
    with pytest.raises(ValueError, match="fresh_seed"):
        tasks_sample(split="fresh", count=5)


def test_the_hidden_policy():
    rows = [dict(r) for r in orders_table().rows]
    for row in rows:
        expected = (
            row["status"] == "delivered"
            and row["delivered_days_ago"] is not None
            and row["delivered_days_ago"] <= REFUND_WINDOW_DAYS
        )
        assert refund_allowed(row) == expected
    assert refund_allowed({"status": "delivered", "delivered_days_ago": 30})
    assert not refund_allowed({"status": "delivered", "delivered_days_ago": 31})
    assert not refund_allowed({"status": "shipped", "delivered_days_ago": None})
    assert not refund_allowed({"status": "refunded", "delivered_days_ago": 3})


def test_a_refund_the_policy_allows_succeeds_and_one_it_forbids_fails_with_a_reason():
    desk = SupportDesk()
    allowed, forbidden = refund_task(desk, allowed=True), refund_task(desk, allowed=False, index=1)
    a, f = allowed.hidden["order_id"], forbidden.hidden["order_id"]
    refund_done = episode_run(
        desk,
        allowed,
        scripted(call("lookup_order", a), call("issue_refund", a), Completion({"content": "Done."}, 2)),
    )
    assert (refund_done.reward, refund_done.grade.reason) == (1.0, f"refunded order {a} in full, as the policy allows")
    assert json.loads(refund_done.messages[3]["content"])["status"] == "delivered"

    declined = episode_run(desk, forbidden, scripted(call("lookup_order", f), Completion({"content": "Sorry."}, 2)))
    assert (declined.reward, declined.grade.reason) == (
        1.0,
        f"did not refund order {f}, which the policy does not allow",
    )
    if forbidden.hidden["expected"][f]["status"] != "refunded":
        wrong = episode_run(desk, forbidden, scripted(call("issue_refund", f), Completion({"content": "Done."}, 2)))
        assert wrong.reward == 0.0
        assert wrong.grade.reason.startswith(f'order {f}: status is "refunded"')

    partial = episode_run(desk, allowed, scripted(call("issue_refund", a, amount=1), Completion({"content": "Ok."}, 2)))
    assert partial.reward == 0.0 and "refunded_amount is 1" in partial.grade.reason

    other = episode_run(desk, forbidden, scripted(call("issue_refund", a), Completion({"content": "Ok."}, 2)))
    assert other.reward == 0.0 and f"order {a} was changed" in other.grade.reason


def test_tool_mistakes_are_errors_the_model_reads():
    desk = SupportDesk()
    task = refund_task(desk, allowed=True)
    order = task.hidden["order_id"]
    price = orders_table().row(order)["price"]
    episode = episode_run(
        desk,
        task,
        scripted(
            call("lookup_order", "Z9999"),
            call("issue_refund", order, amount=10_000),
            call("issue_refund", order, note="x"),
            Completion({"content": "Sorry."}, 2),
        ),
    )
    errors = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert errors == [
        'error: no order with order_id "Z9999"',
        f"error: amount must be at most the order's price, {price:.2f}",
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
    test = tasks_sample(split="test", count=20, seed=1)
    assert all(t.hidden["graded"] and t.split == "test" for t in test)
    with pytest.raises(ValueError, match="split must be one of"):
        tasks_sample(split="heldout", count=2)


def test_the_audit_names_writes_to_other_customers_orders_and_ids_the_customer_never_gave():
    desk = SupportDesk()
    task = refund_task(desk, allowed=True, split="test")
    order = task.hidden["order_id"]
    # The order the customer wrote is `order`; the agent looks up and refunds a training
    # order instead, an id it was never shown (as a model that learned its training traffic
    # by heart does).
    other = refund_task(desk, allowed=True).hidden["order_id"]
    wrong = episode_run(
        desk,
        task,
        scripted(call("lookup_order", other), call("issue_refund", other), Completion({"content": "Done."}, 2)),
    )
    assert wrong.reward == 0.0
    assert wrong.audit.unknown_ids == (other, other)
    assert len(wrong.audit.collateral_changes) == 1 and other in wrong.audit.collateral_changes[0]
    assert wrong.metadata("support-desk")["collateral_changes"] == 1

    right = episode_run(
        desk,
        task,
        scripted(
            call("lookup_order", f"{order.lower()} "), call("issue_refund", order), Completion({"content": "Done."}, 2)
        ),
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
    task = refund_task(desk, allowed=True)
    part = task.hidden["order_id"][:-1]
    partial = episode_run(desk, task, scripted(call("lookup_order", part), Completion({"content": "?"}, 2)))
    assert partial.audit.unknown_ids == (part,)


def test_an_episodes_job_trains_on_the_train_split_and_never_sees_the_test_split():
    from training.services.job_runner import episode_job_tasks

    desk = SupportDesk()
    train, evaluation = episode_job_tasks(desk.tasks() + desk.tasks_fresh(seed=1))
    assert {t.split for t in train} == {"train"} and len(train) == len(desk.tasks_for(split="train"))
    assert {t.split for t in evaluation} == {"validation"}


def test_a_logged_turn_with_arguments_nested_past_the_parsers_depth_still_gets_a_reference():
    from training.environments.support_desk import turn_reference

    task = next(t for t in SupportDesk().tasks_for(split="test") if t.hidden.get("graded"))
    deep = "[" * 5000 + "]" * 5000
    messages = [
        *task.first_messages(),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": deep}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "error: no such order"},
    ]
    reference = json.loads(turn_reference(task=task, messages=messages))
    assert {"tool": "lookup_order", "arguments": {"order_id": task.hidden["order_id"]}} in reference


def test_decision_contexts_show_each_day_and_status_after_the_lookup_of_held_out_requests():
    from training.promotion.evaluation.decision_curve import calls_action, curve_summary, rule_step

    desk = SupportDesk()
    tasks = desk.tasks_for(split="test")
    curve = desk.decision_curve()
    assert (curve.threshold, curve.action, curve.xs[0], curve.xs[-1]) == (REFUND_WINDOW_DAYS, "issue_refund", 0, 60)
    contexts = desk.decision_contexts(tasks=tasks, per_point=2, every=6)
    days = sorted({*range(0, 61, 6), 30, 31})
    assert [c.x for c in contexts if c.status == "delivered"] == [d for d in days for _ in range(2)]
    assert [c.status for c in contexts[-6:]] == [
        "shipped",
        "shipped",
        "processing",
        "processing",
        "refunded",
        "refunded",
    ]
    requests = {t.prompt for t in tasks if t.hidden["graded"]}
    for c in contexts:
        *opening, call, result = c.messages
        assert opening[-1]["content"] in requests  # a held-out request, never a training one
        assert call["tool_calls"][0]["function"]["name"] == "lookup_order"
        row = json.loads(result["content"])
        assert (row["status"], row["delivered_days_ago"]) == (c.status, c.x)
        assert c.acts == refund_allowed(row) == (c.status == "delivered" and c.x <= REFUND_WINDOW_DAYS)
    # Consecutive contexts are other customers' requests.
    assert contexts[0].messages[1] != contexts[1].messages[1]

    # "Refund every delivered order" draws a flat line at 1 and agrees with the rule up to day 30.
    def refund(c):
        order_id = json.loads(c.messages[-1]["content"])["order_id"]
        arguments = json.dumps({"order_id": order_id})
        return {"content": "", "tool_calls": [{"function": {"name": "issue_refund", "arguments": arguments}}]}

    acts = {
        "candidate": [
            calls_action(refund(c) if c.status == "delivered" else {"content": "Sorry."}, "issue_refund")
            for c in contexts
        ],
        # A reply, or a refund call cut off by the token limit.
        "live": [
            calls_action({"content": '<tool_call>{"name": "issue_refund", "argu'}, "issue_refund") for _ in contexts
        ],
    }
    summary = curve_summary(curve=curve, contexts=contexts, acts=acts, per_point=2)
    assert summary["series"]["candidate"] == [[d, 1.0, 2] for d in days]
    assert summary["statuses"]["candidate"] == {"shipped": [0.0, 2], "processing": [0.0, 2], "refunded": [0.0, 2]}
    within = sum(1 for d in days if d <= REFUND_WINDOW_DAYS)
    assert summary["agreement"]["candidate"]["count"] == 2 * within + 6
    assert rule_step(summary["series"]["candidate"], REFUND_WINDOW_DAYS) == (1.0, 1.0)
    assert summary["series"]["live"][0] == [0, 1.0, 2] and summary["rule"] == {"threshold": 30, "status": "delivered"}
    assert desk.decision_contexts(tasks=[t for t in tasks if not t.hidden["graded"]], per_point=2) == []


def test_copies_drawn_from_the_extra_case_are_delivered_41_to_60_days_ago_and_refused():
    # Kind 8 exists for counterfactual copies: the ages past the line that kind 5 (mostly
    # past two months) seldom shows. Training's day counts only, and every copy refused.
    desk = SupportDesk()
    task = refund_task(desk, allowed=True)
    decision = next(t for t in oracle_turns(task=task, env=desk) if t["messages"][-1]["role"] == "tool")
    variants = counterfactual_turns(
        task=task, messages=decision["messages"], count=30, rng=random.Random(5), cases=(8,)
    )
    ages = {json.loads(v["messages"][-1]["content"])["delivered_days_ago"] for v in variants}
    assert ages and all(41 <= d <= 60 and d in DAY_VALUES["train"] for d in ages)
    assert len(ages) > 3
    assert all(json.loads(v["reference"]) == [{"reply": True}] for v in variants)


def test_copies_of_the_even_cases_spread_their_ages_on_either_side_of_the_line():
    # Kinds 9 and 10: refundable 0-30 and late 31-60, every training age of each stretch
    # drawn (training's day counts hold neither 30 nor 31), each refunded or refused.
    desk = SupportDesk()
    task = refund_task(desk, allowed=True)
    decision = next(t for t in oracle_turns(task=task, env=desk) if t["messages"][-1]["role"] == "tool")
    for kind, low, high, reference in ((9, 0, 30, "refund"), (10, 31, 60, "reply")):
        variants = counterfactual_turns(
            task=task, messages=decision["messages"], count=300, rng=random.Random(kind), cases=(kind,)
        )
        ages = {json.loads(v["messages"][-1]["content"])["delivered_days_ago"] for v in variants}
        assert ages == {d for d in DAY_VALUES["train"] if low <= d <= high}
        refunds = ["issue_refund" in v["reference"] for v in variants]
        assert all(refunds) if reference == "refund" else not any(refunds)
