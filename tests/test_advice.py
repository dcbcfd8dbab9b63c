"""The one builder of ``dsconvert shard`` fix commands, shared by analyze and diagnose."""

import shlex

from dsconvert import cli
from dsconvert.advice import output_for, shard_command, source_stem
from dsconvert.analyze.verdict import MEMORY, SOURCE, Measurements, decide
from dsconvert.diagnose.classify import diagnose_stacks
from dsconvert.diagnose.pyspy import Frame, Stack


def test_output_is_named_after_the_source():
    assert output_for("/data/train", "wds") == "/data/train-wds"
    assert output_for("/data/train/", "npy") == "/data/train-npy"
    assert output_for("/data/train.csv", "npy") == "/data/train-npy"  # a list file: without its suffix
    assert output_for("/data/train", "hdf5", "/ssd") == "/ssd/train-hdf5"
    assert output_for("s3://bucket/train", "wds") == "s3://bucket/train-wds"
    assert output_for("/", "wds") == "/data-wds"
    assert source_stem("/data/list.TXT") == "/data/list"


def test_command_flags_in_one_order_and_quoted():
    line = shard_command("/data/my images", "npy", label="cls", options={"resize": 256, "max_size": 320},
                         comment="then read it", output_dir="/ssd/it's here")
    assert line == ("dsconvert shard '/data/my images' --format npy --label cls -o '/ssd/it'\"'\"'s here/my images-npy'"
                    " --resize 256 --max-size 320   # then read it")
    assert shlex.split(line, comments=True) == ["dsconvert", "shard", "/data/my images", "--format", "npy", "--label",
                                                "cls", "-o", "/ssd/it's here/my images-npy", "--resize", "256",
                                                "--max-size", "320"]


def test_the_cli_parses_every_flag_the_builder_writes():
    argv = shlex.split(shard_command("/data/train", "wds", label="cls", options={"resize": 256, "max_size": 320},
                                     comment="x"), comments=True)
    args = cli.build_parser().parse_args(argv[1:])
    assert (args.format, args.label, args.output, args.resize, args.max_size) == ("wds", "cls", "/data/train-wds",
                                                                                  256, 320)


def _decode_bound_measurements(**kw):
    base = dict(source="/data/train", storage_kind="local-disk", num_samples=10_000, files_per_sample=1,
                mean_sample_bytes=110_000, mean_file_bytes=110_000, cold_latency_ms=0.2, fixed_ms=0.1,
                bandwidth_mb_s=2000, sweep=[(1, 5000), (8, 20000)],
                loader={SOURCE: {"cold": 400, "warm": 400, "bytes_per_sample": 110_000},
                        MEMORY: {"cold": 420, "warm": 420},
                        "npy": {"format": "npy", "cold": 3000, "warm": 3000, "bytes_per_sample": 196_608,
                                "options": {"resize": 256}}},
                decode_ms={"pil": 8.0}, transform_ms=1.0, cores=4, output_dir="/data")
    base.update(kw)
    return Measurements(**base)


def _decode_bound_stacks():
    loop = [Frame("<module>", "train.py", 1), Frame("__next__", "torch/utils/data/dataloader.py", 2)]
    worker = [Frame("_worker_loop", "torch/utils/data/_utils/worker.py", 1),
              Frame("fetch", "torch/utils/data/_utils/fetch.py", 2),
              Frame("__getitem__", "ds.py", 3), Frame("load", "PIL/ImageFile.py", 4)]
    main = Stack(1, "python train.py", 1, "MainThread", tuple(loop), 100)
    work = Stack(2, "python train.py", 2, "MainThread", tuple(worker), 100)
    return [main, work], [work]


def test_analyze_and_diagnose_suggest_the_same_command_for_the_same_situation():
    """Decode-bound JPEG folder: both say convert to npy resized to 256, beside the source."""
    v = decide(_decode_bound_measurements())
    wall, cpu = _decode_bound_stacks()
    d = diagnose_stacks(wall, cpu, target=1, cpus=4, data_root="/data/train", shard_formats=("wds", "npy", "hdf5"),
                        read_line=lambda f, n: "")
    assert v.bottleneck == "decode" and d.bottleneck == "decode", (v.summary, d.summary)
    strip = lambda c: shlex.split(c, comments=True)  # noqa: E731
    assert strip(v.commands[0]) == strip(d.commands[0]) == [
        "dsconvert", "shard", "/data/train", "--format", "npy", "-o", "/data/train-npy", "--resize", "256"]


