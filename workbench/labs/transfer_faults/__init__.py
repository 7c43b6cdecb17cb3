"""The transfer-faults lab."""
