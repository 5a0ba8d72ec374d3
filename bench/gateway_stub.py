"""The gateway benches' stand-in for vLLM: a raw asyncio server that answers every chat
completion at once with the same canned answer (JSON, or SSE when streamed), so a bench
measures the gateway and not a model."""

from __future__ import annotations

import asyncio

import orjson

N_TOKENS = 16


def _completion(model: str) -> bytes:
    tokens = [{"token": f"t{i}", "logprob": -0.1 * i, "bytes": [116], "top_logprobs": []} for i in range(N_TOKENS)]
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": " ".join(f"t{i}" for i in range(N_TOKENS))},
                    "logprobs": {"content": tokens},
                    "finish_reason": "stop",
                    "token_ids": list(range(100, 100 + N_TOKENS)),
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": N_TOKENS, "total_tokens": 20 + N_TOKENS},
        }
    )


def _sse(model: str) -> list[bytes]:
    def event(obj) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": model}
    events = [event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    for i in range(N_TOKENS):
        events.append(
            event(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": f"t{i} "},
                            "logprobs": {"content": [{"token": f"t{i}", "logprob": -0.1, "top_logprobs": []}]},
                            "token_ids": [100 + i],
                            "finish_reason": "stop" if i == N_TOKENS - 1 else None,
                        }
                    ],
                }
            )
        )
    events.append(event({**base, "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": N_TOKENS}}))
    events.append(b"data: [DONE]\n\n")
    return events


class _StubProtocol(asyncio.Protocol):
    def __init__(self, body: bytes, sse: list[bytes]) -> None:
        import httptools

        self.parser = httptools.HttpRequestParser(self)
        self.body_json, self.sse = body, sse
        self.chunks: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.chunks)
        self.chunks = []
        if b'"stream":true' in body or b'"stream": true' in body:
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            first, rest = self.sse[0], b"".join(self.sse[1:])
            self.transport.write(head + b"%x\r\n%s\r\n" % (len(first), first))
            self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
        else:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(self.body_json), self.body_json)
            )


def serve_stub(port: int, model: str) -> None:
    import uvloop

    async def main() -> None:
        body, sse = _completion(model), _sse(model)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _StubProtocol(body, sse), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())
