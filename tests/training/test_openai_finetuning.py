"""OpenAI's fine-tuning API served by Practicum, driven by the real `openai` SDK: files in,
supervised and reinforcement jobs through to a candidate version, events and checkpoints,
and every refusal a 400 (or 403/404) naming the request's field, with nothing stored.

A file's lines and a job's training set are read off the request path by the default
queue's worker; here `_processed` and `_prepared` do what it does, in the test's transaction
(`test_openai_finetuning_bounds.py` runs the real worker)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory
from training.finetuning.files import file_validate
from training.finetuning.jobs import fine_tuning_job_prepare
from training.finetuning.models import FineTuningFile, FineTuningJob
from training.models import TrainingItem, TrainingJob, TrainingJobEvent, TrainingSet
from training.services.job_start import training_job_run
from training.serving.models import ModelVersion
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def connect(in_process_site):
    """An `openai` client for a key: the SDK's own HTTP stack, answered in-process."""

    def client(key: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url="http://testserver/api/openai/v1",
            api_key=key,
            max_retries=0,
            http_client=httpx.Client(transport=in_process_site, base_url="http://testserver"),
        )

    return client


@pytest.fixture
def deployment():
    return DeploymentFactory(name="support-bot")


@pytest.fixture
def train_key(deployment):
    return api_key_create(deployment=deployment, scopes=["train"])


@pytest.fixture
def sdk(train_key, connect):
    return connect(train_key.plaintext)


def _jsonl(rows: list[dict]) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode()


def _processed(sdk, upload):
    """What the default queue's worker does after an upload: the file's lines are read."""
    file_validate(file_id=upload.id)
    return sdk.files.retrieve(upload.id)


def _prepared(sdk, job):
    """What the default queue's worker does after a job request: the files become its
    training set and the job is queued for training."""
    fine_tuning_job_prepare(job_id=int(job.id.removeprefix("ftjob-")))
    return sdk.fine_tuning.jobs.retrieve(job.id)


SUPERVISED = [
    {
        "messages": [
            {"role": "system", "content": "You answer order questions."},
            {"role": "user", "content": f"Where is order A{i}?"},
            {"role": "assistant", "content": f"Order A{i} is on its way."},
        ]
    }
    for i in range(4)
] + [
    {
        "messages": [
            {"role": "user", "content": "Look up B7."},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order_id": "B7"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
            {"role": "assistant", "content": "It has shipped.", "weight": 0},
        ],
        "tools": [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}],
    }
]


