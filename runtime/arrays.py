"""Conversion between numpy arrays and the ``dpmarket.v1.Array`` message.

Arrays cross the wire as packed little-endian bytes in C order with explicit dtype and shape
(``array.proto``); this module is the only place that packs or unpacks them.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from dpmarket.v1 import array_pb2

_TO_WIRE: dict[np.dtype, array_pb2.Dtype.ValueType] = {
    np.dtype(np.float32): array_pb2.DTYPE_FLOAT32,
    np.dtype(np.float64): array_pb2.DTYPE_FLOAT64,
    np.dtype(np.int64): array_pb2.DTYPE_INT64,
}
_FROM_WIRE: dict[array_pb2.Dtype.ValueType, np.dtype] = {
    v: k.newbyteorder("<") for k, v in _TO_WIRE.items()
}

#: Largest number of elements accepted in one array (512 MiB of float64).
MAX_ELEMENTS = 64 * 1024 * 1024


def array_to_proto(values: NDArray) -> array_pb2.Array:
    """Pack ``values`` (float32, float64 or int64, any shape) into an ``Array`` message.

    Raises
    ------
    TypeError
        If the dtype is not float32, float64 or int64.
    """
    arr = np.asarray(values)
    wire = _TO_WIRE.get(arr.dtype.newbyteorder("="))
    if wire is None:
        raise TypeError(f"arrays on the wire are float32, float64 or int64, got {arr.dtype}")
    data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
    return array_pb2.Array(dtype=wire, shape=list(arr.shape), data=data)


def array_from_proto(
    message: array_pb2.Array,
    name: str,
    *,
    ndim: int | None = None,
    dtype: type | None = None,
) -> NDArray:
    """Unpack an ``Array`` message into a native-endian numpy array.

    Parameters
    ----------
    message : dpmarket.v1.Array
    name : str
        Field name used in error messages.
    ndim : int, optional
        Required number of dimensions.
    dtype : numpy dtype, optional
        Convert to this dtype (float32 to float64 widening is exact).

    Raises
    ------
    ValueError
        If the dtype is unspecified, the shape is negative or too large, the byte length does not
        match the shape, or the number of dimensions is not ``ndim``.
    """
    wire_dtype = _FROM_WIRE.get(message.dtype)
    if wire_dtype is None:
        raise ValueError(f"{name}: dtype is missing or unknown ({message.dtype})")
    shape = tuple(message.shape)  # Python ints: no overflow in the product below
    if shape and min(shape) < 0:
        raise ValueError(f"{name}: shape {shape} has a negative dimension")
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {shape}")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise ValueError(f"{name}: {count} elements exceed the limit of {MAX_ELEMENTS}")
    if len(message.data) != count * wire_dtype.itemsize:
        raise ValueError(
            f"{name}: {len(message.data)} bytes do not hold shape {shape} of {wire_dtype.name}"
        )
    arr = np.frombuffer(message.data, dtype=wire_dtype).reshape(shape)
    out_dtype = np.dtype(dtype) if dtype is not None else wire_dtype.newbyteorder("=")
    return arr.astype(out_dtype, copy=True)


def labeled_points_from_proto(
    points: array_pb2.Array, labels: array_pb2.Array | None, name: str
) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """Unpack points (float64, shape (n, n_features)) and optional labels (int64, shape (n,)).

    Raises
    ------
    ValueError
        If either array is malformed or the label count differs from the point count.
    """
    out = array_from_proto(points, name, ndim=2, dtype=np.float64)
    if labels is None:
        return out, None
    out_labels = array_from_proto(labels, f"{name} labels", ndim=1, dtype=np.int64)
    if out_labels.shape[0] != out.shape[0]:
        raise ValueError(f"{name}: {out_labels.shape[0]} labels for {out.shape[0]} points")
    return out, out_labels
