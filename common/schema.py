"""A dataset's public schema: its columns in order, their types and public bounds or levels, and
its label column.

One declaration serves every capability and every party:

* an **owner** checks its table against it when it starts (names, order, types, bounds and
  levels: :meth:`Schema.check_table`, on its own console only) and advertises it;
* the **curator** compares every owner's schema and the consumer's before a session opens
  (:meth:`Schema.difference` names the first column that differs; schemas are public) and refuses
  a mismatch before anything is charged;
* a **consumer** reads its validation set through it (columns selected and ordered by name) and
  takes CAPE's public bounds from it (:meth:`Schema.bounds`);
* a catalogue's **sketch declaration** declares its columns in the same ``[[columns]]`` format,
  or takes them from a schema file (:mod:`dpmarket.common.sketches.spec`).

The TOML layout (:meth:`Schema.from_mapping`)::

    name = "diabetes"                 # optional
    description = "..."               # optional
    label = "high"                    # optional: the label column (binary, integer or categorical)

    [[columns]]                       # in the table's order
    name = "age"
    type = "integer"                  # continuous | integer | binary | categorical
    low = 0                           # public bounds: continuous and integer columns
    high = 120

    [[columns]]
    name = "sex"
    type = "categorical"
    levels = [1, 2]                   # the values a categorical column may take

    [[columns]]
    name = "high"
    type = "binary"                   # 0 or 1; no bounds or levels needed

``type`` may be left out: a column with ``levels`` is categorical, one without is continuous (the
sketch declarations written before types existed read unchanged). A schema drafted from data
(:func:`draft_schema`, ``dpmarket init``) carries ``draft = true``: its bounds are statistics of
the private data and must be replaced by public knowledge before anyone serves it
(:meth:`Schema.check_confirmed`).

The :attr:`Schema.fingerprint` is the SHA-256 of the canonical public schema (column names,
types, bounds, levels and the label; not the name, description or draft flag): two parties with
the same fingerprint hold the same declaration.

Pure: no I/O (the commands read the files, :mod:`dpmarket.runtime.tables` the tables).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.validation import check_config_keys, config_number, config_table

__all__ = [
    "COLUMN_TYPES",
    "LABEL_TYPES",
    "Column",
    "ColumnType",
    "Schema",
    "SchemaMismatchError",
    "disagreement",
    "draft_schema",
    "parse_columns",
]

ColumnType = Literal["continuous", "integer", "binary", "categorical"]
#: The column types, in the order the wire enumerates them.
COLUMN_TYPES: tuple[ColumnType, ...] = ("continuous", "integer", "binary", "categorical")
#: The types a label column may have (class labels).
LABEL_TYPES: tuple[ColumnType, ...] = ("binary", "integer", "categorical")
#: Most distinct whole values a drafted column may have to be drafted categorical.
DRAFT_MAX_LEVELS = 10
#: Problems :meth:`Schema.check_table` lists before it stops counting.
_MAX_PROBLEMS = 20
_COLUMN_KEYS = ("name", "type", "low", "high", "levels", "description")
_SCHEMA_KEYS = ("name", "description", "label", "draft", "columns")
_FINGERPRINT_VERSION = "dpmarket-schema-v1"


class SchemaMismatchError(InvalidArgumentError):
    """A table or another party's schema does not match a schema (the message names the
    column)."""


def _fmt(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Column:
    """One column of a schema.

    Attributes
    ----------
    name : str
        Non-empty.
    type : {"continuous", "integer", "binary", "categorical"}
        ``continuous``: any real in ``[low, high]``; ``integer``: whole numbers in ``[low,
        high]``; ``binary``: 0 or 1 (``low = 0``, ``high = 1``, ``levels = (0, 1)``);
        ``categorical``: one of ``levels`` (``low``/``high`` default to the smallest and largest
        level).
    low, high : float
        Public bounds, in the column's own units, ``low < high``: documented or physical ranges,
        never statistics of private data.
    levels : tuple of float
        Strictly increasing; empty for continuous and integer columns.
    description : str
        Free text (units, source of the bounds); not part of the fingerprint.

    Raises
    ------
    InvalidArgumentError
        If the name is empty, the type unknown, a bound is missing or not finite, ``low >=
        high``, a categorical column has no levels or levels outside its bounds, a binary
        column declares anything but ``[0, 1]``, or an integer column has fractional bounds.
    """

    name: str
    type: ColumnType
    low: float
    high: float
    levels: tuple[float, ...] = ()
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(
                f"a column name must be a non-empty string, got {self.name!r}"
            )
        at = f"column {self.name!r}"
        if self.type not in COLUMN_TYPES:
            raise InvalidArgumentError(
                f"{at}: type must be one of {', '.join(COLUMN_TYPES)}, got {self.type!r}"
            )
        low = config_number(self.low, f"{at} low")
        high = config_number(self.high, f"{at} high")
        if not low < high:
            raise InvalidArgumentError(f"{at}: bounds must satisfy low < high, got [{low}, {high}]")
        levels = tuple(config_number(v, f"{at} levels") for v in self.levels)
        if self.type == "binary":
            if (low, high) != (0.0, 1.0) or levels not in ((), (0.0, 1.0)):
                raise InvalidArgumentError(
                    f"{at}: a binary column holds 0 and 1 (bounds [0, 1], levels [0, 1]), got "
                    f"bounds [{_fmt(low)}, {_fmt(high)}] and levels {list(levels)}"
                )
            levels = (0.0, 1.0)
        elif self.type == "categorical":
            if not levels:
                raise InvalidArgumentError(f"{at}: a categorical column needs levels")
            if any(b <= a for a, b in pairwise(levels)):
                raise InvalidArgumentError(
                    f"{at}: levels must be strictly increasing, got {list(levels)}"
                )
            if levels[0] < low or levels[-1] > high:
                raise InvalidArgumentError(
                    f"{at}: levels {list(levels)} must lie within the bounds [{_fmt(low)}, "
                    f"{_fmt(high)}]"
                )
        elif levels:
            raise InvalidArgumentError(
                f"{at}: a {self.type} column has bounds, not levels (declare type = "
                "'categorical' for a column of listed values)"
            )
        if self.type == "integer" and not (low.is_integer() and high.is_integer()):
            raise InvalidArgumentError(
                f"{at}: an integer column's bounds must be whole numbers, got [{low}, {high}]"
            )
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "levels", levels)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> Column:
        """Parse one ``[[columns]]`` table (module docstring).

        Raises
        ------
        InvalidArgumentError
            Naming ``where`` and the key: an unknown or missing key, a wrong type, a bad value.
        """
        check_config_keys(config_table(data, where), _COLUMN_KEYS, where)
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{where} needs a name (a non-empty string)")
        at = f"{where}: column {name!r}"
        levels_value = data.get("levels")
        if levels_value is not None and (not isinstance(levels_value, list) or not levels_value):
            raise InvalidArgumentError(f"{at} levels must be a non-empty list of numbers")
        levels = tuple(config_number(v, f"{at} levels") for v in levels_value or ())
        kind = data.get("type", "categorical" if levels else "continuous")
        if kind not in COLUMN_TYPES:
            raise InvalidArgumentError(
                f"{at}: type must be one of {', '.join(COLUMN_TYPES)}, got {kind!r}"
            )
        description = data.get("description", "")
        if not isinstance(description, str):
            raise InvalidArgumentError(f"{at}: description must be a string")
        if kind == "binary":
            low = config_number(data.get("low", 0.0), f"{at} low")
            high = config_number(data.get("high", 1.0), f"{at} high")
        elif kind == "categorical":
            if len(levels) < 2:
                raise InvalidArgumentError(
                    f"{at}: a categorical column needs levels (two values or more)"
                )
            low = config_number(data["low"], f"{at} low") if "low" in data else min(levels)
            high = config_number(data["high"], f"{at} high") if "high" in data else max(levels)
        else:
            for key in ("low", "high"):
                if key not in data:
                    raise InvalidArgumentError(
                        f"{at} needs {key} (a public bound: a documented or physical range, "
                        "never a statistic of the data)"
                    )
            low = config_number(data["low"], f"{at} low")
            high = config_number(data["high"], f"{at} high")
        try:
            return cls(name, kind, low, high, levels, description)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{where}: {exc}") from None

    def canonical(self) -> dict[str, Any]:
        """The column's public declaration as plain data (what the fingerprint hashes)."""
        return {
            "name": self.name,
            "type": self.type,
            "low": self.low,
            "high": self.high,
            "levels": list(self.levels),
        }

    def describe(self) -> str:
        """``"age (integer in [0, 120])"``, ``"sex (categorical: 1, 2)"``, ``"high (binary)"``."""
        if self.type == "binary":
            return f"{self.name} (binary)"
        if self.type == "categorical":
            return f"{self.name} (categorical: {', '.join(_fmt(v) for v in self.levels)})"
        return f"{self.name} ({self.type} in [{_fmt(self.low)}, {_fmt(self.high)}])"

    def as_toml(self) -> str:
        """The column as a ``[[columns]]`` table (no trailing newline)."""
        lines = [
            "[[columns]]",
            f"name = {json.dumps(self.name)}",
            f"type = {json.dumps(self.type)}",
        ]
        if self.type == "categorical":
            lines.append(f"levels = [{', '.join(_toml_number(v) for v in self.levels)}]")
        elif self.type != "binary":
            lines += [f"low = {_toml_number(self.low)}", f"high = {_toml_number(self.high)}"]
        if self.description:
            lines.append(f"description = {json.dumps(self.description)}")
        return "\n".join(lines)

    def problems(self, values: NDArray[np.float64]) -> list[str]:
        """What in ``values`` (this column of a table) breaks the declaration: one line per
        kind of problem, naming the first row and value.

        For the owner's own console only: the text depends on the data.
        """
        out = []
        if self.type == "categorical" or self.type == "binary":
            bad = ~np.isin(values, np.asarray(self.levels))
            if bad.any():
                row = int(np.argmax(bad))
                allowed = ", ".join(_fmt(v) for v in self.levels)
                out.append(
                    f"column {self.name!r} is {self.type} ({allowed}) but holds {int(bad.sum())} "
                    f"other value(s), first {values[row]:g} at row {row}"
                )
            return out
        if self.type == "integer":
            bad = values != np.round(values)
            if bad.any():
                row = int(np.argmax(bad))
                out.append(
                    f"column {self.name!r} is integer but holds {int(bad.sum())} fractional "
                    f"value(s), first {values[row]:g} at row {row}"
                )
        outside = (values < self.low) | (values > self.high)
        if outside.any():
            row = int(np.argmax(outside))
            out.append(
                f"column {self.name!r} holds {int(outside.sum())} value(s) outside its public "
                f"bounds [{_fmt(self.low)}, {_fmt(self.high)}], first {values[row]:g} at row "
                f"{row}: fix the data, or the bounds if public knowledge allows wider ones"
            )
        return out


