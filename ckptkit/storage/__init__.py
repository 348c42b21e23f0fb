"""Storage: atomic commits, digests, codecs, safetensors shards, locks."""
