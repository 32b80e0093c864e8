"""Benchmarks of dpmarket (``make bench``): JSON reports, kept apart from the tests.

See ``bench/README.md`` for what each benchmark measures and how to read its output.
"""
