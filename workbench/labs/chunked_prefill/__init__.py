"""The chunked-prefill lab."""
