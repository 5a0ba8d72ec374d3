"""A deployment's own judge reads its key from an environment variable named for that
purpose only: naming any other (SECRET_KEY, a database password) is refused when the
endpoint is saved — by the model, the admin and the service — and again when it is used."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from feedback.models import DeploymentJudge, JudgeStatus, JudgeTrigger
from feedback.services.judging import judge_request, judge_run
from feedback.services.review import comment_add
from tests.factories import user_with_role
from tests.fixtures.judge import Reply
from tests.judge.conftest import VALID_JUDGEMENT

pytestmark = pytest.mark.django_db
REFUSED = ["SECRET_KEY", "DATABASE_URL", "PRACTICUM_JUDGE_KEY_", "practicum_judge_key_x", "PRACTICUM_JUDGE_KEY_A-B"]


@pytest.mark.parametrize("name", REFUSED)
def test_the_service_and_the_model_refuse_other_variables(deployment, name):
    from feedback.services.judging import deployment_judge_set

    with pytest.raises(ValidationError) as exc:
        deployment_judge_set(deployment=deployment, base_url="http://judge.invalid/v1", model="m", api_key_env=name)
    assert "api_key_env" in exc.value.message_dict
    assert not DeploymentJudge.objects.exists()
    with pytest.raises(ValidationError):
        DeploymentJudge(
            deployment=deployment, base_url="http://judge.invalid/v1", model="m", api_key_env=name
        ).full_clean()


@pytest.mark.parametrize("name", ["", "PRACTICUM_JUDGE_KEY_SUPPORT_BOT", "PRACTICUM_JUDGE_API_KEY"])
def test_judge_key_variables_are_accepted(deployment, name):
    from feedback.services.judging import deployment_judge_set

    judge = deployment_judge_set(deployment=deployment, base_url="http://judge.invalid/v1", model="m", api_key_env=name)
    assert judge.api_key_env == name


def test_a_staff_admin_cannot_save_another_variable_in_the_admin(client, deployment):
    admin = user_with_role("admin", "ada", is_staff=True)
    client.force_login(admin)
    form = {"deployment": deployment.pk, "base_url": "http://judge.invalid/v1", "model": "m"}
    form |= {"schema_mode": "full", "correction_mode": "text", "updated_at_0": "2026-12-01", "updated_at_1": "12:00:00"}
    response = client.post("/admin/feedback/deploymentjudge/add/", {**form, "api_key_env": "SECRET_KEY"})
    assert response.status_code == 200 and "is not a judge key variable" in response.content.decode()
    assert not DeploymentJudge.objects.exists()
    response = client.post("/admin/feedback/deploymentjudge/add/", {**form, "api_key_env": "PRACTICUM_JUDGE_KEY_BOT"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert DeploymentJudge.objects.get().api_key_env == "PRACTICUM_JUDGE_KEY_BOT"


def test_a_stored_row_naming_another_variable_is_refused_at_use(
    make_trace, deployment, operator, judge_settings, settings, monkeypatch
):
    monkeypatch.setenv("SECRET_KEY", "the-django-secret")
    DeploymentJudge.objects.create(deployment=deployment, base_url=judge_settings.base_url, model="own")
    DeploymentJudge.objects.filter(deployment=deployment).update(api_key_env="SECRET_KEY")  # past validation
    trace = make_trace()
    answer = trace.messages.get(position=4)
    comment_add(message=answer, author=operator, body="It should have looked the order up.")
    judge_settings.script(Reply.json(VALID_JUDGEMENT))
    result = judge_run(result=judge_request(message=answer, trigger=JudgeTrigger.MANUAL, enqueue=False))
    assert result.status == JudgeStatus.FAILED and "SECRET_KEY" in result.error
    assert judge_settings.requests == []
