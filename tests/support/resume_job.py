"""A training job's reading, stopped and resumed in fresh processes (tests/test_resume.py).

``python resume_job.py CONFIG.json``: for each case in the config, read one epoch through
torchdata's StatefulDataLoader and write what each step saw (sample digests) and, for
``stop`` phases, the loader's state after k steps; ``resume`` phases load those states in this
new process and read the rest. Under torch.distributed (RANK/WORLD_SIZE in the environment)
it joins a gloo group first and writes one result per rank.
"""

import hashlib
import json
import os
import pickle
import sys

import numpy as np
import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from dsconvert.data import ResumableSampler, open_dataset

EPOCH = 1


def keep(batch):
    return batch


def digest(x):
    data = x.tobytes() if isinstance(x, np.ndarray) else bytes(x)
    return hashlib.sha1(data).hexdigest()[:12]


def step_digests(batch):
    """The samples of one step, whatever shape the loader gives them."""
    if len(batch) == 2 and isinstance(batch[1], torch.Tensor):  # (images, stacked labels): default_collate
        return [digest(x) for x in batch[0]]
    return [digest(image) for image, _ in batch]  # keep(): [(image, label), ...]


def make(case, rank, world):
    out, b, workers = case["out"], case["batch"], case["workers"]
    kw = dict(num_workers=workers, multiprocessing_context=case.get("context") if workers else None)
    if case["kind"] == "stream":
        opts = dict(shuffle=True, seed=3, buffer_size=case.get("window", 20), rank=rank, world_size=world,
                    even=case.get("even", "pad"))
        if case.get("in_dataset"):
            ds = open_dataset(out, decode="raw", batch_size=b, **opts)
            loader = StatefulDataLoader(ds, batch_size=None, **kw)
        else:
            ds = open_dataset(out, decode="raw", **opts)
            loader = StatefulDataLoader(ds, batch_size=b, **kw)
        ds.set_epoch(EPOCH)
        return ds, loader
    ds = open_dataset(out, decode=case.get("decode", "raw"))
    if case["kind"] == "sampler":
        sampler = ResumableSampler(ds, seed=3, rank=rank, world_size=world, even=case.get("even", "pad"))
        sampler.set_epoch(EPOCH)
        return sampler, StatefulDataLoader(ds, batch_size=b, sampler=sampler, collate_fn=keep, **kw)
    gen = torch.Generator().manual_seed(5)  # torchdata's stateful RandomSampler, seeded
    return ds, StatefulDataLoader(ds, batch_size=b, shuffle=True, generator=gen, collate_fn=keep, **kw)


def run(case, rank, world, me):
    """``rank``/``world`` as given to the readers (None under torch.distributed); ``me`` names files."""
    phase = case["phase"]
    states = case["states"]
    result = {}
    if phase == "full":
        _, loader = make(case, rank, world)
        result["steps"] = [step_digests(batch) for batch in loader]
    elif phase == "stop":
        for k in case["stops"]:
            _, loader = make(case, rank, world)
            it = iter(loader)
            seen = [step_digests(next(it)) for _ in range(k)]
            with open(os.path.join(states, f"{case['name']}-{k}-{me}.pkl"), "wb") as f:
                pickle.dump(loader.state_dict(), f)
            del it
            result[str(k)] = seen
    elif phase == "resume":
        for k in case["stops"]:
            _, loader = make(case, rank, world)
            with open(os.path.join(states, f"{case['name']}-{k}-{me}.pkl"), "rb") as f:
                loader.load_state_dict(pickle.load(f))
            result[str(k)] = [step_digests(batch) for batch in loader]
    elif phase == "elastic":  # a new topology continues from the samples the old job consumed
        for seen in case["seen"]:
            ds, loader = make(case, rank, world)
            ds.load_state_dict({"epoch": EPOCH, "samples_seen": seen})
            result[str(seen)] = [step_digests(batch) for batch in loader]
            result[f"next-{seen}"] = len([1 for _ in loader])  # the following iteration: the whole epoch again
    return result


def main():
    cases = json.load(open(sys.argv[1]))
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    if world > 1:
        dist.init_process_group("gloo", init_method="env://")
        del os.environ["RANK"], os.environ["WORLD_SIZE"]  # from here only torch.distributed knows
        rank, world = dist.get_rank(), dist.get_world_size()
    results = {f"{case['name']}/{case['phase']}": run(case, None if world > 1 else rank,
                                                       None if world > 1 else world, rank)
               for case in cases}
    with open(f"{sys.argv[2]}.{rank}.json", "w") as f:
        json.dump(results, f)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
