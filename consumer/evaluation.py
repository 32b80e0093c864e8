"""Downstream evaluation of a summary: how well a model trained on it does on the target task."""

from __future__ import annotations

import logging
import warnings

import numpy as np
from numpy.typing import NDArray

from dpmarket.runtime.tables import PointSet

__all__ = ["downstream_accuracy", "hash_model_accuracy"]

_LOGGER = logging.getLogger(__name__)

#: Iteration cap of liblinear; far above what standardized summaries of a few hundred points need.
_MAX_ITER = 100_000


def downstream_accuracy(train: PointSet, test: PointSet, *, seed: int = 0) -> float:
    """Train a linear SVM on a summary and return its accuracy on a labeled test set.

    The model is ``StandardScaler`` (fitted on the training summary only) followed by
    ``LinearSVC`` (liblinear, squared hinge loss, ``C = 1``, ``dual="auto"``), as in the
    summarization paper's Allstate experiment. If the summary holds a single class, no SVM can
    be fitted; a ``DummyClassifier(strategy="most_frequent")`` then predicts that class for every
    test point.

    Parameters
    ----------
    train : PointSet
        The summary ``D_s``: features of shape (p, n_features) and labels of shape (p,).
    test : PointSet
        Held-out target data: features of shape (n_test, n_features) and labels (n_test,).
    seed : int, default 0
        ``random_state`` of ``LinearSVC`` (liblinear shuffles coordinates in the dual solver).

    Returns
    -------
    float
        Fraction of test points classified correctly, in [0, 1].

    Raises
    ------
    ValueError
        If ``train`` or ``test`` has no labels, or their feature counts differ.

    Notes
    -----
    ``max_iter`` is 100,000 so that liblinear converges on summaries of the sizes used here
    (tens to a few thousand points). Should it still stop early, the ``ConvergenceWarning`` is
    caught and reported through this module's logger at WARNING level instead of being raised
    as a warning, and the (approximate) model is evaluated anyway.

    References
    ----------
    Summarization paper, Section 4 (downstream classification on the summary).
    """
    if train.labels is None:
        raise ValueError(f"training set {train.name!r} has no labels; a classifier needs them")
    if test.labels is None:
        raise ValueError(f"test set {test.name!r} has no labels; accuracy needs them")
    if train.n_features != test.n_features:
        raise ValueError(
            f"training set {train.name!r} has {train.n_features} features but test set "
            f"{test.name!r} has {test.n_features}"
        )
    # scikit-learn (about a second to import) on first use: a program that imports the client
    # without evaluating a summary does not pay for it.
    from sklearn.dummy import DummyClassifier
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.pipeline import Pipeline, make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    model: Pipeline | DummyClassifier
    if np.unique(train.labels).size < 2:
        model = DummyClassifier(strategy="most_frequent")
        model.fit(train.features, train.labels)
    else:
        model = make_pipeline(
            StandardScaler(),
            LinearSVC(dual="auto", max_iter=_MAX_ITER, random_state=seed),
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            model.fit(train.features, train.labels)
        for warning in caught:
            if issubclass(warning.category, ConvergenceWarning):
                _LOGGER.warning(
                    "LinearSVC did not converge on %r (%d points): %s",
                    train.name,
                    train.n_points,
                    warning.message,
                )
            else:
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
    predicted = model.predict(test.features)
    return float(np.mean(predicted == test.labels))


def hash_model_accuracy(
    hashes: NDArray[np.float64],
    labels: NDArray[np.int64],
    test_hashes: NDArray[np.float64],
    test_labels: NDArray[np.int64],
    *,
    seed: int = 0,
) -> float:
    """The consumer's kernel model on a hashes summary: a linear SVM on the h1 hashes.

    A linear model on random Fourier features approximates a model in the RBF kernel's feature space
    (Rahimi & Recht 2008), which is what Appendix F of the summarization paper says the hashes are
    for. The model is :func:`downstream_accuracy`'s (``StandardScaler`` and ``LinearSVC``), trained
    on the summary's hashes and labels and scored on the hashes of the consumer's labeled test
    points, which an owner computed under the same secret map
    (:meth:`dpmarket.owner.protocol.Owner.hash_points`; the consumer cannot: it does not know the
    map).

    Parameters
    ----------
    hashes : ndarray of shape (p, d)
    labels : ndarray of shape (p,), int
    test_hashes : ndarray of shape (n_test, d)
    test_labels : ndarray of shape (n_test,), int
    seed : int
        ``random_state`` of ``LinearSVC``.

    Returns
    -------
    float
        Accuracy in [0, 1].

    Raises
    ------
    ValueError
        As :func:`downstream_accuracy` (e.g. hash dimensions that differ).
    """
    return downstream_accuracy(
        PointSet(hashes, labels, "hashes summary"),
        PointSet(test_hashes, test_labels, "hashed test set"),
        seed=seed,
    )
