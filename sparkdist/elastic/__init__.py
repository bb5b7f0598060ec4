"""In-process elastic training: survivors keep their processes when the world changes.

```python
from sparkdist import elastic

state = elastic.TorchState(model=model, optimizer=opt, step=0)

@elastic.run
def train(state):
    ...  # steps; state.commit() after each
```

Horovod elastic's API (`hvd.elastic.run`, `TorchState`, `ObjectState`, `commit`,
`restore`, `sync`, `register_reset_callbacks`) on torch.distributed (or on Horovod, with
`HorovodState`), with worlds formed by sparkdist's driver. Importing this package imports
no torch.
"""

from __future__ import annotations

from sparkdist.elastic.generations import WorldChanged, WorldStuck
from sparkdist.elastic.horovod_state import HorovodState
from sparkdist.elastic.run import run
from sparkdist.elastic.sharded_state import ShardedTorchState
from sparkdist.elastic.state import ObjectState, State, TorchState

__all__ = [
    "HorovodState",
    "ObjectState",
    "ShardedTorchState",
    "State",
    "TorchState",
    "WorldChanged",
    "WorldStuck",
    "run",
]
