"""Deployments, base models, model versions and the live pointer.

Flipping the live pointer is one small transaction (`live_version_set`): the LiveVersion row
(primary key = deployment) is updated or created, the version statuses follow, and the
pointer's trail (`LiveVersionChange`, the one record of every live move, which the audit log
shows) records who moved it from what to what, how and why. Loading the weights into the inference server
is a separate step (`training.inference`): promotion checks that first, then flips.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import connection, transaction
from django.utils import timezone

from training.inference.client import server_root
from training.serving.models import (
    BaseModel,
    Deployment,
    LiveChangeKind,
    LiveVersion,
    LiveVersionChange,
    ModelVersion,
    ModelVersionKind,
    ModelVersionStatus,
)
from training.serving.selectors import live_withdrawals
from webapp.kernel.errors import Invalid

# PostgreSQL channel a live-pointer flip is announced on (the payload is the deployment id);
# the gateway listens and drops its cached route at once instead of waiting for its TTL.
LIVE_CHANNEL = "practicum_live_version"


def live_version_announce(*, deployment_id: int) -> None:
    """NOTIFY the flip; PostgreSQL delivers it when the surrounding transaction commits
    (never, if it rolls back). Other databases have no such channel: the TTL applies."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [LIVE_CHANNEL, str(deployment_id)])


class ModelRegistryError(Invalid, ValueError):
    """A model or version cannot be registered as asked; the message says why."""


def deployment_get_or_create(*, name: str, description: str = "") -> Deployment:
    try:
        validate_slug(name)
    except ValidationError as exc:
        raise ValueError(f"deployment name {name!r}: use letters, digits, '-' and '_' only") from exc
    deployment, _ = Deployment.objects.get_or_create(name=name, defaults={"description": description})
    return deployment


def _slug(value: str, what: str) -> str:
    try:
        validate_slug(value)
    except ValidationError as exc:
        raise ModelRegistryError(f"{what} {value!r}: use letters, digits, '-' and '_' only") from exc
    return value


def model_folder_claim(*, prefix: str) -> Path:
    """A new, empty folder under `MODELS_DIR/versions/` for a version's weights, named
    `<prefix>-<random id>`: unique, so it can never be a registered version's folder.
    Creating it is the claim (it fails if the name exists)."""
    root = Path(settings.MODELS_DIR) / "versions"
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(5):
        folder = root / f"{prefix}-{uuid.uuid4().hex[:16]}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise ModelRegistryError(f"could not claim a new folder under {root}")


