from __future__ import annotations

VALID_JUDGEMENT = {
    "rubric": {
        "criteria": [
            {"criterion": "Looks up the order before answering about its status", "weight": 3},
            {"criterion": "Gives the tracking number when the order has shipped", "weight": 2},
        ]
    },
    "rationale": "The operator says the agent guessed the status instead of calling lookup_order.",
    "reward": 0.2,
    "corrected_response": "Let me check order A1 for you.",
}
