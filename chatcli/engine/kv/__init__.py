"""The KV cache stage: a conversation's cache (`cache.KVCache`) and session (`session`), how the
lean runners' caches take memory (`memory`: reserved, grown, a strip for sliding layers), the
prefix a cache can reuse (`prefix`), the pool of sessions kept between turns (`pool`) and caches
saved to disk (`persist`)."""
