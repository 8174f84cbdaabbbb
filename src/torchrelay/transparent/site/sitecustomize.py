"""Installed by ``torchrelay run --transparent`` on its workers' PYTHONPATH (not a package).

It installs :mod:`torchrelay.transparent.hook` in a worker, then runs the ``sitecustomize``
it shadows, if any (Debian's Python ships one). The variable that asks for the hook is removed
so that processes the script starts do not install it again.
"""

import os
import sys

if os.environ.pop("TORCHRELAY_TRANSPARENT", "") == "1":
    from torchrelay.transparent.hook import install

    install()

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _candidate = os.path.join(os.path.abspath(_entry or "."), "sitecustomize.py")
    if os.path.dirname(_candidate) != _here and os.path.isfile(_candidate):
        with open(_candidate) as _file:
            exec(compile(_file.read(), _candidate, "exec"))
        break
