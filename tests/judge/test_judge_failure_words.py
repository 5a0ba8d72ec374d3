"""A judge's failures in words with their fix, a prompt fitted to a small judge's context,
and judgements of a judge the agreement gate has not passed shown as unverified on every
page and in the API that lists them."""

from __future__ import annotations

import json
import random

import pytest

from feedback.judge.failures import JUDGE_DOCS, failure_explained
from feedback.judge.prompts import FeedbackItem
from feedback.judge.scoring import judge_turn, prompt_chars
from feedback.models import JudgeResult, JudgeStatus
from feedback.services.judging import judge_run
from feedback.services.review import comment_add
from tests.fixtures.judge import Reply, user_prompt
from tests.judge.conftest import VALID_JUDGEMENT

pytestmark = pytest.mark.django_db

# What vLLM answers when the prompt and max_tokens do not fit in the model's context.
CONTEXT_ERROR = json.dumps(
    {
        "error": {
            "message": "This model's maximum context length is 2048 tokens. However, you requested 2623 tokens "
            "(2223 in the messages, 400 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "code": 400,
        }
    }
)


def test_a_context_too_small_for_the_turn_is_said_in_words_on_the_pages_and_in_the_api(
    make_trace, operator, judge_settings, client, deployment
):
    from feedback.services.api_keys import api_key_create

    trace = make_trace()
    comment_add(message=trace.messages.get(position=4), author=operator, body="It should give the tracking number.")
    judge_settings.script(Reply.error(400, CONTEXT_ERROR))
    result = judge_run(result=JudgeResult.objects.get())

    assert result.status == JudgeStatus.FAILED
    assert result.error.startswith("the judge model's context is too small for this turn — connect a judge")
    assert JUDGE_DOCS in result.error and "PRACTICUM_JUDGE_CONTEXT_TOKENS" in result.error
    # The endpoint's own words follow, not its JSON envelope.
    assert "maximum context length is 2048 tokens" in result.error
    assert '{"error"' not in result.error
    assert len(judge_settings.requests) == 1  # a 400 is not asked again

    client.force_login(operator)
    for page in ("/judge/", f"/traces/{trace.pk}/", f"/judge/results/{result.pk}/"):
        html = client.get(page).content.decode()
        assert "the judge model&#x27;s context is too small for this turn" in html, page
    key = api_key_create(deployment=deployment, scopes=["read"]).plaintext
    data = client.get(f"/api/v1/traces/{trace.pk}/judgements", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert data["judgements"][0]["failure_reason"] == result.error


@pytest.mark.parametrize(
    ("detail", "words"),
    [
        ("HTTP 401: bad key (after 1 attempt)", "the judge endpoint refused the key — check PRACTICUM_JUDGE_API_KEY"),
        ("HTTP 404: no such model (after 1 attempt)", "the judge endpoint does not know this model or path"),
        ("connection failed: refused (after 3 attempts)", "the judge endpoint does not answer"),
        ("timed out after 60 s (after 3 attempts)", "the judge took too long — raise PRACTICUM_JUDGE_TIMEOUT_S"),
        (
            "output cut off at max_tokens (400) (after 2 attempts)",
            "the judge's answer was cut off at its token limit — raise PRACTICUM_JUDGE_MAX_TOKENS",
        ),
        ("output is not JSON: Expecting value (after 3 attempts)", "the judge did not answer in the required JSON"),
        ("something new (after 1 attempt)", "the judge call failed"),
    ],
)
def test_each_kind_of_failure_says_what_fixes_it_and_keeps_the_judges_words(detail, words):
    explained = failure_explained(detail)
    assert explained.startswith(words) and explained.endswith(f"The judge said: {detail}")
    assert failure_explained(explained) == explained  # explained once, however often it is passed on


def test_a_judge_with_a_small_context_gets_the_conversation_trimmed_to_fit(judge_settings):
    long_history = [{"role": "system", "content": "You are Acme's support agent."}]
    for i in range(40):
        long_history += [
            {"role": "user", "content": f"Question {i} about order A{i}, " + "with many details " * 10},
            {"role": "assistant", "content": f"Answer {i}: " + "a long reply " * 10},
        ]
    long_history.append({"role": "user", "content": "So where is my parcel for order A1?"})
    turn = {"role": "assistant", "content": "It has shipped."}
    feedback = [FeedbackItem(kind="comment", text="It should give the tracking number.")]
    small = judge_settings.endpoint(context_tokens=2048, max_tokens=400)
    judge_settings.script(Reply.json(VALID_JUDGEMENT), Reply.json(VALID_JUDGEMENT))

    judge_turn(context=long_history, turn=turn, feedback=feedback, endpoint=small)
    sent = judge_settings.requests[-1]["messages"]
    assert sum(len(m["content"]) for m in sent) <= prompt_chars(small)
    prompt = user_prompt(judge_settings.requests[-1])
    # The start and the end of the conversation, the turn and the comment are kept.
    assert "You are Acme" in prompt and "So where is my parcel for order A1?" in prompt
    assert "earlier messages omitted" in prompt and "tracking number" in prompt and "It has shipped." in prompt

    # A judge whose context is not known is sent everything (up to the fixed cap).
    judge_turn(context=long_history, turn=turn, feedback=feedback, endpoint=small.with_(context_tokens=0))
    assert "earlier messages omitted" not in user_prompt(judge_settings.requests[-1])

    # A judge that chooses actions is fitted the same way.
    chosen = {"rationale": "Give the tracking number.", "action": {"kind": "reply", "text": "Tracking: TN1."}}
    judge_settings.script(Reply.json({**chosen, "reward": 0.0}))
    judge_turn(context=long_history, turn=turn, feedback=feedback, endpoint=small.with_(correction_mode="actions"))
    sent = judge_settings.requests[-1]["messages"]
    assert sum(len(m["content"]) for m in sent) <= prompt_chars(small)
    assert "earlier messages omitted" in user_prompt(judge_settings.requests[-1])


def test_a_judgement_is_unverified_until_its_judges_agreement_gate_passes(
    make_trace, operator, judge_settings, client, deployment, settings
):
    from feedback.services.api_keys import api_key_create
    from feedback.services.judge_gate import judge_calibration_run
    from tests.judge.test_training_gate import honest_judge, rated_turn

    settings.JUDGE_MAX_ATTEMPTS = 1
    trace = make_trace()
    comment_add(message=trace.messages.get(position=4), author=operator, body="It should give the tracking number.")
    judge_settings.script(Reply.json(VALID_JUDGEMENT))
    result = judge_run(result=JudgeResult.objects.get())
    assert result.status == JudgeStatus.SUCCEEDED

    client.force_login(operator)
    key = api_key_create(deployment=deployment, scopes=["read"]).plaintext

    def shown() -> tuple[list[bool], str | None]:
        pages = [client.get(p).content.decode() for p in ("/judge/", f"/traces/{trace.pk}/")]
        detail = client.get(f"/judge/results/{result.pk}/").content.decode()
        api = client.get(f"/api/v1/traces/{trace.pk}/judgements", HTTP_AUTHORIZATION=f"Bearer {key}").json()
        return [">unverified</span>" in html for html in [*pages, detail]], api["judgements"][0]["unverified"]

    badges, api_says = shown()
    assert badges == [True, True, True]
    assert api_says.startswith("the judge's agreement gate has not passed: only 0 rated turns")

    # Calibrated against operators' ratings (kappa and order-swap checks), the gate passes.
    for n in range(20):
        rated_turn(deployment, operator, good=True, n=n)
        rated_turn(deployment, operator, good=False, n=100 + n)
    JudgeResult.objects.update(judge_base_url=judge_settings.base_url)  # all of this one judge
    judge_settings.respond_with(honest_judge())
    judge_calibration_run(deployment=deployment, rng=random.Random(0))
    badges, api_says = shown()
    assert badges == [False, False, False] and api_says is None


def test_a_backfill_that_failed_says_why_beside_its_count(make_trace, operator, judge_settings, client):
    from feedback.services.judge_jobs import judge_job_create, judge_job_run

    for i in range(2):
        trace = make_trace(external_id=f"conv-{i}")
        comment_add(message=trace.messages.get(position=4), author=operator, body="It should give the tracking number.")
    JudgeResult.objects.all().delete()  # the comments queued judgements; the backfill judges them
    judge_settings.respond_with(lambda request: Reply.error(400, CONTEXT_ERROR))
    job = judge_job_create(created_by=operator, limit=10)
    judge_job_run(job=job)

    client.force_login(operator)
    html = client.get("/judge/").content.decode()
    assert '2/2 · <span class="error">2 failed</span>' in html
    assert "latest: the judge model&#x27;s context is too small for this turn" in html
