"""The runtime's compiled extension (runtime/native.py): built once by the launcher, loaded by
workers only from this user's own directories, and a failed build costs one line, once."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import require_built
from torchrelay.agent import native_build
from torchrelay.runtime import native


def test_nothing_loads_where_the_extension_is_switched_off_or_not_built(monkeypatch, tmp_path):
    monkeypatch.setenv(native.SWITCH, "0")
    native.load.cache_clear()
    try:
        assert native.load() is None
        monkeypatch.setenv(native.SWITCH, "1")
        monkeypatch.setenv("TORCHRELAY_CACHE", str(tmp_path))  # nothing built there
        native.load.cache_clear()
        assert native.load() is None
    finally:
        monkeypatch.undo()
        native.load.cache_clear()


def test_the_extension_loads_where_it_is_built():
    require_built()
    native.load.cache_clear()
    module = native.load()
    assert module is not None
    assert hasattr(module, "guarded") and hasattr(module, "start_exit_holder")


def test_the_extension_is_loaded_only_from_this_users_own_directories(monkeypatch, tmp_path, capfd):
    """Code is loaded from the cache: a directory others can write to is refused."""
    require_built()
    built = native.built_path()
    monkeypatch.setenv("TORCHRELAY_CACHE", str(tmp_path / "cache"))
    copy = native.built_path()
    assert built is not None and copy is not None
    native.make_private_dirs(copy)
    shutil.copy2(built, copy)
    try:
        copy.parent.chmod(0o777)
        native.load.cache_clear()
        assert native.load() is None
        assert "not this user's alone" in capfd.readouterr().err
        copy.parent.chmod(0o700)
        native.load.cache_clear()
        assert native.load() is not None
    finally:
        monkeypatch.undo()
        native.load.cache_clear()


def test_a_build_that_fails_is_one_line_and_is_not_retried_at_every_launch(monkeypatch, tmp_path):
    """A compiler that cannot compile: the launcher says why in one line, leaves the job to
    the workers without it, and the next launch does not compile again."""
    compiler = tmp_path / "c++"
    compiler.write_text(
        '#!/bin/sh\ncase "$1" in -v|--version|-dumpfullversion) exec g++ "$@";; esac\n'
        'echo "cc1plus: out of memory allocating 4096 bytes" >&2\nexit 1\n'
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("TORCHRELAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(native.SWITCH, raising=False)
    lines: list[str] = []
    assert not native_build.ensure_native(lines.append)
    assert len(lines) == 2 and "compiling" in lines[0]
    assert "did not build" in lines[1] and "Python step guard" in lines[1]
    assert "no exit holder" in lines[1]
    build_dir = Path(str(native.built_path())).parent
    logs = sorted(build_dir.glob("build-*.log"))
    assert len(logs) == 1 and "out of memory" in logs[0].read_text()
    again: list[str] = []
    assert not native_build.ensure_native(again.append)
    assert len(again) == 1 and "to retry" in again[0]
    assert sorted(build_dir.glob("build-*.log")) == logs  # not compiled again


def test_nothing_is_built_or_imported_when_switched_off(monkeypatch, tmp_path):
    monkeypatch.setenv(native.SWITCH, "0")
    monkeypatch.setenv("TORCHRELAY_CACHE", str(tmp_path))
    lines: list[str] = []
    assert not native_build.ensure_native(lines.append)
    assert lines == [] and not any(tmp_path.iterdir())
