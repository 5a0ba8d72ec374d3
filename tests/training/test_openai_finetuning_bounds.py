"""What one fine-tuning request can cost, through the real `openai` SDK: a line's items are
bounded (messages and targets per line, item bytes per job), the files are read and the items
built by the default queue's worker instead of in the request, and the storage quota counts
every byte a deployment's files (deleted ones too, until their content is gone) and the items
made of them hold."""

from __future__ import annotations

import json
import time
import tracemalloc

import httpx
import openai
import pytest

from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory
from training.finetuning.files import file_validate, storage_used
from training.finetuning.jobs import fine_tuning_job_prepare
from training.finetuning.models import FineTuningFile, FineTuningJob
from training.models import TrainingItem

MiB = 1024 * 1024


@pytest.fixture
def deployment(db):
    return DeploymentFactory(name="support-bot")


@pytest.fixture
def sdk(deployment, in_process_site):
    key = api_key_create(deployment=deployment, scopes=["train"]).plaintext
    return openai.OpenAI(
        base_url="http://testserver/api/openai/v1",
        api_key=key,
        max_retries=0,
        http_client=httpx.Client(transport=in_process_site, base_url="http://testserver"),
    )


def _jsonl(rows: list[dict]) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode()


def _quadratic_line(n: int) -> dict:
    """The issue's line: a user message and `n` assistant messages (78 KB at n = 2,000)."""
    replies = [{"role": "assistant", "content": f"R{i}"} for i in range(n)]
    return {"messages": [{"role": "user", "content": "Start."}, *replies]}


def _processed(sdk, upload):
    file_validate(file_id=upload.id)
    return sdk.files.retrieve(upload.id)


def _prepared(sdk, job):
    fine_tuning_job_prepare(job_id=int(job.id.removeprefix("ftjob-")))
    return sdk.fine_tuning.jobs.retrieve(job.id)


class Peak:
    """The most Python memory allocated inside the block (tracemalloc)."""

    def __enter__(self):
        tracemalloc.start()
        return self

    def __exit__(self, *exc):
        self.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def test_a_line_of_2000_assistant_messages_is_refused_naming_the_limit(sdk, base_version):
    data = _jsonl([_quadratic_line(2000)])
    assert 70_000 < len(data) < 100_000
    with Peak() as peak:
        upload = sdk.files.create(file=("quadratic.jsonl", data), purpose="fine-tune")
        read = _processed(sdk, upload)
        assert read.status == "error"
        assert read.status_details == (
            "line 1: 2001 messages; at most 256 per line (PRACTICUM_FINETUNE_MAX_MESSAGES_PER_LINE)"
        )
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
    assert refused.value.body["param"] == "training_file"
    assert "PRACTICUM_FINETUNE_MAX_MESSAGES_PER_LINE" in refused.value.body["message"]
    # Under the messages bound, the assistant messages one line trains on are bounded too.
    many = sdk.files.create(file=("many.jsonl", _jsonl([_quadratic_line(100)])), purpose="fine-tune")
    assert _processed(sdk, many).status_details.startswith(
        "line 1: 100 assistant messages to train on; at most 32 per line (PRACTICUM_FINETUNE_MAX_TARGETS_PER_LINE"
    )
    assert not TrainingItem.objects.exists()
    assert peak.bytes < 16 * MiB, peak.bytes  # the 2,000 items of up to 2,000 messages took 405 MB


def test_with_the_line_bounds_raised_the_item_bytes_per_job_still_hold(sdk, base_version, settings):
    settings.FINETUNE_MAX_MESSAGES_PER_LINE = settings.FINETUNE_MAX_TARGETS_PER_LINE = 5000
    settings.FINETUNE_MAX_ITEM_BYTES = 4 * MiB
    data = _jsonl([_quadratic_line(2000)])
    with Peak() as peak:
        upload = sdk.files.create(file=("quadratic.jsonl", data), purpose="fine-tune")
        assert upload.status == "uploaded"  # its lines are read after the request
        # Asked for before the file is read: the worker refuses it before building an item.
        job = sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
        failed = _prepared(sdk, job)
        # Once the file is read, the request itself is refused from what reading it found.
        assert _processed(sdk, upload).status == "processed"
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
    assert failed.status == "failed" and failed.error.param == "training_file"
    assert f"at most {4 * MiB} per job (PRACTICUM_FINETUNE_MAX_ITEM_BYTES)" in failed.error.message
    assert refused.value.body["param"] == "training_file"
    assert "PRACTICUM_FINETUNE_MAX_ITEM_BYTES" in refused.value.body["message"]
    assert not TrainingItem.objects.exists()
    assert peak.bytes < 16 * MiB, peak.bytes


