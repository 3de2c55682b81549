"""Where the trainers and inference actors run, and where trainer rank 0's stores listen.

- Each trainer rank and each inference actor gets a bundle of a Ray placement group
  (``placement_strategy``: PACK by default, SPREAD on request), with ``num_cpus`` of its role and,
  when the run uses CUDA, its share of a GPU: Ray then sets that actor's ``CUDA_VISIBLE_DEVICES``.
  GPU ids named by hand (``trainer_gpu_ids`` / ``inference_gpu_ids``) still work on one host: the
  actors pin their ids themselves, and each still reserves its share of a GPU from Ray
  (``pinned_gpu_shares``: an inference actor beside a trainer a fraction), so Ray's count of free GPUs
  stays true and nothing else is scheduled onto a GPU they use.
- Trainer rank 0 goes to a bundle on the driver's node when there is one: rank 0 writes a
  checkpoint's model files next to the driver's ``log_dir``.
- The training group's master and the weight-sync store live on trainer rank 0's node: rank 0
  reports an address and a free port of its own (``rendezvous``), 127.0.0.1 only for a local run.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
from rich.console import Console

from async_rl.errors import ActorFailedError, ActorTimeoutError, ConfigError
from async_rl.process_setup import plan_gpus, required_cpus

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig, RunSection, ScaleSection

LOCALHOST = "127.0.0.1"
# How long a failed run waits for Ray to report a lost node (GCS health checks: ~3 s period).
NODE_LOSS_WAIT_S = 30.0
console = Console(stderr=True)
# The share of a GPU a trainer keeps when inference actors must share the trainers' GPUs: two
# trainers never fit on one GPU (NCCL refuses two ranks on a device), an inference actor does.
CO_LOCATED_TRAINER_SHARE = 0.75
_GPU_GRANULARITY = 1e-4  # Ray's smallest fractional unit


def gpu_shares(total_gpus: float, num_trainers: int, num_inference: int) -> tuple[float, float]:
    """GPUs per trainer rank and per inference actor on a cluster with ``total_gpus``.

    A whole GPU each while there are enough; else the inference actors share the GPUs left over
    (``k`` per GPU, 1/k each), or, with none left over, the trainers' GPUs."""
    gpus = int(total_gpus + 1e-9)
    if gpus < num_trainers:
        raise ConfigError(f"num_trainers={num_trainers} needs {num_trainers} GPU(s) but the cluster has {total_gpus:g}; "
                          "lower --num-trainers or use --device cpu")
    if gpus >= num_trainers + num_inference:
        return 1.0, 1.0
    spare, trainer_share = gpus - num_trainers, 1.0
    if spare == 0:  # inference actors sit next to the trainers
        spare, trainer_share = num_trainers, CO_LOCATED_TRAINER_SHARE
    per_gpu = math.ceil(num_inference / spare)
    share = (1.0 - trainer_share if trainer_share < 1.0 else 1.0) / per_gpu
    return trainer_share, math.floor(share / _GPU_GRANULARITY) * _GPU_GRANULARITY


def pinned_gpu_shares(trainer_ids: list[Optional[str]], inference_ids: list[Optional[str]]) -> tuple[float, float]:
    """GPUs each trainer rank and each inference actor reserve from Ray when their GPUs are pinned by hand
    (``plan_gpus``; None = CPU): a whole GPU for a trainer alone on its GPU, ``CO_LOCATED_TRAINER_SHARE`` when
    inference actors share it; the inference actors split what is left of the GPU they share, the most
    crowded GPU deciding (every member of a role reserves alike)."""
    if not any(g is not None for g in [*trainer_ids, *inference_ids]):
        return 0.0, 0.0
    beside = {g: inference_ids.count(g) for g in inference_ids if g is not None}
    trainer_share = CO_LOCATED_TRAINER_SHARE if any(g in beside for g in trainer_ids) else 1.0
    if not beside:
        return trainer_share, 0.0
    left = min((1.0 - trainer_share if g in trainer_ids else 1.0) / k for g, k in beside.items())
    return trainer_share, math.floor(left / _GPU_GRANULARITY) * _GPU_GRANULARITY


def uses_cuda(cfg: ScaleSection, cluster_gpus: float) -> bool:
    return cfg.device == "cuda" or (cfg.device == "auto" and cluster_gpus > 0)


