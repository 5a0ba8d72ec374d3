"""A form field that should hold an id or a JSON object is read without `int()` raising: "²"
(a digit to `str.isdigit()`, not to `int()`), a zero, a number longer than a bigint, or a JSON
number of more than 4,300 digits (which Python refuses to read) is a 400 naming the field."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.training.test_job_pages import client_in, running_job, training_set, version  # noqa: F401 - fixtures
from training.models import TrainingJob
from webapp.kernel.form_problems import json_object_error
from webapp.kernel.ids import ID_REASON, form_id

pytestmark = pytest.mark.django_db
HUGE = '{"steps": ' + "1" * 5000 + "}"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"set": "42"}, (42, [])),
        ({"set": " 42 "}, (42, [])),
        ({}, (None, [])),
        ({"set": ""}, (None, [])),
        ({"set": "\u00b2"}, (None, [("set", ID_REASON)])),
        ({"set": "0"}, (None, [("set", ID_REASON)])),
        ({"set": "9" * 20}, (None, [("set", ID_REASON)])),
        ({"set": "-3"}, (None, [("set", ID_REASON)])),
    ],
)
def test_a_form_id_is_a_whole_positive_number_in_ascii_digits_or_the_fields_error(data, expected):
    assert form_id(data, "set") == expected


def test_a_json_number_too_long_for_python_is_said_not_raised():
    assert json_object_error(HUGE) == "holds a number too long to read (more than 4,300 digits)"


def test_the_job_form_names_the_field_of_a_number_it_cannot_read(client_in, version, training_set):  # noqa: F811
    url = reverse("training:job-list")
    form = {"kind": "grpo", "base_version": version.pk, "training_set": training_set.pk, "config": "{}"}
    huge = client_in.post(url, form | {"config": HUGE})
    assert huge.status_code == 400 and "too long to read" in huge.content.decode()
    for field in ("base_version", "training_set"):
        for value in ("\u00b2", "0", "9" * 20):
            bad = client_in.post(url, form | {field: value})
            assert bad.status_code == 400, (field, value)
            assert f'href="#job-{field.replace("_", "-")}"' in bad.content.decode()
            assert ID_REASON in bad.content.decode()
    assert not TrainingJob.objects.exists()


def test_the_usable_note_refuses_a_set_that_is_no_id(client_in, training_set):  # noqa: F811
    url = reverse("training:job-list")
    for value in ("\u00b2", "9" * 20):
        bad = client_in.get(url, {"part": "usable", "training_set": value}, HTTP_HX_REQUEST="true")
        assert bad.status_code == 400 and bad.content.decode() == f"training_set: {ID_REASON}"
    ok = client_in.get(url, {"part": "usable", "training_set": training_set.pk}, HTTP_HX_REQUEST="true")
    assert ok.status_code == 200 and "items usable by GRPO" in ok.content.decode()


def test_the_learning_policy_form_names_a_job_config_it_cannot_read(client_in):  # noqa: F811
    bad = client_in.post(reverse("training:policy-list"), {"deployment": "support-bot", "job_config": HUGE})
    assert bad.status_code == 400 and "too long to read" in bad.content.decode()


def test_pages_that_take_an_id_in_the_query_ignore_one_that_is_none(client_in, running_job):  # noqa: F811
    page = reverse("training:job-detail", args=[running_job.pk])
    assert client_in.get(page, {"sample_step": "\u00b2"}).status_code == 200
