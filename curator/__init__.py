"""dpmarket curator."""
