"""``torchrelay pool``: one service owns the slots of a set of nodes; jobs attach to it
(``torchrelay run --pool ADDR --priority N``) and borrow slots from lower-priority jobs
(issue 13, docs/pool.md).

``state`` holds the pool as plain data (slots, jobs, loans, enum states); ``policy`` decides,
as pure functions over it, who lends, what each job is told and when a loan comes back;
``service`` serves it over gRPC with sealed JSON (the pool token), keeping the state in a
:class:`~torchrelay.control.store.StateBackend`; ``client`` is a job's or an operator's
connection to it; ``link`` is the launcher's side (it turns the pool's commands into controller
calls and the controller's asks into pool requests). Importing this package loads nothing.
"""
