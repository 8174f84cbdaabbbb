"""Exit statuses a worker uses to tell the controller it left on purpose, not by a fault of
its own: the controller neither counts these against ``--max-restarts`` nor mistakes them for
a bug in the script."""

EXIT_FENCED = 70
"""The controller refused this process (a stale generation), or its lease ran out."""

EXIT_CONTROLLER_LOST = 75
"""The controller is gone (its connection closed); the job cannot continue."""

SELF_FENCED = frozenset({EXIT_FENCED, EXIT_CONTROLLER_LOST})
