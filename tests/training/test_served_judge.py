"""The experiments' local judge: a .gguf file is served by llama-server, and where none is
built the run stops with what builds it, before any server starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "scripts"))

from served_judge import GgufSpec, served_judge

from training.inference.server import ServerFailed


def test_a_gguf_judge_with_no_llama_server_stops_with_what_builds_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PRACTICUM_LLAMA_SERVER", str(tmp_path / "missing" / "llama-server"))
    gguf = tmp_path / "judge.gguf"
    gguf.write_bytes(b"GGUF")
    with (
        pytest.raises(ServerFailed, match="make local-judge-server"),
        served_judge(gguf, served_name="judge", port=1, max_model_len=512, log_path=tmp_path / "log", start_timeout=5),
    ):
        pytest.fail("nothing is yielded without a server")
    assert not (tmp_path / "log").exists()  # no process was started


def test_llama_server_is_started_behind_a_key_on_loopback_with_the_models_own_template(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("")
    spec = GgufSpec(model_path="m.gguf", served_name="judge", port=8123, max_model_len=4096, slots=4, binary=binary)
    argv, env = spec.command()
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    # The key in the environment, not on a command line that `ps` shows every local user.
    assert env["LLAMA_API_KEY"] == spec.api_key and len(spec.api_key) >= 32 and spec.api_key not in " ".join(argv)
    assert flags["--host"] == "127.0.0.1"
    assert flags["--alias"] == "judge" and flags["--ctx-size"] == str(4096 * 4) and flags["--parallel"] == "4"
    assert "--jinja" in argv and spec.url == "http://127.0.0.1:8123"
