"""Support-desk recipes side by side, on SmolLM2-135M on the CPU: chosen on the VALIDATION
split, then measured once on the TEST split.

    X="nice -n 10 .venv/bin/python scripts/desk_experiment.py"
    $X base --seed 0                                  # validation (32 episodes)
    $X run --recipe cf3-near3 --seed 0                # train; checkpoint and figures on validation
    $X curve --recipe cf3-near3 --seed 0              # its decision curve on validation contexts
    $X measure --recipe cf3-near3 --seed 0 --split test --episodes 48 --fresh-seed 2   # the one look
    $X base --seed 0 --split test --episodes 48 --fresh-seed 2
    .venv/bin/python scripts/desk_experiment.py summary

A measurement of the test split (or a fresh slice) is a look: refused for a recipe family
and seed already measured there unless `--second-look REASON`, and logged in
docs/experiments/test-split-looks.jsonl.

Every run appends one JSON line to var/desk-experiment/runs.jsonl (the recipe, its
settings, the training history and each measurement), so partial results survive a stop.

What is trained: SFT on oracle labels — the turns of training-split tasks played by the
hidden policy itself (`oracle_turns`: the context at each point of the conversation and
the corrected response `turn_target` renders over the order the customer named and what
its lookup showed). No test or validation order, id, customer or wording is in a
training set.

What is measured: episodes of the support desk played by the model with the agent's
harness (the same tool-call regex the demo agent asks vLLM to enforce, here enforced
token by token in torch; temperature 0.7; each episode seeded), on tasks of the TEST split
(or of a freshly generated slice, `--fresh-seed`): the success rate, the share of episodes
that changed another customer's order (collateral changes, from the episode's audit),
the share that called a tool on an id the conversation never showed, and the share whose
first tool call named another order than the customer's.

Recipes (`RECIPES`): `memorise` is the failure mode: a few orders, many steps.
`templates` trains on every training order once per pass; `-es` adds early stopping on
the validation split's turns; `-r4` a lower LoRA rank and fewer steps; `-mix` mixes in
the base model's own answers on other turns (the training split's tracking questions);
`decisions-es` weights the turns where the policy decides (after the lookup);
`decisions-weighted-32` also weights each target's first token (the action) 32 times, and
`-cf3` adds 3 counterfactual copies of each decision point (`counterfactual_turns`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("OMP_NUM_THREADS", "1")

OUT = ROOT / "var" / "desk-experiment"
MODEL = ROOT / "var" / "models" / "smollm2-135m-instruct"
TEMPERATURE = 0.7
MAX_TURN_TOKENS = 96
TOP_K = 64  # tokens checked against the harness's regex before the whole vocabulary is

BASE_RECIPE: dict[str, Any] = {
    "orders": 0,  # training orders used (0 = every order of the train split)
    "steps": 40,
    "prompts_per_step": 4,
    "learning_rate": 5e-4,
    "lora_rank": 16,
    "lora_alpha": 32,
    "trainable_layers": 6,
    "early_stop": False,
    "eval_every": 20,
    "patience": 2,
    "validation_turns": 12,
    "mix_base": 0.0,  # share of extra items: the base model's own answers on other turns
    # "decisions": every turn that follows a lookup (refund or refuse: where the policy is),
    # one in two first turns (the lookup) and one in four confirmations after a refund.
    "focus": "",
    # Checkpoint choice on whole validation-split episodes under the harness (the measure the
    # test reports, on other orders): at these steps, the best success rate is kept.
    "validate_at": [],
    "validate_episodes": 16,
    "first_token_weight": 1.0,  # see training.trainer.loss.sft_loss
    # Counterfactual copies of each decision point: the lookup shows another status and
    # age, the target is what the policy does then (support_desk.counterfactual_turns).
    "variants": 0,
    # More copies, each near the line (22-40 days since delivery: NEAR_LINE_CASES).
    "near_line_variants": 0,
    # Which of `_case`'s eight cases the `variants` copies are drawn from (all by default:
    # four refundable, so a delivered order is refundable in 4 copies of 6). "balanced":
    # BALANCED_CASES, as many refusals of a delivered order as refunds; "past": PAST_CASES.
    "variant_cases": "all",
    # With focus "decisions": keep one in N first turns (the lookup) and one in N
    # confirmations after a refund; every decision turn (after the lookup) is kept.
    "keep_first": 2,
    "keep_confirm": 4,
    # Each decision turn (and its copies) this many times in the set: its weight in a step's
    # sampling, against the lookups and confirmations.
    "decision_repeats": 1,
    # "oracle": the hidden policy's turns and copies; "note": the decision points of the
    # training orders and `variants` copies of each, labelled by a policy note a reader wrote
    # from the comment bank (`note_items`: words only, no oracle label), the note of the
    # run's seed in `note_arm` of NOTES.
    "labels": "oracle",
    "note_arm": "",
    "note_prompt": "",
}
RECIPES: dict[str, dict[str, Any]] = {
    "memorise": {"orders": 8, "steps": 200},
    "templates": {},
    "templates-es": {"early_stop": True},
    "templates-es-r4": {"early_stop": True, "lora_rank": 4, "lora_alpha": 8, "steps": 40},
    "templates-es-mix": {"early_stop": True, "mix_base": 0.25},
    "decisions-es": {"early_stop": True, "focus": "decisions"},
    "decisions-es-lr1e-3": {"early_stop": True, "focus": "decisions", "learning_rate": 1e-3},
    "decisions-long": {"focus": "decisions", "steps": 200, "validate_at": [100, 150, 200]},
    "decisions-long-lr1e-3": {
        "focus": "decisions",
        "steps": 200,
        "learning_rate": 1e-3,
        "validate_at": [100, 150, 200],
    },
    # The decision token weighted (16 of a ~30-token target: about a third of a turn's loss).
    "decisions-weighted": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 16.0,
        "validate_at": [50, 100, 150],
    },
    # Half of a turn's loss on its decision token.
    "decisions-weighted-32": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 32.0,
        "validate_at": [75, 150],
    },
    # The same, with 3 counterfactual copies of every decision point.
    "decisions-weighted-32-cf3": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 32.0,
        "validate_at": [75, 150],
        "variants": 3,
    },
    # 2026-12-06 (the dealt split): the checkpoint chosen on 16 validation episodes at 50, 100
    # or 150 steps; then, one at a time: 3 more copies near the line, decision turns twice
    # in the set, fewer lookup targets.
    "cf3-ckpt": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 32.0,
        "validate_at": [50, 100, 150],
        "variants": 3,
    },
    "cf3-near3": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 32.0,
        "validate_at": [50, 100, 150],
        "variants": 3,
        "near_line_variants": 3,
    },
    "cf3-near3-dec2": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 32.0,
        "validate_at": [50, 100, 150],
        "variants": 3,
        "near_line_variants": 3,
        "decision_repeats": 2,
    },
    "cf3-near3-lookup4": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 32.0,
        "validate_at": [50, 100, 150],
        "variants": 3,
        "near_line_variants": 3,
        "keep_first": 4,
    },
    # 2026-12-06, second family (aimed at the refusals past the line): the copies drawn so
    # that a delivered order is refused as often as refunded (BALANCED_CASES); then 3 more
    # copies near the line, as in cf3-near3.
    "bal6": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 32.0,
        "validate_at": [50, 100, 150],
        "variants": 6,
        "variant_cases": "balanced",
    },
}
RECIPES["bal6-near3"] = {**RECIPES["bal6"], "near_line_variants": 3}
# 2026-12-06, third family (aimed at the 40s and 50s): bal6's copies drawn over
# PAST_CASES, where a delivered copy is refundable or late as often, and the late ones are
# 31-40, 41-60 and past 60 days old equally often; then the same with 10 copies.
RECIPES["past6"] = {**RECIPES["bal6"], "variant_cases": "past"}
RECIPES["past10"] = {**RECIPES["past6"], "variants": 10}
# Issue 39's words-only arm (A2) and its control (A3), bal6's settings with labels from a
# policy note: the note the reader wrote from the comments on their own cases, or from the
# comments each moved to another case (`scripts/note_probe.py`).
# `-v2`: the notes written under the policy-note prompt v2 (the rule carries every fact its
# text names, and an otherwise).
for _arm, _note, _prompt in (
    ("words-note", "paired", "policy-note/v1"),
    ("words-note-shuffled", "shuffled", "policy-note/v1"),
    ("words-note-v2", "paired", "policy-note/v2"),
    ("words-note-v2-shuffled", "shuffled", "policy-note/v2"),
):
    RECIPES[_arm] = {
        **{k: v for k, v in RECIPES["bal6"].items() if k != "variant_cases"},
        "labels": "note",
        "note_arm": _note,
        "note_prompt": _prompt,
    }
NOTES = ROOT / "docs" / "experiments" / "2026-12-06-notes-from-words.jsonl"
# `_case`'s cases: one refundable recent, one refundable near the line, one late near the
# line, one long past, one shipping, one processing or refunded.
BALANCED_CASES = (0, 3, 4, 5, 6, 7)
# Three refundable (one recent, two 22-30 days old), three late (31-40, 41-60 through
# `_case`'s kind 8, and 41-180, mostly past 60), one shipping, one processing or refunded.
PAST_CASES = (0, 3, 3, 4, 8, 5, 6, 7)
VARIANT_CASES = {"all": tuple(range(8)), "balanced": BALANCED_CASES, "past": PAST_CASES}


def cpu_attention() -> None:
    """SDPA's own grouped-query attention on the CPU (`policy.cpu_grouped_attention`, which
    jobs install when they load a policy), for the models this harness loads itself."""
    from training.trainer.policy import cpu_grouped_attention

    cpu_grouped_attention()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- the harness: constrained turns in torch ---------------------------------------------


class Harness:
    """The demo agent's harness on a local model: the first turn must be a tool call on an
    order, later turns a tool call or a sentence (`ACT_REGEX`, `ACT_OR_REPLY_REGEX`),
    enforced token by token: among the `TOP_K` likeliest tokens, those that keep the text
    a prefix of the regex's language are kept (the whole vocabulary is searched when none
    is), and one is sampled at `temperature` with the episode's own generator; the end
    token only once the text matches. Episodes run in threads and their turns are decoded
    in one batch (the system prompt and tools, which all share, computed once)."""

    def __init__(self, model, tokenizer, *, temperature: float = TEMPERATURE):
        import regex

        from feedback.demo.agent import ACT_OR_REPLY_REGEX, ACT_REGEX

        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.first = regex.compile(ACT_REGEX)
        self.later = regex.compile(ACT_OR_REPLY_REGEX)
        self.vocab = [tokenizer.decode([i]) for i in range(len(tokenizer))]
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.lock = threading.Lock()

    def decode(self, rows: list[tuple[list[int], Any, Any, int]]) -> list[tuple[str, int, bool]]:
        """Each row (context ids, pattern, generator, token limit) → (text, tokens, ended)."""
        import torch

        from training.trainer.sampling import prefill

        batch = len(rows)
        with torch.no_grad():
            logits, cache, mask, after = prefill(self.model, [r[0] for r in rows], pad_id=self.pad)
            texts, produced, ended = [""] * batch, [0] * batch, [False] * batch
            done = [False] * batch
            for _ in range(max(r[3] for r in rows)):
                logits = logits.float()
                tokens = []
                for b, (_ids, pattern, generator, limit) in enumerate(rows):
                    if done[b]:
                        tokens.append(self.pad)
                        continue
                    token = self._pick(logits[b], texts[b], pattern, generator)
                    produced[b] += 1
                    if token == self.eos:
                        ended[b] = done[b] = True
                    else:
                        texts[b] += self.vocab[token]
                        done[b] = produced[b] >= limit
                    tokens.append(token)
                if all(done):
                    break
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
                logits = self.model(
                    input_ids=torch.tensor(tokens)[:, None],
                    attention_mask=mask,
                    position_ids=after,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                ).logits[:, -1]
                after = after + 1
        return list(zip(texts, produced, ended, strict=True))

    def _pick(self, logits, text: str, pattern, generator) -> int:
        import torch

        complete = pattern.fullmatch(text) is not None
        order = torch.topk(logits, TOP_K).indices.tolist()
        allowed = [t for t in order if self._ok(t, text, pattern, complete)]
        if not allowed:
            order = torch.argsort(logits, descending=True).tolist()
            allowed = [t for t in order if self._ok(t, text, pattern, complete)][:TOP_K]
        if not allowed:
            return self.eos
        if self.temperature <= 0:
            return allowed[0]
        probs = torch.softmax(logits[allowed] / self.temperature, dim=0)
        return allowed[int(torch.multinomial(probs, 1, generator=generator))]

    def _ok(self, token: int, text: str, pattern, complete: bool) -> bool:
        if token == self.eos:
            return complete
        piece = self.vocab[token]
        return bool(piece) and pattern.fullmatch(text + piece, partial=True) is not None

    def episodes(self, tasks, *, seed: int, batch: int = 16) -> list:
        """Play each task once, `batch` at a time (episode i seeded with seed·100003 + i)."""
        import torch

        from training.environments import Completion, episode_run
        from training.environments.support_desk import SupportDesk
        from training.inference.codec import tool_calls_parse
        from training.trainer.sampling import encode_prompt

        env = SupportDesk()
        results: list = [None] * len(tasks)
        for start in range(0, len(tasks), batch):
            chunk = list(enumerate(tasks))[start : start + batch]
            batcher = _Batcher(self, active=len(chunk))
            errors: list[BaseException] = []

            def run(index: int, task, batcher=batcher, errors=errors) -> None:
                generator = torch.Generator().manual_seed(seed * 100_003 + index)
                turns = [0]

                def complete(messages, tools, max_tokens_left):
                    pattern = self.later if len(messages) > 2 else self.first
                    with self.lock:
                        ids = encode_prompt(self.tokenizer, messages, tools)
                    limit = max(1, min(MAX_TURN_TOKENS, max_tokens_left))
                    text, produced, ended = batcher.submit(index, (ids, pattern, generator, limit))
                    content, calls = tool_calls_parse(text)
                    for k, call in enumerate(calls):
                        call["id"] = f"call_{turns[0]}_{k}"
                    turns[0] += 1
                    message: dict[str, Any] = {"content": content}
                    if calls:
                        message["tool_calls"] = calls
                    reason = ("tool_calls" if calls else "stop") if ended else "length"
                    return Completion(message=message, tokens=produced, finish_reason=reason)

                try:
                    results[index] = episode_run(env, task, complete)
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    batcher.finished()

            threads = [threading.Thread(target=run, args=(i, t), daemon=True) for i, t in chunk]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
        return results


class _Batcher:
    """Waits until every running episode asks for its next turn, then decodes them in one
    batch, rows ordered by episode."""

    def __init__(self, harness: Harness, active: int):
        self.harness = harness
        self.active = active
        self.cv = threading.Condition()
        self.pending: dict[int, tuple] = {}
        self.results: dict[int, tuple] = {}
        self.error: BaseException | None = None

    def submit(self, key: int, row: tuple) -> tuple:
        with self.cv:
            self.pending[key] = row
            self._run_if_ready()
            while key not in self.results and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise RuntimeError("decoding failed") from self.error
            return self.results.pop(key)

    def finished(self) -> None:
        with self.cv:
            self.active -= 1
            self._run_if_ready()

    def _run_if_ready(self) -> None:
        if not self.pending or len(self.pending) < self.active or self.error is not None:
            return
        batch, self.pending = dict(sorted(self.pending.items())), {}
        try:
            self.results.update(zip(batch, self.harness.decode(list(batch.values())), strict=True))
        except BaseException as exc:
            self.error = exc
        self.cv.notify_all()


def first_call_other(episode) -> bool:
    """The episode's first tool call names another order than the customer's."""
    order = str(episode.task.hidden["order_id"]).upper()
    for message in episode.messages:
        for call in message.get("tool_calls") or []:
            try:
                arguments = json.loads((call.get("function") or {}).get("arguments") or "{}")
            except ValueError:
                return True
            return str(arguments.get("order_id", "")).strip().upper() != order
    return False


def measure(harness: Harness, tasks, *, seed: int, label: str) -> dict[str, Any]:
    """Play each task once (episode i seeded with seed·100003 + i): rates and their counts."""
    harness.model.eval()
    rows = []
    started = time.time()
    for start in range(0, len(tasks), 16):
        episodes = harness.episodes(tasks[start : start + 16], seed=seed * 1_000 + start)
        for episode in episodes:
            rows.append(
                {
                    "task": episode.task.id,
                    "refund": episode.task.hidden["refund"],
                    "success": episode.reward >= 1.0,
                    "kind": episode.task.hidden.get("kind", ""),
                    "collateral": bool(episode.audit.collateral_changes),
                    "violations": bool(episode.audit.policy_violations),
                    "unknown_ids": bool(episode.audit.unknown_ids),
                    "first_call_other": first_call_other(episode),
                    "end": episode.end,
                    "transcript": [m.get("content") or json.dumps(m.get("tool_calls")) for m in episode.messages[2:]][
                        :8
                    ],
                }
            )
        done = sum(r["success"] for r in rows)
        log(f"  {label}: {len(rows)}/{len(tasks)} episodes, {done} succeeded ({time.time() - started:.0f} s)")
    n = len(rows)
    summary = {
        "n": n,
        "successes": sum(r["success"] for r in rows),
        "collateral": sum(r["collateral"] for r in rows),
        "violations": sum(r["violations"] for r in rows),
        "unknown_ids": sum(r["unknown_ids"] for r in rows),
        "first_call_other": sum(r["first_call_other"] for r in rows),
        "refundable_refunded": sum(r["success"] for r in rows if r["refund"]),
        "refundable": sum(1 for r in rows if r["refund"]),
        "others_left_alone": sum(r["success"] for r in rows if not r["refund"]),
        "others": sum(1 for r in rows if not r["refund"]),
        "seconds": round(time.time() - started, 1),
    }
    summary["success_rate"] = summary["successes"] / n
    summary["collateral_rate"] = summary["collateral"] / n
    summary["violation_rate"] = summary["violations"] / n
    summary["unknown_id_rate"] = summary["unknown_ids"] / n
    summary["episodes"] = rows
    return summary


def eval_tasks(*, split: str, episodes: int, seed: int, fresh_seed: int | None = None):
    """`episodes` graded tasks of `split`, the same for a base and a candidate of one seed."""
    from training.environments.support_desk import tasks_sample

    return tasks_sample(split=split, count=episodes, seed=10_000 + seed, graded_share=1.0, fresh_seed=fresh_seed)


# --- training ----------------------------------------------------------------------------


def oracle_items(
    tasks,
    *,
    prefix: str,
    variants: int = 0,
    near_line: int = 0,
    rng: random.Random | None = None,
    cases: tuple[int, ...] = tuple(range(8)),
):
    """One SFT item per oracle turn of each task (see `oracle_turns`), and `variants`
    counterfactual copies of each decision point (`counterfactual_turns`, drawn over
    `cases`), and `near_line` more drawn near the refund window's line."""
    from training.environments.support_desk import NEAR_LINE_CASES, SupportDesk, counterfactual_turns, oracle_turns
    from training.trainer.items import TurnItem

    env = SupportDesk()
    rng = rng or random.Random(0)
    items = []
    for task in tasks:
        for k, turn in enumerate(oracle_turns(task=task, env=env)):
            extra = counterfactual_turns(task=task, messages=turn["messages"], count=variants, rng=rng, cases=cases)
            if near_line:
                extra += counterfactual_turns(
                    task=task, messages=turn["messages"], count=near_line, rng=rng, cases=NEAR_LINE_CASES
                )
            for j, t in enumerate([turn, *extra]):
                items.append(
                    TurnItem(
                        id=f"{prefix}:{task.id}:{k}" + (f":v{j}" if j else ""),
                        messages=t["messages"],
                        tools=task.tools,
                        target=t["target"],
                        reference=t["reference"],
                        grader="tool_action",
                    )
                )
    return items


