"""API keys: created with a random secret shown once, stored as a SHA-256 hash.

A key reads `prk_<prefix>_<secret>`. The prefix finds the row; the secret's hash is
compared in constant time. SHA-256 (not a slow password hash) suits 32 random
characters: there is no dictionary to guess from, and every API request checks one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from feedback.models import ApiKey, ApiKeyScope
from training.serving.models import Deployment

KEY_PREFIX = "prk"
_ALPHABET = string.ascii_lowercase + string.digits
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiKeyError(Exception):
    """The key is missing, unknown, revoked or expired; the message says which."""


@dataclass(frozen=True, slots=True)
class CreatedKey:
    api_key: ApiKey
    plaintext: str


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _random(n: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


def scopes_validate(scopes: list[str]) -> list[str]:
    unknown = sorted(set(scopes) - set(ApiKeyScope.values))
    if unknown:
        raise ValueError(f"unknown scope(s) {', '.join(unknown)}; choose from {', '.join(ApiKeyScope.values)}")
    if not scopes:
        raise ValueError("at least one scope is required")
    return sorted(set(scopes))


@transaction.atomic
def api_key_create(
    *,
    deployment: Deployment,
    scopes: list[str],
    name: str = "",
    expires_at: datetime | None = None,
    created_by=None,
) -> CreatedKey:
    scopes = scopes_validate(scopes)
    prefix, secret = _random(12), secrets.token_urlsafe(24)
    key = ApiKey.objects.create(
        deployment=deployment,
        name=name,
        prefix=prefix,
        hashed_secret=_hash(secret),
        scopes=scopes,
        expires_at=expires_at,
        created_by=created_by,
    )
    return CreatedKey(api_key=key, plaintext=f"{KEY_PREFIX}_{prefix}_{secret}")


def api_key_authenticate(plaintext: str, *, now: datetime | None = None) -> ApiKey:
    """The active key for a presented secret, or `ApiKeyError` saying why not."""
    parts = plaintext.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        raise ApiKeyError("malformed API key")
    key = ApiKey.objects.select_related("deployment").filter(prefix=parts[1]).first()
    if key is None or not hmac.compare_digest(key.hashed_secret, _hash(parts[2])):
        raise ApiKeyError("invalid API key")
    now = now or timezone.now()
    if key.revoked_at is not None:
        raise ApiKeyError("API key revoked")
    if key.expires_at is not None and key.expires_at <= now:
        raise ApiKeyError("API key expired")
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        # At most one write a minute per key, so a busy key does not write on every request.
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


def api_key_revoke(*, api_key: ApiKey) -> None:
    api_key.revoked_at = timezone.now()
    api_key.save(update_fields=["revoked_at"])