def test_a_supervised_job_from_the_sdk_trains_a_candidate_that_waits_for_approval(
    sdk, base_version, deployment, django_capture_on_commit_callbacks
):
    upload = sdk.files.create(file=("train.jsonl", _jsonl(SUPERVISED)), purpose="fine-tune")
    assert upload.id.startswith("file-") and upload.purpose == "fine-tune" and upload.bytes == len(_jsonl(SUPERVISED))
    assert upload.status == "uploaded" and _processed(sdk, upload).status == "processed"
    assert [f.id for f in sdk.files.list()] == [upload.id]
    assert sdk.files.content(upload.id).content == _jsonl(SUPERVISED)

    with django_capture_on_commit_callbacks() as queued:
        job = sdk.fine_tuning.jobs.create(
            model="tiny-base",
            training_file=upload.id,
            method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 2}}},
            suffix="orders",
            seed=3,
            metadata={"team": "support"},
        )
    assert job.id.startswith("ftjob-") and job.status == "validating_files" and len(queued) == 1
    assert job.model == "tiny-base" and job.fine_tuned_model is None and job.seed == 3
    with django_capture_on_commit_callbacks() as queued:
        assert _prepared(sdk, job).status == "queued"
    assert len(queued) == 1  # the training itself, on the training queue
    # Four one-turn lines and the tool call of the fifth (its weight-0 reply is left out).
    training_job = TrainingJob.objects.get(pk=int(job.id.removeprefix("ftjob-")))
    targets = list(
        TrainingItem.objects.filter(training_set=training_job.training_set).values_list("corrected_response", flat=True)
    )
    assert len(targets) == 5 and sum("<tool_call>" in t for t in targets) == 1
    assert not any("It has shipped" in t for t in targets)
    assert training_job.kind == "sft" and training_job.total_steps == 3  # ceil(5 items x 1 epoch / 2)

    assert training_job_run(job_id=training_job.pk, worker="w1") == WorkStatus.FINISHED
    done = sdk.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "succeeded" and done.finished_at is not None
    candidate = ModelVersion.objects.get(name=done.fine_tuned_model)
    assert candidate.status == "candidate" and candidate.deployment == deployment  # nothing serves it yet
    checkpoints = sdk.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.fine_tuned_model_checkpoint for c in checkpoints] == [candidate.name]
    # The checkpoint's metrics are the logged ones at its step, in OpenAI's names.
    last = TrainingJobEvent.objects.filter(job=training_job, kind="step").latest("step")
    assert checkpoints[0].step_number == last.step == 3
    assert checkpoints[0].metrics.step == 3 and checkpoints[0].metrics.train_loss == pytest.approx(last.data["loss"])
    events = sdk.fine_tuning.jobs.list_events(job.id, limit=100).data
    assert any("another person has approved" in e.message for e in events)
    assert sum(e.type == "metrics" for e in events) == 3
    assert all(e.data["train_loss"] == e.data["loss"] for e in events if e.type == "metrics")
    assert [j.id for j in sdk.fine_tuning.jobs.list(metadata={"team": "support"})] == [job.id]
    assert list(sdk.fine_tuning.jobs.list(metadata={"team": "other"})) == []
    assert list(sdk.fine_tuning.jobs.list(metadata={"team__regex": ".*"})) == []  # a key, never a lookup


GRADED = [
    {"messages": [{"role": "user", "content": f"Say the code word for box {i}."}], "answer": "e", "box": str(i)}
    for i in range(6)
]
MULTI = {
    "type": "multi",
    "name": "answer",
    "graders": {
        "has": {
            "type": "string_check",
            "name": "has",
            "input": "{{ sample.output_text }}",
            "reference": "{{ item.answer }}",
            "operation": "ilike",
        },
        "close": {
            "type": "text_similarity",
            "name": "close",
            "input": "{{ sample.output_text }}",
            "reference": "box {{ item.box }}",
            "evaluation_metric": "fuzzy_match",
        },
    },
    "calculate_output": "0.75 * has + 0.25 * close",
}


def test_a_reinforcement_job_is_scored_by_the_requests_grader_on_each_line(
    sdk, base_version, django_capture_on_commit_callbacks
):
    train = sdk.files.create(file=("train.jsonl", _jsonl(GRADED[:4])), purpose="fine-tune")
    check = sdk.files.create(file=("valid.jsonl", _jsonl(GRADED[4:])), purpose="fine-tune")
    with django_capture_on_commit_callbacks():
        job = sdk.fine_tuning.jobs.create(
            model="tiny-base",
            training_file=train.id,
            validation_file=check.id,
            method={
                "type": "reinforcement",
                "reinforcement": {
                    "grader": MULTI,
                    "hyperparameters": {"n_epochs": 1, "batch_size": 2, "eval_interval": 2, "eval_samples": 2},
                },
            },
        )
        _prepared(sdk, job)
    training_job = TrainingJob.objects.get(pk=int(job.id.removeprefix("ftjob-")))
    splits = TrainingItem.objects.filter(training_set=training_job.training_set).values_list("split", flat=True)
    assert training_job.kind == "grpo" and training_job.total_steps == 2
    assert sorted(splits) == ["heldout"] * 2 + ["train"] * 4  # the validation file is held out, whole
    training_job.config = {**training_job.config, "group_size": 2, "max_new_tokens": 4}
    training_job.save(update_fields=["config"])

    assert training_job_run(job_id=training_job.pk, worker="w1") == WorkStatus.FINISHED
    done = sdk.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "succeeded" and done.fine_tuned_model
    assert done.method.type == "reinforcement"
    events = sdk.fine_tuning.jobs.list_events(job.id, limit=100).data
    # Each step's reward is the grader's score of a sample; a held-out evaluation ran at the end.
    steps = [e for e in events if e.type == "metrics" and e.message.startswith("Step")]
    assert len(steps) == 2 and all(0.0 <= e.data["reward_mean"] <= 1.0 for e in steps)
    assert any(e.message.startswith("Evaluation at step 2") for e in events)
    (checkpoint,) = sdk.fine_tuning.jobs.checkpoints.list(job.id).data
    assert checkpoint.metrics.step == 2 and checkpoint.metrics.train_loss is not None
    assert 0.0 <= checkpoint.metrics.valid_mean_reward <= 1.0  # the held-out lines' evaluation


