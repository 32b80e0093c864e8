"""Privacy machinery shared by every protocol: accounting, budgets, ledgers and randomness."""
