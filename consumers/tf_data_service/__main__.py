"""A tf.data service process the run starts: `python -m consumers.tf_data_service dispatcher|worker --port P`.

It listens on 127.0.0.1:P only (runner/bind_host.py), dies with the run that
started it (producers/parent.py), and exits at once on SIGTERM: a worker
holds no state worth saving, and the dispatcher keeps none (no work_dir).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m consumers.tf_data_service")
    p.add_argument("role", choices=("dispatcher", "worker"))
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dispatcher", help="the dispatcher's HOST:PORT (a worker's)")
    args = p.parse_args(argv)
    from producers import parent
    from runner import bind_host
    from runner.local_cluster import LOOPBACK

    own = f"{LOOPBACK}:{args.port}"
    bind_host.ensure(own, LOOPBACK, allow_remote=False)  # may run this command again with the shim preloaded
    parent.watch()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    service = tf.data.experimental.service
    if args.role == "dispatcher":
        from consumers.tf_data_service.service import WORKER_TIMEOUT_MS

        config = service.DispatcherConfig(port=args.port, protocol="grpc", worker_timeout_ms=WORKER_TIMEOUT_MS)
        server = service.DispatchServer(config)
    else:
        config = service.WorkerConfig(
            dispatcher_address=args.dispatcher, worker_address=own, port=args.port, protocol="grpc",
            heartbeat_interval_ms=500,
        )  # fmt: skip
        server = service.WorkerServer(config)
    bind_host.check_listening(f"{args.role} {own}", own, allow_remote=False)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