def _toml_number(x: float) -> str:
    """A float as TOML: whole numbers without a fraction, others by ``repr`` (exact)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 2**53 else repr(float(x))


def parse_columns(columns: Any, where: str) -> tuple[Column, ...]:
    """Parse a ``[[columns]]`` array (module docstring), in order.

    Raises
    ------
    InvalidArgumentError
        If ``columns`` is not a non-empty array of tables, a column is malformed
        (:meth:`Column.from_mapping`) or names repeat.
    """
    if not isinstance(columns, list) or not columns:
        raise InvalidArgumentError(
            f"{where}: declare the columns in order as [[columns]] tables (name, type, and low "
            "and high or levels)"
        )
    parsed = tuple(
        Column.from_mapping(column, f"{where}: columns[{j}]") for j, column in enumerate(columns)
    )
    names = [c.name for c in parsed]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidArgumentError(f"{where}: column names repeat: {repeated}")
    return parsed


@dataclass(frozen=True)
class Schema:
    """A dataset's public schema (module docstring).

    Attributes
    ----------
    columns : tuple of Column
        In the table's order; names unique.
    label : str or None
        The label column (class labels: binary, integer or categorical), or ``None``.
    name, description : str
        Free text; not part of the fingerprint.
    draft : bool
        Drafted from data (:func:`draft_schema`): its bounds are statistics of private data.
        Not part of the fingerprint; refused by :meth:`check_confirmed`.

    Raises
    ------
    InvalidArgumentError
        If there is no column, names repeat, or the label is not a column or not of a label type.
    """

    columns: tuple[Column, ...]
    label: str | None = None
    name: str = field(default="", compare=False)
    description: str = field(default="", compare=False)
    draft: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        columns = tuple(self.columns)
        if not columns:
            raise InvalidArgumentError("a schema needs at least one column")
        names = [c.name for c in columns]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise InvalidArgumentError(f"schema column names repeat: {repeated}")
        if self.label is not None:
            if self.label not in names:
                raise InvalidArgumentError(
                    f"the label {self.label!r} is not a column of the schema ({', '.join(names)})"
                )
            kind = columns[names.index(self.label)].type
            if kind not in LABEL_TYPES:
                raise InvalidArgumentError(
                    f"the label column {self.label!r} is {kind}; a label holds classes: declare "
                    f"it {', '.join(LABEL_TYPES)}"
                )
            if len(columns) == 1:
                raise InvalidArgumentError("a schema needs a column besides its label")
        object.__setattr__(self, "columns", columns)

    # ---------------------------------------------------------------------------- parsing
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "schema") -> Schema:
        """Parse a schema document (a parsed TOML file; layout in the module docstring).

        Raises
        ------
        InvalidArgumentError
            Naming ``source`` and the key or column.
        """
        check_config_keys(config_table(data, source), _SCHEMA_KEYS, source)
        for key in ("name", "description"):
            if not isinstance(data.get(key, ""), str):
                raise InvalidArgumentError(f"{source}: {key} must be a string")
        label = data.get("label")
        if label is not None and (not isinstance(label, str) or not label):
            raise InvalidArgumentError(f"{source}: label must be a column name, got {label!r}")
        draft = data.get("draft", False)
        if not isinstance(draft, bool):
            raise InvalidArgumentError(f"{source}: draft must be true or false, got {draft!r}")
        columns = parse_columns(data.get("columns"), source)
        try:
            return cls(columns, label, data.get("name", ""), data.get("description", ""), draft)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{source}: {exc}") from None

    def as_toml(self) -> str:
        """The schema as a TOML document :meth:`from_mapping` reads back (drafts carry their
        warning as comments)."""
        head = []
        if self.draft:
            head += [
                "# DRAFT written by `dpmarket init` from the private data: every bound and level",
                "# below is a statistic of that data (its minimum, maximum or distinct values).",
                "# Replace each by public knowledge (a documented or physical range), then delete",
                "# the line `draft = true`. Owners refuse to serve a draft.",
                "draft = true",
            ]
        if self.name:
            head.append(f"name = {json.dumps(self.name)}")
        if self.description:
            head.append(f"description = {json.dumps(self.description)}")
        if self.label is not None:
            head.append(f"label = {json.dumps(self.label)}")
        return "\n".join(head) + "\n\n" + "\n\n".join(c.as_toml() for c in self.columns) + "\n"

    # ------------------------------------------------------------------------- accessors
    @property
    def names(self) -> tuple[str, ...]:
        """Every column's name, in order."""
        return tuple(c.name for c in self.columns)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The columns but the label, in order: a summarization's features."""
        return tuple(c.name for c in self.columns if c.name != self.label)

    @property
    def binary_columns(self) -> tuple[str, ...]:
        """The binary columns (the targets a CAPE logistic regression or training may take)."""
        return tuple(c.name for c in self.columns if c.type == "binary")

    def column(self, name: str) -> Column:
        """The column called ``name``.

        Raises
        ------
        InvalidArgumentError
            If there is none (the message lists the schema's columns).
        """
        for c in self.columns:
            if c.name == name:
                return c
        raise InvalidArgumentError(
            f"the schema has no column {name!r}; its columns are {', '.join(self.names)}"
        )

    def bounds(self, names: Sequence[str] | None = None) -> list[tuple[str, float, float]]:
        """``(column, low, high)`` of the named columns (default: the features), for CAPE specs.

        Raises
        ------
        InvalidArgumentError
            For a name the schema lacks.
        """
        chosen = self.feature_names if names is None else names
        return [(c.name, c.low, c.high) for c in (self.column(n) for n in chosen)]

    def canonical(self) -> dict[str, Any]:
        """The public declaration the fingerprint hashes: columns (name, type, bounds, levels)
        and the label."""
        return {"columns": [c.canonical() for c in self.columns], "label": self.label}

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of :meth:`canonical`, as canonical JSON (sorted keys, no spaces)."""
        text = json.dumps(
            {"version": _FINGERPRINT_VERSION, **self.canonical()},
            sort_keys=True,
            separators=(",", ":"),
            allow_nan=False,
        )
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    # ---------------------------------------------------------------------------- checks
    def check_confirmed(self, source: str = "the schema") -> None:
        """Refuse a draft.

        Raises
        ------
        InvalidArgumentError
            If :attr:`draft` is set.
        """
        if self.draft:
            raise InvalidArgumentError(
                f"{source} is a draft: its bounds and levels were drafted from the private data "
                "and disclose it. Replace each by public knowledge (a documented or physical "
                "range), then delete the line `draft = true`"
            )

    def check_table(
        self, names: Sequence[str], values: ArrayLike, source: str = "the table"
    ) -> None:
        """Check a table against the schema: names and order, then every column's type, bounds
        and levels.

        Parameters
        ----------
        names : sequence of str
            The table's column names, in its order.
        values : array-like of shape (n_rows, len(names))
            Finite values.
        source : str
            The table's name for messages (a file name).

        Raises
        ------
        SchemaMismatchError
            Naming the first column whose name or position differs, or listing every column
            whose values break its type, bounds or levels (the first row and value of each).

        Notes
        -----
        The messages name rows and values: an owner's own console only, never another party.
        """
        names = [str(n) for n in names]
        expected = list(self.names)
        if names != expected:
            raise SchemaMismatchError(
                _name_difference(names, expected, have_label=source, want_label="the schema")
            )
        x = np.asarray(values, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(expected):
            raise SchemaMismatchError(
                f"{source}: values must have shape (n, {len(expected)}), got {x.shape}"
            )
        problems: list[str] = []
        for j, column in enumerate(self.columns):
            problems += column.problems(x[:, j])
        if problems:
            shown = problems[:_MAX_PROBLEMS]
            more = len(problems) - len(shown)
            raise SchemaMismatchError(
                f"{source} does not match the schema:\n  "
                + "\n  ".join(shown)
                + (f"\n  ... and {more} more" if more else "")
            )

    def difference(self, other: Schema | None, *, mine: str, theirs: str) -> str | None:
        """The first way ``other`` differs from this schema, naming the column, or ``None`` when
        they are the same declaration (equal fingerprints).

        Parameters
        ----------
        other : Schema or None
            ``None``: the other party declared no schema.
        mine, theirs : str
            The parties' names for the message (``"the consumer"``, ``"owner clinic-a"``).
        """
        if other is None:
            return f"{theirs} declares no schema; {mine} declares {len(self.columns)} column(s)"
        if other.fingerprint == self.fingerprint:
            return None
        if self.names != other.names:
            return _name_difference(
                list(other.names), list(self.names), have_label=theirs, want_label=mine
            )
        for a, b in zip(self.columns, other.columns, strict=True):
            if a != b:
                return f"column {a.name!r}: {mine} declares {a.describe()}, {theirs} {b.describe()}"
        return f"the label column: {mine} declares {self.label!r}, {theirs} {other.label!r}"

    def check_feature_names(self, names: Sequence[str], *, theirs: str) -> None:
        """Check that ``names`` are this schema's features, in order.

        Raises
        ------
        SchemaMismatchError
            Naming the first column that differs.
        """
        if tuple(names) != self.feature_names:
            raise SchemaMismatchError(
                _name_difference(
                    list(names),
                    list(self.feature_names),
                    have_label=theirs,
                    want_label="the schema",
                )
            )


def _name_difference(have: list[str], want: list[str], *, have_label: str, want_label: str) -> str:
    """The first difference between two column lists, naming the column."""
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{have_label} lacks column(s) {', '.join(repr(n) for n in missing)}")
        if extra:
            parts.append(
                f"{have_label} has column(s) {', '.join(repr(n) for n in extra)} that "
                f"{want_label} lacks"
            )
        return "; ".join(parts) + f" ({want_label}: {', '.join(want)})"
    if len(have) == len(want):
        for j, (a, b) in enumerate(zip(have, want, strict=True)):
            if a != b:
                return (
                    f"column {j + 1} is {a!r} in {have_label} but {b!r} in {want_label}: the same "
                    f"columns in another order ({have_label}: {', '.join(have)})"
                )
    return f"{have_label} repeats columns: {', '.join(have)}"


def draft_schema(
    names: Sequence[str],
    values: ArrayLike,
    *,
    label: str | None = None,
    name: str = "",
    max_levels: int = DRAFT_MAX_LEVELS,
) -> Schema:
    """Draft a schema from a table: types guessed, bounds and levels read from the data.

    A column holding only 0 and 1 is drafted binary. A column of whole numbers is drafted
    categorical (its values as levels) when it holds at most ``max_levels`` distinct values
    and they run without a gap from its minimum to its maximum (codes such as 1, 2, 3), or when
    it is the label (classes); otherwise integer, so that a count or an age whose sample skips
    values is not drafted as a list of the values seen, refusing every one it missed. Any other
    column is continuous. Bounds are the column's minimum and maximum.

    Parameters
    ----------
    names : sequence of str
    values : array-like of shape (n_rows, len(names))
        Finite values (several owners' tables stacked, for a deployment's common draft).
    label : str, optional
        The label column.
    name : str
        The schema's name.
    max_levels : int

    Returns
    -------
    Schema
        With :attr:`Schema.draft` set.

    Raises
    ------
    InvalidArgumentError
        If ``values`` has the wrong shape or a non-finite value, or a column is constant (no
        bounds ``low < high`` can be drafted from it).

    Notes
    -----
    Everything drafted is a statistic of the data: the minimum and maximum of a column are the
    values of two records. A draft must never be served (:meth:`Schema.check_confirmed`); its
    owner replaces every bound with public knowledge.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(names) or x.shape[0] == 0:
        raise InvalidArgumentError(
            f"values must have shape (n >= 1, {len(names)}), got {np.asarray(values).shape}"
        )
    if not np.isfinite(x).all():
        raise InvalidArgumentError("values must be finite to draft a schema")
    columns = []
    for j, column_name in enumerate(names):
        v = x[:, j]
        low, high = float(v.min()), float(v.max())
        distinct = np.unique(v)
        whole = bool((v == np.round(v)).all())
        if low == high:
            raise InvalidArgumentError(
                f"column {column_name!r} is constant: no bounds can be drafted from it; drop it "
                "from the tables (it tells nothing apart) or declare its public bounds by hand "
                "in the schema"
            )
        if set(distinct.tolist()) <= {0.0, 1.0}:
            columns.append(Column(str(column_name), "binary", 0.0, 1.0))
        elif (
            whole
            and distinct.size <= max_levels
            and (column_name == label or distinct.size == high - low + 1)
        ):
            columns.append(
                Column(str(column_name), "categorical", low, high, tuple(distinct.tolist()))
            )
        elif whole:
            columns.append(Column(str(column_name), "integer", low, high))
        else:
            columns.append(Column(str(column_name), "continuous", low, high))
    if label is not None and label in names:
        j = list(names).index(label)
        if columns[j].type == "continuous":
            raise InvalidArgumentError(
                f"the label column {label!r} holds fractional values; a label holds classes"
            )
    return Schema(tuple(columns), label, name=name, draft=True)