def test_a_job_can_be_cancelled_before_it_starts_and_not_after_it_ends(
    sdk, base_version, django_capture_on_commit_callbacks
):
    upload = sdk.files.create(file=("train.jsonl", _jsonl(SUPERVISED[:2])), purpose="fine-tune")
    with django_capture_on_commit_callbacks():
        job = sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
    assert sdk.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    with pytest.raises(openai.ConflictError):
        sdk.fine_tuning.jobs.cancel(job.id)
    # The file a job was made from is hidden, not destroyed: the job keeps its provenance.
    assert sdk.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(upload.id)
    assert FineTuningFile.objects.filter(pk=upload.id).exists()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "nope"}, "model"),
        ({"training_file": "file-missing"}, "training_file"),
        ({"method": {"type": "dpo"}}, "method.type"),
        (
            {"method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 0}}}},
            "method.supervised.hyperparameters.n_epochs",
        ),
        (
            {"method": {"type": "supervised", "supervised": {"hyperparameters": {"warmup": 3}}}},
            "method.supervised.hyperparameters.warmup",
        ),
        (
            {
                "method": {
                    "type": "reinforcement",
                    "reinforcement": {"grader": {"type": "python", "source": "import os"}},
                }
            },
            "method.reinforcement.grader.type",
        ),
        (
            {
                "method": {
                    "type": "reinforcement",
                    "reinforcement": {"grader": {**MULTI, "calculate_output": "has.__class__"}},
                }
            },
            "method.reinforcement.grader.calculate_output",
        ),
        (
            {
                "method": {
                    "type": "reinforcement",
                    "reinforcement": {"grader": {**MULTI, "calculate_output": "2 ** 99999"}},
                }
            },
            "method.reinforcement.grader.calculate_output",
        ),
        ({"seed": -1}, "seed"),
        ({"model": "tiny\x00base"}, "model"),
        ({"suffix": "a\x00"}, "suffix"),
        ({"metadata": {"k": "\x00"}}, "metadata"),
        ({"metadata": {"k": 3}}, "metadata"),
        ({"integrations": [{"type": "wandb"}]}, "integrations"),
    ],
)
def test_a_job_that_cannot_start_is_a_400_naming_the_field_and_stores_nothing(sdk, base_version, body, param):
    upload = sdk.files.create(file=("train.jsonl", _jsonl(SUPERVISED)), purpose="fine-tune")
    request = {"model": "tiny-base", "training_file": upload.id, **body}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.fine_tuning.jobs.create(**request)
    assert refused.value.body["param"] == param, refused.value.body
    assert not FineTuningJob.objects.exists() and not TrainingSet.objects.exists() and not TrainingJob.objects.exists()


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        (b'{"messages": [}\n', "line 1 is not JSON"),
        (_jsonl([{"messages": [{"role": "wizard", "content": "hi"}]}]), "line 1: messages[0] needs a role"),
        (b"\n\n", "has no lines"),
        (b"[1]\n" + _jsonl(SUPERVISED[:1]), "line 1 must be a JSON object"),
    ],
)
def test_a_bad_file_is_reported_on_the_file_and_refused_for_jobs(sdk, base_version, lines, reason):
    upload = sdk.files.create(file=("bad.jsonl", lines), purpose="fine-tune")
    read = _processed(sdk, upload)
    # As OpenAI's: the file object says why, before any job is asked for.
    assert read.status == "error" and reason in read.status_details
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
    assert refused.value.body["param"] == "training_file" and reason in refused.value.body["message"]
    assert not TrainingJob.objects.exists()


