"""Which harm signals the promotion's harm precondition blocks on (no override), read by the
precondition (`promotion_checks.check_harm`) and by the signals shown beside it
(`promotion_signals.harm_signals`: a rise of one it does not name yet is a regression, never a
pass). Below both, so neither imports the other for it."""

from __future__ import annotations

HARM_SIGNALS = (
    ("collateral", "changed records the task does not concern"),
    ("unknown_ids", "called a tool on an id never shown"),
    ("violations", "wrote against the task's expected outcome on the records it concerns (policy violations)"),
)
