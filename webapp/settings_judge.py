"""The LLM judge's settings: its endpoint and limits, what it writes, and the gates its
judgements pass before training uses them. webapp/settings.py (the module Django reads)
imports every name here; a comment directly above each setting says what it is."""

from __future__ import annotations

import os

from webapp.settings_env import env_bool

# The LLM judge: any OpenAI-compatible chat-completions endpoint (a hosted model, or one
# served by our own vLLM). No base URL means no judge: judging is then not offered.
JUDGE_BASE_URL = os.environ.get("PRACTICUM_JUDGE_BASE_URL", "")
# The model the judge endpoint is asked for (results are grouped by this name).
JUDGE_MODEL = os.environ.get("PRACTICUM_JUDGE_MODEL", "")
# The judge endpoint's key (a judge on our own inference server gets that server's key
# when this is unset, webapp/settings.py).
JUDGE_API_KEY = os.environ.get("PRACTICUM_JUDGE_API_KEY", "")
# The most one attempt may take, the whole response body included (a body trickled in
# slowly is cut off).
JUDGE_TIMEOUT_S = float(os.environ.get("PRACTICUM_JUDGE_TIMEOUT_S", 60))
JUDGE_MAX_ATTEMPTS = int(os.environ.get("PRACTICUM_JUDGE_MAX_ATTEMPTS", 3))
JUDGE_RETRY_BACKOFF_S = float(os.environ.get("PRACTICUM_JUDGE_RETRY_BACKOFF_S", 1.0))
# The most one judge call may take, every attempt and every wait between them included.
JUDGE_DEADLINE_S = float(os.environ.get("PRACTICUM_JUDGE_DEADLINE_S", 300))
# A judgement still "running" this long past the deadline is failed by the stale-work sweep
# (its worker died). The sweep's interval (webapp/celery.py) is the shorter of
# JUDGE_STALE_CHECK_SECONDS and TRAINING_STALE_CHECK_SECONDS unless
# PRACTICUM_STALE_WORK_CHECK_SECONDS says.
JUDGE_STALE_GRACE_S = float(os.environ.get("PRACTICUM_JUDGE_STALE_GRACE_S", 120))
JUDGE_STALE_CHECK_SECONDS = float(os.environ.get("PRACTICUM_JUDGE_STALE_CHECK_SECONDS", 60))
# The most tokens the judge may write in one answer; one cut off there is asked for again.
JUDGE_MAX_TOKENS = int(os.environ.get("PRACTICUM_JUDGE_MAX_TOKENS", 1024))
# The judge model's context window in tokens (0: not known). When set, the conversation sent
# is trimmed so that the prompt and JUDGE_MAX_TOKENS fit in it (`make demo`: the served 2048).
JUDGE_CONTEXT_TOKENS = int(os.environ.get("PRACTICUM_JUDGE_CONTEXT_TOKENS", 0))
# The most bytes one judge response body may have (error bodies too); a bigger one fails the call.
JUDGE_MAX_RESPONSE_BYTES = int(os.environ.get("PRACTICUM_JUDGE_MAX_RESPONSE_BYTES", 2_000_000))
# "full" sends the whole output schema; "portable" leaves out length/range bounds that some
# hosted providers' strict mode rejects (they are still checked on the answer).
JUDGE_SCHEMA_MODE = os.environ.get("PRACTICUM_JUDGE_SCHEMA_MODE", "full")
# "text": the judge writes a corrected turn; "actions": it chooses the turn among the agent's
# own tools (ids copied from the conversation) or a reply, and the product renders it.
JUDGE_CORRECTION_MODE = os.environ.get("PRACTICUM_JUDGE_CORRECTION_MODE", "text")
JUDGE_PRICE_INPUT_PER_MTOK = (
    float(os.environ["PRACTICUM_JUDGE_PRICE_INPUT_PER_MTOK"])
    if os.environ.get("PRACTICUM_JUDGE_PRICE_INPUT_PER_MTOK")
    else None
)
JUDGE_PRICE_OUTPUT_PER_MTOK = (
    float(os.environ["PRACTICUM_JUDGE_PRICE_OUTPUT_PER_MTOK"])
    if os.environ.get("PRACTICUM_JUDGE_PRICE_OUTPUT_PER_MTOK")
    else None
)
# Caps on what the judge writes (characters): they bound cost and latency per judgement.
JUDGE_RATIONALE_MAX_CHARS = int(os.environ.get("PRACTICUM_JUDGE_RATIONALE_MAX_CHARS", 800))
JUDGE_CORRECTION_MAX_CHARS = int(os.environ.get("PRACTICUM_JUDGE_CORRECTION_MAX_CHARS", 2000))
JUDGE_MAX_CRITERIA = int(os.environ.get("PRACTICUM_JUDGE_MAX_CRITERIA", 6))
# Judge on every new operator comment / customer feedback (when a judge is configured).
JUDGE_AUTO = env_bool("PRACTICUM_JUDGE_AUTO", True)
# Training uses judge rewards automatically only when the judge version agrees with
# operators' ratings at least this well (Cohen's kappa on pass/fail) over at least n turns.
JUDGE_REWARD_MIN_KAPPA = float(os.environ.get("PRACTICUM_JUDGE_REWARD_MIN_KAPPA", 0.6))
JUDGE_REWARD_MIN_N = int(os.environ.get("PRACTICUM_JUDGE_REWARD_MIN_N", 30))
# The training gate (feedback/selectors/judge_gate.py) also asks the score-candidates prompt
# for at least this many order-swap checks, this consistency, and at most this failure rate;
# the kappa minimum applies to the lower bound of its 95% interval.
JUDGE_GATE_MIN_SWAP_N = int(os.environ.get("PRACTICUM_JUDGE_GATE_MIN_SWAP_N", 10))
JUDGE_GATE_MIN_SWAP_AGREEMENT = float(os.environ.get("PRACTICUM_JUDGE_GATE_MIN_SWAP_AGREEMENT", 0.8))
JUDGE_GATE_MAX_FAILURE_RATE = float(os.environ.get("PRACTICUM_JUDGE_GATE_MAX_FAILURE_RATE", 0.1))
# A judge that chooses actions (PRACTICUM_JUDGE_CORRECTION_MODE / a deployment judge's
# correction mode "actions") must also agree with operators' own corrections at least this
# often on each kind of turn, measured on at least this many corrected turns of that kind.
JUDGE_ACTION_MIN_AGREEMENT = float(os.environ.get("PRACTICUM_JUDGE_ACTION_MIN_AGREEMENT", 0.8))
JUDGE_ACTION_MIN_N = int(os.environ.get("PRACTICUM_JUDGE_ACTION_MIN_N", 10))  # corrected turns per kind, at least
# The general rubric for a turn that carries none of its own: what calibration scores a rated
# turn without a judgement under, and what the evaluation uses for held-out turns.
GENERAL_RUBRIC = (
    "Answers the user's last message correctly and helpfully; calls a tool, with valid arguments, "
    "when the answer needs one; does not invent facts."
)
JUDGE_CALIBRATION_RUBRIC = os.environ.get("PRACTICUM_JUDGE_CALIBRATION_RUBRIC", GENERAL_RUBRIC)
# A judge reward at or above this counts as "pass" when compared with thumbs up/down.
JUDGE_PASS_THRESHOLD = float(os.environ.get("PRACTICUM_JUDGE_PASS_THRESHOLD", 0.5))
# Share of judgements with a correction that are followed by an order-swap check (the
# logged turn and the correction scored in both orders), for the agreement page.
JUDGE_SWAP_CHECK_RATE = float(os.environ.get("PRACTICUM_JUDGE_SWAP_CHECK_RATE", 0.2))
