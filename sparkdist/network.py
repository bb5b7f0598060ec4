"""Which address and interface a task should use, so all traffic stays on one network.

Spark already knows an address at which every executor is reachable; the runner
uses that address's interface for its own channels, for MPI and for Gloo, unless
the user names an interface.
"""

from __future__ import annotations

import ipaddress
import random
import socket

import psutil


def resolve(host: str) -> str:
    """The IPv4 address of `host` (an address is returned as is)."""
    try:
        ipaddress.IPv4Address(host)
        return host
    except ValueError:
        return socket.gethostbyname(host)


def interface_of(ip: str) -> tuple[str, str]:
    """The local interface that owns `ip`, and its network in CIDR notation."""
    target = ipaddress.IPv4Address(ip)
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family != socket.AF_INET or not addr.netmask:
                continue
            if ipaddress.IPv4Address(addr.address) == target:
                network = ipaddress.IPv4Network(f"{addr.address}/{addr.netmask}", strict=False)
                return name, str(network)
    if target.is_loopback:
        return "lo", "127.0.0.0/8"
    raise ValueError(
        f"no local network interface has the address {ip}; name one with "
        "HorovodRunner(network_interface=...)"
    )


def is_local_address(ip: str) -> bool:
    """Whether `ip` belongs to this machine."""
    return any(
        addr.address == ip
        for addrs in psutil.net_if_addrs().values()
        for addr in addrs
        if addr.family == socket.AF_INET
    )


def address_of_interface(name: str) -> str:
    """The IPv4 address of the interface `name`."""
    addrs = psutil.net_if_addrs()
    if name not in addrs:
        raise ValueError(
            f"network interface {name!r} does not exist on host {socket.gethostname()} "
            f"(it has: {', '.join(sorted(addrs))})"
        )
    for addr in addrs[name]:
        if addr.family == socket.AF_INET:
            return addr.address
    raise ValueError(f"network interface {name!r} has no IPv4 address")


def reserve_port(host: str) -> socket.socket:
    """A listening-capable socket bound to a free port on `host`; close it to hand over.

    Keeping the socket until just before the port is used narrows the window in which
    another process could take it. The port is drawn below the kernel's ephemeral range
    where there is room: a port the kernel hands out itself (to a wildcard `bind(0)`, as
    Open MPI's daemons and Spark make, or to an outgoing connection) can be taken by
    another process in the seconds between this socket's close and the listener's bind
    (seen once: torch's TCPStore failed with EADDRINUSE on a port bind(0) had given).
    """
    low, _ = _ephemeral_ports()
    candidates = range(_FIXED_PORTS_FROM, low)
    for port in random.sample(candidates, min(len(candidates), _FIXED_PORT_TRIES)):
        sock = _unshared_socket()
        try:
            sock.bind((host, port))
            return sock
        except OSError:
            sock.close()
    sock = _unshared_socket()
    sock.bind((host, 0))
    return sock


# Below the default ephemeral range (32768-60999) and above most well-known services.
_FIXED_PORTS_FROM = 20000
_FIXED_PORT_TRIES = 64


def _unshared_socket() -> socket.socket:
    # No SO_REUSEADDR: with it the kernel may hand out a port that connections of an
    # earlier job still hold (TIME_WAIT, or FIN_WAIT towards a host that was cut off),
    # and the listener that takes the port over (torch's TCPStore) then fails to bind.
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (Linux; the usual default elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low, high = handle.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def split_address(address: str) -> tuple[str, int]:
    """("host", port) from "host:port" (the form addresses travel in, e.g. the job's
    service in `job_environment.DRIVER`)."""
    host, port = address.rsplit(":", 1)
    return host, int(port)


def join_address(host: str, port: int) -> str:
    """ "host:port", the inverse of `split_address`."""
    return f"{host}:{port}"
