"""vLLM adapter: an elastic BlockPool (prefix caching kept) and KV tensors on a workbench pool."""
