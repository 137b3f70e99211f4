"""The package's JSON Schemas (scenario, golden manifest, run manifest, report) and the one validator.

:func:`validate` raises :class:`~precision_harness.errors.SchemaError`; a caller whose input is a
user's file turns it into its own error (a scenario file: ``ScenarioError``; a golden's manifest:
``GoldenCorruptError``), so a bug in what the package writes is not blamed on a scenario.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from precision_harness.errors import SchemaError


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Return the JSON Schema ``schemas/<name>.schema.json`` shipped with the package."""
    text = resources.files("precision_harness.schemas").joinpath(f"{name}.schema.json").read_text("utf-8")
    return json.loads(text)


def validate(instance: Any, schema_name: str, *, source: str | Path) -> None:
    """Validate ``instance`` against a packaged schema; raise :class:`SchemaError` naming the field.

    Only the first (best-match) error is reported, as ``<source>: <field.path>: <message>``.
    """
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(load_schema(schema_name))
    errors = sorted(validator_cls(load_schema(schema_name)).iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        where = ".".join(str(p) for p in err.absolute_path) or "<top level>"
        message = err.message
        if err.validator == "additionalProperties":
            message = f"{message}; remove it or check its spelling against {schema_name}.schema.json"
        elif err.validator == "minItems" and err.instance == []:
            message = "[] is empty: an empty list gates nothing; list at least one"
        raise SchemaError(f"{source}: {where}: {message}")