def disagreement(
    consumer: Schema | None,
    owners: Mapping[str, Schema | None],
    *,
    feature_names: Sequence[str] = (),
) -> str | None:
    """Why a session's parties do not share one schema, naming the first column that differs,
    or ``None`` when they do.

    Parameters
    ----------
    consumer : Schema or None
        The consumer's schema (``None``: it declared none).
    owners : mapping of str to (Schema or None)
        Each owner's schema, by owner name.
    feature_names : sequence of str
        The validation set's column names when the consumer read a table without a schema
        (compared with the owners' features); empty when unknown.

    Returns
    -------
    str or None
        ``None`` when every owner declares the consumer's schema, or, without a consumer
        schema, when the owners agree among themselves (all without a schema, or all with one
        whose features are ``feature_names`` when given).
    """
    if consumer is not None:
        for name, schema in owners.items():
            found = consumer.difference(schema, mine="the consumer", theirs=f"owner {name}")
            if found is not None:
                return found
        return None
    declared = [(name, s) for name, s in owners.items() if s is not None]
    if not declared:
        return None
    first_name, first = declared[0]
    for name, schema in owners.items():
        found = first.difference(schema, mine=f"owner {first_name}", theirs=f"owner {name}")
        if found is not None:
            return found
    if feature_names and tuple(feature_names) != first.feature_names:
        return _name_difference(
            list(feature_names),
            list(first.feature_names),
            have_label="the validation set",
            want_label="the owners' schema",
        )
    return None
