"""A toy worker for the park tests: counts, parks at step PARK_AT, prints its identity.

``python park_toy.py STEPS PARK_AT [SLEEP]``: prints ``step <i> <value>`` per step (a running
sum drawn from a seeded generator, so a copy that lost or repeated state would print other
numbers), sleeping SLEEP seconds after each; parks before each step of PARK_AT (``4``, or
``2,4,6``) and prints ``instruction <kind> <slot>`` once released (the slot it holds: an
instruction without one keeps it), then goes on to STEPS and exits with its slot (0 if none):
the test reads a copy's exit status through its restore wrapper.
"""

import os
import random
import sys
import time

from torchrelay.transparent import park

steps, park_at = int(sys.argv[1]), {int(step) for step in sys.argv[2].split(",")}
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
slot = None
rng = random.Random(1234)
total = 0
for step in range(steps):
    if step in park_at:
        instruction = park.wait(os.environ["TORCHRELAY_TOKEN"])
        slot = slot if instruction.slot is None else instruction.slot
        print(f"instruction {instruction.kind.value} {slot}", flush=True)
    total += rng.randrange(1000)
    print(f"step {step} {total}", flush=True)
    time.sleep(pause)
sys.exit(slot or 0)