def note_of(arm: str, seed: int, *, prompt: str, path: Path = NOTES):
    """The rule and text of the note `scripts/note_probe.py` logged for `arm` and `seed`
    under the policy-note prompt `prompt` (the first runs logged no prompt: v1)."""
    from training.environments.policy_rules import rule_parse

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    found = [
        r
        for r in rows
        if r["arm"] == arm and r["seed"] == seed and r.get("rule") and r.get("prompt", "policy-note/v1") == prompt
    ]
    if not found:
        raise SystemExit(f"no {arm} note with a rule for seed {seed} under {prompt} in {path}")
    return rule_parse(found[-1]["rule"]), found[-1]["text"]


def note_turn(order_id: str, refund: bool, text: str) -> tuple[str, str]:
    """(target, accepted actions) of a decision turn the note labels: the refund call on
    the order the lookup showed, or a refusal that quotes the note."""
    if refund:
        call = {"name": "issue_refund", "arguments": {"order_id": order_id}}
        return f"<tool_call>{json.dumps(call)}</tool_call>", json.dumps(
            [{"tool": "issue_refund", "arguments": {"order_id": order_id}}]
        )
    return f"I am sorry, order {order_id} cannot be refunded. {text}", json.dumps([{"reply": True}])


def _note_label(rule, messages) -> bool | None:
    from training.environments.base import DecisionContext
    from training.environments.support_desk import policy_note_label

    return policy_note_label(rule, DecisionContext(status="", x=None, messages=messages, tools=[], acts=False))


