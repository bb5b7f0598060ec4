"""The PyTorch side: batches as dicts of tensors keyed by column name, like petastorm's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from sparkdist.data.reader import ShardReader


def _to_torch(values: np.ndarray) -> Any:
    import torch

    if values.dtype == object:  # strings and bytes stay Python lists
        return values.tolist()
    # The reader hands out writable memory; anything else is copied rather than shared.
    return torch.from_numpy(np.require(values, requirements=["W", "C"]))


class TorchDataLoader:
    """Iterable of ``{column: torch.Tensor}`` batches from one shard.

    Not a ``torch.utils.data.DataLoader``: reading already happens in a background
    thread, so there is nothing for DataLoader workers to do (petastorm's loader is
    likewise its own class).
    """

    def __init__(self, reader: ShardReader) -> None:
        self.reader = reader

    @property
    def rows_in_shard(self) -> int:
        """Rows this shard reads per epoch."""
        return self.reader.rows_in_shard

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.reader:
            yield {name: _to_torch(values) for name, values in batch.items()}


class TorchLoaderContext:
    """Context manager returned by ``make_torch_dataloader``; stops reading on exit."""

    def __init__(self, reader: ShardReader) -> None:
        self._reader = reader

    def __enter__(self) -> TorchDataLoader:
        return TorchDataLoader(self._reader)

    def __exit__(self, *exc_info: object) -> None:
        self._reader.close()
