"""Win the lead on etcd, print ``leader <revision>``, and hold it until killed.

Usage: etcd_leader.py PORT PREFIX TTL. The test SIGKILLs this process: its lease is then no
longer refreshed, and a standby must win only once etcd has expired it.
"""

import sys
import threading

from torchrelay.control.store.etcd import EtcdBackend

port, prefix, ttl = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
leadership = EtcdBackend("127.0.0.1", port, prefix).campaign("child", ttl, timeout=60)
print(f"leader {leadership.revision}", flush=True)
threading.Event().wait()
