"""The worker runtime's compiled extension: where it is built, and how a process loads it.

One module, ``native.cpp``, binds three things that need C++:

- the step guard's completion of a collective (``native_guard.cpp``; used by
  :mod:`torchrelay.runtime.guard`). DDP's all-reduces each completed through a Python callback
  that gloo's thread ran under the GIL, 2.5-4 % of a small model's CPU per step
  (docs/benchmarks.md, "Steady state"); the compiled callback takes no GIL;
- the exit holder (``exit_holder.cpp``; :mod:`torchrelay.runtime.exit_holder`), which no
  Python can do: a process that shares the worker's memory, so that the kernel reports a
  killed worker before it has unmapped that memory;
- the end line of a stack dump (``stack_dump.cpp``; :mod:`torchrelay.runtime.stack_dump`),
  written from a signal handler, where no Python runs.

Contract:

- :func:`build` (the launcher, through ``python -m torchrelay.runtime.native``) compiles the
  sources with torch's C++ extension tools into the cache, once per source, torch and Python:
  ``$TORCHRELAY_CACHE``, else ``$XDG_CACHE_HOME/torchrelay``, else ``~/.cache/torchrelay``.
  It needs a C++ compiler and Python's headers (about 40 s on 2 cores). Concurrent builds of
  one key (nodes sharing a home) wait on torch's lock file.
- :func:`load` (every worker, once): the built module, or ``None`` where nothing is built, the
  build does not load, or ``TORCHRELAY_NATIVE=0``. It never compiles: a worker without the
  module runs the Python guard, which behaves the same and costs that CPU, and no exit holder.
  It loads only from directories this user alone can write (:func:`make_private_dirs` makes
  them so): a shared ``$TORCHRELAY_CACHE`` could otherwise hand a worker another user's code.
- Failure: a build that fails is one line from the launcher, and the job runs without the
  extension; nothing else changes.

Imports neither torch nor the rest of torchrelay at module level: the launcher asks
:func:`built_path` without paying for ``import torch``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path
from types import ModuleType

NAME = "torchrelay_native"
_HERE = Path(__file__).parent
SOURCES = tuple(
    _HERE / name
    for name in (
        "native.cpp",
        "native_guard.cpp",
        "fast_lane.cpp",
        "exit_holder.cpp",
        "stack_dump.cpp",
    )
)
HEADERS = (_HERE / "native.h",)
SWITCH = "TORCHRELAY_NATIVE"  # "0": neither build nor load (the Python guard, no exit holder)


class NativeBuildError(RuntimeError):
    """The extension could not be built here: the message is one line, ``detail`` what
    the compiler said."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def enabled() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


def cache_root() -> Path:
    if os.environ.get("TORCHRELAY_CACHE"):
        return Path(os.environ["TORCHRELAY_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torchrelay"


def built_path() -> Path | None:
    """Where this source, torch and Python's build lives (built or not); ``None`` without an
    installed torch distribution to key it on."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    key = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        key.update(source.read_bytes())
    key.update(f"{torch_version}|{sys.version}|{platform.machine()}".encode())
    return cache_root() / "native" / key.hexdigest()[:16] / f"{NAME}.so"


@functools.cache
def load() -> ModuleType | None:
    """The extension, if built and enabled; else ``None`` (see the module doc)."""
    path = built_path() if enabled() else None
    if path is None or not path.is_file():
        return None
    if not _private(path):
        print(
            f"torchrelay: not loading {path}: it, or its directory, is not this user's alone "
            f"(another user could have written it); running without it",
            file=sys.stderr,
        )
        return None
    if NAME in sys.modules:  # a module pybind11 built cannot be initialised twice
        return sys.modules[NAME]
    import torch  # noqa: F401  (the module links against libtorch, loaded by this import)

    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_loader(NAME, loader)
    if spec is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        loader.exec_module(module)
    except ImportError as exc:  # built against another torch or libstdc++ than this one
        print(f"torchrelay: {path} does not load ({exc}); running without it", file=sys.stderr)
        return None
    sys.modules[NAME] = module
    return module


def _private(path: Path) -> bool:
    """Whether ``path`` and every directory from the cache root down to it are this user's
    and writable by no one else: code is loaded from it."""
    root = cache_root()
    for place in (path, *path.parents):
        info = place.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            return False
        if place == root:
            return True
    return False


def make_private_dirs(path: Path) -> None:
    """Create the directories from the cache root down to ``path``'s, each readable and
    writable by this user only (see :func:`load`)."""
    root = cache_root()
    root.parent.mkdir(parents=True, exist_ok=True)
    below_root = path.parent.relative_to(root)
    for place in (*reversed(below_root.parents), below_root):
        (root / place).mkdir(mode=0o700, exist_ok=True)


def build() -> Path:
    """Compile the extension into :func:`built_path` unless it is there; raises
    :class:`NativeBuildError` (one line) when it cannot be built."""
    path = built_path()
    if path is None:
        raise NativeBuildError("torch is not installed as a distribution")
    if path.is_file():
        return path
    make_private_dirs(path)
    from torch.utils.cpp_extension import load as compile_extension

    try:
        compile_extension(
            NAME,
            [str(source) for source in SOURCES],
            build_directory=str(path.parent),
            extra_cflags=["-O2"],
            verbose=False,
        )
    except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(_summary(exc), str(exc)) from None
    if not path.is_file():
        raise NativeBuildError(f"the build left no {path.name} in {path.parent}")
    return path


def _summary(exc: BaseException) -> str:
    """One line for a failed build (the compiler's own output is in the launcher's log)."""
    text = str(exc)
    if text.startswith("Error building extension"):
        return "the C++ compiler failed (see the build log)"
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return f"{first[:200]} (it needs a C++ compiler and Python's headers)"


def main() -> int:
    """``python -m torchrelay.runtime.native``: build; the last line of stderr says why
    not, and the exit status is 1."""
    try:
        print(build())
    except NativeBuildError as exc:
        print(exc.detail, file=sys.stderr)
        print(f"torchrelay's C++ did not build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
