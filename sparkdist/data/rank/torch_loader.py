"""The PyTorch side: a real ``torch.utils.data.DataLoader`` over one rank's slice.

The dataset is an ``IterableDataset`` that yields whole batches, so the DataLoader runs
with ``batch_size=None``: by default the batches are ``{column: torch.Tensor}``, made of
each numpy batch without a copy; a given ``collate_fn`` gets each batch as ``{column:
numpy array}`` and makes what it likes of it. With ``num_workers=k`` each worker process
reads and decodes every k-th batch of the rank, which is the order in which DataLoader
takes them back: the rank still gets its batches in order, each row once. ``pin_memory``
and the other DataLoader options pass through. The loader counts the batches it hands
out, so ``state_dict()`` is the world's position (see `sparkdist.data.rank.order`). With
``device="cuda"`` its batches come already on the GPU: each chunk gathered into a slot of
a ring of page-locked buffers, copied in one piece on a side stream and cut into batches
there, or a plain ``.to()`` where that was faster (`sparkdist.data.rank.device_feed`);
they are counted when handed out, not when copied.

Tensor types: ``tensor_types="petastorm"`` gives petastorm's (booleans as ``torch.uint8``,
unsigned 16/32-bit integers widened to int32/int64), as ``make_spark_converter`` does for
code written against petastorm; ``"torch"`` keeps numpy's (``torch.bool``), as the converter
the runner makes of a DataFrame argument does. A ``pad_column`` stays ``torch.bool``: it is
a mask, and ``~`` on a uint8 tensor is a bitwise not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from sparkdist.data.rank import device_feed as device_feed_module
from sparkdist.data.rank.batches import as_is
from sparkdist.data.rank.device_prefetch import DevicePrefetcher, side_for
from sparkdist.data.rank.reader import ReaderPosition, ShardReader, decode_threads

# petastorm's promotions (petastorm.pytorch._sanitize_pytorch_types), for its API.
_PETASTORM_TYPES = {
    np.dtype(np.bool_): np.uint8,
    np.dtype(np.uint16): np.int32,
    np.dtype(np.uint32): np.int64,
}


def petastorm_types(batch: dict[str, np.ndarray], keep: str | None = None) -> dict[str, np.ndarray]:
    """``batch`` with petastorm's types for torch (``keep``, the pad mask, stays bool)."""
    out = {}
    for name, values in batch.items():
        wanted = _PETASTORM_TYPES.get(values.dtype) if name != keep else None
        if wanted is None:
            out[name] = values
        elif values.dtype.itemsize == np.dtype(wanted).itemsize:
            out[name] = values.view(wanted)  # bool as uint8: the same bytes, no copy
        else:
            out[name] = values.astype(wanted)
    return out


def _to_torch(values: np.ndarray) -> Any:
    if values.dtype == object:  # strings and bytes stay Python lists
        return values.tolist()
    # The reader hands out writable memory; anything else is copied rather than shared.
    if not (values.flags.writeable and values.flags.c_contiguous):
        values = np.array(values, order="C")
    return torch.from_numpy(values)


