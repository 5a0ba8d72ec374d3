"""Tags that tie a hand-written form's fields to its problems (webapp.kernel.form_problems):
`{% field_attrs problems "name" %}` gives an input its id, and `aria-invalid` with the
error's id when it has one; `{% field_error problems "name" %}` is the error beside it."""

from __future__ import annotations

from django import template
from django.utils.html import format_html

from webapp.kernel.form_problems import FormProblems, field_id

register = template.Library()


@register.simple_tag
def field_attrs(problems: FormProblems, name: str) -> str:
    if not isinstance(problems, FormProblems):
        return ""
    anchor = field_id(problems.prefix, name)
    if name not in problems.by_field:
        return format_html(' id="{}"', anchor)
    return format_html(' id="{}" aria-invalid="true" aria-describedby="{}-error"', anchor, anchor)


@register.simple_tag
def field_error(problems: FormProblems, name: str) -> str:
    reason = problems.by_field.get(name) if isinstance(problems, FormProblems) else None
    if not reason:
        return ""
    return format_html('<p class="error field-error" id="{}-error">{}</p>', field_id(problems.prefix, name), reason)


@register.filter
def get_item(mapping, key):
    """`mapping[key]`, or "" (a template cannot index a dict by a variable)."""
    return mapping.get(key, "") if isinstance(mapping, dict) else ""
