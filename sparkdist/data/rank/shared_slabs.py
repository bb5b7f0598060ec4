"""Memory that a rank and its decode processes both map: a shuffled window's pieces.

With ``reader_pool_type="process"`` a window's row groups are decoded in other processes
(`sparkdist.data.rank.decode_processes`), which put the rows straight into the pieces the
rank hands out, as the decode threads do. So a piece's slab is shared memory: a memfd
(anonymous memory with a file descriptor: nothing on a file system to be left behind if the
rank dies), mapped by the rank, and by a decode process through ``/proc/<rank>/fd/<fd>``.

A decode process keeps its mapping of a slab for the slab's next uses (``lasting``); a
window's order, used once (a message a process a window), is mapped for that message
only. The rank closes the descriptor once it drops
the slab; the memory goes back to the system once no process maps it.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import weakref
from dataclasses import dataclass

import numpy as np

_serials = itertools.count()


@dataclass(frozen=True)
class Handle:
    """Where a decode process finds a slab of the rank's: its descriptor, in ``pid``."""

    pid: int
    fd: int
    serial: int  # unique in the rank: a descriptor's number is reused once closed
    nbytes: int
    lasting: bool = True  # a piece's slab, used again; else a window's order, used once


def shared(nbytes: int, lasting: bool = True) -> tuple[np.ndarray, Handle]:
    """``nbytes`` of shared memory as uint8 numpy, and the handle a decode process maps it by.
    The descriptor is closed once the array is dropped (views of it keep the memory)."""
    fd = os.memfd_create("sparkdist-piece", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(nbytes, 1))
        mapped = mmap.mmap(fd, max(nbytes, 1))
    except BaseException:
        os.close(fd)
        raise
    array = np.frombuffer(mapped, np.uint8)[:nbytes]
    weakref.finalize(array, os.close, fd)
    return array, Handle(os.getpid(), fd, next(_serials), nbytes, lasting)


_lasting: dict[int, np.ndarray] = {}  # in a decode process: the slabs mapped, by serial


def attached(handle: Handle) -> np.ndarray:
    """In a decode process: the slab of ``handle``, as uint8 numpy (a lasting one mapped
    once; another unmapped once the array is dropped)."""
    array = _lasting.get(handle.serial)
    if array is None:
        fd = os.open(f"/proc/{handle.pid}/fd/{handle.fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            mapped = mmap.mmap(fd, max(handle.nbytes, 1))
        finally:
            os.close(fd)
        array = np.frombuffer(mapped, np.uint8)[: handle.nbytes]
        if handle.lasting:
            _lasting[handle.serial] = array
    return array


def view(handle: Handle, offset: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """In a decode process: an array of ``shape`` at ``offset`` bytes into the slab."""
    dtype_ = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype_.itemsize
    return attached(handle)[offset : offset + nbytes].view(dtype_).reshape(shape)
