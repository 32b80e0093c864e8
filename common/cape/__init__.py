"""Correlation Assisted Private Estimation (Imtiaz, Mohammadi & Sarwate): zero-sum noise,
the CAPE estimator and Theorem 1, the CAPE mean, the improved functional mechanism and capeFM,
and distributed DP gradient descent, with the jobs' public specs and plans.

Site-side and aggregator-side steps are separate functions on numpy arrays, so a service layer can
run each where it belongs; the ``run_*`` drivers compose them in one process.
"""
