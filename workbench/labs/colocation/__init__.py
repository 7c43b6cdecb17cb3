"""The colocation lab."""