def test_every_fix_record_is_a_known_category_with_a_text_that_formats():
    from dsconvert.diagnose.classify import DATA_CATEGORIES
    from dsconvert.diagnose.fixes import FIXES, FixContext, Fixes, apply_fixes

    ctx = FixContext(top="JPEG (Pillow)", fast_decoder="turbojpeg", pillow=True, wds_out="/data/train-wds")
    for category, fixes in FIXES.items():
        assert category in DATA_CATEGORIES, category
        for fix in fixes:
            assert "{" not in fix.text.format(**vars(ctx)), fix
            if fix.otherwise:
                fix.otherwise.format(**vars(ctx))
    fx = Fixes("/data/train", ("wds", "npy"))
    apply_fixes("decode", fx, {"JPEG (Pillow)": 0.9}, "turbojpeg")
    assert fx.commands == [
        "dsconvert shard /data/train --format npy -o /data/train-npy --resize 256   # decoded and resized once: "
        "training reads pixels from a memory map",
        "dsconvert shard /data/train --format wds -o /data/train-wds   # then open_dataset('/data/train-wds', "
        "decode=\"numpy\") decodes JPEGs with turbojpeg"]
    refused = Fixes("/data/train", ("wds",))  # dsconvert shard does not take it for npy: a code change instead
    apply_fixes("unpickle", refused, {"pickle.load": 1.0}, None)
    assert refused.commands == [] and refused.refused == ["npy"] and "np.save" in refused.notes[0]


def test_the_verdict_is_the_first_rule_of_the_table_that_holds():
    from dsconvert.diagnose.verdicts import VERDICTS, Measured, decide

    def m(**kw):
        base = dict(main_samples=100, input_share=0.1, own={}, workers=4, worker_busy=0.9, receive=0.0, wait=0.1,
                    pool={"decode": 0.6, "read": 0.2})
        base.update(kw)
        return Measured(**base)

    assert decide(m(main_samples=5, input_share=0.9)) == ("unknown", None)
    assert decide(m()) == ("compute-bound", None)
    assert decide(m(input_share=0.7, wait=0.6)) == ("input-bound", "decode")  # the pool's largest
    assert decide(m(input_share=0.7, wait=0.6, worker_busy=0.3)) == ("input-bound", "ipc")  # idle workers
    assert decide(m(input_share=0.4, receive=0.3, wait=0.1)) == ("input-bound", "ipc")  # receiving > waiting
    # ... unless the workers' loading takes more CPU than the receiving: then it is named
    assert decide(m(input_share=0.4, receive=0.3, wait=0.1, loading_cpu=1.2, receive_cpu=0.3)) == ("input-bound",
                                                                                                "decode")
    assert decide(m(input_share=0.4, receive=0.3, wait=0.1, loading_cpu=0.2, receive_cpu=0.3)) == ("input-bound",
                                                                                                "ipc")
    # without workers 15 % of the loop's own loading is enough: the fix is workers first
    assert decide(m(workers=0, input_share=0.16, own={"decode": 0.16})) == ("input-bound", "no-workers")
    assert [r.verdict for r in VERDICTS][0] == "unknown" and VERDICTS[-1].verdict == "compute-bound"


def test_dsconvert_decoding_is_known_in_the_codecs_package():
    from dsconvert.diagnose.classify import classify_stack

    for leaf in (Frame("decode_rgb", "/site/dsconvert/codecs/jpeg.py", 10),
                 Frame("pil_rgb", "/site/dsconvert/codecs/checks.py", 10)):
        frames = (Frame("_worker_loop", "torch/utils/data/_utils/worker.py", 1),
                  Frame("fetch", "torch/utils/data/_utils/fetch.py", 2), Frame("__getitem__", "ds.py", 3), leaf)
        stack = Stack(2, "python train.py", 2, "MainThread", frames, 1)
        assert classify_stack(stack, 1, [2], lambda f, n: "") == ("worker", "decode",
                                                                   "dsconvert (Pillow/turbojpeg chain)")
