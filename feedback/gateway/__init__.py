"""The OpenAI-compatible completion gateway: `POST /v1/chat/completions`, `GET /v1/models`.

A lean ASGI app (no Django request cycle on the hot path) mounted under `/v1/` by
`webapp/asgi.py`. It authenticates the deployment's API key (cached), forwards the call to
the deployment's live version on the inference server over a keep-alive connection pool,
streams server-sent events through as they arrive, and hands the exchange to a background
recorder that writes it to the trace store in batches.
"""
