"""The nav's count of what waits for the signed-in person."""

from __future__ import annotations

from functools import cached_property

from django.http import HttpRequest

from training.notifications.selectors import promotions_awaiting_count


class Inbox:
    """Counted when a template first reads `inbox.count` (the nav does), once per response:
    a page that renders no nav, or a person who decides nothing, costs no query."""

    def __init__(self, user) -> None:
        self._user = user

    @cached_property
    def count(self) -> int:
        return promotions_awaiting_count(user=self._user)


def inbox(request: HttpRequest) -> dict[str, Inbox]:
    return {"inbox": Inbox(getattr(request, "user", None))}
