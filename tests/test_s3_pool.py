"""S3 clients made for dsconvert pool 64 connections (botocore's default of 10 queued a cache's
fetch-ahead in waves, a round trip each), unless the caller's storage_options name a number."""

import pytest

from dsconvert.io.location import POOL, _pooled, filesystem


def test_an_s3_url_gets_the_pool_and_a_callers_number_or_another_protocol_is_left_alone():
    assert _pooled("s3://b/out", {"anon": True}) == {"anon": True, "config_kwargs": {"max_pool_connections": POOL}}
    mine = {"config_kwargs": {"max_pool_connections": 3, "read_timeout": 5}}
    assert _pooled("s3://b/out", mine) is mine
    other = {"config_kwargs": {"read_timeout": 5}}
    assert _pooled("s3a://b/out", other)["config_kwargs"] == {"read_timeout": 5, "max_pool_connections": POOL}
    assert other == {"config_kwargs": {"read_timeout": 5}}  # the caller's dict untouched
    assert _pooled("gs://b/out", {}) == {} and _pooled("/data/out", {}) == {}
    odd = {"config_kwargs": "not a dict"}  # left for s3fs to refuse in its own words
    assert _pooled("s3://b/out", odd) is odd


def test_the_s3_file_system_is_made_with_it():
    pytest.importorskip("s3fs")
    fs, _ = filesystem("s3://b/out", {"key": "k", "secret": "s",
                                       "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}})
    assert fs.config_kwargs["max_pool_connections"] == POOL
