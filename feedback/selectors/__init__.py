"""Reads, by sub-domain; import them from here."""

from feedback.selectors.traces import message_as_openai, trace_as_chat_jsonl_row, trace_as_dict, trace_visible_to

__all__ = ["message_as_openai", "trace_as_chat_jsonl_row", "trace_as_dict", "trace_visible_to"]
