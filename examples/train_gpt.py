"""The GPT example, as a script path for ``torchrelay run``:

    torchrelay run --nproc-per-node 4 --spares 1 examples/train_gpt.py --steps 200

The example itself ships inside the package (``src/torchrelay/examples/train_gpt.py``), so
that ``torchrelay demo`` finds it in an installed wheel too; this file runs that one.
"""

import runpy

runpy.run_module("torchrelay.examples.train_gpt", run_name="__main__")
