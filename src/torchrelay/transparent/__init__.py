"""Transparent mode: process snapshots (CRIU) of unmodified training scripts; see issue 16."""
