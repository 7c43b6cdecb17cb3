"""SGLang adapter: elastic token-slot / paged allocators, the MHA pool and the RadixCache bound."""
