"""What the decider's rule sets may ask of the decision in progress.

The decider (``saga/core/decider.py``) decides one event with a mutable working copy of the
saga's state, and composes one small object per rule set: waits and the deadline
(``wait_rules.py``), groups, maps and first-of-N (``group_rules.py``), TCC steps and child end
reports (``tcc_rules.py``), compensation (``compensation_rules.py``), operator actions
(``operator_rules.py``) and the commands it sends (``commands.py``). Each rule object is made
with the decision, as :class:`Run`, and reaches the rest of the decider only through the
calls below; a rule set that needs another one gets it in its constructor. So a rule file
reads on its own: the state it changes, the effects it appends, and these calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import msgspec

    from saga.core.effects import Effect
    from saga.core.model import Attempt, Kind, Outcome, SagaState, StepState
    from saga.definition.saga import Saga, Step


class Run(Protocol):
    """A decision in progress, as its rule sets see it.

    Attributes:
        definition: The saga's definition.
        state: The working copy of the saga's state (rule sets change it in place).
        now_ms: The event's time: the decision's only clock.
        effects: What the decision asks the engine to do, in order (rule sets append).

    """

    definition: Saga[Any]
    state: SagaState
    now_ms: int
    effects: list[Effect]

    @property
    def stopping(self) -> bool:
        """Whether the saga goes no further forward: cancel requested or deadline passed."""
        ...

    def ignore(self, reason: str) -> None:
        """Record the event as ignored: the decision changes nothing."""
        ...

    def record(self, key: str) -> StepState | None:
        """The record of a step or a branch (``<group>#<index>``), ready to be changed."""
        ...

    def writable(self, key: str) -> StepState:
        """The record of a step or branch that has one, ready to be changed (``KeyError`` if none).

        Read a record through ``state.steps`` or ``state.branches``; change it only through
        this or :meth:`record`: the working copy shares the records it was not asked to change
        with the decision's input, which must stay as it was.
        """
        ...

    def add_branch(self, key: str) -> StepState:
        """Start the record of branch ``key`` (scheduled), owned by the decision."""
        ...

    def bound(self, key: str) -> Step[Any, Any]:
        """The step a record key runs (a branch: its branch step, named by the key)."""
        ...

    def current_forward(self) -> tuple[Step[Any, Any], StepState] | None:
        """The step at the cursor and its record (``None`` past the last one)."""
        ...

    def begin_step(self, step: Step[Any, Any]) -> None:
        """Begin ``step``: wait, start its group, or send its command."""
        ...

    def advance(self) -> None:
        """Begin the next step, or confirm and complete the saga after the last one."""
        ...

    def dispatch(self, step: Step[Any, Any], kind: Kind) -> None:
        """Send a new attempt of the step's ``do``, ``undo`` or ``confirm``."""
        ...

    def cancel_timer(self, step_state: StepState) -> None:
        """Cancel the record's timer, if it has one."""
        ...

    def succeeded(self, step: Step[Any, Any], step_state: StepState, output: msgspec.Raw) -> None:
        """The step (or branch) succeeded with ``output``: go on."""
        ...

    def failed(
        self, step: Step[Any, Any], step_state: StepState, attempt: Attempt, error: str, outcome: Outcome
    ) -> None:
        """The attempt failed: retry it, compensate, or dead-letter the saga."""
        ...

    def stop(self) -> None:
        """After a cancel or the deadline: undo what completed, as soon as it is safe."""
        ...

    def begin_compensation(self) -> None:
        """Start undoing what completed (or end the saga when nothing is to undo)."""
        ...

    def continue_compensation(self) -> None:
        """Undo the next step (or branch) not yet undone; end when none is left."""
        ...
