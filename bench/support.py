"""What the benchmarks share: a fresh database of their own, a free port, the site under uvicorn."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The project's one port picker, for the benches that start servers.
from training.inference.server import free_port as free_port  # noqa: E402


def fresh_database(base_url: str, suffix: str) -> str:
    """Drop and recreate `<name><suffix>` beside the database of `base_url`, migrate it,
    and return its URL."""
    import psycopg

    name = base_url.rsplit("/", 1)[1].split("?")[0] + suffix
    admin = base_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = base_url.rsplit("/", 1)[0] + "/" + name
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    return url


@contextlib.contextmanager
def site(db_url: str, *, port: int, workers: int) -> Iterator[str]:
    """The site (`webapp.asgi`) under uvicorn on `db_url`, as production runs it; yields its
    base URL once it answers, and stops it on the way out."""
    import httpx

    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "uvicorn"), "webapp.asgi:application", "--port", str(port),
         "--workers", str(workers), "--log-level", "warning", "--no-access-log"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": db_url},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(f"{base}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield base
    finally:
        server.terminate()
        server.wait(10)
