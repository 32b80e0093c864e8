"""The keys of an owner's policy file: the closed vocabulary in which an owner's refusal names
its cause, and in which a curator passes that cause on as its own words.

An owner refuses a step by its policy with a text that names the key (``"access.
allow_steered_selection off"``, ``"... (its policy's cape.min_colluders)"``). The rest of that
text is the owner's: a hostile owner may write anything there, up to 500 characters. A curator
recognises the keys of this list in it (:func:`policy_keys_in`) and states those itself; it
quotes the rest as the owner's own words (:mod:`dpmarket.curator.disclosure`).
"""

from __future__ import annotations

import re

__all__ = ["POLICY_KEYS", "policy_keys_in"]

#: Every ``section.key`` of an owner's policy file (:mod:`dpmarket.owner.policy` reads exactly
#: these; tests/owner check that the two agree).
POLICY_KEYS: tuple[str, ...] = (
    "budget.epsilon",
    "budget.delta",
    "budget.window_days",
    "budget.points",
    "session.epsilon",
    "session.delta",
    "session.points",
    "session.points_fraction",
    "session.rounds_per_point",
    "access.curators",
    "access.allow_non_private",
    "access.allow_exact_bids",
    "access.allow_steered_selection",
    "access.allow_reward_disclosure",
    "limits.max_sessions",
    "limits.session_idle_timeout_seconds",
    "limits.max_rff_dimension",
    "limits.session_memory_mib",
    "limits.step_seconds",
    "sketches.publish",
    "sketches.epsilon",
    "cape.min_colluders",
)

#: A dotted name as a policy key is written: letters, digits and underscores on both sides.
_DOTTED = re.compile(r"(?<![\w.])([a-z]+\.[a-z_]+)(?![\w.])")


def policy_keys_in(text: str) -> tuple[str, ...]:
    """The policy keys ``text`` names, each once, in the order it names them.

    Parameters
    ----------
    text : str
        Another party's text (a refusal's details).

    Returns
    -------
    tuple of str
        Members of :data:`POLICY_KEYS` only: a dotted name that is not a key (``cape.made_up``)
        is not one, nor is a key inside a longer dotted name (``access.curators.x``).
    """
    found = (m for m in _DOTTED.findall(text) if m in POLICY_KEYS)
    return tuple(dict.fromkeys(found))
