"""Annotation queues: built from a filter, worked one locked item at a time."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.utils import timezone

from feedback.models import AnnotationQueue, QueueItem
from feedback.selectors.queues import queue_progress
from feedback.selectors.trace_list import traces_filtered
from feedback.services.queues import QueueItemNotHeld, queue_create, queue_item_done, queue_item_skip, queue_next_item
from tests.factories import user_with_role
from webapp.kernel.roles import ROLES

pytestmark = pytest.mark.django_db


@pytest.fixture
def five(deployment, ingest):
    return ingest(
        deployment,
        *[
            {
                "external_id": f"q{i}",
                "environment": "web" if i % 2 else "phone",
                "messages": [{"role": "user", "content": "hi"}],
            }
            for i in range(5)
        ],
    )


def test_roles_are_groups_with_their_permissions(db):
    for role in ROLES:
        assert Group.objects.filter(name=role).exists()
    approver = user_with_role("approver", "amy")
    assert approver.has_perm("training.approve_promotion")
    assert not approver.has_perm("feedback.add_comment")
    reviewer = user_with_role("reviewer", "rob")
    assert reviewer.has_perm("feedback.work_annotationqueue") and not reviewer.has_perm("feedback.view_trace")
    admin = user_with_role("admin", "ada")
    assert admin.has_perm("feedback.delete_trace") and admin.has_perm("training.approve_promotion")
    assert Permission.objects.filter(codename="approve_promotion", content_type__app_label="training").count() == 1


def test_a_queue_is_a_snapshot_of_the_filtered_list(five, operator):
    queue = queue_create(
        name="phone calls",
        traces=traces_filtered({"environment": "phone"}),
        filters={"environment": ["phone"]},
        created_by=operator,
        limit=2,
    )
    items = list(queue.items.order_by("position").select_related("trace"))
    assert queue.item_count == 2 and [i.trace.external_id for i in items] == ["q4", "q2"]


def test_reviewers_get_different_items_locks_expire_and_skips_stick(five, operator, reviewer):
    other = user_with_role("reviewer", "ravi")
    queue = queue_create(name="all", traces=traces_filtered({}), filters={}, created_by=operator, lock_minutes=10)
    now = timezone.now()
    mine = queue_next_item(queue=queue, user=reviewer, now=now)
    theirs = queue_next_item(queue=queue, user=other, now=now)
    assert mine.pk != theirs.pk
    # Asking again returns the item already held, not a new one.
    assert queue_next_item(queue=queue, user=reviewer, now=now + timedelta(minutes=1)).pk == mine.pk
    with pytest.raises(QueueItemNotHeld):
        queue_item_done(item=mine, user=other, now=now)
    # After the lock runs out, someone else may take it.
    later = now + timedelta(minutes=30)
    taken = queue_next_item(queue=queue, user=other, now=later)
    assert taken.pk in (mine.pk, theirs.pk)
    queue_item_done(item=taken, user=other, now=later)
    skipped = queue_next_item(queue=queue, user=reviewer, now=later)
    queue_item_skip(item=skipped, user=reviewer, now=later)
    after_skip = queue_next_item(queue=queue, user=reviewer, now=later)
    assert after_skip.pk != skipped.pk
    queue_item_done(item=after_skip, user=reviewer, now=later)
    # The skipped item is still there for someone else.
    assert queue_next_item(queue=queue, user=operator, now=later).pk == skipped.pk

    done, reviewers = queue_progress(queue)
    assert done == 2
    by_name = {r.username: r for r in reviewers}
    assert (by_name["rita"].done, by_name["rita"].skipped) == (1, 1)
    assert by_name["ravi"].done == 1
    assert by_name["olga"].holding == 1


def test_working_a_queue_through_the_pages(client, five, operator, reviewer):
    client.force_login(operator)
    response = client.post("/queues/new", {"name": "web chats", "limit": 10, "lock_minutes": 5, "environment": "web"})
    queue = AnnotationQueue.objects.get()
    assert (
        response.url == f"/queues/{queue.pk}/" and queue.item_count == 2 and queue.filters == {"environment": ["web"]}
    )

    client.force_login(reviewer)
    assert client.get("/queues/").status_code == 200
    first = client.post(f"/queues/{queue.pk}/next")
    item = QueueItem.objects.get(locked_by=reviewer)
    assert first.url == f"/queues/{queue.pk}/items/{item.pk}/"
    page = client.get(first.url)
    assert page.status_code == 200 and 'id="queue-done"' in page.content.decode()
    # The reviewer sees this trace only through the queue.
    other_trace = QueueItem.objects.exclude(pk=item.pk).get().trace
    assert client.get(f"/traces/{other_trace.id}/").status_code == 403
    assert client.get(f"/traces/{item.trace_id}/").status_code == 200
    # and may comment on it.
    message = item.trace.messages.get(position=0)
    assert client.post(f"/traces/{item.trace_id}/messages/0/comments", {"body": "rude"}).status_code == 302
    assert message.comments.get().body == "rude"

    second = client.post(f"/queues/{queue.pk}/items/{item.pk}/done")
    nxt = QueueItem.objects.get(locked_by=reviewer)
    assert second.url == f"/queues/{queue.pk}/items/{nxt.pk}/"
    end = client.post(f"/queues/{queue.pk}/items/{nxt.pk}/skip")
    assert end.url == f"/queues/{queue.pk}/"
    detail = client.get(end.url).content.decode()
    assert '<b id="queue-done-count">1</b> of 2 done' in detail and "rita" in detail
    # A reviewer cannot build queues.
    assert client.post("/queues/new", {"name": "x", "limit": 1, "lock_minutes": 5}).status_code == 403


def test_a_refused_queue_keeps_what_was_typed_and_the_filter_and_says_why_beside_the_field(client, five, operator):
    client.force_login(operator)
    typed = {
        "name": "web <b>chats</b>",
        "limit": 10,
        "lock_minutes": 5,
        "environment": "web",
        "instructions": "Read the last turn first.",
        "rubric": "Good: the order's status in one sentence.",
        "dimensions": "helpfulness: numeric 5-1 | How far it solved the problem",
    }
    response = client.post("/queues/new", typed)
    page = response.content.decode()
    assert response.status_code == 400 and AnnotationQueue.objects.count() == 0
    # The form is open again with every value typed (escaped), under the same filter.
    assert '<details class="queue-build" open>' in page
    assert 'value="web &lt;b&gt;chats&lt;/b&gt;"' in page and 'name="limit" value="10"' in page
    assert (
        ">Read the last turn first.</textarea>" in page
        and "numeric 5-1 | How far it solved the problem</textarea>" in page
    )
    assert '<input type="hidden" name="environment" value="web">' in page
    # The reason is beside the field, in the summary too, and the list is the filtered one.
    assert 'id="queue-dimensions-error"' in page and "line 1: the range 5-1 is empty" in page
    assert "One thing stops this form" in page and page.count('class="trace-row"') == 2

    # A form error (no name) is kept the same way.
    response = client.post("/queues/new", {**typed, "name": "", "dimensions": ""})
    page = response.content.decode()
    assert response.status_code == 400 and 'id="queue-name-error"' in page
    assert ">Good: the order&#x27;s status in one sentence.</textarea>" in page and AnnotationQueue.objects.count() == 0


def test_a_queue_on_a_filter_that_cannot_be_read_is_refused_naming_it(client, five, operator):
    client.force_login(operator)
    response = client.post("/queues/new", {"name": "late", "limit": 10, "lock_minutes": 5, "start": "notadate"})
    assert response.status_code == 400 and AnnotationQueue.objects.count() == 0
    assert "the list&#x27;s filter start:" in response.content.decode()


def test_a_refused_queue_shows_no_trace_to_an_account_that_may_not_read_them(client, five, db):
    builder = user_with_role("reviewer", "bo")
    builder.user_permissions.add(Permission.objects.get(codename="add_annotationqueue"))
    builder.user_permissions.remove(*Permission.objects.filter(codename="view_trace"))
    for group in builder.groups.all():
        builder.groups.remove(group)
    builder.user_permissions.add(Permission.objects.get(codename="add_annotationqueue"))
    client.force_login(builder)
    assert client.get("/traces/").status_code == 403
    response = client.post("/queues/new", {"name": "", "limit": 10, "lock_minutes": 5})
    assert response.status_code == 403 and "trace-row" not in response.content.decode()


def test_load_more_on_a_refused_queue_page_goes_to_the_list(client, deployment, ingest, operator):
    ingest(deployment, *[{"external_id": f"m{i}", "messages": [{"role": "user", "content": "hi"}]} for i in range(55)])
    client.force_login(operator)
    page = client.post("/queues/new", {"name": "", "limit": 10, "lock_minutes": 5}).content.decode()
    more = re.search(r'href="([^"]*after=[^"]*)"', page).group(1).replace("&amp;", "&")
    assert more.startswith("/traces/?") and client.get(more).status_code == 200