def test_a_line_within_the_bounds_makes_its_items_and_counts_their_bytes(sdk, base_version, deployment):
    upload = sdk.files.create(file=("ok.jsonl", _jsonl([_quadratic_line(20)])), purpose="fine-tune")
    assert _processed(sdk, upload).status == "processed"
    job = _prepared(sdk, sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id))
    assert job.status == "queued" and job.hyperparameters.batch_size == 4  # settled from the 20 items
    items = TrainingItem.objects.filter(training_set__jobs__pk=int(job.id[6:]))
    assert sorted(len(i.messages) for i in items) == list(range(1, 21))  # item k: the k messages before it
    stored = sum(len(json.dumps(i.messages)) + len(i.corrected_response) + 2 for i in items)
    counted = FineTuningJob.objects.get().items_bytes
    assert stored <= counted < 2 * stored + 20 * 512  # an upper bound, not a guess
    assert storage_used(deployment=deployment) == len(_jsonl([_quadratic_line(20)])) + counted


def _stored(deployment) -> int:
    """Bytes the database holds for the deployment's fine-tuning data, measured from the rows."""
    files = sum(len(f.content.encode()) for f in FineTuningFile.objects.filter(api_key__deployment=deployment))
    items = TrainingItem.objects.filter(training_set__jobs__deployment=deployment)
    made = sum(
        len(json.dumps(i.messages)) + len(json.dumps(i.tools)) + len(i.corrected_response.encode()) for i in items
    )
    return files + made


@pytest.mark.parametrize("worker_first", [True, False], ids=["prepared-then-cancelled", "cancelled-while-validating"])
def test_upload_job_cancel_delete_six_times_stays_within_the_quota(
    sdk, base_version, deployment, settings, worker_first
):
    quota = settings.FINETUNE_STORAGE_MAX_BYTES = 250_000
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"Question {i}: " + "q" * 900},
                {"role": "assistant", "content": "a" * 900},
            ]
        }
        for i in range(52)
    ]
    data = _jsonl(rows)
    assert 95_000 < len(data) < 105_000  # the 100,090-byte file, near enough
    refused = []
    for _ in range(6):
        try:
            upload = sdk.files.create(file=("train.jsonl", data), purpose="fine-tune")
        except openai.BadRequestError as exc:
            refused.append(exc.body["message"])
            continue
        _processed(sdk, upload)
        try:
            job = sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
        except openai.BadRequestError as exc:
            refused.append(exc.body["message"])
        else:
            if worker_first:
                job = _prepared(sdk, job)
            if job.status in ("validating_files", "queued"):
                sdk.fine_tuning.jobs.cancel(job.id)
            else:
                refused.append(job.error.message)
            fine_tuning_job_prepare(job_id=int(job.id[6:]))  # a late delivery changes nothing
        sdk.files.delete(upload.id)
        assert _stored(deployment) <= quota
        assert storage_used(deployment=deployment) <= quota
    if worker_first:
        # The first job's items stay with it; the next rounds are told why they cannot store more.
        assert refused and all("at most 250000" in r for r in refused)
        assert _stored(deployment) > 0
    else:
        # Nothing was built, and the deleted files' content is gone with them.
        assert refused == [] and _stored(deployment) == 0 == storage_used(deployment=deployment)
    assert FineTuningFile.objects.filter(deleted_at__isnull=False).exists()  # kept for the jobs' provenance


@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_default_queue_reads_the_file_and_builds_the_training_set(sdk, base_version, celery_worker_process):
    upload = sdk.files.create(file=("ok.jsonl", _jsonl([_quadratic_line(3)] * 1)), purpose="fine-tune")
    assert upload.status == "uploaded"
    assert sdk.files.wait_for_processing(upload.id, poll_interval=0.2, max_wait_seconds=60).status == "processed"
    job = sdk.fine_tuning.jobs.create(model="tiny-base", training_file=upload.id)
    deadline = time.monotonic() + 60
    while job.status == "validating_files" and time.monotonic() < deadline:
        time.sleep(0.2)
        job = sdk.fine_tuning.jobs.retrieve(job.id)
    assert job.status == "queued", job
    assert TrainingItem.objects.filter(training_set__jobs__pk=int(job.id[6:])).count() == 3
