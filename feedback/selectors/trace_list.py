"""The trace list: filters, full-text search and keyset pagination on (started_at, id).

Every query here walks an index in (started_at DESC, id DESC) order and stops after a
page, so its cost does not grow with the table; nothing counts the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import BooleanField, Exists, OuterRef, Q, QuerySet
from django.db.models.expressions import RawSQL

from feedback.models import Message, MessageRole, Trace, TraceFlag, TraceSource
from feedback.services.search import SEARCH_CONFIG, search_match_sql

PAGE_SIZE = 50
# What each choice of the filter's rating and outcome fields stands for in the rows (the
# form, feedback/forms.py, offers the choices); an ungraded trace's stored outcome is blank.
RATING_VALUES = {"negative": -1, "neutral": 0, "positive": 1}
OUTCOME_VALUES = {"failure": "failure", "success": "success", "ungraded": ""}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
LIST_COLUMNS = (
    "id",
    "deployment__name",
    "external_id",
    "environment",
    "model_name",
    "model_version__name",
    "started_at",
    "status",
    "message_count",
    "total_tokens",
    "preview",
    "has_comment",
    "has_customer_feedback",
    "feedback_rating",
    "judge_reward",
    "ended_at",
    "outcome",
    "outcome_reason",
    "outcome_score",
)


@dataclass(frozen=True, slots=True)
class Cursor:
    started_at: datetime
    id: int

    def encode(self) -> str:
        return f"{(self.started_at - _EPOCH) // _MICRO}.{self.id}"

    @classmethod
    def decode(cls, value: str | None) -> Cursor | None:
        """A cursor from the URL, or None when absent or malformed (the first page)."""
        try:
            micros, ident = (value or "").split(".")
            return cls(_EPOCH + int(micros) * _MICRO, int(ident))
        except (ValueError, OverflowError):
            return None


def traces_search(queryset: QuerySet[Trace], query: str, *, include_system: bool = False) -> QuerySet[Trace]:
    """Traces matching a search query, in their system messages too only with
    `include_system`; see feedback.services.search for both backends."""
    query = query.strip()
    if not query:
        return queryset
    if connection.vendor == "postgresql":
        return queryset.filter(
            RawSQL(
                search_match_sql(table=Trace._meta.db_table, include_system=include_system),
                [SEARCH_CONFIG, query],
                output_field=BooleanField(),
            )
        )
    messages = Message.objects.filter(trace=OuterRef("pk"))
    if not include_system:
        messages = messages.exclude(role=MessageRole.SYSTEM)
    condition = Q()
    for word in query.replace('"', " ").split()[:10]:
        condition &= Q(Exists(messages.filter(content__icontains=word)))
    return queryset.filter(condition)


def traces_filtered(filters: dict) -> QuerySet[Trace]:
    """Traces matching cleaned TraceFilterForm values, newest first."""
    qs = Trace.objects.all()
    if "deployment" in filters:
        qs = qs.filter(deployment_id=filters["deployment"])
    if "environment" in filters:
        qs = qs.filter(environment=filters["environment"])
    if "version" in filters:
        qs = qs.filter(model_version_id=filters["version"])
    if "status" in filters:
        qs = qs.filter(status=filters["status"])
    if "start" in filters:
        qs = qs.filter(started_at__gte=datetime.combine(filters["start"], time.min, tzinfo=UTC))
    if "end" in filters and filters["end"] < date.max:  # the last date there is: no bound
        # The end date is inclusive: everything before the next midnight.
        qs = qs.filter(started_at__lt=datetime.combine(filters["end"] + timedelta(days=1), time.min, tzinfo=UTC))
    if "comment" in filters:
        qs = qs.filter(has_comment=filters["comment"] == "yes")
    if "feedback" in filters:
        qs = qs.filter(has_customer_feedback=filters["feedback"] == "yes")
    if "rating" in filters:
        qs = qs.filter(feedback_rating=RATING_VALUES[filters["rating"]])
    if "reward_min" in filters:
        qs = qs.filter(judge_reward__gte=filters["reward_min"])
    if "reward_max" in filters:
        qs = qs.filter(judge_reward__lte=filters["reward_max"])
    if "outcome" in filters:
        qs = qs.filter(outcome=OUTCOME_VALUES[filters["outcome"]])
    if "q" in filters:
        qs = traces_search(qs, filters["q"], include_system=filters.get("system") == "yes")
    if "flag" in filters:
        # Walk the flag's (name, trace_started_at, trace) index newest first and join the
        # traces: the cost follows the page, not how many traces carry the flag. A trace has
        # a flag name at most once, so the join adds no duplicates.
        return qs.filter(flags__name=filters["flag"]).order_by("-flags__trace_started_at", "-flags__trace_id")
    return qs.order_by("-started_at", "-id")


def _compare(cursor: Cursor, op: str, *, flagged: bool) -> RawSQL:
    # A row comparison, so PostgreSQL turns it into one index range condition; on the flag
    # table's copy of the columns when the list is driven by a flag. Raw SQL skips the
    # field's conversion, so the timestamp is adapted here (SQLite compares text).
    if flagged:
        columns = f'"{TraceFlag._meta.db_table}"."trace_started_at", "{TraceFlag._meta.db_table}"."trace_id"'
    else:
        columns = f'"{Trace._meta.db_table}"."started_at", "{Trace._meta.db_table}"."id"'
    return RawSQL(
        f"({columns}) {op} (%s, %s)",
        [connection.ops.adapt_datetimefield_value(cursor.started_at), cursor.id],
        output_field=BooleanField(),
    )


@dataclass(slots=True)
class TracePage:
    rows: list[dict]
    next_cursor: Cursor | None


def trace_page(*, filters: dict, after: Cursor | None = None, limit: int = PAGE_SIZE) -> TracePage:
    """One page of the list (dicts of LIST_COLUMNS plus `flags`), and the cursor of the next."""
    qs = traces_filtered(filters)
    if after is not None:
        qs = qs.filter(_compare(after, "<", flagged="flag" in filters))
    rows = list(qs.values(*LIST_COLUMNS)[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    flags: dict[int, list[str]] = {}
    if rows:
        for trace_id, name in (
            TraceFlag.objects.filter(trace_id__in=[r["id"] for r in rows])
            .order_by("name")
            .values_list("trace_id", "name")
        ):
            flags.setdefault(trace_id, [])
            if name not in flags[trace_id]:
                flags[trace_id].append(name)
    for r in rows:
        r["flags"] = flags.get(r["id"], [])
    last = rows[-1] if rows else None
    return TracePage(rows, Cursor(last["started_at"], last["id"]) if more and last else None)


def trace_neighbour(*, filters: dict, trace: Trace, older: bool) -> int | None:
    """The id of the next older (or newer) trace in the filtered list, if any."""
    here = Cursor(trace.started_at, trace.id)
    qs = traces_filtered(filters)
    flagged = "flag" in filters
    if older:
        qs = qs.filter(_compare(here, "<", flagged=flagged))
    else:
        order = ("flags__trace_started_at", "flags__trace_id") if flagged else ("started_at", "id")
        qs = qs.filter(_compare(here, ">", flagged=flagged)).order_by(*order)
    return qs.values_list("id", flat=True).first()


def flag_names(limit: int = 200) -> list[str]:
    """Distinct failure-flag names for the filter's suggestions. On PostgreSQL a loose index
    scan over (name, trace): one probe per name instead of reading the whole table."""
    if connection.vendor != "postgresql":
        return list(TraceFlag.objects.order_by("name").values_list("name", flat=True).distinct()[:limit])
    table = TraceFlag._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""WITH RECURSIVE names(name) AS (
                  (SELECT name FROM {table} ORDER BY name LIMIT 1)
                  UNION ALL
                  SELECT (SELECT f.name FROM {table} f WHERE f.name > names.name ORDER BY f.name LIMIT 1)
                  FROM names WHERE names.name IS NOT NULL
                ) SELECT name FROM names WHERE name IS NOT NULL LIMIT %s""",
            [limit],
        )
        return [r[0] for r in cursor.fetchall()]


def demo_agent_starting() -> bool:
    """`make demo` is running (it sets PRACTICUM_DEMO_EPISODES) and no episode of its agent
    has come through the gateway yet: the agent is still starting (the model server loads
    first), so an empty trace list is waiting, not wanting."""
    return settings.DEMO_EPISODES > 0 and not Trace.objects.filter(source=TraceSource.GATEWAY).exists()
