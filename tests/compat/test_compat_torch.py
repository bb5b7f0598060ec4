"""torch on a runtime's stack (the stacks where its CPU wheel installs: Python 3.11):
TorchDistributor, and a converted DataFrame read through make_torch_dataloader by DDP ranks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sparkdist import HorovodRunner, TorchDistributor
from sparkdist.data import make_spark_converter


def allreduce(scale):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    result = value.item() * scale
    dist.destroy_process_group()
    return result


@pytest.mark.parametrize("local_mode", [False, True])
def test_torch_distributor_runs_a_function_on_two_processes(spark, local_mode):
    distributor = TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False)
    assert distributor.run(allreduce, 2.0) == 6.0


def test_torch_dataloader_feeds_ddp_ranks(spark, tmp_path):
    frame = pd.DataFrame({"x": np.arange(64, dtype="float64"), "y": np.arange(64) % 2})
    converter = make_spark_converter(
        spark.createDataFrame(frame).repartition(2), cache_dir_url=tmp_path.as_uri()
    )

    def main(converter):
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        model = DistributedDataParallel(torch.nn.Linear(1, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
        seen = []
        with converter.make_torch_dataloader(batch_size=8, num_epochs=1) as loader:
            for batch in loader:
                optimizer.zero_grad()
                out = model(batch["x"].unsqueeze(1))
                loss = torch.nn.functional.mse_loss(out.squeeze(1), batch["y"].float())
                loss.backward()
                optimizer.step()
                seen.extend(batch["x"].tolist())
        dist.destroy_process_group()
        return seen

    try:
        shards = HorovodRunner(np=2, launcher="direct", timeout=300).run_all(
            main, converter=converter
        )
    finally:
        converter.delete()
    assert len(shards[0]) == len(shards[1]) == 32
    assert sorted(shards[0] + shards[1]) == [float(i) for i in range(64)]