def test_a_line_a_supervised_job_cannot_use_is_refused_by_line(sdk, base_version):
    prompt_only = _jsonl([{"messages": [{"role": "user", "content": "hi"}]}])
    upload = sdk.files.create(file=("prompts.jsonl", prompt_only), purpose="fine-tune")
    assert _processed(sdk, upload).status == "processed"  # a reinforcement job could use it
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
    assert refused.value.body["param"] == "training_file"
    assert "line 1: no assistant message" in refused.value.body["message"]


@pytest.mark.parametrize(
    ("lines", "method", "reason"),
    [
        (b'{"messages": [}\n', None, "line 1 is not JSON"),
        (_jsonl([{"messages": [{"role": "user", "content": "hi"}]}]), None, "no assistant message"),
        (
            _jsonl(GRADED[:1]),
            {
                "type": "reinforcement",
                "reinforcement": {"grader": {**MULTI["graders"]["has"], "reference": "{{ item.missing }}"}},
            },
            "item.missing",
        ),
    ],
)
def test_a_job_whose_files_cannot_train_fails_naming_the_file_and_the_line(sdk, base_version, lines, method, reason):
    upload = sdk.files.create(file=("bad.jsonl", lines), purpose="fine-tune")
    # Asked for before the worker read the file: the worker reads it and fails the job.
    job = sdk.fine_tuning.jobs.create(
        model="tiny-base", training_file=upload.id, **({"method": method} if method else {})
    )
    assert job.status == "validating_files"
    failed = _prepared(sdk, job)
    assert failed.status == "failed" and failed.error.param == "training_file"
    assert failed.error.code == "invalid_training_file" and reason in failed.error.message
    assert not TrainingSet.objects.exists()
    with pytest.raises(openai.ConflictError):  # over: nothing to cancel
        sdk.fine_tuning.jobs.cancel(job.id)


def test_files_list_in_either_order_pages_with_after(sdk, base_version):
    line = _jsonl([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}])
    ids = [sdk.files.create(file=(f"f{i}.jsonl", line), purpose="fine-tune").id for i in range(3)]
    assert [f.id for f in sdk.files.list()] == ids[::-1]
    assert [f.id for f in sdk.files.list(order="asc")] == ids
    first = sdk.files.list(order="asc", limit=2)
    assert [f.id for f in first.data] == ids[:2] and first.has_more
    assert [f.id for f in sdk.files.list(order="asc", after=ids[1])] == ids[2:]
    assert [f.id for f in sdk.files.list(order="desc", after=ids[1])] == ids[:1]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.files.list(order="sideways")
    assert refused.value.body["param"] == "order"


def test_a_deployments_stored_files_are_bounded_and_deleting_one_makes_room(sdk, base_version, settings):
    line = _jsonl([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}])
    settings.FINETUNE_STORAGE_MAX_BYTES = 2 * len(line)
    first = sdk.files.create(file=("a.jsonl", line), purpose="fine-tune")
    sdk.files.create(file=("b.jsonl", line), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.files.create(file=("c.jsonl", line), purpose="fine-tune")
    assert refused.value.body["param"] == "file" and "at most" in refused.value.body["message"]
    assert len(sdk.files.list().data) == 2
    sdk.files.delete(first.id)
    assert sdk.files.create(file=("c.jsonl", line), purpose="fine-tune").filename == "c.jsonl"


def test_a_nul_escaped_in_a_line_is_stored_as_a_replacement_character(sdk, base_version):
    line = {"messages": [{"role": "user", "content": "hi\u0000"}, {"role": "assistant", "content": "ok\u0000"}]}
    upload = sdk.files.create(file=("nul\x00.jsonl", json.dumps(line).encode()), purpose="fine-tune")
    assert "\x00" not in sdk.files.retrieve(upload.id).filename
    job = _prepared(sdk, sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id))
    (item,) = TrainingItem.objects.filter(training_set=TrainingJob.objects.get(pk=int(job.id[6:])).training_set)
    assert item.corrected_response == "ok\ufffd" and item.messages[0]["content"] == "hi\ufffd"


