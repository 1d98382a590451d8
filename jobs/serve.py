"""Serve the speculative decoder behind an OpenAI-compatible HTTP API (Ray Serve, FastAPI ingress).

    python jobs/serve.py --preset smollm2-135m [--systems lilicorr,dflash,ar] [--checkpoint DIR | SYSTEM=DIR]
        [--drafter random] [--host 127.0.0.1 --port 8000] [section.field=value ...]

Models are named <preset>-<system> (e.g. smollm2-135m-lilicorr). A speculative system uses its
--checkpoint, else the shipped checkpoints/<preset>/<system>/, else (with --drafter random) an untrained
drafter; otherwise it is not served. Set $LILICORR_API_KEY to require `Authorization: Bearer <key>`.
Binds 127.0.0.1 unless --host says otherwise. Starts a private local Ray instance unless --address
(or $RAY_ADDRESS) names a cluster. Runs until interrupted; prints one JSON line when ready.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`

from lilicorr.cli import parse_job_args  # noqa: E402


def _add_arguments(p) -> None:
    p.add_argument("--systems", default="lilicorr,dflash,ar", help="comma-separated systems to serve")
    p.add_argument("--checkpoint", action="append", default=[], metavar="DIR|SYSTEM=DIR",
                   help="drafter + head export (jobs/train.py); repeatable; DIR serves every listed system whose "
                        "head it holds")
    p.add_argument("--drafter", default=None, choices=["random"], help="random drafters where no checkpoint is found")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"), help="Ray cluster (default: private, local)")
    p.add_argument("--api-key-env", default="LILICORR_API_KEY", help="environment variable holding the API key")
    p.add_argument("--num-replicas", type=int, default=1)
    p.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica")
    p.add_argument("--no-warmup", action="store_true", help="skip the engine warm-up at replica start")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="intra-op threads per replica (default: the node's cores, at most 8; 1 on a busy CPU)")


def main(argv: list[str] | None = None) -> None:
    args, _cfg = parse_job_args(__doc__.split("\n")[0], add_arguments=_add_arguments, argv=argv)
    from lilicorr.platform.console import quiet_console

    quiet_console("serve", enabled=argv is None)  # console: our lines; Ray's and Serve's logs: outputs/logs/
    from lilicorr.engine.systems import UnknownSystemOrCheckpoint
    from lilicorr.serve_apps.launch import start_serve, stop_serve
    from lilicorr.serve_apps.loading import ServeSpec, resolve_checkpoints

    spec = ServeSpec(preset=args.preset, overrides=args.overrides,  # --config's settings first (cli.py)
                     systems=[s.strip() for s in args.systems.split(",") if s.strip()],
                     checkpoints=list(args.checkpoint), drafter=args.drafter, api_key_env=args.api_key_env,
                     warmup=not args.no_warmup, torch_threads=args.torch_threads)
    try:
        plan = resolve_checkpoints(spec)  # fail fast, before Ray starts
    except (UnknownSystemOrCheckpoint, ValueError) as e:
        print(f"serve: error: {e}", file=sys.stderr)
        sys.exit(2)
    spec.systems = list(plan)
    spec.checkpoints = [f"{s}={os.path.abspath(c)}" for s, c in plan.items() if c]  # what the replica loads
    url = start_serve(spec, args.host, args.port, address=args.address, num_replicas=args.num_replicas,
                      num_gpus=args.num_gpus)
    print(json.dumps({"url": url, "models": [f"{spec.preset}-{s}" for s in spec.systems],
                      "api_key": bool(os.environ.get(spec.api_key_env))}), flush=True)
    done = threading.Event()  # runs until interrupted
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    stop_serve()


if __name__ == "__main__":
    main()
