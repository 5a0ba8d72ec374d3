"""The demo agent's harness on a local model, in torch: the tool-call regex enforced token by
token, episodes played in threads with their turns decoded in one batch; and the base model
it loads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from desk import ROOT

MODEL = ROOT / "var" / "models" / "smollm2-135m-instruct"
TEMPERATURE = 0.7
MAX_TURN_TOKENS = 96
TOP_K = 64  # tokens checked against the harness's regex before the whole vocabulary is


def cpu_attention() -> None:
    """SDPA's own grouped-query attention on the CPU (`policy.cpu_grouped_attention`, which
    jobs install when they load a policy), for the models this harness loads itself."""
    from training.trainer.policy import cpu_grouped_attention

    cpu_grouped_attention()


def load_base(path: Path = MODEL):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, tokenizer


class Harness:
    """The demo agent's harness on a local model: the first turn must be a tool call on an
    order, later turns a tool call or a sentence (`ACT_REGEX`, `ACT_OR_REPLY_REGEX`),
    enforced token by token: among the `TOP_K` likeliest tokens, those that keep the text
    a prefix of the regex's language are kept (the whole vocabulary is searched when none
    is), and one is sampled at `temperature` with the episode's own generator; the end
    token only once the text matches. Episodes run in threads and their turns are decoded
    in one batch (the system prompt and tools, which all share, computed once)."""

    def __init__(self, model, tokenizer, *, temperature: float = TEMPERATURE):
        import regex

        from feedback.demo.agent import ACT_OR_REPLY_REGEX, ACT_REGEX

        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.first = regex.compile(ACT_REGEX)
        self.later = regex.compile(ACT_OR_REPLY_REGEX)
        self.vocab = [tokenizer.decode([i]) for i in range(len(tokenizer))]
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.lock = threading.Lock()

    def decode(self, rows: list[tuple[list[int], Any, Any, int]]) -> list[tuple[str, int, bool]]:
        """Each row (context ids, pattern, generator, token limit) → (text, tokens, ended)."""
        import torch

        from training.trainer.sampling import prefill

        batch = len(rows)
        with torch.no_grad():
            logits, cache, mask, after = prefill(self.model, [r[0] for r in rows], pad_id=self.pad)
            texts, produced, ended = [""] * batch, [0] * batch, [False] * batch
            done = [False] * batch
            for _ in range(max(r[3] for r in rows)):
                logits = logits.float()
                tokens = []
                for b, (_ids, pattern, generator, limit) in enumerate(rows):
                    if done[b]:
                        tokens.append(self.pad)
                        continue
                    token = self._pick(logits[b], texts[b], pattern, generator)
                    produced[b] += 1
                    if token == self.eos:
                        ended[b] = done[b] = True
                    else:
                        texts[b] += self.vocab[token]
                        done[b] = produced[b] >= limit
                    tokens.append(token)
                if all(done):
                    break
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
                logits = self.model(
                    input_ids=torch.tensor(tokens)[:, None],
                    attention_mask=mask,
                    position_ids=after,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                ).logits[:, -1]
                after = after + 1
        return list(zip(texts, produced, ended, strict=True))

    def _pick(self, logits, text: str, pattern, generator) -> int:
        import torch

        complete = pattern.fullmatch(text) is not None
        order = torch.topk(logits, TOP_K).indices.tolist()
        allowed = [t for t in order if self._ok(t, text, pattern, complete)]
        if not allowed:
            order = torch.argsort(logits, descending=True).tolist()
            allowed = [t for t in order if self._ok(t, text, pattern, complete)][:TOP_K]
        if not allowed:
            return self.eos
        if self.temperature <= 0:
            return allowed[0]
        probs = torch.softmax(logits[allowed] / self.temperature, dim=0)
        return allowed[int(torch.multinomial(probs, 1, generator=generator))]

    def _ok(self, token: int, text: str, pattern, complete: bool) -> bool:
        if token == self.eos:
            return complete
        piece = self.vocab[token]
        return bool(piece) and pattern.fullmatch(text + piece, partial=True) is not None

    def episodes(self, tasks, *, seed: int, batch: int = 16) -> list:
        """Play each task once, `batch` at a time (episode i seeded with seed·100003 + i)."""
        import torch

        from training.environments import Completion, episode_run
        from training.environments.support_desk import SupportDesk
        from training.inference.codec import tool_calls_parse
        from training.trainer.sampling import encode_prompt

        env = SupportDesk()
        results: list = [None] * len(tasks)
        for start in range(0, len(tasks), batch):
            chunk = list(enumerate(tasks))[start : start + batch]
            batcher = _Batcher(self, active=len(chunk))
            errors: list[BaseException] = []

            def run(index: int, task, batcher=batcher, errors=errors) -> None:
                generator = torch.Generator().manual_seed(seed * 100_003 + index)
                turns = [0]

                def complete(messages, tools, max_tokens_left):
                    pattern = self.later if len(messages) > 2 else self.first
                    with self.lock:
                        ids = encode_prompt(self.tokenizer, messages, tools)
                    limit = max(1, min(MAX_TURN_TOKENS, max_tokens_left))
                    text, produced, ended = batcher.submit(index, (ids, pattern, generator, limit))
                    content, calls = tool_calls_parse(text)
                    for k, call in enumerate(calls):
                        call["id"] = f"call_{turns[0]}_{k}"
                    turns[0] += 1
                    message: dict[str, Any] = {"content": content}
                    if calls:
                        message["tool_calls"] = calls
                    reason = ("tool_calls" if calls else "stop") if ended else "length"
                    return Completion(message=message, tokens=produced, finish_reason=reason)

                try:
                    results[index] = episode_run(env, task, complete)
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    batcher.finished()

            threads = [threading.Thread(target=run, args=(i, t), daemon=True) for i, t in chunk]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
        return results


class _Batcher:
    """Waits until every running episode asks for its next turn, then decodes them in one
    batch, rows ordered by episode."""

    def __init__(self, harness: Harness, active: int):
        self.harness = harness
        self.active = active
        self.cv = threading.Condition()
        self.pending: dict[int, tuple] = {}
        self.results: dict[int, tuple] = {}
        self.error: BaseException | None = None

    def submit(self, key: int, row: tuple) -> tuple:
        with self.cv:
            self.pending[key] = row
            self._run_if_ready()
            while key not in self.results and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise RuntimeError("decoding failed") from self.error
            return self.results.pop(key)

    def finished(self) -> None:
        with self.cv:
            self.active -= 1
            self._run_if_ready()

    def _run_if_ready(self) -> None:
        if not self.pending or len(self.pending) < self.active or self.error is not None:
            return
        batch, self.pending = dict(sorted(self.pending.items())), {}
        try:
            self.results.update(zip(batch, self.harness.decode(list(batch.values())), strict=True))
        except BaseException as exc:
            self.error = exc
        self.cv.notify_all()
