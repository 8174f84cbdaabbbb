"""The slot pool of issue 13 (borrowed replacements): its state and decisions, pure so far."""
