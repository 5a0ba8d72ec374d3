"""A NUL character in a query parameter, form field or URL path is a 400 naming it, before
any view runs (PostgreSQL text cannot hold NUL: each of these was a 500)."""

from __future__ import annotations

import pytest

from training.promotion.models import Release
from training.serving.models import LiveVersion, LiveVersionChange

pytestmark = pytest.mark.django_db


def test_a_nul_in_the_tours_deployment_parameter_is_a_400_naming_it(client, operator):
    client.force_login(operator)
    response = client.get("/tour/", {"deployment": "support\x00bot"})
    assert response.status_code == 400
    assert b"deployment: contains a NUL character" in response.content


def test_a_nul_in_a_url_segment_is_a_400(client, operator):
    client.force_login(operator)
    response = client.post("/tour/support%00bot/agent-run")
    assert response.status_code == 400 and b"path: contains a NUL character" in response.content


@pytest.mark.parametrize("encoding", ["urlencoded", "multipart"])
def test_a_nul_in_a_rollback_reason_is_a_400_and_nothing_changes(client, registry, approver, encoding):
    client.force_login(approver)
    before = LiveVersionChange.objects.count()
    url = f"/deployments/{registry.deployment.name}/rollback"
    if encoding == "urlencoded":
        response = client.post(url, "reason=bad%00day", content_type="application/x-www-form-urlencoded")
    else:
        response = client.post(url, {"reason": "bad\x00day"})
    assert response.status_code == 400 and b"reason: contains a NUL character" in response.content
    assert LiveVersionChange.objects.count() == before and not Release.objects.exists()
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version


def test_an_api_query_parameter_with_a_nul_is_the_apis_400_body(client, operator):
    client.force_login(operator)
    response = client.get("/api/v1/traces", {"search": "a\x00b"})
    assert response.status_code == 400
    assert response.json() == {
        "detail": "search: contains a NUL character",
        "errors": [{"field": "search", "reason": "contains a NUL character"}],
    }


def test_markup_in_the_offending_field_name_is_escaped(client, operator):
    client.force_login(operator)
    response = client.get("/tour/?%3Cscript%3E=%00")
    assert response.status_code == 400
    assert b"<script>" not in response.content and b"&lt;script&gt;" in response.content
