"""Request bodies against the real server (uvicorn, as `make demo` and production run it): a
body that does not arrive holds no slot of the web process, a body over the route's limit is
refused from its Content-Length (and a chunked one as it streams) before anything is stored,
and a route that needs a login or a key says so before the body is read."""

from __future__ import annotations

import base64
import socket
import threading
import time

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory
from tests.fixtures.site_server import serve_site

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SLOTS = 8
BODY_TIMEOUT = 3
LIMIT = 8 * 1024 * 1024  # above what Django keeps in memory (2.5 MB) before it spools to disk
IN_TIME = 10  # seconds any answer below may take on a busy 2-core machine
SERVER_ENV = {
    "PRACTICUM_WEB_MAX_CONCURRENT_REQUESTS": str(SLOTS),
    "PRACTICUM_WEB_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
    "PRACTICUM_INGEST_MAX_BODY_BYTES": str(LIMIT),
    "PRACTICUM_FINETUNE_FILE_MAX_BYTES": str(LIMIT),
}


@pytest.fixture(scope="module")
def site(django_db_setup, django_db_blocker):
    with serve_site(SERVER_ENV) as server:
        yield server


@pytest.fixture
def keys():
    deployment = DeploymentFactory(name="bodies")
    return {
        "ingest": api_key_create(deployment=deployment, scopes=["ingest", "feedback"]).plaintext,
        "train": api_key_create(deployment=deployment, scopes=["train"]).plaintext,
    }


def _send_head(port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=IN_TIME)
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return sock


