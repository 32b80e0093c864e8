"""dpmarket deploy."""
