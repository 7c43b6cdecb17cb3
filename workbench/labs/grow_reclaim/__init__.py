"""The grow-reclaim lab."""
