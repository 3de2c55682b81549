"""Rendezvous of actors that form a process group of their own: a free port, the interface that
holds an address, and the two sides of a ``TCPStore``. Both the trainers' DeepSpeed group and the
weight-sync group meet this way."""
from __future__ import annotations

import datetime
import ipaddress
import socket
import time

import torch.distributed as dist

from async_rl.errors import ActorTimeoutError, ConfigError

POLL_S = 0.05


def timedelta_s(seconds: float) -> datetime.timedelta:
    """``seconds`` as a timedelta, at least 1 ms (torch refuses a zero timeout)."""
    return datetime.timedelta(seconds=max(float(seconds), 0.001))


def find_free_port(addr: str = "") -> int:
    """A TCP port that was free on ``addr`` (default: every interface) a moment ago (another
    process may still take it). Call it on the host that will listen on the port."""
    with socket.socket(_family(addr), socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def interface_of(addr: str) -> str:
    """Name of this host's network interface that holds ``addr`` (e.g. for GLOO_SOCKET_IFNAME)."""
    import psutil  # noqa: PLC0415 (a dependency of ray[default]; only multi-node runs need it)

    if is_loopback(addr):
        return "lo"
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == addr for a in addrs):
            return str(name)
    raise ConfigError(f"no network interface of this host holds {addr}; start Ray with --node-ip-address "
                      "set to one of this host's addresses")


def host_store(addr: str, port: int, world_size: int | None, timeout: datetime.timedelta) -> dist.TCPStore:
    """The master side of a TCPStore that listens on ``addr`` only (loopback for a local run, the
    node's own address on a cluster): TCPStore alone listens on every interface, so it is handed a
    socket bound to ``addr`` (it takes the descriptor over)."""
    listen = socket.create_server((addr, port), family=_family(addr), backlog=128)
    store = dist.TCPStore(addr, port, world_size, True, timeout, wait_for_workers=False, master_listen_fd=listen.fileno())
    listen.detach()
    return store


def connect_store(addr: str, port: int, world_size: int | None, timeout_s: float, who: str, host: str) -> dist.TCPStore:
    """The client side of ``host``'s store at ``addr:port``. Waits for the master's socket itself
    (TCPStore's own connect retries overshoot the timeout 2-3x and log a C++ stack trace each try);
    raises ActorTimeoutError naming ``who`` and ``host`` if it is not reachable within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((addr, port), timeout=max(min(1.0, deadline - time.monotonic()), 0.05)):
                break
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ActorTimeoutError(f"{who}: {host} did not open its store at {addr}:{port} within "
                                        f"{timeout_s:g} s ({e})") from None
            time.sleep(POLL_S)
    try:
        return dist.TCPStore(addr, port, world_size, False, timedelta_s(max(deadline - time.monotonic(), 1.0)))
    except RuntimeError as e:
        raise ActorTimeoutError(f"{who}: could not connect to the store of {host} at {addr}:{port}: {e}") from e
