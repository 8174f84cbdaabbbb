"""Side-by-side benchmark of plain DDP, torchrun + checkpoints, torchft and torchrelay.

Run ``python -m bench`` (about 10 minutes on 2 cores) or ``python -m bench --quick`` (a smoke
test, under 3 minutes). Results go to ``docs/benchmarks.md`` and ``docs/img/bench_progress.png``
unless ``--out-dir`` says otherwise.
"""
