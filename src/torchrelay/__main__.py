"""``python -m torchrelay``: the ``torchrelay`` command, as ``python -m torch.distributed.run``
is torchrun's (under ``srun python -m torchrelay run ...``, or wherever the console script is
not on ``PATH``)."""

from torchrelay.cli.main import main

raise SystemExit(main())
