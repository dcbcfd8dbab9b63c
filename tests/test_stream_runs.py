"""The stream without ``batch_size`` hands each DataLoader worker runs of consecutive samples
(``STREAM_RUN``, dsconvert/readers/stream.py), not one sample each in turn: through a real
DataLoader with workers, every sample once, and a DataLoader batch of the run consumed as a
prefix of the epoch, so an elastic resume from samples_seen alone is exact."""

import hashlib

import pytest

from dsconvert import convert, open_dataset
from dsconvert.readers.stream import STREAM_RUN

from conftest import make_image_folder


@pytest.fixture(scope="module")
def wds(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("runs")
    src = str(root / "src")
    make_image_folder(src, photos, {"a": 160, "b": 140}, size=(24, 16))
    out = str(root / "wds")
    convert(src, out, samples_per_shard=50, workers=1)
    return out


def keys(batches):
    return [hashlib.sha1(bytes(x)).hexdigest() for images, _ in batches for x in images]


def raw_collate(samples):
    return [bytes(x) for x, _ in samples], [y for _, y in samples]


@pytest.mark.slow
def test_a_dataloader_batch_of_the_run_resumes_exactly_from_samples_seen(wds, torch):
    everything = sorted(hashlib.sha1(bytes(x)).hexdigest() for x, _ in open_dataset(wds, decode="raw"))
    ds = open_dataset(wds, decode="raw", stream=True, shuffle=True, seed=3)
    assert len(ds) == 300
    loader = torch.utils.data.DataLoader(ds, batch_size=STREAM_RUN, num_workers=2, collate_fn=raw_collate)
    whole = keys(loader)
    assert sorted(whole) == everything  # every sample once
    ds.set_epoch(4)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=STREAM_RUN, num_workers=2, collate_fn=raw_collate))
    first = keys([next(it) for _ in range(3)])  # a job stopped after 3 steps
    del it
    again = open_dataset(wds, decode="raw", stream=True, shuffle=True, seed=3)
    again.load_state_dict({"epoch": 4, "samples_seen": 3 * STREAM_RUN})
    rest = keys(torch.utils.data.DataLoader(again, batch_size=STREAM_RUN, num_workers=2, collate_fn=raw_collate))
    assert sorted(first + rest) == everything  # each sample once: nothing read twice, nothing lost
    # a worker's samples come in runs of consecutive positions of the epoch's order
    alone = open_dataset(wds, decode="raw", stream=True, shuffle=True, seed=3)
    alone.set_epoch(4)
    order = keys(torch.utils.data.DataLoader(alone, batch_size=STREAM_RUN, num_workers=0, collate_fn=raw_collate))
    assert first == order[: 3 * STREAM_RUN]
