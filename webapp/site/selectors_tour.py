"""The guided tour's checklist, ticked from the database.

Every step asks one or two indexed `EXISTS`/`LIMIT 1` questions about one deployment, so the
page costs the same with a hundred traces or a million (no table is counted)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from urllib.parse import urlencode

from django.db.models import Q
from django.urls import NoReverseMatch, reverse

from feedback.models import Comment, CustomerFeedback, Grade, JudgeResult, JudgeStatus, Trace, TraceSource
from training.models import TrainingJob, TrainingSet
from training.promotion.models import Evaluation, PromotionRequest, PromotionStatus
from training.promotion.rollout_models import Rollout, RolloutState
from training.serving.models import Deployment, LiveVersion, ModelVersion, ModelVersionKind
from webapp.kernel.work import WorkStatus
from webapp.site.selectors import HELD_OUT_SPLITS
from webapp.site.selectors_measurements import OUTCOME_GRADE

DEFAULT_TOUR_DEPLOYMENT = "support-bot"
# What a set of the agent's episodes with corrected turns trains on, named where it is offered.
ORACLE_LABELS = "oracle labels (computed from the environment's hidden answer)"
GRADED_SHOWN = 50  # graded episodes counted at most (a LIMIT, never the table)
# While a progressive release is under way, "run the agent" sends enough episodes for the
# candidate to expect this many times its step's minimum of conversations at its share (one
# press, not dozens); at most what one run may ask (feedback.services.demo_runs.MAX_EPISODES).
ROLLOUT_TRAFFIC_FACTOR = 2
AGENT_EPISODES_MAX = 200


@dataclass(frozen=True, slots=True)
class TourStep:
    key: str
    title: str
    how: str  # what to do, in a sentence
    done: bool
    detail: str  # what the database shows for this step now
    link: str
    link_text: str
    in_progress: bool = False
    hint: str = ""  # settings to paste, shown under the step


@dataclass(slots=True)
class Tour:
    deployment: Deployment | None
    live: ModelVersion | None
    steps: list[TourStep] = field(default_factory=list)
    # `make demo`: episodes its agent has worked so far, of how many (0: not a demo run).
    demo_have: int = 0
    demo_target: int = 0
    # The progressive release under way (running or held), if any.
    rollout: Rollout | None = None

    def agent_episodes(self, default: int) -> int:
        """How many test tasks "run the agent" sends: `default`, or while a release is under
        way enough for the candidate's share of them to meet its step's minimum."""
        if self.rollout is None:
            return default
        step = self.rollout.steps[self.rollout.step]
        wanted = math.ceil(ROLLOUT_TRAFFIC_FACTOR * max(step.get("min_conversations") or 1, 1) / step["share"])
        return min(max(default, wanted), AGENT_EPISODES_MAX)

    @property
    def demo_filling(self) -> bool:
        """The demo agent is still working: the tour is not ready to start yet."""
        return self.demo_have < self.demo_target

    @property
    def done_count(self) -> int:
        return sum(step.done for step in self.steps)

    @property
    def current(self) -> TourStep | None:
        """The first step not done yet: the one the page points at."""
        return next((step for step in self.steps if not step.done), None)

    @property
    def trained_live(self) -> bool:
        """The live version is one a training job here produced (not a base model)."""
        return self.live is not None and self.live.kind != ModelVersionKind.BASE


def tour_deployment(*, name: str | None) -> Deployment | None:
    """The deployment the tour follows: the one named, else the demo's, else the first."""
    if name:
        return Deployment.objects.filter(name=name).first()
    return (
        Deployment.objects.filter(name=DEFAULT_TOUR_DEPLOYMENT).first() or Deployment.objects.order_by("name").first()
    )


def demo_readiness(*, deployment: Deployment | None, target: int) -> int:
    """How many of the demo agent's `target` episodes have arrived (each is one gateway
    trace); counted with a LIMIT, so never more than `target` rows are read."""
    if deployment is None or target <= 0:
        return 0
    return Trace.objects.filter(deployment=deployment, source=TraceSource.GATEWAY).values("id")[:target].count()


