"""Join a running Ray with the authentication it runs with, and say so in one line when the token is refused.

``ray start`` turns token authentication on by itself when it finds a token (``~/.ray/auth_token``), and its
processes then run with ``RAY_AUTH_MODE=token`` in their environment; the user's shell has no such variable.
Ray's own ``ray.init("auto")`` follows ``ray start`` (it turns token mode on when a token exists); a driver given
the address, as ``--address auto`` gives it, does not, so it connected with authentication off and Ray retried
for twenty seconds, logging every refusal from C++, before a ``ConnectionError``.

So a Ray found by ``--address auto`` is joined with what its GCS runs with (:class:`RayAuth`, read from its
process's environment, the same user's: ``running_ray.py``), where the user did not say otherwise:
``RAY_AUTH_MODE`` when the shell has none, and the token file it reads when the shell names no token. Then
:func:`check_token` makes one call to the GCS with the token this process would send: a refusal is one
:class:`~distributed_onnx.errors.RayStartError` naming authentication and what to set, before ``ray.init``
starts its retries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from distributed_onnx.errors import RayStartError
from distributed_onnx.runtime import ray_private

MODE = "RAY_AUTH_MODE"
TOKEN = "RAY_AUTH_TOKEN"
TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
#: Where ``ray start`` reads its token when neither variable above names one (under the HOME it ran with).
DEFAULT_TOKEN_FILE = Path(".ray") / "auth_token"


@dataclass(frozen=True)
class RayAuth:
    """The authentication a running Ray's GCS runs with: its ``RAY_AUTH_MODE`` (None: unset, Ray's default off)
    and the token file it reads (None: the token is in its environment itself, or unknown)."""

    mode: str | None
    token_file: str | None

    @classmethod
    def from_environment(cls, environment: dict[str, str]) -> RayAuth:
        token_file = environment.get(TOKEN_PATH)
        if token_file is None and TOKEN not in environment and environment.get("HOME"):
            token_file = str(Path(environment["HOME"]) / DEFAULT_TOKEN_FILE)
        return cls(environment.get(MODE), token_file)


def adopt(auth: RayAuth) -> None:
    """Use ``auth`` in this process where its environment does not say otherwise (module docstring)."""
    changed = False
    if MODE not in os.environ and auth.mode is not None:
        os.environ[MODE] = auth.mode
        changed = True
    wants_token = os.environ.get(MODE, "").lower() == "token"
    names_no_token = TOKEN not in os.environ and TOKEN_PATH not in os.environ
    if wants_token and names_no_token and auth.token_file is not None and os.access(auth.token_file, os.R_OK):
        os.environ[TOKEN_PATH] = auth.token_file
        changed = True
    if changed:
        ray_private.reload_authentication()


def check_token(address: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`RayStartError` if the GCS at ``address`` refuses this process's token (or its lack of one).

    Any other answer, or none, is left to ``ray.init`` (which says what it is).
    """
    import grpc

    metadata = ray_private.auth_metadata()
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(ray_private.GCS_PROBE_METHOD)
        try:
            call(b"", metadata=metadata, timeout=timeout_s)
        except grpc.RpcError as refused:
            if refused.code() != grpc.StatusCode.UNAUTHENTICATED:
                return
            raise RayStartError(_refusal(address, bool(metadata))) from None


def _refusal(address: str, sent_token: bool) -> str:
    mode = os.environ.get(MODE)
    if not sent_token:
        seen = f"{MODE}={mode}" if mode else f"{MODE} unset (Ray's default: off)"
        what = f"this command sent no token ({seen})"
        do = f"set {MODE}=token and the Ray's token: ~/.ray/auth_token, {TOKEN_PATH}=FILE or {TOKEN}"
    else:
        source = os.environ.get(TOKEN_PATH) or ("$" + TOKEN if TOKEN in os.environ else "~/.ray/auth_token")
        what = f"it refused the token this command sent (from {source})"
        do = f"point {TOKEN_PATH} at the token file the Ray was started with (or set {TOKEN})"
    return f"authentication to the Ray at {address} failed: {what}; {do}, then rerun (docs/cluster.md)"
