"""dpmarket for programs: a consumer's requests to a curator, and an owner's own ledger and
publications, each returning typed results.

A consumer connects to a curator over mTLS with its certificate (the files ``dpmarket pki issue``
writes, or those ``dpmarket init`` lays out):

>>> from dpmarket.client import Consumer
>>> from dpmarket.common.summarization.methods import CandidatesConfig
>>> with Consumer("127.0.0.1:50050", pki_dir="pki", name="alice") as alice:  # doctest: +SKIP
...     result = alice.summarize(CandidatesConfig(summary_size=20), validation, seed=1)
...     result.report.ledger.owner_terms.epsilon  # what the session spent of each owner's data

An owner reads its own ledger on its own machine, and publishes its sketches:

>>> from dpmarket.client import ledger  # doctest: +SKIP
>>> ledger("state/owner-0").budget.epsilon.left  # doctest: +SKIP

Every call raises the :class:`dpmarket.common.errors.DPMarketError` matching what went wrong
(``InvalidArgumentError`` for a malformed validation set, ``FailedPreconditionError`` for an
owner's policy refusing a session, ``UnavailableError`` when the curator cannot be reached); a
summarization session that failed raises :class:`~dpmarket.consumer.client.SessionFailedError`,
whose ``report`` holds what it spent. The command line (``dpmarket consumer request``,
``explore``, ``rank-owners``, ``cape``; ``dpmarket owner ledger``, ``publish``) runs the same
code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.market.money import credits_cap
from dpmarket.common.market.pricing import Quote
from dpmarket.common.market.terms import NO_REWARD, RewardOffer
from dpmarket.common.schema import Schema
from dpmarket.common.sketches.spec import SketchSpec
from dpmarket.common.summarization.methods import SummarizationConfig
from dpmarket.common.summarization.summary import OwnerSelection, ProgressEvent, SummaryResult
from dpmarket.consumer.catalogue import Exploration, ExploreOptions, Ranking, explore, rank
from dpmarket.consumer.client import CapeFit, CapeMean, CapeNetwork, CuratorClient
from dpmarket.consumer.explore import Query
from dpmarket.consumer.report import MMDCurve, SummaryEvaluation, evaluate_summary, summary_curve
from dpmarket.owner.publishing import Publishing
from dpmarket.owner.statement import LedgerStatement
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.tables import PointSet
from dpmarket.runtime.transport import TransportSecurity

__all__ = [
    "Consumer",
    "Exploration",
    "ExploreOptions",
    "LedgerStatement",
    "Publishing",
    "Query",
    "Ranking",
    "credentials",
    "ledger",
    "publish",
]


def credentials(
    role: Literal["consumer", "owner"],
    *,
    pki_dir: str | Path | None = None,
    name: str | None = None,
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    insecure: bool = False,
) -> TransportSecurity:
    """A party's mTLS credentials: ``pki_dir`` and ``name`` (the layout ``dpmarket pki issue``
    writes: ``ca.crt``, ``<role>-<name>.crt`` and ``.key``), or the three files, or plaintext.

    Parameters
    ----------
    role : {"consumer", "owner"}
    pki_dir, name : optional
    ca, cert, key : path, optional
    insecure : bool
        Plaintext gRPC with no identities (a development curator started ``--insecure``).

    Raises
    ------
    ValueError
        If neither ``pki_dir`` with ``name`` nor the three files (nor ``insecure``) are given,
        or the certificate is another role's.
    OSError
        If a file cannot be read.
    """
    if insecure:
        return TransportSecurity.plaintext()
    if pki_dir is not None and name is not None:
        files = identity_files(Path(pki_dir), Identity(role, name))
    elif ca is not None and cert is not None and key is not None:
        files = (Path(ca), Path(cert), Path(key))
    else:
        raise ValueError("give pki_dir and name, or ca, cert and key (or insecure=True)")
    security = TransportSecurity.from_files(*(str(f) for f in files))
    if security.identity is None or security.identity.role != role:
        raise ValueError(f"the certificate {files[1]} is for {security.identity}, not a {role}")
    return security


class Consumer:
    """A consumer's connection to a curator: summaries, exploration of the sketch catalogue,
    owner ranking and the CAPE jobs.

    Parameters
    ----------
    curator : str
        ``HOST:PORT`` of the curator.
    security : TransportSecurity, optional
        The consumer's credentials (default: :func:`credentials` of the keyword arguments).
    curator_name : str
        The name the curator's certificate must carry.
    timeout : float
        Deadline of unary calls, seconds.
    **files
        ``pki_dir``, ``name``, ``ca``, ``cert``, ``key``, ``insecure``: as :func:`credentials`.

    Attributes
    ----------
    client : CuratorClient
        The gRPC client beneath (every RPC of the curator's services).

    Raises
    ------
    dpmarket.runtime.transport.ConnectError
        If the curator cannot be reached or proves another identity (the message says which).
    """

    def __init__(
        self,
        curator: str,
        security: TransportSecurity | None = None,
        *,
        curator_name: str = "curator",
        timeout: float = 60.0,
        **files: Any,
    ) -> None:
        if security is None:
            security = credentials("consumer", **files)
        self.target = curator
        self.curator_name = curator_name
        self.client = CuratorClient(
            curator, security, curator=Identity("curator", curator_name), timeout=timeout
        )

    def close(self) -> None:
        """Close the connection."""
        self.client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -------------------------------------------------------------------------- summaries
    def summarize(
        self,
        config: SummarizationConfig,
        validation: ArrayLike,
        seed_set: ArrayLike | None = None,
        *,
        seed: int | None = None,
        selection: OwnerSelection | None = None,
        schema: Schema | None = None,
        feature_names: Sequence[str] = (),
        on_progress: Callable[[ProgressEvent], None] | None = None,
        request_id: str | None = None,
        max_cost: str | int | Decimal | None = None,
        reward: RewardOffer | None = None,
    ) -> SummaryResult:
        """A summary of ``config.summary_size`` owner points matching ``validation``.

        Parameters
        ----------
        config : SummarizationConfig
            The method and its parameters (:mod:`dpmarket.common.summarization.methods`:
            ``CandidatesConfig``, the default method, ``PrivateConfig``, ``RoundsConfig``,
            ``UniformConfig``, ``GreedyConfig``).
        validation : array-like of shape (m, n)
            The validation set D_v (features only: labels never leave the consumer).
        seed_set : array-like of shape (n0, n), optional
            A public seed set.
        seed : int, optional
            Seeds every draw (reproducible; the curator must allow seeded sessions).
        selection : OwnerSelection, optional
            Owners to leave out, and the fewest the session may open with (default: every
            owner must take part).
        schema, feature_names
            The public schema the validation set was read through, or its column names.
        on_progress : callable, optional
            Receives every :class:`ProgressEvent`.
        request_id : str, optional
            Idempotency key (default: a fresh one; a retry never opens a second session).
        max_cost : str, int or Decimal, optional
            The most the session may cost, in credits (``"12.5"``; not a float): the curator
            quotes the request from every owner's prices before anything is released, and a
            quote above the cap is refused (``FailedPreconditionError``), nothing released or
            charged anywhere. The quote is ``result.report.quote``, the settled cost
            ``result.report.cost`` (micro-credits).
        reward : RewardOffer, optional
            A value-based reward (:class:`~dpmarket.common.market.terms.RewardOffer`: rule,
            micro-credits, payout epsilon) split among the owners by the private payout
            release.

        Returns
        -------
        SummaryResult
            The points (p, n) in the order added, their labels and owners, and the session's
            :class:`~dpmarket.common.summarization.summary.SessionReport` (its typed ledger:
            ``report.ledger``).

        Raises
        ------
        dpmarket.common.errors.InvalidArgumentError
            If ``config`` is not a :class:`SummarizationConfig` (a dict of options, say: build
            the method's class, or :func:`~dpmarket.common.summarization.methods.method_config`).
        SessionFailedError
            If the session failed (its ``report`` holds what it spent).
        dpmarket.common.errors.DPMarketError
            If the curator refused the request (a parameter outside its policy, an owner's
            policy refusing the terms, ...).
        """
        config = _method(config)
        points = np.asarray(validation, dtype=np.float64)
        seeds = np.zeros((0, points.shape[-1])) if seed_set is None else seed_set
        return self.client.summarize(
            config,
            points,
            np.asarray(seeds, dtype=np.float64),
            seed=seed,
            on_progress=on_progress,
            request_id=request_id,
            selection=selection,
            schema=schema,
            feature_names=feature_names,
            max_cost=credits_cap(max_cost),
            reward=reward or NO_REWARD,
        )

    def quote(
        self,
        config: SummarizationConfig,
        validation: ArrayLike,
        seed_set: ArrayLike | None = None,
        *,
        selection: OwnerSelection | None = None,
        schema: Schema | None = None,
        feature_names: Sequence[str] = (),
        max_cost: str | int | Decimal | None = None,
        reward: RewardOffer | None = None,
    ) -> Quote:
        """The most :meth:`summarize` with these arguments would cost, without running it:
        nothing is released or charged, no session is created.

        Returns
        -------
        Quote
            One line per owner (its limits and its charge at them, micro-credits) and
            ``total``, the maximum cost in micro-credits.

        Raises
        ------
        dpmarket.common.errors.DPMarketError
            As :meth:`summarize` before its session opens (``FailedPreconditionError`` for a
            quote above ``max_cost``).
        """
        config = _method(config)
        points = np.asarray(validation, dtype=np.float64)
        seeds = np.zeros((0, points.shape[-1])) if seed_set is None else seed_set
        return self.client.quote_session(
            config,
            points,
            np.asarray(seeds, dtype=np.float64),
            selection=selection,
            schema=schema,
            feature_names=feature_names,
            max_cost=credits_cap(max_cost),
            reward=reward or NO_REWARD,
        )

    @staticmethod
    def evaluate(
        result: SummaryResult,
        validation: ArrayLike,
        gamma: float,
        *,
        test: PointSet | None = None,
        seed: int = 0,
    ) -> SummaryEvaluation:
        """Measure a summary as ``dpmarket consumer request`` does
        (:func:`~dpmarket.consumer.report.evaluate_summary`): MMD² to D_v and to a labeled test
        set, the accuracy of a linear SVM trained on it, every owner's part."""
        points = np.asarray(validation, dtype=np.float64)
        return evaluate_summary(result, points, gamma, test=test, seed=seed)

    @staticmethod
    def curve(result: SummaryResult, validation: ArrayLike, gamma: float) -> MMDCurve:
        """MMD² to D_v of the summary's first k points, for k up to p, and every owner's share
        (:func:`~dpmarket.consumer.report.summary_curve`)."""
        return summary_curve(result, np.asarray(validation, dtype=np.float64), gamma)

    # -------------------------------------------------------------------- the catalogue
    def sketch_specs(self) -> list[SketchSpec]:
        """The catalogue's specs, each validated."""
        return self.client.sketch_specs()

    def explore(
        self,
        query: Query,
        *,
        spec: str | None = None,
        owners: Sequence[str] = (),
        options: ExploreOptions | None = None,
    ) -> Exploration:
        """Answer ``query`` about ``owners``' data from their published sketches, computed here
        (:func:`dpmarket.consumer.catalogue.explore`: no owner is asked anything).

        Raises
        ------
        dpmarket.consumer.catalogue.SpecChoiceError
            If the catalogue's specs do not say which to read (name one).
        dpmarket.common.errors.NotFoundError
            If an owner asked about has published no sketch under them.
        """
        return explore(self.client, query, spec=spec, owners=owners, options=options)

    def rank_owners(
        self,
        validation: ArrayLike,
        *,
        spec: str | None = None,
        owners: Sequence[str] = (),
        schema: Schema | None = None,
    ) -> Ranking:
        """Owners ranked by the MMD between ``validation`` and their RFF sketches
        (:func:`dpmarket.consumer.catalogue.rank`); it never leaves this process.

        Parameters
        ----------
        validation : array-like of shape (m, d) or (m, d - 1)
            D_v in the spec's column order; or, when the spec's columns include the label of
            ``schema``, the features alone (the array :meth:`summarize` takes): each row then
            counts once per value of the label
            (:func:`~dpmarket.consumer.catalogue.label_completed`).
        spec : str, optional
            An RFF spec (default: the only one).
        owners : sequence of str
            Rank only these owners.
        schema : Schema, optional
            The consumer's schema, whose label the spec's extra column is.

        Returns
        -------
        Ranking
            Owners best first, each MMD² with its interval.

        Raises
        ------
        dpmarket.common.errors.InvalidArgumentError
            If ``validation`` has neither the spec's columns nor all but the label (the message
            names the spec and its columns), or a record lies outside the spec's domain.
        dpmarket.consumer.catalogue.SpecChoiceError
            If no spec is named and the catalogue has not exactly one RFF spec.
        """
        label = schema.label if schema is not None else None
        points = np.asarray(validation, dtype=np.float64)
        return rank(self.client, points, spec=spec, owners=owners, label=label)

    # ------------------------------------------------------------------------------ CAPE
    def cape_mean(
        self,
        spec: CapeMeanSpec,
        *,
        seed: int | None = None,
        request_id: str | None = None,
        timeout: float = 600.0,
        schema: Schema | None = None,
        min_owners: int = 0,
        max_cost: str | int | Decimal | None = None,
    ) -> CapeMean:
        """The mean of some columns across the owners (CAPE; ``EstimateCapeMean``), with its
        intervals (:meth:`CuratorClient.estimate_cape_mean`).

        Parameters
        ----------
        spec : CapeMeanSpec
            The columns, their bounds and the guarantee (epsilon, delta).
        seed : int, optional
            Seeds the owners' noise (reproducible; the curator must allow seeded jobs).
        request_id : str, optional
            Idempotency key (default: a fresh one; a retry with the same key returns the same
            answer and charges nothing new).
        timeout : float
            Deadline of the job, seconds.
        schema : Schema, optional
            The consumer's schema: the curator refuses owners that declare another before
            anything is charged.
        min_owners : int
            The fewest owners the job may open with (0: every owner the curator serves).
        max_cost : str, int or Decimal, optional
            The most the job may cost, in credits (``"12.5"``, ``5``; not a float), as
            :meth:`summarize`'s: a quote above it is refused before any owner opens the job.

        Returns
        -------
        CapeMean
            The mean of each column, in the spec's order, and the job's report (sites, noise,
            epsilon and delta per site, each owner's spend, quote and cost in micro-credits).

        Raises
        ------
        ValueError
            If ``max_cost`` is not an amount of credits
            (:func:`~dpmarket.common.market.money.parse_credits`).
        dpmarket.common.errors.DPMarketError
            The error matching the curator's status (``FailedPreconditionError`` for a quote
            above ``max_cost`` or an owner's policy refusing the job, nothing charged).
        """
        return self.client.estimate_cape_mean(
            spec,
            seed=seed,
            request_id=request_id,
            timeout=timeout,
            schema=schema,
            min_owners=min_owners,
            max_cost=credits_cap(max_cost),
        )

    def cape_quote(
        self,
        spec: CapeMeanSpec | CapeJobSpec | CapeTrainingSpec,
        *,
        seed: int | None = None,
        schema: Schema | None = None,
        min_owners: int = 0,
        max_cost: str | int | Decimal | None = None,
    ) -> Quote:
        """The most a CAPE job (a mean, a regression or a training) would cost, without running
        it (``QuoteCape``; :meth:`CuratorClient.quote_cape`): the owners are asked for their
        prices only; nothing is opened, released or charged, and no job is recorded.

        Parameters
        ----------
        spec : CapeMeanSpec, CapeJobSpec or CapeTrainingSpec
        seed, schema, min_owners, max_cost
            As :meth:`cape_mean` (``max_cost`` in credits).

        Returns
        -------
        Quote
            One line per owner (its price per unit epsilon at the job's epsilon, raised to its
            minimum, micro-credits) and ``total``.

        Raises
        ------
        ValueError
            If ``max_cost`` is not an amount of credits.
        dpmarket.common.errors.DPMarketError
            As the job would before any owner opens it (``FailedPreconditionError`` for a
            quote above ``max_cost``).
        """
        return self.client.quote_cape(
            spec, seed=seed, schema=schema, min_owners=min_owners, max_cost=credits_cap(max_cost)
        )

    def cape_fit(
        self,
        spec: CapeJobSpec,
        *,
        seed: int | None = None,
        request_id: str | None = None,
        timeout: float = 600.0,
        schema: Schema | None = None,
        min_owners: int = 0,
        max_cost: str | int | Decimal | None = None,
    ) -> CapeFit:
        """A linear or logistic regression fitted by capeFM across the owners (``FitCape``;
        :meth:`CuratorClient.fit_cape`).

        Parameters
        ----------
        spec : CapeJobSpec
            The regression (features, label, bounds, guarantee).
        seed, request_id, timeout, schema, min_owners, max_cost
            As :meth:`cape_mean` (``max_cost`` in credits).

        Returns
        -------
        CapeFit
            The coefficients on the raw feature columns, the intercept and the job's report.

        Raises
        ------
        ValueError
            If ``max_cost`` is not an amount of credits.
        dpmarket.common.errors.DPMarketError
            As :meth:`cape_mean`.
        """
        return self.client.fit_cape(
            spec,
            seed=seed,
            request_id=request_id,
            timeout=timeout,
            schema=schema,
            min_owners=min_owners,
            max_cost=credits_cap(max_cost),
        )

    def cape_train(
        self,
        spec: CapeTrainingSpec,
        *,
        seed: int | None = None,
        request_id: str | None = None,
        timeout: float = 1800.0,
        schema: Schema | None = None,
        min_owners: int = 0,
        max_cost: str | int | Decimal | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> CapeNetwork:
        """A 2-layer network trained by CAPE gradient descent across the owners
        (``TrainCape``; :meth:`CuratorClient.train_cape`).

        Parameters
        ----------
        spec : CapeTrainingSpec
            The columns, bounds, hyper-parameters and budget.
        seed, request_id, timeout, schema, min_owners, max_cost
            As :meth:`cape_mean` (``max_cost`` in credits; ``timeout`` covers every iteration).
        on_progress : callable, optional
            ``on_progress(done, total)`` after every iteration (best effort).

        Returns
        -------
        CapeNetwork
            The trained parameters and the job's report.

        Raises
        ------
        ValueError
            If ``max_cost`` is not an amount of credits.
        dpmarket.common.errors.DPMarketError
            As :meth:`cape_mean`.
        """
        return self.client.train_cape(
            spec,
            seed=seed,
            request_id=request_id,
            timeout=timeout,
            schema=schema,
            min_owners=min_owners,
            on_progress=on_progress,
            max_cost=credits_cap(max_cost),
        )


def _method(config: object) -> SummarizationConfig:
    """``config`` if it is a summarization method's configuration.

    Raises
    ------
    InvalidArgumentError
        Naming what was given and what to pass instead.
    """
    if isinstance(config, SummarizationConfig):
        return config
    raise InvalidArgumentError(
        f"config must be a summarization method's configuration (a SummarizationConfig), got "
        f"{type(config).__name__} {config!r}: pass e.g. CandidatesConfig(summary_size=20) from "
        "dpmarket.common.summarization.methods, or method_config('candidates', **options) to "
        "build one from a mapping"
    )


# ---------------------------------------------------------------------------------- owners
def ledger(
    data_dir: str | Path, *, session: str | None = None, limit: int | None = None
) -> LedgerStatement:
    """What an owner's ledger has charged, and what is left of each budget (read-only; the
    policy the ledger recorded at the owner's last start): ``dpmarket owner ledger``.

    Parameters
    ----------
    data_dir : path
        The owner's data directory.
    session : str, optional
        Only this session's charges, and its totals against the per-session limits.
    limit : int, optional
        Only the last ``limit`` charges (the totals always cover every charge).

    Raises
    ------
    dpmarket.owner.ledger.LedgerMissingError
        If the directory holds no ledger (a :class:`~dpmarket.common.errors.NotFoundError`, and
        a ``FileNotFoundError``).
    """
    from dpmarket.owner.ledger import OwnerLedger
    from dpmarket.owner.statement import ledger_statement

    with OwnerLedger(Path(data_dir), None) as book:
        return ledger_statement(book, session=session, limit=limit)


def publish(
    curator: str,
    *,
    table: str | Path,
    data_dir: str | Path,
    specs: Sequence[str] = (),
    epsilon: float | None = None,
    seed: int | None = None,
    schema: str | None = None,
    policy: str | None = None,
    security: TransportSecurity | None = None,
    curator_name: str = "curator",
    **files: Any,
) -> Publishing:
    """Publish an owner's private sketches of ``table`` under ``specs`` (default: every spec of
    the curator's catalogue), each charged to the owner's own ledger before it is sent:
    ``dpmarket owner publish``.

    Parameters
    ----------
    curator : str
        ``HOST:PORT`` of the curator.
    table, data_dir : path
        The owner's table and data directory (its ledger and policy).
    specs : sequence of str
        The specs to publish.
    epsilon : float, optional
        Each new sketch's epsilon (default: its spec's). A spec whose map this owner released
        at another epsilon refuses the call before anything is charged.
    seed : int, optional
        Seeds the noise (reproducible by whoever knows it).
    schema : str, optional
        The owner's confirmed schema file.
    policy : str, optional
        The owner's policy file (default: the data directory's).
    security : TransportSecurity, optional
        The owner's credentials (default: :func:`credentials` of ``**files``).

    Returns
    -------
    Publishing
        Every spec's delivery and what is left of the owner's budgets.

    Raises
    ------
    dpmarket.owner.sketches.AnotherEpsilonError
        ``epsilon`` is given and a spec's map was released at another epsilon
        (``ALREADY_EXISTS``): nothing of any spec charged or sent; the message names the stored
        epsilon.
    dpmarket.common.errors.DPMarketError
        From the catalogue or the ledger (a charge the owner's policy refuses, ...).
    """
    from dpmarket.owner.publishing import publish_sketches

    return publish_sketches(
        curator,
        security if security is not None else credentials("owner", **files),
        table_path=table,
        data_dir=data_dir,
        specs=specs,
        epsilon=epsilon,
        seed=seed,
        schema_path=schema,
        policy_path=policy,
        curator_name=curator_name,
    )
