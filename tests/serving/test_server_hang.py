"""An inference server that hangs while starting says where: the launcher's timeout makes
every Python process of it write its stacks to its log, and the failure carries them."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

import pytest

from training.inference.server import InferenceServer, ServerFailed, ServerSpec, supervise_all

# A "server" that prints one line and then waits forever inside a function of its own.
HANG = """
import time
print("starting", flush=True)
def waiting_for_the_engine():
    time.sleep(600)
waiting_for_the_engine()
"""


@dataclass
class HangingSpec(ServerSpec):
    def command(self) -> tuple[list[str], dict[str, str]]:
        _, env = super().command()  # the server's environment, PYTHONFAULTHANDLER included
        return [sys.executable, "-c", HANG], env


def _server(tmp_path) -> InferenceServer:
    spec = HangingSpec(model_path=str(tmp_path), served_name="hang", port=9, api_key="k")
    return InferenceServer(spec, log_path=tmp_path / "server.log")


def test_a_server_that_never_answers_fails_with_the_stack_it_hangs_in(tmp_path):
    server = _server(tmp_path)
    with pytest.raises(ServerFailed) as failed:
        server.start_ready(timeout=3)
    message = str(failed.value)
    assert "not healthy after 3 s" in message and "starting" in message
    assert "most recent call first" in message and "waiting_for_the_engine" in message, message
    assert not server.alive()
    assert not list(tmp_path.glob("core*"))  # the abort left no core file


def test_the_supervisor_logs_where_a_restarting_server_hangs_and_gives_up_on_it(tmp_path, caplog):
    server = _server(tmp_path)
    gave_up = []
    with caplog.at_level(logging.ERROR, logger="training.inference.server"):
        code = supervise_all([server], on_gave_up=gave_up.append, max_restarts=0, ready_timeout=3, poll_s=0.2)
    assert code == 1 and gave_up == [server]
    assert "waiting_for_the_engine" in caplog.text and "most recent call first" in caplog.text, caplog.text
    assert not server.alive()


def test_a_server_that_survives_sigkill_does_not_take_its_supervisor_down(tmp_path, monkeypatch, caplog):
    """A server process stuck in the kernel (seen: inside sched_setaffinity) is deaf to every
    signal, SIGKILL included. Its supervisor reports it and carries on, rather than dying
    with an uncaught timeout, which left the replica down for good."""
    import os
    import signal
    import subprocess

    from training.inference import server as server_module

    real_killpg, real_wait = os.killpg, subprocess.Popen.wait

    def deaf_killpg(pgid, sig):  # nothing reaches the group (a probe with 0 still answers)
        if sig == 0:
            real_killpg(pgid, sig)

    def slow_wait(self, timeout=None):  # and it is never reaped in time
        if timeout is not None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return real_wait(self, timeout)

    server = _server(tmp_path)
    monkeypatch.setattr(server_module.os, "killpg", deaf_killpg)
    monkeypatch.setattr(subprocess.Popen, "wait", slow_wait)
    try:
        with caplog.at_level(logging.ERROR, logger="training.inference.server"):
            code = supervise_all([server], max_restarts=0, ready_timeout=2, poll_s=0.2)
    finally:
        monkeypatch.undo()
        real_killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(10)

    assert code == 1  # it gave up on the server, as told, and returned
    assert "did not exit after SIGKILL" in caplog.text and "stuck in the kernel (state" in caplog.text
