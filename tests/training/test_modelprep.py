"""The tiny test model is built locally, deterministically, and reloads exactly."""

from __future__ import annotations

import hashlib

from training.modelprep import tiny_prepare


def test_tiny_model_is_deterministic_and_its_tokenizer_reloads_identically(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = tiny_prepare(tmp_path / "a")
    b = tiny_prepare(tmp_path / "b")
    digest = [hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest() for p in (a, b)]
    assert digest[0] == digest[1]
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()

    tokenizer = AutoTokenizer.from_pretrained(a)
    model = AutoModelForCausalLM.from_pretrained(a)
    assert sum(p.numel() for p in model.parameters()) < 3_000_000
    messages = [
        {"role": "user", "content": "Refund A1?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "issue_refund", "arguments": '{"order_id": "A1"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'},
    ]
    tools = [{"type": "function", "function": {"name": "issue_refund"}}]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '<tool_call>{"name": "issue_refund", "arguments": {"order_id": "A1"}}</tool_call>' in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert max(ids) < model.config.vocab_size


def test_two_preparations_of_one_model_at_once_both_succeed(tmp_path):
    """Two runs building the same model folder at the same moment (two test sessions, two
    `make` targets) each stage their own copy and leave one whole model behind; a shared
    staging folder had one run delete the other's files mid-write."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[2]); "
        "from training.modelprep import tiny_prepare; tiny_prepare(Path(sys.argv[1]), force=True)"
    )
    runs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "tiny"), str(root)], stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    errors = [run.communicate(timeout=300)[1].decode()[-2000:] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # no staging folder left
    assert (tmp_path / "tiny" / "model.safetensors").exists() and (tmp_path / "tiny" / "tokenizer.json").exists()
    assert (tmp_path / "tiny").stat().st_mode & 0o755 == 0o755


def test_the_fast_demos_tiny_model_answers_in_words_where_the_random_one_answers_newlines():
    """`make demo FAST=1` serves this model: a release's smoke test refuses blank replies, so
    the model it serves, and the candidates trained over it, must say something."""
    import torch
    from django.conf import settings
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from feedback.judge.client import JudgeEndpoint
    from feedback.judge.prompts import FeedbackItem, turn_prompt_messages
    from feedback.judge.scoring import prompt_chars
    from training.environments import environment_get
    from training.modelprep import TINY_TALKING_TEXT, tiny_talking_prepare

    # Where the demo's own test (PRACTICUM_MODELS_DIR=test-models) prepares it: built once.
    path = tiny_talking_prepare(settings.DATA_DIR / "test-models" / "tiny-talking")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    unseen = environment_get("support-desk").tasks()[7]  # not among the prompts it was fitted on
    for messages, tools in [
        ([{"role": "user", "content": settings.RELEASE_SMOKE_PROMPT}], None),
        ([{"role": "user", "content": "What is the weather like on Mars?"}], None),
        (unseen.first_messages(), unseen.tools),
    ]:
        prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        out = model.generate(ids, max_new_tokens=32, do_sample=False)
        assert tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True) == TINY_TALKING_TEXT
    # A judge's prompt (as the demo's judge sends it) gets a judgement's JSON, which the judge's
    # structured output then holds to its schema.
    judge = turn_prompt_messages(
        context=unseen.first_messages(),
        turn={"role": "assistant", "content": TINY_TALKING_TEXT},
        feedback=[FeedbackItem(kind="comment", text="It should refund the order.")],
        tools=unseen.tools,
        max_chars=prompt_chars(JudgeEndpoint(base_url="x", model="x", max_tokens=400, context_tokens=2048)),
    )
    prompt = tokenizer.apply_chat_template(judge, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    # Unguided, on a task it was not fitted on, it opens the judgement; the judge's structured
    # output (the tour's path) then holds every later token to the schema.
    assert tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).startswith('{"rubric": ')


def test_greedy_margin_is_the_closest_call_between_an_answer_token_and_its_runner_up():
    """By hand: prompt of 2 tokens, answer [1, 2]. The logits that predict token 1 are
    [0, 3, 1] (margin 3 - 1 = 2), those that predict token 2 are [4, 0, 3.5] (margin
    3.5 - 4 = -0.5: greedy decoding would say 0 there)."""
    import torch

    from training.modelprep import greedy_margin

    class Fixed(torch.nn.Module):
        def forward(self, input_ids):
            logits = torch.tensor([[[9.0, 0, 0], [0, 3, 1], [4, 0, 3.5], [0, 0, 0]]])
            return type("Out", (), {"logits": logits})()

    model = Fixed()
    assert greedy_margin(model, [([7, 8, 1, 2], 2)]) == -0.5
    assert model.training  # left in training mode, as the fitting loop needs it
