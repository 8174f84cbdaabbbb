"""Durable job state and leader election behind one small interface (issue 10, item 3).

``base`` defines :class:`StateBackend` (compare-and-swap of one state blob, ``campaign`` for
the lead) and :class:`Leadership`; ``memory`` and ``etcd`` implement it (``election`` holds
etcd's lease-based election, ``etcd_client`` its bounded calls); ``sealed`` authenticates the
state with the job token; ``url`` parses ``--state``. Importing this package loads no client.
"""

from torchrelay.control.store.base import (
    ElectionTimeout,
    Leadership,
    NotLeader,
    Revision,
    StateBackend,
    StoreError,
    StoreUnavailable,
)
from torchrelay.control.store.sealed import SealedStore, StateTampered
from torchrelay.control.store.url import StoreKind, StoreSpec, open_backend, parse_store_url

__all__ = [
    "ElectionTimeout",
    "Leadership",
    "NotLeader",
    "Revision",
    "SealedStore",
    "StateBackend",
    "StateTampered",
    "StoreError",
    "StoreKind",
    "StoreSpec",
    "StoreUnavailable",
    "open_backend",
    "parse_store_url",
]
