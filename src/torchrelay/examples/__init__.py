"""Example training scripts shipped inside the package, so that ``torchrelay demo`` works
from an installed wheel (not only from a checkout). Each is a script to launch with
``torchrelay run``; importing one does not run it."""

from pathlib import Path

GPT_SCRIPT = Path(__file__).resolve().parent / "train_gpt.py"
"""The character-level GPT that ``torchrelay demo`` trains (see its docstring)."""
