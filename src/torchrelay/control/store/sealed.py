"""The state as the controller reads and writes it: sealed with the job token.

A backend stores bytes that anyone with access to etcd could write. :class:`SealedStore`
seals each state with :func:`torchrelay.control.wire.seal` (HMAC-SHA256 of the job token over
JSON) before it is stored, and opens what it reads before anything looks at it: a value that
fails authentication (another job's, or tampered with) raises :class:`StateTampered` and is
never acted on. What is stored is a small JSON envelope, the state itself inside it deflated
(zlib, level 1) and base64-encoded: a large job's state is JSON with the same keys for every
member, which deflates about 13-fold (16,384 ranks: 4.4 MB of JSON, 0.33 MB stored, under
etcd's default 1.5 MiB request limit even base64-encoded twice, by the envelope and by etcd's
JSON gateway). An envelope of an earlier version (``state``: not deflated) still opens.
"""

from __future__ import annotations

import base64
import binascii
import zlib

from torchrelay.control.store.base import Leadership, Revision, StateBackend, StoreError
from torchrelay.control.wire import WireError, seal, unseal


class StateTampered(StoreError):
    """The stored state failed authentication with this job's token."""


class SealedStore:
    """Compare-and-swap of the job's state over ``backend``, authenticated with ``token``."""

    def __init__(self, backend: StateBackend, token: str) -> None:
        self.backend = backend
        self.token = token

    def get_state(self) -> tuple[bytes | None, Revision]:
        """The authenticated state and its revision, ``(None, 0)`` when none is stored."""
        raw, revision = self.backend.get_state()
        return self._open(raw, revision), revision

    def set_state(
        self, state: bytes, revision: Revision, fence: Leadership | None = None
    ) -> tuple[bytes | None, Revision, bool]:
        """As :meth:`StateBackend.set_state`; the current state returned is authenticated."""
        deflated = base64.b64encode(zlib.compress(state, 1)).decode()
        sealed = seal({"deflated": deflated}, self.token)
        current, new_revision, written = self.backend.set_state(sealed, revision, fence)
        if written:
            return bytes(state), new_revision, True
        return self._open(current, new_revision), new_revision, False

    def _open(self, raw: bytes | None, revision: Revision) -> bytes | None:
        if raw is None:
            return None
        try:
            body = unseal(raw, self.token)  # authenticated before anything is inflated
            if "deflated" in body:
                return zlib.decompress(base64.b64decode(body["deflated"], validate=True))
            return base64.b64decode(body["state"], validate=True)
        except (WireError, KeyError, TypeError, binascii.Error, zlib.error) as exc:
            raise StateTampered(
                f"the job state in {self.backend.where} (revision {revision}) failed "
                f"authentication with this job's token ({exc}); refusing to use it: was it "
                "written by another job with the same key prefix, or by hand?"
            ) from None