def note_items(tasks, *, rule, text: str, variants: int, rng: random.Random):
    """Words only (issue 39's A2): each training order's decision point (its request and
    the lookup of the order, as an episode logs them) and `variants` copies whose lookup
    shows another status and age, every turn labelled by the note's `rule` alone. The copies
    are drawn from the training split's statuses and day counts, as many that the note
    refunds as that it refuses (the note's own line, not the policy's); a case the rule does
    not cover is left out. No target, reference or case choice reads the hidden policy."""
    from training.environments.support_desk import SupportDesk
    from training.environments.support_desk.store import DAY_VALUES
    from training.environments.support_desk.transcripts import lookup_messages
    from training.trainer.items import TurnItem

    desk = SupportDesk()
    days = list(DAY_VALUES["train"])
    items = []
    for task in tasks:
        row = desk.table.row(task.hidden["order_id"])  # the situation: the store's order, not its answer
        first = task.first_messages()
        shown = [row]
        wanted = {True: variants // 2, False: variants - variants // 2}
        for _ in range(50 * max(1, variants)):
            if not any(wanted.values()):
                break
            status = rng.choice(["delivered", "shipped", "processing", "refunded"])
            age = rng.choice(days) if status in ("delivered", "refunded") else None
            changed = {
                **row,
                "status": status,
                "delivered_days_ago": age,
                "refunded_amount": row["price"] if status == "refunded" else 0.0,
            }
            label = _note_label(rule, [*first, *lookup_messages(row["order_id"], changed)])
            if label is not None and wanted[label] > 0:
                wanted[label] -= 1
                shown.append(changed)
        for j, looked in enumerate(shown):
            messages = [*first, *lookup_messages(row["order_id"], looked)]
            label = _note_label(rule, messages)
            if label is None:
                continue
            target, reference = note_turn(row["order_id"], label, text)
            items.append(
                TurnItem(
                    id=f"train:{task.id}:note" + (f":v{j}" if j else ""),
                    messages=messages,
                    tools=task.tools,
                    target=target,
                    reference=reference,
                    grader="tool_action",
                )
            )
    return items


def words_only_check(items, *, rule, text: str) -> None:
    """Refuse a words-only set any of whose targets is not the note's own label of its
    context (so none came from the hidden policy)."""
    for item in items:
        row = json.loads(item.messages[-1]["content"])
        label = _note_label(rule, item.messages)
        if label is None or (item.target, item.reference) != note_turn(row["order_id"], label, text):
            raise SystemExit(f"{item.id}: a target the note does not give; not a words-only set")


def base_answers(harness: Harness, tasks, *, seed: int, prefix: str):
    """The base model's own first turns on `tasks` (other turns: tracking questions), as
    SFT items that keep that behaviour."""
    import torch

    from training.trainer.items import TurnItem
    from training.trainer.sampling import encode_prompt

    harness.model.eval()
    rows = []
    for i, task in enumerate(tasks):
        generator = torch.Generator().manual_seed(seed * 7_919 + i)
        ids = encode_prompt(harness.tokenizer, task.first_messages(), task.tools)
        rows.append((ids, harness.first, generator, MAX_TURN_TOKENS))
    items = []
    for start in range(0, len(rows), 16):
        decoded = harness.decode(rows[start : start + 16])
        for task, (text, _, ended) in zip(tasks[start : start + 16], decoded, strict=True):
            if ended:
                items.append(
                    TurnItem(id=f"{prefix}:{task.id}", messages=task.first_messages(), tools=task.tools, target=text)
                )
    return items


def train(recipe: dict[str, Any], *, seed: int, run_dir: Path, model: Path = MODEL):
    """SFT (LoRA on the top blocks) with `sft_train`; with `early_stop`, the validation
    split's turns are graded every `eval_every` steps and the best adapter is kept."""
    import torch

    from training.environments.support_desk import SupportDesk
    from training.trainer.common import Hooks
    from training.trainer.config import SFTConfig
    from training.trainer.distill import sft_train
    from training.trainer.items import TurnItem, grader_scorer
    from training.trainer.policy import load_policy

    desk = SupportDesk()
    train_tasks = desk.tasks_for(split="train", graded=True)
    if recipe["orders"]:
        refundable = [t for t in train_tasks if t.hidden["refund"]][: recipe["orders"] // 2]
        refused = [t for t in train_tasks if not t.hidden["refund"]][: recipe["orders"] - len(refundable)]
        train_tasks = refundable + refused
    if recipe["labels"] == "note":
        rule, text = note_of(recipe["note_arm"], seed, prompt=recipe["note_prompt"])
        log(f"labels from the {recipe['note_arm']} note of seed {seed}: {rule.text()}")
        items = note_items(
            train_tasks, rule=rule, text=text, variants=recipe["variants"], rng=random.Random(f"variants-{seed}")
        )
        words_only_check(items, rule=rule, text=text)
    else:
        items = oracle_items(
            train_tasks,
            prefix="train",
            variants=recipe["variants"],
            near_line=recipe["near_line_variants"],
            rng=random.Random(f"variants-{seed}"),
            cases=VARIANT_CASES[recipe["variant_cases"]],
        )
    if recipe["focus"] == "decisions":
        # context length → keep one in N (first turn, decision, confirmation)
        keep_every = {2: recipe["keep_first"], 4: 1, 6: recipe["keep_confirm"]}
        seen: dict[int, int] = {}
        kept = []
        for item in items:
            length = len(item.messages)
            seen[length] = seen.get(length, 0) + 1
            if (seen[length] - 1) % keep_every.get(length, 1) == 0:
                kept.append(item)
        items = kept
    if recipe["decision_repeats"] > 1:
        items += [
            TurnItem(**{**item.__dict__, "id": f"{item.id}:r{r}"})
            for r in range(1, recipe["decision_repeats"])
            for item in items
            if len(item.messages) == 4
        ]
    rng = random.Random(seed)
    validation = oracle_items(desk.tasks_for(split="validation", graded=True), prefix="validation")
    validation = rng.sample(validation, min(recipe["validation_turns"], len(validation)))
    config = SFTConfig(
        model_path=str(model),
        adapter="lora",
        lora_rank=recipe["lora_rank"],
        lora_alpha=recipe["lora_alpha"],
        trainable_layers=recipe["trainable_layers"],
        learning_rate=recipe["learning_rate"],
        first_token_weight=recipe["first_token_weight"],
        steps=recipe["steps"],
        prompts_per_step=recipe["prompts_per_step"],
        seed=seed,
        eval_every=recipe["eval_every"] if recipe["early_stop"] else 0,
        eval_samples=1,
        max_new_tokens=40,
        temperature=TEMPERATURE,
        checkpoint_every=0,
        samples_every=0,
        torch_threads=torch.get_num_threads(),
    )
    torch.manual_seed(seed)
    policy = load_policy(config)
    mixed = 0
    if recipe["mix_base"]:
        harness = Harness(policy.model, policy.tokenizer)
        with policy.model.disable_adapter():
            others = desk.tasks_for(split="train", graded=False)
            wanted = int(len(items) * recipe["mix_base"])
            extra = base_answers(harness, rng.sample(others, min(wanted, len(others))), seed=seed, prefix="base")
        items += extra
        mixed = len(extra)
        policy.model.train()
    best = {"step": 0, "reward": -1.0, "state": None}
    evals: list[dict] = []
    stale = [0]

    def on_eval(step: int, metrics: dict) -> None:
        evals.append({"step": step, **{k: v for k, v in metrics.items() if isinstance(v, int | float)}})
        log(f"  validation turns at step {step}: reward {metrics.get('reward', 0):.3f}")
        if metrics.get("reward", 0) > best["reward"]:
            best.update(step=step, reward=metrics["reward"])
            best["state"] = {k: v.detach().clone() for k, v in policy.model.named_parameters() if v.requires_grad}
            stale[0] = 0
        else:
            stale[0] += 1

    harness_val = Harness(policy.model, policy.tokenizer) if recipe["validate_at"] else None
    validation_tasks = (
        eval_tasks(split="validation", episodes=recipe["validate_episodes"], seed=seed) if harness_val else []
    )

    def on_step(step: int, metrics: dict) -> None:
        if step % 10 == 0:
            log(f"  step {step}: loss {metrics['loss']:.3f} ({metrics['step_seconds']:.1f} s)")
        if harness_val is not None and step in recipe["validate_at"]:
            result = measure(harness_val, validation_tasks, seed=seed, label=f"validation at step {step}")
            policy.model.train()
            on_eval(step, {"reward": result["success_rate"], "validation_episodes": result["n"]})

    hooks = Hooks(
        on_eval=on_eval,
        on_step=on_step,
        should_stop=lambda: recipe["early_stop"] and stale[0] >= recipe["patience"],
    )
    started = time.time()
    result = sft_train(
        config=config,
        items=items,
        run_dir=run_dir,
        eval_items=validation if recipe["early_stop"] else None,
        eval_score=grader_scorer("tool_action") if recipe["early_stop"] else None,
        hooks=hooks,
        policy=policy,
        export=False,
    )
    kept = result.step
    if (recipe["early_stop"] or recipe["validate_at"]) and best["state"] is not None:
        params = dict(policy.model.named_parameters())
        with torch.no_grad():
            for name, value in best["state"].items():
                params[name].copy_(value)
        kept = best["step"]
    info = {
        "train_orders": len(train_tasks),
        "train_items": len(items),
        "base_items_mixed": mixed,
        "steps_run": result.step,
        "step_kept": kept,
        "status": result.status,
        "validation": evals,
        "final_loss": result.history[-1]["loss"] if result.history else None,
        "train_seconds": round(time.time() - started, 1),
    }
    return policy, info


# --- the runs ------------------------------------------------------------------------------


def append(record: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "runs.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")


def load_base(path: Path = MODEL):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, tokenizer


def slim(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k != "episodes"}


def slices(args, family: str) -> list[tuple[str, int | None]]:
    """(split, fresh seed) of each measurement the command asks for. A measurement of the
    test split or a fresh slice is a look at held-out figures: refused when `family` was
    already measured there for this seed (without `--second-look REASON`), else logged in
    docs/experiments/test-split-looks.jsonl."""
    from training.promotion.evaluation.split_looks import SecondLook, split_look_check, split_look_record

    wanted = [] if args.only_fresh else [(args.split, None)]
    wanted += [("fresh", f) for f in args.fresh_seed]
    if args.episodes > 0 and any(split != "validation" for split, _ in wanted):
        try:
            split_look_check(family=family, seeds=[args.seed], reason=args.second_look)
        except SecondLook as exc:
            raise SystemExit(str(exc)) from None
        split_look_record(
            family=family,
            script="scripts/desk_experiment.py",
            argv=sys.argv[1:],
            seeds=[args.seed],
            reason=args.second_look,
        )
    return wanted


def command_base(args) -> None:
    model, tokenizer = load_base()
    harness = Harness(model, tokenizer)
    for split, fresh in slices(args, "base"):
        tasks = eval_tasks(split=split, episodes=args.episodes, seed=args.seed, fresh_seed=fresh)
        label = f"base {split}{'' if fresh is None else f' {fresh}'} seed {args.seed}"
        result = measure(harness, tasks, seed=args.seed, label=label)
        log(f"{label}: {json.dumps(slim(result))}")
        append(
            {
                "kind": "base",
                "seed": args.seed,
                "split": split,
                "fresh_seed": fresh,
                "measure": result,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )


def command_run(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    recipe = {**BASE_RECIPE, **RECIPES[args.recipe]}
    for key in ("steps", "lora_rank", "orders", "first_token_weight", "learning_rate", "variants"):
        if getattr(args, key) is not None:
            recipe[key] = getattr(args, key)
    wanted = slices(args, args.recipe)  # a refused look stops here, before the training
    run_dir = OUT / "runs" / f"{args.recipe}-seed{args.seed}-{int(time.time())}"
    log(f"recipe {args.recipe} seed {args.seed}: {recipe}")
    policy, info = train(recipe, seed=args.seed, run_dir=run_dir)
    log(f"trained: {json.dumps({k: v for k, v in info.items() if k != 'validation'})}")
    policy.model.save_pretrained(run_dir / "adapter")  # the kept adapter, to measure it again
    info["adapter"] = str(run_dir / "adapter")
    measures = measure_all(args, Harness(policy.model, policy.tokenizer), args.recipe, wanted)
    append(
        {
            "kind": "candidate",
            "recipe": args.recipe,
            "settings": recipe,
            "seed": args.seed,
            "train": info,
            "measures": measures,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )


def measure_all(args, harness: Harness, family: str, wanted: list[tuple[str, int | None]]) -> dict[str, Any]:
    """The command's measurements of one model on the `wanted` slices (see `slices`), by
    slice ("validation", "test", "fresh-F")."""
    measures = {}
    for split, fresh in wanted:
        if args.episodes <= 0:
            continue
        tasks = eval_tasks(split=split, episodes=args.episodes, seed=args.seed, fresh_seed=fresh)
        label = f"{family} {split}{'' if fresh is None else f' {fresh}'} seed {args.seed}"
        try:
            result = measure(harness, tasks, seed=args.seed, label=label)
        except Exception as exc:  # keep the other measurements and the training record
            log(f"{label} failed: {exc!r}")
            continue
        log(f"{label}: {json.dumps(slim(result))}")
        measures[split if fresh is None else f"fresh-{fresh}"] = result
    return measures


def command_measure(args) -> None:
    """A trained run's kept adapter measured again (after the recipe was chosen on the
    validation split: its one look at the test split), recorded as that run's candidate."""
    from peft import PeftModel

    runs = [json.loads(line) for line in (OUT / "runs.jsonl").read_text().splitlines() if line.strip()]
    run = next(
        (
            r
            for r in reversed(runs)
            if r["kind"] == "candidate" and r["recipe"] == args.recipe and r["seed"] == args.seed
        ),
        None,
    )
    if run is None:
        raise SystemExit(f"no run of {args.recipe} with seed {args.seed} in {OUT / 'runs.jsonl'}")
    wanted = slices(args, args.recipe)
    model, tokenizer = load_base()
    model = PeftModel.from_pretrained(model, run["train"]["adapter"]).eval()
    measures = measure_all(args, Harness(model, tokenizer), args.recipe, wanted)
    append({**run, "measures": measures, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


# --- the decision, read off the model ---------------------------------------------------------


def command_decisions(args) -> None:
    """P(the turn after a lookup starts a tool call) — i.e. refunds — per kind of order,
    on the first `--turns` decision contexts of the train and test splits: a model that
    learned the policy puts it near 1 for delivered orders at most 30 days old and near 0
    for the rest, on both splits; one that learned "refund after a lookup" puts it high
    everywhere."""
    import torch

    from training.environments.support_desk import REFUND_WINDOW_DAYS, SupportDesk
    from training.trainer.sampling import encode_prompt

    model, tokenizer = load_base()
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    model.eval()
    start = tokenizer.convert_tokens_to_ids("<")  # "<tool_call>" is tokenised "<", "tool", …
    desk = SupportDesk()
    tasks = {t.id: t for t in desk.tasks()}

    def p_refund(messages, tools) -> float:
        ids = torch.tensor([encode_prompt(tokenizer, messages, tools)])
        with torch.no_grad():
            return float(torch.softmax(model(input_ids=ids, logits_to_keep=1).logits[0, -1].float(), -1)[start])

    for split in ("train", "test"):
        items = oracle_items(desk.tasks_for(split=split, graded=True), prefix=split)
        kinds: dict[str, list[float]] = {}
        for item in [i for i in items if len(i.messages) == 4][: args.turns]:
            p = p_refund(item.messages, item.tools)
            if args.hint:
                # The self-distillation teacher's view: the simulated lead's comment on the
                # wrong turn here (a refusal of a refundable order, a refund of another) as
                # the system hint; the figure printed is P(refund) with it minus without.
                p = p_refund(hinted(tasks[item.id.split(":")[1]], item.messages, at=args.hint_at), item.tools) - p
            row = json.loads(item.messages[-1]["content"])
            days = row["delivered_days_ago"]
            kind = (
                row["status"]
                if row["status"] != "delivered"
                else f"delivered, {'≤' if days <= REFUND_WINDOW_DAYS else '>'} 30 days"
            )
            kinds.setdefault(kind, []).append(p)
        print(f"{split}: " + "; ".join(f"{k} {sum(v) / len(v):.2f} (n={len(v)})" for k, v in sorted(kinds.items())))


def command_curve(args) -> None:
    """The decision curve on `--split`'s held-out decision contexts (`decision_contexts`):
    P(the turn after a lookup is a refund call) by days since delivery, and per other status,
    read off the model as the probability of the call's opening tokens
    (`<tool_call>{"name": "issue_refund`) under the harness's constraint and temperature
    (`p_refund`: unconstrained, the call's opening is all but impossible for every model,
    which the harness's regex then forces), for the base and a run's kept adapter. A model
    that learned the rule draws a step down after day 30 and nowhere before; the mean of
    each side of the line is printed."""
    import torch

    from training.environments.support_desk import SupportDesk
    from training.promotion.evaluation.decision_curve import rule_step
    from training.trainer.sampling import encode_prompt

    model, tokenizer = load_base()
    adapter = args.adapter
    if args.recipe:
        runs = [json.loads(line) for line in (OUT / "runs.jsonl").read_text().splitlines() if line.strip()]
        run = next(r for r in reversed(runs) if r.get("recipe") == args.recipe and r["seed"] == args.seed)
        adapter = run["train"]["adapter"]
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    desk = SupportDesk()
    curve = desk.decision_curve()
    # Without the closing quote, which the call's text merges with the comma after it.
    opening = tokenizer.encode('<tool_call>{"name": "issue_refund', add_special_tokens=False)
    contexts = desk.decision_contexts(
        tasks=desk.tasks_for(split=args.split, graded=True), per_point=args.per_point, every=args.every
    )

    harness = Harness(model, tokenizer)

    def p_refund(context) -> float:
        """The probability that the harness's sampling writes the opening along its own
        tokens: at each of them, the token's share among the `TOP_K` likeliest that keep the
        turn a prefix of `ACT_OR_REPLY_REGEX`, at the harness's temperature (as `_pick`
        draws). Other tokenizations of the same text are not counted: a lower bound."""
        prompt = encode_prompt(tokenizer, context.messages, context.tools)
        ids = torch.tensor([prompt + opening])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        p, text = 1.0, ""
        for row, token in zip(logits, opening, strict=True):
            order = torch.topk(row, TOP_K).indices.tolist()
            allowed = [t for t in order if harness._ok(t, text, harness.later, False)]
            if token not in allowed:
                return 0.0
            p *= float(torch.softmax(row[allowed] / harness.temperature, dim=0)[allowed.index(token)])
            text += harness.vocab[token]
        return p

    points: dict[Any, list[float]] = {}
    for context in contexts:
        key = context.x if context.status == curve.status else context.status
        points.setdefault(key, []).append(p_refund(context))
    series = [[x, sum(v) / len(v), len(v)] for x, v in points.items() if isinstance(x, int)]
    within, past = rule_step(series, curve.threshold)
    print(f"{adapter or 'base'} on {args.split} ({len(contexts)} contexts):")
    print("  " + " ".join(f"{x}:{p:.2f}" for x, p, _n in series))
    print("  " + "; ".join(f"{k} {sum(v) / len(v):.2f}" for k, v in points.items() if not isinstance(k, int)))
    print(f"  mean P(refund) at most {curve.threshold} days {within:.3f}, past it {past:.3f}")


def hinted(task, messages: list[dict[str, Any]], *, at: str = "system") -> list[dict[str, Any]]:
    """`messages` with the simulated lead's specific comment on the wrong next turn as the
    distillation teacher's hint (`DistillConfig.hint_template`): in the system message, as
    the distill job puts it, or (`at="last"`) as a user message right before the decision."""
    import random

    from training.environments.support_operator import operator_comment
    from training.trainer.config import DistillConfig
    from training.trainer.items import with_hint

    order_id = task.hidden["order_id"]
    wrong = (
        {"role": "assistant", "content": "I am sorry, this order cannot be refunded."}
        if task.hidden["refund"]
        else {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_wrong",
                    "type": "function",
                    "function": {"name": "issue_refund", "arguments": json.dumps({"order_id": order_id})},
                }
            ],
        }
    )
    comment = operator_comment(
        task=task, messages=[*messages, wrong], rng=random.Random(task.id), vague_rate=0, wrong_rate=0
    )
    hint = DistillConfig.hint_template.format(feedback=comment.body)
    if at == "last":
        return [*messages, {"role": "user", "content": hint}]
    return with_hint(messages, hint)


# --- the summary ---------------------------------------------------------------------------


def rates(measure: dict[str, Any], n: int) -> dict[str, Any]:
    """The figures of a measurement's first `n` episodes (a base and a candidate of one seed
    play the same tasks in the same order with the same seeds, so prefixes pair up)."""
    rows = measure["episodes"][:n]
    refundable = [r for r in rows if r["refund"]]
    others = [r for r in rows if not r["refund"]]
    return {
        "n": len(rows),
        "success": sum(r["success"] for r in rows) / len(rows),
        "collateral": sum(r["collateral"] for r in rows) / len(rows),
        "violations": sum(bool(r.get("violations")) for r in rows) / len(rows),
        "unknown_ids": sum(r["unknown_ids"] for r in rows) / len(rows),
        "first_call_other": sum(r["first_call_other"] for r in rows) / len(rows),
        "refunded": f"{sum(r['success'] for r in refundable)}/{len(refundable)}",
        "left_alone": f"{sum(r['success'] for r in others)}/{len(others)}",
    }


def command_summary(args) -> None:
    path = args.runs
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    summary_print(records)


def summary_print(records: list[dict[str, Any]]) -> None:
    """The per-seed and over-seeds tables of `records` (base and candidate runs)."""
    from training.promotion.evaluation.seeds import interval_text

    base = {}
    for r in records:
        if r["kind"] == "base":
            key = r["split"] if r["fresh_seed"] is None else f"fresh-{r['fresh_seed']}"
            base[(key, r["seed"])] = r["measure"]
    by_recipe: dict[str, list[dict]] = {}
    for r in records:
        if r["kind"] == "candidate":
            by_recipe.setdefault(r["recipe"], []).append(r)
    print("Per seed (oracle-graded episodes; base and candidate on the same tasks and sampling seeds):\n")
    print(
        "| recipe | slice | seed | episodes | steps kept | success base → candidate | collateral changes "
        "base → candidate | unknown-id calls base → candidate | first call names another order | "
        "refundable refunded | others left alone |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    from training.promotion.evaluation.bootstrap import PairedEpisode, task_bootstrap_gain

    pooled: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    # Candidate minus base success of each (seed, task) pair: one episode each, same seeds.
    paired: dict[tuple[str, str], list[float]] = {}
    episodes: dict[tuple[str, str], list[PairedEpisode]] = {}
    for recipe, runs in by_recipe.items():
        for r in runs:
            for key, measure in r["measures"].items():
                b = base.get((key, r["seed"]))
                if b is None:
                    continue
                n = min(len(measure["episodes"]), len(b["episodes"]))
                rb, rc = rates(b, n), rates(measure, n)
                pooled.setdefault((recipe, key), []).append((rb, rc))
                paired.setdefault((recipe, key), []).extend(
                    float(c["success"]) - float(b_["success"])
                    for b_, c in zip(b["episodes"][:n], measure["episodes"][:n], strict=True)
                )
                episodes.setdefault((recipe, key), []).extend(
                    PairedEpisode(
                        seed=r["seed"],
                        task=c["task"],
                        kind=c.get("kind", ""),
                        base=float(b_["success"]),
                        candidate=float(c["success"]),
                    )
                    for b_, c in zip(b["episodes"][:n], measure["episodes"][:n], strict=True)
                )
                print(
                    f"| {recipe} | {key} | {r['seed']} | {n} | {r['train']['step_kept']} | "
                    f"{rb['success']:.3f} → {rc['success']:.3f} | {rb['collateral']:.3f} → {rc['collateral']:.3f} | "
                    f"{rb['unknown_ids']:.3f} → {rc['unknown_ids']:.3f} | "
                    f"{rb['first_call_other']:.3f} → {rc['first_call_other']:.3f} | "
                    f"{rb['refunded']} → {rc['refunded']} | {rb['left_alone']} → {rc['left_alone']} |"
                )
    print(
        "\nOver seeds: mean [95 % t interval]; the gain also with its task-bootstrap interval (tasks "
        "stratified by kind, and seeds: the recipe's figure) and paired by episode (every (seed, task) "
        "counted as independent: too narrow):\n"
    )
    print(
        "| recipe | slice | seeds | base success | candidate success | gain | gain, task bootstrap | "
        "gain paired by episode | base collateral | candidate collateral | base policy violations | "
        "candidate policy violations | candidate unknown-id calls |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (recipe, key), pairs in pooled.items():
        gain = task_bootstrap_gain(episodes[recipe, key])
        print(
            f"| {recipe} | {key} | {len(pairs)} | {interval_text([b['success'] for b, _ in pairs])} | "
            f"{interval_text([c['success'] for _, c in pairs])} | "
            f"{interval_text([c['success'] - b['success'] for b, c in pairs])} | "
            f"{gain.text() if gain else '-'} | "
            f"{interval_text(paired[recipe, key])} (n = {len(paired[recipe, key])}) | "
            f"{interval_text([b['collateral'] for b, _ in pairs])} | "
            f"{interval_text([c['collateral'] for _, c in pairs])} | "
            f"{interval_text([b['violations'] for b, _ in pairs])} | "
            f"{interval_text([c['violations'] for _, c in pairs])} | "
            f"{interval_text([c['unknown_ids'] for _, c in pairs])} |"
        )
    for key in dict.fromkeys(key for _recipe, key in pooled):
        kinds_table(records, key)


def kinds_table(records: list[dict[str, Any]], slice_key: str = "test") -> None:
    """Successes and policy violations per kind of task on `slice_key`, summed over seeds,
    the base beside each recipe (records written before episodes named their kind are left
    out: their store was another)."""
    from training.environments.support_desk import KINDS

    columns: dict[str, dict[str, list[int]]] = {}
    for r in records:
        if r["kind"] == "base":
            key = r["split"] if r["fresh_seed"] is None else f"fresh-{r['fresh_seed']}"
            measures = {"base": r["measure"]} if key == slice_key else {}
        else:
            measures = {r["recipe"]: r["measures"][slice_key]} if slice_key in r["measures"] else {}
        for name, m in measures.items():
            for e in m["episodes"]:
                if not e.get("kind"):
                    continue
                cell = columns.setdefault(name, {}).setdefault(e["kind"], [0, 0, 0])
                cell[0] += int(e["success"])
                cell[1] += 1
                cell[2] += int(bool(e.get("violations")))
    if not columns:
        return
    kinds = [k for k in KINDS if any(k in c for c in columns.values())]
    print(f"\nSuccesses (and policy violations) by kind of task ({slice_key}, every seed):\n")
    print("| kind of task | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for kind in kinds:
        cells = [f"{c[kind][0]}/{c[kind][1]} ({c[kind][2]})" if kind in c else "-" for c in columns.values()]
        print(f"| {KINDS[kind]} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("base", "run", "measure"):
        p = sub.add_parser(name)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--episodes", type=int, default=32, help="episodes per measurement")
        p.add_argument(
            "--split",
            default="validation",
            choices=["validation", "test"],
            help="validation to choose; test once per recipe family and seed (each look logged)",
        )
        p.add_argument("--fresh-seed", type=int, action="append", default=[], help="also measure this fresh slice")
        p.add_argument("--only-fresh", action="store_true", help="measure the fresh slices only")
        p.add_argument("--second-look", default="", metavar="REASON", help="measure the test split again, and why")
        if name == "measure":
            p.add_argument("--recipe", choices=sorted(RECIPES), required=True)
        if name == "run":
            p.add_argument("--recipe", choices=sorted(RECIPES), required=True)
            p.add_argument("--steps", type=int)
            p.add_argument("--lora-rank", dest="lora_rank", type=int)
            p.add_argument("--orders", type=int)
            p.add_argument("--first-token-weight", dest="first_token_weight", type=float)
            p.add_argument("--lr", dest="learning_rate", type=float)
            p.add_argument("--variants", type=int, help="counterfactual copies of each decision point")
            p.add_argument("--threads", type=int, default=1, help="torch threads")
    decisions = sub.add_parser("decisions", help="P(refund) after a lookup, per kind of order")
    decisions.add_argument("--adapter", default="", help="a run's adapter folder (default: the base model)")
    decisions.add_argument("--turns", type=int, default=40)
    decisions.add_argument(
        "--hint", action="store_true", help="print how much the simulated lead's comment as a hint moves P(refund)"
    )
    decisions.add_argument("--hint-at", choices=["system", "last"], default="system", help="where the hint goes")
    curve = sub.add_parser("curve", help="P(refund) after a lookup by days since delivery (the decision curve)")
    curve.add_argument("--adapter", default="", help="an adapter folder (default: the base model)")
    curve.add_argument("--recipe", default="", help="or the kept adapter of this recipe's run with --seed")
    curve.add_argument("--seed", type=int, default=0)
    curve.add_argument("--split", default="validation", choices=["validation", "test"])
    curve.add_argument("--per-point", dest="per_point", type=int, default=2)
    curve.add_argument("--every", type=int, default=2, help="every N-th day (and 30, 31)")
    summary = sub.add_parser("summary")
    summary.add_argument("--runs", type=Path, default=OUT / "runs.jsonl", help="the runs' record (JSONL)")
    args = parser.parse_args()
    if args.command == "summary":
        command_summary(args)
        return 0
    import django

    django.setup()
    import torch

    torch.set_num_threads(1)
    cpu_attention()
    commands = {
        "base": command_base,
        "run": command_run,
        "measure": command_measure,
        "decisions": command_decisions,
        "curve": command_curve,
    }
    commands[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
