from django.db import migrations, models
from django.db.models import F, Sum, TextField, Value
from django.db.models.functions import Cast, Coalesce, Length


def existing_rows(apps, schema_editor):
    """Files uploaded before files were read after their upload were reported processed, and
    held all their bytes; each job's training items are counted against the storage quota."""
    File = apps.get_model("finetuning", "FineTuningFile")
    Job = apps.get_model("finetuning", "FineTuningJob")
    TrainingItem = apps.get_model("training", "TrainingItem")
    File.objects.update(status="processed", stored_bytes=F("bytes"))
    size = (
        Length(Cast("messages", TextField()))
        + Coalesce(Length(Cast("tools", TextField())), Value(0))
        + Coalesce(Length(Cast("rubric", TextField())), Value(0))
        + Length("corrected_response")
        + Length("reference")
    )
    for job in Job.objects.select_related("job").iterator():
        if job.job.training_set_id is None:
            continue
        total = TrainingItem.objects.filter(training_set_id=job.job.training_set_id).aggregate(n=Sum(size))["n"]
        Job.objects.filter(pk=job.pk).update(items_bytes=total or 0)


class Migration(migrations.Migration):
    dependencies = [
        ("finetuning", "0001_initial"),
        ("training", "0012_serving_models"),
    ]

    operations = [
        migrations.AddField(
            model_name="finetuningfile",
            name="status",
            field=models.CharField(
                choices=[
                    ("uploaded", "Uploaded, not read yet"),
                    ("processed", "Read: every line can train"),
                    ("error", "Refused (status_details says why)"),
                ],
                default="uploaded",
                max_length=20,
            ),
        ),
        migrations.AddField(
            model_name="finetuningfile",
            name="status_details",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="finetuningfile",
            name="stored_bytes",
            field=models.PositiveBigIntegerField(
                default=0, help_text="what the row still holds of it (0 once a deleted file's content is dropped)"
            ),
        ),
        migrations.AddField(
            model_name="finetuningfile",
            name="summary",
            field=models.JSONField(
                blank=True, default=dict, help_text="what reading its lines found: lines, targets, bytes as SFT items"
            ),
        ),
        migrations.AddField(
            model_name="finetuningjob",
            name="failure",
            field=models.JSONField(
                blank=True, default=dict, help_text="why its files could not make a training set: OpenAI's error object"
            ),
        ),
        migrations.AddField(
            model_name="finetuningjob",
            name="items_bytes",
            field=models.PositiveBigIntegerField(
                default=0, help_text="the training items made from its files (they count against the storage quota)"
            ),
        ),
        migrations.AlterField(
            model_name="finetuningfile",
            name="bytes",
            field=models.PositiveBigIntegerField(help_text="the upload's size, as OpenAI's file object reports it"),
        ),
        migrations.RunPython(existing_rows, migrations.RunPython.noop),
    ]
