"""``make_numpy_batches``: a rank's batches as numpy arrays, with neither torch nor TF.

The same guarantees as the torch and tf loaders (equal steps, one global order per epoch,
a position that a world of another size resumes), checked against the torch loader's
own rows, and a reader in a process where importing torch or TensorFlow fails.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter

import cloudpickle
import numpy as np
import pytest

N_ROWS = 1001
SHUFFLED = {"shuffle": True, "seed": 11, "shuffle_buffer_rows": 300}


def converter_frame(spark):
    """The rows of this module's `converter` (tests/helpers.py): 1001 rows in 5 files of
    small row groups, an id, a float and a 3-float array."""
    df = spark.range(N_ROWS).selectExpr(
        "id", "cast(id as double) * 2 as twice", "array(id, id + 1, id + 2) as near"
    )
    return df.repartition(5)


def numpy_ids(converter, rank: int, world: int, **kwargs) -> list[list[int]]:
    kwargs.setdefault("num_epochs", 1)
    with converter.make_numpy_batches(
        batch_size=64, cur_shard=rank, shard_count=world, **kwargs
    ) as batches:
        return [batch["id"].tolist() for batch in batches]


def torch_ids(converter, rank: int, world: int, **kwargs) -> list[list[int]]:
    kwargs.setdefault("num_epochs", 1)
    with converter.make_torch_dataloader(
        batch_size=64, cur_shard=rank, shard_count=world, **kwargs
    ) as loader:
        return [batch["id"].tolist() for batch in loader]


def test_batches_are_dicts_of_numpy_arrays(converter):
    with converter.make_numpy_batches(batch_size=100, num_epochs=1) as batches:
        assert len(batches) == 11
        seen = list(batches)
    assert [len(batch["id"]) for batch in seen] == [100] * 10 + [1]
    first = seen[0]
    assert set(first) == {"id", "twice", "near"}
    assert all(isinstance(values, np.ndarray) for values in first.values())
    assert first["id"].dtype == np.int64 and first["twice"].dtype == np.float32
    assert first["near"].shape == (100, 3)
    np.testing.assert_array_equal(first["twice"], first["id"] * 2)
    np.testing.assert_array_equal(first["near"], first["id"][:, None] + np.arange(3))
    first["twice"][0] = -1.0  # ordinary arrays: the caller may write to them


@pytest.mark.parametrize("world", [1, 2, 3, 16])
@pytest.mark.parametrize("shuffle", [False, True])
def test_same_rows_as_the_torch_loader_equal_steps_every_row(converter, world, shuffle):
    kwargs = SHUFFLED if shuffle else {}
    per_rank = [numpy_ids(converter, rank, world, **kwargs) for rank in range(world)]
    assert per_rank == [torch_ids(converter, rank, world, **kwargs) for rank in range(world)]
    assert len({len(batches) for batches in per_rank}) == 1  # equal steps
    rows = Counter(i for batches in per_rank for batch in batches for i in batch)
    assert sorted(rows) == list(range(N_ROWS))
    assert sum(rows.values()) == -(-N_ROWS // world) * world  # DistributedSampler's pads


def test_each_epoch_a_new_global_order(converter):
    two_epochs = numpy_ids(converter, 0, 2, num_epochs=2, **SHUFFLED)
    each = len(two_epochs) // 2
    first = [i for batch in two_epochs[:each] for i in batch]
    second = [i for batch in two_epochs[each:] for i in batch]
    assert len(first) == len(second) == -(-N_ROWS // 2)
    assert set(first) != set(second)


def test_position_resumes_in_a_world_of_another_size(converter):
    """3 ranks read 2 batches each; 2 ranks load rank 0's state and read the rest."""
    seen, states = [], []
    for rank in range(3):
        with converter.make_numpy_batches(
            batch_size=50, num_epochs=1, cur_shard=rank, shard_count=3, **SHUFFLED
        ) as batches:
            iterator = iter(batches)
            for _ in range(2):
                seen += next(iterator)["id"].tolist()
            states.append(batches.state_dict())
            assert batches.state_dict(steps=1)["rows_consumed"] == 150
    assert states[0] == states[1] == states[2]
    assert (states[0]["epoch"], states[0]["rows_consumed"]) == (0, 300)
    rest = []
    for rank in range(2):
        with converter.make_numpy_batches(
            batch_size=50, num_epochs=1, cur_shard=rank, shard_count=2, **SHUFFLED
        ) as batches:
            batches.load_state_dict(cloudpickle.loads(cloudpickle.dumps(states[0])))
            rest.append([i for batch in batches for i in batch["id"].tolist()])
            assert batches.epoch == 1
    assert len(rest[0]) == len(rest[1]) == -(-(N_ROWS - 300) // 2)
    counts = Counter(seen + rest[0] + rest[1])
    assert sorted(counts) == list(range(N_ROWS))
    assert sum(counts.values()) == N_ROWS + 1  # 701 rows left for 2 ranks: 351 each, one pad


BLOCKED_READER = """
import sys

class Blocked:
    '''Importing torch or TensorFlow fails here, as on a rank without them.'''

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "tensorflow", "keras", "jax"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Blocked())
import cloudpickle

with open(sys.argv[1], "rb") as f:
    converter = cloudpickle.load(f)
rows = 0
with converter.make_numpy_batches(batch_size=100, num_epochs=1, cur_shard=1, shard_count=2,
                                  shuffle=True) as batches:
    for batch in batches:
        rows += len(batch["id"])
    state = batches.state_dict()
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "tensorflow"))
print(rows, state["epoch"], loaded)
"""


def test_reads_where_torch_and_tensorflow_cannot_be_imported(converter, tmp_path):
    handle = tmp_path / "converter.pkl"
    handle.write_bytes(cloudpickle.dumps(converter))
    script = tmp_path / "reader.py"
    script.write_text(textwrap.dedent(BLOCKED_READER))
    done = subprocess.run(
        [sys.executable, str(script), str(handle)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(-(-N_ROWS // 2)), "1", "[]"]
