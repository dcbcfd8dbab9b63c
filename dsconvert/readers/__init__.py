"""Reading: Datasets over dsconvert outputs (and over anything map-style, cached).

``open.py``    ``open_dataset``: the manifest says which Dataset (torch-free to import)
``base.py``    what every Dataset shares: decode mode, transforms, locating a sample
``stream.py``  ``StreamDataset``: shards in file order, split by rank and worker (wds)
``map.py``     ``MapDataset``: random access by index (hdf5, npy)
``cached.py``  ``CachedDataset``: any map-style dataset, decoded once into a memory map
"""
