"""Naming a cluster of failure notes with the judge model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from feedback.judge.client import CallRecord, JudgeEndpoint, call_structured
from feedback.judge.prompts import CURRENT_NAME, name_prompt_messages
from feedback.judge.schemas import CLUSTER_NAME_SCHEMA, ClusterName, parse_cluster_name


@dataclass(frozen=True, slots=True)
class NamedCluster:
    name: ClusterName
    record: CallRecord
    prompt_version: str


def name_cluster(*, texts: Sequence[str], endpoint: JudgeEndpoint) -> NamedCluster:
    """A short name and a one-sentence description for what `texts` have in common.
    Raises `JudgeCallFailed`."""
    result = call_structured(
        endpoint=endpoint,
        messages=name_prompt_messages(texts=texts),
        schema_name="failure_mode_name",
        schema=CLUSTER_NAME_SCHEMA,
        parse=parse_cluster_name,
    )
    return NamedCluster(name=result.value, record=result.record, prompt_version=CURRENT_NAME.version)
