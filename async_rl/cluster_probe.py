"""Asks a Ray cluster's GCS, before ``ray.init`` joins it, whether this process can join.

``ray.init(address=...)`` meets an unreachable address, a refused authentication token or another
Ray/Python version with ~20 s of retries, a C++ log line per retry and a traceback. One gRPC call
(the GCS's key-value read of the cluster's metadata, as ``ray.init`` itself makes it) tells the
three apart in a few seconds; ``probe_cluster`` turns each into one sentence that names the fix.
"""
from __future__ import annotations

import json
import os
from typing import Optional

from ray._private import ray_constants
from ray._private.authentication.authentication_utils import is_token_auth_enabled
from ray._private.utils import check_version_info, compute_version_info
from ray.core.generated import gcs_service_pb2

PROBE_TIMEOUT_S = 5.0


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--ray-address {address!r}: expected HOST:PORT of the head's GCS (e.g. 10.0.0.1:6379)")
    return host, int(port)


def _auth_metadata() -> tuple[tuple[str, str], ...]:
    """The token header this process would send (none unless RAY_AUTH_MODE=token)."""
    from ray._private.authentication.grpc_authentication_client_interceptor import (  # noqa: PLC0415 (grpc: as below)
        _get_authentication_metadata_tuple,
    )

    return _get_authentication_metadata_tuple() if is_token_auth_enabled() else ()


def probe_cluster(address: Optional[str], timeout_s: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """None when the cluster at ``address`` (``HOST:PORT``) answers, accepts this process's token
    and runs this Ray and Python; otherwise the one line to print. ``auto`` and ``ray://``
    addresses are left to Ray (they are not a GCS address to dial)."""
    if not address or address == "auto" or address.startswith("ray://"):
        return None
    try:
        host, port = _split(address)
    except ValueError as exc:
        return str(exc)
    # What the probe needs beyond what `import ray` loads (grpc: ~20 modules, a C extension) loads only where an
    # address is probed, not with the driver module (the launch scripts' --help imports it).
    import grpc  # noqa: PLC0415 (see above)
    from ray._common.usage.usage_constants import CLUSTER_METADATA_KEY  # noqa: PLC0415 (see above)
    from ray.core.generated import gcs_service_pb2_grpc  # noqa: PLC0415 (see above)

    fix_address = (f"--ray-address {address}: no Ray cluster answers there; start one with "
                   f"`ray start --head --port={port}` on {host}, or pass the address `ray start --head` printed")
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        stub = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
        request = gcs_service_pb2.InternalKVGetRequest(  # type: ignore[attr-defined]  # generated protobuf: no stub
            key=CLUSTER_METADATA_KEY, namespace=ray_constants.KV_NAMESPACE_CLUSTER)
        metadata = _auth_metadata()
        try:
            reply = stub.InternalKVGet(request, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                if not metadata and os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
                    return (f"--ray-address {address}: the cluster uses token authentication and this process found "
                            "no token; set RAY_AUTH_TOKEN or copy the head's ~/.ray/auth_token")
                if not metadata:
                    return (f"--ray-address {address}: the cluster uses token authentication; run with "
                            "RAY_AUTH_MODE=token (the token is read from ~/.ray/auth_token or RAY_AUTH_TOKEN)")
                return (f"--ray-address {address}: the cluster refused this process's token; use the head's token "
                        "(its ~/.ray/auth_token, or RAY_AUTH_TOKEN=<token>)")
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return fix_address
            return f"--ray-address {address}: the cluster's GCS answered {code}: {exc.details() if hasattr(exc, 'details') else exc}"
    if not reply.value:  # a GCS that has not written its metadata yet: ray.init checks again
        return None
    return version_mismatch(address, json.loads(reply.value.decode()))


def version_mismatch(address: str, cluster_metadata: dict) -> Optional[str]:
    """The line to print when the cluster's Ray or Python (its GCS metadata) differs from this
    process's, judged as ``ray.init`` judges it; None when they match."""
    try:
        check_version_info(cluster_metadata, "this machine")  # Ray's own rule (Python's patch level included)
    except RuntimeError:
        ray_here, python_here = compute_version_info()
        return (f"--ray-address {address}: version mismatch: the cluster runs Ray {cluster_metadata['ray_version']} "
                f"on Python {cluster_metadata['python_version']}, this process Ray {ray_here} on Python {python_here}; "
                "run the driver with the cluster's Ray and Python (the project's .venv on every node)")
    return None
