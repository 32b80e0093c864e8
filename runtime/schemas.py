"""A dataset's public schema on disk and on the wire: reading a schema file (TOML) and the
``DatasetSchema`` message every party sends (:mod:`dpmarket.common.schema` holds the schema
itself)."""

from __future__ import annotations

import os

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.schema import COLUMN_TYPES, Column, Schema
from dpmarket.runtime.files import read_toml
from dpmarket.v1 import schema_pb2

__all__ = ["load_schema", "schema_from_proto", "schema_to_proto"]

_TYPE_TO_PROTO = {
    "continuous": schema_pb2.COLUMN_TYPE_CONTINUOUS,
    "integer": schema_pb2.COLUMN_TYPE_INTEGER,
    "binary": schema_pb2.COLUMN_TYPE_BINARY,
    "categorical": schema_pb2.COLUMN_TYPE_CATEGORICAL,
}
_TYPE_FROM_PROTO = {v: k for k, v in _TYPE_TO_PROTO.items()}
assert set(_TYPE_TO_PROTO) == set(COLUMN_TYPES)


def load_schema(path: str | os.PathLike[str]) -> Schema:
    """Read a schema file (TOML; layout in :mod:`dpmarket.common.schema`).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not valid TOML or not a valid schema (naming the file and the key or column).
    """
    return Schema.from_mapping(read_toml(path, "schema file"), source=str(path))


def schema_to_proto(schema: Schema) -> schema_pb2.DatasetSchema:
    """Schema -> DatasetSchema, with its fingerprint."""
    return schema_pb2.DatasetSchema(
        columns=[
            schema_pb2.SchemaColumn(
                name=c.name,
                type=_TYPE_TO_PROTO[c.type],
                low=c.low,
                high=c.high,
                levels=list(c.levels),
            )
            for c in schema.columns
        ],
        label=schema.label or "",
        fingerprint=schema.fingerprint,
    )


def schema_from_proto(message: schema_pb2.DatasetSchema, who: str) -> Schema | None:
    """DatasetSchema -> Schema; an empty message (no column) is ``None``: no schema declared.

    Parameters
    ----------
    message : DatasetSchema
    who : str
        The sender, for messages (``"owner clinic-a"``, ``"the consumer"``).

    Raises
    ------
    InvalidArgumentError
        If a column is malformed (unknown type, bad bounds or levels), or the fingerprint sent
        is not the one of the columns and label sent.
    """
    if not message.columns:
        return None
    try:
        columns = []
        for c in message.columns:
            if c.type not in _TYPE_FROM_PROTO:
                raise InvalidArgumentError(f"column {c.name!r} has no type")
            columns.append(
                Column(c.name, _TYPE_FROM_PROTO[c.type], c.low, c.high, tuple(c.levels))  # type: ignore[arg-type]
            )
        schema = Schema(tuple(columns), message.label or None)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"the schema of {who} is malformed: {exc}") from None
    if message.fingerprint != schema.fingerprint:
        raise InvalidArgumentError(
            f"the schema of {who} carries the fingerprint {message.fingerprint[:16]!r}, not its "
            f"columns' {schema.fingerprint[:16]!r}"
        )
    return schema
