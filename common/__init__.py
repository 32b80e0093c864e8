"""Numeric and cryptographic kernels of dpmarket: pure functions and small classes on numpy arrays.

Nothing in this package performs I/O, logs data or imports gRPC; services adapt these kernels.
"""