def check_cluster(cfg: RunConfig, resources: dict[str, float]) -> None:
    """Refuse, before any actor exists, a plan the cluster cannot hold (CPUs in total, GPUs)."""
    cpus, gpus = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    need = required_cpus(cfg)
    if need > cpus + 1e-9:
        raise ConfigError(f"the actors need {need:g} CPUs but the cluster has {cpus:g}; lower the counts or the "
                          "*_num_cpus keys")
    explicit = cfg.trainer_gpu_ids is not None or cfg.inference_gpu_ids is not None
    if explicit and cfg.ray_address:
        raise ConfigError("trainer_gpu_ids/inference_gpu_ids name GPUs of one host; on a cluster (--ray-address) "
                          "drop them and let Ray give each trainer and inference actor its GPU")
    pinned = {g for g in [*(cfg.trainer_gpu_ids or []), *(cfg.inference_gpu_ids or [])]}
    if explicit and uses_cuda(cfg, gpus) and len(pinned) > gpus + 1e-9:
        raise ConfigError(f"trainer_gpu_ids/inference_gpu_ids name {len(pinned)} GPU(s) ({', '.join(sorted(pinned))}) "
                          f"but Ray has {gpus:g}; start Ray with the GPUs they name (or fewer ids)")
    if cfg.device == "cuda" and gpus == 0:
        raise ConfigError("device 'cuda' but the Ray cluster has no GPU; use --device cpu or add GPU nodes")
    if uses_cuda(cfg, gpus) and not explicit:
        gpu_shares(gpus, cfg.num_trainers, cfg.num_inference_actors)


@dataclass
class RolePlacement:
    """Ray options of every member of one role (trainers or inference actors)."""

    role: str
    num_cpus: float
    num_gpus: float
    group: Optional[PlacementGroup] = None
    bundle_of: list[int] = field(default_factory=list)  # member index -> bundle index
    gpu_ids: list[Optional[str]] = field(default_factory=list)  # GPU pinned by hand, per member
    nodes: list[str] = field(default_factory=list)  # node id per member ("" = Ray decides later)

    def options(self, index: int) -> dict[str, Any]:
        """``ActorClass.options(**placement.options(i))`` for member ``i``."""
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.group is not None:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=self.bundle_of[index])
        return opts

    def gpu_id(self, index: int) -> Optional[str]:
        """The GPU id member ``index`` pins itself (explicit ids), None when Ray assigns it."""
        return self.gpu_ids[index] if self.gpu_ids else None


def _role(role: str, count: int, num_cpus: float, num_gpus: float, strategy: str, timeout_s: float,
          driver_node: str, gpu_ids: Optional[list[Optional[str]]] = None) -> RolePlacement:
    bundle = {k: v for k, v in (("CPU", num_cpus), ("GPU", num_gpus)) if v > 0}
    placed = RolePlacement(role, num_cpus, num_gpus, gpu_ids=list(gpu_ids or []), nodes=[""] * count)
    if not bundle:  # Ray refuses empty bundles: a role that reserves nothing goes anywhere
        return placed
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy, name="")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise ActorTimeoutError(
            f"Ray could not place the {count} {role} bundle(s) of {bundle} ({strategy}) within {timeout_s:g} s; "
            f"free: {ray.available_resources()}; lower the counts or *_num_cpus, or try placement_strategy "
            f"{'SPREAD' if strategy == 'PACK' else 'PACK'}")
    by_bundle = placement_group_table(group)["bundles_to_node_id"]
    # Bundles on the driver's node first (stable): rank 0 lands there when one does.
    order = sorted(range(count), key=lambda b: by_bundle[b] != driver_node)
    placed.group, placed.bundle_of = group, order
    placed.nodes = [by_bundle[b] for b in order]
    return placed


