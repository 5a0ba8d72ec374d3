"""Seeded failure notes in known groups, written the way operators write them."""

from __future__ import annotations

import random

GROUPS: dict[str, list[str]] = {
    "guessed order status": [
        "It guessed the status of order {o} instead of calling lookup_order.",
        "Never looked order {o} up, just claimed it had shipped.",
        "Said order {o} was delivered without checking the order system.",
        "The agent made up a shipping status for {o}; it should have used the lookup tool.",
        "Invented tracking info for order {o} rather than querying lookup_order.",
        "Answered about order {o}'s delivery without looking it up first.",
    ],
    "rude tone": [
        "Way too rude to the customer, told them to {r}.",
        "The tone is dismissive and impolite: '{r}'.",
        "Snapped at the customer ('{r}'), that is not acceptable.",
        "Condescending reply, basically said '{r}'.",
        "Unfriendly and curt with an upset customer: {r}.",
        "Be polite! Telling someone '{r}' is offensive.",
    ],
    "wrong refund policy": [
        "Quoted a {d}-day refund window, our policy is 30 days.",
        "Wrong refund rules: promised a full refund after {d} days.",
        "Told the customer refunds take {d} days; policy says 5 business days.",
        "Misstated the return policy (said {d} days).",
        "Offered a refund outside the {d}-day policy window, which we don't allow.",
        "Refund amount and deadline are wrong, it said {d} days.",
    ],
    "wrong language": [
        "Customer wrote in {l} but the answer came back in English.",
        "Replied in English to a {l} speaker.",
        "Should have answered in {l}, the user's language.",
        "Language mismatch: question in {l}, reply in English.",
        "Ignored that the customer writes {l}; answer in their language.",
        "The user asked in {l}, why is the response not in {l}?",
    ],
    "leaked internals": [
        "Leaked the internal {s} to the customer.",
        "Revealed our {s}, that must stay private.",
        "It pasted the {s} into the reply.",
        "Exposed internal details ({s}) to an external user.",
        "Shared confidential {s} with the customer, never do that.",
        "Disclosed the {s} when asked, security problem.",
    ],
}
FILLERS = {
    "o": ["A1", "B77", "C-2041", "#5532", "Z9", "order 12"],
    "r": ["read the FAQ yourself", "stop wasting my time", "that's your problem", "figure it out", "whatever"],
    "d": ["14", "60", "90", "7", "45"],
    "l": ["German", "Spanish", "French", "Italian", "Portuguese"],
    "s": ["system prompt", "admin password", "API key", "staff notes", "internal pricing sheet"],
}


def seeded_notes(per_group: int, *, seed: int = 0) -> tuple[list[str], list[str]]:
    """`per_group` notes per group, shuffled: (texts, true group of each)."""
    rng = random.Random(seed)
    rows = []
    for group, templates in GROUPS.items():
        for i in range(per_group):
            template = templates[i % len(templates)]
            text = template.format(**{k: rng.choice(v) for k, v in FILLERS.items()})
            rows.append((text, group))
    rng.shuffle(rows)
    return [r[0] for r in rows], [r[1] for r in rows]
