"""dpmarket consumer."""
