"""PostgreSQL full-text search: a trace-level tsvector with a GIN index.

Not a model field (see feedback.models.traces); SQLite searches messages directly, so
nothing happens there. Existing traces are indexed from their stored messages.
"""

from django.db import migrations

# The document feedback.services.search builds, as of this migration.
BACKFILL = """
UPDATE feedback_trace AS t SET search_vector = to_tsvector('english'::regconfig, d.doc)
FROM (
    SELECT m.trace_id, left(string_agg(
        left(m.content, 20000) || coalesce(' ' || (
            SELECT string_agg(concat_ws(' ', c->'function'->>'name', c->'function'->>'arguments'), ' ')
            FROM jsonb_array_elements(m.tool_calls) AS c
        ), ''), E'\\n' ORDER BY m.position), 200000) AS doc
    FROM feedback_message AS m GROUP BY m.trace_id
) AS d
WHERE t.id = d.trace_id
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("ALTER TABLE feedback_trace ADD COLUMN IF NOT EXISTS search_vector tsvector")
    schema_editor.execute(BACKFILL)
    schema_editor.execute("CREATE INDEX IF NOT EXISTS trace_search_idx ON feedback_trace USING gin (search_vector)")


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP INDEX IF EXISTS trace_search_idx")
    schema_editor.execute("ALTER TABLE feedback_trace DROP COLUMN IF EXISTS search_vector")


class Migration(migrations.Migration):
    dependencies = [("feedback", "0003_review_and_queues")]

    operations = [migrations.RunPython(forwards, backwards)]
