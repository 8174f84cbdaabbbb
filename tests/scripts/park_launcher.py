"""A stand-in launcher for the launcher-death test: ``python park_launcher.py RUN_DIR``.

It starts the toy worker (slowly stepping, parking at step 2), clones it, releases donor and
clone, prints ``{"donor": pid, "clone": pid}`` on one line, then drains both outputs until it
is killed.
"""

import json
import sys
import threading
from pathlib import Path

from tests.snapshots import TOKEN, start_worker
from torchrelay.transparent import cloner
from torchrelay.transparent.park import Instruction, Kind

worker = start_worker("park_toy.py", "100000", "2", "0.05")
parked = worker.park()
copy = cloner.clone(parked, Path(sys.argv[1]))
worker.channel.instruct(parked.notice, Instruction(Kind.CONTINUE, 1), TOKEN)
copy.channel.instruct(copy.notice, Instruction(Kind.BECOME, 1, slot=1), TOKEN)
for stream in (worker.process.stdout, copy.process.stdout):
    threading.Thread(target=stream.read, daemon=True).start()
print(json.dumps({"donor": worker.process.pid, "clone": copy.pid}), flush=True)
threading.Event().wait()
