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
