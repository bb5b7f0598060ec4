"""The PyTorch side: a real ``torch.utils.data.DataLoader`` over one rank's slice.

The dataset is an ``IterableDataset`` that yields whole batches (``{column: numpy
array}``), so the DataLoader runs with ``batch_size=None`` and its ``collate_fn`` turns
each batch into tensors (the default), or into whatever a given ``collate_fn`` makes of
it. With ``num_workers=k`` each worker process reads and decodes every k-th batch of the
rank, which is the order in which DataLoader takes them back: the rank still gets its
batches in order, each row once. ``pin_memory`` and the other DataLoader options pass
through. The loader counts the batches it hands out, so ``state_dict()`` is the world's
position (see `sparkdist.data.order`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from sparkdist.data.reader import ShardReader


def _to_torch(values: np.ndarray) -> Any:
    if values.dtype == object:  # strings and bytes stay Python lists
        return values.tolist()
    # The reader hands out writable memory; anything else is copied rather than shared.
    if not (values.flags.writeable and values.flags.c_contiguous):
        values = np.array(values, order="C")
    return torch.from_numpy(values)


def to_tensors(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """The default ``collate_fn``: ``{column: torch.Tensor}`` (strings stay lists)."""
    return {name: _to_torch(values) for name, values in batch.items()}


class RankDataset(IterableDataset):
    """One rank's batches; in DataLoader worker ``w`` of ``k``, batches ``w, w+k, ...``."""

    def __init__(self, reader: ShardReader) -> None:
        self.reader = reader

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        yield from self.reader.batches(worker, workers)


class TorchDataLoader(DataLoader):
    """``torch.utils.data.DataLoader`` of one rank's batches, with a resumable position.

    ``len(loader)`` is the number of batches one iteration yields from the current
    position; every rank gets the same number.
    """

    def __init__(
        self,
        reader: ShardReader,
        *,
        collate_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        **dataloader_kwargs: Any,
    ) -> None:
        super().__init__(
            RankDataset(reader),
            batch_size=None,
            collate_fn=collate_fn or to_tensors,
            num_workers=num_workers,
            pin_memory=pin_memory,
            **dataloader_kwargs,
        )
        self.reader = reader

    @property
    def rows_in_shard(self) -> int:
        """Rows this rank reads in the current epoch (the same on every rank)."""
        return self.reader.rows_in_shard

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.reader.position.epoch

    def __len__(self) -> int:
        return self.reader.batches_per_iteration()

    def state_dict(self, steps: int | None = None) -> dict:
        """The world's position: epoch, rows consumed, seed, what is left. Picklable.

        After the batches handed out so far, or after the iteration's first ``steps``.
        """
        return self.reader.state_dict(steps)

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict` (saved by a world of any size) on the next ``iter``."""
        self.reader.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        self.reader.position.settle()
        return self.reader.count(super().__iter__())


class TorchLoaderContext:
    """Context manager returned by ``make_torch_dataloader``; stops reading on exit."""

    def __init__(self, reader: ShardReader, **dataloader_kwargs: Any) -> None:
        self._reader = reader
        self._kwargs = dataloader_kwargs

    def __enter__(self) -> TorchDataLoader:
        return TorchDataLoader(self._reader, **self._kwargs)

    def __exit__(self, *exc_info: object) -> None:
        self._reader.close()
