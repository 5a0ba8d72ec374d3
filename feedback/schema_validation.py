"""JSON Schema validation for schemas that come from outside: an agent's tool definitions
stored with its traces, and the judge's own output schemas.

Every validator in the project is made here. A schema from a trace is untrusted data:
`{"$ref": "http://…"}` (or `file:`, `ftp:`, a relative reference) would make jsonschema's
default registry fetch that address — from the worker or the web process, with no
timeout. The registry used here retrieves nothing: a reference outside the schema itself
is unresolvable, and the schema is then treated as unusable (the caller decides what an
unusable schema means for it). References inside the schema (`#/$defs/…`) still work.

Imports no Django: the trainer and the evaluation code use it too.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable


class UnusableSchema(ValueError):
    """A schema that cannot be used to validate: not a valid JSON Schema, a reference to
    anything outside itself, or nested too deeply to walk."""


def _refuse(uri: str) -> Any:
    raise NoSuchResource(ref=uri)


# No retrieval of any kind: remote URLs, file: and ftp: URIs and relative references all
# end here. The specification's own meta-schemas are built in and need no retrieval.
NO_RETRIEVAL = Registry(retrieve=_refuse)


def schema_validator(schema: Any) -> Draft202012Validator:
    """A Draft 2020-12 validator for `schema` that never fetches a reference. Raises
    `UnusableSchema` when the schema itself is not valid."""
    if not isinstance(schema, dict | bool):
        raise UnusableSchema("a JSON Schema is an object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise UnusableSchema(f"not a valid JSON Schema: {exc.message[:200]}") from None
    except RecursionError:
        raise UnusableSchema("the schema is nested too deeply") from None
    return Draft202012Validator(schema, registry=NO_RETRIEVAL)


def schema_errors(validator: Draft202012Validator, instance: Any) -> list[ValidationError]:
    """Every way `instance` breaks the schema, in document order. Raises `UnusableSchema`
    when validating needs something the schema does not hold (a reference outside it)."""
    try:
        return sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    except Unresolvable as exc:
        raise UnusableSchema(
            f"the schema refers to {getattr(exc, 'ref', 'a document')!s:.200}, outside itself"
        ) from None
    except RecursionError:
        raise UnusableSchema("the schema or the value is nested too deeply") from None


def schema_first_error(validator: Draft202012Validator, instance: Any) -> ValidationError | None:
    """The most relevant error (jsonschema's `best_match`), or None when `instance` is valid.
    Raises `UnusableSchema` as `schema_errors` does."""
    errors = schema_errors(validator, instance)
    return best_match(errors) if errors else None


def tool_parameter_schemas(tools: Any) -> dict[str, dict[str, Any] | None]:
    """Each tool a conversation offers (chat-format `tools`), by name: its parameters' JSON
    schema, or None when it gives none. Malformed entries offer nothing."""
    out: dict[str, dict[str, Any] | None] = {}
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            params = function.get("parameters")
            out[function["name"]] = params if isinstance(params, dict) else None
    return out


def tool_arguments_error(schema: dict[str, Any] | None, arguments: Any) -> ValidationError | None:
    """Why `arguments` do not meet a tool's parameters `schema`, or None. A tool with no
    schema, or one too broken to use (or pointing outside itself, never fetched), takes
    any object: the agent's own definition is at fault, not the call."""
    if not schema:
        return None
    try:
        return schema_first_error(schema_validator(schema), arguments)
    except UnusableSchema:
        return None
