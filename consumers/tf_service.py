"""A tf.data service process the tf-data-service path starts: `python -m consumers.tf_service dispatcher|worker`.

It listens on 127.0.0.1:P only, dies with the run that started it and exits
at once on SIGTERM (runner/data_service.py `become_server`, before
TensorFlow is imported); the dispatcher keeps no state on disk (no work_dir).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m consumers.tf_service")
    p.add_argument("role", choices=("dispatcher", "worker"))
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dispatcher", help="the dispatcher's HOST:PORT (a worker's)")
    args = p.parse_args(argv)
    from runner import bind_host
    from runner.data_service import WORKER_TIMEOUT_MS, become_server

    own = become_server(args.port)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    service = tf.data.experimental.service
    if args.role == "dispatcher":
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