def test_keys_see_their_own_deployment_and_need_the_train_scope(sdk, connect, base_version, deployment):
    upload = sdk.files.create(file=("train.jsonl", _jsonl(SUPERVISED)), purpose="fine-tune")
    other = connect(api_key_create(deployment=DeploymentFactory(name="other-bot"), scopes=["train"]).plaintext)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(upload.id)
    assert list(other.files.list()) == []
    reader = connect(api_key_create(deployment=deployment, scopes=["read", "ingest"]).plaintext)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        reader.files.list()
    assert "train" in refused.value.body["message"]
    with pytest.raises(openai.AuthenticationError):
        connect("pk_nope.secret").files.list()
    with pytest.raises(openai.BadRequestError) as wrong:
        sdk.files.create(file=("x.jsonl", b"{}"), purpose="assistants")
    assert wrong.value.body["param"] == "purpose"
    with pytest.raises(openai.BadRequestError):
        sdk.files.create(file=("x.jsonl", b"\xff\xfe"), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError):
        sdk.fine_tuning.jobs.retrieve("ftjob-99999999999999999999999")


def test_a_score_model_grader_becomes_the_judges_rubric_with_the_line_filled_in():
    from training.finetuning.lines import reinforcement_items

    content = _jsonl(GRADED[:1]).decode()
    grader = {
        "type": "score_model",
        "name": "judge",
        "model": "any",
        "input": [{"role": "user", "content": "Does {{ sample.output_text }} name the code word {{ item.answer }}?"}],
        "range": [0, 1],
    }
    (item,), _ = reinforcement_items(
        content=content, file_id="file-x", grader=grader, split="train", field="training_file", budget=10**6
    )
    assert item["kind"] == "turn" and "code word e?" in item["rubric"] and "{{" not in item["rubric"]


def test_a_score_model_job_needs_the_judges_training_gate_open(sdk, base_version):
    upload = sdk.files.create(file=("train.jsonl", _jsonl(GRADED)), purpose="fine-tune")
    grader = {"type": "score_model", "name": "judge", "model": "any", "input": [{"role": "user", "content": "ok?"}]}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.fine_tuning.jobs.create(
            model="tiny-base",
            training_file=upload.id,
            method={"type": "reinforcement", "reinforcement": {"grader": grader}},
        )
    assert refused.value.body["param"] == "method" and "judge" in refused.value.body["message"]
    assert not TrainingSet.objects.exists() and not TrainingJob.objects.exists()


def test_lines_end_at_newlines_only_and_a_byte_order_mark_is_not_part_of_line_one(sdk, base_version):
    lines = [
        {
            "messages": [
                {"role": "user", "content": f"a\u2028b\u2029c\u0085 {i}"},
                {"role": "assistant", "content": "ok"},
            ]
        }
        for i in range(2)
    ]
    data = b"\xef\xbb\xbf" + "\r\n".join(json.dumps(x, ensure_ascii=False) for x in lines).encode()
    upload = sdk.files.create(file=("u.jsonl", data), purpose="fine-tune")
    assert _processed(sdk, upload).status == "processed"
    job = _prepared(sdk, sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id))
    items = TrainingItem.objects.filter(training_set=TrainingJob.objects.get(pk=int(job.id[6:])).training_set)
    assert sorted(i.messages[0]["content"] for i in items) == [f"a\u2028b\u2029c\u0085 {i}" for i in range(2)]


