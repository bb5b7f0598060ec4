"""The numpy side: one rank's batches as ``{column: numpy array}``, with neither torch nor TF.

For JAX, scikit-learn's ``partial_fit`` or plain numpy, and for ranks where no framework is
installed. The rows, their order, the equal steps and the position are the torch and tf
loaders': all three read through one `ShardReader`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from sparkdist.data.reader import ReaderPosition, ShardReader


class NumpyBatches(ReaderPosition):
    """One rank's batches, with the torch loader's ``len()``, ``epoch`` and position."""

    def __init__(self, reader: ShardReader) -> None:
        self.reader = reader

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.reader)
