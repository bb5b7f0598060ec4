"""A real multi-host Spark standalone cluster on one machine, built with network namespaces.

Each test host is a network namespace with its own address on a private bridge
(10.213.7.0/24 by default; traffic never leaves this machine). The driver stays in the
root namespace, on the bridge's own address. Host 0 runs the Spark master; every host
runs one Spark worker, all started with the `spark-class` that ships with pyspark. The
last host also has a second interface (on another subnet, leading nowhere) that cannot
reach the others, so that the runner has a wrong interface to avoid.

By hand (as root):

    python tests/cluster/netns_cluster.py up      # prints the master URL, leaves it running
    python tests/cluster/netns_cluster.py down    # stops what `up` started, removes the hosts

Everything `up` starts is recorded in a state file; `down` stops exactly those process
ids and deletes exactly those namespaces and links.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

PREFIX = "sdc"
SUBNET = "10.213.7"
DEAD_SUBNET = "10.213.9"
MASTER_PORT = 7077
MASTER_UI_PORT = 8080
STATE_ROOT = Path("/tmp/sparkdist-netns")
HOST_RESOURCE = "sparkdisthost"
"""A custom Spark resource each worker has one of: an application whose executors ask
for one (`HOST_RESOURCE_CONF`) gets at most one executor on each host, also after a
host was lost (the master cannot stack a replacement on a survivor)."""
DECOMMISSION_CONF = {"spark.decommission.enabled": "true"}
"""An application that takes decommission notices (the workers do: `_worker_properties`)."""
HOST_RESOURCE_CONF = {
    f"spark.executor.resource.{HOST_RESOURCE}.amount": "1",
    f"spark.task.resource.{HOST_RESOURCE}.amount": "1",
}


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def can_build() -> str | None:
    """None when namespaces can be built here, else the reason why not."""
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Java is not installed (Spark's master and workers need it)"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a network namespace: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class ClusterState:
    """What `up` created, so that `down` removes exactly that."""

    prefix: str
    subnet: str
    hosts: int
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    create_times: dict[str, float] = field(default_factory=dict)


class NetnsCluster:
    """Builds, describes and tears down the namespaced cluster."""

    def __init__(
        self,
        hosts: int = 3,
        prefix: str = PREFIX,
        subnet: str = SUBNET,
        worker_cores: int = 2,
        worker_memory: str = "2g",
        daemon_java_options: str = "",
    ):
        if not 2 <= hosts <= 9:
            raise ValueError(f"hosts must be between 2 and 9, got {hosts}")
        self.prefix = prefix
        self.subnet = subnet
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.daemon_java_options = daemon_java_options
        """The Spark master's and workers' JVM options (SPARK_DAEMON_JAVA_OPTS)."""
        self.state = ClusterState(prefix=prefix, subnet=subnet, hosts=hosts)
        self.dir = STATE_ROOT / prefix
        self.state_file = self.dir / "state.json"

    # --- names and addresses -----------------------------------------------------------

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    @property
    def driver_address(self) -> str:
        """The root namespace's address on the bridge: where the driver runs."""
        return f"{self.subnet}.1"

    def namespace(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def outer_link(self, i: int) -> str:
        """The root-namespace end of host i's veth pair (set it down to cut host i off)."""
        return f"{self.prefix}v{i}"

    @property
    def dead_host(self) -> int:
        """The host with the second interface that reaches nobody."""
        return self.state.hosts - 1

    @property
    def dead_address(self) -> str:
        return f"{DEAD_SUBNET}.{10 + self.dead_host}"

    @property
    def master_url(self) -> str:
        return f"spark://{self.address(0)}:{MASTER_PORT}"

    @property
    def network(self) -> str:
        return f"{self.subnet}.0/24"

    # --- building ----------------------------------------------------------------------

    def _ip(self, *args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")

    def up(self, timeout_s: float = 120.0) -> NetnsCluster:
        """Build the hosts, start the master and the workers, wait until all registered."""
        if self.state_file.exists():
            logger.info("removing what a previous run left behind (%s)", self.state_file)
            NetnsCluster.load(self.prefix).down()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._build_network()
            self._start_spark(timeout_s)
        except BaseException:
            self.down()
            raise
        return self

    def _build_network(self) -> None:
        self._ip("link", "add", self.bridge, "type", "bridge")
        self.state.links.append(self.bridge)
        self._save()
        self._ip("addr", "add", f"{self.driver_address}/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for i in range(self.state.hosts):
            ns = self.namespace(i)
            self._ip("netns", "add", ns)
            self.state.namespaces.append(ns)
            self._save()
            self._ip("link", "add", self.outer_link(i), "type", "veth", "peer", "name", "tn0")
            self.state.links.append(self.outer_link(i))
            self._save()
            self._ip("link", "set", "tn0", "netns", ns)
            self._ip("link", "set", self.outer_link(i), "master", self.bridge, "up")
            self._ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "tn0")
            self._ip("-n", ns, "link", "set", "tn0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")
        dead_ns = self.namespace(self.dead_host)
        # A veth pair with both ends on that host: an interface that leads nowhere.
        self._ip("-n", dead_ns, "link", "add", "tn1", "type", "veth", "peer", "name", "tn1end")
        self._ip("-n", dead_ns, "link", "set", "tn1end", "up")
        self._ip("-n", dead_ns, "addr", "add", f"{self.dead_address}/24", "dev", "tn1")
        self._ip("-n", dead_ns, "link", "set", "tn1", "up")

    def _spark_env(self, i: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "SPARK_HOME": spark_home(),
                "SPARK_LOCAL_IP": self.address(i),
                "SPARK_LOG_DIR": str(self.dir / "logs"),
                "SPARK_DAEMON_MEMORY": "384m",
                "SPARK_DAEMON_JAVA_OPTS": self.daemon_java_options,
                "SPARK_NO_DAEMONIZE": "1",
                "PYSPARK_PYTHON": sys.executable,
            }
        )
        env.pop("SPARK_CONF_DIR", None)
        return env

    def _spawn(self, name: str, i: int, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "ab")
        cmd = ["ip", "netns", "exec", self.namespace(i), *argv]
        # `ip netns exec` and `spark-class` both exec, so this pid is the JVM's.
        proc = subprocess.Popen(
            cmd,
            env=self._spark_env(i),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.state.pids[name] = proc.pid
        try:
            self.state.create_times[name] = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            self.state.create_times[name] = 0.0
        self._save()

    def _start_spark(self, timeout_s: float) -> None:
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        self._spawn(
            "master",
            0,
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.address(0),
                "--port",
                str(MASTER_PORT),
                "--webui-port",
                str(MASTER_UI_PORT),
            ],
        )
        for i in range(self.state.hosts):
            self._spawn_worker(i)
        self.wait_workers(self.state.hosts, timeout_s)

    def _worker_properties(self) -> Path:
        """The workers' properties file: one HOST_RESOURCE each, found by a script."""
        script = self.dir / "host-resource.sh"
        found = json.dumps({"name": HOST_RESOURCE, "addresses": ["0"]})
        script.write_text(f"#!/bin/sh\necho '{found}'\n")
        script.chmod(0o755)
        props = self.dir / "worker.properties"
        props.write_text(
            f"spark.worker.resource.{HOST_RESOURCE}.amount 1\n"
            f"spark.worker.resource.{HOST_RESOURCE}.discoveryScript {script}\n"
            # SIGPWR decommissions the worker (`decommission_worker`), as a cloud's notice
            # does; applications take it with DECOMMISSION_CONF.
            "spark.decommission.enabled true\n"
        )
        return props

    def _spawn_worker(self, i: int) -> None:
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        work = self.dir / f"work-h{i}"
        work.mkdir(exist_ok=True)
        self._spawn(
            f"worker-{i}",
            i,
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                self.address(i),
                "--cores",
                str(self.worker_cores),
                "--memory",
                self.worker_memory,
                "--work-dir",
                str(work),
                "--webui-port",
                "8081",
                "--properties-file",
                str(self._worker_properties()),
                self.master_url,
            ],
        )

    def master_status(self) -> dict:
        url = f"http://{self.address(0)}:{MASTER_UI_PORT}/json/"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=5) as response:
            return json.load(response)

    def wait_workers(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        alive = 0
        while time.monotonic() < deadline:
            for name in self.state.pids:
                if not self.alive(name):
                    raise RuntimeError(
                        f"Spark {name} exited during start-up; see {self.dir / (name + '.log')}"
                    )
            try:
                status = self.master_status()
                alive = sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")
                if alive >= count:
                    return
            except (OSError, ValueError):
                pass  # the master's web UI is not up yet
            time.sleep(0.5)
        raise TimeoutError(f"only {alive} of {count} Spark workers registered in {timeout_s}s")

    # --- processes ---------------------------------------------------------------------

    def alive(self, name: str) -> bool:
        try:
            proc = psutil.Process(self.state.pids[name])
            return (
                proc.create_time() == self.state.create_times[name]
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except (psutil.Error, KeyError):
            return False

    def worker_process(self, i: int) -> psutil.Process:
        return psutil.Process(self.state.pids[f"worker-{i}"])

    def descendants(self, i: int) -> list[psutil.Process]:
        """Every process running under host i's worker (executors and what they started)."""
        try:
            return self.worker_process(i).children(recursive=True)
        except psutil.Error:
            return []

    def executors(self, i: int) -> list[psutil.Process]:
        """Host i's executor JVMs."""
        found = []
        for proc in self.worker_process(i).children():
            try:
                if any("CoarseGrainedExecutorBackend" in part for part in proc.cmdline()):
                    found.append(proc)
            except psutil.Error:
                pass
        return found

    def alive_worker_hosts(self) -> list[str]:
        """The addresses of the workers the master sees as ALIVE."""
        workers = self.master_status().get("workers", [])
        return sorted(w["host"] for w in workers if w.get("state") == "ALIVE")

    def _wait_master_sees(self, i: int, alive: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if (self.address(i) in self.alive_worker_hosts()) == alive:
                    return
            except (OSError, ValueError):
                pass  # the master is busy; ask again
            time.sleep(0.2)
        state = "alive" if alive else "gone"
        raise TimeoutError(f"the master did not see host {i}'s worker {state} in {timeout_s}s")

    def stop_worker(self, i: int, timeout_s: float = 60.0) -> list[int]:
        """Lose host i's worker as a host is lost: SIGKILL its Worker JVM and everything
        under it (executors of every application, their Python workers, job processes)
        at once, by pid; wait until they are gone and the master has dropped the worker.
        Returns the pids killed."""
        worker = self.worker_process(i)
        if not self.alive(f"worker-{i}"):
            raise RuntimeError(f"host {i}'s worker is not running")
        procs = [worker, *self.descendants(i)]
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=timeout_s)
        if alive:
            raise RuntimeError(f"processes of host {i} survived SIGKILL: {alive}")
        self._wait_master_sees(i, False, timeout_s)
        return [p.pid for p in procs]

    def decommission_worker(self, i: int) -> float:
        """Give host i's worker Spark's decommission signal (SIGPWR), as a cloud's notice
        that the host is taken back does; returns when (time.time()). Its executors'
        running tasks go on until the host is lost (`stop_worker`)."""
        if not self.alive(f"worker-{i}"):
            raise RuntimeError(f"host {i}'s worker is not running")
        at = time.time()
        self.worker_process(i).send_signal(signal.SIGPWR)
        return at

    def start_worker(self, i: int, timeout_s: float = 120.0) -> None:
        """Start a worker on host i again (after `stop_worker`) and wait until the
        master sees it alive."""
        if self.alive(f"worker-{i}"):
            raise RuntimeError(f"host {i}'s worker is still running")
        self._spawn_worker(i)
        self._wait_master_sees(i, True, timeout_s)

    def set_link(self, i: int, up: bool) -> None:
        """Connect (up) or cut off (down) host i from the bridge."""
        self._ip("link", "set", self.outer_link(i), "up" if up else "down")

    # --- tearing down ------------------------------------------------------------------

    def _save(self) -> None:
        self.state_file.write_text(json.dumps(asdict(self.state)))

    @classmethod
    def load(cls, prefix: str = PREFIX) -> NetnsCluster:
        data = json.loads((STATE_ROOT / prefix / "state.json").read_text())
        cluster = cls(hosts=data["hosts"], prefix=data["prefix"], subnet=data["subnet"])
        cluster.state = ClusterState(**data)
        return cluster

    def down(self) -> None:
        """Stop the processes `up` started (and their descendants), delete the hosts."""
        procs = []
        for name in list(self.state.pids):
            if self.alive(name):
                proc = psutil.Process(self.state.pids[name])
                try:
                    procs += proc.children(recursive=True)
                except psutil.Error:
                    pass
                procs.append(proc)
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, still = psutil.wait_procs(procs, timeout=10)
        for proc in still:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(still, timeout=5)
        for ns in self.state.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for link in self.state.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        self.state.pids.clear()
        self.state.namespaces.clear()
        self.state.links.clear()
        if self.state_file.exists():
            self.state_file.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--prefix", default=PREFIX)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "up":
        reason = can_build()
        if reason:
            sys.stderr.write(f"cannot build the cluster: {reason}\n")
            return 1
        cluster = NetnsCluster(hosts=args.hosts, prefix=args.prefix).up()
        print(f"master: {cluster.master_url}")
        print(f"driver address (root namespace): {cluster.driver_address}")
        for i in range(args.hosts):
            print(f"host {i}: namespace {cluster.namespace(i)}, address {cluster.address(i)}")
        print(f"host {cluster.dead_host} also has tn1 = {cluster.dead_address} (reaches nobody)")
        return 0
    if not (STATE_ROOT / args.prefix / "state.json").exists():
        print("no cluster is up")
        return 0 if args.command == "down" else 1
    cluster = NetnsCluster.load(args.prefix)
    if args.command == "down":
        cluster.down()
        print("cluster removed")
    else:
        print(json.dumps(cluster.master_status(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