def model_version_name_free(name: str) -> str:
    """`name`, or `name-2`, `name-3`, … — the first no version has."""
    candidate, n = name, 1
    while ModelVersion.objects.filter(name=candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def registered_folder_owner(path: Path) -> str | None:
    """The name of a registered base model or version whose weights live at `path` (or
    inside it, or around it), else None. Nothing may write into such a folder."""
    path = path.expanduser().resolve()
    folders = [(f"version {name}", p) for name, p in ModelVersion.objects.values_list("name", "path")]
    folders += [(f"base model {name}", p) for name, p in BaseModel.objects.values_list("name", "path")]
    for owner, folder in folders:
        other = Path(folder).expanduser().resolve()
        if other == path or other in path.parents or path in other.parents:
            return owner
    return None


def _hf_folder(path: Path) -> Path:
    path = path.expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ModelRegistryError(f"{path} is not a Hugging Face model folder (no config.json)")
    return path


@transaction.atomic
def base_model_register(
    *,
    name: str,
    path: Path,
    description: str = "",
    metadata: dict[str, Any] | None = None,
    inference_url: str = "",
) -> tuple[BaseModel, ModelVersion]:
    """Register (or update) a local HF folder as a base model, with its `base` version of the
    same name — the name the inference server serves the base weights under."""
    _slug(name, "base model name")
    path = _hf_folder(path)
    base = BaseModel.objects.select_for_update().filter(name=name).first()
    if base is None:
        base = BaseModel.objects.create(
            name=name, path=str(path), description=description, metadata=metadata or {}, inference_url=inference_url
        )
    elif base.path != str(path) or (inference_url and base.inference_url != inference_url):
        # The weights and the server a base model's versions are served from decide what
        # answers customers: registered once, never repointed by a later registration.
        raise ModelRegistryError(
            f"base model {name!r} is registered at {base.path}"
            + (f" on {base.inference_url}" if base.inference_url else "")
            + "; register other weights or another server under a new name"
        )
    else:
        base.description, base.metadata = description or base.description, metadata or base.metadata
        base.save(update_fields=["description", "metadata"])
    version = ModelVersion.objects.filter(name=name).first()
    if version is None:
        version = ModelVersion.objects.create(
            name=name, base_model=base, kind=ModelVersionKind.BASE, path=str(path), status=ModelVersionStatus.APPROVED
        )
    elif version.base_model_id != base.id or version.kind != ModelVersionKind.BASE:
        raise ModelRegistryError(f"a {version.kind} version named {name!r} already exists; pick another name")
    return base, version


def _root_key(url: str) -> str:
    """`url`'s server root with its scheme and host in lower case (the path kept as given)."""
    root = server_root(url)
    parts = urlsplit(root)
    return parts._replace(scheme=parts.scheme.lower(), netloc=parts.netloc.lower()).geturl()


def replica_urls_clean(*, primary: str, urls: list[Any], field: str = "inference_replicas") -> list[str]:
    """`urls` as stored: each an `http://host:port` root (a trailing `/v1` is the same server),
    none twice and none the same as `primary`. Raises `ModelRegistryError` naming the entry.

    Plain http only: the gateway's upstream client speaks HTTP/1.1 to a private network
    (docs/decisions/0001-gateway-hot-path.md), so an https replica could never take traffic."""
    if not isinstance(urls, list):
        raise ModelRegistryError("a list of URLs", field=field)
    # Scheme and host are case-insensitive: `HTTP://GPU2:8001` is gpu2's server again, and
    # listed twice it would take a double share of the traffic.
    seen = {_root_key(primary)} if primary else set()
    out: list[str] = []
    for i, url in enumerate(urls):
        where = f"{field}[{i}]"
        if not isinstance(url, str) or not url.strip():
            raise ModelRegistryError("a non-empty URL string", field=where)
        root = server_root(url)
        try:
            parts = urlsplit(root)
            parts.port  # noqa: B018 - raises on a port that is not a number in range
        except ValueError as exc:
            raise ModelRegistryError(f"{url!r} is not a URL ({exc})", field=where) from exc
        if parts.scheme != "http" or not parts.hostname:
            raise ModelRegistryError(
                f"{url!r}: an http://host:port URL (the gateway reaches inference servers over plain http)",
                field=where,
            )
        if parts.query or parts.fragment or parts.username or parts.password or any(c in root for c in "\r\n\0 "):
            raise ModelRegistryError(f"{url!r}: only scheme, host, port and path", field=where)
        root = _root_key(root)
        if root in seen:
            raise ModelRegistryError(f"{url!r} is listed twice (or is the base model's inference_url)", field=where)
        seen.add(root)
        out.append(root)
    return out


@transaction.atomic
def base_model_replicas_set(*, base: BaseModel, urls: list[Any]) -> BaseModel:
    """Record the servers beside `base.inference_url` that serve `base` (replicas). The
    gateway picks them up within its route cache's TTL; a release loads into each."""
    locked = BaseModel.objects.select_for_update().get(pk=base.pk)
    locked.inference_replicas = replica_urls_clean(primary=locked.inference_url or settings.INFERENCE_URL, urls=urls)
    locked.save(update_fields=["inference_replicas"])
    base.inference_replicas = locked.inference_replicas
    return locked


@transaction.atomic
def base_model_replicas_drop(*, base: BaseModel, urls: list[str]) -> list[str]:
    """Take `urls` off `base`'s replicas (those a stopped server held), leaving any other entry
    as it is (someone may have changed the list meanwhile). Returns the list as stored."""
    locked = BaseModel.objects.select_for_update().get(pk=base.pk)
    gone = {server_root(url) for url in urls}
    kept = [url for url in locked.inference_replicas or [] if server_root(url) not in gone]
    if kept != locked.inference_replicas:
        locked.inference_replicas = kept
        locked.save(update_fields=["inference_replicas"])
    base.inference_replicas = kept
    return kept


@transaction.atomic
def model_version_create(
    *,
    name: str,
    base_model: BaseModel,
    kind: str,
    path: Path,
    parent: ModelVersion | None = None,
    deployment: Deployment | None = None,
    metadata: dict[str, Any] | None = None,
    created_by=None,
) -> ModelVersion:
    """A new candidate version: a LoRA adapter folder over `base_model`, or a full checkpoint."""
    _slug(name, "version name")
    if kind not in (ModelVersionKind.LORA, ModelVersionKind.FULL):
        raise ModelRegistryError("kind: a derived version is 'lora' or 'full' (base versions come with the base model)")
    path = path.expanduser().resolve()
    marker = "adapter_config.json" if kind == ModelVersionKind.LORA else "config.json"
    if not (path / marker).is_file():
        raise ModelRegistryError(f"{path} has no {marker}: not a {kind} folder")
    if parent is not None and parent.base_model_id != base_model.id:
        raise ModelRegistryError(f"parent {parent.name} is built on another base model")
    if ModelVersion.objects.filter(name=name).exists():
        raise ModelRegistryError(f"a version named {name!r} already exists")
    return ModelVersion.objects.create(
        name=name,
        base_model=base_model,
        kind=kind,
        path=str(path),
        parent=parent,
        deployment=deployment,
        metadata=metadata or {},
        created_by=created_by,
        status=ModelVersionStatus.CANDIDATE,
    )


@transaction.atomic
def live_version_set(
    *,
    deployment: Deployment,
    version: ModelVersion,
    user=None,
    reason: str = "",
    kind: str = LiveChangeKind.SET,
    request_made_at: datetime | None = None,
    promotion_id: int | None = None,
    release_id: int | None = None,
) -> LiveVersion:
    """Point `deployment` at `version`. Returns the live row; a no-op when it already is live.

    Every move writes one row of the pointer's trail, here and nowhere else: `user` (who),
    `reason` (why), `kind` and the promotion request and release behind it (by id).

    `kind` says how (a release's promotion or rollback, or a command). A version the
    deployment withdrew (`live_withdrawals`) comes back only through a promotion whose
    request was made after the withdrawal (`request_made_at`); a command may put back what
    a command took out, never what a rollback did. Every route to the live pointer
    (releases, `set_live`, `prepare_model --live-for`, `demo_setup`) comes through here.
    The previous version goes back to `approved` unless another deployment still serves it.
    """
    if version.status == ModelVersionStatus.FAILED:
        raise ModelRegistryError(f"version {version.name} failed; it cannot go live")
    now = timezone.now()
    live = LiveVersion.objects.select_for_update().filter(deployment=deployment).first()
    previous = live.version if live else None
    if previous is not None and previous.pk == version.pk:
        return live
    withdrawal = live_withdrawals(deployment_id=deployment.pk).get(version.pk)
    if kind == LiveChangeKind.PROMOTION:
        allowed = withdrawal is None or (request_made_at is not None and request_made_at > withdrawal.at)
    else:
        allowed = withdrawal is None or (kind == LiveChangeKind.SET and not withdrawal.by_rollback)
    if not allowed:
        raise ModelRegistryError(
            f"{withdrawal.describe()} for {deployment.name}: it goes live again only through a new "
            "promotion request, approved by another person",
            field="version",
        )
    if live is None:
        live = LiveVersion.objects.create(deployment=deployment, version=version, changed_at=now, changed_by=user)
    else:
        live.version = version
        live.changed_at = now
        live.changed_by = user
        live.save(update_fields=["version", "changed_at", "changed_by"])
    LiveVersionChange.objects.create(
        deployment=deployment,
        from_version=previous,
        to_version=version,
        changed_at=now,
        changed_by=user,
        reason=reason[:300],
        kind=kind,
        promotion_id=promotion_id,
        release_id=release_id,
    )
    live_version_announce(deployment_id=deployment.pk)
    if version.status != ModelVersionStatus.LIVE:
        version.status = ModelVersionStatus.LIVE
        version.save(update_fields=["status"])
    if previous is not None and not LiveVersion.objects.filter(version=previous).exists():
        previous.status = ModelVersionStatus.APPROVED
        previous.save(update_fields=["status"])
    return live
