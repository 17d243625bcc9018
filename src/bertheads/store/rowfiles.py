"""Arrays written row block by row block into files laid out in advance, so that building a
large feature array never holds it in memory.

`.npy` files get numpy's own header (`np.load(path, mmap_mode="r")` maps them); a
safetensors file gets the format's header (8-byte little-endian length, JSON with each
tensor's dtype, shape and byte range, padded to 8 bytes) followed by the raw tensors, so
`safetensors.safe_open` reads it. Rows go to their place with `os.pwrite`, in any order.
"""

from __future__ import annotations

import json
import os
import struct
from math import prod
from pathlib import Path

import numpy as np

SAFETENSORS_DTYPES = {"float16": "F16", "float32": "F32", "int32": "I32", "int64": "I64", "int8": "I8"}


class RowFile:
    """One preallocated C-ordered array inside an open file; `write(row, block)` stores rows
    `row .. row + len(block)` (converted to the array's dtype)."""

    def __init__(self, fd: int, base: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.fd, self.base, self.shape, self.dtype = fd, base, tuple(shape), np.dtype(dtype)
        self.row_bytes = prod(self.shape[1:]) * self.dtype.itemsize
        self.nbytes = self.shape[0] * self.row_bytes

    def write(self, row: int, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=self.dtype)
        if block.shape[1:] != self.shape[1:] or row < 0 or row + block.shape[0] > self.shape[0]:
            raise ValueError(f"rows {row}..{row + block.shape[0]} of shape {block.shape[1:]} do not fit {self.shape}")
        data = memoryview(block).cast("B")
        offset = self.base + row * self.row_bytes
        while data:
            written = os.pwrite(self.fd, data, offset)
            data, offset = data[written:], offset + written


class ArrayFile:
    """A file holding preallocated arrays (`arrays[name]` is a `RowFile`); close it to flush."""

    def __init__(self, path: Path, fd: int, arrays: dict[str, RowFile]) -> None:
        self.path, self.fd, self.arrays = path, fd, arrays

    def __getitem__(self, name: str) -> RowFile:
        return self.arrays[name]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ArrayFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def create_npy(path: str | Path, shape: tuple[int, ...], dtype) -> ArrayFile:
    """A `.npy` file of `shape` (holes until written), open for `write`."""
    path = Path(path)
    dtype = np.dtype(dtype)
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)})
        base = fh.tell()
        fh.truncate(base + prod(shape) * dtype.itemsize)
    fd = os.open(path, os.O_RDWR)
    return ArrayFile(path, fd, {"array": RowFile(fd, base, shape, dtype)})


def create_safetensors(path: str | Path, arrays: dict[str, tuple[tuple[int, ...], str]],
                       metadata: dict[str, str] | None = None) -> ArrayFile:
    """A safetensors file with the named arrays `{name: (shape, dtype name)}`, open for `write`."""
    path = Path(path)
    header: dict = {}
    position = 0
    for name, (shape, dtype) in arrays.items():
        size = prod(shape) * np.dtype(dtype).itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[np.dtype(dtype).name], "shape": list(shape),
                        "data_offsets": [position, position + size]}
        position += size
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    base = 8 + len(blob)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        fh.truncate(base + position)
    fd = os.open(path, os.O_RDWR)
    files = {name: RowFile(fd, base + header[name]["data_offsets"][0], shape, np.dtype(dtype))
             for name, (shape, dtype) in arrays.items()}
    return ArrayFile(path, fd, files)
