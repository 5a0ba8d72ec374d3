from django.urls import path

from training.finetuning import apis

urlpatterns = [
    path("files", apis.FilesApi.as_view(), name="openai-files"),
    path("files/<str:file_id>", apis.FileDetailApi.as_view(), name="openai-file"),
    path("files/<str:file_id>/content", apis.FileContentApi.as_view(), name="openai-file-content"),
    path("fine_tuning/jobs", apis.JobsApi.as_view(), name="openai-fine-tuning-jobs"),
    path("fine_tuning/jobs/<str:job_id>", apis.JobDetailApi.as_view(), name="openai-fine-tuning-job"),
    path("fine_tuning/jobs/<str:job_id>/cancel", apis.JobCancelApi.as_view(), name="openai-fine-tuning-cancel"),
    path("fine_tuning/jobs/<str:job_id>/events", apis.JobEventsApi.as_view(), name="openai-fine-tuning-events"),
    path(
        "fine_tuning/jobs/<str:job_id>/checkpoints",
        apis.JobCheckpointsApi.as_view(),
        name="openai-fine-tuning-checkpoints",
    ),
]
