"""Every operation of the published API schema, fuzzed with generated requests (valid and
invalid bodies, query strings and path values), as a person and as an API key: none is
answered with a server error. Requests run in-process, inside the test's transaction, so
nothing they queue on commit (jobs, releases) ever runs."""

from __future__ import annotations

import base64
import contextlib

import pytest

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

EXAMPLES = 12  # per operation and mode; the whole schema runs in about a minute


def test_no_generated_request_gets_a_server_error(in_process_site, settings):
    import hypothesis
    import schemathesis
    from django.contrib.auth import get_user_model
    from drf_spectacular.generators import SchemaGenerator
    from hypothesis import HealthCheck, Phase
    from schemathesis.generation import GenerationMode

    from feedback.models import ApiKeyScope
    from feedback.services.api_keys import api_key_create
    from tests.factories import DeploymentFactory

    settings.JUDGE_BASE_URL = "http://127.0.0.1:9"  # nothing answers: a judge call fails fast
    deployment = DeploymentFactory(name="support-bot")
    key = api_key_create(deployment=deployment, scopes=list(ApiKeyScope.values)).plaintext
    get_user_model().objects.create_superuser("fuzz", "fuzz@example.com", "pw-fuzz-1234")
    basic = "Basic " + base64.b64encode(b"fuzz:pw-fuzz-1234").decode()  # a person, as scripts log in

    raw = SchemaGenerator().get_schema(request=None, public=True)
    schema = schemathesis.openapi.from_dict(raw)
    schema.app = in_process_site.app
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 40  # the whole API, not an empty schema

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode)

            @hypothesis.given(case=strategy, label=hypothesis.strategies.just(mode.value))
            @hypothesis.settings(
                max_examples=EXAMPLES,
                database=None,
                deadline=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def call(case, label):
                for headers in ({"Authorization": f"Bearer {key}"}, {"Authorization": basic}):
                    response = case.call(headers=headers)
                    if response.status_code >= 500:
                        failures.append(
                            f"{case.method} {case.formatted_path} {label} → {response.status_code}: "
                            f"query={case.query!r} body={str(case.body)[:200]!r}"
                        )

            # Unsatisfiable: nothing to negate in this operation (no parameters, no body).
            with contextlib.suppress(hypothesis.errors.Unsatisfiable):
                call()
    assert not failures, "\n".join(dict.fromkeys(failures))
