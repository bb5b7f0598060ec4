"""The jobs of the stall tests (tests/runner/test_stacks.py, tests/runner/test_stalls_cluster.py,
tests/connect_client.py): ranks that hang in the user's own code or crawl. Imported by
reference on the ranks (the driver's import path reaches them)."""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time


def stuck(lock_file: str) -> None:
    """Block on a lock until `lock_file` is removed (the test releases it so). Writes
    `<lock_file>.stuck` first: a test can wait for the rank to be here."""
    open(lock_file + ".stuck", "w").close()
    lock = threading.Lock()
    lock.acquire()
    while os.path.exists(lock_file):
        lock.acquire(timeout=0.5)


def held_lock(lock_file: str) -> int:
    """Block in C for as long as `lock_file` exists: the main thread waits on a lock
    (no timeout) that a helper thread releases once the file is gone. No torch: the rank
    starts in a second. Its line starts the silent spell a stall warning is given for."""
    lock = threading.Lock()
    lock.acquire()

    def release() -> None:
        while os.path.exists(lock_file):
            time.sleep(0.05)
        lock.release()

    threading.Thread(target=release, daemon=True).start()
    print("waiting on the lock", flush=True)
    lock.acquire()
    return 0


def lock_job(
    lock_file: str, steps: int = 1000, stuck_rank: int = 1, stuck_at: int = 5, beat: bool = False
) -> int:
    """An all_reduce per step; at step `stuck_at`, rank `stuck_rank` blocks in `stuck`,
    so the other ranks wait in all_reduce.

    `beat`: a line a second until the group formed (importing torch takes seconds, in
    silence, on a loaded machine: a short `stall_timeout` must count from the stall)."""
    started = threading.Event()
    if beat:
        threading.Thread(target=_beat_until, args=(started,), daemon=True).start()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    started.set()
    rank = dist.get_rank()
    value = torch.ones(1)
    for step in range(steps):
        if step == stuck_at and rank == stuck_rank:
            stuck(lock_file)
        dist.all_reduce(value)
        print(f"step {step}", flush=True)
        time.sleep(0.05)
    dist.destroy_process_group()
    return rank


def silent_wait(ready_file: str) -> int:
    """Print once, then wait in silence (a rank in a long silent step, or hung)."""
    import sparkdist

    print("ready", flush=True)
    sparkdist.log_to_driver("waiting")
    while True:
        time.sleep(1)


def crawl(seconds: float, slow_rank: int, extra_s: float, step_s: float = 0.1) -> int:
    """Report a step every `step_s` seconds (rank `slow_rank`: `extra_s` more), for
    `seconds`; no collectives, so a slow rank holds no other back."""
    import sparkdist

    rank = int(os.environ["RANK"])
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        time.sleep(step_s + (extra_s if rank == slow_rank else 0.0))
        sparkdist.report({"step": step}, step=step)
        step += 1
    return step


def blocked_loader(data, lock_file: str) -> int:
    """Read batches through the data loader; rank 1's transform (run by the reader's
    thread) blocks until `lock_file` is removed, so its main thread waits for a batch."""
    import torch  # noqa: F401 - imported (seconds, in silence) before the stall is timed

    from sparkdist.data import TransformSpec

    rank = int(os.environ["RANK"])
    print("loading", flush=True)

    def hang(frame):
        if rank == 1:
            stuck(lock_file)
        return frame

    spec = TransformSpec(hang)
    batches = 0
    with data.make_torch_dataloader(batch_size=4, num_epochs=1, transform_spec=spec) as loader:
        for _ in loader:
            batches += 1
    return batches


def _beat_until(started: threading.Event) -> None:
    """A line a second until `started` is set (a sign of life for the driver)."""
    while not started.wait(1.0):
        print("starting", flush=True)


def elastic_lock_job(
    lock_file: str, stuck_rank: int = 1, stuck_at: int = 5, by_launch_rank: bool = False
) -> int:
    """`lock_job` inside `sparkdist.elastic.run`: an all_reduce and a commit per step; at
    step `stuck_at`, rank `stuck_rank` blocks in `stuck`, so the others wait in all_reduce.
    `by_launch_rank`: the process launched as rank `stuck_rank` blocks (once: a world
    that dropped it and grew back goes on), not whichever is world rank `stuck_rank`.

    A thread prints a line a second until training starts: importing torch and forming
    the group take seconds on a loaded machine, in silence, and a short `stall_timeout`
    must count from the stall, not from the start."""
    started = threading.Event()
    threading.Thread(target=_beat_until, args=(started,), daemon=True).start()
    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    print("ready", flush=True)
    launched_as = int(os.environ["RANK"])  # elastic.run gives RANK each world's rank

    @elastic.run
    def train(state) -> int:
        started.set()
        value = torch.ones(1)
        while state.step < 1000:
            rank = launched_as if by_launch_rank else state.rank
            if state.step == stuck_at and rank == stuck_rank:
                stuck(lock_file)
            dist.all_reduce(value)
            state.step += 1
            state.commit()
        return state.rank

    return train(elastic.ObjectState(step=0))


def elastic_silent_commits(seconds: float) -> int:
    """Commit every 0.1 s for `seconds` inside `sparkdist.elastic.run`, printing nothing
    after its first line there: the commits are the only signs of life. (The driver warns
    once per silent spell: the line starts the spell the test watches.)"""
    from sparkdist import elastic

    @elastic.run
    def train(state) -> int:
        print("training", flush=True)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.1)
            state.step += 1
            state.commit()
        return state.step

    return train(elastic.ObjectState(step=0))


def wait_noting_supervisor(note_file: str) -> int:
    """Note this rank's supervisor (its parent) and stacks directory, then wait: a rank
    a test cuts off through its supervisor."""
    note = f"{os.getppid()} {os.environ['SPARKDIST_STACKS']}"
    with open(note_file + ".partial", "w") as f:
        f.write(note)
    os.replace(note_file + ".partial", note_file)
    while True:
        time.sleep(1)


def slow_import(module_dir: str) -> None:
    """Import `slow_start` from `module_dir`: its import sleeps, in silence (a slow
    `import torch` on a loaded host; the test writes the module)."""
    sys.path.insert(0, module_dir)
    importlib.import_module("slow_start")


def slow_start(module_dir: str, slow_rank: int = 1) -> int:
    """Rank `slow_rank` starts slowly (`slow_import`), then says so (a file); the others
    print a line at once and wait for it, in silence."""
    rank = int(os.environ["RANK"])
    started = os.path.join(module_dir, "started")
    if rank == slow_rank:
        slow_import(module_dir)
        print("started", flush=True)
        open(started, "w").close()
    else:
        print("ready", flush=True)
        while not os.path.exists(started):
            time.sleep(0.05)
    return rank


def silent_forever() -> int:
    """Never a sign of life: no line, no report."""
    while True:
        time.sleep(1)


def elastic_slow_start(module_dir: str, slow_rank: int = 1, steps: int = 5) -> int:
    """Rank `slow_rank` starts slowly (`slow_import`), the others print a line at once;
    then `steps` commits inside `sparkdist.elastic.run`. Returns the world's size."""
    if int(os.environ["RANK"]) == slow_rank:
        slow_import(module_dir)
    else:
        print("ready", flush=True)
    import torch.distributed as dist

    from sparkdist import elastic

    @elastic.run
    def train(state) -> int:
        while state.step < steps:
            state.step += 1
            state.commit()
            time.sleep(0.05)
        return dist.get_world_size()

    return train(elastic.ObjectState(step=0))
