"""A toy worker for the park tests: counts, parks once at step PARK_AT, prints its identity.

``python park_toy.py STEPS PARK_AT``: prints ``step <i> <value>`` per step (a running sum seeded
by a random state, so a copy that lost or repeated state would print other numbers), parks at
PARK_AT and prints ``instruction <kind> <slot>`` once released, then goes on to STEPS.
"""

import os
import random
import sys

from torchrelay.transparent import park

steps, park_at = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(1234)
total = 0
for step in range(steps):
    if step == park_at:
        instruction = park.wait(os.environ["TORCHRELAY_TOKEN"])
        print(f"instruction {instruction.kind.value} {instruction.slot}", flush=True)
    total += rng.randrange(1000)
    print(f"step {step} {total}", flush=True)
