"""A plain Lightning DDP fit, as people write it for torchrun: the Trainer finds its
ranks by itself. Each rank writes its world size and final weights to OUT/rank-N.json.

    python lightning_fit.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os


def fit(out: str, epochs: int = 2) -> dict:
    import pytorch_lightning as pl
    import torch

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = Regression()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=2,
        strategy="ddp",
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    result = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "env": type(trainer.strategy.cluster_environment).__name__,
        "weights": [p.detach().flatten().tolist() for p in model.parameters()],
    }
    with open(os.path.join(out, f"rank-{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    fit(parser.parse_args().out)
