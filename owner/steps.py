"""The state machine of a summarization session at an owner: which step it answers now.

A session's terms state its method
(:class:`~dpmarket.common.summarization.terms.SessionMethod`); the method lists the steps the
owner answers, in order (:data:`~dpmarket.common.summarization.terms.METHOD_STEPS`).
:class:`SessionSteps` holds where the session stands in that list and refuses,
with ``FailedPreconditionError``, every step that is not the next one: a step of another
method (a Bid under the uniform method's terms, which charge nothing for it), a step out of
order (ProposeCandidates before the count allocation's CountRelevant) and a step already taken.
Every refusal depends only on the terms and on which steps the curator has called, so its text
is public; a refused step runs nothing, releases nothing and charges nothing.

What a repeat gets is decided by the step (:class:`dpmarket.owner.protocol.OwnerSession`): the same
release for a noisy release (CountRelevant with the same threshold returns the value released;
another threshold is refused), a no-op for an identical SetValidationEmbedding, a refusal for
everything else. The rounds are the one step taken many times, each round checked by the
session itself (the next round, up to the terms' ``max_rounds``; a release of the round just
bid, once). Every check is O(1): a dictionary lookup and an integer comparison.
"""

from __future__ import annotations

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.summarization.terms import METHOD_STEPS, OwnerTerms, Step

__all__ = ["SessionSteps"]


class SessionSteps:
    """Where a session stands among the steps its terms allow.

    Parameters
    ----------
    terms : OwnerTerms
        The terms the owner accepted when the session opened.

    Notes
    -----
    ``position`` is the index of the next step in the method's list; :meth:`done` moves it past
    a step once the step has released (or, for a step that releases nothing, succeeded), so a
    step that fails or is refused can be asked again. The rounds step never completes: it is the
    last of every list that has it.
    """

    def __init__(self, terms: OwnerTerms) -> None:
        self.terms = terms
        self.steps = METHOD_STEPS[terms.method]
        self._index = {step: i for i, step in enumerate(self.steps)}
        self.position = 0

    def allows(self, step: Step) -> bool:
        """Whether the terms list ``step`` at all (whatever the session has done)."""
        return step in self._index

    def taken(self, step: Step) -> bool:
        """Whether ``step`` is done (the session has moved past it)."""
        index = self._index.get(step)
        return index is not None and index < self.position

    def check(self, step: Step) -> None:
        """Refuse ``step`` unless it is the session's next step.

        Raises
        ------
        FailedPreconditionError
            If the terms do not list ``step`` (naming the method and the steps it allows),
            ``step`` was already taken, or a step before it has not been.
        """
        index = self._index.get(step)
        if index is None:
            allowed = ", ".join(s.value for s in self.steps)
            raise FailedPreconditionError(
                f"the session's terms (method {self.terms.method.value}) allow no "
                f"{step.value}; they allow {allowed}, in that order"
            )
        if index < self.position:
            raise FailedPreconditionError(
                f"{step.value} was already answered in this session; a step is answered once"
            )
        if index > self.position:
            raise FailedPreconditionError(
                f"{step.value} comes after {self.steps[self.position].value} in a "
                f"{self.terms.method.value} session, which has not been answered"
            )

    def done(self, step: Step) -> None:
        """``step`` (the next step, :meth:`check`) has been answered: move past it, unless it
        is the rounds, which are answered many times."""
        if step is not Step.ROUNDS and self._index.get(step) == self.position:
            self.position += 1
