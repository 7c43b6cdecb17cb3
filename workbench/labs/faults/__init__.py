"""The faults lab."""
