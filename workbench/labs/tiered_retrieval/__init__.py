"""The tiered-retrieval lab."""
