"""Guards against "master key" responses: content-free text that LLM judges are known to
reward (a bare ":" or ".", or a reasoning opener such as "Thought process:" with nothing
after it). A policy trained on judge rewards finds these quickly, so such a response
gets reward 0 from the guard, recorded as such, and the judge is never asked.
"""

from __future__ import annotations

import re

_OPENER = re.compile(
    r"^(?:thought process|thinking|reasoning|let'?s (?:solve|think about) (?:this|it)(?: problem)?"
    r"(?: step[- ]by[- ]step)?|let me think(?: step[- ]by[- ]step)?|step[- ]by[- ]step|solution|answer|"
    r"final answer|response|sure|okay|ok)$",
    re.IGNORECASE,
)
_HAS_WORD = re.compile(r"[^\W_]", re.UNICODE)


def master_key_reason(text: str, *, has_tool_calls: bool = False) -> str | None:
    """Why `text` is a content-free response, or None when it has content.

    A turn made only of tool calls has content (the calls) even with empty text.
    """
    if has_tool_calls:
        return None
    stripped = text.strip()
    if not stripped:
        return "empty response"
    if not _HAS_WORD.search(stripped):
        return "punctuation or symbols only"
    core = re.sub(r"[\s\W_]+$", "", stripped)
    core = re.sub(r"^[\s\W_]+", "", core)
    if _OPENER.match(core):
        return f"a bare opener with no content ({stripped[:40]!r})"
    return None