def tour_get(*, deployment: Deployment | None, demo_target: int = 0) -> Tour:
    """The tour's checklist for `deployment`: each step done or not, from what is stored;
    with `demo_target`, how far `make demo`'s agent has got."""
    if deployment is None:
        return Tour(deployment=None, live=None, demo_target=demo_target)
    live_row = LiveVersion.objects.select_related("version").filter(deployment=deployment).first()
    live = live_row.version if live_row else None
    traces = Trace.objects.filter(deployment=deployment)
    trace_list = f"{reverse('feedback:trace-list')}?deployment={deployment.pk}"
    first_trace = traces.order_by("-started_at", "-id").only("id").first()
    # The trace to comment on is one the agent may learn from: never a held-out task's (the
    # test split and fresh slices measure the candidate), when there is another.
    to_review = (
        # (has_key too: a plain exclude would also drop the traces that name no split.)
        traces.exclude(Q(metadata__has_key="split") & Q(metadata__split__in=HELD_OUT_SPLITS))
        .order_by("-started_at", "-id")
        .only("id")
        .first()
        or first_trace
    )

    steps: list[TourStep] = []
    steps.append(
        TourStep(
            key="traces",
            title="Browse the agent's traces",
            how="Open the trace list, filter it, and open a conversation: the chat, its tool calls and results.",
            done=first_trace is not None,
            detail="traces have arrived" if first_trace else "no traces yet: run the demo agent",
            link=trace_list,
            link_text="Trace list",
        )
    )

    comment = Comment.objects.filter(trace__deployment=deployment).select_related("author").order_by("-id").first()
    customer = CustomerFeedback.objects.filter(trace__deployment=deployment).exists()
    steps.append(
        TourStep(
            key="comment",
            title="Comment on a turn",
            how="Select a reply that went wrong and say in plain words what it should have done (key c).",
            done=comment is not None,
            detail=(
                f"latest comment by {comment.author.username if comment.author else 'someone'}"
                if comment
                else "no operator comment yet" + (" (customers have sent feedback)" if customer else "")
            ),
            link=reverse("feedback:trace-detail", args=[to_review.pk]) if to_review else trace_list,
            link_text="Open a trace" if to_review else "Trace list",
        )
    )

    judged = JudgeResult.objects.filter(trace__deployment=deployment, is_latest=True)
    latest_ok = judged.filter(status=JudgeStatus.SUCCEEDED).order_by("-id").first()
    pending = judged.filter(status__in=[JudgeStatus.PENDING, JudgeStatus.RUNNING]).exists()
    failed = None if latest_ok or pending else judged.filter(status=JudgeStatus.FAILED).order_by("-id").first()
    steps.append(
        TourStep(
            key="judge",
            title="Let the judge turn the words into signal",
            how=(
                "Press “Judge this turn” under the commented turn (automatic when PRACTICUM_JUDGE_AUTO is on), "
                "or run a backfill on the Judge page: a rubric, a reward and a corrected reply."
            ),
            done=latest_ok is not None,
            detail=(
                f"latest reward {latest_ok.reward:.2f} under a rubric of {_criteria(latest_ok.rubric)}"
                if latest_ok and latest_ok.reward is not None
                else (
                    "a judgement is running"
                    if pending
                    else (
                        f"the latest judgement failed ({failed.error[:160]}): judge again, or connect a stronger judge"
                        if failed
                        else "no judgement yet"
                    )
                )
            ),
            link=reverse("feedback:judge"),
            link_text="Judge",
            in_progress=pending and latest_ok is None,
        )
    )

    # The step's own artefact: a set built from feedback (the dashboard's filters or a queue,
    # not a file, the agent's episodes or a task list) whose items are commented turns.
    sets = comment_sets(deployment=deployment)
    latest_set = sets.order_by("-created_at", "-id").first()
    other_set = (
        None
        if latest_set
        else TrainingSet.objects.filter(Q(deployment=deployment) | Q(items__trace__deployment=deployment))
        .order_by("-created_at", "-id")
        .first()
    )
    commented = urlencode({"filters": f"comment=yes&deployment={deployment.pk}"})
    steps.append(
        TourStep(
            key="training_set",
            title="Build a training set from the operators' comments",
            how=(
                "On Training, “Build a training set from feedback” comes filled in with this deployment's commented "
                "traces: each commented turn becomes an item with its context and the comment (and the judge's "
                "rubric and correction where it judged; those need its training gate open, Judge → Agreement, or "
                "an override with a reason). The other form builds a set from the agent's graded episodes with "
                f"{ORACLE_LABELS}: a measuring stick, not what operators give."
            ),
            done=latest_set is not None,
            detail=(
                f"{latest_set} ({_set_source(latest_set)}): {latest_set.train_count} to train on, "
                f"{latest_set.heldout_count} held out"
                if latest_set
                else "no set built from commented turns yet"
                + (f" ({other_set} came from {_set_source(other_set)}: not this step's)" if other_set else "")
            ),
            link=reverse("training:job-list") + f"?{commented}#build-set",
            link_text="Training",
        )
    )

    # A job on such a set: one on a fine-tuning file or an episode set is another story.
    jobs = TrainingJob.objects.filter(training_set__in=sets.values("pk"))
    finished = jobs.filter(status=WorkStatus.FINISHED, result_version__isnull=False).order_by("-finished_at").first()
    active = jobs.filter(status__in=[WorkStatus.QUEUED, WorkStatus.RUNNING]).order_by("-created_at").first()
    steps.append(
        TourStep(
            key="job",
            title="Start a job and watch it learn",
            how=(
                "Self-distillation from the live version on the comments set: the model answers without the "
                "comment and is pulled toward itself reading the comment as a hint. The job page draws loss, KL "
                "and length as it goes. These settings (the ones make learn-from-comments trains) go in the JSON "
                "box. GRPO scores fresh samples with the judge under each comment instead; SFT on an episode set "
                f"with corrected turns ({ORACLE_LABELS}) is what make tour-demo measures, with "
                f"{episode_job_settings()}."
            ),
            hint=comment_job_settings(),
            done=finished is not None,
            detail=(
                f"job {finished.pk} finished: candidate {finished.result_version.name}"
                if finished
                else (
                    f"job {active.pk}: step {active.step}/{active.total_steps}"
                    if active
                    else "no finished job on a set of commented turns yet"
                )
            ),
            link=reverse("training:job-detail", args=[(finished or active).pk])
            if (finished or active)
            else reverse("training:job-list") + "?kind=distill#job-form",
            link_text="The job" if (finished or active) else "Training",
            in_progress=finished is None and active is not None,
        )
    )

    evaluations = Evaluation.objects.filter(deployment=deployment).select_related("candidate", "baseline")
    evaluation = evaluations.filter(status=WorkStatus.FINISHED).order_by("-created_at", "-id").first()
    running_eval = evaluations.filter(status__in=[WorkStatus.QUEUED, WorkStatus.RUNNING]).first()
    win = (evaluation.summary or {}).get("comparison", {}).get("win_rate") if evaluation else None
    steps.append(
        TourStep(
            key="evaluate",
            title="Evaluate the candidate against the live version",
            how="On Models, pick the candidate and the set's held-out items; read the report side by side.",
            done=evaluation is not None,
            detail=(
                f"{evaluation.candidate.name} vs {evaluation.baseline.name}"
                + (f": win rate {100 * win:.0f}%" if isinstance(win, int | float) else "")
                if evaluation
                else ("an evaluation is running" if running_eval else "no finished evaluation yet")
            ),
            link=reverse("promotion:evaluation", args=[(evaluation or running_eval).pk])
            if (evaluation or running_eval)
            else reverse("promotion:models"),
            link_text="The evaluation" if (evaluation or running_eval) else "Models",
            in_progress=evaluation is None and running_eval is not None,
        )
    )

    promotions = PromotionRequest.objects.filter(deployment=deployment).select_related("candidate", "decided_by")
    approved = (
        promotions.filter(status__in=[PromotionStatus.APPROVED, PromotionStatus.DEPLOYED])
        .order_by("-decided_at", "-id")
        .first()
    )
    pending_request = promotions.filter(status=PromotionStatus.PENDING).order_by("-id").first()
    shown = approved or pending_request
    # Approved with a release plan: the candidate takes its traffic in steps (the release page).
    rollout = (
        Rollout.objects.filter(deployment=deployment, state__in=(RolloutState.RUNNING, RolloutState.HELD))
        .select_related("candidate")
        .first()
    )
    in_steps = rollout if rollout is not None and approved is not None and rollout.promotion_id == approved.pk else None
    steps.append(
        TourStep(
            key="promote",
            title="Request the promotion; another person approves it",
            how=(
                "The operator asks with a note; the approver (not the requester) approves and the release goes "
                "live, at once or in the steps of a release plan."
            ),
            done=approved is not None and approved.status == PromotionStatus.DEPLOYED,
            detail=(
                f"{approved.candidate.name} approved by {approved.decided_by.username if approved.decided_by else '?'}"
                + (
                    f" — in steps: {_share(in_steps.share)} of new conversations, step {in_steps.step + 1} of "
                    f"{len(in_steps.steps)} ({in_steps.get_state_display().lower()}; plan {in_steps.plan.get('name')})"
                    if in_steps
                    else f" — {approved.get_status_display().lower()}"
                )
                if approved
                else (
                    f"{pending_request.candidate.name} waits for an approver" if pending_request else "no request yet"
                )
            ),
            link=(
                reverse("promotion:rollout", args=[in_steps.pk])
                if in_steps
                else reverse("promotion:promotion", args=[shown.pk])
                if shown
                else reverse("promotion:promotion-list")
            ),
            link_text="The release" if in_steps else "The request" if shown else "Promotion requests",
            in_progress=approved is not None and approved.status == PromotionStatus.APPROVED,
        )
    )

    # The agent's run: its episodes (traces of a task) served by the trained version since
    # it went live; a single call through the gateway is not a run of the agent.
    trained_live = live is not None and live.kind != ModelVersionKind.BASE
    episodes_of_live = (
        traces.filter(model_version=live, started_at__gte=live_row.changed_at, metadata__has_key="task_id")
        if trained_live
        else traces.none()
    )
    served_by_live = episodes_of_live.order_by("-started_at", "-id").only("id").first() if trained_live else None
    steps.append(
        TourStep(
            key="rerun",
            title="Run the agent again",
            how="Send the agent test tasks (never trained on) through the gateway: the live version answers them now.",
            done=served_by_live is not None,
            detail=(
                f"episodes served by {live.name} since it went live have arrived"
                if served_by_live
                else f"{rollout.candidate.name} answers {_share(rollout.share)} of new conversations, "
                f"{live.name if live else 'the live version'} the others: the agent's episodes are the traffic "
                "that walks the release's steps"
                if rollout is not None
                else (
                    f"{live.name} is live; no episode of the agent served by it yet"
                    if trained_live
                    else (f"{live.name} is live, not a trained version yet" if live else "no live version")
                )
            ),
            link=f"{trace_list}&version={live.pk}" if live is not None else trace_list,
            link_text=f"Traces of {live.name}" if live is not None else "Trace list",
        )
    )

    # What the overview compares: graded episodes of the new version beside another's.
    graded = Grade.objects.filter(deployment=deployment, name=OUTCOME_GRADE)
    graded_live = (
        graded.filter(trace__in=episodes_of_live.values("pk")).values("id")[:GRADED_SHOWN].count()
        if trained_live
        else 0
    )
    graded_other = (
        graded_live and graded.filter(trace__model_version__isnull=False).exclude(trace__model_version=live).exists()
    )
    overview = _overview_url()
    steps.append(
        TourStep(
            key="overview",
            title="See the improvement",
            how=(
                "The overview charts success rate per model version over time, and sets the candidate "
                "beside the base run by run on the same test tasks: success and collateral changes "
                "(writes to other customers' orders), with intervals over seeds."
            ),
            done=bool(graded_live and graded_other),
            detail=(
                f"{graded_live}{'+' if graded_live == GRADED_SHOWN else ''} graded episodes of {live.name}, "
                "beside another version's"
                if graded_live and graded_other
                else (
                    f"{graded_live} graded episodes of {live.name}; none of another version to compare"
                    if graded_live
                    else "needs graded episodes of the new version (run the agent again)"
                )
            ),
            link=overview or trace_list,
            link_text="Overview" if overview else "Trace list",
        )
    )
    return Tour(
        deployment=deployment,
        live=live,
        steps=steps,
        demo_have=demo_readiness(deployment=deployment, target=demo_target),
        demo_target=demo_target,
        rollout=rollout,
    )