def _status(sock: socket.socket, timeout: float) -> int:
    """The status of the answer on `sock`, waiting at most `timeout` seconds for it."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise AssertionError(f"the connection closed without an answer ({data!r})")
        data += chunk
    return int(data.split(b" ", 2)[1])


def _login(client: httpx.Client, username: str, password: str) -> httpx.Response:
    page = client.get("/login/")
    token = client.cookies["csrftoken"]
    assert page.status_code == 200
    return client.post(
        "/login/", data={"username": username, "password": password, "csrfmiddlewaretoken": token, "next": "/"}
    )


def _traces(n: int) -> dict:
    return {"traces": [{"external_id": f"t-{n}", "messages": [{"role": "user", "content": "hello"}]}]}


def test_bodies_that_do_not_arrive_hold_no_slot_and_time_out(site, keys):
    user = get_user_model().objects.create_user("op", is_superuser=True)
    # Hashed as the server hashes (the tests' own hasher is a faster one it does not know).
    user.password = PBKDF2PasswordHasher().encode("a-long-password-1", PBKDF2PasswordHasher().salt())
    user.save(update_fields=["password"])
    slow = [
        _send_head(
            site.port,
            "POST",
            "/login/",
            {"Content-Type": "application/x-www-form-urlencoded", "Content-Length": "100000"},
            b"username=x",
        )
        for _ in range(SLOTS + 2)
    ]
    slow += [
        _send_head(
            site.port,
            "POST",
            "/api/v1/traces",
            {
                "Authorization": f"Bearer {keys['ingest']}",
                "Content-Type": "application/json",
                "Content-Length": "100000",
            },
            b'{"traces":',
        )
        for _ in range(SLOTS + 2)
    ]
    slow.append(  # the gateway reads its own bodies, under the same deadline
        _send_head(
            site.port,
            "POST",
            "/v1/chat/completions",
            {
                "Authorization": f"Bearer {keys['ingest']}",
                "Content-Type": "application/json",
                "Content-Length": "100000",
            },
            b'{"model":',
        )
    )
    time.sleep(0.5)  # every slow request is in the server before the others come
    started = time.monotonic()
    with httpx.Client(base_url=site.url, timeout=IN_TIME) as client:
        assert client.get("/healthz").status_code == 200
        assert _login(client, "op", "a-long-password-1").status_code == 302
        assert client.get("/traces/").status_code == 200  # the logged-in person's pages
        ingest = client.post("/api/v1/traces", json=_traces(1), headers={"Authorization": f"Bearer {keys['ingest']}"})
        assert ingest.status_code == 207, ingest.text
        assert client.get("/v1/models").status_code == 401  # the gateway, as before
    assert time.monotonic() - started < IN_TIME
    # Each slow request is answered 408 once its body is late, and its connection closed.
    for sock in slow:
        assert _status(sock, BODY_TIMEOUT + IN_TIME) == 408
        sock.close()


@pytest.mark.parametrize(
    ("path", "key", "declared", "expected"),
    [
        ("/api/v1/traces", None, 300_000_000, {401, 413}),  # the anonymous 300 MB
        ("/api/v1/traces", None, LIMIT // 2, {401}),  # under the limit: no key, no body read
        ("/api/v1/traces", "ingest", LIMIT + 1, {413}),
        ("/api/v1/otel/v1/traces", None, LIMIT // 2, {401}),
        ("/api/v1/feedback", None, LIMIT // 2, {401}),
        ("/api/openai/v1/files", None, LIMIT // 2, {401}),
        ("/api/openai/v1/files", "train", 300_000_000, {413}),
        ("/traces/1/messages/0/comments", None, LIMIT // 2, {302}),  # a page: to the login
        ("/login/", None, 300_000_000, {413}),
        ("/v1/chat/completions", None, LIMIT // 2, {401}),
        ("/v1/chat/completions", "ingest", 300_000_000, {413}),
    ],
)
def test_a_request_is_refused_before_its_body_is_read(site, keys, path, key, declared, expected):
    headers = {"Content-Type": "application/json", "Content-Length": str(declared)}
    if key:
        headers["Authorization"] = f"Bearer {keys[key]}"
    sock = _send_head(site.port, "POST", path, headers)
    try:
        # Answered with none of the body sent: nothing of it can have been stored.
        assert _status(sock, IN_TIME) in expected
    finally:
        sock.close()


def test_an_anonymous_body_is_not_spooled(site):
    declared = LIMIT - 1
    sock = _send_head(
        site.port, "POST", "/api/v1/traces", {"Content-Type": "application/json", "Content-Length": str(declared)}
    )
    before = site.rss_bytes()
    sent = 0
    try:
        while sent < declared - 1:  # all but the last byte: a server that reads it is still reading
            sent += sock.send(b"x" * min(65536, declared - 1 - sent))
    except OSError:
        pass  # refused and closed: the rest has nowhere to go
    time.sleep(0.5)
    # Django spools a body past 2.5 MB to a temporary file in the server's TMPDIR.
    spooled = [f for f in site.open_files() if f.startswith(str(site.tmpdir))]
    assert spooled == [], spooled
    assert site.rss_bytes() - before < LIMIT // 4
    sock.close()


def test_a_chunked_body_is_counted_as_it_streams_and_cut_off(site, keys):
    sock = _send_head(
        site.port,
        "POST",
        "/api/v1/traces",
        {
            "Authorization": f"Bearer {keys['ingest']}",
            "Content-Type": "application/json",
            "Transfer-Encoding": "chunked",
        },
    )
    chunk = b"x" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    total = 32 * LIMIT
    sent = 0
    answer: list[int] = []

    def read_answer() -> None:
        answer.append(_status(sock, 60))

    reader = threading.Thread(target=read_answer)
    reader.start()
    before = site.rss_bytes()
    try:
        while sent < total and not answer:
            sock.sendall(frame)
            sent += len(chunk)
    except OSError:
        pass  # cut off
    reader.join(60)
    sock.close()
    assert answer == [413]
    # Cut off near the limit: what was sent past it sat in the sockets' buffers.
    assert sent < total // 4, sent
    assert site.rss_bytes() - before < 2 * LIMIT


def _basic(username: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{username}:{password}".encode())


def test_credentials_are_checked_from_the_headers_alone(client, keys, settings):
    from axes.models import AccessAttempt

    from webapp.site.request_bodies import credentials_check

    user = get_user_model().objects.create_user("basil", password="a-long-password-2")
    assert credentials_check({b"authorization": f"Bearer {keys['ingest']}".encode()}, None) == ""
    assert "key" in credentials_check({b"authorization": b"Bearer prk_nope_nope"}, None)
    assert credentials_check({}, None).startswith("log in")
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()
    assert credentials_check({b"cookie": cookie}, ("127.0.0.1", 1)) == ""
    client.logout()
    assert "log in again" in credentials_check({b"cookie": cookie}, ("127.0.0.1", 1))
    assert credentials_check({b"authorization": _basic("basil", "a-long-password-2")}, ("127.0.0.1", 1)) == ""
    # A wrong Basic password is a failed login, as in the view: it counts toward the lockout.
    wrong = {b"authorization": _basic("basil", "wrong")}
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert credentials_check(wrong, ("127.0.0.1", 1)) == "wrong username or password"
    assert credentials_check(wrong, ("127.0.0.1", 1)).startswith("too many failed logins")
    assert AccessAttempt.objects.get(username="basil").failures_since_start == settings.AXES_FAILURE_LIMIT
    right = {b"authorization": _basic("basil", "a-long-password-2")}
    assert credentials_check(right, ("127.0.0.1", 1)).startswith("too many failed logins")


def test_a_route_anyone_may_post_to_takes_a_body_without_credentials(site, keys):
    with httpx.Client(base_url=site.url, timeout=IN_TIME) as client:
        auth = {"Authorization": f"Bearer {keys['ingest']}"}
        assert client.post("/api/v1/traces", json=_traces(7), headers=auth).status_code == 207
        link = client.post("/api/v1/feedback/links", json={"external_id": "t-7"}, headers=auth)
        assert link.status_code == 201, link.text
        # A customer with the link and no key: its signed token is the credential.
        sent = client.post(link.json()["api_url"], json={"rating": 1, "comment": "x" * 20_000})
        assert sent.status_code == 201, sent.text