class Placement:
    """The placement of one run: ``Placement(cfg)`` reserves the trainers' and the inference
    actors' resources (one placement group per role, ``cfg.placement_strategy``) and decides their
    GPUs; it raises if Ray cannot place them within ``actor_timeout_s``. Call after ``ray.init``;
    ``remove()`` at shut-down. Set ``rank0`` to trainer rank 0's handle before asking for the
    rendezvous addresses."""

    def __init__(self, cfg: RunConfig) -> None:
        check_cluster(cfg, ray.cluster_resources())
        self.cfg, self.strategy = cfg, cfg.placement_strategy
        self.rank0: Any = None
        gpus = float(ray.cluster_resources().get("GPU", 0))
        trainer_gpu = inference_gpu = 0.0
        trainer_ids: Optional[list[Optional[str]]] = None
        inference_ids: Optional[list[Optional[str]]] = None
        if cfg.trainer_gpu_ids is not None or cfg.inference_gpu_ids is not None:
            trainer_ids, inference_ids = plan_gpus(cfg)  # pinned by hand on this host, reserved through Ray
            trainer_gpu, inference_gpu = pinned_gpu_shares(trainer_ids, inference_ids)
        elif uses_cuda(cfg, gpus):
            trainer_gpu, inference_gpu = gpu_shares(gpus, cfg.num_trainers, cfg.num_inference_actors)
        driver = ray.get_runtime_context().get_node_id()
        self.trainers = _role("trainer", cfg.num_trainers, cfg.trainer_num_cpus, trainer_gpu, self.strategy,
                              cfg.actor_timeout_s, driver, trainer_ids)
        self.inference = RolePlacement("inference", 0, 0)
        try:
            self.inference = _role("inference", cfg.num_inference_actors, cfg.inference_num_cpus, inference_gpu,
                                   self.strategy, cfg.actor_timeout_s, driver, inference_ids)
        except BaseException:
            self.remove()
            raise
        self._ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        console.print(self.describe(), markup=False, soft_wrap=True)

    def trainer_options(self, rank: int) -> dict[str, Any]:
        return self.trainers.options(rank)

    def inference_options(self, index: int) -> dict[str, Any]:
        return self.inference.options(index)

    def trainer_gpu(self, rank: int) -> Optional[str]:
        return self.trainers.gpu_id(rank)

    def inference_gpu(self, index: int) -> Optional[str]:
        return self.inference.gpu_id(index)

    def training_master(self) -> tuple[str, int]:
        """MASTER_ADDR/MASTER_PORT of the training group: on trainer rank 0's node. The first call
        on trainer 0 waits for its process to start and import (a minute and more on a loaded
        machine), so it is bounded by startup_timeout_s, not by one call's actor_timeout_s."""
        return rendezvous(self.cfg, self.rank0, self.cfg.startup_timeout_s)

    def weight_sync_rendezvous(self) -> tuple[str, int]:
        """Address and port of the weight-sync group's store: on trainer rank 0's node (asked anew on
        every (re)join: the port is chosen free at that moment)."""
        return rendezvous(self.cfg, self.rank0)

    def describe(self) -> str:
        """One line: which node (IP) each trainer rank and inference actor was given."""
        parts = [f"{role.role}-{i}@{self.node_ip(f'{role.role}-{i}') or 'any node'}"
                 for role in (self.trainers, self.inference) for i in range(len(role.nodes))]
        return f"placement ({self.strategy}): " + ", ".join(parts)

    def node_ip(self, name: str) -> Optional[str]:
        """IP of the node that actor ``name`` (trainer-R, inference-I) was placed on at start-up,
        also once that node is gone (for the line that names a lost rank); None if not pinned."""
        role, _, index = name.rpartition("-")
        members = {"trainer": self.trainers, "inference": self.inference}.get(role)
        if members is None or not index.isdigit() or int(index) >= len(members.nodes):
            return None
        return self._ips.get(members.nodes[int(index)])

    def lost_trainers(self, wait_s: float = NODE_LOSS_WAIT_S) -> list[str]:
        """"trainer-R on node IP" for each trainer rank whose node Ray reports dead, polling up to
        ``wait_s`` for Ray to notice (its health checks take seconds); [] if none is lost."""
        deadline = time.monotonic() + wait_s
        while True:
            dead = {n["NodeID"] for n in ray.nodes() if not n.get("Alive")}
            lost = [f"trainer-{r} on node {self._ips.get(node, node)}" for r, node in enumerate(self.trainers.nodes)
                    if node in dead]
            if lost or time.monotonic() >= deadline:
                return lost
            time.sleep(0.5)

    def remove(self) -> None:
        """Give the reserved resources back (idempotent)."""
        for role in (self.trainers, self.inference):
            if role.group is not None:
                remove_placement_group(role.group)
                role.group = None


def rendezvous(cfg: RunConfig, trainer0: Any, timeout_s: Optional[float] = None) -> tuple[str, int]:
    """(address, port) on trainer rank 0's node for a store it will host: its node's IP and a port
    free there on a cluster, 127.0.0.1 and a loopback port for a local run. Waits ``timeout_s``
    (default actor_timeout_s)."""
    if trainer0 is None:
        raise RuntimeError("Placement.rank0 is not set: create the trainers first")
    timeout_s = cfg.actor_timeout_s if timeout_s is None else timeout_s
    try:
        addr, port = ray.get(trainer0.rendezvous_endpoint.remote(not cfg.ray_address), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise ActorTimeoutError(f"trainer-0 did not report its rendezvous address within {timeout_s:g} s") from None
    return addr, port


def lost_node_note(cfg: RunSection, placement: Optional[Placement], exc: BaseException) -> str:
    """"; lost with its node: trainer-R on node IP" when a cluster run stopped because the node of a
    trainer rank died (the error itself may name a surviving rank whose collective broke, or
    another actor of the lost node); else ""."""
    if placement is None or not cfg.ray_address:
        return ""
    # Wait for Ray's verdict only where a lost node is a likely cause: a trainer failed, a wait
    # timed out, or an actor became unreachable (any actor of the lost node may be noticed first).
    likely = (not isinstance(exc, ActorFailedError) or exc.actor_name.startswith("trainer")
              or any(word in str(exc) for word in ("Unavailable", "Died", "died")))
    lost = placement.lost_trainers(NODE_LOSS_WAIT_S if likely else 0.0)
    return f"; lost with its node: {', '.join(lost)}" if lost else ""


def on_driver_node() -> dict[str, Any]:
    """Ray options that keep an actor on the driver's node: the run's singletons (replay buffer,
    stats) share the driver's fate instead of dying with whichever node Ray picked for them."""
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}
