"""The cross-engine lab."""
