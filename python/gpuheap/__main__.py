"""`gpuheap ARGS` (the console script) and `python -m gpuheap ARGS`: runs the CLI binary of
this installation in place of the Python process (exec: the same pid, signals and exit
status, no interpreter left in between)."""

import os
import sys

from . import cli_path


def main():
    exe = cli_path()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"gpuheap: the CLI binary is missing ({exe}); install the gpuheap wheel "
                         f"(README, Install) instead of importing the source tree\n")
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, ["gpuheap"] + sys.argv[1:])
    return 2  # not reached: execv returns only by raising


if __name__ == "__main__":
    sys.exit(main())
