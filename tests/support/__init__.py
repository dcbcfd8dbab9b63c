"""What the tests (and the benchmarks) run beside the code under test: servers, mounts and jobs.

    s3server        moto's S3 server on 127.0.0.1 (``start()``/``stop()``)
    latency_proxy   a TCP proxy that delays every request (``start()``)
    slowfs          a FUSE passthrough that sleeps in open() and read() (``mount()``)
    train_job       a training-like job: a DataLoader feeding a numpy "model" (run as a script)
    resume_job      a reader stopped and resumed in fresh processes (tests/test_resume.py)
    fuzz_readers    coverage-guided fuzzing of the manifest and tar-index readers (atheris)

Import them as ``tests.support.NAME`` from the repository root (the tests and
``python -m benchmarks`` both run from there); the scripts run by path, e.g.
``python tests/support/train_job.py --help``.
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
SLOWFS = os.path.join(HERE, "slowfs.py")
TRAIN_JOB = os.path.join(HERE, "train_job.py")
RESUME_JOB = os.path.join(HERE, "resume_job.py")
