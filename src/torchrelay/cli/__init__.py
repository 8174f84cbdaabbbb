"""The ``torchrelay`` command line."""
