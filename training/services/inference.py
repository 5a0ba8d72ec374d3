"""The site's inference server: the settings and the registry handed to the Django-free
`training.inference` (its client and its launcher), which reads neither.

`inference_client` / `version_server` give a client with the site's key (`INFERENCE_API_KEY`)
for the site's server (`INFERENCE_URL`) or the one a base model names; `version_servers` one
for each of the base model's replicas (`base_model_replica_urls`); `server_spec_for_base`
fills a launch spec from `INFERENCE_*`; `live_adapters_load` loads, by name, the adapters the
deployments serve, which `serve_inference` runs each time its server is ready.
"""

from __future__ import annotations

import logging

from django.conf import settings

from training.inference.client import InferenceClient, InferenceRefused
from training.inference.server import ServerSpec
from training.serving.models import BaseModel, ModelVersion, ModelVersionKind
from training.serving.selectors import base_model_replica_urls, live_versions_for_base

logger = logging.getLogger(__name__)


def inference_client(url: str | None = None, **options) -> InferenceClient:
    """A client for the server at `url` (the site's `INFERENCE_URL` when empty), with the site's key."""
    return InferenceClient(url or settings.INFERENCE_URL, api_key=settings.INFERENCE_API_KEY, **options)


def version_server(version: ModelVersion, **options) -> InferenceClient:
    """A client for the first server that serves `version` (its base model's `inference_url`,
    or the site's): enough for a read or an evaluation, which need one server, not all."""
    return inference_client(base_model_replica_urls(base=version.base_model)[0], **options)


def version_servers(version: ModelVersion, **options) -> list[InferenceClient]:
    """A client for every replica that serves `version`, the first one first: whatever changes
    what a name answers (loading, unloading an adapter) goes to each."""
    return [inference_client(url, **options) for url in base_model_replica_urls(base=version.base_model)]


def server_spec_for_base(base: BaseModel, **overrides) -> ServerSpec:
    """How to start the server for `base` on this site; `None` overrides keep the setting."""
    values = {
        "model_path": base.path,
        "served_name": base.name,
        "host": settings.INFERENCE_HOST,
        "port": settings.INFERENCE_PORT,
        "max_model_len": settings.INFERENCE_MAX_MODEL_LEN,
        "max_lora_rank": settings.INFERENCE_MAX_LORA_RANK,
        "max_loras": settings.INFERENCE_MAX_LORAS,
        "kv_cache_gib": settings.INFERENCE_KV_CACHE_GIB,
        "api_key": settings.INFERENCE_API_KEY,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ServerSpec(**values)


def live_adapters_load(*, base: BaseModel, server: InferenceClient) -> list[str]:
    """Load, by name, the LoRA adapters of every live version over `base`; returns their names.

    A server that answers without the key (not started through `ServerSpec`, so without its
    key guard) is refused first: the live names would be open to anyone who reaches it."""
    if server.open_without_key():
        raise InferenceRefused(
            f"{server.url} answers GET /version without the inference key: start it with `manage.py "
            "serve_inference` (its key covers every route but /health), not as a plain vLLM server"
        )
    names = []
    for version in live_versions_for_base(base_model_id=base.id):
        if version.kind == ModelVersionKind.LORA:
            server.adapter_load(version.name, version.path)
            names.append(version.name)
        elif version.kind == ModelVersionKind.FULL:
            logger.warning(
                "version %s is a full checkpoint: serve it with its own server (serve_inference --version)",
                version.name,
            )
    logger.info("adapters loaded into %s: %s", server.url, names or "none")
    return names
