"""dsconvert's benchmarks: one suite per module, each holding its measurement (``run``) and the
tables it writes into docs/benchmarks.md (``render``). Not installed with dsconvert; run from
the repository root:

    python -m benchmarks list                         # the suites and the tables they write
    python -m benchmarks decode --photos 1000 --rounds 7 --json docs/bench/decode.json
    python -m benchmarks decode --quick               # a tiny run that shows the suite works
    python -m benchmarks all                          # every table: run one at a time, then render
    python -m benchmarks all --only decode wds_convert
    python -m benchmarks all --render-only            # tables from the JSON already in docs/bench/
    python -m benchmarks all --quick                  # every suite tiny, into a scratch folder

A suite module has a docstring (its first line is what ``list`` says), ``add_arguments(parser)``,
``run(args)``, ``QUICK`` (the options of its tiny run) and ``TABLES``: per table of the docs, the
options ``all`` runs it with and the function that renders its JSON (``{}`` for the suites that
only print, such as the revision comparisons). Test servers, mounts and jobs are in
tests/support/ (imported as ``tests.support``, also from the repository root).
"""

# name -> what it measures, in the order ``all`` runs them (one at a time: benchmarks must not
# share the CPUs)
SUITES = {
    "decode": "JPEG decoders",
    "wds": "conversion and raw reads of wds shards against webdataset, litdata, tar",
    "resume": "time to the first batch after a resume",
    "foreign": "webdataset tars and Parquet files read and converted in place",
    "compressed": ".tar.gz and .tar.zst shards read in place and converted",
    "cache": "decoded caches against decoding the JPEGs",
    "verify": "dsconvert verify against sha256sum",
    "monitor": "DataLoadingMonitor's cost per step",
    "train_input": "the training input end to end against every peer",
    "mixing": "how well each read mode mixes classes",
    "fused_accuracy": "decode='fused' against torchvision's pixels",
    "analyze": "analyze on a large tree",
    "diagnose": "what diagnose costs the job it samples",
    "remote": "S3 reads and Dask conversion",
    "remote_peers": "the default remote read against litdata, MosaicML Streaming, webdataset over S3",
    "resize": "npy --resize 256 against earlier revisions",
    "loader": "dsconvert bench through a real DataLoader",
    "tracers": "what each of diagnose's recorders costs",
    "predictions": "analyze's predictions against dsconvert bench",
    "stability": "analyze's advice over quiet and busy runs (issue 41)",
    "scenarios": "held-out situations: are analyze's and diagnose's verdicts right?",
    "resample": "the antialiased resize kernel against torch, OpenCV, Pillow",
    "compare": "every suite on a git revision and on this checkout",
    "before_after": "the hot read and write paths of a revision against this checkout",
    "decode_checks": "the decode checks' cost against a revision's codecs",
    "writer": "dsconvert.optimize and Writer against LitData's optimize and webdataset's ShardWriter",
    "zstd_fields": "--compress zstd levels on non-image fields: write speed, size, read cost",
    "scale": "memory and time of every process from 10k to 1M (10M) samples, growth per sample",
}
