"""Ready-made saga templates: functions that return a versioned definition.

Each template is parameterised by your types and functions and returns an ordinary
:class:`~saga.Saga` (add steps after the template's, register it with an app, version it
like any other definition). See ``docs/composition.md`` for examples.

- :func:`approval_chain`: a request approved by several people, one after the other, all
  at once or k of n, each through a human task (its id is what you send them); a rejection
  or a timeout withdraws the approvals given so far, a late approver's task may go to a deputy.
- :func:`batch`: a batch/ETL job: a map over chunks with bounded concurrency, per-chunk
  retries and time-outs, an optional undo per chunk, and :func:`chunked` to cut a list.
"""

from saga.templates._approval import ApprovalChain, ApprovalRequest, Decision, approval_chain
from saga.templates._batch import batch, chunked

__all__ = ["ApprovalChain", "ApprovalRequest", "Decision", "approval_chain", "batch", "chunked"]
