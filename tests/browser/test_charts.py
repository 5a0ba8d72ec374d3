"""Charts drawn with the vendored uPlot: the job page's training and validation lines with
their axes, hover values and checkpoints marked; the overview's traces per day as bars; the
deployment story's success per day on an axis that fits its data. At 1400 and 390 px wide,
without the page scrolling sideways, under the site's Content-Security-Policy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.factories import user_with_role
from training.models import JobEventKind, TrainingJob, TrainingJobEvent
from training.services.training_sets import training_set_from_tasks
from training.serving.models import BaseModel, ModelVersion
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
WIDTHS = (1400, 390)


@pytest.fixture
def finished_job():
    base = BaseModel.objects.create(name="tiny", path="/models/tiny")
    version = ModelVersion.objects.create(name="tiny-base", base_model=base, kind="base", path="/models/tiny")
    training_set = training_set_from_tasks(
        name="qa", tasks=[{"prompt": f"q{i}", "reference": "a", "grader": "exact"} for i in range(10)]
    )
    started = timezone.now() - timedelta(minutes=30)
    job = TrainingJob.objects.create(
        kind="grpo",
        status=WorkStatus.FINISHED,
        config={"kind": "grpo", "steps": 20, "eval_every": 10},
        base_version=version,
        training_set=training_set,
        step=20,
        total_steps=20,
        started_at=started,
    )
    for step in range(1, 21):
        TrainingJobEvent.objects.create(
            job=job,
            kind=JobEventKind.STEP,
            step=step,
            created_at=started + timedelta(seconds=40 * step),
            data={
                "reward_mean": 0.2 + 0.03 * step,
                "reward_std": 0.1,
                "loss": 1.0 / step,
                "kl": 0.002 * step,
                "response_length": 40 - step / 2,
                "zero_variance_share": 0.5 - step / 50,
                "step_seconds": 40.0,
            },
        )
    for step, reward in ((0, 0.25), (10, 0.45), (20, 0.6)):
        TrainingJobEvent.objects.create(
            job=job,
            kind=JobEventKind.EVAL,
            step=step,
            data={"reward": reward, "success": reward, "response_length": 35},
        )
    for step in (10, 20):
        TrainingJobEvent.objects.create(
            job=job, kind=JobEventKind.LOG, step=step, data={"message": f"checkpoint at step {step}"}
        )
    return job


def marker_drawn(page, figure: str, step: int) -> bool:
    """Whether a marker's grey dashes are on the plot at `step` (read off the canvas, below
    the markers' labels)."""
    return page.evaluate(
        """([figure, step]) => {
            const u = document.querySelector(figure).uplot;
            const x = Math.round(u.valToPos(step, "x", true));
            const below = Math.round(40 * uPlot.pxRatio);
            const pixels = u.ctx.getImageData(x, u.bbox.top + below, 1, u.bbox.height - below).data;
            for (let i = 0; i < pixels.length; i += 4) {
                const [r, g, b, a] = pixels.slice(i, i + 4);
                if (a > 0 && Math.abs(r - 0x86) < 30 && Math.abs(g - 0x8e) < 30 && Math.abs(b - 0x96) < 30) return true;
            }
            return false;
        }""",
        [figure, step],
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_the_job_page_draws_training_and_validation_lines_with_axes_hover_and_checkpoints(
    open_page, screenshot, finished_job, width
):
    page = open_page(user_with_role("operator", "olga"), width=width)
    page.goto(f"/training/jobs/{finished_job.pk}/")
    reward = page.locator("#chart-reward_mean-figure")
    reward.locator("canvas").wait_for()
    page.locator("#live .charts").scroll_into_view_if_needed()
    assert page.locator("figure.uchart canvas").count() == 5
    # Two axes, each labelled; the legend names both lines.
    assert reward.locator(".u-axis").count() == 2
    labels = reward.locator(".u-legend .u-series th").all_inner_texts()
    assert [t.strip() for t in labels] == ["step", "training", "validation (held out)"]
    # The chart takes its box's width, whatever the page's.
    box, plot = reward.bounding_box(), reward.locator("canvas").bounding_box()
    assert plot["width"] > 0.85 * (box["width"] - 20) and plot["x"] + plot["width"] <= box["x"] + box["width"] + 1
    assert page.evaluate("document.documentElement.scrollWidth") <= width

    # Hovering a point shows its step, when it ran, and both lines' values there.
    u = reward.locator(".u-over")
    over = u.bounding_box()
    x = page.evaluate("() => document.querySelector('#chart-reward_mean-figure').uplot.valToPos(10, 'x')")
    page.mouse.move(over["x"] + x, over["y"] + over["height"] / 2)
    values = reward.locator(".u-legend .u-series .u-value").all_inner_texts()
    assert values[0] == "10 · 6 min 40 s in"  # the step, and how far into the job it ran
    assert values[1] == "0.5" and values[2] == "0.45"
    if width == 1400:
        screenshot(page, "training-job-charts", element=page.locator("#live .charts"))
    else:
        screenshot(page, "training-job-charts-390", element=reward)
    # The checkpoints at steps 10 and 20 are marked on the plot; step 5 has none.
    assert marker_drawn(page, "#chart-reward_mean-figure", 10) and marker_drawn(page, "#chart-loss-figure", 20)
    assert not marker_drawn(page, "#chart-reward_mean-figure", 5)


def test_a_running_jobs_charts_take_new_steps_in_place(open_page, finished_job):
    TrainingJob.objects.filter(pk=finished_job.pk).update(status=WorkStatus.RUNNING, step=20, total_steps=30)
    page = open_page(user_with_role("operator", "olga"), width=1400)
    page.goto(f"/training/jobs/{finished_job.pk}/")
    page.locator("#chart-loss-figure canvas").wait_for()
    page.evaluate("() => { document.querySelector('#chart-loss-figure').dataset.mark = 'kept'; }")
    TrainingJobEvent.objects.create(job=finished_job, kind=JobEventKind.STEP, step=21, data={"loss": 0.01})
    page.wait_for_function(
        "() => document.querySelector('#chart-loss-figure').uplot.data[0].includes(21)", timeout=10_000
    )
    # The same figure and plot: the live page did not redraw it from scratch.
    assert page.evaluate("() => document.querySelector('#chart-loss-figure').dataset.mark") == "kept"


@pytest.fixture
def one_day_of_traffic(tmp_path):
    """A deployment whose live version served graded traffic on one day only."""
    from tests.factories import DeploymentFactory
    from tests.test_overview import graded_traces
    from training.serving.services import live_version_set

    deployment = DeploymentFactory(name="support-bot")
    base = BaseModel.objects.create(name="smol", path=str(tmp_path))
    version = ModelVersion.objects.create(name="smol", base_model=base, kind="base", path=str(tmp_path))
    live_version_set(deployment=deployment, version=version)
    graded_traces(deployment, version, [True, True, False, True])
    return deployment


def tick_gaps(page, figure: str) -> list[float]:
    """The distances in CSS pixels between the x axis's consecutive labels."""
    return page.evaluate(
        """(figure) => {
            const u = document.querySelector(figure).uplot;
            const xs = u.axes[0]._splits.map((v) => u.valToPos(v, "x"));
            return xs.slice(1).map((x, i) => x - xs[i]);
        }""",
        figure,
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_the_story_axis_fits_its_one_day_and_its_labels_keep_apart(open_page, screenshot, one_day_of_traffic, width):
    page = open_page(user_with_role("operator", "olga"), width=width)
    page.goto("/overview/support-bot/story/?days=90")
    figure = "#chart-story-figure"
    page.locator(f"{figure} canvas").wait_for()
    # A week around the day, not 90 days with the day at the edge.
    span = page.evaluate(
        f"() => {{ const u = document.querySelector('{figure}').uplot; return u.scales.x.max - u.scales.x.min; }}"
    )
    assert span == 7 * 86_400
    day = page.evaluate(f"() => document.querySelector('{figure}').uplot.data[0][0]")
    position = page.evaluate(
        f"() => {{ const u = document.querySelector('{figure}').uplot; return u.valToPos({day}, 'x') / u.bbox.width * devicePixelRatio; }}"
    )
    assert 0.3 < position < 0.7
    assert min(tick_gaps(page, figure)) >= 50  # date labels do not run into each other
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    if width == 1400:
        screenshot(page, "deployment-story-chart", element=page.locator("#success-curve"))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_overview_draws_traces_per_day_as_bars(open_page, one_day_of_traffic, width):
    page = open_page(user_with_role("operator", "olga"), width=width)
    page.goto("/overview/")
    figure = f"#chart-traffic-{one_day_of_traffic.pk}-figure"
    page.locator(f"{figure} canvas").wait_for()
    assert page.evaluate(f"() => document.querySelector('{figure}').uplot.data[1].slice(-1)[0]") == 4
    assert min(tick_gaps(page, figure)) >= 50
    box = page.locator(figure).bounding_box()
    assert box["x"] + box["width"] <= width
    wide = page.evaluate(
        """(width) => [...document.querySelectorAll("main *")]
            .filter((e) => e.getBoundingClientRect().right > width + 1 && !e.closest(".scroll-x"))
            .map((e) => e.tagName + "." + e.className).slice(0, 5)""",
        width,
    )
    assert wide == [] and page.evaluate("document.documentElement.scrollWidth") <= width
