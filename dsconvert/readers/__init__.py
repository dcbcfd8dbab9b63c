"""Reading: Datasets over dsconvert outputs, over sources as they are, and over anything
map-style, cached.

``open.py``    ``open_dataset``: the manifest says which Dataset (torch-free to import); ``open_source``
``base.py``    what every Dataset shares: decode mode, transforms, locating a sample
``stream.py``  ``StreamDataset``: the epoch's order dealt to ranks and workers, position as state (wds)
``order.py``   that order and the dealing, as arithmetic (pure; what makes resumption exact)
``epoch.py``   the epoch and a pending resume, shared with persistent DataLoader workers
``sampler.py`` ``ResumableSampler``: the same for map-style outputs (a resumable DistributedSampler)
``map.py``     ``MapDataset``: random access by index (hdf5, npy)
``cached.py``  ``CachedDataset``: any map-style dataset, decoded once into a memory map
``source.py``  ``SourceDataset``: a scanned source read in place, without conversion (the baseline)
``tars.py``    tar shards another tool wrote, opened without a manifest (their indexes stand in)
``prefetch.py`` ``prefetch``: every shard of an output fetched into a local cache ahead of training
``offline.py`` a remote output's manifest kept in the cache, read from there when the remote is out of reach
``mix.py``     ``mix``, ``subsample``: a mixture's arguments checked, its Dataset made (torch-free to import)
``mix_draws.py`` which source and which of its samples each position of a mixture draws (pure arithmetic)
``mix_datasets.py`` ``MixedDataset``, ``MixedStream``: the Datasets that read those draws (map-style; dealt, resumable)
"""
