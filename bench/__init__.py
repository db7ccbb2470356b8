"""rangeshard benchmarks: the system against its alternatives, in one run, compared as ratios.

Purpose
    ``python -m bench [--quick] [--json FILE]`` runs every section and prints
    a table; see bench/README.md for what each number means.

    * :mod:`bench.fanout` -- N range watchers through the proxy vs N direct
      watches with client-side filtering;
    * :mod:`bench.throughput` -- events/s the proxy absorbs with 16 watchers
      (fed through its ``Upstream`` interface by :mod:`bench.feed`, and as the
      ``rangeshard proxy`` command reading :mod:`bench.upstream_server`),
      delivery latency, against a bare decode/re-encode loop and the
      write-only latency floor of :mod:`bench.floor`;
    * :mod:`bench.cache` -- LIST of a 1/16 range at 10k/100k pods, memory per
      cached object, garbage-collector pauses with and without the heap keeper;
    * :mod:`bench.scaleout` -- reconcile throughput with 1, 2, 4 managers,
      join-to-active, SIGKILL-to-takeover;
    * :mod:`bench.balance` -- owned objects per instance after joins and
      after the plans of ``rangeshard rebalance`` (``--by workload``/``range``);
    * :mod:`bench.sidecar` -- what an external-only manager costs beside the
      controller it shards (memory, start, the endpoint's added latency),
      against the floor of one more hop (:mod:`bench.hop`).

Invariants
    Benchmarks only listen on and connect to loopback; every process they
    start is stopped before the run ends, also on errors.

Concurrency model
    Sections run one after another in the calling thread; see each module.
"""
