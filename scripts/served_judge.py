"""A local model as a judge endpoint for one run of a script: an HF folder served by the
product's inference server (`training.inference.server`, vLLM on a loopback port with a key
of its own), reached through the product's judge client (`feedback.judge.client`), and
stopped when the run is done.

The probes and experiments that measure a reader or a judge start it the same way
(`judge_probe.py`, `reader_bank.py`, `note_probe.py`, and the judge arm of
`learn_from_comments.py` in `comments/judge.py`); only the names, the ports, the context
length and the endpoint's limits differ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from feedback.judge.client import JudgeEndpoint
from training.inference.server import InferenceServer, ServerSpec


@contextlib.contextmanager
def served_judge(
    model: Path,
    *,
    served_name: str,
    port: int,
    max_model_len: int,
    log_path: Path,
    start_timeout: float,
    announce: Callable[[str], object] | None = None,
    **endpoint: Any,
) -> Iterator[JudgeEndpoint]:
    """Serve `model` as `served_name` on `port` and yield a `JudgeEndpoint` for it (its
    other settings: `endpoint`); the server is stopped on the way out.

    `announce` is told the server's URL before the (minutes-long) start; by default a line
    on stdout says so. A server that does not become ready in `start_timeout` seconds is
    stopped and `ServerFailed` raised, before anything is yielded."""
    spec = ServerSpec(
        model_path=str(model), served_name=served_name, port=port, max_model_len=max_model_len, kv_cache_gib=2
    )
    server = InferenceServer(spec, log_path=log_path)
    if announce is None:
        print(f"starting vLLM for {model} on {spec.url} …", flush=True)
    else:
        announce(spec.url)
    server.start_ready(timeout=start_timeout)
    try:
        yield JudgeEndpoint(base_url=f"{spec.url}/v1", model=served_name, api_key=spec.api_key, **endpoint)
    finally:
        server.stop()
