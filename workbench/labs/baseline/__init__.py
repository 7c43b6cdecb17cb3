"""The baseline lab."""
