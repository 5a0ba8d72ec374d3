"""A failed judge call in words: what the recorded reason means for the person reading it,
what fixes it, and where to read more (docs/how-to/connect-a-judge.md)."""

from __future__ import annotations

JUDGE_DOCS = "docs/how-to/connect-a-judge.md"
# What each kind of failure means for the person reading it, and what fixes it, in order of
# precedence: (a phrase of the recorded reason, lower-cased) → the words.
_EXPLAINED: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("maximum context length", "context length", "context window", "too many tokens", "prompt is too long"),
        "the judge model's context is too small for this turn — connect a judge with a longer context, or set "
        "PRACTICUM_JUDGE_CONTEXT_TOKENS to its window so the conversation is trimmed to fit",
    ),
    (
        ("http 401", "http 403"),
        "the judge endpoint refused the key — check PRACTICUM_JUDGE_API_KEY (or the deployment's judge key)",
    ),
    (
        ("http 404",),
        "the judge endpoint does not know this model or path — check PRACTICUM_JUDGE_BASE_URL (it ends in /v1) "
        "and PRACTICUM_JUDGE_MODEL",
    ),
    (("http 429",), "the judge endpoint is rate-limiting these calls — judge again later, or raise its quota"),
    (
        ("connection failed",),
        "the judge endpoint does not answer — is it running, and is PRACTICUM_JUDGE_BASE_URL right?",
    ),
    (
        ("timed out", "no time left", "would pass the deadline"),
        "the judge took too long — raise PRACTICUM_JUDGE_TIMEOUT_S and PRACTICUM_JUDGE_DEADLINE_S, or connect a "
        "faster judge",
    ),
    (
        ("cut off at max_tokens",),
        "the judge's answer was cut off at its token limit — raise PRACTICUM_JUDGE_MAX_TOKENS, or connect a "
        "stronger judge that answers briefly",
    ),
    (
        ("not json", "does not match the schema", "empty output", "no choices"),
        "the judge did not answer in the required JSON — connect a model that follows structured output",
    ),
    (("the judge refused",), "the judge model refused to judge this turn — judge again, or connect another judge"),
    (("http 5",), "the judge endpoint had an error of its own — judge again later"),
    (
        ("practicum_judge_max_response_bytes",),
        "the judge's answer was larger than allowed — raise PRACTICUM_JUDGE_MAX_RESPONSE_BYTES, or lower "
        "PRACTICUM_JUDGE_MAX_TOKENS",
    ),
)


def failure_explained(reason: str) -> str:
    """The recorded `reason` of a failed judge call in words, with what fixes it and where
    to read more, followed by the endpoint's own words; a reason already explained is kept."""
    if JUDGE_DOCS in reason:
        return reason
    lowered = reason.lower()
    for phrases, words in _EXPLAINED:
        if any(phrase in lowered for phrase in phrases):
            return f"{words} (see {JUDGE_DOCS}). The judge said: {reason}"
    return f"the judge call failed (see {JUDGE_DOCS}). The judge said: {reason}"
