"""Check 2: `elastic.run` with a model and optimizer on `device`, over gloo: two ranks
commit, one is killed, the survivor restores and goes on alone, a newcomer joins (a grow
back to two ranks) and gets the state by broadcast. At the end the parameters and the
optimizer state are on `device` and equal on both ranks.

Ranks are spawned processes against the driver's real `DriverService` (no Spark), as in
tests/elastic/test_elastic_rank.py; this side plays the driver's loop: it reports the loss and
forms the smaller world, then seats the newcomer.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

TIMEOUT_S = 10.0
"""The ranks' elastic timeout."""


def _connect(launch: int, address: str, secret_text: str) -> None:
    from sparkdist import job_environment
    from sparkdist.protocol import driver_channel, messages
    from sparkdist.protocol.job_secret import JobSecret

    os.environ.update(
        {
            "RANK": str(launch),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            job_environment.TASK_HOST: "127.0.0.1",
            job_environment.ELASTIC_TIMEOUT_S: str(TIMEOUT_S),
            job_environment.ELASTIC_BACKEND: "gloo",
        }
    )
    client = driver_channel.connect(address, JobSecret.from_text(secret_text))
    client.request(messages.RankHello(launch, "127.0.0.1", os.getpid()))


def _note(out: Path, launch: int, **event) -> None:
    with open(out / f"events-{launch}.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")


def rank_main(launch: int, address: str, secret_text: str, device: str, out: str) -> None:
    """Train until the harness says stop (world rank 0 decides for all, at a step)."""
    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    _connect(launch, address, secret_text)
    out_dir = Path(out)
    torch.manual_seed(launch)  # every rank starts different: sync makes them one
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = model.to(device)
    state = elastic.TorchState(model=model, optimizer=torch.optim.Adam(model.parameters()), step=0)

    @elastic.run
    def train(state):
        _note(
            out_dir,
            launch,
            event="enter",
            generation=state.generation,
            step=state.step,
            rank=state.rank,
            size=state.world_size,
            time=time.time(),
        )
        ddp = torch.nn.parallel.DistributedDataParallel(state.model)
        while True:
            stop = torch.tensor([int((out_dir / "stop").exists())])
            dist.broadcast(stop, src=0)
            if stop.item():
                break
            x = torch.randn(16, 8, generator=torch.Generator().manual_seed(state.step))
            state.optimizer.zero_grad()
            ddp(x.to(device)).pow(2).mean().backward()
            state.optimizer.step()
            state.step += 1
            state.commit()
            _note(
                out_dir,
                launch,
                event="step",
                generation=state.generation,
                step=state.step,
                time=time.time(),
            )
        flat = torch.cat([p.detach().reshape(-1) for p in state.model.parameters()])
        moments = [t for s in state.optimizer.state.values() for t in s.values()]
        gathered = [torch.zeros_like(flat.cpu()) for _ in range(state.world_size)]
        dist.all_gather(gathered, flat.cpu())
        return {
            "equal": all(torch.equal(g, gathered[0]) for g in gathered),
            "params": sorted({p.device.type for p in state.model.parameters()}),
            "moments": sorted({t.device.type for t in moments if t.dim() > 0}),
            "rank": state.rank,
            "size": state.world_size,
            "step": state.step,
        }

    result = train(state)
    (out_dir / f"result-{launch}.json").write_text(json.dumps(result))
    # End as a job's rank ends (sparkdist/runner/rank/main.py, `_exit_now`): without the
    # interpreter's teardown, which destroys the process group `elastic.run` leaves
    # formed while its gloo threads run (a SIGABRT, "terminate called without an active
    # exception", in 2 of 12 runs of this check on CPU).
    os._exit(0)


def _events(out: Path, launch: int) -> list[dict]:
    """The rank's events so far: its whole lines (the rank may be writing the last one)."""
    path = out / f"events-{launch}.jsonl"
    if not path.exists():
        return []
    *whole, _ = path.read_text().split("\n")  # "" after the last newline, or a part line
    return [json.loads(line) for line in whole]


def _wait_for(condition, what: str, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"elastic check: {what} did not happen in {limit_s:.0f} s")
        time.sleep(0.05)


def _stepped(out: Path, launch: int, generation: int, steps: int) -> bool:
    found = [e for e in _events(out, launch) if e.get("generation") == generation]
    return sum(e["event"] == "step" for e in found) >= steps


class ElasticJob:
    """The driver's service and state for the ranks, and their processes."""

    def __init__(self, device: str, out: Path) -> None:
        from sparkdist.protocol import wire
        from sparkdist.runner.driver.job_spec import JobSpec
        from sparkdist.runner.driver.job_state import JobState
        from sparkdist.runner.driver.service import DriverService

        self.state = JobState(JobSpec("gpu-check", 2, b"-", False, "all", in_process_min_np=1))
        self.secret = wire.new_secret(tls=False)
        self.service = DriverService(self.state, self.secret, "127.0.0.1", "127.0.0.1")
        address = self.service.address
        self.address = address if isinstance(address, str) else "{}:{}".format(*address)
        self.device, self.out = device, out
        self.procs: dict[int, multiprocessing.Process] = {}

    def start(self, launch: int) -> None:
        context = multiprocessing.get_context("spawn")
        args = (launch, self.address, self.secret.to_text(), self.device, str(self.out))
        self.procs[launch] = context.Process(target=rank_main, args=args)
        self.procs[launch].start()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
            proc.join()
        self.service.close()


def check_elastic(device: str, out: Path) -> str:
    """Two ranks commit 3 steps; launch rank 1 is killed; rank 0 restores and trains 2
    steps alone; launch rank 2 joins (world 2) and both train 2 more steps."""
    out.mkdir(parents=True, exist_ok=True)
    job = ElasticJob(device, out)
    began = time.monotonic()
    try:
        job.start(0)
        job.start(1)
        _wait_for(lambda: all(_stepped(out, r, 0, 3) for r in (0, 1)), "3 steps in world 0")
        os.kill(job.procs[1].pid, signal.SIGKILL)
        job.procs[1].join()
        job.state.losses.rank_exited(1, -signal.SIGKILL, [])
        job.state.membership.shrink()  # as the driver's loop of attempts decides
        _wait_for(lambda: _stepped(out, 0, 1, 2), "2 steps of the survivor in world 1")
        job.state.add_ranks([2], "a newcomer for the check")
        job.start(2)
        _wait_for(lambda: all(_stepped(out, r, 2, 2) for r in (0, 2)), "2 steps in world 2")
        (out / "stop").touch()
        for launch in (0, 2):
            job.procs[launch].join(60)
            if job.procs[launch].exitcode != 0:
                raise AssertionError(f"launch rank {launch} exited {job.procs[launch].exitcode}")
    finally:
        job.close()
    results = [json.loads((out / f"result-{r}.json").read_text()) for r in (0, 2)]
    for result in results:
        if not result["equal"] or result["size"] != 2:
            raise AssertionError(f"parameters differ across the grown world: {results}")
        if result["params"] != [device] or result["moments"] != [device]:
            raise AssertionError(f"state not on {device}: {results}")
    entered = [e for e in _events(out, 0) if e["event"] == "enter"]
    if [e["generation"] for e in entered] != [0, 1, 2]:
        raise AssertionError(f"rank 0 entered worlds {entered}")
    took = time.monotonic() - began
    return f"worlds 2 -> 1 -> 2 ranks, {results[0]['step']} steps, {took:.1f} s"
