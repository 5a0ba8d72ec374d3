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
