"""The chat/tool-call format the served models speak, in one place.

A model writes a tool call into its text as a hermes block,
`<tool_call>{"name": …, "arguments": {…}}</tool_call>` (the chat template of
`training.modelprep` renders calls that way, and the inference server's `hermes` parser reads
them back into OpenAI `tool_calls`). Everything that reads or writes that text goes through
here: the evaluation's grading, the environment's episode loop (the trainer's completer), the
programmatic graders and the training monitors. Pure functions, no Django, no torch.

- `tool_call_blocks(text)`: every block in the text, each with its parsed call or `None`;
- `tool_calls_parse(text)`: the text split into its words and OpenAI-format `tool_calls`;
- `message_served_text(message)`: an assistant message (OpenAI format) written back as the
  text the model produced, calls as blocks — what a text grader must read;
- `tool_call_validity(texts)`: how many blocks the texts hold and how many do not parse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# No \s* around the lazy body: with them a long run of spaces is matched in quadratic time
# (30,000 spaces took 5.5 s); the body is stripped in Python instead.
TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCallBlock:
    """One `<tool_call>` block: where it lies in the text, and the call it holds (`name`, and
    `arguments` as the model wrote them) or `None` when it is not a JSON object with a string
    `name`. `arguments` is None when the block has none."""

    start: int
    end: int
    name: str | None
    arguments: Any = None

    @property
    def parsed(self) -> bool:
        return self.name is not None

    @property
    def arguments_object(self) -> dict[str, Any] | None:
        """The arguments as an object (a JSON string holding one is read), else None."""
        arguments = {} if self.arguments is None else self.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                return None
        return arguments if isinstance(arguments, dict) else None


def tool_call_blocks(text: str) -> list[ToolCallBlock]:
    """Every `<tool_call>` block of `text` in order (an unclosed last block runs to the end)."""
    blocks = []
    for match in TOOL_CALL_BLOCK.finditer(text or ""):
        try:
            body = json.loads(match.group(1).strip())
        except (ValueError, RecursionError):  # model output: any depth
            body = None
        if isinstance(body, dict) and isinstance(body.get("name"), str):
            blocks.append(ToolCallBlock(match.start(), match.end(), body["name"], body.get("arguments")))
        else:
            blocks.append(ToolCallBlock(match.start(), match.end(), None))
    return blocks


def tool_calls_parse(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split the parsed blocks out of generated text, as the inference server's hermes parser
    does: `(the remaining words, OpenAI-format tool_calls)`. Blocks that do not parse stay in
    the text, where the checks count them invalid."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for i, block in enumerate(tool_call_blocks(text)):
        if not block.parsed:
            continue
        arguments = {} if block.arguments is None else block.arguments
        calls.append(
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {
                    "name": block.name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
        kept.append(text[last : block.start])
        last = block.end
    if not calls:
        return text, []
    kept.append(text[last:])
    return "".join(kept).strip(), calls


def message_text(message: dict[str, Any]) -> str:
    """The words of a message (its text parts joined when the content is a list)."""
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def tool_call_encode(name: str, arguments: Any) -> str:
    """One call written as the model writes it (and the chat template renders it). Arguments
    given as a JSON string are written as they are, like the template does."""
    written = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
    return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {written}}}</tool_call>'


def message_served_text(message: dict[str, Any]) -> str:
    """An assistant message written back as the model's text: its words, then each of its
    `tool_calls` as a block. `tool_calls_parse(message_served_text(m))` gives `m`'s calls back,
    so a text grader reads a served tool call exactly as it reads one in generated text."""
    text = message_text(message)
    calls = message.get("tool_calls") or []
    blocks = []
    for call in calls:
        function = (call or {}).get("function") or {}
        blocks.append(tool_call_encode(str(function.get("name") or ""), function.get("arguments")))
    return text + "".join(blocks)


def tool_call_validity(texts: list[str]) -> tuple[int, int]:
    """(blocks seen, blocks that are not a JSON object with a string `name` and an object
    `arguments`) across `texts`."""
    seen = invalid = 0
    for text in texts:
        for block in tool_call_blocks(text):
            seen += 1
            if not block.parsed or not isinstance(block.arguments, dict):
                invalid += 1
    return seen, invalid
