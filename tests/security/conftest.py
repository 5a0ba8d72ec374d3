# The feedback tests' fixtures (a deployment, keys, the real ingest service, role users).
from tests.feedback.conftest import (  # noqa: F401
    deployment,
    ingest,
    ingest_key,
    make_key,
    operator,
    operator_client,
    reviewer,
)


def recording_server(*, status: int, body: bytes, content_type: str = "application/json"):
    """A real HTTP server on a free port that answers every GET and POST with `status` and
    `body` and records each request (path, Authorization header). Returns (server, seen);
    call `server.shutdown()` when done."""
    import http.server
    import threading

    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen
