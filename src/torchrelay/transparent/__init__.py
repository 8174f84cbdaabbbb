"""Model-transparent mode (``torchrelay run --transparent``): an unmodified torchrun script.

The launcher puts :mod:`site` (a ``sitecustomize``) on the workers' ``PYTHONPATH``; it installs
:mod:`torchrelay.transparent.hook`, which routes ``init_process_group`` to the relay's stable
process group, finds the step boundary at ``optimizer.step()`` and voids a step whose
collectives failed (:mod:`boundary`, :mod:`sampler`). See docs/transparent.md.
"""