def to_tensors(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """A batch (or a chunk) as ``{column: torch.Tensor}`` (strings stay lists)."""
    return {name: _to_torch(values) for name, values in batch.items()}


def _views_as_tensors(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """`to_tensors` of a batch of number columns in writable, contiguous memory: one
    ``map`` of ``torch.from_numpy``, no Python work a column."""
    return dict(zip(batch, map(torch.from_numpy, batch.values()), strict=True))


def batch_to_tensors(reader: ShardReader) -> Callable[[dict[str, np.ndarray]], dict[str, Any]]:
    """What makes each of ``reader``'s numpy batches tensors: `_views_as_tensors` where
    its batches are number columns the reader made writable (no transform), else
    `to_tensors`, a column at a time."""
    options = reader.options
    lists = any(info.kind in ("string", "binary") for info in reader.batch_columns)
    if lists or not options.writable or options.transform_spec is not None:
        return to_tensors
    return _views_as_tensors


class RankDataset(IterableDataset):
    """One rank's batches; in DataLoader worker ``w`` of ``k``, batches ``w, w+k, ...``.

    With ``tensors``, the batches come as tensors: numpy batches, cut ahead as views of
    the decoded chunks by the reader's thread, made tensors one batch at a time as they are
    taken (`batch_to_tensors`). Not tensors cut ahead a chunk at a time: tensors, unlike
    numpy arrays, are tracked by Python's garbage collector, and a chunk's batches waiting
    (8,000 tensors at 66 columns) outlived the collections of the young, were promoted,
    and set off a collection of the whole heap every 45,000 (180,000 objects once torch is
    imported, 0.06-0.25 s each: 6-8 in 2M rows; docs/data.md, "Wide tables"). Else as numpy,
    for a ``collate_fn`` of the user's.
    """

    def __init__(
        self, reader: ShardReader, tensor_types: str = "petastorm", tensors: bool = False
    ) -> None:
        self.reader = reader
        self.tensor_types = tensor_types
        self.tensors = tensors

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        typed = numpy_types(self.reader, self.tensor_types)
        batches = self.reader.batches(worker, workers, convert=typed)
        return map(batch_to_tensors(self.reader), batches) if self.tensors else batches


def numpy_types(
    reader: ShardReader, tensor_types: str
) -> Callable[[dict[str, np.ndarray]], Any] | None:
    """What makes a chunk's numpy columns of ``tensor_types`` (None: they are already)."""
    if tensor_types == "torch":
        return None
    keep = reader.options.pad_column
    return lambda chunk: petastorm_types(chunk, keep=keep)


def outside_row_bytes(reader: ShardReader, tensor_types: str) -> int:
    """Bytes a row of the columns made after a chunk is gathered: the weight and pad
    marks, and the columns petastorm's types widen (a copy each)."""
    options, total = reader.options, 0
    if options.global_batch_size is not None:
        total += 4
    if options.pad_column is not None:
        total += 1
    if tensor_types != "torch":
        for info in reader.output_columns:
            number = info.kind in ("scalar", "array")
            wanted = _PETASTORM_TYPES.get(np.dtype(info.dtype)) if number else None
            if wanted is not None and np.dtype(wanted).itemsize != np.dtype(info.dtype).itemsize:
                total += np.dtype(wanted).itemsize * int(np.prod(info.shape or (info.length or 1,)))
    return total


class BatchedDataLoader(ReaderPosition, DataLoader):
    """``torch.utils.data.DataLoader`` of one rank's batches, with a resumable position.

    Made as petastorm's ``data_loader_fn`` is called: ``BatchedDataLoader(reader=...,
    batch_size=..., shuffling_queue_capacity=...)``, where ``reader`` already shuffles and
    cuts batches of ``batch_size`` (so ``shuffling_queue_capacity`` adds nothing here).
    ``collate_fn`` gets each batch as ``{column: numpy array}`` (default: tensors).
    ``device``: hand out batches on that device, each chunk copied in one piece from a
    ring of page-locked slots and cut there (`sparkdist.data.rank.device_feed`; with
    DataLoader workers, ``pin_memory`` or a ``collate_fn``, each batch packed and copied,
    `DevicePrefetcher`); None: on the CPU. ``device_feed``: "ring" or "plain" (each column
    ``.to(device)``) forces one way; "auto" (default, or env SPARKDIST_DEVICE_FEED) times
    both on the first chunks and keeps the faster.
    """

    def __init__(
        self,
        reader: ShardReader,
        batch_size: int | None = None,
        shuffling_queue_capacity: int = 0,
        *,
        tensor_types: str = "petastorm",
        collate_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        device: Any = None,
        device_feed: str | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if dataloader_kwargs.get("persistent_workers"):
            raise ValueError(
                "persistent_workers=True: DataLoader's workers would keep the reader's position "
                "of the first iteration, so the next epoch, a load_state_dict or a change of the "
                "world would not reach them (rows read twice or never); leave it False"
            )
        if batch_size is not None and batch_size != reader.batch_size:
            raise ValueError(
                f"batch_size={batch_size}, but the reader cuts batches of {reader.batch_size}: "
                "give batch_size to make_torch_dataloader"
            )
        super().__init__(
            RankDataset(reader, tensor_types, tensors=collate_fn is None),
            batch_size=None,
            collate_fn=collate_fn or as_is,  # the dataset's batches are tensors already
            num_workers=num_workers,
            pin_memory=pin_memory,  # device=: packed into its own page-locked ring
            **dataloader_kwargs,
        )
        self.reader = reader
        self.device = device
        self.tensor_types = tensor_types
        self.feed_choice = device_feed_module.Choice(device_feed_module.feed_mode(device_feed))

    def __iter__(self) -> Iterator[Any]:
        # The reader settles its position before DataLoader's workers take their copy.
        if self.device is None:
            return self.reader.count(self._batches)
        if self.num_workers or self.pin_memory or self.collate_fn is not as_is:
            # Batches made elsewhere (workers, the user's collate_fn): each packed and moved.
            wrap = lambda batches: iter(DevicePrefetcher(batches, self.device))  # noqa: E731
            return self.reader.count(self._batches, wrap)
        feed = self._feed()
        convert = numpy_types(self.reader, self.tensor_types)
        opened = lambda: self.reader.batches(convert=convert, feed=feed)  # noqa: E731
        return self.reader.count(opened, feed.hand_out)

    def _feed(self) -> device_feed_module.ChunkFeed:
        """This iteration's chunk ring: a slot for each chunk the reader's threads may hold
        at once (gathering, read ahead, being cut), its copies on their way."""
        options = self.reader.options
        slots = options.prefetch + 2 * decode_threads(options.workers_count) + 3
        return device_feed_module.ChunkFeed(
            side_for(self.device, slots=0),
            slots,
            self.feed_choice,
            outside_row_bytes(self.reader, self.tensor_types),
        )

    def _batches(self) -> Iterator[Any]:
        """The batches, as DataLoader hands them out. In this process (no workers, no
        pinning) they come straight from the dataset through ``collate_fn``: DataLoader's
        own iterator wraps each batch in a profiler record, a torch op that lets the
        decode threads take the GIL (20 us a batch, a tenth of a wide table's read)."""
        if self.num_workers or self.pin_memory:
            return super().__iter__()
        return map(self.collate_fn, iter(self.dataset))
