"""The Ray job entrypoint: ``python -m popgrpo.cli.job --config FILE [--set K=V …] [--out DIR]``.

Takes the flags of ``popgrpo train``. Inside a Ray job ``RAY_ADDRESS`` names the job's
cluster, so the run attaches to it instead of starting an embedded Ray. ``--out`` may start
with ``~`` (expanded on the node the job's driver runs on, which is where the run directory
is written). Exit codes are the CLI's: 0 done, 2 bad config (the job ends FAILED with the
message in its logs), 1 the run failed (traceback in the run directory's ``error.log``).
"""

from __future__ import annotations

import os
import sys

from popgrpo.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            argv[i + 1] = os.path.expanduser(argv[i + 1])
        elif arg.startswith("--out="):
            argv[i] = "--out=" + os.path.expanduser(arg.removeprefix("--out="))
    if os.environ.get("RAY_ADDRESS"):
        print(f"popgrpo job: attaching to the job's Ray cluster at {os.environ['RAY_ADDRESS']}", flush=True)
    return cli_main(["train", *argv])


if __name__ == "__main__":
    sys.exit(main())
