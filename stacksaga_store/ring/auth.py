"""Who may talk to the ring coordinator (docs/recovery-engine.md "Security").

Without it, a ``Hello`` naming an existing node's id disconnected that node and handed the
caller its lease (or the whole ring), and made-up ids forced epoch bumps. Two mechanisms,
either or both:

* **A shared secret.** The coordinator holds ``secret``; each Retry-Node holds its *node key*
  ``HMAC-SHA256(secret, node id)`` (:func:`node_key`), or the secret itself, from which it
  derives its own. Every call carries the metadata ``x-stacksaga-ring-auth`` =
  ``v1.<node id, base64url>.<send time µs>.<random nonce>.<HMAC under the node key>``: the
  coordinator recomputes the node key, so a node given only its node key cannot speak for
  another node, a captured header expires after the window and is accepted only once within
  it, and the secret never crosses the network.
* **Mutual TLS.** With ``tls.require_client_certificate`` the client certificate's common
  name or a subject alternative name must be ``tls.identity`` formatted with the node id of
  the ``Hello`` (``{node_id}`` by default).

The ``Hello``'s node id must be the authenticated one (PERMISSION_DENIED otherwise), so an
unauthenticated or differently authenticated caller can neither end another node's session
nor receive its lease, and only authenticated nodes can join a ring (and cause an epoch).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from accord_cassandra.peerauth import is_loopback
from stacksaga_store.config.settings import CoordinatorProperties
from stacksaga_store.errors import ConfigError, StackSagaError

__all__ = [
    "AUTH_METADATA",
    "NODE_ID_MAX_BYTES",
    "RingAuthenticator",
    "RingRefused",
    "auth_metadata",
    "client_security",
    "is_loopback",
    "node_key",
    "server_security",
]

AUTH_METADATA = "x-stacksaga-ring-auth"
NODE_ID_MAX_BYTES = 256
SERVICE_NAME_MAX_BYTES = 256
WINDOW_SECONDS = 60.0
# Nonces of accepted credentials are remembered for the window; only callers holding a
# valid key add one (a session or a Status call each), so this bounds honest load only.
NONCES_MAX = 100_000
_KEY_DOMAIN = b"stacksaga ring node key v1\x00"
_MAC_DOMAIN = b"stacksaga ring call v1\x00"


class RingRefused(StackSagaError):
    """A ring-coordinator call refused before it touches state; ``code`` is the gRPC status."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def node_key(secret: bytes, node_id: str) -> bytes:
    """The key a Retry-Node signs with: lets it speak for ``node_id`` and no other node."""
    return hmac.new(secret, _KEY_DOMAIN + node_id.encode(), hashlib.sha256).digest()


