"""Device health: read each GPU's state, judge it, and keep failing devices out of use.

* :mod:`~torchrelay.health.readings` -- a :class:`Reading` of one device, plain JSON data;
* :mod:`~torchrelay.health.nvml` -- the NVIDIA driver's readings (``nvidia-ml-py``, optional);
* :mod:`~torchrelay.health.inject` -- readings raised on purpose (drills, tests,
  ``torchrelay chaos overheat``), from an owner-only file in the run directory;
* :mod:`~torchrelay.health.poller` -- the node agent's thread that polls the sources;
* :mod:`~torchrelay.health.policy` -- the thresholds, and what one reading breaks;
* :mod:`~torchrelay.health.judge` -- hysteresis and the rate limit: which device to migrate
  off, and when (a pure function over plain state);
* :mod:`~torchrelay.health.quarantine` -- the devices never handed to a spare again until
  ``torchrelay uncordon``.

See docs/health.md. Imports neither torch nor NVML (the NVML source imports it when built).
"""
