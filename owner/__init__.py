"""dpmarket owner."""
