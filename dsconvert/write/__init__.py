"""Writing one output, the parts every writer shares: the options (:mod:`.options`), the
output's life cycle from claim to manifest (:mod:`.output`) and the executor loop that writes
shard specs (:mod:`.loop`). ``convert``, ``Writer`` and ``optimize`` are built on them."""