@pytest.mark.parametrize(
    "assistant",
    [
        {"role": "assistant", "tool_calls": "x"},
        {"role": "assistant", "tool_calls": [{"function": "x"}]},
        {"role": "assistant", "tool_calls": [5]},
        {"role": "assistant", "content": {"a": 1}},
    ],
)
def test_a_message_of_the_wrong_shape_is_refused_by_line(sdk, base_version, assistant):
    upload = sdk.files.create(
        file=("x.jsonl", _jsonl([{"messages": [{"role": "user", "content": "hi"}, assistant]}])), purpose="fine-tune"
    )
    assert "line 1: messages[1]" in _processed(sdk, upload).status_details
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
    assert refused.value.body["param"] == "training_file" and "line 1: messages[1]" in refused.value.body["message"]


def test_what_one_request_can_cost_is_bounded(sdk, base_version, in_process_site, train_key, monkeypatch):
    from training.finetuning import lines

    raw = httpx.Client(transport=in_process_site, base_url="http://testserver")
    answer = raw.post(
        "/api/openai/v1/fine_tuning/jobs",
        content=b'{"metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        headers={"Authorization": f"Bearer {train_key.plaintext}", "Content-Type": "application/json"},
    )
    assert answer.status_code == 400, answer.text  # nested too deeply for the parser: not a 500

    upload = sdk.files.create(file=("t.jsonl", _jsonl(GRADED)), purpose="fine-tune")
    big = {**MULTI["graders"]["has"], "name": "x" * 10_000}  # each line's item carries the grader
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.fine_tuning.jobs.create(
            model="tiny-base",
            training_file=upload.id,
            method={"type": "reinforcement", "reinforcement": {"grader": big}},
        )
    assert refused.value.body["param"] == "method.reinforcement.grader"

    monkeypatch.setattr(lines, "MAX_LINES", 3)
    long = sdk.files.create(file=("t.jsonl", _jsonl(GRADED)), purpose="fine-tune")
    assert "more than 3 lines" in _processed(sdk, long).status_details
    with pytest.raises(openai.BadRequestError, match="more than 3 lines"):
        sdk.fine_tuning.jobs.create(model="tiny-base", training_file=long.id)

    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], "x": [[[[]]]]}
    for _ in range(70):
        line["x"] = [line["x"]]
    deep = sdk.files.create(file=("d.jsonl", json.dumps(line).encode()), purpose="fine-tune")
    assert "nested deeper" in _processed(sdk, deep).status_details
    with pytest.raises(openai.BadRequestError, match="nested deeper"):
        sdk.fine_tuning.jobs.create(model="tiny-base", training_file=deep.id)


def test_ids_are_ascii_digits_and_the_deployments_own_version_wins(sdk, base_version, deployment):
    from training.serving.models import ModelVersion as Version

    with pytest.raises(openai.NotFoundError):
        sdk.fine_tuning.jobs.retrieve("ftjob-\u00b2")
    own = Version.objects.create(
        name="shared-name",
        base_model=base_version.base_model,
        kind="base",
        path=base_version.path,
        deployment=deployment,
    )
    Version.objects.create(
        name="shared-name-2", base_model=base_version.base_model, kind="base", path=base_version.path
    )
    upload = sdk.files.create(file=("t.jsonl", _jsonl(SUPERVISED)), purpose="fine-tune")
    job = sdk.fine_tuning.jobs.create(
        model="shared-name",
        training_file=upload.id,
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 2}}},
        metadata={"0": "x"},
    )
    assert TrainingJob.objects.get(pk=int(job.id[6:])).base_version == own
    assert job.hyperparameters.n_epochs == 1  # as asked, not worked back from the steps
    assert [j.id for j in sdk.fine_tuning.jobs.list(metadata={"0": "x"})] == [job.id]  # a key, not an index
    assert sdk.fine_tuning.jobs.cancel(job.id).status == "cancelled"


def test_an_admin_can_still_delete_a_deployment_that_fine_tuned(sdk, base_version, deployment):
    upload = sdk.files.create(file=("t.jsonl", _jsonl(SUPERVISED)), purpose="fine-tune")
    sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
    deployment.delete()
    assert not FineTuningFile.objects.exists() and not FineTuningJob.objects.exists()
