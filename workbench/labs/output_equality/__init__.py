"""The output-equality lab."""
