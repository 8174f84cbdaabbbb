"""``torchrelay run`` whose controller sets a handover's boundary at the highest step the ranks
reported, with no margin: as if every report had lagged its rank by the whole margin (a loaded
machine). Ranks that wait inside the next step are then told their boundary after they looked
past it (tests: ``python lagging_launcher.py run ...``, the arguments of ``torchrelay``)."""

import sys

from torchrelay.cli.main import main
from torchrelay.control import handover

handover._margin = lambda job: 0
sys.exit(main(sys.argv[1:]))
