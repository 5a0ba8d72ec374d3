"""Whether a model's words can be read: garbled text and cluster names worth showing.

Pure functions (no Django): the judge's pages use them to flag a judgement that passed the
schema with garbage in it, and the failure-mode pipeline to replace an unreadable cluster
name by one taken from the cluster's own comments."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

NAME_MAX_CHARS = 60
_GENERIC_NAMES = {
    "",
    "failure mode",
    "failure",
    "cluster",
    "issue",
    "issues",
    "problem",
    "unknown",
    "n/a",
    "none",
    "other",
}


def text_is_garbled(text: str) -> bool:
    """Text no reader could use: empty, mostly not letters, or one word over and over."""
    stripped = text.strip()
    if not stripped:
        return True
    letters = sum(ch.isalpha() for ch in stripped)
    if letters / len(stripped) < 0.5:
        return True
    words = re.findall(r"\w+", stripped.lower())
    return len(words) >= 6 and Counter(words).most_common(1)[0][1] / len(words) > 0.5


def name_is_readable(name: str) -> bool:
    """A cluster name worth showing: real words, short enough for a flag, not a placeholder
    ("Cluster 3", "Failure mode")."""
    stripped = name.strip()
    if not stripped or len(stripped) > NAME_MAX_CHARS or text_is_garbled(stripped):
        return False
    words = re.findall(r"[^\W\d_]+", stripped.lower())
    if not words or max(len(w) for w in words) > 30:
        return False
    return re.sub(r"[\s\d#.:_-]+$", "", stripped.lower()) not in _GENERIC_NAMES


def name_from_texts(texts: Sequence[str]) -> str:
    """A readable name from a cluster's most representative texts (most central first): the
    first sentence of the first one that reads, cut at a word boundary."""
    for text in texts:
        first = re.split(r"(?<=[.!?])\s|\n", text.strip(), maxsplit=1)[0].strip().rstrip(".!?")
        if not first or text_is_garbled(first):
            continue
        if len(first) > NAME_MAX_CHARS:
            first = first[: NAME_MAX_CHARS - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"
        return first[0].upper() + first[1:]
    return ""


_PRAISE = re.compile(
    r"\b(?:great|perfect|perfectly|excellent|good (?:job|answer|reply|response|one)|well done|nice|spot on"
    r"|exactly right|correct|helpful|love|loved|thanks|thank you|awesome|brilliant|fine|ok|okay|lgtm)\b|👍",
    re.IGNORECASE,
)
_CRITICISM = re.compile(
    r"\b(?:not|no|never|wrong|should|shouldn|instead|missing|missed|miss|but|however|fail|failed|fails|error"
    r"|incorrect|forgot|forgets|without|too|bad|worse|confus\w*|hallucinat\w*|unclear|ignored|ignores|lacks?"
    r"|needs?|must|could have|would have|rude|slow|didn|doesn|isn|wasn|can't|cannot|won't)\b|n't\b|👎",
    re.IGNORECASE,
)


def text_is_praise(text: str) -> bool:
    """A note that only praises ("Great answer, thanks!"): it says nothing went wrong, so it
    is no failure mode. Any word of criticism ("good, but should…") keeps it."""
    return bool(_PRAISE.search(text)) and not _CRITICISM.search(text)
