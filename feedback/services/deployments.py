from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug

from feedback.models import Deployment


def deployment_get_or_create(*, name: str, description: str = "") -> Deployment:
    try:
        validate_slug(name)
    except ValidationError as exc:
        raise ValueError(f"deployment name {name!r}: use letters, digits, '-' and '_' only") from exc
    deployment, _ = Deployment.objects.get_or_create(name=name, defaults={"description": description})
    return deployment
