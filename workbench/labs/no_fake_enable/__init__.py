"""The no-fake-enable lab."""
