"""Where bytes live: every folder through fsspec (:mod:`.location`), local-only helpers
(:mod:`.localfs`: regular files, atomic writes, page-cache eviction, mounts), file locks
(:mod:`.locks`), byte ranges read the way the storage wants (:mod:`.ranges`), and verified
local copies of remote shards (:mod:`.shard_cache`), kept by default for remote outputs
(:mod:`.default_cache`)."""
