"""The dynamic-limit lab."""
