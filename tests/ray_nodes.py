"""A Ray cluster of several nodes on this machine, for the tests of runs on an existing cluster.

``python tests/ray_nodes.py --temp-dir DIR --gpu-nodes N``: a head node with CPUs and no GPU, and N worker nodes
with one ``GPU`` each (a rank's bundle; verl's single controller asks one per rank, which no process uses on the
CPU), started with Ray's own test cluster (``ray.cluster_utils.Cluster``: each node its own raylet and object
store, as separate machines would have). Prints ``ADDRESS <gcs address>`` once every node is up, then blocks until
SIGTERM or SIGINT and takes the cluster down. Run it in a session of its own and signal the session.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from precision_harness.runs.ray_cluster import HEAD_ENV


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--temp-dir", required=True)
    parser.add_argument("--gpu-nodes", type=int, default=2)
    parser.add_argument("--head-cpus", type=int, default=8)
    args = parser.parse_args(argv)
    # a loopback test cluster opts out of Ray's token auth (a real cluster's token reaches the driver through
    # RAY_AUTH_TOKEN or ~/.ray/auth_token)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.update(HEAD_ENV)  # as on the gate's own head: no idle workers no run takes
    from ray.cluster_utils import Cluster

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    head = {"num_cpus": args.head_cpus, "num_gpus": 0, "include_dashboard": False, "temp_dir": args.temp_dir}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(args.gpu_nodes):
            cluster.add_node(num_cpus=4, num_gpus=1)
        cluster.wait_for_nodes()
        print(f"ADDRESS {cluster.address}", flush=True)
        stop.wait()
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