def _share(share: float) -> str:
    return f"{100 * share:g} %"


def comment_sets(*, deployment: Deployment):
    """The deployment's training sets built from operators' comments: from feedback (the
    dashboard's filters or a queue; not a file, episodes, tasks or a slice), holding at
    least one commented turn."""
    return (
        TrainingSet.objects.filter(Q(deployment=deployment) | Q(items__trace__deployment=deployment))
        .filter(selection__has_key="filters")
        .exclude(selection__has_key="kind")
        .filter(items__message__comments__isnull=False)
        .distinct()
    )


def comment_job_settings() -> str:
    """The settings of the self-distillation job `make learn-from-comments` trains on the
    operators' comments (scripts/learn_from_comments.py; a test keeps the two the same)."""
    config = {
        "steps": 40,
        "prompts_per_step": 4,
        "samples_per_prompt": 2,
        "max_new_tokens": 48,
        "temperature": 0.7,
        "learning_rate": 5e-4,
        "lora_rank": 16,
        "trainable_layers": 6,
    }
    return json.dumps(config)


def _set_source(training_set: TrainingSet) -> str:
    selection = training_set.selection if isinstance(training_set.selection, dict) else {}
    if selection.get("kind") == "episodes":
        return ORACLE_LABELS if selection.get("targets") else "the agent's graded episodes"
    if selection.get("filters") is not None or selection.get("queue"):
        return "operators' feedback"
    return "imported"


def episode_job_settings() -> str:
    """The settings of the SFT job the tour's measurement (`make tour-demo`) trains the demo
    agent's episodes with: each logged turn's accepted action as the corrected response,
    LoRA on the top blocks, about four passes over two hundred turns."""
    config = {
        "steps": 200,
        "prompts_per_step": 4,
        "learning_rate": 5e-4,
        "lora_rank": 16,
        "trainable_layers": 6,
    }
    return json.dumps(config)


def _criteria(rubric) -> str:
    criteria = (rubric or {}).get("criteria", []) if isinstance(rubric, dict) else (rubric or [])
    return f"{len(criteria)} criterion" if len(criteria) == 1 else f"{len(criteria)} criteria"


def _overview_url() -> str:
    try:
        return reverse("overview")
    except NoReverseMatch:
        return ""
