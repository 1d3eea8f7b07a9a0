"""bench/api.py's options (issue 33): the uncached path, keep-alive clients, writes in the
background and gthread workers, as the command line gives them."""

from __future__ import annotations

import pytest

from bench.api import parse_args


def test_the_defaults_are_the_deployment_the_dockerfile_runs():
    args = parse_args([])
    assert (args.workers, args.worker_class, args.threads, args.client) == (3, "sync", 1, "http.client")
    assert not args.with_writes and not args.no_cache


def test_no_cache_wins_over_a_cache_url():
    assert parse_args(["--cache-url", "redis://127.0.0.1:6379/7", "--no-cache"]).cache_url == ""
    assert parse_args(["--cache-url", "redis://127.0.0.1:6379/7"]).cache_url == "redis://127.0.0.1:6379/7"


def test_gthread_gets_8_threads_unless_told():
    assert parse_args(["--worker-class", "gthread"]).threads == 8
    assert parse_args(["--worker-class", "gthread", "--threads", "4"]).threads == 4
    with pytest.raises(SystemExit):
        parse_args(["--worker-class", "eventlet"])


def test_clients_and_writes():
    args = parse_args(["--client", "both", "--with-writes", "--heartbeat-rate", "50", "--campaign-nodes", "20"])
    assert (args.client, args.with_writes, args.heartbeat_rate, args.campaign_nodes) == ("both", True, 50.0, 20)
    assert parse_args(["--with-writes"]).heartbeat_rate == 200.0
    for wrong in (["--client", "curl"], ["--with-writes", "--heartbeat-rate", "0"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)


def test_stale_answers_are_opt_in_as_in_the_settings():
    assert parse_args([]).stale_s == 0
    assert parse_args(["--stale-s", "5"]).stale_s == 5
    with pytest.raises(SystemExit):
        parse_args(["--stale-s", "-1"])