def _mac(key: bytes, node_id: bytes, sent_at: int, nonce: bytes) -> bytes:
    body = struct.pack(">I", len(node_id)) + node_id + struct.pack(">Q", sent_at) + nonce
    return hmac.new(key, _MAC_DOMAIN + body, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def auth_metadata(
    key: bytes, node_id: str, clock: Callable[[], float] = time.time
) -> tuple[tuple[str, str], ...]:
    """The call metadata authenticating ``node_id`` with its node key ``key``."""
    encoded = node_id.encode()
    sent_at = int(clock() * 1_000_000)
    nonce = secrets.token_bytes(16)
    value = ".".join(
        ("v1", _b64(encoded), str(sent_at), _b64(nonce), _b64(_mac(key, encoded, sent_at, nonce)))
    )
    return ((AUTH_METADATA, value),)


def _identities(auth_context: Mapping[str, Sequence[bytes]]) -> set[str]:
    names = [
        *auth_context.get("x509_common_name", ()),
        *auth_context.get("x509_subject_alternative_name", ()),
    ]
    return {n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in names}


@dataclass
class RingAuthenticator:
    """Checks a call's credentials; :meth:`authenticate` returns the node id they prove
    (None: no mechanism is configured, anyone is anyone)."""

    secret: bytes | None = None
    # With mutual TLS: the identity a node's certificate must carry.
    certificate_identity: str | None = None
    window_seconds: float = WINDOW_SECONDS
    clock: Callable[[], float] = time.time
    _nonces: dict[bytes, float] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.secret is not None or self.certificate_identity is not None

    def authenticate(
        self,
        metadata: Sequence[tuple[str, str | bytes]],
        auth_context: Mapping[str, Sequence[bytes]],
    ) -> str | None:
        """The node id the secret-based credential proves (None without a secret)."""
        if self.certificate_identity is not None and not _identities(auth_context):
            raise RingRefused(grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
        if self.secret is None:
            return None
        values = [v for k, v in metadata if k == AUTH_METADATA]
        if len(values) != 1:
            raise RingRefused(
                grpc.StatusCode.UNAUTHENTICATED,
                f"expected one {AUTH_METADATA} credential, got {len(values)}",
            )
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        parts = value.split(".")
        try:
            if len(parts) != 5 or parts[0] != "v1":
                raise ValueError("not v1.<node>.<time>.<nonce>.<mac>")
            node_id = _unb64(parts[1])
            sent_at = int(parts[2])
            nonce, mac = _unb64(parts[3]), _unb64(parts[4])
            name = node_id.decode()
        except (ValueError, binascii.Error, UnicodeDecodeError) as error:
            raise RingRefused(
                grpc.StatusCode.UNAUTHENTICATED, f"malformed {AUTH_METADATA}: {error}"
            ) from None
        if len(node_id) > NODE_ID_MAX_BYTES or len(nonce) != 16:
            raise RingRefused(grpc.StatusCode.UNAUTHENTICATED, f"malformed {AUTH_METADATA}")
        expected = _mac(node_key(self.secret, name), node_id, sent_at, nonce)
        if not hmac.compare_digest(expected, mac):
            raise RingRefused(grpc.StatusCode.UNAUTHENTICATED, "wrong credential")
        now = self.clock()
        if abs(now - sent_at / 1_000_000) > self.window_seconds:
            raise RingRefused(
                grpc.StatusCode.UNAUTHENTICATED,
                f"credential made {now - sent_at / 1e6:+.0f} s ago, outside the "
                f"{self.window_seconds:g} s window (are the clocks in sync?)",
            )
        self._remember(nonce, now)
        return name

    def _remember(self, nonce: bytes, now: float) -> None:
        if nonce in self._nonces:
            raise RingRefused(grpc.StatusCode.UNAUTHENTICATED, "credential replayed")
        if len(self._nonces) >= NONCES_MAX:
            self._nonces = {n: t for n, t in self._nonces.items() if t > now - self.window_seconds}
            if len(self._nonces) >= NONCES_MAX:
                raise RingRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many sessions")
        self._nonces[nonce] = now

    def check_node(
        self, node_id: str, proven: str | None, auth_context: Mapping[str, Sequence[bytes]]
    ) -> None:
        """The Hello's ``node_id`` must be the one the credentials prove."""
        if self.secret is not None and proven != node_id:
            raise RingRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"credentials of node {proven!r} cannot speak for node {node_id!r}",
            )
        if self.certificate_identity is not None:
            wanted = self.certificate_identity.format(node_id=node_id)
            if wanted not in _identities(auth_context):
                raise RingRefused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"the client certificate is not {wanted!r} (node {node_id!r})",
                )


_PROPERTY = "stacksaga.cassandra.recovery.coordinator"


def _read(path: Path, name: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ConfigError.single(
            f"{_PROPERTY}.tls.{name}", f"cannot read {path}: {error}"
        ) from None


def server_security(
    props: CoordinatorProperties, listen: str
) -> tuple[RingAuthenticator, grpc.ServerCredentials | None]:
    """The coordinator's authenticator and TLS credentials; refuses to serve beyond loopback
    unauthenticated unless ``allow-insecure`` says so."""
    secret = props.secret.get_secret_value().encode() if props.secret is not None else None
    credentials = None
    identity = None
    tls = props.tls
    if tls is not None:
        credentials = grpc.ssl_server_credentials(
            [(_read(tls.private_key, "private-key"), _read(tls.certificate, "certificate"))],
            root_certificates=_read(tls.ca, "ca") if tls.ca is not None else None,
            require_client_auth=tls.require_client_certificate,
        )
        identity = tls.identity if tls.require_client_certificate else None
    auth = RingAuthenticator(secret=secret, certificate_identity=identity)
    if not auth.enabled and not is_loopback(listen) and not props.allow_insecure:
        raise ConfigError.single(
            f"{_PROPERTY}.secret",
            f"the coordinator would listen on {listen}, beyond loopback, with neither a secret "
            "nor client certificates: any caller could take any node's lease. Set secret (or "
            "tls with require-client-certificate), or allow-insecure: true on a trusted network",
        )
    return auth, credentials


def client_security(
    props: CoordinatorProperties, node_id: str
) -> tuple[bytes | None, grpc.ChannelCredentials | None]:
    """A Retry-Node's node key (from ``node-key``, else derived from ``secret``) and its TLS
    channel credentials."""
    key = None
    if props.node_key is not None:
        key = bytes.fromhex(props.node_key.get_secret_value())
    elif props.secret is not None:
        key = node_key(props.secret.get_secret_value().encode(), node_id)
    credentials = None
    tls = props.tls
    if tls is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(tls.ca, "ca") if tls.ca is not None else None,
            private_key=_read(tls.private_key, "private-key"),
            certificate_chain=_read(tls.certificate, "certificate"),
        )
    return key, credentials
