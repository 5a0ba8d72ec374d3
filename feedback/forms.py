"""Forms of the dashboard: the trace-list filter and the annotation forms.

The filter lives in the URL: every field is a GET parameter, so a filtered list can be
shared, bookmarked and restored with the back button.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django import forms
from django.http import QueryDict
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from feedback.models import TraceStatus
from training.serving.models import Deployment, ModelVersion
from webapp.kernel.chat_format import FieldError

YES_NO = [("", "any"), ("yes", "yes"), ("no", "no")]
RATINGS = [
    ("", "any"),
    ("negative", "negative (thumbs down, 1-2)"),
    ("neutral", "neutral (3)"),
    ("positive", "positive (thumbs up, 4-5)"),
]
OUTCOMES = [("", "any"), ("failure", "failure"), ("success", "success"), ("ungraded", "ungraded")]
# The parameters that make up a filter (the cursor `after` is not one).
FILTER_FIELDS = (
    "q",
    "system",
    "deployment",
    "environment",
    "version",
    "status",
    "start",
    "end",
    "comment",
    "feedback",
    "rating",
    "outcome",
    "reward_min",
    "reward_max",
    "flag",
)


class TraceFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=500, label="Search")
    # The system prompt is the same on every trace of an agent: searched only when asked.
    system = forms.ChoiceField(required=False, choices=[("", "no"), ("yes", "yes")], label="Search system messages too")
    # Ids, not choices: validating against the lists would query them on every htmx request.
    deployment = forms.IntegerField(required=False, min_value=1)
    environment = forms.CharField(required=False, max_length=200)
    version = forms.IntegerField(required=False, min_value=1, label="Model version")
    status = forms.ChoiceField(required=False, choices=[("", "any"), *TraceStatus.choices])
    start = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))
    comment = forms.ChoiceField(required=False, choices=YES_NO, label="Commented")
    feedback = forms.ChoiceField(required=False, choices=YES_NO, label="Customer feedback")
    rating = forms.ChoiceField(required=False, choices=RATINGS, label="Feedback rating")
    outcome = forms.ChoiceField(required=False, choices=OUTCOMES, label="Outcome")
    reward_min = forms.FloatField(
        required=False, label="Judge reward ≥", widget=forms.NumberInput(attrs={"step": "any"})
    )
    reward_max = forms.FloatField(required=False, label="≤", widget=forms.NumberInput(attrs={"step": "any"}))
    flag = forms.SlugField(required=False, max_length=100, label="Failure flag")

    def selects(self) -> dict[str, SafeString]:
        """The filter's drop-downs as HTML. Built here rather than by the widgets' templates,
        which cost ~12 ms a page on a busy machine; format_html escapes every value."""
        choices = {
            "deployment": [("", "all"), *Deployment.objects.values_list("id", "name")],
            # Capped, so a long history of versions cannot bloat the page.
            "version": [
                ("", "any"),
                *ModelVersion.objects.order_by("-created_at", "-id").values_list("id", "name")[:200],
            ],
        }
        out = {}
        for name in ("deployment", "version", "status", "outcome", "comment", "feedback", "rating"):
            current = str(self.data.get(name, "")) if self.is_bound else ""
            options = format_html_join(
                "",
                '<option value="{}"{}>{}</option>',
                (
                    (value, " selected" if str(value) == current else "", label)
                    for value, label in choices.get(name) or self.fields[name].choices
                ),
            )
            out[name] = format_html('<select name="{}" id="id_{}">{}</select>', name, name, options)
        return out

    def filters(self) -> dict:
        """The valid filter values (an invalid field is left out and shown as an error)."""
        if not self.is_bound:
            return {}
        self.is_valid()
        return {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}


class CommentForm(forms.Form):
    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))
    quote = forms.CharField(required=False)
    quote_start = forms.IntegerField(required=False, min_value=0)
    quote_end = forms.IntegerField(required=False, min_value=0)


class QueueCreateForm(forms.Form):
    name = forms.CharField(max_length=200)
    limit = forms.IntegerField(min_value=1, max_value=5000, initial=100, label="Traces")
    lock_minutes = forms.IntegerField(min_value=1, max_value=240, initial=10, label="Lock (minutes)")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    instructions = forms.CharField(required=False, max_length=20_000, widget=forms.Textarea(attrs={"rows": 3}))
    rubric = forms.CharField(required=False, max_length=20_000, widget=forms.Textarea(attrs={"rows": 4}))
    dimensions = forms.CharField(
        required=False, max_length=20_000, label="Score dimensions", widget=forms.Textarea(attrs={"rows": 3})
    )


def trace_filters(data: Mapping[str, Any], *, also: Iterable[str] = (), prefix: str = "") -> dict:
    """The cleaned trace-list filters in `data` (a query string's or a JSON object's), for an
    API: a parameter that is no filter (nor one of `also`) or a value that cannot be read is a
    `FieldError` naming it (after `prefix`), never silently "any"."""
    unknown = sorted(set(map(str, data)) - {*FILTER_FIELDS, *also})
    if unknown:
        raise FieldError(prefix + unknown[0][:100], "not a filter of the trace list")
    query = data if isinstance(data, QueryDict) else QueryDict(mutable=True)
    if query is not data:
        for key, value in data.items():
            query[str(key)] = "" if value is None else str(value)
    form = TraceFilterForm(query)
    if not form.is_valid():
        field, problems = next(iter(form.errors.items()))
        raise FieldError(prefix + field, str(problems[0]))
    return form.filters()
