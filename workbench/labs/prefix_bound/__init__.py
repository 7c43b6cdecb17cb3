"""The prefix-bound lab."""
